//! The operator binary the lab drives as a process (`cachevisor serve` for the daemon
//! benches and the vSSD experiment, `cachevisor simulate` for the whole-process rows):
//! `cachevisor` beside the lab binary, else on `PATH` (`cachevisor_cli::sibling_binary`).

use std::path::PathBuf;

/// The `cachevisor` binary, or an error saying where it was looked for.
pub(crate) fn cachevisor() -> anyhow::Result<PathBuf> {
    cachevisor_cli::sibling_binary::find("cachevisor").map_err(|looked| {
        let looked: Vec<String> = looked.iter().map(|p| p.display().to_string()).collect();
        anyhow::anyhow!(
            "the operator binary, cachevisor, is not beside cachevisor-lab nor on PATH (looked at {})",
            looked.join(", ")
        )
    })
}
