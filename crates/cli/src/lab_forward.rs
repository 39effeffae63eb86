//! `cachevisor bench …` and `cachevisor experiment …`: the benches and the seeds'
//! experiments live in the lab binary, `cachevisor-lab`, so the operator's binary carries
//! no lab code (fio and qemu drivers, test certificates, a guest VM launcher). These two
//! commands run it with the same arguments, the way `git` runs `git-foo`: the lab binary
//! beside this one first (a build tree, an install prefix), then `PATH`. The lab's own
//! help is what `cachevisor bench --help` prints.

use anyhow::Context;
use clap::Args;
use std::os::unix::process::CommandExt;

/// Everything after `bench` / `experiment`, handed to the lab unchanged.
#[derive(Debug, Args)]
pub struct LabArgs {
    /// The lab command's arguments (`cachevisor-lab bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<String>,
}

/// The lab binary's name.
const LAB: &str = "cachevisor-lab";

/// Replaces this process with `cachevisor-lab COMMAND ARGS…`; returns only on failure.
pub fn run(command: &str, a: LabArgs) -> anyhow::Result<()> {
    let Ok(lab) = cachevisor_cli::sibling_binary::find(LAB) else {
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
