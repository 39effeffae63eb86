//! One request to etcd outside the membership agent, on a short-lived connection and
//! runtime of its own, bounded by a deadline: for what is rare and must be answered before
//! the caller goes on (a start's map check, a replica log's state at a takeover or a
//! resync). The agent's connection is its own thread's, and these callers are not async.

use crate::config::cluster_section::ClusterSettings;
use std::time::Duration;

/// Runs `f` against a fresh connection to `s.etcd`, all of it within `deadline`.
pub(crate) fn block_on<T>(
    s: &ClusterSettings,
    deadline: Duration,
    f: impl AsyncFnOnce(&mut etcd_client::Client) -> Result<T, etcd_client::Error>,
) -> Result<T, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let opts = etcd_client::ConnectOptions::new().with_connect_timeout(deadline).with_timeout(deadline);
        let work = async {
            let mut c = etcd_client::Client::connect(&s.etcd, Some(opts)).await?;
            f(&mut c).await
        };
        match tokio::time::timeout(deadline, work).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("etcd: no answer within {deadline:?}")),
        }
    })
}
