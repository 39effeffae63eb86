//! The daemon's core: the engine (which decides) and the files (which hold the bytes),
//! behind one lock. Every NBD command becomes an engine call whose device operations are
//! executed against the cache store and the backing files before the reply, so the engine
//! state and the bytes on disk never disagree. Serializing on one lock is the simple,
//! safe first shape; a sharded or queue-based data path is the speed work to come.

use crate::config::{Config, Resolved};
use crate::executor::{execute, Client, Devices, OpError};
use cachevisor_engine::{Engine, EngineConfig, FillMode, Output, PartitionMode};
use cachevisor_policy::{registry, Pool, VmDemand};
use cachevisor_trace::{Op, Request, VmId};
use std::fs::{File, OpenOptions};
use std::sync::Mutex;
use std::time::Instant;

/// One served vDisk.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    /// Export name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
}

/// Per-export counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExportStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests.
    pub writes: u64,
    /// Block accesses that hit.
    pub hit_blocks: u64,
    /// Block accesses.
    pub blocks: u64,
    /// Flushes.
    pub flushes: u64,
    /// Device errors returned as EIO.
    pub errors: u64,
}

struct Files {
    ssd: File,
    backings: Vec<File>,
}

impl Devices for Files {
    fn ssd(&self) -> &File {
        &self.ssd
    }
    fn backing(&self, vm: VmId) -> &File {
        &self.backings[vm as usize]
    }
}

struct Core {
    engine: Engine,
    files: Files,
    out: Output,
    staging: Vec<(VmId, u64, Vec<u8>)>,
    stats: Vec<ExportStats>,
}

/// The daemon: exports and the locked core.
pub struct Daemon {
    exports: Vec<ExportInfo>,
    block_size: u64,
    core: Mutex<Core>,
    start: Instant,
}

/// A failed start: which file or setting.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Bad configuration.
    #[error("config: {0}")]
    Config(String),
    /// A file could not be opened or created.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

fn open(path: &std::path::Path, create_size: Option<u64>) -> Result<File, StartError> {
    let err = |source| StartError::File { path: path.display().to_string(), source };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let exists = path.exists();
    let f = OpenOptions::new().read(true).write(true).create(create_size.is_some()).truncate(false).open(path).map_err(err)?;
    if let Some(size) = create_size {
        if !exists || f.metadata().map_err(err)?.len() < size {
            f.set_len(size).map_err(err)?;
        }
    }
    Ok(f)
}

impl Daemon {
    /// Opens (creating where configured) the cache store and backing files and sets up
    /// the engine: one partition per vDisk sized by the configured allocator.
    pub fn start(cfg: &Config) -> Result<Daemon, StartError> {
        let r: Resolved = cfg.resolve().map_err(StartError::Config)?;
        let ssd = open(&cfg.cache.path, Some(r.cache_bytes))?;
        let mut backings = Vec::new();
        let mut exports = Vec::new();
        for v in &cfg.vdisk {
            let size = v.size.as_deref().map(cachevisor_trace::units::parse_size).transpose().map_err(StartError::Config)?;
            let f = open(&v.backing, if v.backing.exists() { None } else { size })?;
            let len = f.metadata().map_err(|source| StartError::File { path: v.backing.display().to_string(), source })?.len();
            exports.push(ExportInfo { name: v.name.clone(), size: len });
            backings.push(f);
        }
        let ecfg = EngineConfig {
            block_size: r.block_size,
            slots: r.slots,
            partition: PartitionMode::Static,
            replacement: cfg.cache.replacement,
            write_policy: cfg.cache.write_policy,
            fill: FillMode::Block,
            track_last_access: false,
        };
        let mut engine = Engine::new(ecfg).map_err(StartError::Config)?;
        let mut out = Output::default();
        for (i, v) in cfg.vdisk.iter().enumerate() {
            engine.ensure_vm(i as VmId);
            if let Some(p) = v.write_policy {
                engine.set_write_policy(i as VmId, p, &mut out);
            }
        }
        let mut alloc = registry::build(&cfg.cache.allocator).map_err(StartError::Config)?;
        let demands: Vec<VmDemand> = cfg.vdisk.iter().map(|v| VmDemand { weight: v.weight, throughput_ratio: 1.0, ..Default::default() }).collect();
        let d = alloc.allocate(&Pool::new(r.slots, (r.slots / 256).max(1)), &demands);
        for (i, t) in d.targets.iter().enumerate() {
            engine.set_target(i as VmId, (*t).min(r.slots), &mut out);
        }
        let stats = vec![ExportStats::default(); exports.len()];
        Ok(Daemon { exports, block_size: r.block_size, core: Mutex::new(Core { engine, files: Files { ssd, backings }, out, staging: Vec::new(), stats }), start: Instant::now() })
    }

