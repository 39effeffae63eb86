//! What a node believes of the records it reads from etcd: anyone
//! who can write to etcd (plain HTTP today) could wedge the cluster — a leader key with
//! no lease left it leaderless forever, an unparseable 1.5 MB member record was logged 4
//! times a second per node without end. Here every value read is capped
//! ([`MAX_VALUE`]: larger ones are ignored unread), a record that is ignored (too large,
//! unreadable, a leader key held by no lease) is logged once per change of the record
//! (its mod revision) and counted (`/metrics`: `cachevisor_cluster_bad_records`), and a
//! leader key no live lease holds is treated as absent and removed by the next
//! campaign. The map's epoch is bounded where it is decoded (`ClusterMap::decode`) and
//! never wraps (`next_map`).

use std::collections::BTreeMap;

/// Largest value a node reads from etcd (a member record of 10,000 vDisk names is
/// ~200 KiB).
pub(crate) const MAX_VALUE: usize = 1 << 20;

/// The records ignored, by key: the mod revision last logged.
#[derive(Debug, Default)]
pub(crate) struct BadRecords {
    logged: BTreeMap<String, i64>,
    /// Ignored records seen (each change of a record counted once).
    pub count: u64,
}

impl BadRecords {
    /// Notes that the record at `key` (mod revision `rev`) is ignored for `why`: logged
    /// and counted once per revision.
    pub(crate) fn note(&mut self, key: &str, rev: i64, why: &str) {
        if self.logged.get(key) == Some(&rev) {
            return;
        }
        self.logged.insert(key.to_string(), rev);
        self.count += 1;
        tracing::warn!(key = %crate::log_safe(key), revision = rev, "cluster: ignoring a record in etcd: {why}");
    }

    /// Forgets the records no longer bad (gone, or readable again) after a read of the
    /// prefix that noted `still` bad.
    pub(crate) fn keep_only(&mut self, still: &[String]) {
        self.logged.retain(|k, _| still.contains(k));
    }
}

/// Whether a value read from etcd may be looked at.
pub(crate) fn small_enough(value: &[u8]) -> Result<(), String> {
    if value.len() > MAX_VALUE {
        return Err(format!("{} bytes, more than any record a node writes ({MAX_VALUE})", value.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_record_is_noted_once_per_revision() {
        let mut b = BadRecords::default();
        b.note("members/x", 5, "unreadable");
        b.note("members/x", 5, "unreadable");
        assert_eq!(b.count, 1);
        b.note("members/x", 6, "unreadable");
        assert_eq!(b.count, 2);
        b.keep_only(&[]);
        b.note("members/x", 6, "unreadable");
        assert_eq!(b.count, 3, "noted again once it was gone and came back");
        assert!(small_enough(&vec![0u8; MAX_VALUE]).is_ok());
        assert!(small_enough(&vec![0u8; MAX_VALUE + 1]).is_err());
    }
}
