//! The guest-side cache manager (SymFlex §2.3, §4.1): an origin device read and written
//! through a [`BlockCache`] whose blocks live on an elastic vSSD, cooperating with the host
//! over the control channel — inflates grow the free list, deflates give back free blocks
//! first, then the least recently used ones (dirty ones written back to the origin
//! before they go), and blocks the host took after a deadline are dropped (dirty ones
//! reported: their writes never reached the origin). Single-threaded: the caller's I/O and
//! [`GuestCache::service`] take turns, so a deflate is answered between two requests.

use crate::balloon::{self, BlockUser, Channel};
use crate::block_cache::{Access, AppId, BlockCache, Lbn, OriginBlock, Release};
use crate::control::Control;
use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

/// A device read and written at byte offsets: the vSSD (an NBD export, or the virtio
/// disk in a guest) and the origin.
pub trait BlockDevice {
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes `data` at `offset`.
    fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()>;
    /// Makes what was written durable.
    fn flush(&mut self) -> io::Result<()>;
}

impl BlockDevice for std::fs::File {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
    fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(self, data, offset)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

/// When the origin gets a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WriteMode {
    /// At once, as the cache block: a block the host takes loses nothing.
    WriteThrough,
    /// When the block is evicted, given back, or flushed.
    WriteBack,
}

/// Per-application counters (block accesses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AppStats {
    /// Blocks found in the cache.
    pub hits: u64,
    /// Blocks brought in.
    pub misses: u64,
    /// Blocks served by the origin alone.
    pub bypassed: u64,
}

/// Counters of the manager.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// By application.
    pub apps: BTreeMap<AppId, AppStats>,
    /// Dirty blocks written to the origin.
    pub writebacks: u64,
    /// Blocks given back in deflates.
    pub released: u64,
    /// Blocks the host inflated.
    pub inflated: u64,
    /// Blocks the host took after a deadline.
    pub forced: u64,
    /// Dirty blocks among those (writes the origin never got).
    pub lost_dirty: u64,
    /// Their origin blocks.
    pub lost_origin_blocks: Vec<OriginBlock>,
}

/// The error of an I/O that found the host had taken cache blocks holding writes the
/// origin never got (write-back only; the blocks are in [`Stats::lost_origin_blocks`]).
#[derive(Debug, thiserror::Error)]
#[error("the host took cache blocks holding writes the origin never got ({0} in all)")]
pub struct LostWrites(pub u64);

impl LostWrites {
    /// Whether `e` is one.
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|r| r.is::<LostWrites>())
    }
}

/// The manager.
pub struct GuestCache<V, O> {
    cache: BlockCache,
    vssd: V,
    origin: O,
    origin_size: u64,
    channel: Channel,
    block: u64,
    mode: WriteMode,
    stats: Stats,
}

impl<V: BlockDevice, O: BlockDevice> GuestCache<V, O> {
    /// Starts over a vSSD and an origin of `origin_size` bytes: says hello and takes the
    /// valid-block bitmap (§2.4.1), then answers any deflate outstanding.
    pub fn start(vssd: V, origin: O, origin_size: u64, control: Control, mode: WriteMode) -> io::Result<Self> {
        let (channel, hello) = Channel::hello(control)?;
        let mut g = GuestCache {
            cache: BlockCache::new(hello.max_blocks, &hello.valid),
            vssd,
            origin,
            origin_size,
            channel,
            block: hello.block_size,
            mode,
            stats: Stats::default(),
        };
        balloon::give_back(&mut g)?;
        Ok(g)
    }

    /// Bytes per cache block.
    pub fn block_size(&self) -> u64 {
        self.block
    }

    /// The origin's bytes.
    pub fn origin_size(&self) -> u64 {
        self.origin_size
    }

    /// Reads the whole cache block `lbn` from the vSSD.
    pub(crate) fn vssd_read(&mut self, lbn: Lbn, buf: &mut [u8]) -> io::Result<()> {
        self.vssd.read_at(buf, u64::from(lbn) * self.block)
    }

    /// See [`BlockCache::adopt`].
    pub(crate) fn adopt(&mut self, app: AppId, lbn: Lbn, origin: OriginBlock) -> bool {
        self.cache.adopt(app, lbn, origin)
    }

