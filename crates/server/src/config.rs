//! The daemon's TOML configuration, validated with messages that name the key, and the
//! embedded default that makes `cachevisor serve` alone start a working demo under ./var.
//!
//! Every setting, with its default and range, is in [`REFERENCE`] (tested to parse and to
//! name every key), which `cachevisor serve --print-default-config` prints.

use cachevisor_engine::{ReplacementKind, WritePolicy};
use cachevisor_trace::units::parse_size;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// `[cache]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheConfig {
    /// Cache store file.
    pub path: PathBuf,
    /// Size of the cache.
    pub size: String,
    /// Block size.
    #[serde(default = "default_block")]
    pub block_size: String,
    /// Replacement policy. Unset: the allocator's own ([`CacheConfig::replacement`]).
    #[serde(default)]
    pub replacement: Option<ReplacementKind>,
    /// Write policy of vDisks that do not set one.
    #[serde(default = "default_write_policy")]
    pub write_policy: WritePolicy,
    /// Per-vDisk partitions the allocator sizes (`static`), or one shared pool with no
    /// targets (`shared`: the unmanaged baseline; no allocator runs).
    #[serde(default)]
    pub partition: cachevisor_engine::PartitionMode,
    /// Allocation policy.
    #[serde(default = "default_allocator")]
    pub allocator: String,
    /// Metadata directory (checkpoint and journal); default `PATH.meta` beside the store.
    pub metadata: Option<PathBuf>,
    /// The largest `size` a reload may grow the cache to while running (default `size`):
    /// the engine's slot table and the metadata's geometry are laid out for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<String>,
    /// Device errors after which a vDisk stops using the cache (pass-through).
    #[serde(default = "default_error_threshold")]
    pub error_threshold: u64,
    /// Background destaging of dirty blocks, bytes per second at most (`16MiB`; `0` =
    /// off): the rate once no client request came for 1 s, or with a `writeback_percent`
    /// of 0; under load bcache's controller writes less (`engine/src/flush_rate.rs`).
    #[serde(default = "cachevisor_engine::cache_settings::default_flush_rate")]
    pub flush_rate: String,
    /// Percent of the cache the flusher lets stay dirty (bcache's `writeback_percent`):
    /// hot blocks rewritten often stay dirty and cost no write-back (`10`; `0` writes
    /// everything back).
    #[serde(default = "cachevisor_engine::cache_settings::default_writeback_percent")]
    pub writeback_percent: f64,
    /// Write-back ahead of eviction: the dirty blocks among each vDisk's next this many
    /// victims are written back, one at a time, while nothing else of the vDisk is on its
    /// backing store (`32`; `0` = off).
    #[serde(default = "cachevisor_engine::cache_settings::default_writeback_ahead")]
    pub writeback_ahead: u32,
    /// How often the allocator runs on the traffic it has seen (`1s`).
    #[serde(default = "default_interval")]
    pub interval: String,
    /// The allocator's parameters over its seed's defaults.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub params: std::collections::BTreeMap<String, f64>,
    /// O_DIRECT on the cache store: `auto` (where the filesystem allows), `on` (fail
    /// where it does not), `off` (through the page cache).
    #[serde(default)]
    pub direct: DirectIo,
    /// An O_DIRECT cache store's I/O through io_uring where the kernel allows (`true`);
    /// `false`: a pool of threads.
    #[serde(default = "default_io_uring")]
    pub io_uring: bool,
    /// How long a dirty block's region goes without a write before its checksums are
    /// sealed into the metadata, so a restart after a crash checks it too (`30s`; `0s`:
    /// never — checksums are then checked while the daemon runs only). The first write
    /// into a sealed region waits for one metadata commit (`engine/src/seals.rs`).
    #[serde(default = "default_seal_after")]
    pub seal_after: String,
}

fn default_io_uring() -> bool {
    true
}

fn default_seal_after() -> String {
    "30s".into()
}

pub use cachevisor_store::backing::DirectIo;

fn default_interval() -> String {
    "1s".into()
}

impl CacheConfig {
    /// The keys it shares with the simulator's `[cache]`, for their one check.
    pub fn keys(&self) -> cachevisor_policy::cache_settings::CacheKeys<'_> {
        cachevisor_policy::cache_keys!(self)
    }

    /// The replacement policy in force: the one set, else the allocator's own
    /// (`Allocator::replacement`; LRU for a name the registry does not know, which
    /// validation reports).
    pub fn replacement(&self) -> ReplacementKind {
        self.replacement.unwrap_or_else(|| cachevisor_policy::registry::replacement_for(&self.allocator))
    }
}

fn default_error_threshold() -> u64 {
    8
}

fn default_block() -> String {
    "4KiB".into()
}
fn default_write_policy() -> WritePolicy {
    WritePolicy::Wt
}
fn default_allocator() -> String {
    "static".into()
}
fn one() -> f64 {
    1.0
}

/// `[listen]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListenConfig {
    /// TCP address.
    pub tcp: Option<String>,
    /// Unix socket path.
    pub unix: Option<PathBuf>,
    /// A directory (it must exist) where every export, vDisk or vSSD, is also a
    /// vhost-user-blk socket `NAME.sock` for QEMU's `-device vhost-user-blk-pci`
    /// (`vhost_user/`); same mode and group as `unix`.
    pub vhost_user: Option<PathBuf>,
    /// The unix socket's file mode, octal (`"0600"`: only the daemon's user connects;
    /// `"0660"` lets its group, e.g. the hypervisor's, connect too). Connecting takes
    /// write permission on the socket.
    #[serde(default = "default_unix_mode")]
    pub unix_mode: String,
    /// The unix socket's group (a name or a number), e.g. the hypervisor's ("kvm",
    /// "libvirt-qemu"); needs `unix_mode = "0660"` and a daemon user in that group (or
    /// root).
    pub unix_group: Option<String>,
    /// How long a connection's reader polls for the next request before it sleeps
    /// (`cachevisor_nbd::polling`; "0" never polls). Polling spares a client that sends request
    /// after request the cost of waking a sleeping CPU; it stops for idle clients and at
    /// most all CPUs but one poll at once. At most 1ms.
    #[serde(default = "default_poll")]
    pub poll: String,
    /// NBD connections at once (each is a thread): 1 to 65536, default 1024; more are
    /// closed at once (logged, counted).
    #[serde(default = "default_max_connections")]
    pub max_connections: usize,
    /// How long a client has to finish the NBD handshake: 100ms to 10min, default 10s.
    #[serde(default = "default_handshake_timeout")]
    pub handshake_timeout: String,
    /// NBD over TLS: off (default), on (offered), require (`tls.rs`).
    #[serde(default)]
    pub tls: cachevisor_nbd::tls::TlsMode,
    /// A directory in QEMU's `tls-creds-x509` layout: `server-cert.pem`,
    /// `server-key.pem`, and `ca-cert.pem` (the CA of client certificates).
    pub tls_dir: Option<PathBuf>,
    /// The server certificate chain (PEM), over `tls_dir`'s.
    pub tls_cert: Option<PathBuf>,
    /// The server's private key (PEM), over `tls_dir`'s.
    pub tls_key: Option<PathBuf>,
    /// The CA that signs client certificates (PEM), over `tls_dir`'s.
    pub tls_ca: Option<PathBuf>,
    /// Clients must present a certificate the CA signed (QEMU's `verify-peer`, default
    /// true).
    #[serde(default = "yes")]
    pub tls_verify_peer: bool,
}

