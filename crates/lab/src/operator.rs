//! The operator binary the lab drives as a process (`cachevisor serve` for the daemon
//! benches and the vSSD experiment, `cachevisor simulate` for the whole-process rows):
//! `cachevisor` beside the lab binary (a build tree, an install prefix), else on `PATH`.

use std::path::PathBuf;

/// The `cachevisor` binary, or an error saying where it was looked for.
pub(crate) fn cachevisor() -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe()?.parent().map(|d| d.join("cachevisor"));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("cachevisor"));
    let mut looked = Vec::new();
    for p in beside.into_iter().chain(on_path) {
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p.display().to_string());
    }
    anyhow::bail!(
        "the operator binary, cachevisor, is not beside cachevisor-lab nor on PATH (looked at {})",
        looked.join(", ")
    )
}
