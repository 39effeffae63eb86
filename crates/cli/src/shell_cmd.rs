//! `cachevisor completions SHELL` and `cachevisor man`: shell completion scripts
//! (clap_complete) and manual pages (clap_mangen), both generated from the same clap
//! definitions the binary parses, so they never drift from the real options.

use std::path::PathBuf;

/// Prints the completion script for `shell` (source it, or install it where the shell
/// looks: e.g. `cachevisor completions bash > /etc/bash_completion.d/cachevisor`).
pub fn completions(shell: clap_complete::Shell, mut cmd: clap::Command) -> anyhow::Result<()> {
    clap_complete::generate(shell, &mut cmd, "cachevisor", &mut std::io::stdout());
    Ok(())
}

/// Prints the manual page of `cachevisor` (roff: `cachevisor man | man -l -`), or with
/// `out` writes one page per command into that directory (`cachevisor.1`,
/// `cachevisor-serve.1`, …).
pub fn man(out: Option<PathBuf>, cmd: clap::Command) -> anyhow::Result<()> {
    match out {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
        Some(dir) => {
            std::fs::create_dir_all(&dir)?;
            clap_mangen::generate_to(cmd, &dir)?;
            eprintln!("wrote the manual pages to {}", dir.display());
        }
    }
    Ok(())
}