fn yes() -> bool {
    true
}

impl ListenConfig {
    /// The TLS credentials `[listen]` names (None when `tls` is off); errors name the key.
    pub fn tls_credentials(&self) -> Result<Option<cachevisor_nbd::tls::Credentials>, String> {
        if self.tls == cachevisor_nbd::tls::TlsMode::Off {
            return Ok(None);
        }
        cachevisor_nbd::tls::Credentials::of(
            self.tls_dir.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_ca.as_deref(),
            self.tls_verify_peer,
        )
        .map(Some)
    }
}

impl Default for ListenConfig {
    fn default() -> Self {
        ListenConfig {
            tcp: None,
            unix: None,
            vhost_user: None,
            unix_mode: default_unix_mode(),
            unix_group: None,
            poll: default_poll(),
            max_connections: default_max_connections(),
            handshake_timeout: default_handshake_timeout(),
            tls: cachevisor_nbd::tls::TlsMode::Off,
            tls_dir: None,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            tls_verify_peer: true,
        }
    }
}

fn default_max_connections() -> usize {
    1024
}

fn default_handshake_timeout() -> String {
    "10s".into()
}

fn default_unix_mode() -> String {
    "0600".into()
}

/// `listen.unix_mode` checked: octal permission bits, none for others (a socket anyone
/// can write to is an open door to every vDisk) and none but read/write.
pub fn unix_mode(mode: &str) -> Result<u32, String> {
    let m = u32::from_str_radix(mode.trim().trim_start_matches("0o"), 8)
        .map_err(|_| format!("listen.unix_mode: `{mode}` is not an octal file mode like \"0600\""))?;
    if m & !0o660 != 0 {
        return Err(format!(
            "listen.unix_mode: `{mode}` gives more than read/write to owner and group (0660 at most: other users must not reach the vDisks)"
        ));
    }
    if m & 0o600 != 0o600 {
        return Err(format!("listen.unix_mode: `{mode}` leaves the daemon's own user without read/write"));
    }
    Ok(m)
}

/// `listen.unix_group` resolved to a group id (a name from the system's group database,
/// or a number), checked against `mode`: a group that cannot read and write the socket
/// would be given nothing.
pub fn unix_group(group: &str, mode: u32) -> Result<u32, String> {
    let gid = match group.parse::<u32>() {
        Ok(n) => n,
        Err(_) => nix::unistd::Group::from_name(group)
            .map_err(|e| format!("listen.unix_group: looking up `{group}`: {e}"))?
            .ok_or_else(|| format!("listen.unix_group: no group named `{group}` on this system"))?
            .gid
            .as_raw(),
    };
    check_group_mode(group, mode)?;
    Ok(gid)
}

/// A socket group needs read and write for the group in the socket's mode.
fn check_group_mode(group: &str, mode: u32) -> Result<(), String> {
    if mode & 0o060 != 0o060 {
        return Err(format!(
            "listen.unix_group: `{group}` would get no access with unix_mode {mode:04o}: set unix_mode = \"0660\""
        ));
    }
    Ok(())
}

fn default_poll() -> String {
    "50us".into()
}

/// `[api]`: the HTTP control API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiConfig {
    /// Address (loopback).
    pub listen: String,
    /// Bearer token for mutating calls; a random one is generated when absent.
    pub token: Option<String>,
    /// A connection that sends and receives nothing for this long is closed.
    #[serde(default = "default_api_idle_timeout")]
    pub idle_timeout: String,
    /// HTTPS with `[listen]`'s TLS certificate and key (no client certificates: the
    /// token authenticates).
    #[serde(default)]
    pub tls: bool,
}

impl ApiConfig {
    /// The API on `listen` with the defaults (a random token).
    pub fn on(listen: &str) -> ApiConfig {
        ApiConfig { listen: listen.into(), token: None, tls: false, idle_timeout: default_api_idle_timeout() }
    }
}

fn default_api_idle_timeout() -> String {
    "30s".into()
}

/// `[[vdisk]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VdiskConfig {
    /// Export name.
    pub name: String,
    /// Backing file.
    pub backing: PathBuf,
    /// Size of the backing: creates a missing backing file; an existing one must have it.
    pub size: Option<String>,
    /// Allow growing an existing backing file to `size` (never shrunk).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub grow: bool,
    /// Share of the cache.
    #[serde(default = "one")]
    pub weight: f64,
    /// Write policy.
    pub write_policy: Option<WritePolicy>,
    /// Target share of hit throughput (symflex-proportional).
    #[serde(default = "one")]
    pub ratio: f64,
    /// Smallest cache share (`64MiB`).
    pub min: Option<String>,
    /// Contiguous run (`4MiB`) after which the stream stops taking cache slots.
    pub sequential_cutoff: Option<String>,
    /// Client certificates that may open this export over TLS (`tls_authz.rs`: "CN=host-a",
    /// "CN=h,O=tenant1", "DNS:h.example", "IP:10.0.0.2", "URI:…", "email:…", "*"); empty:
    /// any client the listener lets in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    /// On a cluster node with `cluster.replica`: whether this vDisk's client writes are
    /// on the replica peer too before they are acknowledged (default: yes; `false` keeps
    /// its write-back data on this node only, and another node then refuses to take it
    /// over from the backing store after this one died).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<bool>,
    /// Who may open it over vhost-user-blk: "owner" (0600), "group:NAME" (0660), "none";
    /// unset: the listener's mode and group, or none for an export with `allow` or under
    /// `listen.tls = "require"` (`vhost_user/access.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_user: Option<String>,
}

impl VdiskConfig {
    /// Whether this vDisk's writes go to the replica log on a node that keeps one.
    pub fn replicates(&self) -> bool {
        self.replicate != Some(false)
    }

    /// Checks every value for a cache of `block_size` blocks; the message starts with `at`
    /// and names the key.
    pub fn check(&self, at: &str, block_size: u64) -> Result<(), String> {
        let v = self;
        if v.name.is_empty() || v.name.len() > 4096 {
            return Err(format!("{at}.name: must be 1 to 4096 bytes"));
        }
        check_share(&format!("{at}.weight"), v.weight)?;
        for (key, val) in [("size", &v.size), ("min", &v.min), ("sequential_cutoff", &v.sequential_cutoff)] {
            if let Some(s) = val {
                parse_size(s).map_err(|e| format!("{at}.{key}: {e}"))?;
            }
        }
        if let Some(size) = v.size.as_deref().map(parse_size).transpose()? {
            if size == 0 || !size.is_multiple_of(512) {
                return Err(format!("{at}.size: {size} bytes is not a positive multiple of 512 (a sector)"));
            }
            cachevisor_engine::check_disk_size(size, block_size).map_err(|e| format!("{at}.size: {e}"))?;
        }
        check_share(&format!("{at}.ratio"), v.ratio)?;
        cachevisor_nbd::tls_authz::check(&v.allow).map_err(|e| format!("{at}.allow: {e}"))?;
        crate::vhost_user::access::check(v.vhost_user.as_deref(), &format!("{at}.vhost_user"))?;
        if v.replicate == Some(true) && v.name.len() > cachevisor_cluster::replica_record::MAX_NAME {
            return Err(format!("{at}.replicate: a replicated vDisk's name must be at most 400 bytes"));
        }
        if !cachevisor_store::backing::is_uri(&v.backing) && !v.backing.exists() && v.size.is_none() {
            return Err(format!("{at}.backing: {} does not exist (give `size` to create it)", v.backing.display()));
        }
        Ok(())
    }
}

