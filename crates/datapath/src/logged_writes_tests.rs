//! Replicated writes held for their log (`logged_writes.rs`) against a model: a scripted
//! log answers each write late and out of order — appended, bypassed (the bytes then
//! belong on the backing store) or failed — while clients write and read their own
//! blocks through a small write-back cache, on the io_uring thread and on device
//! threads. Every write answered `Ok` is in the log or on its backing store at that
//! moment; reads, and the backing store after a destage, see the last acknowledged
//! write or a failed one after it; every write's local part is reported to the log
//! once; nothing stays held.

use super::tests::open_wb;
use super::*;
use crate::injected::{LogOutcomes, LogRecord, Logged, WriteLog};
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;

const BS: u64 = 4096;

/// What the scripted log does with a write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Answer {
    Append,
    Bypass,
    Fail,
}

#[derive(Default)]
struct Script {
    queued: Vec<(u64, Vec<LogRecord>)>,
    /// Data records delivered as appended: (vm, offset) → the bytes, every version.
    appended: HashMap<(VmId, u64), Vec<Vec<u8>>>,
    /// Tickets answered, and those whose local part was reported.
    answered: HashMap<u64, Answer>,
    local_done: HashSet<u64>,
    /// A ticket reported before its local part, or twice: the data path's bug.
    misuse: Vec<String>,
}

/// A log answering from its own thread, in random order, after random delays: a tenth
/// of the writes failed, 15% bypassed, the rest appended.
struct ScriptedLog {
    script: Mutex<Script>,
    sink: std::sync::OnceLock<LogOutcomes>,
    /// Ends [`Self::run`].
    stop: AtomicBool,
}

impl WriteLog for ScriptedLog {
    fn covers(&self, _vm: VmId) -> bool {
        true
    }
    fn attach(&self, outcomes: LogOutcomes) {
        let _ = self.sink.set(outcomes);
    }
    fn submit(&self, ticket: u64, recs: Vec<LogRecord>) {
        self.script().queued.push((ticket, recs));
    }
    fn local_done(&self, ticket: u64) {
        let mut s = self.script();
        if !s.local_done.insert(ticket) {
            s.misuse.push(format!("ticket {ticket}: its local part reported twice"));
        }
    }
}