    /// The exports, by VM id.
    pub fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }

    /// Cache block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Counters of export `vm`.
    pub fn stats(&self, vm: VmId) -> ExportStats {
        self.lock().stats[vm as usize]
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Core> {
        // A panic while holding the lock leaves engine and files consistent up to the op
        // that failed; keep serving.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn access(&self, vm: VmId, op: Op, offset: u64, client: Client<'_>) -> Result<(), OpError> {
        let len = match &client {
            Client::Read(_, _, b) => b.len(),
            Client::Write(_, _, b) => b.len(),
            Client::None => 0,
        };
        let req = Request { time_ns: self.start.elapsed().as_nanos() as u64, vm, op, offset, len: len as u32 };
        let mut guard = self.lock();
        let Core { engine, files, out, staging, stats } = &mut *guard;
        engine.access(req.time_ns, &req, out);
        let s = &mut stats[vm as usize];
        s.blocks += out.blocks.len() as u64;
        s.hit_blocks += out.blocks.iter().filter(|b| b.hit).count() as u64;
        if op.is_write() {
            s.writes += 1;
        } else {
            s.reads += 1;
        }
        let r = execute(&out.ops, client, files, staging);
        if r.is_err() {
            s.errors += 1;
        }
        r
    }

    /// Reads `buf.len()` bytes of export `vm` at `offset` (range already checked).
    pub fn read(&self, vm: VmId, offset: u64, buf: &mut [u8]) -> Result<(), OpError> {
        self.access(vm, Op::Read, offset, Client::Read(vm, offset, buf))
    }

    /// Writes `data` to export `vm` at `offset`; with `fua`, durable before returning.
    pub fn write(&self, vm: VmId, offset: u64, data: &[u8], fua: bool) -> Result<(), OpError> {
        self.access(vm, Op::Write, offset, Client::Write(vm, offset, data))?;
        if fua {
            self.flush(vm)?;
        }
        Ok(())
    }

    /// Makes every write to export `vm` acknowledged so far durable: dirty blocks are
    /// written back and the backing file (and cache store) fsynced.
    pub fn flush(&self, vm: VmId) -> Result<(), OpError> {
        let mut guard = self.lock();
        let Core { engine, files, out, staging, stats } = &mut *guard;
        stats[vm as usize].flushes += 1;
        engine.flush(Some(vm), out);
        execute(&out.ops, Client::None, files, staging)?;
        let sync = |f: &File, kind| {
            f.sync_data().map_err(|source| OpError { kind, vm, disk_addr: 0, ssd_addr: 0, len: 0, source })
        };
        sync(&files.backings[vm as usize], cachevisor_engine::OpKind::BackingWrite)?;
        sync(&files.ssd, cachevisor_engine::OpKind::SsdWrite)
    }

    /// Sets export `vm`'s partition to `blocks` cache blocks (a shrink evicts its coldest
    /// blocks, writing dirty ones back first).
    pub fn resize(&self, vm: VmId, blocks: u64) -> Result<(), OpError> {
        let mut guard = self.lock();
        let Core { engine, files, out, staging, .. } = &mut *guard;
        engine.set_target(vm, blocks, out);
        execute(&out.ops, Client::None, files, staging)
    }

    /// Blocks export `vm` holds in the cache and its dirty blocks.
    pub fn occupancy(&self, vm: VmId) -> (u64, u64) {
        let p = self.lock().engine.partition(vm);
        (p.used, p.dirty_blocks)
    }

    /// Flushes every export (a clean stop).
    pub fn flush_all(&self) -> Result<(), OpError> {
        (0..self.exports.len()).try_for_each(|vm| self.flush(vm as VmId))
    }
}
