//! Starting a data path: its threads (device threads, the io_uring thread where it
//! applies, the committer, the ticker) around an engine replayed from its metadata
//! (`DataPath::start`), and a fresh one in a directory for tests and benches (`open_in`).

use super::*;

impl DataPath {
    /// Starts the data path on `s.engine` (replayed from `s.persist`'s metadata), turning
    /// on persistent mode, with device, commit and timer threads.
    pub fn start(s: Setup) -> DataPath {
        let Setup {
            mut engine,
            persist,
            ssd,
            direct,
            devices,
            backings,
            names,
            threads,
            schedule,
            reserve,
            error_threshold,
            io_uring,
            peers,
            sums,
            seal_after,
            faults,
        } = s;
        let backings = match &faults {
            Some(f) => backings.into_iter().map(|b| crate::fault_devices::faulty_backing(b, f)).collect(),
            None => backings,
        };
        engine.set_persistent(reserve);
        engine.set_seal_after(seal_after.as_nanos() as u64);
        engine.set_schedule(0, schedule);
        engine.set_error_threshold(error_threshold);
        let bs = engine.config().block_size;
        let layout = engine.layout().clone();
        let ssd: store_devices::CacheSlot = Arc::new(RwLock::new(Some(Arc::new(ssd))));
        let devices: Vec<(store_devices::CacheSlot, bool)> = devices
            .into_iter()
            .map(|d| match d {
                Some((f, direct)) => (Arc::new(RwLock::new(Some(Arc::new(f)))), direct),
                None => (Arc::new(RwLock::new(None)), false),
            })
            .collect();
        let n = names.len();
        let engine_ram = engine.ram_stats().slots;
        let core = Core {
            engine,
            waiting: HashMap::new(),
            bufs: HashMap::new(),
            cache_sources: Default::default(),
            work: VecDeque::new(),
            background: VecDeque::new(),
            background_busy: 0,
            commit: None,
            committing: false,
            stop: false,
            callbacks: Vec::new(),
            removed: names.iter().map(|n| n.is_empty()).collect(),
            names,
            stats: vec![ExportStats::default(); n],
            meta: Vec::new(),
            jobs: HashMap::new(),
            observe: None,
            on_interval: None,
            on_sample: None,
            recorder: None,
            want_checkpoint: false,
            quiet: false,
            cache: CacheState::Attached,
            saved_modes: Vec::new(),
            device_removals: Default::default(),
            ram: crate::ram_memory::RamMemory::new(engine_ram, bs),
        };
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            wake: Condvar::new(),
            commit_cv: Condvar::new(),
            stores: RwLock::new(
                crate::fault_devices::wrap_stores(
                    store_devices::store_devices(&layout, bs, (&ssd, direct), &devices, peers.as_ref()),
                    faults.as_ref(),
                )
                .into_iter()
                .map(Arc::new)
                .collect(),
            ),
            ssd,
            device_files: RwLock::new(devices.clone()),
            ring_gen: Default::default(),
            ring_mask: 1.into(),
            persist: Mutex::new(persist),
            ring_stop: Default::default(),
            local_slots: (layout.range(cachevisor_engine::LOCAL).1 as u32).into(),
            direct,
            backings: RwLock::new(backings),
            bs,
            layout: RwLock::new(Arc::new(layout.clone())),
            start: Instant::now(),
            calls: Default::default(),
            checkpoints: Default::default(),
            commit_failures: Default::default(),
            exec: crate::executors::Executors::new(threads),
            written_back: Default::default(),
            halted: Default::default(),
            ticks: Default::default(),
            busy: Default::default(),
            faults,
            replicator: Default::default(),
            holds: Default::default(),
            io_pool: Default::default(),
            sums,
        });
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let s = shared.clone();
            handles.push(named(format!("cv-device-{i}"), move || s.device_thread()));
        }
        if direct && io_uring && shared.faults.is_none() {
            if let Some(h) = ring::start(shared.clone()) {
                shared.exec.set_ring(true);
                handles.push(h);
                tracing::info!("cache store: O_DIRECT through io_uring");
            }
        }
        let s = shared.clone();
        handles.push(named("cv-committer".into(), move || s.committer()));
        let s = shared.clone();
        handles.push(named("cv-ticker".into(), move || s.ticker(Duration::from_millis(20))));
        DataPath { shared, threads: Mutex::new(handles), hints: Default::default() }
    }

    /// Opens (or creates) a cache of `cfg.slots` blocks in `dir` (`cache.img`, metadata in
    /// `meta/`) in front of `vms` disk files `disk{N}.img` of `disk` bytes, replays the
    /// metadata into a new engine, writes the first checkpoint and starts (for benches and
    /// tests, with `faults` on every device when given; the daemon has its own start with
    /// its checks).
    #[allow(clippy::too_many_arguments)]
    pub fn open_in(
        dir: &std::path::Path,
        cfg: cachevisor_engine::EngineConfig,
        vms: u32,
        disk: u64,
        threads: usize,
        schedule: Schedule,
        reserve: u64,
        journal_limit: Option<u64>,
        direct: cachevisor_store::backing::DirectIo,
        io_uring: bool,
        faults: Option<Arc<cachevisor_store::faults::Faults>>,
    ) -> Result<DataPath, String> {
        let (bs, slots) = (cfg.block_size, cfg.slots);
        let spb = (bs / 512) as u32;
        let mut engine = Engine::new(cfg)?;
        let mut seals = crate::block_sums::Replayed::default();
        let (mut persist, _) = Persistence::open(&dir.join("meta"), bs, slots, &mut |r| {
            match r {
                cachevisor_store::journal::Record::Free { slot } => {
                    engine.release_slot(slot);
                    seals.free(slot);
                }
                cachevisor_store::journal::Record::Slot { slot, vm, block, valid, dirty, sums } => {
                    engine.release_slot(slot);
                    let bools = |w: &[u64]| crate::persist::bits_to_bools(w, spb);
                    engine.restore_slot(slot, vm as VmId, block, &bools(&valid), &bools(&dirty))?;
                    seals.slot(slot, vm as VmId, block, &dirty, sums);
                }
                cachevisor_store::journal::Record::Mirror { slot, vm, block, sectors } => {
                    engine.release_slot(slot);
                    seals.free(slot);
                    engine.restore_mirror(slot, vm as VmId, block, &crate::persist::bits_to_bools(&sectors, spb))?;
                }
                _ => {}
            }
            Ok(())
        })?;
        engine.settle_restored_mirrors();
        let sums = crate::block_sums::BlockSums::new(bs);
        seals.apply(&mut engine, &sums);
        let file = |name: &str, len: u64| -> Result<File, String> {
            let path = dir.join(name);
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            f.set_len(len).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(f)
        };
        let bytes = cachevisor_store::cache_label::DATA_OFFSET + slots * bs;
        drop(file("cache.img", bytes)?);
        let path = dir.join("cache.img");
        let (ssd, direct) = cachevisor_store::backing::open_cache_store(&path, bytes, direct)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut backings = Vec::new();
        for v in 0..vms {
            let f = file(&format!("disk{v}.img"), disk)?;
            backings.push(Arc::new(Backing::file(f).map_err(|e| e.to_string())?));
        }
        let names: Vec<String> = (0..vms).map(|v| format!("vm{v}")).collect();
        persist
            .checkpoint(&engine, &names, &vec![0; vms as usize], &ssd, &|r| sums.of_record(r))
            .map_err(|e| e.to_string())?;
        if let Some(limit) = journal_limit {
            persist.set_journal_limit(limit);
        }
        let error_threshold = u64::MAX;
        Ok(DataPath::start(Setup {
            engine,
            persist,
            ssd,
            direct,
            devices: Vec::new(),
            backings,
            names,
            threads,
            schedule,
            reserve,
            error_threshold,
            io_uring,
            peers: None,
            sums,
            seal_after: SEAL_AFTER,
            faults,
        }))
    }
}
