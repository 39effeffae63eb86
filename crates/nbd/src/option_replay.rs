//! The option phase run on bytes in memory, for the fuzz target (`fuzz/fuzz_targets/
//! option_phase.rs`) and the property test below: a client's bytes go in, the server's
//! replies come out, and [`check_tls_required`] says whether a `require` listener kept
//! its promise — no export before TLS, and every option before it but STARTTLS and ABORT
//! answered `NBD_REP_ERR_TLS_REQD`.

use super::handshake::{greet, options, Negotiated};
use super::proto::*;
use crate::backend::ExportInfo;
use crate::tls::TlsMode;
use std::io::{self, Read, Write};

/// A client's bytes in, the server's bytes out.
struct Memory<'a> {
    input: &'a [u8],
    output: Vec<u8>,
}

impl Read for Memory<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Memory<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Two exports, one of them open to `CN=host-a` only.
struct TwoExports;

impl super::handshake::Exports for TwoExports {
    fn exports(&self) -> Vec<ExportInfo> {
        vec![
            ExportInfo { id: 0, name: "a".into(), size: 1 << 20, ..Default::default() },
            ExportInfo { id: 1, name: "b".into(), size: 1 << 20, allow: vec!["CN=host-a".into()] },
        ]
    }
    fn block_size(&self) -> u64 {
        4096
    }
}

/// Runs the greeting and the option phase of a listener in `mode` on `input` (the
/// client's flags, then options): the outcome (an error when the input ran out) and the
/// server's bytes.
pub fn replay(input: &[u8], mode: TlsMode) -> (io::Result<Negotiated>, Vec<u8>) {
    let mut m = Memory { input, output: Vec::new() };
    let outcome = match greet(&mut m) {
        Ok(Some(mut session)) => {
            session.tls = mode;
            options(&mut m, &TwoExports, &mut session)
        }
        Ok(None) => Ok(Negotiated::Closed),
        Err(e) => Err(e),
    };
    (outcome, m.output)
}

