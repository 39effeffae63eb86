//! The block manager's durable state (SymFlex §2.2): per physical block its owner and
//! logical block (or free), per vSSD its name, maximum size M, persist flag P, whether its
//! VM is running, its ⟨lbn, pbn⟩ map and the logical blocks swapped out (§2.4.4). It
//! changes only by [`Record`]s, checked one by one, so a journal replays into exactly the
//! state it was written from, and a record that does not fit (a corrupt or foreign
//! journal) is refused with its index and the reason instead of being half applied.

use crate::geometry::{Geometry, Lbn, Pbn};
use crate::record::{Record, VssdId};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One vSSD's durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vssd {
    /// Its id.
    pub id: VssdId,
    /// Its name.
    pub name: String,
    /// M: logical blocks the device has (its size is M × block).
    pub max_blocks: u32,
    /// P: its blocks and their data outlive the VM.
    pub persist: bool,
    /// Whether its VM is registered and running.
    pub active: bool,
    /// Logical → physical blocks it holds on the SSD.
    pub map: BTreeMap<Lbn, Pbn>,
    /// Logical blocks whose data is on secondary storage.
    pub swapped: BTreeSet<Lbn>,
    /// Its removal began (`Record::Removing`): it serves nothing and goes away once it
    /// holds nothing.
    pub removing: bool,
}

/// A record that does not fit the state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{record:?}: {reason}")]
pub struct Misfit {
    /// The record.
    pub record: Record,
    /// Why it does not fit.
    pub reason: String,
}

/// The durable state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    geometry: Geometry,
    owners: Vec<Option<(VssdId, Lbn)>>,
    /// Per block, whether it is in the region (else the cache engine's: one SSD budget).
    inside: Vec<bool>,
    /// Whether the region starts with no block (it shares its SSD with the cache engine
    /// and holds what `Grant`s gave it) or with all of them (a region of its own).
    shared: bool,
    vssds: BTreeMap<VssdId, Vssd>,
    names: HashMap<String, VssdId>,
}

impl State {
    /// An empty region of its own: every block in it, free.
    pub fn new(geometry: Geometry) -> State {
        State::start(geometry, false)
    }

    /// An empty region sharing its SSD with the cache engine: no block in it until the
    /// engine grants some (`Record::Grant`).
    pub fn shared(geometry: Geometry) -> State {
        State::start(geometry, true)
    }

    fn start(geometry: Geometry, shared: bool) -> State {
        let n = geometry.blocks as usize;
        State {
            geometry,
            owners: vec![None; n],
            inside: vec![!shared; n],
            shared,
            vssds: BTreeMap::new(),
            names: HashMap::new(),
        }
    }

    /// Whether the region shares its SSD with the cache engine ([`State::shared`]).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Whether block `pbn` is in the region.
    pub fn inside(&self, pbn: Pbn) -> bool {
        self.inside.get(pbn as usize).copied().unwrap_or(false)
    }

    /// Blocks in the region.
    pub fn inside_blocks(&self) -> u32 {
        self.inside.iter().filter(|&&i| i).count() as u32
    }

    /// The state `records` leave, from an empty region of its own; the first that does
    /// not fit stops it (its index and why).
    pub fn replay<'a>(
        geometry: Geometry,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Result<State, (usize, Misfit)> {
        State::replay_onto(State::new(geometry), records)
    }

    /// The state `records` leave from `s`.
    pub fn replay_onto<'a>(
        mut s: State,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Result<State, (usize, Misfit)> {
        for (i, r) in records.into_iter().enumerate() {
            s.apply(r).map_err(|e| (i, e))?;
        }
        Ok(s)
    }

    /// The region's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Physical block `pbn`'s owner and logical block.
    pub fn owner(&self, pbn: Pbn) -> Option<(VssdId, Lbn)> {
        self.owners.get(pbn as usize).copied().flatten()
    }

    /// The vSSDs by id.
    pub fn vssds(&self) -> &BTreeMap<VssdId, Vssd> {
        &self.vssds
    }

    /// A vSSD.
    pub fn vssd(&self, id: VssdId) -> Option<&Vssd> {
        self.vssds.get(&id)
    }

    /// A vSSD's id by name.
    pub fn id_of(&self, name: &str) -> Option<VssdId> {
        self.names.get(name).copied()
    }