pub use cachevisor_policy::controller::{check_share, MAX_SHARE};

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Cache.
    pub cache: CacheConfig,
    /// Listeners.
    #[serde(default)]
    pub listen: ListenConfig,
    /// HTTP API (off when absent).
    pub api: Option<ApiConfig>,
    /// Exports.
    #[serde(default)]
    pub vdisk: Vec<VdiskConfig>,
    /// Cache-state snapshots and prewarming (defaults when absent).
    #[serde(default)]
    pub prewarm: PrewarmConfig,
    /// SymFlex's elastic vSSDs (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vssd: Option<crate::vssd::settings::VssdConfig>,
    /// A node of an HCI cluster coordinated through etcd (single host when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::cluster::settings::ClusterConfig>,
    /// What the daemon logs.
    #[serde(default)]
    pub log: LogConfig,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// What is logged: `error`, `warn`, `info`, `debug`, `trace`, or directives per module
    /// as RUST_LOG takes them (`info,cachevisor_server::vssd=debug`); RUST_LOG, when set,
    /// wins. A reload changes it.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".into() }
    }
}

/// `[prewarm]`: snapshots of the cache's state on a schedule and at shutdown, and
/// prewarming a cold cache from another cache's snapshots (the Nutanix study; see
/// `docs/prewarm.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrewarmConfig {
    /// Where this daemon writes its snapshots (default METADATA/snapshots).
    pub snapshot_dir: Option<PathBuf>,
    /// Time between snapshots (`60s`), or requests served between them (`100000req`);
    /// `0` = at shutdown only.
    pub snapshot_every: String,
    /// Snapshots kept (the history a prewarm scores).
    pub snapshots_kept: usize,
    /// Prewarm at start from another cache's snapshot directory (`serve --prewarm-from`).
    pub from: Option<PathBuf>,
    /// Scoring heuristic.
    pub heuristic: cachevisor_prewarm::Heuristic,
    /// Prewarm set size limit, percent of this cache.
    pub limit: String,
    /// Prewarm rate per second (`unlimited` allowed).
    pub rate: String,
    /// Rate while a vDisk serves its clients (default: rate / 4).
    pub busy_rate: Option<String>,
    /// Largest coalesced read (default 128KiB, or one block if blocks are larger).
    pub max_read: Option<String>,
    /// Decide per vDisk whether, how much and how fast from the activity the source's
    /// snapshots carry (`prewarm::online`), instead of `limit` and `rate`.
    pub online: bool,
    /// Keep each prewarmed block from eviction until its first touch or this long after
    /// it is loaded (`"5min"`); none when absent.
    pub protect: Option<String>,
    /// How long the slides' minute lasts for `online` (`60s`): a working set back by
    /// itself within one is not prewarmed, and the source's last five are looked at.
    /// Shorter for scaled-down demos and tests, as the simulator's `failover.minute`.
    pub minute: String,
}

impl Default for PrewarmConfig {
    fn default() -> Self {
        PrewarmConfig {
            snapshot_dir: None,
            snapshot_every: "60s".into(),
            snapshots_kept: 10,
            from: None,
            heuristic: cachevisor_prewarm::Heuristic::Recent,
            limit: "100%".into(),
            rate: "64MiB".into(),
            busy_rate: None,
            max_read: None,
            online: false,
            protect: None,
            minute: "60s".into(),
        }
    }
}

/// When the daemon snapshots its cache's state (besides at a clean shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotSchedule {
    /// Only at shutdown.
    AtShutdown,
    /// Every this many ns.
    Every(u64),
    /// Every this many requests served (the slides' "every n requests").
    Requests(u64),
}

impl PrewarmConfig {
    /// The snapshot schedule and the pacing, checked.
    pub fn resolve(&self, block_size: u64) -> Result<(SnapshotSchedule, cachevisor_prewarm::Pacing), String> {
        let every = self.snapshot_every.trim();
        let schedule = match every.strip_suffix("req") {
            Some(n) => SnapshotSchedule::Requests(
                n.trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or(format!("prewarm.snapshot_every: `{every}` is not a positive request count"))?,
            ),
            None => match cachevisor_trace::units::parse_duration_ns(every)
                .map_err(|e| format!("prewarm.snapshot_every: {e} (or `<n>req`)"))?
            {
                0 => SnapshotSchedule::AtShutdown,
                ns if ns < 1_000_000_000 => {
                    return Err(format!("prewarm.snapshot_every: `{every}` is under 1s (or 0: at shutdown only)"))
                }
                ns => SnapshotSchedule::Every(ns),
            },
        };
        if !(1..=10_000).contains(&self.snapshots_kept) {
            return Err(format!("prewarm.snapshots_kept: {} is outside 1 to 10000", self.snapshots_kept));
        }
        let p = cachevisor_prewarm::settings::resolve(
            "prewarm",
            &self.limit,
            &self.rate,
            self.busy_rate.as_deref(),
            self.max_read.as_deref().unwrap_or(if block_size > 128 << 10 { "1MiB" } else { "128KiB" }),
            block_size,
        )?;
        self.protect_ms()?;
        self.minute_s()?;
        Ok((schedule, p))
    }

    /// `minute` in seconds, checked.
    pub fn minute_s(&self) -> Result<f64, String> {
        cachevisor_prewarm::settings::minute_s("prewarm", &self.minute)
    }

    /// `protect` in ms, checked (`None`: no protection).
    pub fn protect_ms(&self) -> Result<Option<u32>, String> {
        cachevisor_prewarm::settings::protect_ms("prewarm", self.protect.as_deref())
    }
}

/// The embedded default: a 256 MiB cache and two 1 GiB demo disks under ./var.
pub const DEFAULT: &str = r#"
[cache]
path = "var/cache.img"
size = "256MiB"
block_size = "4KiB"
write_policy = "wt"

[listen]
tcp = "127.0.0.1:10809"

[api]
listen = "127.0.0.1:10810"

[[vdisk]]
name = "vm1"
backing = "var/vm1.img"
size = "1GiB"

[[vdisk]]
name = "vm2"
backing = "var/vm2.img"
size = "1GiB"
write_policy = "wb"
"#;

