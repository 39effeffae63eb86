//! The API token for the daemon's mutating calls, as `destage` and `prewarm` take it:
//! `--token`, `CACHEVISOR_API_TOKEN`, or `--token-file` (the daemon's `api-token`).

use anyhow::{bail, Context};
use std::path::PathBuf;

/// The token from `token` or `token_file`; `what` names the command in the error.
pub fn resolve(token: &Option<String>, token_file: &Option<PathBuf>, what: &str) -> anyhow::Result<String> {
    match (token, token_file) {
        (Some(t), _) => Ok(t.clone()),
        (None, Some(f)) => Ok(cachevisor_files::bounded_read::read_to_string(f, 1 << 20)
            .with_context(|| format!("reading the API token from {}", f.display()))?
            .trim()
            .to_string()),
        (None, None) => bail!("{what} needs the API token: --token, CACHEVISOR_API_TOKEN, or --token-file (the daemon prints where it keeps it)"),
    }
}
