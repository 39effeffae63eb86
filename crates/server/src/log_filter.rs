//! The daemon's log filter: `log.level` (or RUST_LOG, which wins when set) at start, and
//! changed by a reload. The subscriber is the process's, set up by the binary; it hands
//! this module the function that swaps its filter (`tracing_subscriber::reload`), so the
//! daemon's reload can change it without knowing how logs are written (journald or a
//! terminal).

use std::sync::{Mutex, OnceLock};

type Swap = Box<dyn Fn(tracing_subscriber::EnvFilter) + Send + Sync>;

/// How the running process's filter is swapped, once the binary installed it.
static SWAP: OnceLock<Swap> = OnceLock::new();
/// The directives in force (what the last `set` applied).
static CURRENT: Mutex<String> = Mutex::new(String::new());

/// Checks `directives` (the error says what is wrong).
pub fn check(directives: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(directives).map(drop).map_err(|e| e.to_string())
}

/// The filter for `directives` from the config, unless RUST_LOG is set; and the
/// directives it stands for. rustls's per-connection warnings stay off unless asked for
/// (libnbd sends an IP address as SNI: not the operator's business).
pub fn filter(directives: &str) -> Result<(tracing_subscriber::EnvFilter, String), String> {
    let env = std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty());
    let text = env.clone().unwrap_or_else(|| directives.to_string());
    let mut f = tracing_subscriber::EnvFilter::try_new(&text).map_err(|e| format!("`{text}`: {e}"))?;
    if !text.contains("rustls") {
        f = f.add_directive("rustls=error".parse().expect("a valid directive"));
    }
    Ok((f, text))
}

/// Installs the swap (the binary, once, after setting up its subscriber with `initial`).
pub fn install(swap: Swap, initial: &str) {
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = initial.to_string();
    let _ = SWAP.set(swap);
}

/// Sets the filter to `directives` (RUST_LOG still wins); returns what is in force now,
/// or `None` when nothing changed (no subscriber installed it, or the same directives).
pub fn set(directives: &str) -> Result<Option<String>, String> {
    let Some(swap) = SWAP.get() else { return Ok(None) };
    let (f, text) = filter(directives)?;
    let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
    if *cur == text {
        return Ok(None);
    }
    swap(f);
    *cur = text.clone();
    Ok(Some(text))
}
