//! Device latency models with queueing, in virtual time: SSD (parallel channels, per-op
//! latency plus transfer), HDD (one queue; seek ∝ √distance between track-to-track and
//! full-stroke times, half a rotation on average, transfer; no seek or rotation for a
//! sequential continuation), and a fixed-latency link (a remote node or a network store).
//!
//! Queueing is FCFS in submission order: an op starts when both it is issued and its
//! server (a channel, the disk arm) is free. The simulator submits ops in request issue
//! order, so the model is a reservation model: later requests queue behind work already
//! reserved, which is exact for FCFS queues fed in time order.

use serde::{Deserialize, Serialize};

/// Parameters of one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum DeviceSpec {
    /// A flash device with internal parallelism.
    Ssd {
        /// Label in reports.
        name: String,
        /// Independent channels (ops served in parallel), ≥ 1.
        channels: u32,
        /// Fixed latency of a read, ns.
        read_ns: u64,
        /// Fixed latency of a write, ns.
        write_ns: u64,
        /// Read bandwidth per device, MB/s (10^6 bytes).
        read_mbps: f64,
        /// Write bandwidth per device, MB/s.
        write_mbps: f64,
    },
    /// A rotating disk with one arm.
    Hdd {
        /// Label in reports.
        name: String,
        /// Spindle speed.
        rpm: u32,
        /// Track-to-track seek, ns.
        seek_track_ns: u64,
        /// Average seek over uniformly random distances, ns.
        seek_avg_ns: u64,
        /// Media transfer rate, MB/s.
        transfer_mbps: f64,
        /// Bytes that a full stroke spans (seek distance scale).
        capacity_bytes: u64,
    },
    /// A link of fixed latency and bandwidth (remote SSD, network store).
    Link {
        /// Label in reports.
        name: String,
        /// Parallel streams, ≥ 1.
        channels: u32,
        /// Round-trip latency, ns.
        latency_ns: u64,
        /// Bandwidth, MB/s.
        mbps: f64,
    },
}