/// Every setting, with its default and range, as `--print-default-config` prints it
/// after [`DEFAULT`] (each line commented out; a test parses it uncommented).
pub const REFERENCE: &str = r#"[cache]
path = "var/cache.img"        # cache store: a file (created and preallocated to `size`; its directory must exist) or a block device
size = "256MiB"               # required; a multiple of block_size (the file is created 0600; one other users can read refuses the start); a reload grows or shrinks the cache online up to max_size
max_size = "256MiB"           # default size: the most a reload may grow the cache to (the slot table and metadata are laid out for it, and its memory grows with it); a change needs a restart; not with [vssd] or [cluster]
block_size = "4KiB"           # default 4KiB; a power of two, 512B to 1MiB; fixed for the cache's life (metadata refuses a change)
replacement = "lru"           # lru | fifo | clock | two-pool | s3fifo; default the allocator's own: s3fifo for adaptive, clock for s-cave, lru otherwise
write_policy = "wt"           # default wt | wb | wa | ro: the policy of vDisks that set none
partition = "static"          # default static | shared: per-vDisk partitions the allocator sizes, or one pool all vDisks share (no targets, no allocator)
allocator = "static"          # default static | adaptive | optimal | symflex-weighted | symflex-proportional | s-cave | s-cave-literal | eci-cache | centaur | scave-recs | scave-hitratio
metadata = "var/cache.img.meta" # default PATH.meta beside the cache store (its parent must exist)
error_threshold = 8           # default 8, 1 to 1000000; device errors after which a vDisk passes through (its dirty blocks stay cached until written back)
interval = "1s"               # default 1s, at least 1ms: the allocator's interval on live traffic (and pass-through draining)
flush_rate = "16MiB"          # default 16MiB per second at most of background write-back, in each backing store's idle time (under load: the dirty data over writeback_percent / 40 s, bcache's controller; this rate once idle 1 s); "0" = off
writeback_percent = 10        # default 10, 0 to 100: share of the cache the flusher leaves dirty (hot blocks stay dirty)
writeback_ahead = 32          # default 32, 0 to 4096: dirty blocks among each vDisk's next this many victims are written back while its backing store is idle; 0 = off
direct = "auto"               # default auto | on | off: O_DIRECT on the cache store
io_uring = true               # default true: an O_DIRECT cache store's I/O through io_uring where the kernel allows; false: device threads
seal_after = "30s"            # default 30s, 0s or 1s to 1h: a dirty block whose 16 MiB region went this long without a write has its checksums sealed into the metadata (checked after a crash too; the region's next write waits for one commit); 0s = checked while running only
params = {}                   # default {}: the allocator's parameters over its seed's defaults, e.g. { m = 5.0 } for s-cave (unknown keys are errors)

[listen]                      # at least one of tcp, unix and vhost_user
tcp = "127.0.0.1:10809"       # loopback, or a test namespace address
unix = "var/cachevisor.sock"  # a unix socket (a stale one is replaced)
vhost_user = "var/vhost"      # an existing directory: every export (vDisk or vSSD) also a vhost-user-blk socket NAME.sock there, for QEMU's -device vhost-user-blk-pci,chardev=... (guest memory shared: memory-backend-memfd,share=on)
unix_mode = "0660"            # default 0600, at most 0660: the socket's mode (connecting takes write permission; 0660 lets the daemon's group in)
unix_group = "kvm"            # default: the daemon's group; a group name or number for the socket (with unix_mode = "0660"; the daemon's user must be in it, or root)
poll = "50us"                 # default 50us, 0 to 1ms: a connection polls this long for its next request before sleeping ("0": never)
max_connections = 1024        # default 1024, 1 to 65536: NBD connections at once (more are closed at once; logged, counted)
handshake_timeout = "10s"     # default 10s, 100ms to 10min: a client that has not finished the NBD handshake by then is closed
tls = "require"               # default off | on | require: NBD over TLS (STARTTLS); on offers it, require refuses everything else before it
tls_dir = "/etc/pki/qemu"     # QEMU's tls-creds-x509 layout: server-cert.pem, server-key.pem (not readable by others), ca-cert.pem (the CA of client certificates)
tls_cert = "server-cert.pem"  # default TLS_DIR/server-cert.pem: the server's certificate chain (PEM)
tls_key = "server-key.pem"    # default TLS_DIR/server-key.pem: its private key (PEM; mode 0640 at most)
tls_ca = "ca-cert.pem"        # default TLS_DIR/ca-cert.pem if present: the CA that signs client certificates
tls_verify_peer = true        # default true: clients must present a certificate the CA signed (QEMU's verify-peer); false lets clients in without one

[api]                         # the HTTP API and /metrics; omit the section to disable
listen = "127.0.0.1:10810"
token = "at-least-16-characters" # default: random, written to METADATA/api-token (0600; an existing one other users can read refuses the start); 16 to 4096 visible ASCII characters. Mutating calls need it (5 wrong ones in a row lock them out for 1 s, doubling to 60 s)
tls = false                   # default false; true: HTTPS with [listen]'s tls certificate and key (curl --cacert CA https://…); the token still authenticates
idle_timeout = "30s"          # default 30s, 1s to 1h: a connection that sends and receives nothing this long is closed (at most 64 are open at once)

[prewarm]                     # cache-state snapshots and prewarming (defaults when absent)
snapshot_dir = "var/cache.img.meta/snapshots" # default METADATA/snapshots (its parent must exist; created 0700)
snapshot_every = "60s"        # default 60s, at least 1s, or "100000req" (requests served); "0" = at shutdown only
snapshots_kept = 10           # default 10, 1 to 10000: the history a prewarm scores
from = "var/other.meta/snapshots" # default none: prewarm at start from another cache's snapshots (serve --prewarm-from)
heuristic = "k-recent"        # default k-recent | k-frequent | k-frerecent-lnr | k-frerecent-qdr
limit = "100%"                # default 100%: the prewarm set's size, of this cache
rate = "64MiB"                # default 64MiB per second; "unlimited"
busy_rate = "16MiB"           # default rate / 4: the rate while a vDisk serves its clients (never 0)
max_read = "128KiB"           # default 128KiB (one block if blocks are larger), at most 64MiB: neighbouring blocks coalesced into reads up to this size
online = false                # default false; true: per vDisk, whether, how much and how fast from what the source saw in its last 5 minutes (its snapshots' activity): a vDisk whose own traffic re-warms it within a minute, or that hit under 10%, is skipped; the rest load their working set at 4x their block traffic (at least 1MiB/s); limit still caps the set, rate and busy_rate are replaced
minute = "60s"                # default 60s, at least 1ms: how long online's minute lasts (shorter for scaled-down demos)
protect = "5min"              # default none, at least 1ms: a prewarmed block is kept from eviction until its first touch or this long after it is loaded

[[vdisk]]                     # one or more
name = "vm1"                  # the NBD export name, 1 to 4096 bytes, unique
backing = "var/vm1.img"       # a file or block device (one vDisk per backing), or an NBD URI: "nbd://HOST:PORT/EXPORT", "nbd+unix:///EXPORT?socket=PATH", nbds:// and nbds+unix:// with &tls-certificates=DIR
size = "1GiB"                 # a multiple of 512; creates a missing backing file (sparse, 0600); an existing one must have this size (without `size` an image of any length is served rounded up to a whole 512-byte sector)
grow = false                  # default false; true lets an existing smaller backing file grow to `size` (never shrinks)
weight = 1.0                  # default 1.0, > 0: share of the cache (static, symflex-weighted)
ratio = 1.0                   # default 1.0, > 0: target share of hit throughput (symflex-proportional)
min = "16MiB"                 # default 0: the smallest cache share (all vDisks' together at most the cache)
sequential_cutoff = "4MiB"    # default off: longer contiguous runs bypass the cache
write_policy = "wb"           # default: [cache] write_policy
allow = ["CN=host-a,O=tenant1", "DNS:host-b.example"] # default []: over TLS, only clients whose verified certificate has one of these subjects (every ATTR=value given) or alt names (DNS:, IP:, URI:, email:; "*" any) open this export
vhost_user = "group:kvm"      # who may open it over vhost-user-blk: "owner" (0600), "group:NAME" (0660), "none"; default: listen.unix_mode/unix_group, but none for an export with `allow` or under listen.tls = "require" (a socket has no certificate)
replicate = true              # default true, on a cluster node with cluster.replica: its client writes are on the replica peer too before they are acknowledged; false keeps its write-back data on this node only (another node then refuses to take it over after this one died)