    /// The id the next registration gets.
    pub fn next_id(&self) -> VssdId {
        self.vssds.keys().next_back().map_or(0, |&i| i + 1)
    }

    /// Physical blocks of the region no vSSD holds, in ascending order.
    pub fn free_blocks(&self) -> impl Iterator<Item = Pbn> + '_ {
        self.owners.iter().zip(&self.inside).enumerate().filter(|(_, (o, &i))| i && o.is_none()).map(|(p, _)| p as Pbn)
    }

    /// Applies one record, or refuses it and changes nothing.
    pub fn apply(&mut self, r: &Record) -> Result<(), Misfit> {
        let misfit = |reason: String| Misfit { record: r.clone(), reason };
        let blocks = self.geometry.blocks;
        match r {
            Record::Register { id, name, max_blocks, persist } => {
                if self.vssds.contains_key(id) {
                    return Err(misfit(format!("vSSD {id} exists")));
                }
                if self.names.contains_key(name) {
                    return Err(misfit(format!("the name `{name}` is taken")));
                }
                if *max_blocks == 0 {
                    return Err(misfit("a vSSD of 0 blocks".into()));
                }
                self.names.insert(name.clone(), *id);
                let v = Vssd {
                    id: *id,
                    name: name.clone(),
                    max_blocks: *max_blocks,
                    persist: *persist,
                    active: true,
                    map: BTreeMap::new(),
                    swapped: BTreeSet::new(),
                    removing: false,
                };
                self.vssds.insert(*id, v);
            }
            Record::Assign { pbn, id, lbn } => {
                if *pbn >= blocks {
                    return Err(misfit(format!("block {pbn} is past the region's {blocks}")));
                }
                if let Some((o, l)) = self.owners[*pbn as usize] {
                    return Err(misfit(format!("block {pbn} is held by vSSD {o} (logical {l})")));
                }
                if !self.inside[*pbn as usize] {
                    return Err(misfit(format!("block {pbn} is not in the region (the cache's)")));
                }
                let v = self.vssds.get_mut(id).ok_or_else(|| misfit(format!("no vSSD {id}")))?;
                if *lbn >= v.max_blocks {
                    return Err(misfit(format!("logical block {lbn} is past vSSD {id}'s {}", v.max_blocks)));
                }
                if let Some(p) = v.map.get(lbn) {
                    return Err(misfit(format!("logical block {lbn} is at block {p} already")));
                }
                v.swapped.remove(lbn);
                v.map.insert(*lbn, *pbn);
                self.owners[*pbn as usize] = Some((*id, *lbn));
            }
            Record::Free { pbn } => {
                let (id, lbn) = self.owner(*pbn).ok_or_else(|| misfit(format!("block {pbn} is free")))?;
                self.vssds.get_mut(&id).expect("owners name vSSDs").map.remove(&lbn);
                self.owners[*pbn as usize] = None;
            }
            Record::SwappedOut { id, lbn, pbn } => {
                let v = self.vssds.get(id).ok_or_else(|| misfit(format!("no vSSD {id}")))?;
                if *lbn >= v.max_blocks || v.swapped.contains(lbn) {
                    return Err(misfit(format!("logical block {lbn} cannot be swapped out")));
                }
                if v.map.get(lbn) != pbn.as_ref() {
                    return Err(misfit(format!("logical block {lbn} is at {:?}", v.map.get(lbn))));
                }
                if let Some(p) = pbn {
                    self.owners[*p as usize] = None;
                }
                let v = self.vssds.get_mut(id).expect("checked");
                v.map.remove(lbn);
                v.swapped.insert(*lbn);
            }
            Record::SwapDropped { id, lbn } => {
                let v = self.vssds.get_mut(id).ok_or_else(|| misfit(format!("no vSSD {id}")))?;
                if !v.swapped.remove(lbn) {
                    return Err(misfit(format!("logical block {lbn} is not swapped out")));
                }
            }
            Record::Deactivate { id } | Record::Activate { id } => {
                let on = matches!(r, Record::Activate { .. });
                let v = self.vssds.get_mut(id).ok_or_else(|| misfit(format!("no vSSD {id}")))?;
                if v.active == on {
                    return Err(misfit(format!("vSSD {id} is {} already", if on { "active" } else { "inactive" })));
                }
                v.active = on;
            }
            Record::Grant { pbn } | Record::Yield { pbn } => {
                let grant = matches!(r, Record::Grant { .. });
                if *pbn >= blocks {
                    return Err(misfit(format!("block {pbn} is past the region's {blocks}")));
                }
                if self.inside[*pbn as usize] == grant {
                    let where_ = if grant { "in the region" } else { "the cache's" };
                    return Err(misfit(format!("block {pbn} is {where_} already")));
                }
                if let Some((o, l)) = self.owners[*pbn as usize] {
                    return Err(misfit(format!("block {pbn} is held by vSSD {o} (logical {l})")));
                }
                self.inside[*pbn as usize] = grant;
            }
            Record::Removing { id } => {
                let v = self.vssds.get_mut(id).ok_or_else(|| misfit(format!("no vSSD {id}")))?;
                if v.removing {
                    return Err(misfit(format!("vSSD {id} is being removed already")));
                }
                v.removing = true;
            }
            Record::Remove { id } => {
                let v = self.vssds.get(id).ok_or_else(|| misfit(format!("no vSSD {id}")))?;
                if !v.map.is_empty() || !v.swapped.is_empty() {
                    return Err(misfit(format!("vSSD {id} still holds data")));
                }
                self.names.remove(&v.name);
                self.vssds.remove(id);
            }
        }
        Ok(())
    }

    /// Records that rebuild this state from empty (a checkpoint), in an order
    /// [`State::replay`] accepts.
    pub fn checkpoint(&self) -> Vec<Record> {
        let mut out = Vec::new();
        // Which blocks the region has, from where it started ([`State::replay_onto`] a
        // state started the same way).
        for (pbn, &inside) in self.inside.iter().enumerate() {
            if inside == self.shared {
                let pbn = pbn as Pbn;
                out.push(if self.shared { Record::Grant { pbn } } else { Record::Yield { pbn } });
            }
        }
        for v in self.vssds.values() {
            out.push(Record::Register { id: v.id, name: v.name.clone(), max_blocks: v.max_blocks, persist: v.persist });
            if !v.active {
                out.push(Record::Deactivate { id: v.id });
            }
            out.extend(v.map.iter().map(|(&lbn, &pbn)| Record::Assign { pbn, id: v.id, lbn }));
            out.extend(v.swapped.iter().map(|&lbn| Record::SwappedOut { id: v.id, lbn, pbn: None }));
            if v.removing {
                out.push(Record::Removing { id: v.id });
            }
        }
        out
    }

    /// Panics unless owners and maps agree (tests).
    pub fn check(&self) {
        let mut n = 0;
        for v in self.vssds.values() {
            for (&lbn, &pbn) in &v.map {
                assert_eq!(self.owners[pbn as usize], Some((v.id, lbn)), "block {pbn}");
                assert!(self.inside[pbn as usize], "block {pbn} is held outside the region");
                assert!(lbn < v.max_blocks && !v.swapped.contains(&lbn));
                n += 1;
            }
            assert_eq!(self.names.get(&v.name), Some(&v.id));
        }
        assert_eq!(self.owners.iter().flatten().count(), n);
        assert_eq!(self.names.len(), self.vssds.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g() -> Geometry {
        Geometry::new(1 << 20, 4).unwrap()
    }

    #[test]
    fn misfits_change_nothing_and_say_why() {
        let mut s = State::new(g());
        let reg = Record::Register { id: 0, name: "a".into(), max_blocks: 2, persist: true };
        s.apply(&reg).unwrap();
        s.apply(&Record::Assign { pbn: 3, id: 0, lbn: 1 }).unwrap();
        let before = s.clone();
        for (r, why) in [
            (Record::Assign { pbn: 3, id: 0, lbn: 0 }, "held by vSSD 0"),
            (Record::Assign { pbn: 4, id: 0, lbn: 0 }, "past the region"),
            (Record::Assign { pbn: 0, id: 0, lbn: 2 }, "past vSSD 0's 2"),
            (Record::Assign { pbn: 0, id: 0, lbn: 1 }, "at block 3 already"),
            (Record::Assign { pbn: 0, id: 9, lbn: 0 }, "no vSSD 9"),
            (Record::Free { pbn: 0 }, "is free"),
            (Record::Remove { id: 0 }, "still holds data"),
            (Record::Activate { id: 0 }, "active already"),
            (reg.clone(), "exists"),
            (Record::Register { id: 1, name: "a".into(), max_blocks: 1, persist: false }, "taken"),
            (Record::SwappedOut { id: 0, lbn: 1, pbn: Some(2) }, "is at Some(3)"),
            (Record::SwapDropped { id: 0, lbn: 0 }, "not swapped out"),
            (Record::Removing { id: 7 }, "no vSSD 7"),
        ] {
            let e = s.apply(&r).unwrap_err();
            assert!(e.reason.contains(why), "{e}");
            assert_eq!(s, before);
        }
    }

    #[test]
    fn a_shared_region_holds_only_what_it_was_granted() {
        let mut s = State::shared(g());
        assert_eq!((s.inside_blocks(), s.free_blocks().count()), (0, 0));
        s.apply(&Record::Register { id: 0, name: "a".into(), max_blocks: 2, persist: true }).unwrap();
        let before = s.clone();
        for (r, why) in [
            (Record::Assign { pbn: 1, id: 0, lbn: 0 }, "not in the region"),
            (Record::Yield { pbn: 1 }, "the cache's already"),
            (Record::Grant { pbn: 4 }, "past the region"),
        ] {
            let e = s.apply(&r).unwrap_err();
            assert!(e.reason.contains(why), "{e}");
            assert_eq!(s, before);
        }
        s.apply(&Record::Grant { pbn: 1 }).unwrap();
        s.apply(&Record::Grant { pbn: 3 }).unwrap();
        assert!(s.apply(&Record::Grant { pbn: 1 }).unwrap_err().reason.contains("in the region already"));
        s.apply(&Record::Assign { pbn: 1, id: 0, lbn: 0 }).unwrap();
        assert!(s.apply(&Record::Yield { pbn: 1 }).unwrap_err().reason.contains("held by vSSD 0"));
        s.apply(&Record::Yield { pbn: 3 }).unwrap();
        assert_eq!((s.inside_blocks(), s.free_blocks().count()), (1, 0));
        s.check();
        assert_eq!(State::replay_onto(State::shared(g()), &s.checkpoint()).unwrap(), s);
        // A region of its own that gave a block to the cache checkpoints that too.
        let mut own = State::new(g());
        own.apply(&Record::Yield { pbn: 2 }).unwrap();
        assert_eq!(own.free_blocks().collect::<Vec<_>>(), [0, 1, 3]);
        assert_eq!(State::replay(g(), &own.checkpoint()).unwrap(), own);
    }

    #[test]
    fn a_removal_begins_once() {
        let mut s = State::new(g());
        s.apply(&Record::Register { id: 0, name: "a".into(), max_blocks: 2, persist: false }).unwrap();
        s.apply(&Record::Removing { id: 0 }).unwrap();
        assert!(s.vssd(0).unwrap().removing);
        let e = s.apply(&Record::Removing { id: 0 }).unwrap_err();
        assert!(e.reason.contains("being removed already"), "{e}");
        s.apply(&Record::Remove { id: 0 }).unwrap();
        assert!(s.vssd(0).is_none() && s.id_of("a").is_none());
    }

    #[test]
    fn a_checkpoint_replays_into_the_same_state() {
        let mut s = State::new(g());
        let rs = [
            Record::Register { id: 0, name: "a".into(), max_blocks: 8, persist: true },
            Record::Register { id: 1, name: "b".into(), max_blocks: 8, persist: false },
            Record::Assign { pbn: 0, id: 0, lbn: 5 },
            Record::Assign { pbn: 1, id: 0, lbn: 6 },
            Record::Assign { pbn: 2, id: 1, lbn: 0 },
            Record::Deactivate { id: 0 },
            Record::SwappedOut { id: 0, lbn: 6, pbn: Some(1) },
            Record::Free { pbn: 2 },
            Record::Removing { id: 1 },
        ];
        for r in &rs {
            s.apply(r).unwrap();
        }
        s.check();
        assert_eq!(s.free_blocks().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(State::replay(g(), &s.checkpoint()).unwrap(), s);
        let (i, e) = State::replay(g(), &[rs[2].clone()]).unwrap_err();
        assert_eq!(i, 0);
        assert!(e.reason.contains("no vSSD 0"));
    }
}
