//! A real Linux guest (TCG) on node n0 of a cluster whose cache is partly in node n1's
//! lent region, across a SIGKILL of n1: the guest's disk is an NBD export of
//! n0 reached from inside n0's network namespace; it writes files, reads them over and
//! over (dropping its page cache) so its blocks fill n0's cache and n1's region, and goes
//! on reading and writing while n1 is killed. No guest I/O error, every checksum intact:
//! the blocks that were in n1's region are read from the backing store instead (they
//! were never dirty there).

use cachevisor_testkit as common;

use common::cluster::Cluster;
use common::guest_vm;
use std::time::Duration;

/// The guest's /init: 12 MiB of files on a 48 MiB disk (n0 caches 8 MiB), read passes,
/// then reads and writes while the host kills the lender (the check after a remount is
/// `guest_vm::VERIFY_AND_POWER_OFF`).
const INIT: &str = r#"i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mke2fs -q -b 4096 /dev/vda || echo "GUEST: FAIL mke2fs"
mount -t ext2 /dev/vda /mnt || echo "GUEST: FAIL mount"
for i in 1 2 3 4 5 6; do dd if=/dev/urandom of=/mnt/a$i bs=64k count=32 2>/dev/null; done
sync
md5sum /mnt/a* > /tmp/sums
for p in 1 2 3 4 5 6 7 8 9 10 11 12; do echo 3 > /proc/sys/vm/drop_caches; cat /mnt/a* > /dev/null; sleep 0.5; done
echo "GUEST: phase1 read"
for i in 1 2 3 4 5 6 7 8; do
  echo 3 > /proc/sys/vm/drop_caches; cat /mnt/a* > /dev/null
  dd if=/dev/urandom of=/mnt/b$i bs=64k count=8 2>/dev/null; sync; sleep 0.25
done
md5sum /mnt/b* >> /tmp/sums
echo "GUEST: phase2 done"
"#;

#[test]
fn a_guest_whose_cache_is_partly_on_a_peer_sees_no_io_error_when_the_peer_is_killed() {
    let kernel = guest_vm::kernel_dir();
    let (mut c, _pki) = Cluster::borrowing();
    std::fs::File::create(c.dir.path().join("guest.img")).unwrap().set_len(48 << 20).unwrap();
    c.add_vdisk(0, "guest", "guest.img");
    let d = c.dir.path().join("guest-vm");
    std::fs::create_dir(&d).unwrap();
    let initrd =
        guest_vm::initramfs(&d, &kernel, &guest_vm::init(&format!("{INIT}{}", guest_vm::VERIFY_AND_POWER_OFF)), &[]);
    let disk = format!(
        "driver=nbd,node-name=disk,server.type=inet,server.host={},server.port=10809,export=guest,reconnect-delay=30",
        c.net.addr(0)
    );
    let args: Vec<String> =
        ["-blockdev", &disk, "-device", "virtio-blk-pci,drive=disk"].iter().map(|s| s.to_string()).collect();
    let mut guest = guest_vm::Guest::boot_in(Some(&c.net.nodes[0]), &kernel, &initrd, "256M", &args);
    guest.wait_for("GUEST: phase1 read", Duration::from_secs(240));
    let region = c.dir.path().join("n1/cache.img.meta/lent/n0.img");
    let held = std::fs::read(&region).map_or(0, |b| b.chunks(4096).filter(|x| x.iter().any(|&y| y != 0)).count());
    let alloc = c.status(0).unwrap()["allocation"]["vms"]["guest"].clone();
    assert!(held > 0, "the guest's blocks never reached n1's region (allocation {alloc}):\n{}", c.logs());
    // The lender dies while the guest reads and writes.
    c.nodes[1].as_mut().unwrap().kill9();
    guest.wait_for("GUEST: done", Duration::from_secs(240));
    let started = guest.started;
    let (status, text, qemu_log) = guest.finish();
    eprintln!(
        "guest ran {:.1} s, {held} of its blocks held in n1's region (allocation {alloc}) when n1 was killed; console:\n{text}\nqemu:\n{qemu_log}",
        started.elapsed().as_secs_f64()
    );
    assert!(status.success(), "qemu: {status}");
    assert!(!text.contains("GUEST: FAIL") && !text.contains("FAILED"), "{text}");
    assert!(text.contains("GUEST: checksums ok"), "{text}");
    assert!(text.contains("GUEST: io errors 0"), "the guest saw I/O errors:\n{text}\nnodes:\n{}", c.logs());
    assert!(
        c.logs().contains("lent cache on a peer: op failed"),
        "n1's loss never met the guest's reads:\n{}",
        c.logs()
    );
}
