//! The guest-side block cache of SymFlex §4.1 — dm-cache with an elastic vSSD as its
//! cache device — as a pure state machine: which vSSD block (lbn) holds which origin block,
//! the free, clean, dirty and **invalid** lists (the invalid list holds the logical blocks
//! the vSSD does not have now: given back in a deflate, or never inflated), least recently
//! used eviction, and per-application shares of the valid blocks (§4.1's cgroup weights,
//! §5.4). No I/O here: [`BlockCache::access`] says what the driver must do (`guest_cache.rs`
//! does it), and a dirty block is never reused or given back before the driver says its
//! bytes reached the origin ([`BlockCache::cleaned`]).
//!
//! Cache blocks are vSSD blocks (1 MiB in the seed's prototype, "the granularity of
//! read/write operations of the dm-cache and the vSSD block size to 1 MB").

use std::collections::{BTreeMap, HashMap};

/// A vSSD logical block.
pub type Lbn = u32;
/// An origin block (origin offset / block size).
pub type OriginBlock = u64;
/// An application sharing the cache (a cgroup in the seed).
pub type AppId = u16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Not a valid block of the vSSD now.
    Invalid,
    /// Valid, holding nothing.
    Free,
    /// Holding `origin` for `app`; `dirty`: newer than the origin.
    Cached { origin: OriginBlock, app: AppId, dirty: bool, stamp: u64 },
}

/// What the driver does for one block access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The block is at `lbn`.
    Hit(Lbn),
    /// The block now owns `lbn` (free, or a clean victim's): for a read, fill it from the
    /// origin; for a write, fill it unless the write covers the block. On a failure the
    /// driver calls [`BlockCache::discard`].
    Miss(Lbn),
    /// Write back the dirty victim `origin` at `lbn` first, call [`BlockCache::cleaned`],
    /// then ask again.
    CleanFirst {
        /// The victim's cache block.
        lbn: Lbn,
        /// Its origin block.
        origin: OriginBlock,
    },
    /// Go to the origin: the vSSD has no valid blocks (or the app's share is none).
    Bypass,
}

/// What a deflate gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// These blocks are now invalid here: send them to the host.
    Ready(Vec<Lbn>),
    /// Among the blocks to give back, these are dirty: write them back, call
    /// [`BlockCache::cleaned`] for each, then ask again.
    CleanFirst(Vec<(Lbn, OriginBlock)>),
}

#[derive(Debug, Clone, Default)]
struct App {
    weight: f64,
    /// Blocks it holds, by last use.
    lru: BTreeMap<u64, Lbn>,
}

/// The cache's state.
#[derive(Debug, Clone)]
pub struct BlockCache {
    slots: Vec<Slot>,
    map: HashMap<OriginBlock, Lbn>,
    free: Vec<Lbn>,
    apps: BTreeMap<AppId, App>,
    valid: u32,
    clock: u64,
}

impl BlockCache {
    /// A cache over a vSSD of `max_blocks` logical blocks of which `valid` are valid now
    /// (the hello's bitmap), shared by one application (0) until [`BlockCache::set_shares`].
    pub fn new(max_blocks: u32, valid: &[Lbn]) -> BlockCache {
        let mut c = BlockCache {
            slots: vec![Slot::Invalid; max_blocks as usize],
            map: HashMap::new(),
            free: Vec::new(),
            apps: BTreeMap::from([(0, App { weight: 1.0, ..App::default() })]),
            valid: 0,
            clock: 0,
        };
        c.inflate(valid);
        c
    }

    /// Weights of the applications sharing the cache (§5.4); an application not named
    /// gets no share (its blocks go first when space is needed). Weights must be ≥ 0.
    pub fn set_shares(&mut self, weights: &[(AppId, f64)]) {
        for a in self.apps.values_mut() {
            a.weight = 0.0;
        }
        for &(id, w) in weights {
            self.apps.entry(id).or_default().weight = w.max(0.0);
        }
    }

    /// App `app`'s share of the valid blocks now, in blocks (rounded down).
    pub fn share(&self, app: AppId) -> u32 {
        let total: f64 = self.apps.values().map(|a| a.weight).sum();
        let w = self.apps.get(&app).map_or(0.0, |a| a.weight);
        if total <= 0.0 {
            return 0;
        }
        (f64::from(self.valid) * w / total).floor() as u32
    }

    /// Blocks app `app` holds.
    pub fn held(&self, app: AppId) -> u32 {
        self.apps.get(&app).map_or(0, |a| a.lru.len() as u32)
    }

    /// Valid blocks of the vSSD.
    pub fn valid(&self) -> u32 {
        self.valid
    }

    /// Dirty blocks.
    pub fn dirty(&self) -> u32 {
        self.slots.iter().filter(|s| matches!(s, Slot::Cached { dirty: true, .. })).count() as u32
    }

