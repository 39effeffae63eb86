//! The messages of a vSSD's control channel (SymFlex §2.4.3, Fig. 4), one definition for
//! both ends: the daemon's channel (`cachevisor-server`'s `vssd/control.rs`) and the
//! guest-side cache manager (`cachevisor-guest`). Newline-delimited JSON, both directions
//! at any time:
//!
//! Guest → host, one [`Request`] per line, each answered by one [`Reply`] line:
//! - `{"op":"hello"}` → `{"reply":"state","block_size":B,"max_blocks":M,"valid":[lbn…],"target":T,"asked":N,"deadline_in_ms":D}`:
//!   the valid-block bitmap as a list (§2.4.1: read at initialization) and any deflate
//!   request outstanding; it also tells the host the guest knows of every block taken
//!   from it so far (blocks the host takes after a deadline are not inflated again
//!   before the guest's next hello, so a guest that has not yet heard of a take gets EIO
//!   on that block, never another block's zeros as its data);
//! - `{"op":"release","lbns":[…]}` → `{"reply":"released","lbns":[…]}`, or
//!   `{"reply":"error","message":"…"}` when any block is not a valid block of this vSSD,
//!   is given twice, or more are given than asked (nothing changes then).
//!
//! Host → guest, whenever they happen, [`Notice`] lines: `{"event":"inflated","lbns":[…]}`
//! (new valid blocks), `{"event":"deflate","blocks":N,"deadline_in_ms":D}` (N blocks are
//! asked for in all, by then; N = 0 withdraws the request; a release answers part of it
//! and no new notice follows), `{"event":"released","lbns":[…],"forced":F}` (blocks no
//! longer valid: the guest's own releases, or with `forced` the ones the host took after
//! the deadline), `{"event":"removed"}`. A guest that reconnects says hello again.

use crate::geometry::Lbn;
use serde::{Deserialize, Serialize};

/// A guest's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// The vSSD's state.
    Hello,
    /// Gives back these logical blocks (all or none).
    Release {
        /// The blocks.
        lbns: Vec<Lbn>,
    },
}

/// The host's answer to one [`Request`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "lowercase")]
pub enum Reply {
    /// The answer to a hello.
    State {
        /// Bytes per block.
        block_size: u64,
        /// M: the device's size in blocks.
        max_blocks: u32,
        /// The valid logical blocks, ascending.
        valid: Vec<Lbn>,
        /// Blocks the host wants the vSSD to hold.
        target: u32,
        /// Blocks asked of the guest and not given yet.
        asked: u32,
        /// Milliseconds until the host picks them itself.
        deadline_in_ms: Option<u64>,
    },
    /// A release taken.
    Released {
        /// The blocks.
        lbns: Vec<Lbn>,
    },
    /// A request refused; nothing changed.
    Error {
        /// Why.
        message: String,
    },
}

/// What the host tells the guest unasked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum Notice {
    /// New valid logical blocks (zeroed, or a persistent vSSD's own data back).
    Inflated {
        /// The blocks.
        lbns: Vec<Lbn>,
    },
    /// Give back `blocks` in all by the deadline (0: the request is withdrawn).
    Deflate {
        /// Blocks asked for.
        blocks: u32,
        /// Milliseconds until the host picks them itself.
        deadline_in_ms: u64,
    },
    /// Blocks no longer valid.
    Released {
        /// The blocks, ascending.
        lbns: Vec<Lbn>,
        /// The host took them after the deadline (their bytes are gone).
        forced: bool,
    },
    /// The vSSD was removed.
    Removed,
}

/// One line from the host: a reply or a notice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HostLine {
    /// The answer to the guest's last request.
    Reply(Reply),
    /// An event.
    Notice(Notice),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_as_the_channel_documents_them() {
        let p = |s: &str| serde_json::from_str::<HostLine>(s).unwrap();
        assert_eq!(
            p(r#"{"event":"deflate","blocks":3,"deadline_in_ms":900}"#),
            HostLine::Notice(Notice::Deflate { blocks: 3, deadline_in_ms: 900 })
        );
        assert_eq!(p(r#"{"event":"removed"}"#), HostLine::Notice(Notice::Removed));
        assert_eq!(p(r#"{"reply":"released","lbns":[4,5]}"#), HostLine::Reply(Reply::Released { lbns: vec![4, 5] }));
        let s = r#"{"reply":"state","block_size":1048576,"max_blocks":8,"valid":[0,1],"target":2,"asked":0,"deadline_in_ms":null}"#;
        assert!(matches!(p(s), HostLine::Reply(Reply::State { max_blocks: 8, .. })));
        let r = serde_json::to_string(&Request::Release { lbns: vec![7] }).unwrap();
        assert_eq!(r, r#"{"op":"release","lbns":[7]}"#);
        assert!(serde_json::from_str::<Request>(r#"{"op":"release","lbns":[1],"x":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"grow"}"#).is_err());
    }
}
