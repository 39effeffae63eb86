//! Threads that run vSSD guests' reads and writes, so the requests one NBD connection has
//! in flight (up to its queue depth) reach the SSD together, as the data path's device
//! threads do for vDisks; each completes its request itself. Written by hand: a shared
//! channel and a fixed set of threads is all it needs (the data path's device threads
//! are tied to the engine's op queue, and an async runtime would put its scheduler
//! between a request and its blocking `pread`).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

type Job = Box<dyn FnOnce() + Send>;

/// The pool; its threads end when it is dropped.
pub struct IoPool {
    tx: Mutex<Sender<Job>>,
}

impl IoPool {
    /// `threads` threads named `cv-vssd-io`.
    pub fn new(threads: usize) -> IoPool {
        let (tx, rx) = channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("cv-vssd-io {i}"))
                .spawn(move || worker(&rx))
                .expect("spawning a vSSD I/O thread");
        }
        IoPool { tx: Mutex::new(tx) }
    }

    /// Runs `job` on a pool thread.
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        // The threads outlive the pool's sender: a send cannot fail while it is alive.
        tx.send(Box::new(job)).expect("the vSSD I/O threads run while the pool lives");
    }
}

fn worker(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = match rx.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(j) => j,
            Err(_) => return, // the pool was dropped
        };
        job();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn jobs_run_at_once_up_to_the_thread_count() {
        let pool = IoPool::new(4);
        let barrier = Arc::new(Barrier::new(5));
        for _ in 0..4 {
            let b = barrier.clone();
            pool.spawn(move || {
                b.wait();
            });
        }
        // Returns only if all four jobs wait at the barrier together.
        barrier.wait();
    }
}
