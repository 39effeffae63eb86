//! The `cachevisor-guest` binary as a user runs it: its errors name the bad argument.
//! (Also what makes `cargo test --workspace` build the binary the CLI's guest tests run.)

use std::process::Command;

#[test]
fn bad_arguments_are_named_and_a_missing_vssd_is_a_clear_error() {
    let bin = env!("CARGO_BIN_EXE_cachevisor-guest");
    let o = Command::new(bin)
        .args(["--vssd", "x", "--control", "c", "--origin", "o", "--mode", "sometimes"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("write-through"), "names the choices");
    let o = Command::new(bin)
        .args(["--vssd", "/nonexistent/vssd", "--control", "/nonexistent/c", "--origin", "/nonexistent/o"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent"), "{}", String::from_utf8_lossy(&o.stderr));
}
