//! Where the bundled sample traces are: `$CACHEVISOR_TRACES`, `../shared/traces` beside
//! the working directory, or beside the source tree this binary was built from.

use std::path::PathBuf;

/// The bundled traces directory, or an error saying where it was looked for.
pub fn traces_dir() -> anyhow::Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(p) = std::env::var("CACHEVISOR_TRACES") {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(PathBuf::from("../shared/traces"));
    candidates.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces"));
    for c in &candidates {
        if c.join("cloudPhysicsIO.vscsi").is_file() {
            return Ok(c.clone());
        }
    }
    anyhow::bail!(
        "bundled traces not found (looked in {}); set CACHEVISOR_TRACES to the shared/traces folder",
        candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
    )
}

/// The three bundled real traces used by the demo and the benches.
pub fn demo_traces() -> anyhow::Result<Vec<PathBuf>> {
    let d = traces_dir()?;
    Ok(["websearch-small.mqsim.txt", "tpcc-small.mqsim.txt", "cloudPhysicsIO.vscsi"]
        .iter()
        .map(|f| d.join(f))
        .collect())
}
