//! Taking the cache file out of a running data path and putting a new one in (the
//! day-2 SSD replacement, as Open-CAS's `casadm --remove-cache` / `--start-cache` and
//! bcache's detach do it): a detach passes every vDisk through to its backing store
//! (`Engine::set_bypass`: writes go around the cache and invalidate what they overwrite),
//! withholds every slot of the local store (`withheld.rs`: dirty blocks are written back,
//! then every block dropped, through the engine's ordinary write-back and durability
//! rules), writes a checkpoint that names no slot, and closes every descriptor of the
//! cache file — the io_uring thread's included — and, when asked, the journal (the
//! metadata directory leaving with the SSD). VMs keep running on their backing stores
//! meanwhile. An attach puts a new (empty) file in, writes the first checkpoint of a new
//! generation, gives the slots back and each vDisk its write policy and pass-through as
//! they were.
//!
//! Crash model: from the detach's checkpoint until the attach's, the durable metadata
//! names no cached block, so a restart at any moment in between — on the old file, on a
//! new one, or with no metadata left at all — finds nothing to recover and serves the
//! backing stores' bytes, which hold every acknowledged write (pass-through writes land
//! there before they are answered).

use super::DataPath;
use cachevisor_engine::Output;
use std::fs::File;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A detach that empties nothing for this long (a backing store refusing write-backs)
/// gives up and gives the cache back.
const STALL_LIMIT: Duration = Duration::from_secs(60);

/// Whether the cache file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheState {
    /// In use.
    Attached,
    /// Being emptied: every vDisk passes through, dirty blocks are written back.
    Detaching,
    /// Out: no descriptor of it is open; every vDisk passes through.
    Detached,
    /// A new file is being put in.
    Attaching,
}

impl CacheState {
    /// The lowercase word the API and status use.
    pub fn as_str(self) -> &'static str {
        match self {
            CacheState::Attached => "attached",
            CacheState::Detaching => "detaching",
            CacheState::Detached => "detached",
            CacheState::Attaching => "attaching",
        }
    }
}

/// What a detach did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DetachReport {
    /// Dirty blocks written back to the backing stores.
    pub written_back: u64,
    /// Blocks the cache held (dropped, after those write-backs).
    pub dropped: u64,
}

impl DataPath {
    /// Whether the cache file is in ([`Self::detach_cache`]).
    pub fn cache_state(&self) -> CacheState {
        self.shared.lock().cache
    }

