//! The exit statuses of the commands that talk to a running daemon (`status`, `destage`,
//! `prewarm`, `reload`), which scripts and monitoring rely on (documented in docs/daemon.md
//! and in each command's `--help`; tested in `tests/exit_status.rs`):
//!
//! | status | meaning |
//! |---|---|
//! | 0 | done (`status`: every vDisk served through its cache) |
//! | 1 | the daemon refused, or the operation failed (the message says why) |
//! | 2 | bad arguments |
//! | 3 | no daemon answered at the API address |
//! | 4 | the API token is missing or wrong, or the API locked out wrong tokens |
//! | 5 | `status`: a vDisk runs in pass-through (its cache failed): served, degraded |

/// Refused or failed.
pub const FAILED: i32 = 1;
/// No daemon at the address.
pub const UNREACHABLE: i32 = 3;
/// The token was not accepted.
pub const UNAUTHORIZED: i32 = 4;
/// A vDisk runs in pass-through.
pub const DEGRADED: i32 = 5;

/// The text `--help` shows for the exit statuses.
pub const HELP: &str = "Exit status: 0 done; 1 refused or failed; 2 bad arguments; 3 no daemon answered at --api; 4 the API token was not accepted; 5 (status) a vDisk runs in pass-through.";

/// An error that ends the command with `code`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    /// The exit status.
    pub code: i32,
    /// What went wrong.
    pub message: String,
}

/// `message` ending the command with `code`.
pub fn exit(code: i32, message: impl Into<String>) -> anyhow::Error {
    Exit { code, message: message.into() }.into()
}

/// The exit status for `e` (1 unless it carries one).
pub fn code_of(e: &anyhow::Error) -> i32 {
    e.downcast_ref::<Exit>().map_or(FAILED, |x| x.code)
}

/// The error for a call to `url` that failed: the daemon's own message (its JSON
/// `error`) when it answered, with the status that says which kind it was.
pub fn api_error(url: &str, e: ureq::Error) -> anyhow::Error {
    match e {
        ureq::Error::Status(code, r) => {
            let body = r.into_string().unwrap_or_default();
            let why = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(body);
            let status = if matches!(code, 401 | 403 | 429) { UNAUTHORIZED } else { FAILED };
            exit(status, format!("{url}: {code}: {why}"))
        }
        e => exit(UNREACHABLE, format!("asking {url}: {e} (is `cachevisor serve` running with an [api] section?)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_error_keeps_its_code_through_context() {
        use anyhow::Context;
        let e: anyhow::Result<()> = Err(exit(UNREACHABLE, "no daemon"));
        let e = e.context("status").unwrap_err();
        assert_eq!(code_of(&e), UNREACHABLE);
        assert_eq!(code_of(&anyhow::anyhow!("plain")), FAILED);
        assert!(HELP.contains("3 no daemon"));
    }
}
