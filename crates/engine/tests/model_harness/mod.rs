//! What the engine's property models share: how many cases a property runs
//! (`PROPTEST_CASES` over each property's default, for longer hunts) and the `TRACE`
//! switch that prints a failing case's steps.

#![allow(dead_code)] // each model uses what it needs

/// Cases per property: `default`, or `PROPTEST_CASES` for longer hunts.
pub fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Prints what happens when `TRACE` is set (debugging a failing case).
pub fn trace(msg: impl FnOnce() -> String) {
    if std::env::var_os("TRACE").is_some() {
        eprintln!("{}", msg());
    }
}
