//! Where the workspace's binaries are for a test that runs them as processes. Cargo
//! hands a package's own binaries to its integration tests (`CARGO_BIN_EXE_…`), not
//! another package's, so the kit finds them the way `cargo test` lays them out: beside
//! the test executable's `deps/` directory (`target/<profile>/`). `CACHEVISOR_BIN_DIR`
//! overrides the directory (an installed tree, a release build).

use std::path::PathBuf;
use std::sync::OnceLock;

/// The directory holding the workspace's binaries.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CACHEVISOR_BIN_DIR") {
        return d.into();
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    let mut d = exe.parent().expect("the test executable's directory").to_path_buf();
    if d.ends_with("deps") {
        d.pop();
    }
    d
}

/// The path of binary `name`, checked: a test that needs a binary cargo did not build
/// fails saying how to build it.
pub fn path(name: &str) -> PathBuf {
    let p = dir().join(name);
    assert!(
        p.is_file(),
        "no {} (build it first: `cargo build --workspace`, which `cargo test --workspace` does; or set CACHEVISOR_BIN_DIR)",
        p.display()
    );
    p
}

fn cached(cell: &'static OnceLock<String>, name: &str) -> &'static str {
    cell.get_or_init(|| path(name).to_string_lossy().into_owned())
}

/// The operator binary, `cachevisor`.
pub fn cachevisor() -> &'static str {
    static CELL: OnceLock<String> = OnceLock::new();
    cached(&CELL, "cachevisor")
}

/// The lab binary (benches and the seeds' experiments), `cachevisor-lab`.
pub fn lab() -> &'static str {
    static CELL: OnceLock<String> = OnceLock::new();
    cached(&CELL, "cachevisor-lab")
}

/// The guest-side cache manager, `cachevisor-guest`.
pub fn guest() -> &'static str {
    static CELL: OnceLock<String> = OnceLock::new();
    cached(&CELL, "cachevisor-guest")
}