impl DeviceSpec {
    /// Names of the built-in presets.
    pub const PRESETS: [&'static str; 7] = ["860-evo", "850-pro", "nvme", "hdd-7200", "hdd-10k", "remote", "dram"];

    /// A built-in device by name: the seeds' hardware classes, from vendor data sheets.
    pub fn preset(name: &str) -> Result<DeviceSpec, String> {
        let ssd = |name: &str, channels, read_ns, write_ns, read_mbps, write_mbps| DeviceSpec::Ssd {
            name: name.into(),
            channels,
            read_ns,
            write_ns,
            read_mbps,
            write_mbps,
        };
        let hdd = |name: &str, rpm, seek_avg_ns, transfer_mbps| DeviceSpec::Hdd {
            name: name.into(),
            rpm,
            seek_track_ns: 800_000,
            seek_avg_ns,
            transfer_mbps,
            capacity_bytes: 1 << 40,
        };
        Ok(match name {
            // SATA SSDs as in ECI-Cache / SymFlex test beds: ~90 µs 4K reads, SLC-buffered writes.
            "860-evo" => ssd(name, 8, 90_000, 40_000, 550.0, 520.0),
            "850-pro" => ssd(name, 8, 80_000, 35_000, 550.0, 520.0),
            "nvme" => ssd(name, 32, 70_000, 20_000, 3400.0, 3000.0),
            // Enterprise HDDs: 8.5 ms / 4.5 ms average seek.
            "hdd-7200" => hdd(name, 7200, 8_500_000, 180.0),
            "hdd-10k" => hdd(name, 10_000, 4_500_000, 200.0),
            // A remote node's SSD over 10 GbE.
            // Host memory for the RAM tier: a memcpy's microsecond, many in parallel.
            "dram" => ssd(name, 64, 1_000, 1_000, 10_000.0, 10_000.0),
            "remote" => DeviceSpec::Link { name: name.into(), channels: 16, latency_ns: 150_000, mbps: 1250.0 },
            _ => return Err(format!("unknown device preset `{name}` (one of {})", Self::PRESETS.join(", "))),
        })
    }

    /// Checks the parameters; the message names the field.
    ///
    /// Every value has a range, so that one op's service time stays far below the
    /// virtual clock's 2^64 ns (a bandwidth near 0 made it saturate and wrap to a
    /// near-free device): bandwidths from [`MIN_MBPS`] to [`MAX_MBPS`], latencies and
    /// seeks at most [`MAX_LATENCY_NS`], channels at most [`MAX_CHANNELS`].
    pub fn validate(&self) -> Result<(), String> {
        let mbps = |v: f64, f: &str| {
            if (MIN_MBPS..=MAX_MBPS).contains(&v) {
                Ok(())
            } else {
                Err(format!("{f}: {v} is outside {MIN_MBPS} to {MAX_MBPS} MB/s"))
            }
        };
        let ns = |v: u64, f: &str| {
            if v <= MAX_LATENCY_NS {
                Ok(())
            } else {
                Err(format!("{f}: {v} ns is over {MAX_LATENCY_NS} ns (1000 s)"))
            }
        };
        let channels = |c: u32| {
            if (1..=MAX_CHANNELS).contains(&c) {
                Ok(())
            } else {
                Err(format!("channels: {c} is outside 1 to {MAX_CHANNELS}"))
            }
        };
        match self {
            DeviceSpec::Ssd { channels: c, read_ns, write_ns, read_mbps, write_mbps, .. } => {
                channels(*c)?;
                ns(*read_ns, "read_ns")?;
                ns(*write_ns, "write_ns")?;
                mbps(*read_mbps, "read_mbps")?;
                mbps(*write_mbps, "write_mbps")
            }
            DeviceSpec::Hdd { rpm, seek_track_ns, seek_avg_ns, transfer_mbps, capacity_bytes, .. } => {
                if !(1..=1_000_000).contains(rpm) || *capacity_bytes == 0 {
                    return Err("rpm (1 to 1000000) and capacity_bytes (> 0) out of range".into());
                }
                if seek_avg_ns < seek_track_ns {
                    return Err("seek_avg_ns must be ≥ seek_track_ns".into());
                }
                ns(*seek_avg_ns, "seek_avg_ns")?;
                mbps(*transfer_mbps, "transfer_mbps")
            }
            DeviceSpec::Link { channels: c, latency_ns, mbps: m, .. } => {
                channels(*c)?;
                ns(*latency_ns, "latency_ns")?;
                mbps(*m, "mbps")
            }
        }
    }

    /// Label.
    pub fn name(&self) -> &str {
        match self {
            DeviceSpec::Ssd { name, .. } | DeviceSpec::Hdd { name, .. } | DeviceSpec::Link { name, .. } => name,
        }
    }
}

/// A device several drivers queue on (a cluster node's SSD, which its borrowers reach
/// too); the simulator is single-threaded.
pub type SharedDevice = std::rc::Rc<std::cell::RefCell<Device>>;

/// A device in a simulation: spec plus queue state.
#[derive(Debug, Clone)]
pub struct Device {
    spec: DeviceSpec,
    free_at: Vec<u64>,
    head: u64,
    busy_ns: u64,
    /// Longest time an op waited in the queue before its service began.
    max_wait_ns: u64,
    /// Bytes written and read through it (an SSD's wear; a link's traffic).
    written: u64,
    read: u64,
}

/// Slowest bandwidth a device model takes, MB/s (1 KB/s).
pub const MIN_MBPS: f64 = 0.001;
/// Fastest, MB/s (1 PB/s).
pub const MAX_MBPS: f64 = 1e9;
/// Longest fixed latency or seek, ns (1000 s).
pub const MAX_LATENCY_NS: u64 = 1_000_000_000_000;
/// Most channels.
pub const MAX_CHANNELS: u32 = 65_536;

/// Time to move `bytes` at `mbps` (saturating: a validated device never gets near it).
fn transfer_ns(bytes: u32, mbps: f64) -> u64 {
    (bytes as f64 * 1000.0 / mbps) as u64
}

impl Device {
    /// An idle device.
    pub fn new(spec: DeviceSpec) -> Self {
        let servers = match &spec {
            DeviceSpec::Ssd { channels, .. } | DeviceSpec::Link { channels, .. } => *channels as usize,
            DeviceSpec::Hdd { .. } => 1,
        };
        Device { spec, free_at: vec![0; servers], head: u64::MAX, busy_ns: 0, max_wait_ns: 0, written: 0, read: 0 }
    }