impl ScriptedLog {
    /// The script (a client's failed assertion poisons nothing: the others go on).
    fn script(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Answers what is queued, a random part of it in random order, until stopped.
    fn run(&self, seed: u64) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        while !self.stop.load(Relaxed) {
            std::thread::sleep(Duration::from_micros(rng.gen_range(0..1500)));
            let mut s = self.script();
            let mut picked = Vec::new();
            let mut i = 0;
            while i < s.queued.len() {
                if rng.gen_bool(0.6) {
                    picked.push(s.queued.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            let mut out = Vec::new();
            for (t, recs) in picked {
                let answer = match rng.gen_range(0..20) {
                    0..=1 => Answer::Fail,
                    2..=4 => Answer::Bypass,
                    _ => Answer::Append,
                };
                if answer == Answer::Append {
                    for r in &recs {
                        if let Some(d) = &r.data {
                            s.appended.entry((r.vm, r.offset)).or_default().push(d.to_vec());
                        }
                    }
                }
                s.answered.insert(t, answer);
                out.push((
                    t,
                    match answer {
                        Answer::Append => Ok(Logged::Appended),
                        Answer::Bypass => Ok(Logged::Bypass),
                        Answer::Fail => Err(std::io::Error::other("the scripted log failed it")),
                    },
                ));
            }
            drop(s);
            if !out.is_empty() {
                (self.sink.get().expect("attached"))(out);
            }
        }
    }
}

/// Versions a block may hold: its last acknowledged write's (0: zeros, never written),
/// and those of the failed writes after it (a failed write leaves either).
type Possible = HashMap<u64, Vec<u64>>;

/// Block `b`'s bytes are one of the versions `possible` allows.
fn allowed(possible: &Possible, vm: u32, b: u64, got: &[u8]) -> bool {
    let zeros = || got.iter().all(|&x| x == 0);
    match possible.get(&b) {
        Some(vs) => vs.iter().any(|&v| if v == 0 { zeros() } else { super::tests::block_at(vm, b, v) == got }),
        None => zeros(),
    }
}

fn replicated_writes_hold_until_logged(io_uring: bool) {
    let dir = tempfile::tempdir().unwrap();
    let dp = Arc::new(open_wb(dir.path(), 48, 2, io_uring));
    let log = Arc::new(ScriptedLog { script: Default::default(), sink: Default::default(), stop: false.into() });
    dp.set_replicator(log.clone());
    let runner = {
        let log = log.clone();
        std::thread::spawn(move || log.run(7))
    };
    let backing = |vm: u32| std::fs::read(dir.path().join(format!("disk{vm}.img"))).unwrap();
    let clients: Vec<_> = (0..4u64)
        .map(|t| {
            let (dp, log) = (dp.clone(), log.clone());
            let disk = dir.path().join(format!("disk{}.img", t % 2));
            std::thread::spawn(move || {
                // Each client owns 16 blocks of one disk.
                let vm = (t % 2) as u32;
                let base = (t / 2) * 16;
                let mut possible = Possible::new();
                let mut failed = 0;
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for i in 0..150u64 {
                    let b = base + rng.gen_range(0..16u64);
                    let n = rng.gen_range(1..=3u64).min(base + 16 - b);
                    if rng.gen_bool(0.6) {
                        let data: Vec<u8> = (0..n).flat_map(|k| super::tests::block_at(vm, b + k, i + 1)).collect();
                        if dp.write(vm, b * BS, &data, false).is_err() {
                            failed += 1;
                            (b..b + n).for_each(|k| possible.entry(k).or_insert_with(|| vec![0]).push(i + 1));
                            continue;
                        }
                        // Acknowledged: every block in the log, or on the backing store.
                        let on_disk = std::fs::read(&disk).unwrap();
                        for k in 0..n {
                            let at = (b + k) * BS;
                            let want = &data[(k * BS) as usize..((k + 1) * BS) as usize];
                            let logged =
                                log.script().appended.get(&(vm, at)).is_some_and(|v| v.iter().any(|d| d == want));
                            let stored = &on_disk[at as usize..(at + BS) as usize] == want;
                            assert!(
                                logged || stored,
                                "client {t} step {i}: block {} acknowledged, in neither place",
                                b + k
                            );
                            possible.insert(b + k, vec![i + 1]);
                        }
                    } else {
                        let mut buf = vec![0u8; (n * BS) as usize];
                        if dp.read(vm, b * BS, &mut buf).is_err() {
                            continue; // a vDisk past its error threshold may fail a read too
                        }
                        for k in 0..n {
                            let got = &buf[(k * BS) as usize..((k + 1) * BS) as usize];
                            assert!(
                                allowed(&possible, vm, b + k, got),
                                "client {t} step {i}: block {} is stale: version {} where {:?} may be",
                                b + k,
                                u64::from_le_bytes(got[..8].try_into().unwrap()) & 0xffff,
                                possible.get(&(b + k))
                            );
                        }
                    }
                }
                (vm, possible, failed)
            })
        })
        .collect();
    let owned: Vec<(u32, Possible, u32)> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    log.stop.store(true, Relaxed);
    runner.join().unwrap();
    let s = log.script();
    assert!(s.misuse.is_empty(), "{:?}", s.misuse);
    assert!(s.queued.is_empty(), "every write answered");
    let answered: HashSet<u64> = s.answered.keys().copied().collect();
    assert_eq!(answered, s.local_done, "every logged write's local part reported to the log, once");
    assert!(s.answered.values().any(|a| *a == Answer::Bypass), "some writes bypassed the log");
    assert!(owned.iter().map(|o| o.2).sum::<u32>() > 0, "some writes failed");
    assert_eq!(dp.shared.holds.len(), 0, "no write left held");
    drop(s);
    dp.with_engine(|e| e.check_invariants()).unwrap();
    // Destaged, the backing stores hold a version each block may hold.
    let _ = dp.destage_pass(&[0, 1]);
    for (vm, possible, _) in &owned {
        let disk = backing(*vm);
        for &b in possible.keys() {
            let at = (b * BS) as usize;
            assert!(allowed(possible, *vm, b, &disk[at..at + BS as usize]), "vm {vm} block {b} after destage");
        }
    }
}

#[test]
fn replicated_writes_are_answered_only_once_logged_or_written_through_on_the_ring() {
    replicated_writes_hold_until_logged(true);
}

#[test]
fn replicated_writes_are_answered_only_once_logged_or_written_through_on_device_threads() {
    replicated_writes_hold_until_logged(false);
}
