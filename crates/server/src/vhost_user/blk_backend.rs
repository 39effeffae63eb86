//! A vhost-user-blk device over an export's store (a vDisk on the cache's data path, or a
//! vSSD): the rust-vmm `vhost-user-backend` crate runs the vhost-user protocol and the
//! virtqueues' threads; this file is the virtio-blk device (virtio 1.2 §5.2) — its
//! features and configuration space, and each request handed to the same
//! `ExportBackend` an NBD connection uses, completed in whatever order the store finishes
//! (the data written into guest memory, then the status byte) and published on the used
//! ring in the order the driver made them available (`in_order.rs` says why).
//! `stop_vring` waits for the queue's requests in flight, so nothing is written into a
//! queue QEMU took back.

use super::blk_request::{self, Descriptor, Layout, Op, Segment, HEADER_LEN};
use super::in_order::InOrder;
use cachevisor_datapath::Cmd;
use cachevisor_nbd::backend::ClientError;
use cachevisor_nbd::backend::ExportBackend;
use cachevisor_nbd::transmission::Latency;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_TOPOLOGY,
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueOwnedT;
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

/// Guest memory as the backend sees it.
pub type Memory = GuestMemoryAtomic<GuestMemoryMmap>;

/// Queues offered (QEMU's `num-queues` may ask for fewer; its default is one per vCPU).
pub const QUEUES: usize = 8;
/// The largest queue QEMU may set up.
pub const MAX_QUEUE_SIZE: usize = 1024;

/// What the device counts, for the log and tests.
#[derive(Debug, Default)]
pub struct DeviceStats {
    /// Requests completed (any status).
    pub requests: AtomicU64,
    /// Of which failed (IOERR or UNSUPP).
    pub errors: AtomicU64,
    /// Chains no request could be made of.
    pub malformed: AtomicU64,
}

/// What completions on store threads share with the device.
struct Shared {
    name: String,
    /// Per queue: its requests between taken and published (`in_order.rs`), and a
    /// wake-up when one is published.
    queues: Vec<(Mutex<InOrder>, Condvar)>,
    stats: Arc<DeviceStats>,
}

impl Shared {
    /// Request `seq` of queue `q` (chain `head`) finished: writes its status byte (none
    /// for a malformed chain), then publishes on the used ring, in the order they were
    /// taken, every request that may now be, each with its data bytes and status byte,
    /// and notifies the driver.
    fn finish(
        &self,
        (q, seq): (usize, u64),
        vring: &VringRwLock,
        mem: &GuestMemoryMmap,
        status: Option<(u64, u8)>,
        head: u16,
        written: u32,
    ) {
        let mut len = written;
        if let Some((addr, status)) = status {
            self.stats.requests.fetch_add(1, Ordering::Relaxed);
            if status != VIRTIO_BLK_S_OK as u8 {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            let _ = mem.write_slice(&[status], GuestAddress(addr));
            len += 1;
        }
        let (order, published) = &self.queues[q];
        let mut order = order.lock().unwrap_or_else(|e| e.into_inner());
        let ready = order.finish(seq, head, len);
        for &(head, len) in &ready {
            if let Err(e) = vring.add_used(head, len) {
                tracing::warn!(export = %self.name, %e, "cannot add to the used ring");
            }
        }
        drop(order);
        if !ready.is_empty() {
            if vring.needs_notification().unwrap_or(true) {
                let _ = vring.signal_used_queue();
            }
            published.notify_all();
        }
    }
}

/// A request started on the store: completed once, on whichever thread finishes it.
struct Completion {
    q: usize,
    seq: u64,
    /// Its latency histogram (the NBD path's, by export and command) and start.
    timing: Option<(prometheus_client::metrics::histogram::Histogram, Instant)>,
    head: u16,
    vring: VringRwLock,
    mem: Arc<GuestMemoryMmap>,
    layout: Layout,
    shared: Arc<Shared>,
}

impl Completion {
    /// Answers the request: OK with `written` data bytes, or IOERR.
    fn complete(self, r: Result<u32, ClientError>) {
        let (status, written) = match r {
            Ok(n) => (VIRTIO_BLK_S_OK as u8, n),
            Err(f) => {
                tracing::debug!(export = %self.shared.name, ?f, "virtio-blk request failed");
                (VIRTIO_BLK_S_IOERR as u8, 0)
            }
        };
        if let Some((h, start)) = &self.timing {
            h.observe(start.elapsed().as_secs_f64());
        }
        let status = Some((self.layout.status, status));
        self.shared.finish((self.q, self.seq), &self.vring, &self.mem, status, self.head, written);
    }
}

/// Copies guest memory at `segs` into `buf` (their total length).
fn gather(mem: &GuestMemoryMmap, segs: &[Segment], buf: &mut [u8]) -> Result<(), vm_memory::GuestMemoryError> {
    let mut at = 0;
    for s in segs {
        let n = s.len as usize;
        mem.read_slice(&mut buf[at..at + n], GuestAddress(s.addr))?;
        at += n;
    }
    Ok(())
}

/// Copies `buf` into guest memory at `segs`, in order, as far as `buf` goes.
fn scatter(mem: &GuestMemoryMmap, segs: &[Segment], buf: &[u8]) -> Result<(), vm_memory::GuestMemoryError> {
    let mut at = 0;
    for s in segs {
        if at >= buf.len() {
            break;
        }
        let n = (s.len as usize).min(buf.len() - at);
        mem.write_slice(&buf[at..at + n], GuestAddress(s.addr))?;
        at += n;
    }
    Ok(())
}

/// The virtio-blk device of one export.
pub struct BlkBackend {
    store: Arc<dyn ExportBackend>,
    capacity: u64,
    /// The cache's block size: the optimal I/O size advertised.
    opt_io: u64,
    mem: Mutex<Option<Memory>>,
    event_idx: AtomicBool,
    shared: Arc<Shared>,
    /// Request latencies, as the NBD path observes them.
    latency: Option<Latency>,
    /// The vring worker's exit event (`exit_event`): without one its thread never ends
    /// and a front end that leaves blocks the socket's next connection forever.
    exit: (vmm_sys_util::event::EventConsumer, vmm_sys_util::event::EventNotifier),
}

impl BlkBackend {
    /// The device of export `name` of `size` bytes (rounded down to whole sectors).
    pub fn new(
        store: Arc<dyn ExportBackend>,
        (name, size): (&str, u64),
        opt_io: u64,
        stats: Arc<DeviceStats>,
        latency: Option<Latency>,
    ) -> std::io::Result<Self> {
        use vmm_sys_util::event::{new_event_consumer_and_notifier, EventFlag};
        let exit = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)?;
        Ok(BlkBackend {
            exit,
            latency,
            store,
            capacity: size / blk_request::SECTOR * blk_request::SECTOR,
            opt_io,
            mem: Mutex::new(None),
            event_idx: AtomicBool::new(false),
            shared: Arc::new(Shared {
                name: name.to_string(),
                queues: (0..QUEUES).map(|_| (Mutex::new(InOrder::default()), Condvar::new())).collect(),
                stats,
            }),
        })
    }

