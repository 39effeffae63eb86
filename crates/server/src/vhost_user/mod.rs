//! vhost-user-blk: exports served to QEMU as virtio block devices over a unix socket with
//! guest memory shared (`-device vhost-user-blk-pci`), the path SPDK and
//! qemu-storage-daemon use for VM disks — no TCP and no NBD framing in the data path.
//! `blk_request.rs` the virtio-blk request on a descriptor chain, `blk_backend.rs` the
//! device, `sockets.rs` one socket per export in `listen.vhost_user`.

pub mod blk_backend;
pub mod blk_request;
pub mod in_order;
pub mod sockets;
