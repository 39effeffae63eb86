//! The order completed requests go onto a queue's used ring: the order the driver made
//! them available, whatever order the store finishes them in. The reason is a crash: the
//! rust-vmm backend crate does not offer VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD, so when the
//! daemon dies QEMU rewinds the queue to the used ring's index and hands the restarted
//! daemon every request from there (`virtio_queue_restore_last_avail_idx`). With
//! completions published out of order, a request still in flight before that index would
//! be lost (the guest waits forever) and finished ones after it would run again after
//! newer writes. Published in order, the used prefix is exactly what the guest has seen
//! complete, and what QEMU replays is exactly what it has not. Pure; the device holds one
//! per queue under a lock.

use std::collections::BTreeMap;

/// One queue's requests between being taken from the available ring and published.
#[derive(Debug, Default)]
pub struct InOrder {
    /// The sequence number the next request taken gets.
    next_taken: u64,
    /// The sequence number published next.
    next_published: u64,
    /// Finished and waiting for earlier ones: sequence → (chain head, bytes written).
    finished: BTreeMap<u64, (u16, u32)>,
}

impl InOrder {
    /// A request taken from the available ring: its sequence number.
    pub fn take(&mut self) -> u64 {
        self.next_taken += 1;
        self.next_taken - 1
    }

    /// Request `seq` finished: the chains that may now be published, in order.
    pub fn finish(&mut self, seq: u64, head: u16, written: u32) -> Vec<(u16, u32)> {
        debug_assert!(
            seq >= self.next_published && seq < self.next_taken,
            "request {seq} finished twice or never taken"
        );
        self.finished.insert(seq, (head, written));
        let mut out = Vec::new();
        while let Some(e) = self.finished.remove(&self.next_published) {
            out.push(e);
            self.next_published += 1;
        }
        out
    }

    /// Requests taken and not yet published.
    pub fn pending(&self) -> u64 {
        self.next_taken - self.next_published
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever order requests finish in, they are published once each, in the order
        /// they were taken, and a request is published only once it and every earlier one
        /// finished.
        #[test]
        fn publication_is_the_taken_order_and_never_ahead_of_an_unfinished_request(
            n in 1usize..40,
            order in proptest::collection::vec(any::<prop::sample::Index>(), 40),
        ) {
            let mut q = InOrder::default();
            let seqs: Vec<u64> = (0..n).map(|_| q.take()).collect();
            let mut left = seqs.clone();
            let mut finished = std::collections::BTreeSet::new();
            let mut published = Vec::new();
            for pick in order.iter().take(n) {
                let s = left.remove(pick.index(left.len()));
                finished.insert(s);
                for (head, written) in q.finish(s, s as u16, s as u32 * 512) {
                    prop_assert_eq!(written, head as u32 * 512);
                    published.push(head as u64);
                }
                // Published: exactly the longest finished prefix.
                let prefix = (0..n as u64).take_while(|s| finished.contains(s)).count();
                prop_assert_eq!(published.len(), prefix);
                prop_assert_eq!(q.pending(), (n - prefix) as u64);
            }
            prop_assert_eq!(published, seqs);
        }
    }
}
