//! The simulator's devices behind the engine's store table: each row gets a
//! [`cachevisor_engine::Device`] — the node's SSD models for its local stores (store 0
//! and each other cache device), the node's link and then the lender's SSD model for a
//! region another node lends — and
//! `Node::run_op` runs a cache op by looking its store up. A new store kind is a row
//! kind in the engine and one `Device` here.

use crate::device::SharedDevice;
use cachevisor_engine::{Device, Io, StoreKind, StoreLayout, Unserved};

/// A store on one device model (the node's own SSD).
pub(crate) struct ModelStore {
    dev: SharedDevice,
    size: u64,
}

impl Device for ModelStore {
    #[inline]
    fn submit(&self, now_ns: u64, at: u64, io: Io<'_>) -> std::io::Result<u64> {
        Ok(self.dev.borrow_mut().submit(now_ns, io.is_write(), at, io.len()))
    }

    fn queue_depth(&self) -> u32 {
        self.dev.borrow().servers() as u32
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        format!("the {} model", self.dev.borrow().spec().name())
    }
}

/// A region another node lends: each op crosses this node's link, then queues on the
/// lender's SSD (ELICA §3.4's remote cache access).
pub(crate) struct LentStore {
    link: SharedDevice,
    lender: SharedDevice,
    node: u16,
    size: u64,
}

impl Device for LentStore {
    #[inline]
    fn submit(&self, now_ns: u64, at: u64, io: Io<'_>) -> std::io::Result<u64> {
        let (write, len) = (io.is_write(), io.len());
        let arrived = self.link.borrow_mut().submit(now_ns, write, 0, len);
        Ok(self.lender.borrow_mut().submit(arrived, write, at, len))
    }

    fn queue_depth(&self) -> u32 {
        self.lender.borrow().servers() as u32
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        format!("a region node {} lends", self.node)
    }
}

/// One device per row of `layout` (blocks of `block` bytes): `ssds[0]` for the local
/// store, `ssds[i]` for cache device `i`, `nic` then `peers[node]` for a region `node`
/// lends (a row whose device, lender or link is missing gets an [`Unserved`] device,
/// whose ops fail naming it).
pub(crate) fn store_devices(
    layout: &StoreLayout,
    block: u64,
    ssds: &[SharedDevice],
    peers: &[Option<SharedDevice>],
    nic: Option<&SharedDevice>,
) -> Vec<Box<dyn Device>> {
    (0..layout.len())
        .map(|i| {
            let id = i as cachevisor_engine::StoreId;
            let size = layout.range(id).1 * block;
            match layout.kind(id) {
                StoreKind::Local => Box::new(ModelStore { dev: ssds[0].clone(), size }) as Box<dyn Device>,
                StoreKind::Device { index } => match ssds.get(index as usize) {
                    Some(dev) => Box::new(ModelStore { dev: dev.clone(), size }) as Box<dyn Device>,
                    None => Box::new(Unserved { what: format!("cache device {index} (no model for it)"), size }),
                },
                StoreKind::Lent { node } => match (nic, peers.get(node as usize).and_then(|p| p.as_ref())) {
                    (Some(link), Some(lender)) => {
                        Box::new(LentStore { link: link.clone(), lender: lender.clone(), node, size })
                            as Box<dyn Device>
                    }
                    _ => Box::new(Unserved { what: format!("a region node {node} lends (no link or lender)"), size }),
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Device as Model, DeviceSpec};
    use cachevisor_engine::{EngineConfig, StoreSpec};
    use std::{cell::RefCell, rc::Rc};

    fn model(name: &str) -> SharedDevice {
        Rc::new(RefCell::new(Model::new(DeviceSpec::preset(name).unwrap())))
    }

    #[test]
    fn each_row_gets_its_device_and_a_lent_row_crosses_the_link() {
        let cfg = EngineConfig { stores: vec![StoreSpec::lent(2, 16)], ..EngineConfig::with_slots(32) };
        let layout = StoreLayout::new(&cfg);
        let (ssd, link, lender) = (model("nvme"), model("remote"), model("nvme"));
        let peers = [None, None, Some(lender.clone())];
        let devs = store_devices(&layout, 4096, std::slice::from_ref(&ssd), &peers, Some(&link));
        assert_eq!(devs.len(), 2);
        assert_eq!((devs[0].size(), devs[1].size()), (32 * 4096, 16 * 4096));
        assert!(devs[1].describe().contains("node 2"), "{}", devs[1].describe());
        let local = devs[0].submit(0, 0, Io::Model { write: false, len: 4096 }).unwrap();
        let remote = devs[1].submit(0, 0, Io::Model { write: false, len: 4096 }).unwrap();
        assert!(remote > local, "a lent region's read crosses the link: {remote} vs {local}");
        assert_eq!(link.borrow().bytes_read(), 4096);
        assert_eq!(lender.borrow().bytes_read(), 4096);
        assert_eq!(ssd.borrow().bytes_read(), 4096);
        // Without its lender the row's ops fail, naming it.
        let devs = store_devices(&layout, 4096, std::slice::from_ref(&ssd), &[], None);
        let e = devs[1].submit(0, 0, Io::Model { write: true, len: 4096 }).unwrap_err();
        assert!(e.to_string().contains("node 2"), "{e}");
    }
}