    /// Ends the vring worker thread (the front end left, or the socket closes).
    pub fn stop_worker(&self) {
        let _ = self.exit.1.notify();
    }

    /// virtio_blk_config (virtio 1.2 §5.2.4), fields at their spec offsets.
    fn config_space(&self) -> [u8; 64] {
        let mut c = [0u8; 64];
        c[0..8].copy_from_slice(&(self.capacity / blk_request::SECTOR).to_le_bytes());
        // seg_max: a request's data descriptors (Linux's default limit).
        c[12..16].copy_from_slice(&254u32.to_le_bytes());
        c[20..24].copy_from_slice(&(blk_request::SECTOR as u32).to_le_bytes()); // blk_size
        c[24] = 3; // physical_block_exp: 4 KiB physical blocks
        c[26..28].copy_from_slice(&8u16.to_le_bytes()); // min_io_size, in logical blocks
        let opt = (self.opt_io / blk_request::SECTOR).min(u32::MAX as u64) as u32;
        c[28..32].copy_from_slice(&opt.to_le_bytes()); // opt_io_size
        c[32] = 1; // writeback: flushes matter
        c[34..36].copy_from_slice(&(QUEUES as u16).to_le_bytes());
        c
    }

    /// Takes every available chain of queue `q` and starts its request.
    fn process(&self, q: usize, vring: &VringRwLock) -> std::io::Result<()> {
        let Some(atomic) = self.mem.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return Ok(()); // no memory table yet: nothing can be read
        };
        let mem = atomic.memory().into_inner();
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        loop {
            if event_idx {
                vring.disable_notification().map_err(std::io::Error::other)?;
            }
            let chains: Vec<(u16, Vec<Descriptor>)> = vring
                .get_mut()
                .get_queue_mut()
                .iter(mem.as_ref())
                .map_err(std::io::Error::other)?
                .map(|chain| (chain.head_index(), chain.map(|d| (d.addr().0, d.len(), d.is_write_only())).collect()))
                .collect();
            let n = chains.len();
            for (i, (head, descriptors)) in chains.into_iter().enumerate() {
                // The last of a batch runs on this thread, as an NBD connection's request
                // with none buffered behind it does (a hand-off's wake-up costs more than
                // the I/O at queue depth 1); those before it go to the store's threads,
                // so a batch reaches the SSD together.
                let here = i + 1 == n;
                self.start(q, head, &descriptors, &mem, vring, here);
            }
            if !event_idx || !vring.enable_notification().map_err(std::io::Error::other)? {
                return Ok(());
            }
        }
    }

    /// Starts the request of one chain (`head`); it completes now or on a store thread.
    fn start(
        &self,
        q: usize,
        head: u16,
        descriptors: &[Descriptor],
        mem: &Arc<GuestMemoryMmap>,
        vring: &VringRwLock,
        here: bool,
    ) {
        let seq = self.shared.queues[q].0.lock().unwrap_or_else(|e| e.into_inner()).take();
        let layout = match blk_request::split(descriptors) {
            Ok(l) => l,
            Err(e) => {
                self.shared.stats.malformed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(export = %self.shared.name, %e, "malformed virtio-blk request");
                return self.shared.finish((q, seq), vring, mem, None, head, 0);
            }
        };
        let mut header = [0u8; HEADER_LEN as usize];
        let op = match gather(mem, &layout.header, &mut header) {
            Err(_) => Err(VIRTIO_BLK_S_IOERR as u8),
            Ok(()) => blk_request::request(&header, &layout, self.capacity),
        };
        let op = match op {
            Ok(op) => op,
            Err(status) => return self.shared.finish((q, seq), vring, mem, Some((layout.status, status)), head, 0),
        };
        // The NBD path's histogram slots: read, write, flush, …, other.
        let slot = match op {
            Op::Read { .. } => 0,
            Op::Write { .. } => 1,
            Op::Flush => 2,
            Op::GetId => 5,
        };
        let timing = self.latency.as_ref().map(|l| (l[slot].clone(), Instant::now()));
        let (vring, mem2, shared) = (vring.clone(), mem.clone(), self.shared.clone());
        let done = Completion { q, seq, timing, head, vring, mem: mem2, layout, shared };
        match op {
            Op::GetId => {
                let id = blk_request::id_bytes(&self.shared.name);
                let n = (blk_request::total(&done.layout.data_out) as usize).min(id.len());
                let ok = scatter(mem, &done.layout.data_out, &id[..n]).is_ok();
                done.complete(if ok { Ok(n as u32) } else { Err(ClientError::Io) });
            }
            Op::Flush => self.store.submit(0, Cmd::Flush, false, Box::new(move |r| done.complete(r.map(|_| 0)))),
            Op::Write { offset, len } => {
                let mut data = vec![0u8; len as usize];
                if gather(mem, &done.layout.data_in, &mut data).is_err() {
                    return done.complete(Err(ClientError::Io));
                }
                self.store.submit(offset, Cmd::Write(data), here, Box::new(move |r| done.complete(r.map(|_| 0))));
            }
            Op::Read { offset, len } => self.store.submit(
                offset,
                Cmd::Read(len as u32),
                here,
                Box::new(move |r| {
                    let r = r.and_then(|parts| {
                        let mut buf = vec![0u8; len as usize];
                        cachevisor_datapath::copy_range(&parts, offset, &mut buf);
                        scatter(&done.mem, &done.layout.data_out, &buf).map_err(|_| ClientError::Io)?;
                        Ok(len as u32)
                    });
                    done.complete(r)
                }),
            ),
        }
    }
}

