//! Fuzzes the NBD option phase of a listener with `tls = "require"` on arbitrary client
//! bytes: it must never panic, never serve an export before TLS, and answer every option
//! but STARTTLS and ABORT with NBD_REP_ERR_TLS_REQD (`nbd/option_replay.rs`). The same
//! bytes against `on` and `off` listeners must not panic either.
#![no_main]

use cachevisor_nbd::option_replay::{check_tls_required, replay};
use cachevisor_nbd::tls::TlsMode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (outcome, output) = replay(data, TlsMode::Require);
    if let Err(e) = check_tls_required(data, &outcome, &output) {
        panic!("{e}");
    }
    let _ = replay(data, TlsMode::On);
    let _ = replay(data, TlsMode::Off);
});