    /// Empties the cache and lets go of its file (see the module doc); `with_metadata`
    /// also closes the journal. `progress(blocks still cached, of them dirty)` is called
    /// while it empties. On a failure the cache is given back as it was (still attached)
    /// and the error says why.
    pub fn detach_cache(
        &self,
        with_metadata: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DetachReport, String> {
        let s = &self.shared;
        let dropped = {
            let mut core = s.lock();
            if core.cache != CacheState::Attached {
                return Err(format!("the cache is {}", core.cache.as_str()));
            }
            core.cache = CacheState::Detaching;
            let vms = core.names.len() as u32;
            core.saved_modes =
                (0..vms).map(|v| (core.engine.partition(v).write_policy, core.engine.bypassed(v))).collect();
            for v in 0..vms {
                core.engine.set_bypass(v, true);
            }
            let used = (0..vms).map(|v| core.engine.partition(v).used).sum::<u64>();
            s.unlock(core);
            used
        };
        let written = s.written_back.load(SeqCst);
        let in_use = self.cache_slots();
        match self.empty_slots(0, in_use, false, progress).and_then(|_| self.checkpoint_now()) {
            Ok(()) => {}
            Err(e) => {
                self.give_back();
                return Err(format!("{e}; the cache stays attached"));
            }
        }
        self.stop_ring();
        if with_metadata {
            s.persist.lock().unwrap_or_else(|p| p.into_inner()).detach();
        }
        *s.ssd.write().unwrap_or_else(|p| p.into_inner()) = None;
        s.lock().cache = CacheState::Detached;
        tracing::info!(
            with_metadata,
            blocks = dropped,
            "cache detached: every vDisk passes through to its backing store"
        );
        Ok(DetachReport { written_back: s.written_back.load(SeqCst) - written, dropped })
    }

    /// Withholds local slots `lo..lo + n` and waits until they hold nothing (dirty
    /// blocks written back first; with `keep`, clean ones moved into free slots outside
    /// the run first, `Engine::withhold_moving`): `progress(blocks still cached there, of
    /// them dirty)`. Slots already withheld stay so. Returns the blocks moved.
    pub(super) fn empty_slots(
        &self,
        lo: u32,
        n: u32,
        keep: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<u64, String> {
        let mut started = Ok(0);
        self.run_job(|e, out| {
            started = if keep { e.withhold_moving(lo, n, out) } else { e.withhold(lo, n, out).map(|()| 0) }
        })
        .map_err(|f| format!("a cache job failed: {f:?}"))?;
        let moved = started?;
        let mut best = (u64::MAX, Instant::now());
        loop {
            let (ready, left) = self.with_engine(|e| (e.withheld_ready(lo, n), e.withhold_cost(lo, n)));
            if ready {
                return Ok(moved);
            }
            let (cached, dirty) = (u64::from(left.cached), u64::from(left.dirty));
            progress(cached, dirty);
            if cached < best.0 {
                best = (cached, Instant::now());
            } else if best.1.elapsed() > STALL_LIMIT {
                return Err(format!(
                    "{cached} cached blocks ({dirty} dirty) could not be emptied in {} s (see the log for failed write-backs)",
                    STALL_LIMIT.as_secs()
                ));
            }
            self.run_job(|e, out| {
                e.withhold_step(out);
            })
            .map_err(|f| format!("a cache job failed: {f:?}"))?;
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Ends the io_uring thread (its descriptor of the cache file closed) when it runs.
    fn stop_ring(&self) {
        let s = &self.shared;
        s.ring_stop.store(true, SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.exec.ring_on() && Instant::now() < deadline {
            s.exec.ring_notify().notify_one();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Gives the slots back and each vDisk its modes as before the detach (as a job: a
    /// failed detach may leave dirty blocks, which a write-through vDisk writes back).
    fn give_back(&self) {
        let n = self.cache_slots();
        let modes = std::mem::take(&mut self.shared.lock().saved_modes);
        let r = self.run_job(|e, out| {
            e.return_slots(0, n);
            let mut one = Output::default();
            for (v, (policy, bypassed)) in modes.into_iter().enumerate() {
                e.set_bypass(v as u32, bypassed);
                if !bypassed {
                    e.set_write_policy(v as u32, policy, &mut one);
                    out.ops.extend_from_slice(&one.ops);
                }
            }
        });
        if let Err(f) = r {
            tracing::error!(failure = ?f, "giving the cache back: a write-back failed (the blocks stay dirty and cached)");
        }
        self.shared.lock().cache = CacheState::Attached;
    }

    /// Puts `file` in as the cache (see the module doc); `with_metadata` reopens the
    /// journal the detach closed, `io_uring` restarts the io_uring thread on an O_DIRECT
    /// file. `direct` says how `file` was opened: it must be as the first one was. On a
    /// failure the cache stays detached.
    pub fn attach_cache(&self, file: File, direct: bool, with_metadata: bool, io_uring: bool) -> Result<(), String> {
        let s = &self.shared;
        {
            let mut core = s.lock();
            if core.cache != CacheState::Detached {
                return Err(format!("the cache is {}", core.cache.as_str()));
            }
            if direct != s.direct {
                return Err(format!(
                    "the new cache file opens {} and the first one {}: give cache.direct the same outcome (a file system with or without O_DIRECT for both)",
                    if direct { "O_DIRECT" } else { "buffered" },
                    if s.direct { "O_DIRECT" } else { "buffered" }
                ));
            }
            core.cache = CacheState::Attaching;
        }
        let back_out = |e: String| {
            *s.ssd.write().unwrap_or_else(|p| p.into_inner()) = None;
            let mut persist = s.persist.lock().unwrap_or_else(|p| p.into_inner());
            if with_metadata || persist.detached() {
                persist.detach();
            }
            drop(persist);
            s.lock().cache = CacheState::Detached;
            Err(format!("{e}; the cache stays detached"))
        };
        if with_metadata {
            if let Err(e) = s.persist.lock().unwrap_or_else(|p| p.into_inner()).reattach() {
                return back_out(format!("the metadata directory: {e}"));
            }
        }
        // The new store gets an identity of its own: named by the new generation's
        // checkpoint (no slot in use yet, it opens the journal before any slot can be
        // taken), then written into it.
        let label = {
            let mut persist = s.persist.lock().unwrap_or_else(|p| p.into_inner());
            let l = cachevisor_store::cache_label::Label::new(persist.next_generation(), s.bs);
            persist.set_label(cachevisor_store::cache_label::Expected {
                id: l.id,
                generation: l.generation,
                previous: l.generation,
            });
            l
        };
        let file = Arc::new(file);
        *s.ssd.write().unwrap_or_else(|p| p.into_inner()) = Some(file.clone());
        if let Err(e) = self.checkpoint_now() {
            return back_out(e);
        }
        if let Err(e) = cachevisor_store::cache_label::write(&file, &label) {
            return back_out(format!("writing the new cache store's label: {e}"));
        }
        if direct && io_uring && s.faults.is_none() {
            s.ring_stop.store(false, SeqCst);
            if let Some(h) = super::ring::start(s.clone()) {
                s.exec.set_ring(true);
                self.threads.lock().unwrap_or_else(|p| p.into_inner()).push(h);
            }
        }
        self.give_back();
        tracing::info!("cache attached: the vDisks are cached again");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{block_at as pattern, open_wb};
    use cachevisor_engine::WritePolicy;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    const BS: u64 = 4096;

    fn open(dir: &std::path::Path, io_uring: bool) -> DataPath {
        open_wb(dir, 48, 2, io_uring)
    }

    /// A new, empty cache file where the old one was (the SSD replaced).
    fn new_cache_file(dir: &std::path::Path) -> (File, bool) {
        let path = dir.join("cache.img");
        std::fs::remove_file(&path).unwrap();
        std::fs::File::create(&path).unwrap();
        cachevisor_store::backing::open_cache_store(&path, 48 * BS, cachevisor_store::backing::DirectIo::Auto).unwrap()
    }

    /// Clients write and read versioned blocks (each thread its own blocks: every read
    /// must return the last version written) while the cache is detached and attached
    /// again three times — with and without its metadata, the old file replaced by an
    /// empty one each time; then every write is flushed, the data path stops as a crash
    /// would, and a restart on the last file and metadata reads every block's last
    /// version back.
    fn swaps_under_clients(io_uring: bool) {
        let dir = tempfile::tempdir().unwrap();
        let dp = Arc::new(open(dir.path(), io_uring));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients: Vec<_> = (0..4u64)
            .map(|t| {
                let (dp, stop) = (dp.clone(), stop.clone());
                std::thread::spawn(move || {
                    let vm = (t % 2) as u32;
                    let base = (t / 2) * 32;
                    let mut last: HashMap<u64, u64> = HashMap::new();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                    let mut i = 0u64;
                    while !stop.load(SeqCst) || i < 200 {
                        i += 1;
                        let b = base + rng.gen_range(0..32u64);
                        if rng.gen_bool(0.5) {
                            dp.write(vm, b * BS, &pattern(vm, b, i), rng.gen_bool(0.05)).unwrap();
                            last.insert(b, i);
                        } else {
                            let mut buf = vec![0u8; BS as usize];
                            dp.read(vm, b * BS, &mut buf).unwrap();
                            let want = last.get(&b).map_or(vec![0u8; BS as usize], |&v| pattern(vm, b, v));
                            assert!(buf == want, "thread {t} step {i}: block {b} is not its last write");
                        }
                    }
                    (vm, last)
                })
            })
            .collect();
        for cycle in 0..3 {
            std::thread::sleep(Duration::from_millis(30));
            let with_metadata = cycle != 1;
            let report = dp.detach_cache(with_metadata, &mut |_, _| {}).unwrap();
            assert_eq!(dp.cache_state(), CacheState::Detached);
            dp.with_engine(|e| {
                assert_eq!((0..2).map(|v| e.partition(v).used).sum::<u64>(), 0, "cycle {cycle}: emptied");
                assert!((0..2).all(|v| e.bypassed(v)));
            });
            assert!(report.dropped > 0, "cycle {cycle}: the clients had cached blocks: {report:?}");
            let e = dp.detach_cache(with_metadata, &mut |_, _| {}).unwrap_err();
            assert!(e.contains("detached"), "{e}");
            std::thread::sleep(Duration::from_millis(30)); // the clients pass through
            let (file, direct) = new_cache_file(dir.path());
            dp.attach_cache(file, direct, with_metadata, io_uring).unwrap();
            dp.with_engine(|e| {
                assert!((0..2).all(|v| !e.bypassed(v) && e.partition(v).write_policy == WritePolicy::Wb));
                e.check_invariants()
            })
            .unwrap();
        }
        std::thread::sleep(Duration::from_millis(30));
        stop.store(true, SeqCst);
        let written: Vec<(u32, HashMap<u64, u64>)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        assert!(dp.with_engine(|e| e.partition(0).dirty_blocks + e.partition(1).dirty_blocks) > 0, "cached again");
        dp.flush(0).unwrap();
        dp.halt();
        drop(dp);
        let dp = open(dir.path(), io_uring);
        for (vm, last) in written {
            for (b, v) in last {
                let mut buf = vec![0u8; BS as usize];
                dp.read(vm, b * BS, &mut buf).unwrap();
                assert!(buf == pattern(vm, b, v), "after the restart: vm {vm} block {b}");
            }
        }
    }

    #[test]
    fn swapping_the_cache_file_under_clients_loses_no_write() {
        swaps_under_clients(true);
    }

    #[test]
    fn swapping_the_cache_file_without_io_uring_loses_no_write() {
        swaps_under_clients(false);
    }

    #[test]
    fn an_attach_of_a_file_opened_otherwise_is_refused_and_the_cache_stays_out() {
        let dir = tempfile::tempdir().unwrap();
        let dp = open(dir.path(), false);
        dp.write(0, 0, &pattern(0, 0, 1), false).unwrap();
        dp.detach_cache(false, &mut |_, _| {}).unwrap();
        let (file, direct) = new_cache_file(dir.path());
        let e = dp.attach_cache(file, !direct, false, false).unwrap_err();
        assert!(e.contains("O_DIRECT"), "{e}");
        assert_eq!(dp.cache_state(), CacheState::Detached);
        let mut buf = vec![0u8; BS as usize];
        dp.read(0, 0, &mut buf).unwrap();
        assert!(buf == pattern(0, 0, 1), "passes through to what was written back");
    }
}