    /// The dirty blocks and their origin blocks.
    pub fn dirty_blocks(&self) -> Vec<(Lbn, OriginBlock)> {
        (0..self.slots.len())
            .filter_map(|l| match self.slots[l] {
                Slot::Cached { origin, dirty: true, .. } => Some((l as Lbn, origin)),
                _ => None,
            })
            .collect()
    }

    /// Whether `lbn` holds `origin`, dirty.
    pub fn is_dirty(&self, lbn: Lbn, origin: OriginBlock) -> bool {
        matches!(self.slots.get(lbn as usize), Some(&Slot::Cached { origin: o, dirty: true, .. }) if o == origin)
    }

    /// Where origin block `origin` is cached.
    pub fn lookup(&self, origin: OriginBlock) -> Option<Lbn> {
        self.map.get(&origin).copied()
    }

    /// The valid logical blocks, ascending (what the host should think we hold).
    pub fn valid_lbns(&self) -> Vec<Lbn> {
        (0..self.slots.len() as Lbn).filter(|&l| self.slots[l as usize] != Slot::Invalid).collect()
    }

    /// An access by `app` to `origin` (a write marks the block dirty with
    /// [`BlockCache::written`] once its bytes are on the vSSD).
    pub fn access(&mut self, app: AppId, origin: OriginBlock) -> Access {
        self.clock += 1;
        let stamp = self.clock;
        if let Some(&lbn) = self.map.get(&origin) {
            let Slot::Cached { app: owner, dirty, stamp: old, .. } = self.slots[lbn as usize] else {
                unreachable!("mapped blocks are cached")
            };
            let a = self.apps.get_mut(&owner).expect("owner");
            a.lru.remove(&old);
            a.lru.insert(stamp, lbn);
            self.slots[lbn as usize] = Slot::Cached { origin, app: owner, dirty, stamp };
            return Access::Hit(lbn);
        }
        if self.share(app) == 0 {
            return Access::Bypass;
        }
        let lbn = match self.free.pop() {
            Some(l) => l,
            None => {
                let Some(victim_app) = self.victim_app(app) else { return Access::Bypass };
                let (&old, &lbn) = self.apps[&victim_app].lru.iter().next().expect("holds blocks");
                let Slot::Cached { origin: vo, dirty, .. } = self.slots[lbn as usize] else { unreachable!() };
                if dirty {
                    return Access::CleanFirst { lbn, origin: vo };
                }
                self.apps.get_mut(&victim_app).expect("app").lru.remove(&old);
                self.map.remove(&vo);
                lbn
            }
        };
        self.map.insert(origin, lbn);
        self.apps.entry(app).or_default().lru.insert(stamp, lbn);
        self.slots[lbn as usize] = Slot::Cached { origin, app, dirty: false, stamp };
        Access::Miss(lbn)
    }

    /// Whose least recently used block a miss by `app` takes: the app furthest over its
    /// share when `app` is under its own, else `app`'s (or, holding none, anyone's over).
    fn victim_app(&self, app: AppId) -> Option<AppId> {
        let over = |id: AppId| i64::from(self.held(id)) - i64::from(self.share(id));
        if over(app) >= 0 && self.held(app) > 0 {
            return Some(app);
        }
        let most_over = self.apps.keys().copied().filter(|&id| self.held(id) > 0).max_by_key(|&id| (over(id), id));
        match most_over {
            Some(id) if over(id) > 0 => Some(id),
            _ if self.held(app) > 0 => Some(app),
            other => other,
        }
    }

    /// A write-back write reached the vSSD at `lbn` (and not the origin).
    pub fn written(&mut self, lbn: Lbn) {
        if let Some(Slot::Cached { dirty, .. }) = self.slots.get_mut(lbn as usize) {
            *dirty = true;
        }
    }

    /// Takes `lbn` (valid and free) as holding `origin`, clean, for `app` — a saved map's
    /// entry whose bytes were checked. False (nothing changes) when `lbn` is not free or
    /// `origin` is cached elsewhere.
    pub fn adopt(&mut self, app: AppId, lbn: Lbn, origin: OriginBlock) -> bool {
        if self.slots.get(lbn as usize) != Some(&Slot::Free) || self.map.contains_key(&origin) {
            return false;
        }
        self.free.retain(|&f| f != lbn);
        self.clock += 1;
        let stamp = self.clock;
        self.map.insert(origin, lbn);
        self.apps.entry(app).or_default().lru.insert(stamp, lbn);
        self.slots[lbn as usize] = Slot::Cached { origin, app, dirty: false, stamp };
        true
    }

    /// The cached blocks: (lbn, origin block, app).
    pub fn cached(&self) -> Vec<(Lbn, OriginBlock, AppId)> {
        (0..self.slots.len())
            .filter_map(|l| match self.slots[l] {
                Slot::Cached { origin, app, .. } => Some((l as Lbn, origin, app)),
                _ => None,
            })
            .collect()
    }

