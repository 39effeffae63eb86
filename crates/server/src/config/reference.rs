//! The embedded default configuration and the reference of every setting, as
//! `cachevisor serve --print-default-config` prints them.

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
congested_read_threshold = "2ms"   # default off: read misses go around the cache while its device's reads take longer than this on average (bcache's congested_read_threshold_us; 3/4 of it clears it)
congested_write_threshold = "20ms" # default off: the same for write misses and the device's writes
write_budget = "3dwpd"        # default off: the SSD's write budget, "50MiB/s" or drive writes per day of the cache ("3dwpd"), shared across the vDisks: each miss a vDisk's own admission lets in enters with a probability a controller holds to it, the room split by hits per admitted block (every vDisk with misses gets a tenth of an equal part); write hits and write-back count against it
writeback_ahead = 32          # default 32, 0 to 4096: dirty blocks among each vDisk's next this many victims are written back while its backing store is idle; 0 = off
direct = "auto"               # default auto | on | off: O_DIRECT on the cache store
io_uring = true               # default true: an O_DIRECT cache store's I/O through io_uring where the kernel allows; false: device threads
seal_after = "30s"            # default 30s, 0s or 1s to 1h: a dirty block whose 16 MiB region went this long without a write has its checksums sealed into the metadata (checked after a crash too; the region's next write waits for one commit); 0s = checked while running only
params = {}                   # default {}: the allocator's parameters over its seed's defaults, e.g. { m = 5.0 } for s-cave (unknown keys are errors)
ram = "0"                     # default 0 (none): a RAM tier of this size in front of the cache devices, clean copies of the hottest cached blocks in memory (never the only copy of anything: a crash or restart loses nothing), each vDisk's share in proportion to its cache target; its memory is taken as it fills; a change needs a restart
# ram_fill = "every-hit"      # default every-hit (CacheLib's rule: every SSD hit copies the block to RAM from the same read) | second-hit (a block's second SSD hit among the recent ones)
# mirror_dirty = true         # default true with two or more devices ([[cache.device]]; refused with one): a write-back write is answered once on two devices, so one device lost loses no acknowledged write; clean blocks live once; false: one copy

# [[cache.device]]            # more cache devices beside path (omit for one; shown commented out: not with the [cluster] below): files or block devices, one allocation over all; new blocks go where free slots per queued op are most; not with max_size, [vssd] or [cluster] yet; a change of the list needs a restart, and a start refuses one while dirty blocks are cached (flush first)
# path = "var/cache2.img"     # required; like [cache] path (its own label: a device emptied or replaced while stopped is refused with dirty blocks on it, its clean blocks dropped)
# size = "256MiB"             # required; a whole number of blocks

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
admission = "second-hit"      # default "all": which read misses take a slot — "all", "second-hit" (the 2nd miss of a block among the vDisk's last misses, as many as the cache has slots), "second-hit:N", "probability:P" (0 < P <= 1), "auto" (second-hit or every miss, as two sampled shadow caches say), "write-budget:RATE" (a probability held by a controller so that the vDisk's SSD writes average RATE: "50MiB/s", or "3dwpd" drive writes per day of the cache); a rejected miss is read around the cache
prefetch = "amp"              # default "none": loads ahead of a sequential reader — "obl" (the next block), "amp" / "amp:N" (AMP: degree up to N = 64 blocks and trigger distance adapted per stream), "auto" (amp that pauses while its loads go unread); for slow backing stores
write_admission = "all"       # default: as admission; which write misses take a slot (a rejected one is written around the cache)
allow = ["CN=host-a,O=tenant1", "DNS:host-b.example"] # default []: over TLS, only clients whose verified certificate has one of these subjects (every ATTR=value given) or alt names (DNS:, IP:, URI:, email:; "*" any) open this export
vhost_user = "group:kvm"      # who may open it over vhost-user-blk: "owner" (0600), "group:NAME" (0660), "none"; default: listen.unix_mode/unix_group, but none for an export with `allow` or under listen.tls = "require" (a socket has no certificate)
replicate = true              # default true, on a cluster node with cluster.replica: its client writes are on the replica peer too before they are acknowledged; false keeps its write-back data on this node only (another node then refuses to take it over after this one died)

[[vdisk.class]]               # I/O classes of the [[vdisk]] above (Open-CAS's ioclasses, at most 32): a request takes the first class it matches
name = "wal"                  # required, unique in the vDisk: metrics and status label
range = "0-1GiB"              # default the whole disk: a request starting in [A, B) matches ("A-B"; "A-" to the end)
size = "-64KiB"               # default every size: request sizes from A to B, both included ("4KiB-1MiB", "64KiB-", "-4KiB")
op = "write"                  # default both: "read" or "write"
pinned = true                 # default false: its blocks are passed over as victims while it holds no more than max_occupancy
max_occupancy = "20%"         # default none: at most this share of the vDisk's partition (of the cache, shared); at it, its misses go around the cache
sync = true                   # default both: true matches only writes the client sent with FUA (NBD; vhost-user-blk has none), false only the others
priority = 10                 # default 100 (as unclassified blocks), 0 to 255, Open-CAS's eviction priority: a block is passed over as a victim while the vDisk holds blocks of a class with a higher number (those go first)
admission = "second-hit"      # default: the vDisk's admission; its misses' own (as admission above)

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
