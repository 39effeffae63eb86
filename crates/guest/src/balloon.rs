//! The guest's half of SymFlex's resize protocol (§2.4.3, Fig. 4), for any user of a
//! vSSD's blocks — the block cache (§4.1) and the slab key-value store (§4.2) alike:
//! hello and the valid blocks, inflate notices, deflate requests answered with the blocks
//! the user picks (it prepares them first: a cache writes dirty ones back), blocks the
//! host took after a deadline, a resync with the host's view when an I/O found a block
//! gone. Free functions over a [`BlockUser`] that owns its [`Channel`], so a user may
//! resync from inside its own release (a write-back that hit a taken block).

use crate::block_cache::Lbn;
use crate::control::Control;
use cachevisor_vssd::protocol::{Notice, Reply, Request};
use std::io;
use std::time::Duration;

/// The control channel and what the host asked for and has not had yet.
pub struct Channel {
    control: Control,
    asked: u32,
}

/// What a hello told: the vSSD's geometry and the valid blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Bytes per block.
    pub block_size: u64,
    /// M, in blocks.
    pub max_blocks: u32,
    /// The valid logical blocks, ascending.
    pub valid: Vec<Lbn>,
}

impl Channel {
    /// Says hello on `control` (§2.4.1's registration): the channel and the vSSD's state.
    /// The caller builds its user from the state, then calls [`give_back`] for a deflate
    /// outstanding.
    pub fn hello(mut control: Control) -> io::Result<(Channel, Hello)> {
        let Reply::State { block_size, max_blocks, valid, asked, .. } = control.request(&Request::Hello)? else {
            return Err(io::Error::other("the host did not answer hello with the vSSD's state"));
        };
        Ok((Channel { control, asked }, Hello { block_size, max_blocks, valid }))
    }

    /// Blocks the host asked for and has not had.
    pub fn asked(&self) -> u32 {
        self.asked
    }
}

/// Something holding a vSSD's blocks.
pub trait BlockUser {
    /// Its control channel.
    fn channel(&mut self) -> &mut Channel;
    /// The blocks it holds, ascending.
    fn valid_lbns(&self) -> Vec<Lbn>;
    /// New valid blocks (zeroed, or a persistent vSSD's own back); `counted`: an inflate
    /// (not a resync or a refused release taken back).
    fn inflate(&mut self, lbns: &[Lbn], counted: bool);
    /// Blocks gone with their bytes; `forced`: the host took them after a deadline.
    fn lost(&mut self, lbns: &[Lbn], forced: bool);
    /// Up to `n` blocks to give back, ready to go, no longer used (none: nothing to give).
    fn release(&mut self, n: u32) -> io::Result<Vec<Lbn>>;
    /// The host took the blocks `release` gave.
    fn released(&mut self, lbns: &[Lbn]);
}

/// Makes `u` agree with the host's valid blocks (a hello): blocks it thought valid and
/// the host does not are lost, new ones inflated.
pub fn resync(u: &mut impl BlockUser) -> io::Result<()> {
    let Reply::State { valid, asked, .. } = u.channel().control.request(&Request::Hello)? else {
        return Err(io::Error::other("the host did not answer hello with the vSSD's state"));
    };
    let gone: Vec<Lbn> = u.valid_lbns().into_iter().filter(|l| valid.binary_search(l).is_err()).collect();
    if !gone.is_empty() {
        u.lost(&gone, false);
    }
    let have = u.valid_lbns();
    let new: Vec<Lbn> = valid.iter().copied().filter(|l| have.binary_search(l).is_err()).collect();
    if !new.is_empty() {
        u.inflate(&new, false);
    }
    u.channel().asked = asked;
    Ok(())
}

/// Handles the host's notices, waiting up to `wait` for the first; how many.
pub fn service_for(u: &mut impl BlockUser, wait: Duration) -> io::Result<usize> {
    let mut wait = wait;
    let mut handled = 0;
    while let Some(n) = u.channel().control.notice(wait)? {
        wait = Duration::ZERO;
        handled += 1;
        match n {
            Notice::Inflated { lbns } => u.inflate(&lbns, true),
            Notice::Deflate { blocks, .. } => {
                u.channel().asked = blocks;
                give_back(u)?;
            }
            Notice::Released { lbns, forced: true } => {
                u.lost(&lbns, true);
                // The host inflates these again only after a hello.
                resync(u)?;
            }
            // Our own releases: already invalid here.
            Notice::Released { lbns, forced: false } => {
                let held = u.valid_lbns();
                let still: Vec<Lbn> = lbns.into_iter().filter(|l| held.binary_search(l).is_ok()).collect();
                if !still.is_empty() {
                    u.lost(&still, false);
                }
            }
            Notice::Removed => {
                let all = u.valid_lbns();
                u.lost(&all, false);
            }
        }
    }
    Ok(handled)
}

/// Gives back what the host asked for (§4.1's and §4.2's deflate): the user's picks,
/// sent as releases until the request is met or the user holds nothing. A refused release
/// (the host's view moved) is taken back and the state taken again, once.
pub fn give_back(u: &mut impl BlockUser) -> io::Result<()> {
    let mut refused = false;
    while u.channel().asked > 0 && !u.valid_lbns().is_empty() {
        let asked = u.channel().asked;
        let lbns = u.release(asked)?;
        if lbns.is_empty() {
            return Ok(());
        }
        match u.channel().control.request(&Request::Release { lbns: lbns.clone() })? {
            Reply::Released { .. } => {
                u.released(&lbns);
                u.channel().asked = asked.saturating_sub(lbns.len() as u32);
            }
            Reply::Error { message } if !refused => {
                tracing::warn!(%message, "release refused; taking the vSSD's state again");
                refused = true;
                u.inflate(&lbns, false);
                resync(u)?;
            }
            r => return Err(io::Error::other(format!("the host refused a release: {r:?}"))),
        }
    }
    Ok(())
}