    /// The dirty block at `lbn` reached the origin.
    pub fn cleaned(&mut self, lbn: Lbn) {
        if let Some(Slot::Cached { dirty, .. }) = self.slots.get_mut(lbn as usize) {
            *dirty = false;
        }
    }

    /// Forgets what `lbn` holds (a fill or write that failed); it stays valid and free.
    pub fn discard(&mut self, lbn: Lbn) {
        if let Some(Slot::Cached { .. }) = self.unmap(lbn) {
            self.slots[lbn as usize] = Slot::Free;
            self.free.push(lbn);
        }
    }

    fn unmap(&mut self, lbn: Lbn) -> Option<Slot> {
        let s = *self.slots.get(lbn as usize)?;
        if let Slot::Cached { origin, app, stamp, .. } = s {
            self.map.remove(&origin);
            self.apps.get_mut(&app).expect("owner").lru.remove(&stamp);
        }
        (s != Slot::Invalid).then_some(s)
    }

    /// New valid blocks (an inflate, §4.1: invalid list → free list); blocks already
    /// valid or past the device are ignored.
    pub fn inflate(&mut self, lbns: &[Lbn]) {
        for &l in lbns {
            if self.slots.get(l as usize) == Some(&Slot::Invalid) {
                self.slots[l as usize] = Slot::Free;
                self.free.push(l);
                self.valid += 1;
            }
        }
    }

    /// Blocks the vSSD no longer has (the host took them, or the vSSD went away): their
    /// contents are gone. Returns the dirty ones' origin blocks — writes the origin never
    /// got.
    pub fn lost(&mut self, lbns: &[Lbn]) -> Vec<OriginBlock> {
        let mut dirty = Vec::new();
        for &l in lbns {
            match self.unmap(l) {
                None => continue,
                Some(Slot::Cached { origin, dirty: true, .. }) => dirty.push(origin),
                Some(_) => {}
            }
            self.free.retain(|&f| f != l);
            self.slots[l as usize] = Slot::Invalid;
            self.valid -= 1;
        }
        dirty
    }

    /// Chooses `n` blocks to give back (§4.1: free blocks first, then cached ones, least
    /// recently used first from the applications furthest over their shares of what
    /// remains), or fewer when fewer are valid.
    pub fn release(&mut self, n: u32) -> Release {
        let n = n.min(self.valid);
        let mut picked: Vec<Lbn> = self.free.iter().rev().take(n as usize).copied().collect();
        let mut dirty = Vec::new();
        // Cached blocks, in the order evictions would take them after the deflate.
        let after = self.valid - n;
        let total: f64 = self.apps.values().map(|a| a.weight).sum();
        let mut held: BTreeMap<AppId, (i64, std::collections::btree_map::Iter<'_, u64, Lbn>)> = self
            .apps
            .iter()
            .map(|(&id, a)| {
                let share = if total > 0.0 { (f64::from(after) * a.weight / total).floor() as i64 } else { 0 };
                (id, (a.lru.len() as i64 - share, a.lru.iter()))
            })
            .collect();
        while (picked.len() as u32) < n {
            let Some((&id, _)) =
                held.iter().filter(|(_, (_, it))| it.len() > 0).max_by_key(|(&id, (over, _))| (*over, id))
            else {
                break;
            };
            let (over, it) = held.get_mut(&id).expect("app");
            let (_, &lbn) = it.next().expect("non-empty");
            *over -= 1;
            if let Slot::Cached { origin, dirty: true, .. } = self.slots[lbn as usize] {
                dirty.push((lbn, origin));
            }
            picked.push(lbn);
        }
        if !dirty.is_empty() {
            return Release::CleanFirst(dirty);
        }
        for &l in &picked {
            self.unmap(l);
            self.slots[l as usize] = Slot::Invalid;
            self.valid -= 1;
        }
        self.free.retain(|f| !picked.contains(f));
        picked.sort_unstable();
        Release::Ready(picked)
    }

    /// Checks the lists against each other (tests).
    pub fn check(&self) {
        let mut valid = 0;
        for (l, s) in self.slots.iter().enumerate() {
            let l = l as Lbn;
            match *s {
                Slot::Invalid => assert!(!self.free.contains(&l), "{l} invalid and free"),
                Slot::Free => {
                    valid += 1;
                    assert_eq!(self.free.iter().filter(|&&f| f == l).count(), 1, "{l} once on the free list");
                }
                Slot::Cached { origin, app, stamp, .. } => {
                    valid += 1;
                    assert_eq!(self.map.get(&origin), Some(&l));
                    assert_eq!(self.apps[&app].lru.get(&stamp), Some(&l));
                }
            }
        }
        assert_eq!(valid, self.valid);
        assert_eq!(self.map.len(), self.apps.values().map(|a| a.lru.len()).sum::<usize>());
    }
}