[vssd]                        # SymFlex's elastic vSSDs: a region of the cache store file after the cache's blocks (omit the section for none)
size = "1GiB"                 # required: the region, whole blocks; fixed while vSSDs hold blocks in it (metadata refuses a change); with budget = "shared", the most of the cache it may take
budget = "own"                # default own (a range of its own after the cache's blocks) | shared (inside the cache's blocks: taken from the host cache as vSSDs inflate — dirty blocks written back first — and given back as they deflate; one SSD budget, split with the vDisks by weight (symflex-weighted) or by throughput served from the SSD against the vDisks' and vSSDs' summed ratios (symflex-proportional) when an allocator runs here; block_size a multiple of the cache's; kept for the region's life)
block_size = "1MiB"           # default 1MiB, a power of two from 4KiB to 1GiB: the unit of inflate and deflate
deflate_grace = "30s"         # default 30s, 1ms to 1h: how long a guest has to give blocks back before the host takes its least recently used ones
swap_dir = "var/cache.img.meta/vssd-swap" # default METADATA/vssd-swap: where an inactive persistent vSSD's blocks go when the space is needed
allocator = "symflex-proportional" # default none (targets from the API only) | symflex-weighted (region shared by weight) | symflex-proportional (sized so the vSSDs' throughputs follow their ratios, SymFlex §5.2)
interval = "1s"               # default 1s, 10ms to 1h: how often the allocator runs

[[vssd.device]]               # vSSDs registered at start (SymFlex's <M, C, P>)
name = "vm1-ssd"              # the NBD export name, unique among vDisks and vSSDs
max_size = "256MiB"           # M, whole blocks: the device's size as its guest sees it
initial_size = "64MiB"        # default 0, at most max_size: C, the blocks it gets now (the rest by inflation)
persist = true                # default false: P; true keeps its blocks and data across its VM's restarts
allow = ["CN=host-a"]         # default []: as a vDisk's allow
vhost_user = "owner"          # as a vDisk's vhost_user
weight = 1.0                  # default 1.0, > 0: share of the region (symflex-weighted; POST /vssds/NAME/share changes it)
ratio = 1.0                   # default 1.0, > 0: target share of the vSSDs' throughput (symflex-proportional)
control = "var/vm1-ssd.ctl"   # default METADATA/NAME.vssd.sock: the guest manager's control socket (0600; newline-delimited JSON, see docs/vssd.md; QEMU can carry it into the guest as a virtio-serial port)

[cluster]                     # a node of an HCI cluster whose state lives in etcd (omit the section for a single host)
name = "node-a"               # required, unique in the cluster: 1 to 63 letters, digits, -, _ or .
address = "10.0.0.1:10809"    # required: host:port its peers reach it at
etcd = ["http://10.0.0.9:2379"] # required: etcd's client URLs
cluster = "default"           # default default: its keys live under /cachevisor/CLUSTER/
lease_ttl = "3s"              # default 3s, whole seconds from 2s to 60s: a node that stops renewing its lease is dead after this
fence_margin = "250ms"        # default 250ms, 50ms to a quarter of lease_ttl: the node stops serving other nodes' data this much before etcd could expire its lease
interval = "2s"               # default 2s, 100ms to 1h: how often the leader decides the map and the allocation (ELICA's Eq. 4), and the window of the estimates each node publishes
unit = "1MiB"                 # default 1MiB, a power of two from 4KiB to 1GiB: ELICA's allocation unit
ideal = 0.99                  # default 0.99, in (0, 1]: Eq. 1's ideal size covers this fraction of a window's reuses (1.0: the maximum stack distance)
ssd_latency = "100us"         # default 100us, 1us to 10s: Eq. 3's latency of an SSD cache hit
network_latency = "100us"     # default 100us: what reaching another node's cache adds (Eq. 3)
backing_latency = "5ms"       # default 5ms: a miss served by the backing store (Eq. 3)
peers = ["node-b", "node-c"] # default []: the nodes this one may borrow cache from (a cache store per peer after the local one)
borrow = "0"                  # default 0 (none), whole units: the most used of each peer's lent cache; blocks there are never dirty (writes to them go through to the backing store), so losing a peer loses no acknowledged write
peer_tls_dir = "/etc/cachevisor/peer" # required to borrow: this node's client credentials for its peers (ca-cert.pem, client-cert.pem with CN=NAME, client-key.pem)
snapshots = "/srv/shared/cachevisor-snapshots" # default none: a directory every node reads (beside the backing store); each node writes its snapshots to SNAPSHOTS/NAME (prewarm.snapshot_dir must be unset), and a vDisk that moves to a node (its VM restarted there after a failover) is prewarmed from the snapshots of the node it came from
lend = "0"                    # default 0 (none), whole units: cache lent to each peer, as the NBD export lent-PEER@EPOCH@INCARNATION only PEER's client certificate (CN=PEER) opens; needs listen.tls with a CA for client certificates
replica = "node-b"            # default none: the peer keeping this node's replica log — every client write of a replicated vDisk is there too (O_DSYNC) before it is acknowledged, so losing either node loses no acknowledged write; needs peer_tls_dir
replica_capacity = "0"        # default 0 (none), 1MiB to 1TiB: the replica log this node keeps for each peer naming it (METADATA/replicas/PEER.log, kept across restarts), exported as replica-PEER@EPOCH; needs listen.tls with a CA for client certificates
replica_timeout = "3s"        # default lease_ttl, 100ms to lease_ttl: how long a write waits for its replica record before the peer counts as lost (then the log is declared void in etcd and writes go through to the backing store until a new log is in place): the stall ceiling
migration = "auto"            # default auto; gradual, instant or off: how a vDisk's cached blocks move when the leader's allocation moves its shares between this node and its lenders (ELICA 3.6) — gradual: a block moves when hit; instant: bulk copies; auto: gradual while the link to the lenders was busy at least half of the last 100 ms, else instant; off: blocks stay until replaced
migration_rate = 4.0          # default 4, above 0 to 1000: migrations that may start per second
migration_burst = 8           # default 8, 1 to 1000: migrations that may start at once after a quiet spell
migration_batch = 64          # default 64, 1 to 4096: blocks per instant-migration copy job (one in flight per vDisk)
hysteresis = 0.0              # default 0 (off: ELICA's re-solve as is), up to 0.5: the leader keeps its last allocation unless a new one lowers Eq. 4's summed latency by at least this fraction (fewer migrations between near-equal splits)

[log]                         # what the daemon logs (to journald under systemd, else stderr)
level = "info"                # default info: error, warn, info, debug, trace, or directives per module as RUST_LOG takes them ("info,cachevisor_server::vssd=debug"); RUST_LOG, when set, wins; a reload changes it
"#;

/// [`DEFAULT`] followed by [`REFERENCE`] commented out: what `--print-default-config` prints.
pub fn default_with_reference() -> String {
    let mut s = format!("# cachevisor's embedded demo configuration (what `cachevisor serve` runs without --config):\n{DEFAULT}\n# Every setting, with its default and range:\n");
    for l in REFERENCE.lines() {
        s += if l.is_empty() { "#\n" } else { "# " };
        if !l.is_empty() {
            s += l;
            s += "\n";
        }
    }
    s
}

