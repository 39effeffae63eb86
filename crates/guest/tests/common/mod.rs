//! A fake host for the guest's tests: the control protocol spoken over a socket pair, a
//! vSSD whose invalid blocks answer EIO, and an origin in memory.

#![allow(dead_code)]

use cachevisor_guest::{BlockDevice, Control};
use cachevisor_vssd::protocol::{HostLine, Notice, Reply, Request};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};

pub const BLOCK: u64 = 4096;
pub const MAX: u32 = 12;
pub const ORIGIN_BLOCKS: u64 = 40;

pub struct Host {
    pub valid: BTreeSet<u32>,
    pub bytes: BTreeMap<u32, Vec<u8>>,
    pub asked: u32,
    /// Taken after a "deadline": not inflated again before the guest's hello.
    pub fenced: BTreeSet<u32>,
    pub out: UnixStream,
    pub partial: Vec<u8>,
    /// Notices sent.
    pub notices: usize,
}

impl Host {
    pub fn send(&mut self, l: &HostLine) {
        self.notices += usize::from(matches!(l, HostLine::Notice(_)));
        let mut s = serde_json::to_string(l).unwrap();
        s.push('\n');
        self.out.write_all(s.as_bytes()).unwrap();
    }

    fn answer(&mut self, r: Request) {
        let reply = match r {
            Request::Hello => {
                self.fenced.clear();
                Reply::State {
                    block_size: BLOCK,
                    max_blocks: MAX,
                    valid: self.valid.iter().copied().collect(),
                    target: 0,
                    asked: self.asked,
                    deadline_in_ms: None,
                }
            }
            Request::Release { lbns } => {
                let set: BTreeSet<u32> = lbns.iter().copied().collect();
                if set.len() != lbns.len() || lbns.len() as u32 > self.asked || !set.is_subset(&self.valid) {
                    Reply::Error { message: format!("bad release {lbns:?}") }
                } else {
                    for l in &lbns {
                        self.valid.remove(l);
                        self.bytes.remove(l);
                    }
                    self.asked -= lbns.len() as u32;
                    // The event first: the harder order for the guest.
                    self.send(&HostLine::Notice(Notice::Released { lbns: lbns.clone(), forced: false }));
                    Reply::Released { lbns }
                }
            }
        };
        self.send(&HostLine::Reply(reply));
    }
}

pub struct HostWriter(pub Arc<Mutex<Host>>);

impl Write for HostWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut h = self.0.lock().unwrap();
        h.partial.extend_from_slice(buf);
        while let Some(i) = h.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = h.partial.drain(..=i).collect();
            let r: Request = serde_json::from_slice(&line).unwrap();
            h.answer(r);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

pub struct Vssd(pub Arc<Mutex<Host>>);

impl Vssd {
    fn blocks(&self, offset: u64, len: usize) -> io::Result<Vec<u32>> {
        let h = self.0.lock().unwrap();
        let lbns: Vec<u32> = ((offset / BLOCK) as u32..=((offset + len as u64 - 1) / BLOCK) as u32).collect();
        if lbns.iter().all(|l| h.valid.contains(l)) {
            Ok(lbns)
        } else {
            Err(io::Error::other("EIO: not a valid block"))
        }
    }
}

impl BlockDevice for Vssd {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.blocks(offset, buf.len())?;
        let h = self.0.lock().unwrap();
        for (i, b) in buf.iter_mut().enumerate() {
            let at = offset + i as u64;
            *b = h.bytes.get(&((at / BLOCK) as u32)).map_or(0, |v| v[(at % BLOCK) as usize]);
        }
        Ok(())
    }
    fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        self.blocks(offset, data.len())?;
        let mut h = self.0.lock().unwrap();
        for (i, b) in data.iter().enumerate() {
            let at = offset + i as u64;
            h.bytes.entry((at / BLOCK) as u32).or_insert_with(|| vec![0; BLOCK as usize])[(at % BLOCK) as usize] = *b;
        }
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Clone)]
pub struct Mem(pub Arc<Mutex<Vec<u8>>>);

impl BlockDevice for Mem {
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        buf.copy_from_slice(&self.0.lock().unwrap()[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&mut self, data: &[u8], offset: u64) -> io::Result<()> {
        self.0.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A host with `initial` valid blocks and a guest's control channel to it.
pub fn host(initial: u32) -> (Arc<Mutex<Host>>, Control) {
    let (host_end, guest_end) = UnixStream::pair().unwrap();
    let host = Arc::new(Mutex::new(Host {
        valid: (0..initial).collect(),
        bytes: BTreeMap::new(),
        asked: 0,
        fenced: BTreeSet::new(),
        out: host_end,
        partial: Vec::new(),
        notices: 0,
    }));
    let control = Control::over(guest_end, HostWriter(host.clone()));
    (host, control)
}

/// A new control channel to `host` (a guest that restarts).
pub fn reconnect(host: &Arc<Mutex<Host>>) -> Control {
    let (host_end, guest_end) = UnixStream::pair().unwrap();
    host.lock().unwrap().out = host_end;
    Control::over(guest_end, HostWriter(host.clone()))
}

/// The host takes the `k` lowest valid blocks after a "deadline": their bytes gone, fenced
/// until the guest's next hello, and the guest told.
pub fn force(host: &Arc<Mutex<Host>>, k: u32) {
    let mut h = host.lock().unwrap();
    let took: Vec<u32> = h.valid.iter().copied().take(k as usize).collect();
    for l in &took {
        h.valid.remove(l);
        h.bytes.remove(l);
        h.fenced.insert(*l);
    }
    h.asked = h.asked.saturating_sub(took.len() as u32);
    if !took.is_empty() {
        h.send(&HostLine::Notice(Notice::Released { lbns: took, forced: true }));
    }
}
