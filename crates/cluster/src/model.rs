//! ELICA's system model (§3.2 (c), Table 3): nodes with a local SSD cache, VMs placed on
//! them, each VM's ideal cache size from its stack distances (Eq. 1), the per-node check
//! that the ideal sizes fit (Eq. 2), and the average latency of a VM given its local and
//! remote cache (Eq. 3) — what the allocation minimizes in sum (Eq. 4).

use crate::ownership::NodeId;
use cachevisor_analysis::histogram::DistanceHistogram;

/// The latencies of Table 3, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latencies {
    /// L_SSD_local: a hit in the local SSD cache.
    pub ssd_local_us: f64,
    /// L_SSD_remote: a hit in a remote node's SSD cache (the SSD alone).
    pub ssd_remote_us: f64,
    /// L_Network: what reaching a remote node adds.
    pub network_us: f64,
    /// L_HDD: a miss, served by the disks.
    pub hdd_us: f64,
}

/// Which stack distance Eq. 1 sizes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum IdealForm {
    /// The maximum stack distance (ELICA's Eq. 1 as written).
    Max,
    /// The distance covering this fraction of the reuses (0..=1): real workloads have a
    /// few very long distances (§3.2 (c)), which the maximum would size for.
    Percentile(f64),
}

/// Eq. 1: the ideal cache size of a VM in blocks, (SD + 1), from its stack-distance
/// histogram; 0 for a VM with no reuse at all.
pub fn ideal_blocks(h: &DistanceHistogram, form: IdealForm) -> u64 {
    match form {
        IdealForm::Max => h.max_distance().map_or(0, |d| d + 1),
        IdealForm::Percentile(p) => h.size_covering_reuses(p).unwrap_or(0),
    }
}

/// Eq. 2: whether every node's VMs' ideal sizes fit its local cache. `vms` is (home
/// node, ideal blocks) per VM, `capacity` each node's cache in blocks.
pub fn ideal_fits(vms: &[(NodeId, u64)], capacity: &[u64]) -> bool {
    let mut used = vec![0u64; capacity.len()];
    for &(node, ideal) in vms {
        used[node as usize] = used[node as usize].saturating_add(ideal);
    }
    used.iter().zip(capacity).all(|(u, c)| u <= c)
}

/// Eq. 3: a VM's average latency with `local` and `remote` blocks of cache and hit ratio
/// `hit_ratio` at their sum (hits are spread over the cache evenly: a share
/// remote ÷ total of them pays the remote latency).
pub fn avl(l: &Latencies, hit_ratio: f64, local: u64, remote: u64) -> f64 {
    let c = local + remote;
    let miss = (1.0 - hit_ratio) * l.hdd_us;
    if c == 0 {
        return l.hdd_us;
    }
    let hit = (local as f64 * l.ssd_local_us + remote as f64 * (l.ssd_remote_us + l.network_us)) / c as f64;
    hit_ratio * hit + miss
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAT: Latencies = Latencies { ssd_local_us: 100.0, ssd_remote_us: 100.0, network_us: 50.0, hdd_us: 8000.0 };

    #[test]
    fn eq1_sizes_from_the_maximum_or_a_percentile_of_the_distances() {
        let mut h = DistanceHistogram::exact();
        for d in [0u64, 0, 1, 2, 2, 2, 3, 99] {
            h.add(Some(d), 1.0);
        }
        h.add(None, 5.0); // cold misses do not size anything
        assert_eq!(ideal_blocks(&h, IdealForm::Max), 100, "SD 99 + 1");
        assert_eq!(ideal_blocks(&h, IdealForm::Percentile(0.75)), 3, "6 of 8 reuses at distance ≤ 2");
        assert_eq!(ideal_blocks(&DistanceHistogram::exact(), IdealForm::Max), 0);
    }

    #[test]
    fn eq2_checks_each_node_alone() {
        assert!(ideal_fits(&[(0, 40), (0, 60), (1, 10)], &[100, 10]));
        assert!(!ideal_fits(&[(0, 40), (0, 61), (1, 10)], &[100, 10]), "node 0 is 1 short");
        assert!(!ideal_fits(&[(1, 11)], &[100, 10]), "node 1 is short however idle node 0 is");
    }

    #[test]
    fn eq3_weighs_hits_by_where_the_cache_is() {
        assert_eq!(avl(&LAT, 0.9, 0, 0), 8000.0, "no cache: every access misses");
        assert!((avl(&LAT, 0.5, 10, 0) - (0.5 * 100.0 + 0.5 * 8000.0)).abs() < 1e-9);
        assert!((avl(&LAT, 0.5, 0, 10) - (0.5 * 150.0 + 0.5 * 8000.0)).abs() < 1e-9);
        // Half remote: the hits pay the mean of the two.
        assert!((avl(&LAT, 0.8, 5, 5) - (0.8 * 125.0 + 0.2 * 8000.0)).abs() < 1e-9);
    }
}
