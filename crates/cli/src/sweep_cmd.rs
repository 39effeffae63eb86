//! `cachevisor sweep SPEC.toml`: a policy sweep (traces × sizes × policies × parameters),
//! locally across cores or on a Ray cluster. The sweep lives in the Python package
//! (`cachevisor.sweep`: Ray's API, Parquet and the plots are Python's), which runs each
//! cell through the same engine; this command runs it with the Python that has the
//! package (`$CACHEVISOR_PYTHON`, else `python3`) and says how to install it if none does.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::process::Command;

/// Options of `sweep` (documented in `cachevisor.sweep`).
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Sweep spec (TOML): `[sweep]` name and metric, `[base]` scenario, `[grid]` lists.
    pub spec: PathBuf,
    /// Output directory (default out/sweep/SPEC-NAME): results.parquet, results.csv,
    /// summary.html, and cells/ (finished cells, so a rerun resumes).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Cells at once locally (default: one per core; 1 to 1024).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub jobs: Option<u16>,
    /// Run each cell as a task on this Ray cluster (`HOST:PORT` of its head).
    #[arg(long, value_name = "ADDRESS")]
    pub ray: Option<String>,
    /// Skip the per-cell memory and time predictions.
    #[arg(long)]
    pub no_predict: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
}

/// `cachevisor sweep`.
pub fn run(a: SweepArgs) -> anyhow::Result<()> {
    let python = std::env::var_os("CACHEVISOR_PYTHON").unwrap_or_else(|| "python3".into());
    let has_package = Command::new(&python)
        .args(["-c", "import cachevisor.sweep"])
        .output()
        .with_context(|| format!("running {}", python.to_string_lossy()))?;
    if !has_package.status.success() {
        anyhow::bail!(
            "the sweep runs in the Python package, which {} cannot import ({}): install it with `pip install .` from the repository (or set CACHEVISOR_PYTHON to a Python that has it)",
            python.to_string_lossy(),
            String::from_utf8_lossy(&has_package.stderr).lines().last().unwrap_or("").trim()
        );
    }
    let mut c = Command::new(&python);
    c.args(["-m", "cachevisor", "sweep"]).arg(&a.spec);
    if let Some(o) = &a.out {
        c.arg("--out").arg(o);
    }
    if let Some(j) = a.jobs {
        c.arg("--jobs").arg(j.to_string());
    }
    if let Some(r) = &a.ray {
        c.arg("--ray").arg(r);
    }
    if a.no_predict {
        c.arg("--no-predict");
    }
    if a.quiet {
        c.arg("--quiet");
    }
    let status = c.status().with_context(|| format!("running {}", python.to_string_lossy()))?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