    /// The cache's state.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// The origin device.
    pub fn origin(&self) -> &O {
        &self.origin
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Application weights (§5.4).
    pub fn set_shares(&mut self, weights: &[(AppId, f64)]) {
        self.cache.set_shares(weights);
    }

    /// Reads `buf.len()` origin bytes at `offset` for `app`.
    pub fn read(&mut self, app: AppId, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        for (ob, within, r) in self.pieces(offset, buf.len())? {
            self.read_block(app, ob, within, &mut buf[r])?;
        }
        Ok(())
    }

    /// Writes `data` to the origin at `offset` for `app`.
    pub fn write(&mut self, app: AppId, offset: u64, data: &[u8]) -> io::Result<()> {
        for (ob, within, r) in self.pieces(offset, data.len())? {
            self.write_block(app, ob, within, &data[r])?;
        }
        Ok(())
    }

    /// `len` bytes at `offset` split at block boundaries: each piece's origin block,
    /// offset in it, and range in the caller's buffer (§2.4.2's split, on the guest side).
    fn pieces(&self, offset: u64, len: usize) -> io::Result<Vec<(OriginBlock, u64, std::ops::Range<usize>)>> {
        self.check_range(offset, len)?;
        let mut out = Vec::new();
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            let (ob, within) = (at / self.block, at % self.block);
            let n = ((self.block - within) as usize).min(len - done);
            out.push((ob, within, done..done + n));
            done += n;
        }
        Ok(out)
    }

    fn check_range(&self, offset: u64, len: usize) -> io::Result<()> {
        if offset.checked_add(len as u64).is_none_or(|end| end > self.origin_size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes at {offset} are past the origin's {} bytes", self.origin_size),
            ));
        }
        Ok(())
    }

    /// Bytes of origin block `ob` (the last may be short).
    fn block_len(&self, ob: OriginBlock) -> usize {
        (self.origin_size - ob * self.block).min(self.block) as usize
    }

    fn app(&mut self, app: AppId) -> &mut AppStats {
        self.stats.apps.entry(app).or_default()
    }

    /// The access plan for `ob`, with dirty victims written back first.
    fn plan(&mut self, app: AppId, ob: OriginBlock) -> io::Result<Access> {
        loop {
            match self.cache.access(app, ob) {
                Access::CleanFirst { lbn, origin } => self.write_back(lbn, origin)?,
                a => return Ok(a),
            }
        }
    }

    fn read_block(&mut self, app: AppId, ob: OriginBlock, within: u64, buf: &mut [u8]) -> io::Result<()> {
        let base = ob * self.block;
        match self.plan(app, ob)? {
            Access::Hit(lbn) => match self.vssd.read_at(buf, u64::from(lbn) * self.block + within) {
                Ok(()) => {
                    self.app(app).hits += 1;
                    Ok(())
                }
                Err(e) => {
                    self.vssd_failed(lbn, e)?;
                    self.app(app).bypassed += 1;
                    self.origin.read_at(buf, base + within)
                }
            },
            Access::Miss(lbn) => {
                self.app(app).misses += 1;
                let mut whole = vec![0; self.block as usize];
                let len = self.block_len(ob);
                if let Err(e) = self.origin.read_at(&mut whole[..len], base) {
                    self.cache.discard(lbn);
                    return Err(e);
                }
                let w = within as usize;
                buf.copy_from_slice(&whole[w..w + buf.len()]);
                if let Err(e) = self.vssd.write_at(&whole, u64::from(lbn) * self.block) {
                    self.cache.discard(lbn);
                    self.vssd_failed(lbn, e)?;
                }
                Ok(())
            }
            Access::Bypass => {
                self.app(app).bypassed += 1;
                self.origin.read_at(buf, base + within)
            }
            Access::CleanFirst { .. } => unreachable!("plan cleans"),
        }
    }

    fn write_block(&mut self, app: AppId, ob: OriginBlock, within: u64, data: &[u8]) -> io::Result<()> {
        let base = ob * self.block;
        let plan = self.plan(app, ob)?;
        if self.mode == WriteMode::WriteThrough || plan == Access::Bypass {
            if let Err(e) = self.origin.write_at(data, base + within) {
                // The origin's bytes there are unknown now: the cache must not vouch for them.
                if let Access::Hit(l) | Access::Miss(l) = plan {
                    self.cache.discard(l);
                }
                return Err(e);
            }
        }
        let lbn = match plan {
            Access::Bypass => {
                self.app(app).bypassed += 1;
                return Ok(());
            }
            Access::Hit(l) => {
                self.app(app).hits += 1;
                l
            }
            Access::Miss(l) => {
                self.app(app).misses += 1;
                l
            }
            Access::CleanFirst { .. } => unreachable!("plan cleans"),
        };
        let at = u64::from(lbn) * self.block;
        let r = if matches!(plan, Access::Miss(_)) && data.len() as u64 != self.block {
            // A partial write to a block not cached: the rest comes from the origin.
            let mut whole = vec![0; self.block as usize];
            let len = self.block_len(ob);
            self.origin.read_at(&mut whole[..len], base).and_then(|()| {
                whole[within as usize..within as usize + data.len()].copy_from_slice(data);
                self.vssd.write_at(&whole, at)
            })
        } else {
            self.vssd.write_at(data, at + within)
        };
        match r {
            Ok(()) if self.mode == WriteMode::WriteThrough => Ok(()),
            Ok(()) => {
                self.cache.written(lbn);
                Ok(())
            }
            Err(e) if self.mode == WriteMode::WriteThrough => {
                // The origin has the bytes; the cache block does not.
                self.cache.discard(lbn);
                self.vssd_failed(lbn, e)
            }
            Err(e) => {
                // Older writes in the block may have gone with it (then an error), or it
                // is gone with nothing lost and the origin takes this write.
                self.vssd_failed(lbn, e)?;
                self.app(app).bypassed += 1;
                self.origin.write_at(data, base + within)
            }
        }
    }

    /// Writes the dirty block at `lbn` (origin block `origin`) back.
    fn write_back(&mut self, lbn: Lbn, origin: OriginBlock) -> io::Result<()> {
        if !self.cache.is_dirty(lbn, origin) {
            return Ok(()); // dropped or cleaned since it was listed
        }
        let len = self.block_len(origin);
        let mut whole = vec![0; len];
        if let Err(e) = self.vssd.read_at(&mut whole, u64::from(lbn) * self.block) {
            self.vssd_failed(lbn, e)?;
            return Err(io::Error::other(format!("cache block {lbn} of origin block {origin} could not be read")));
        }
        self.origin.write_at(&whole, origin * self.block)?;
        self.cache.cleaned(lbn);
        self.stats.writebacks += 1;
        Ok(())
    }

    /// A vSSD I/O on `lbn` failed: the host may have taken it (an EIO for a block it does
    /// not hold), whose notice may still be on its way. Takes the notices in and checks the
    /// valid blocks with the host; `Err` when a dirty block was lost or the error stands
    /// for a block the host says is valid.
    fn vssd_failed(&mut self, lbn: Lbn, e: io::Error) -> io::Result<()> {
        let lost_before = self.stats.lost_dirty;
        self.resync()?;
        if self.stats.lost_dirty > lost_before {
            return Err(io::Error::other(LostWrites(self.stats.lost_dirty)));
        }
        if self.cache.valid_lbns().binary_search(&lbn).is_ok() {
            return Err(io::Error::new(e.kind(), format!("vSSD logical block {lbn}: {e}")));
        }
        Ok(())
    }

    /// Makes the cache agree with the host's valid blocks (a hello).
    fn resync(&mut self) -> io::Result<()> {
        balloon::resync(self)
    }

    fn take_lost(&mut self, lbns: &[Lbn]) {
        let dirty = self.cache.lost(lbns);
        if !dirty.is_empty() {
            self.stats.lost_dirty += dirty.len() as u64;
            self.stats.lost_origin_blocks.extend(&dirty);
            tracing::error!(blocks = ?dirty, "the host took dirty cache blocks: writes to these origin blocks are lost");
        }
    }

    /// Handles the host's notices that came (none waited for); how many.
    pub fn service(&mut self) -> io::Result<usize> {
        self.service_for(Duration::ZERO)
    }

    /// Handles the host's notices, waiting up to `wait` for the first; how many.
    pub fn service_for(&mut self, wait: Duration) -> io::Result<usize> {
        balloon::service_for(self, wait)
    }

    /// Writes every dirty block back and flushes the origin; a [`LostWrites`] error when
    /// the host had taken some of them (the others are written back all the same).
    pub fn flush(&mut self) -> io::Result<()> {
        let dirty: Vec<(Lbn, OriginBlock)> = self.cache.dirty_blocks();
        let mut lost = None;
        for (lbn, origin) in dirty {
            match self.write_back(lbn, origin) {
                Err(e) if LostWrites::is(&e) => lost = Some(e),
                r => r?,
            }
        }
        self.origin.flush()?;
        lost.map_or(Ok(()), Err)
    }
}