    /// Time to serve one op, excluding queueing.
    fn service_ns(&mut self, write: bool, addr: u64, len: u32) -> u64 {
        match &self.spec {
            DeviceSpec::Ssd { read_ns, write_ns, read_mbps, write_mbps, .. } => {
                if write {
                    write_ns.saturating_add(transfer_ns(len, *write_mbps))
                } else {
                    read_ns.saturating_add(transfer_ns(len, *read_mbps))
                }
            }
            DeviceSpec::Hdd { rpm, seek_track_ns, seek_avg_ns, transfer_mbps, capacity_bytes, .. } => {
                let xfer = transfer_ns(len, *transfer_mbps);
                let positioning = if addr == self.head {
                    0
                } else {
                    // With seek = t2t + (full − t2t)·√d, a uniform d averages t2t + (full − t2t)·2/3.
                    let full = *seek_track_ns as f64 + (*seek_avg_ns - *seek_track_ns) as f64 * 1.5;
                    let dist = if self.head == u64::MAX {
                        1.0 / 3.0
                    } else {
                        addr.abs_diff(self.head) as f64 / *capacity_bytes as f64
                    };
                    let seek = *seek_track_ns as f64 + (full - *seek_track_ns as f64) * dist.min(1.0).sqrt();
                    let half_rotation = 30e9 / *rpm as f64;
                    (seek + half_rotation) as u64
                };
                self.head = addr.saturating_add(len as u64);
                positioning.saturating_add(xfer)
            }
            DeviceSpec::Link { latency_ns, mbps, .. } => latency_ns.saturating_add(transfer_ns(len, *mbps)),
        }
    }

    /// Serves an op issued at `at`; returns its completion time.
    pub fn submit(&mut self, at: u64, write: bool, addr: u64, len: u32) -> u64 {
        let (i, &free) = self.free_at.iter().enumerate().min_by_key(|(_, &f)| f).expect("a device has servers");
        let start = at.max(free);
        self.max_wait_ns = self.max_wait_ns.max(start - at);
        let service = self.service_ns(write, addr, len);
        self.busy_ns = self.busy_ns.saturating_add(service);
        *(if write { &mut self.written } else { &mut self.read }) += len as u64;
        // Saturates rather than wraps: a completion at the end of time is late, never early.
        self.free_at[i] = start.saturating_add(service);
        self.free_at[i]
    }

    /// Bytes written through it so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Bytes read through it so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The time one op of `len` bytes takes on an idle device, on average over random
    /// addresses (Eq. 3's latencies for ELICA's allocation).
    pub fn nominal_ns(spec: &DeviceSpec, write: bool, len: u32) -> u64 {
        let mut d = Device::new(spec.clone());
        d.head = u64::MAX; // an HDD's first op: a seek of average distance
        d.service_ns(write, 0, len)
    }

    /// The longest an op waited in the queue so far.
    pub fn max_wait_ns(&self) -> u64 {
        self.max_wait_ns
    }

    /// Requests it serves at once (SSD channels; 1 for an HDD).
    pub fn servers(&self) -> usize {
        self.free_at.len()
    }

    /// Total service time so far (for utilization).
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    /// Its parameters.
    pub fn spec(&self) -> &DeviceSpec {
        &self.spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate_and_queue() {
        for p in DeviceSpec::PRESETS {
            DeviceSpec::preset(p).unwrap().validate().unwrap();
        }
        let mut hdd = Device::new(DeviceSpec::preset("hdd-7200").unwrap());
        let a = hdd.submit(0, false, 1 << 30, 4096);
        let b = hdd.submit(0, false, (1 << 30) + 4096, 4096); // sequential: transfer only, queued
        assert!(a > 4_000_000, "random access pays seek and rotation: {a}");
        assert_eq!(b - a, transfer_ns(4096, 180.0));
        let mut ssd = Device::new(DeviceSpec::preset("860-evo").unwrap());
        let ends: Vec<u64> = (0..9).map(|_| ssd.submit(0, false, 0, 4096)).collect();
        assert!(ends[..8].iter().all(|&e| e == ends[0]), "8 channels in parallel");
        assert_eq!(ends[8], 2 * ends[0], "the ninth queues");
        assert!(DeviceSpec::preset("floppy").unwrap_err().contains("860-evo"));
    }
}