impl VhostUserBackend for BlkBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        QUEUES
    }
    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }
    fn features(&self) -> u64 {
        [
            VIRTIO_F_VERSION_1,
            VIRTIO_RING_F_INDIRECT_DESC,
            VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_BLK_F_SEG_MAX,
            VIRTIO_BLK_F_BLK_SIZE,
            VIRTIO_BLK_F_TOPOLOGY,
            VIRTIO_BLK_F_FLUSH,
            VIRTIO_BLK_F_MQ,
        ]
        .iter()
        .fold(VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(), |f, b| f | 1 << b)
    }
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ
    }
    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }
    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let c = self.config_space();
        (offset as usize..offset as usize + size as usize).map(|i| c.get(i).copied().unwrap_or(0)).collect()
    }
    fn update_memory(&self, mem: Memory) -> std::io::Result<()> {
        *self.mem.lock().unwrap_or_else(|e| e.into_inner()) = Some(mem);
        Ok(())
    }
    fn stop_vring(&self, queue_index: u32) -> std::io::Result<()> {
        // GET_VRING_BASE: QEMU takes the queue back; its requests end first.
        let Some((order, published)) = self.shared.queues.get(queue_index as usize) else { return Ok(()) };
        let mut order = order.lock().unwrap_or_else(|e| e.into_inner());
        while order.pending() > 0 {
            let (next, timeout) =
                published.wait_timeout(order, Duration::from_secs(5)).unwrap_or_else(|e| e.into_inner());
            order = next;
            if timeout.timed_out() && order.pending() > 0 {
                tracing::warn!(export = %self.shared.name, queue = queue_index, in_flight = order.pending(), "waiting for requests before giving the queue back");
            }
        }
        Ok(())
    }
    fn exit_event(
        &self,
        _thread_index: usize,
    ) -> Option<(vmm_sys_util::event::EventConsumer, vmm_sys_util::event::EventNotifier)> {
        Some((self.exit.0.try_clone().ok()?, self.exit.1.try_clone().ok()?))
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            return Err(std::io::Error::other(format!("unexpected event set {evset:?}")));
        }
        let q = device_event as usize;
        match vrings.get(q) {
            Some(vring) => self.process(q, vring),
            None => Err(std::io::Error::other(format!("event for queue {q} of {}", vrings.len()))),
        }
    }
}
