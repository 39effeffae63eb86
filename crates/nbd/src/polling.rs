//! A connection's reader that polls the socket for a short while before it sleeps.
//!
//! Why: at iodepth 1 a client sends its next request a few microseconds after it reads
//! the reply. A reader that blocks in `recv` at once puts its CPU to sleep, and waking a
//! sleeping (in a VM: halted) CPU costs more than the request itself: fio randread at
//! iodepth 1 through the page cache went from 0.76× of nbdkit (18.3k IOPS, 54 µs per
//! round trip, ~1 context switch per request) to 1.79× (43k IOPS) with a 50 µs poll on the
//! same machine (`cachevisor bench serve --rw randread --iodepth 1 --against buffered`).
//! The kernel's own busy polling (`SO_BUSY_POLL`) works on NIC queues, not loopback or
//! unix sockets, so the poll is a loop of non-blocking `recv`s here.
//!
//! It costs CPU only while a client keeps sending: the poll is skipped once the recent
//! waits (a moving average) are much longer than the poll would have lasted (an idle or
//! slow client), and at most `CPUs − 1` readers poll at once (so pollers never take every
//! CPU from the threads doing the I/O); the others block at once.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The readers allowed to poll at once, shared by a server's connections.
#[derive(Debug)]
pub struct Pollers {
    polling: AtomicUsize,
    max: usize,
}

impl Pollers {
    /// At most `max` readers poll at once.
    pub fn new(max: usize) -> Arc<Pollers> {
        Arc::new(Pollers { polling: AtomicUsize::new(0), max })
    }

    /// All CPUs but one, at least one.
    pub fn for_this_machine() -> Arc<Pollers> {
        Pollers::new(std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1)))
    }

    /// A slot, if fewer than `max` readers poll.
    fn take(self: &Arc<Self>) -> Option<PollSlot> {
        let max = self.max;
        self.polling
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1))
            .ok()
            .map(|_| PollSlot(self.clone()))
    }

    /// Readers polling right now.
    pub fn polling(&self) -> usize {
        self.polling.load(Ordering::Acquire)
    }
}

/// A slot among the pollers, given back when dropped.
struct PollSlot(Arc<Pollers>);

impl Drop for PollSlot {
    fn drop(&mut self) {
        self.0.polling.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Wraps a socket's read half; `poll`: how long to poll before blocking (zero: never).
pub struct PollingReader<S> {
    inner: S,
    poll: Duration,
    pollers: Arc<Pollers>,
    /// Moving average of how long reads waited for data, ns (recent waits weigh 1/8).
    avg_wait_ns: u64,
}

impl<S: Read + AsFd> PollingReader<S> {
    /// A reader of `inner` that polls for up to `poll` before it sleeps, when one of
    /// `pollers`' slots is free.
    pub fn new(inner: S, poll: Duration, pollers: Arc<Pollers>) -> Self {
        PollingReader { inner, poll, pollers, avg_wait_ns: 0 }
    }

    /// Data now, without blocking: `Ok(None)` when there is none yet.
    fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match rustix::net::recv(self.inner.as_fd(), &mut *buf, rustix::net::RecvFlags::DONTWAIT) {
            Ok((n, _)) => Ok(Some(n)),
            Err(rustix::io::Errno::AGAIN) => Ok(None),
            Err(rustix::io::Errno::INTR) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether recent waits were short enough that polling is likely to find data: the
    /// average wait (which includes the wakeup's own cost when a read blocked) under
    /// twice the poll.
    fn worth_polling(&self) -> bool {
        self.avg_wait_ns < 2 * self.poll.as_nanos() as u64
    }

    fn record_wait(&mut self, waited: Duration) {
        // Capped, so a client back from an idle spell is polled for again after ~16 reads.
        let w = (waited.as_nanos() as u64).min(16 * self.poll.as_nanos() as u64);
        self.avg_wait_ns = (self.avg_wait_ns * 7 + w) / 8;
    }
}

impl<S: Read + AsFd> Read for PollingReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.poll.is_zero() || buf.is_empty() {
            return self.inner.read(buf);
        }
        if let Some(n) = self.try_recv(buf)? {
            self.record_wait(Duration::ZERO);
            return Ok(n);
        }
        let start = Instant::now();
        if self.worth_polling() {
            if let Some(_slot) = self.pollers.take() {
                while start.elapsed() < self.poll {
                    std::hint::spin_loop();
                    if let Some(n) = self.try_recv(buf)? {
                        self.record_wait(start.elapsed());
                        return Ok(n);
                    }
                }
            }
        }
        let n = self.inner.read(buf)?;
        self.record_wait(start.elapsed());
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn polled_and_blocking_reads_return_the_bytes_and_give_their_slot_back() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let pollers = Pollers::new(1);
        let mut r = PollingReader::new(a, Duration::from_millis(5), pollers.clone());
        // Data already there.
        b.write_all(b"one").unwrap();
        let mut buf = [0u8; 8];
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"one");
        // Data arriving within the poll: found by polling.
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(2));
            b.write_all(b"two").unwrap();
            std::thread::sleep(Duration::from_millis(100));
            b.write_all(b"three").unwrap();
            b
        });
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"two");
        assert!(r.avg_wait_ns > 0 && r.worth_polling());
        // Data arriving after the poll: the read blocks and still returns it.
        let n = r.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"three");
        assert_eq!(pollers.polling(), 0, "every poll gave its slot back");
        // A slow client: long waits stop the polling until waits are short again.
        assert!(!r.worth_polling(), "average {} ns after a 100 ms wait", r.avg_wait_ns);
        let mut b = writer.join().unwrap();
        for _ in 0..32 {
            b.write_all(b"x").unwrap();
            assert_eq!(r.read(&mut buf).unwrap(), 1);
        }
        assert!(r.worth_polling(), "back-to-back requests: polled again");
        // End of stream.
        drop(b);
        assert_eq!(r.read(&mut buf).unwrap(), 0);
        assert_eq!(pollers.polling(), 0);
    }

    #[test]
    fn pollers_are_capped() {
        let pollers = Pollers::for_this_machine();
        let max = pollers.max;
        assert!(max >= 1 && max < std::thread::available_parallelism().unwrap().get().max(2));
        let slots: Vec<PollSlot> = std::iter::from_fn(|| pollers.take()).take(max + 3).collect();
        assert_eq!(slots.len(), max, "at most all CPUs but one (at least one) poll at once");
        assert!(pollers.take().is_none());
        drop(slots);
        assert_eq!(pollers.polling(), 0);
        assert!(pollers.take().is_some());
    }
}
