//! `cachevisor bench …` and `cachevisor experiment …`: the benches and the seeds'
//! experiments live in the lab binary, `cachevisor-lab`, so the operator's binary carries
//! no lab code (fio and qemu drivers, test certificates, a guest VM launcher). These two
//! commands run it with the same arguments, the way `git` runs `git-foo`: the lab binary
//! beside this one first (a build tree, an install prefix), then `PATH`. The lab's own
//! help is what `cachevisor bench --help` prints.

use anyhow::Context;
use clap::Args;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// Everything after `bench` / `experiment`, handed to the lab unchanged.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// The lab command's arguments (`cachevisor-lab bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<String>,
}

/// The lab binary's name.
const LAB: &str = "cachevisor-lab";

/// The lab binary: beside this executable, else the first on `PATH`.
fn lab() -> Option<PathBuf> {
    let beside = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join(LAB)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(LAB));
    beside.into_iter().chain(on_path).find(|p| p.is_file())
}

/// Replaces this process with `cachevisor-lab COMMAND ARGS…`; returns only on failure.
pub fn run(command: &str, a: LabArgs) -> anyhow::Result<()> {
    let Some(lab) = lab() else {
        anyhow::bail!(
            "`cachevisor {command}` runs the lab binary, {LAB}, which is neither beside {} nor on PATH \
             (build it with `cargo build --release -p cachevisor-lab`, or install it with \
             `cargo install --path crates/lab`)",
            std::env::current_exe().map(|e| e.display().to_string()).unwrap_or_else(|_| "this binary".into())
        );
    };
    let err = std::process::Command::new(&lab).arg(command).args(&a.args).exec();
    Err(err).with_context(|| format!("running {}", lab.display()))
}