/// Checks a `require` listener's side of a plaintext conversation: `input` and `output`
/// of [`replay`]. Every complete option the client sent was answered, in order, with
/// TLS_REQD unless it was STARTTLS (ACK or INVALID) or ABORT (ACK), or its data was over
/// the limit (TOO_BIG, then closed); the outcome is never an export.
pub fn check_tls_required(input: &[u8], outcome: &io::Result<Negotiated>, output: &[u8]) -> Result<(), String> {
    if let Ok(Negotiated::Export(vm, _)) = outcome {
        return Err(format!("export {vm} served before TLS"));
    }
    let mut replies = output.get(18..).unwrap_or_default(); // after the greeting
    let mut opts = input.get(4..).unwrap_or_default(); // after the client flags
    while opts.len() >= 16 && replies.len() >= 20 {
        let opt = u32::from_be_bytes(opts[8..12].try_into().expect("4"));
        let len = u32::from_be_bytes(opts[12..16].try_into().expect("4")) as usize;
        let (r_opt, kind) = (
            u32::from_be_bytes(replies[8..12].try_into().expect("4")),
            u32::from_be_bytes(replies[12..16].try_into().expect("4")),
        );
        let r_len = u32::from_be_bytes(replies[16..20].try_into().expect("4")) as usize;
        if r_opt != opt {
            return Err(format!("reply to option {r_opt} where {opt} was asked"));
        }
        // Data over the limit is refused (and the connection closed) whatever the option.
        let fine = kind == REP_ERR_TOO_BIG
            || match opt {
                OPT_STARTTLS => matches!(kind, REP_ACK | REP_ERR_INVALID),
                OPT_ABORT => kind == REP_ACK,
                _ => kind == REP_ERR_TLS_REQD,
            };
        if !fine {
            return Err(format!("option {opt} answered {kind:#x} before TLS"));
        }
        replies = replies.get(20 + r_len..).unwrap_or_default();
        opts = opts.get(16 + len.min(opts.len() - 16)..).unwrap_or_default();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn option(opt: u32, data: &[u8]) -> Vec<u8> {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    }

    fn go(name: &str) -> Vec<u8> {
        let mut d = (name.len() as u32).to_be_bytes().to_vec();
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        d
    }

    proptest! {
        /// Any sequence of well-framed options (known ones, unknown ones, bad data) to a
        /// `require` listener: no export, each answered as the protocol says.
        #[test]
        fn a_require_listener_serves_nothing_before_tls(
            picks in proptest::collection::vec((0u32..12, proptest::collection::vec(any::<u8>(), 0..24), 0usize..3), 0..12)
        ) {
            let mut input = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
            for (opt, junk, which) in &picks {
                let data = match (*opt, which) {
                    (OPT_GO | OPT_INFO, 0) => go("a"),
                    (OPT_GO | OPT_INFO, 1) => go("b"),
                    (OPT_EXPORT_NAME, _) => b"a".to_vec(),
                    (OPT_STARTTLS | OPT_LIST, 0) => vec![],
                    _ => junk.clone(),
                };
                input.extend(option(*opt, &data));
            }
            let (outcome, output) = replay(&input, TlsMode::Require);
            prop_assert!(check_tls_required(&input, &outcome, &output).is_ok(), "{:?}", check_tls_required(&input, &outcome, &output));
        }
    }

    #[test]
    fn oversized_option_data_is_too_big_even_for_starttls() {
        // The fuzz target's first find: STARTTLS with 4 GiB of data announced.
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(IHAVEOPT.to_be_bytes());
        input.extend(OPT_STARTTLS.to_be_bytes());
        input.extend(u32::MAX.to_be_bytes());
        let (outcome, output) = replay(&input, TlsMode::Require);
        assert!(matches!(outcome, Ok(Negotiated::Closed)), "{outcome:?}");
        assert_eq!(u32::from_be_bytes(output[18 + 12..18 + 16].try_into().unwrap()), REP_ERR_TOO_BIG);
        check_tls_required(&input, &outcome, &output).unwrap();
    }

    #[test]
    fn the_checker_catches_a_listener_that_serves_before_tls() {
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(option(OPT_GO, &go("a")));
        // TLS off: the export is served, and the checker says so.
        let (outcome, output) = replay(&input, TlsMode::Off);
        assert!(matches!(outcome, Ok(Negotiated::Export(0, _))));
        assert!(check_tls_required(&input, &outcome, &output).unwrap_err().contains("before TLS"));
        let (outcome, output) = replay(&input, TlsMode::Require);
        check_tls_required(&input, &outcome, &output).unwrap();
        // Without a certificate, the export with an allow list is refused even with TLS
        // merely offered, and not listed.
        let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
        input.extend(option(OPT_LIST, &[]));
        input.extend(option(OPT_GO, &go("b")));
        let (outcome, output) = replay(&input, TlsMode::On);
        assert!(outcome.is_err(), "input ran out after the refusal: {outcome:?}");
        let text = String::from_utf8_lossy(&output);
        assert!(text.contains("no export named `b` for this client") && !text.contains("\u{1}b"), "{text:?}");
    }

    #[test]
    fn a_hidden_export_and_a_missing_one_get_the_same_bytes() {
        // INFO, GO and META_CONTEXT for `b` (exists, this client may not
        // open it) and for `z` (no such export) differ in nothing but the name.
        for opt in [OPT_INFO, OPT_GO, OPT_LIST_META_CONTEXT] {
            let answer = |name: &str| {
                let mut input = FLAG_C_FIXED_NEWSTYLE.to_be_bytes().to_vec();
                let data = if opt == OPT_LIST_META_CONTEXT {
                    let mut d = (name.len() as u32).to_be_bytes().to_vec();
                    d.extend_from_slice(name.as_bytes());
                    d.extend_from_slice(&0u32.to_be_bytes());
                    d
                } else {
                    go(name)
                };
                input.extend(option(opt, &data));
                String::from_utf8_lossy(&replay(&input, TlsMode::On).1).replace(name, "NAME")
            };
            let (hidden, missing) = (answer("b"), answer("z"));
            assert_eq!(hidden, missing, "option {opt}");
            assert!(hidden.contains("no export named `NAME`"), "{hidden:?}");
        }
    }
}
