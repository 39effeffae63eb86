//! Counts of what the daemon's guards refused or cut short (connection limits, the
//! handshake pool, the API's token check and lockout, idle API connections), kept by the
//! guards themselves and read into the status and the metrics. Its own module so that the
//! guards, which sit below the status, depend on nothing above them.

/// Counts of what the daemon's limits refused: API calls with a wrong token
/// and lockouts, NBD connections over the limit or that did not finish their handshake in
/// time, metadata commits that failed (a full file system) and were retried.
#[derive(Debug, Default)]
pub struct Guards {
    /// API calls with a missing or wrong token.
    pub api_auth_failures: std::sync::atomic::AtomicU64,
    /// API lockouts begun.
    pub api_lockouts: std::sync::atomic::AtomicU64,
    /// NBD or API connections refused at the connection limit.
    pub connections_refused: std::sync::atomic::AtomicU64,
    /// NBD connections closed for not finishing the handshake in time.
    pub handshake_timeouts: std::sync::atomic::AtomicU64,
    /// API connections closed after moving no byte for `api.idle_timeout`.
    pub api_idle_closes: std::sync::atomic::AtomicU64,
    /// Connections still in their handshake (or first API request) closed to make room
    /// for newer ones (`preauth.rs`).
    pub handshakes_evicted: std::sync::atomic::AtomicU64,
}

/// A reading of [`Guards`].
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct GuardCounts {
    /// See [`Guards`].
    pub api_auth_failures: u64,
    /// See [`Guards`].
    pub api_lockouts: u64,
    /// See [`Guards`].
    pub connections_refused: u64,
    /// See [`Guards`].
    pub handshake_timeouts: u64,
    /// See [`Guards`].
    pub api_idle_closes: u64,
    /// See [`Guards`].
    pub handshakes_evicted: u64,
    /// Metadata commits that failed (and were retried after a pause; the data path's
    /// count).
    pub commit_failures: u64,
    /// Cache reads whose bytes failed their checksum (the data path's count).
    pub checksum_mismatches: u64,
    /// Client requests that waited for a commit to free a cache slot (the data path's
    /// count).
    pub slot_waits: u64,
}

impl Guards {
    /// The counts now, with the data path's counts (failed commits, cache reads that
    /// failed their checksum, requests that waited for a slot).
    pub fn read(&self, dp: cachevisor_datapath::DataPathCounts) -> GuardCounts {
        use std::sync::atomic::Ordering::Relaxed;
        GuardCounts {
            api_auth_failures: self.api_auth_failures.load(Relaxed),
            api_lockouts: self.api_lockouts.load(Relaxed),
            connections_refused: self.connections_refused.load(Relaxed),
            handshake_timeouts: self.handshake_timeouts.load(Relaxed),
            api_idle_closes: self.api_idle_closes.load(Relaxed),
            handshakes_evicted: self.handshakes_evicted.load(Relaxed),
            commit_failures: dp.commit_failures,
            checksum_mismatches: dp.checksum_mismatches,
            slot_waits: dp.slot_waits,
        }
    }
}
