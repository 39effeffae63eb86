//! Where another of the project's binaries is, found the way `git` finds `git-foo`:
//! beside the running executable first (a build tree, an install prefix), then on
//! `PATH`. The operator's binary finds the lab this way (`cachevisor bench`), and the
//! lab finds the operator's binary it drives as a process.

use std::path::PathBuf;

/// Binary `name` beside this executable, else the first on `PATH`; `Err` lists every
/// place looked at.
pub fn find(name: &str) -> Result<PathBuf, Vec<PathBuf>> {
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join(name)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name));
    let mut looked = Vec::new();
    for p in beside.into_iter().chain(on_path) {
        if p.is_file() {
            return Ok(p);
        }
        looked.push(p);
    }
    Err(looked)
}