/// Numbers resolved from the strings.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The `[cache]` settings shared with the simulator, checked once
    /// (`cachevisor_policy::cache_settings`).
    pub cache: cachevisor_policy::cache_settings::CacheSettings,
    /// Slots (`cache.size`).
    pub slots: u64,
    /// Slots the engine and the metadata are laid out for (`cache.max_size`): those past
    /// `slots` are withheld until a reload grows the cache.
    pub max_slots: u64,
    /// Allocation interval in ns.
    pub interval_ns: u64,
    /// A connection reader's poll before it sleeps, ns (`listen.poll`).
    pub poll_ns: u64,
    /// `listen.handshake_timeout`, ns.
    pub handshake_timeout_ns: u64,
    /// `cache.seal_after`, ns (0: never sealed).
    pub seal_after_ns: u64,
    /// `api.idle_timeout`, ns (0 without an `[api]` section).
    pub api_idle_timeout_ns: u64,
}

impl Config {
    /// Parses TOML text (`origin` names it in errors); relative paths are relative to
    /// `base`.
    pub fn parse(text: &str, origin: &str, base: &Path) -> Result<Config, String> {
        let mut c: Config = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        fix(&mut c.cache.path);
        if let Some(m) = c.cache.metadata.as_mut() {
            fix(m);
        }
        for p in [
            &mut c.listen.unix,
            &mut c.listen.vhost_user,
            &mut c.listen.tls_dir,
            &mut c.listen.tls_cert,
            &mut c.listen.tls_key,
            &mut c.listen.tls_ca,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
        if let Some(d) = c.prewarm.snapshot_dir.as_mut() {
            fix(d);
        }
        if let Some(d) = c.cluster.as_mut().and_then(|c| c.peer_tls_dir.as_mut()) {
            fix(d);
        }
        if let Some(d) = c.cluster.as_mut().and_then(|c| c.snapshots.as_mut()) {
            fix(d);
        }
        if let Some(d) = c.prewarm.from.as_mut() {
            fix(d);
        }
        c.vdisk.iter_mut().filter(|v| !cachevisor_store::backing::is_uri(&v.backing)).for_each(|v| fix(&mut v.backing));
        if let Some(v) = c.vssd.as_mut() {
            if let Some(d) = v.swap_dir.as_mut() {
                fix(d);
            }
            v.device.iter_mut().filter_map(|d| d.control.as_mut()).for_each(fix);
        }
        Ok(c)
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Config, String> {
        let text = cachevisor_files::bounded_read::read_to_string(path, cachevisor_files::bounded_read::CONFIG_CAP)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Config::parse(&text, &path.display().to_string(), path.parent().unwrap_or(Path::new(".")))
    }

    /// Checks every value; the message names the key.
    pub fn resolve(&self) -> Result<Resolved, String> {
        crate::process::log_filter::check(&self.log.level)
            .map_err(|e| format!("log.level: `{}`: {e}", self.log.level))?;
        let settings = cachevisor_policy::cache_settings::CacheSettings::check(&self.cache.keys())?;
        let (cache_bytes, block_size) = (settings.cache_bytes, settings.block_size);
        let slots = cache_bytes / block_size;
        // The cache file is whole blocks (the simulator rounds a size down).
        if !cache_bytes.is_multiple_of(block_size) {
            return Err(format!(
                "cache.size: {cache_bytes} bytes is not a multiple of block_size ({block_size}): use {} or {}",
                cache_bytes / block_size * block_size,
                cache_bytes.div_ceil(block_size) * block_size
            ));
        }
        settings.engine_config(slots)?;
        if !(1..=1_000_000).contains(&self.cache.error_threshold) {
            return Err(format!("cache.error_threshold: {} is outside 1 to 1000000", self.cache.error_threshold));
        }
        let interval = cachevisor_trace::units::parse_duration_ns(&self.cache.interval)
            .map_err(|e| format!("cache.interval: {e}"))?;
        if interval < 1_000_000 {
            return Err("cache.interval: at least 1ms".into());
        }
        let seal_after_ns = cachevisor_trace::units::parse_duration_ns(&self.cache.seal_after)
            .map_err(|e| format!("cache.seal_after: {e}"))?;
        if seal_after_ns != 0 && !(1_000_000_000..=3_600_000_000_000).contains(&seal_after_ns) {
            return Err(format!("cache.seal_after: `{}` is outside 1s to 1h (or 0s: never)", self.cache.seal_after));
        }
        if self.listen.tcp.is_none() && self.listen.unix.is_none() && self.listen.vhost_user.is_none() {
            return Err("listen: give `tcp`, `unix` and/or `vhost_user`".into());
        }

        if let Some(t) = &self.listen.tcp {
            t.parse::<SocketAddr>().map_err(|e| format!("listen.tcp: `{t}`: {e}"))?;
        }
        let mode = unix_mode(&self.listen.unix_mode)?;
        if let Some(g) = &self.listen.unix_group {
            // The name is looked up at start, on the host that binds the socket.
            check_group_mode(g, mode)?;
        }
        self.listen.tls_credentials()?;
        let poll_ns =
            cachevisor_trace::units::parse_duration_ns(&self.listen.poll).map_err(|e| format!("listen.poll: {e}"))?;
        if poll_ns > 1_000_000 {
            return Err(format!("listen.poll: `{}` is over 1ms (polling longer wastes CPU)", self.listen.poll));
        }
        if !(1..=65_536).contains(&self.listen.max_connections) {
            return Err(format!("listen.max_connections: {} is outside 1 to 65536", self.listen.max_connections));
        }
        let handshake_ns = cachevisor_trace::units::parse_duration_ns(&self.listen.handshake_timeout)
            .map_err(|e| format!("listen.handshake_timeout: {e}"))?;
        if !(100_000_000..=600_000_000_000).contains(&handshake_ns) {
            return Err(format!(
                "listen.handshake_timeout: `{}` is outside 100ms to 10min",
                self.listen.handshake_timeout
            ));
        }
        if let Some(c) = &self.cluster {
            let s = c.check()?;
            if s.lend_bytes > 0 || s.replica_capacity > 0 {
                let ca = self.listen.tls_credentials()?.and_then(|c| c.ca);
                if ca.is_none() {
                    let key = if s.lend_bytes > 0 { "cluster.lend" } else { "cluster.replica_capacity" };
                    return Err(format!("{key}: lent cache and replica logs are served over TLS to each peer's certificate only: set listen.tls (\"on\" or \"require\") with a CA for client certificates (listen.tls_dir's ca-cert.pem or listen.tls_ca)"));
                }
            }
            if s.unit_bytes % block_size != 0 {
                return Err(format!(
                    "cluster.unit: `{}` is not a multiple of cache.block_size ({block_size} B)",
                    c.unit
                ));
            }
        }
        let mut api_idle_ns = 0;
        if let Some(a) = &self.api {
            a.listen.parse::<SocketAddr>().map_err(|e| format!("api.listen: `{}`: {e}", a.listen))?;
            api_idle_ns = cachevisor_trace::units::parse_duration_ns(&a.idle_timeout)
                .map_err(|e| format!("api.idle_timeout: {e}"))?;
            if !(1_000_000_000..=3_600_000_000_000).contains(&api_idle_ns) {
                return Err(format!("api.idle_timeout: `{}` is outside 1s to 1h", a.idle_timeout));
            }
            if a.tls && self.listen.tls == cachevisor_nbd::tls::TlsMode::Off {
                return Err("api.tls: HTTPS uses [listen]'s certificate and key: set listen.tls (\"on\" or \"require\") and listen.tls_dir".into());
            }
            if let Some(t) = &a.token {
                if !(16..=4096).contains(&t.len()) || !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err("api.token: use 16 to 4096 visible ASCII characters (no spaces, tabs or newlines: clients send it in a header)".into());
                }
            }
        }
        if self.vdisk.is_empty() {
            return Err("vdisk: no [[vdisk]] to serve".into());
        }
        self.prewarm.resolve(block_size)?;
        for (i, v) in self.vdisk.iter().enumerate() {
            let at = format!("vdisk[{i}] ({})", v.name);
            if self.vdisk[..i].iter().any(|o| o.name == v.name) {
                return Err(format!("{at}.name: used twice"));
            }
            v.check(&at, block_size)?;
            if let Some(min) = v.min.as_deref().map(parse_size).transpose()? {
                if min > cache_bytes {
                    return Err(format!("{at}.min: {min} bytes is more than the cache ({cache_bytes} bytes)"));
                }
            }
        }
        if let Some(v) = &self.vssd {
            let plan = v.resolve()?;
            if let Some(d) = plan.devices.iter().find(|d| self.vdisk.iter().any(|v| v.name == d.name)) {
                return Err(format!("vssd.device ({}).name: a vDisk has that name", d.name));
            }
        }
        let mins: u64 = self.vdisk.iter().filter_map(|v| v.min.as_deref().and_then(|m| parse_size(m).ok())).sum();
        if mins > cache_bytes {
            return Err(format!(
                "vdisk.min: the minimums add up to {mins} bytes, more than the cache ({cache_bytes} bytes)"
            ));
        }
        let max_slots = match &self.cache.max_size {
            None => slots,
            Some(m) => {
                let max = parse_size(m).map_err(|e| format!("cache.max_size: {e}"))?;
                if max < cache_bytes || !max.is_multiple_of(block_size) {
                    return Err(format!(
                        "cache.max_size: {max} bytes must be at least cache.size ({cache_bytes}) and a multiple of block_size ({block_size})"
                    ));
                }
                if max > cache_bytes && (self.vssd.is_some() || self.cluster.is_some()) {
                    return Err("cache.max_size: a cache that grows online cannot hold a vSSD region ([vssd]) or lend to a cluster ([cluster]) (both are laid out after its blocks)".into());
                }
                settings.engine_config(max / block_size).map_err(|e| format!("cache.max_size: {e}"))?;
                max / block_size
            }
        };
        Ok(Resolved {
            cache: settings,
            slots,
            max_slots,
            interval_ns: interval,
            seal_after_ns,
            poll_ns,
            handshake_timeout_ns: handshake_ns,
            api_idle_timeout_ns: api_idle_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_size_is_checked_where_it_enters() {
        let base = "[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n{}[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1MiB\"\n";
        let r =
            |extra: &str| Config::parse(&base.replace("{}", extra), "t", Path::new("/srv")).and_then(|c| c.resolve());
        assert_eq!(r("").unwrap().max_slots, 16384, "default: the size");
        assert_eq!(r("max_size = \"64MiB\"\n").unwrap().max_slots, 16384, "equal to the size");
        assert_eq!(r("max_size = \"1GiB\"\n").unwrap().max_slots, 262144);
        for (bad, why) in [
            ("max_size = \"0\"\n", "at least cache.size"),
            ("max_size = \"32MiB\"\n", "at least cache.size"),
            ("max_size = \"65537KiB\"\n", "multiple of block_size"),
            ("max_size = \"99999999999EiB\"\n", "cache.max_size"),
            ("max_size = \"lots\"\n", "cache.max_size"),
        ] {
            let e = r(bad).unwrap_err();
            assert!(e.contains("cache.max_size") && e.contains(why), "{bad}: {e}");
        }
        // Past what an engine can lay out (slot ids are 32-bit): refused, not wrapped.
        let e = r("max_size = \"64TiB\"\n").unwrap_err();
        assert!(e.contains("cache.max_size"), "{e}");
    }

    #[test]
    fn seal_after_is_0_or_1s_to_1h() {
        let base = "[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n{}[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"a.img\"\nsize = \"1MiB\"\n";
        let r =
            |extra: &str| Config::parse(&base.replace("{}", extra), "t", Path::new("/srv")).and_then(|c| c.resolve());
        assert_eq!(r("").unwrap().seal_after_ns, 30_000_000_000, "default 30 s");
        assert_eq!(r("seal_after = \"0s\"\n").unwrap().seal_after_ns, 0, "never");
        assert_eq!(r("seal_after = \"1h\"\n").unwrap().seal_after_ns, 3_600_000_000_000);
        for bad in ["500ms", "61min", "soon", "-1s"] {
            let e = r(&format!("seal_after = \"{bad}\"\n")).unwrap_err();
            assert!(e.starts_with("cache.seal_after"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_reference_lists_every_setting_and_parses() {
        let text = default_with_reference();
        let reference: String = text
            .lines()
            .skip_while(|l| !l.starts_with("# Every setting"))
            .skip(1)
            .map(|l| l.strip_prefix("# ").unwrap_or("").to_string() + "\n")
            .collect();
        let c = Config::parse(&reference, "reference", Path::new("/tmp")).unwrap();
        c.resolve().unwrap();
        assert_eq!(c.vdisk.len(), 1);
        // Every key of every section is shown (serde would refuse an unknown one).
        let keys = |t: &str| {
            t.lines()
                .filter_map(|l| l.split_once(" =").map(|(k, _)| k.trim().to_string()))
                .filter(|k| !k.starts_with('['))
                .collect::<Vec<_>>()
        };
        let shown = keys(&reference);
        let full = toml::to_string(&c).unwrap();
        for k in keys(&full) {
            assert!(shown.contains(&k), "`{k}` is not in the reference");
        }
        for k in ["params", "metadata", "unix", "token", "min", "sequential_cutoff", "write_policy", "grow"] {
            assert!(shown.iter().any(|s| s == k), "{k}");
        }
    }

    #[test]
    fn the_default_parses_and_errors_name_the_key() {
        let c = Config::parse(DEFAULT, "default", Path::new("/tmp/x")).unwrap();
        assert_eq!(c.vdisk.len(), 2);
        assert_eq!(c.resolve().unwrap().slots, 65536);
        let bad = DEFAULT.replace("size = \"256MiB\"", "size = \"256 potatoes\"");
        assert!(Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err().starts_with("cache.size"));
        let bad = DEFAULT.replace("127.0.0.1:10809", "localhost");
        assert!(Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err().starts_with("listen.tcp"));
        let bad = DEFAULT.replace("name = \"vm2\"", "name = \"vm1\"");
        assert!(Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err().contains("used twice"));
        let e =
            Config::parse(&DEFAULT.replace("[listen]", "[listen]\nport = 1"), "cfg.toml", Path::new(".")).unwrap_err();
        assert!(e.contains("cfg.toml") && e.contains("port"), "{e}");
        for (from, to, key) in [
            ("write_policy = \"wt\"", "write_policy = \"wt\"\ninterval = \"often\"", "cache.interval"),
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nflush_rate = \"fast\"", "cache.flush_rate"),
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nwriteback_percent = 150", "cache.writeback_percent"),
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nwriteback_ahead = 5000", "cache.writeback_ahead"),
            (
                "write_policy = \"wt\"",
                "write_policy = \"wt\"\nallocator = \"s-cave\"\nreplacement = \"lru\"",
                "cache.replacement",
            ),
            ("127.0.0.1:10810", "localhost:10810", "api.listen"),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\ntoken = \"short\"", "api.token"),
            ("[listen]", "[listen]\npoll = \"2ms\"", "listen.poll"),
            ("[listen]", "[listen]\npoll = \"soon\"", "listen.poll"),
            ("name = \"vm1\"", "name = \"vm1\"\nratio = 0.0", "vdisk[0] (vm1).ratio"),
            ("name = \"vm1\"", "name = \"vm1\"\nmin = \"x\"", "vdisk[0] (vm1).min"),
            ("name = \"vm1\"", "name = \"vm1\"\nsequential_cutoff = \"x\"", "vdisk[0] (vm1).sequential_cutoff"),
            // every key has a range.
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 0", "cache.error_threshold"),
            ("size = \"256MiB\"\nblock_size = \"4KiB\"", "size = \"10001KiB\"\nblock_size = \"8KiB\"", "cache.size"),
            ("name = \"vm1\"", "name = \"vm1\"\nmin = \"512MiB\"", "vdisk[0] (vm1).min"),
            ("write_policy = \"wb\"", "write_policy = \"wb\"\nmin = \"200MiB\"\n[[vdisk]]\nname = \"vm3\"\nbacking = \"var/vm3.img\"\nsize = \"1GiB\"\nmin = \"100MiB\"", "vdisk.min"),
            ("size = \"1GiB\"", "size = \"16778241B\"", "vdisk[0] (vm1).size"),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\ntoken = \"                \"", "api.token"),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\ntoken = \"0123456789\\nabcdefgh\"", "api.token"),
            ("[listen]", "[listen]\nmax_connections = 0", "listen.max_connections"),
            ("name = \"vm1\"", "name = \"vm1\"\nweight = 1000000.5", "vdisk[0] (vm1).weight"),
            ("name = \"vm1\"", "name = \"vm1\"\nratio = 1e308", "vdisk[0] (vm1).ratio"),
            ("[listen]", "[listen]\nmax_connections = 65537", "listen.max_connections"),
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 1000001", "cache.error_threshold"),
            ("[[vdisk]]", "[prewarm]\nsnapshots_kept = 10001\n[[vdisk]]", "prewarm.snapshots_kept"),
            (
                "[[vdisk]]",
                "[cluster]\nname = \"a\"\naddress = \"10.0.0.1:1\"\netcd = [\"http://10.0.0.9:2379\"]\nlease_ttl = \"1s\"\n[[vdisk]]",
                "cluster.lease_ttl",
            ),
            ("[[vdisk]]", "[cluster]\nname = \"a\"\naddress = \"here\"\netcd = [\"http://h:1\"]\n[[vdisk]]", "cluster.address"),
            (
                "[[vdisk]]",
                "[cluster]\nname = \"a\"\naddress = \"10.0.0.1:1\"\netcd = [\"http://h:1\"]\nlend = \"1MiB\"\n[[vdisk]]",
                "cluster.lend",
            ),
            ("[[vdisk]]", "[prewarm]\nmax_read = \"65MiB\"\n[[vdisk]]", "prewarm.max_read"),
            ("size = \"1GiB\"", "size = \"0B\"", "vdisk[0] (vm1).size"),
            ("[listen]", "[listen]\nhandshake_timeout = \"1ms\"", "listen.handshake_timeout"),
            ("[listen]", "[listen]\nhandshake_timeout = \"1h\"", "listen.handshake_timeout"),
            ("[[vdisk]]", "[prewarm]\nmax_read = \"1TiB\"\n[[vdisk]]", "prewarm.max_read"),
            ("[[vdisk]]", "[prewarm]\nsnapshots_kept = 0\n[[vdisk]]", "prewarm.snapshots_kept"),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"999ms\"", "api.idle_timeout"),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"61min\"", "api.idle_timeout"),
        ] {
            let bad = DEFAULT.replacen(from, to, 1);
            let e = Config::parse(&bad, "x", Path::new(".")).unwrap().resolve().unwrap_err();
            assert!(e.starts_with(key), "{key}: {e}");
        }
        // Each range's ends are accepted.
        for (from, to) in [
            ("[listen]", "[listen]\nmax_connections = 1\nhandshake_timeout = \"100ms\""),
            ("[listen]", "[listen]\nmax_connections = 65536\nhandshake_timeout = \"10min\""),
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 1000000"),
            ("write_policy = \"wt\"", "write_policy = \"wt\"\nerror_threshold = 1"),
            ("[[vdisk]]", "[prewarm]\nsnapshots_kept = 10000\nmax_read = \"64MiB\"\n[[vdisk]]"),
            ("name = \"vm1\"", "name = \"vm1\"\nmin = \"256MiB\""),
            ("size = \"1GiB\"", "size = \"512B\""),
            ("name = \"vm1\"", "name = \"vm1\"\nweight = 1000000.0\nratio = 1000000.0"),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"1s\""),
            ("listen = \"127.0.0.1:10810\"", "listen = \"127.0.0.1:10810\"\nidle_timeout = \"1h\""),
        ] {
            let ok = DEFAULT.replacen(from, to, 1);
            Config::parse(&ok, "x", Path::new(".")).unwrap().resolve().unwrap_or_else(|e| panic!("{to}: {e}"));
        }
        // The largest block size works with the default prewarm read (one block).
        let big = DEFAULT.replacen("block_size = \"4KiB\"", "block_size = \"1MiB\"", 1);
        Config::parse(&big, "x", Path::new(".")).unwrap().resolve().unwrap();
        // Unset, the replacement is the allocator's own; set, it is what is set.
        for (alloc, set, want) in [
            ("static", "", ReplacementKind::Lru),
            ("adaptive", "", ReplacementKind::S3fifo),
            ("s-cave", "", ReplacementKind::Clock),
            ("adaptive", "\nreplacement = \"lru\"", ReplacementKind::Lru),
        ] {
            let t = DEFAULT.replacen(
                "write_policy = \"wt\"",
                &format!("write_policy = \"wt\"\nallocator = \"{alloc}\"{set}"),
                1,
            );
            let c = Config::parse(&t, "x", Path::new(".")).unwrap();
            c.resolve().unwrap();
            assert_eq!(c.cache.replacement(), want, "{alloc}{set}");
        }
        // A wrong type is a parse error naming the file, the line and the key.
        let e = Config::parse(
            &DEFAULT.replacen("write_policy = \"wt\"", "write_policy = \"wt\"\nio_uring = \"yes\"", 1),
            "cfg.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(e.contains("cfg.toml") && e.contains("io_uring = \"yes\"") && e.contains("expected a boolean"), "{e}");
        let e = Config::parse(
            &DEFAULT.replacen("write_policy = \"wt\"", "write_policy = \"wt\"\ndirect = \"fast\"", 1),
            "cfg.toml",
            Path::new("."),
        )
        .unwrap_err();
        assert!(e.contains("cfg.toml") && e.contains("direct") && e.contains("auto"), "{e}");
        let missing = "[cache]\npath = \"c\"\nsize = \"1MiB\"\n[listen]\ntcp = \"127.0.0.1:1\"\n[[vdisk]]\nname = \"a\"\nbacking = \"/nonexistent/a.img\"\n";
        assert!(Config::parse(missing, "x", Path::new(".")).unwrap().resolve().unwrap_err().contains("does not exist"));
    }
}