/// §4.1's deflate: free blocks first, then the least recently used of the applications
/// furthest over their shares, dirty ones written back before they go.
impl<V: BlockDevice, O: BlockDevice> BlockUser for GuestCache<V, O> {
    fn channel(&mut self) -> &mut Channel {
        &mut self.channel
    }
    fn valid_lbns(&self) -> Vec<Lbn> {
        self.cache.valid_lbns()
    }
    fn inflate(&mut self, lbns: &[Lbn], counted: bool) {
        if counted {
            self.stats.inflated += lbns.len() as u64;
        }
        self.cache.inflate(lbns);
    }
    fn lost(&mut self, lbns: &[Lbn], forced: bool) {
        if forced {
            self.stats.forced += lbns.len() as u64;
        }
        self.take_lost(lbns);
    }
    fn release(&mut self, n: u32) -> io::Result<Vec<Lbn>> {
        loop {
            match self.cache.release(n) {
                Release::CleanFirst(dirty) => {
                    for (lbn, origin) in dirty {
                        match self.write_back(lbn, origin) {
                            // Counted and logged; the block is no longer ours.
                            Err(e) if LostWrites::is(&e) => {}
                            r => r?,
                        }
                    }
                }
                Release::Ready(l) => return Ok(l),
            }
        }
    }
    fn released(&mut self, lbns: &[Lbn]) {
        self.stats.released += lbns.len() as u64;
    }
}
