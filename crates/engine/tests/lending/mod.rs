//! Lending runs of local-store slots out of the engine in the property tests (a vSSD
//! region sharing the SSD): one definition of the steps the out-of-order and crash
//! models both take — withhold a run, see which runs the engine has emptied, give one
//! back. The models differ only in what they do with a lent slot's bytes.

use cachevisor_engine::Engine;
use std::collections::BTreeMap;

/// Slots in a lent run.
pub const RUN: u32 = 2;

/// Runs withheld (first slot) and whether they are lent out yet.
pub type Lending = BTreeMap<u32, bool>;

/// Withholds the run at `first` (as a job) unless it is withheld already; with `moving`,
/// its clean blocks move to free slots outside it first (`withhold_moving`: a cache
/// shrinking online).
pub fn lend(e: &mut Engine, lending: &mut Lending, first: u32, moving: bool) -> Result<(), String> {
    if lending.contains_key(&first) {
        return Ok(());
    }
    let mut r = Ok(());
    e.submit_job(|e, out| {
        r = if moving { e.withhold_moving(first, RUN, out).map(|_| ()) } else { e.withhold(first, RUN, out) }
    });
    r?;
    lending.insert(first, false);
    Ok(())
}

/// Gives the `pick`-th withheld run (modulo) back; returns the slots the model no longer
/// treats as lent.
pub fn give_back(e: &mut Engine, lending: &mut Lending, pick: usize) -> Vec<u32> {
    let Some(&first) = lending.keys().nth(pick % lending.len().max(1)) else { return Vec::new() };
    lending.remove(&first);
    e.return_slots(first, RUN);
    (first..first + RUN).collect()
}

/// Whether some withheld run is not lent out yet (then the driver runs a `withhold_step`
/// job and pumps before [`newly_lent`]).
pub fn waiting(lending: &Lending) -> bool {
    lending.values().any(|&lent| !lent)
}

/// A model driver that lends runs: its engine and runs, how it runs the engine's ops and
/// events, and what its model does with a lent slot's bytes.
pub trait Lends {
    /// The engine and the runs withheld.
    fn parts(&mut self) -> (&mut Engine, &mut Lending);
    /// Hands the engine's ops and events to the model.
    fn pump_model(&mut self) -> Result<(), String>;
    /// Slot `slot` is lent out: someone else's bytes from now on.
    fn lent(&mut self, slot: u32);

    /// Retries emptying withheld runs; runs the engine says are empty are lent out.
    fn lend_ready(&mut self) -> Result<(), String> {
        let (e, lending) = self.parts();
        if !waiting(lending) {
            return Ok(());
        }
        e.submit_job(|e, out| {
            e.withhold_step(out);
        });
        self.pump_model()?;
        let (e, lending) = self.parts();
        for s in newly_lent(e, lending) {
            self.lent(s);
        }
        Ok(())
    }
}

/// Implements [`Lends`] for a driver with fields `e` (the engine), `lending` (the runs)
/// and `$model`, whose `lend(slot)` takes a lent slot.
macro_rules! impl_lends {
    ($driver:ty, $model:ident) => {
        impl $crate::lending::Lends for $driver {
            fn parts(&mut self) -> (&mut cachevisor_engine::Engine, &mut $crate::lending::Lending) {
                (&mut self.e, &mut self.lending)
            }
            fn pump_model(&mut self) -> Result<(), String> {
                self.pump()
            }
            fn lent(&mut self, slot: u32) {
                self.$model.lend(slot);
            }
        }
    };
}
#[allow(unused_imports)] // used by the models that lend (not every test includes one)
pub(crate) use impl_lends;

/// The slots of the runs the engine now says are empty, marked lent.
pub fn newly_lent(e: &Engine, lending: &mut Lending) -> Vec<u32> {
    let mut slots = Vec::new();
    for (&first, lent) in lending.iter_mut() {
        if !*lent && e.withheld_ready(first, RUN) {
            *lent = true;
            slots.extend(first..first + RUN);
        }
    }
    slots
}
