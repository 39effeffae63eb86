//! The region's side of one SSD budget shared with the host-managed cache (SymFlex §2.2:
//! the hypervisor carves one SSD between guest-managed vSSDs and its own caching, and
//! the allocator moves space between them). A shared region ([`State::shared`]) starts
//! with no block; the driver grants it blocks the cache engine emptied (their bytes are
//! the cache's old ones: a block is zeroed before it serves a vSSD, as every block is),
//! and takes free blocks back for the engine. Both moves are records, so after a crash
//! the region has exactly the blocks its journal says and the engine withholds exactly
//! those again; a block is the engine's again only once its `Yield` is durable
//! ([`Event::Yielded`]), and the region uses a granted block only once its `Grant` is.
//!
//! [`State::shared`]: crate::state::State::shared

use crate::geometry::Pbn;
use crate::manager::{AfterCommit, BlockManager, Live};
use crate::record::Record;

impl BlockManager {
    /// Block `pbn`, emptied by the cache engine (its frees durable), joins the region:
    /// free once its `Grant` is committed. Refused (nothing changed) when it is in the
    /// region already or past it.
    pub fn grant(&mut self, pbn: Pbn) -> Result<(), String> {
        if pbn >= self.config.geometry.blocks {
            return Err(format!("block {pbn} is past the region's {}", self.config.geometry.blocks));
        }
        if self.live[pbn as usize] != Live::Outside {
            return Err(format!("block {pbn} is in the region already"));
        }
        self.set_live(pbn, Live::Freeing);
        self.emit(Record::Grant { pbn }, Some(AfterCommit::Free(pbn)));
        Ok(())
    }

    /// Gives up to `n` free blocks back to the cache engine (the highest first, so the
    /// region stays packed at the start of the SSD); returns how many. Each is the
    /// engine's once its `Yield` is committed ([`crate::Event::Yielded`]).
    pub fn yield_free(&mut self, n: u32) -> u32 {
        let mut given = 0;
        while given < n {
            let Some(pbn) = self.free.pop_last() else { break };
            self.set_live(pbn, Live::Yielding);
            self.emit(Record::Yield { pbn }, Some(AfterCommit::Yielded(pbn)));
            given += 1;
        }
        given
    }

    /// Blocks in the region (granted, or all of a region of its own), whatever they do.
    pub fn region_blocks(&self) -> u32 {
        self.live.iter().filter(|l| !matches!(l, Live::Outside | Live::Yielding)).count() as u32
    }

    /// Blocks the region lacks for its running vSSDs beyond its free ones (what a budget
    /// allocator grants next): their targets, and the swapped-out blocks of a restarted
    /// persistent vSSD waiting for a block to come back into (which its target counts as
    /// held).
    pub fn shortfall(&self) -> u32 {
        let want: u64 = self
            .vssds
            .iter()
            .filter_map(|(&id, l)| Some((id, l, self.state.vssd(id).filter(|v| v.active && !v.removing)?)))
            .map(|(id, l, v)| {
                let waiting = (v.swapped.len() as u32).saturating_sub(self.tally(id).map_or(0, |t| t.filling_swap_in));
                u64::from(l.target.saturating_sub(self.held(id))) + u64::from(waiting)
            })
            .sum();
        want.saturating_sub(self.free.len() as u64).min(u64::from(u32::MAX)) as u32
    }

    /// Lets the region shrink to `cap` blocks when free blocks and the running vSSDs'
    /// releases cannot: blocks of inactive persistent vSSDs are swapped out, inactive
    /// longest first (SymFlex §2.4.4: an inactive VM's blocks leave the SSD when the space
    /// is needed — here by the host cache), and are free once their `SwappedOut` is
    /// committed, for [`Self::yield_free`]. Returns how many swap-outs it started.
    pub fn shed_inactive(&mut self, cap: u32) -> u32 {
        let over = self.region_blocks().saturating_sub(cap);
        let releasing: u32 = self
            .vssds
            .iter()
            .filter(|(&id, _)| self.state.vssd(id).is_some_and(|v| v.active && !v.removing))
            .map(|(&id, l)| {
                let on_ssd = self.tally(id).map_or(0, |t| t.valid + t.committing + t.filling.len() as u32);
                on_ssd.saturating_sub(l.target)
            })
            .sum();
        let n = over.saturating_sub(self.free.len() as u32 + releasing);
        if n == 0 {
            return 0;
        }
        self.reclaim_inactive(u64::from(n)) as u32
    }

    /// Blocks outside the region, in ascending order (the cache engine's).
    pub fn outside_blocks(&self) -> Vec<Pbn> {
        self.live.iter().enumerate().filter(|(_, l)| **l == Live::Outside).map(|(p, _)| p as Pbn).collect()
    }
}
