//! The operator's changes to a running daemon: vDisks added and removed, partition
//! targets, write policies and the allocator switched, dirty blocks destaged. Each runs as
//! engine jobs on the data path (requests go on beside them) and is saved to the metadata
//! directory's overlay, so it survives a restart.

use super::{policy, Daemon, Export, OpError};
use cachevisor_policy::registry;
use cachevisor_store::backing::Backing;
use cachevisor_store::backing_identity::{Identity, Place};
use cachevisor_store::journal::Record;
use cachevisor_trace::units::parse_size;
use cachevisor_trace::VmId;

/// Why adding or removing a vDisk was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// Bad settings.
    #[error("{0}")]
    Invalid(String),
    /// The name is taken, or the change would leave nothing to serve.
    #[error("{0}")]
    Conflict(String),
    /// No such vDisk.
    #[error("{0}")]
    NotFound(String),
    /// A device or metadata failure.
    #[error("{0}")]
    Failed(String),
}

/// Who asked for a change: the API (noted in the overlay, so it survives restarts) or a
/// reloaded configuration file (which says it itself: the overlay forgets the name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Api,
    File,
}

impl Daemon {
    /// Adds vDisk `v` while running: its backing store is opened (created when `size` is
    /// given), the change is saved to the metadata directory's overlay (so it survives a
    /// restart), the vDisk's name and backing are journaled, it joins the engine and the
    /// controller, the allocator re-divides the cache at once, and the export is offered.
    pub fn add_vdisk(&self, v: crate::config::VdiskConfig) -> Result<Export, ChangeError> {
        self.add_vdisk_forced(v, false)
    }

    /// [`Self::add_vdisk`]; on a cluster node, a vDisk the cluster map homes on another
    /// node is refused (`Cluster::may_serve`) unless `force`, and one another node claims
    /// is refused even so (`Cluster::claim`).
    pub fn add_vdisk_forced(&self, v: crate::config::VdiskConfig, force: bool) -> Result<Export, ChangeError> {
        self.add_vdisk_as(v, force, Origin::Api)
    }

    /// [`Self::add_vdisk_forced`], noted as `origin` asks.
    pub(crate) fn add_vdisk_as(
        &self,
        mut v: crate::config::VdiskConfig,
        force: bool,
        origin: Origin,
    ) -> Result<Export, ChangeError> {
        // Held throughout: a detach waits for the change (and the change for it).
        let _swap = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        self.cache_must_be_in("adding a vDisk").map_err(ChangeError::Conflict)?;
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        if self.vdisk(&v.name).is_some() {
            return Err(ChangeError::Conflict(format!("a vDisk named `{}` is already served", v.name)));
        }
        let replay = match self.cluster().filter(|_| !force) {
            Some(c) => c.may_serve(&v.name).map_err(ChangeError::Conflict)?,
            None => None,
        };
        // One node at a time by compare-and-swap: the claim in etcd before anything is
        // served or replayed (`cluster/claims.rs`), force or not.
        let _claim = match self.cluster() {
            Some(c) => Some(c.claim(&v.name, force).map_err(ChangeError::Conflict)?),
            None => None,
        };
        if !cachevisor_store::backing::is_uri(&v.backing) {
            v.backing = std::path::absolute(&v.backing).map_err(|e| ChangeError::Invalid(format!("backing: {e}")))?;
        }
        v.check("vdisk", self.block_size).map_err(ChangeError::Invalid)?;
        self.own.check_backing(&v.backing, "vdisk.backing").map_err(ChangeError::Invalid)?;
        let size = v.size.as_deref().map(parse_size).transpose().map_err(ChangeError::Invalid)?;
        let place =
            Place::of(&v.backing).map_err(|e| ChangeError::Invalid(format!("backing {}: {e}", v.backing.display())))?;
        {
            let identities = self.identities.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(other) = self.exports().iter().find(|e| {
                identities.get(e.id as usize).cloned().flatten().is_some_and(|id| place.same(&Place::Existing(id)))
            }) {
                return Err(ChangeError::Conflict(format!("backing {} is already the backing of vDisk `{}`: two vDisks on one backing store would overwrite each other's data", v.backing.display(), other.name)));
            }
        }
        let b = Backing::open(&v.backing, size, v.grow, "vdisk").map_err(ChangeError::Invalid)?;
        if let (Some(r), Some(c)) = (&replay, self.cluster()) {
            let certs = c.settings().peer_tls_dir.clone().ok_or_else(|| {
                ChangeError::Conflict(
                    "replaying a replica log needs cluster.peer_tls_dir (this node's client certificate)".into(),
                )
            })?;
            crate::cluster::takeover_replay::replay_once(c, r, &v.name, &b, &certs, &self.meta_dir)
                .map_err(|e| ChangeError::Conflict(format!("vDisk `{}`: {e}", crate::log_safe(&v.name))))?;
        }
        let failed = |e: std::io::Error| ChangeError::Invalid(format!("backing {}: {e}", v.backing.display()));
        let size = b.size().map_err(failed)?;
        cachevisor_engine::check_disk_size(size, self.block_size)
            .map_err(|e| ChangeError::Invalid(format!("backing {}: {e}", v.backing.display())))?;
        let identity = match place {
            Place::Uri(uri) => Identity::Nbd { uri, size },
            _ => Identity::of_path(&v.backing)
                .map_err(failed)?
                .ok_or_else(|| ChangeError::Invalid(format!("backing {} vanished", v.backing.display())))?,
        };
        let id = self.dp.next_vm();
        if id > u16::MAX as VmId {
            return Err(ChangeError::Conflict("no VM ids left: restart the daemon to renumber".into()));
        }
        match origin {
            Origin::Api => overlay.change(&self.meta_dir, |o| o.add(v.clone())),
            Origin::File => overlay.change(&self.meta_dir, |o| o.drop_name(&v.name)),
        }
        .map_err(ChangeError::Failed)?;
        {
            let mut off = self.no_replica.lock().unwrap_or_else(|e| e.into_inner());
            if v.replicates() {
                off.remove(&v.name);
            } else {
                off.insert(v.name.clone());
            }
        }
        self.set_replicated(id, &v.name);
        let bs = self.block_size;
        self.dp
            .with_engine_mut(|e| {
                e.set_disk_size(id, size).map_err(|e| e.to_string())?;
                policy::enroll(e, &mut self.policy.lock().unwrap_or_else(|p| p.into_inner()).ctl, id, &v, bs)
            })
            .map_err(ChangeError::Invalid)?;
        let meta = vec![
            Record::Vdisk { vm: id as u16, name: v.name.clone() },
            Record::Binding { vm: id as u16, identity: identity.clone() },
        ];
        let added = self.dp.add_vm(&v.name, std::sync::Arc::new(b), meta);
        self.identities.lock().unwrap_or_else(|e| e.into_inner()).push(Some(identity));
        added.map_err(|f| ChangeError::Failed(format!("journaling the new vDisk failed ({f:?}); see the log")))?;
        self.redivide();
        let vhost_user = crate::vhost_access::of(v.vhost_user.as_deref(), &v.allow, self.tls_required());
        let info = Export { id, name: v.name.clone(), size, allow: v.allow.clone(), vhost_user };
        self.exports.write().unwrap_or_else(|e| e.into_inner()).push(Some(info.clone()));
        tracing::info!(vdisk = %v.name, id, size, backing = %v.backing.display(), "vDisk added");
        Ok(info)
    }

    /// Removes vDisk `vm` while running: it stops being offered (open connections get
    /// ESHUTDOWN at their next request), its dirty blocks are written back and made
    /// durable, its cache is released to the others at once, its backing store is closed,
    /// and the removal is saved to the metadata directory's overlay. The last vDisk cannot
    /// be removed.
    pub fn remove_vdisk(&self, vm: VmId) -> Result<(), ChangeError> {
        self.remove_vdisk_as(vm, Origin::Api)
    }

    /// [`Self::remove_vdisk`], noted as `origin` asks.
    pub(crate) fn remove_vdisk_as(&self, vm: VmId, origin: Origin) -> Result<(), ChangeError> {
        let _swap = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        self.cache_must_be_in("removing a vDisk").map_err(ChangeError::Conflict)?;
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        let info = self.export(vm).ok_or_else(|| ChangeError::NotFound(format!("no vDisk with id {vm}")))?;
        if self.exports().len() == 1 {
            return Err(ChangeError::Conflict(format!(
                "`{}` is the last vDisk: add another before removing it",
                info.name
            )));
        }
        self.exports.write().unwrap_or_else(|e| e.into_inner())[vm as usize] = None;
        if let Err(f) = self.dp.remove_vm(vm) {
            self.exports.write().unwrap_or_else(|p| p.into_inner())[vm as usize] = Some(info.clone());
            return Err(ChangeError::Failed(format!(
                "`{}` is still served: writing its dirty blocks back failed ({f:?}); see the log",
                info.name
            )));
        }
        self.dp.with_engine_mut(|_| self.policy.lock().unwrap_or_else(|p| p.into_inner()).ctl.retire_vm(vm as usize));
        self.identities.lock().unwrap_or_else(|e| e.into_inner())[vm as usize] = None;
        self.redivide();
        match origin {
            Origin::Api => overlay.change(&self.meta_dir, |o| o.remove(&info.name)),
            Origin::File => overlay.change(&self.meta_dir, |o| o.drop_name(&info.name)),
        }
        .map_err(ChangeError::Failed)?;
        if let Some(c) = self.cluster() {
            c.release(&info.name);
        }
        tracing::info!(vdisk = %info.name, id = vm, "vDisk removed");
        Ok(())
    }

    /// The allocator re-divides the cache now (a vDisk joined or left, the cache was
    /// resized).
    pub(crate) fn redivide(&self) {
        self.dp.with_engine_mut(|e| self.policy.lock().unwrap_or_else(|p| p.into_inner()).redivide(e));
    }

    /// Switches the allocation policy online (VM settings are kept).
    ///
    /// Checked as the config is (`config::check_allocator`), then saved, then applied: a
    /// change that cannot be saved is not made.
    pub fn set_allocator(&self, name: &str, params: &cachevisor_policy::params::Params) -> Result<(), ChangeError> {
        self.switch_allocator(name, params, |o| o.set_allocator(name, params))
    }

    /// [`Self::set_allocator`], with `note` the overlay's change.
    pub(crate) fn switch_allocator(
        &self,
        name: &str,
        params: &cachevisor_policy::params::Params,
        note: impl FnOnce(&mut crate::vdisk_overlay::Overlay),
    ) -> Result<(), ChangeError> {
        let (replacement, partition) = self.dp.with_engine(|e| (e.config().replacement, e.config().partition));
        if partition == cachevisor_engine::PartitionMode::Shared {
            return Err(ChangeError::Invalid(
                "allocator: this cache is one shared pool (cache.partition = \"shared\"): no allocator runs".into(),
            ));
        }
        cachevisor_policy::registry::check_cache_policy(name, params, replacement, partition)
            .map_err(|e| ChangeError::Invalid(format!("{e} (a restart)")))?;
        let alloc = registry::build_with(name, params).map_err(ChangeError::Invalid)?;
        self.overlay
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .change(&self.meta_dir, note)
            .map_err(|e| ChangeError::Failed(format!("not switched: saving it for the next start failed: {e}")))?;
        let (bs, vms) = (self.block_size, self.dp.next_vm() as usize);
        self.dp.with_engine_mut(|e| {
            let mut p = self.policy.lock().unwrap_or_else(|p| p.into_inner());
            p.ctl = policy::rebuilt(&mut p.ctl, alloc, e.slot_count(), bs, vms);
            e.set_cleaner(cachevisor_policy::controller::cleaner_watermarks(p.ctl.allocator(), e.slot_count(), true));
            // (static partitions: a shared pool refused the switch above)
        });
        tracing::info!(allocator = name, "allocator switched");
        Ok(())
    }

    /// Applies the partition targets the API set before the last stop (from the overlay).
    pub(crate) fn restore_api_targets(&self) -> Result<(), OpError> {
        let targets = self.overlay.lock().unwrap_or_else(|e| e.into_inner()).target_blocks.clone();
        for (name, blocks) in targets {
            if let Some(vm) = self.vdisk(&name) {
                tracing::info!(vdisk = %name, blocks, "partition target set through the API");
                self.set_target_now(vm, blocks)?;
            }
        }
        Ok(())
    }

    /// Switches export `vm`'s write policy online (leaving write-back writes its dirty
    /// blocks back first, made durable before this returns).
    ///
    /// Saved first: a change that cannot be saved is not made.
    pub fn set_write_policy(&self, vm: VmId, policy: cachevisor_engine::WritePolicy) -> Result<(), OpError> {
        self.cache_must_be_in("changing a write policy").map_err(OpError::Invalid)?;
        self.remember(vm, |o, name| o.set_write_policy(name, policy))?;
        self.set_write_policy_now(vm, policy)
    }

    /// [`Self::set_write_policy`] without noting it in the overlay.
    pub(crate) fn set_write_policy_now(&self, vm: VmId, policy: cachevisor_engine::WritePolicy) -> Result<(), OpError> {
        let _swap = self.carried.lock().unwrap_or_else(|e| e.into_inner());
        self.cache_must_be_in("changing a write policy").map_err(OpError::Invalid)?;
        Ok(self.dp.run_job(|e, out| e.set_write_policy(vm, policy, out)).and_then(|_| self.dp.flush(vm))?)
    }

    /// Sets export `vm`'s partition to `blocks` cache blocks (a shrink evicts its coldest
    /// blocks, writing dirty ones back first).
    ///
    /// A target above the cache is refused; the change is saved first (one that cannot be
    /// saved is not made).
    pub fn resize(&self, vm: VmId, blocks: u64) -> Result<(), OpError> {
        if self.dp.with_engine(|e| e.config().partition) == cachevisor_engine::PartitionMode::Shared {
            return Err(OpError::Invalid(
                "this cache is one shared pool (cache.partition = \"shared\"): vDisks have no targets to set".into(),
            ));
        }
        let slots = self.cache_blocks();
        if blocks > slots {
            return Err(OpError::Invalid(format!(
                "blocks: {blocks} is more than the cache holds ({slots} blocks of {} bytes)",
                self.block_size
            )));
        }
        self.remember(vm, |o, name| o.set_target(name, blocks))?;
        self.set_target_now(vm, blocks)
    }

    /// Sets export `vm`'s weight and/or ratio online (SymFlex's phases: the weighted and
    /// proportional-throughput policies read them at their next decision; an allocator
    /// that does not run every interval re-divides now). Each is checked as the config
    /// checks it (`config::check_share`); saved first (a change that cannot be saved is not made).
    pub fn set_share(&self, vm: VmId, share: crate::vdisk_overlay::Share) -> Result<(), OpError> {
        for (key, v) in [("weight", share.weight), ("ratio", share.ratio)] {
            if let Some(v) = v {
                crate::config::check_share(key, v).map_err(OpError::Invalid)?;
            }
        }
        if share.weight.is_none() && share.ratio.is_none() {
            return Err(OpError::Invalid("give `weight`, `ratio` or both".into()));
        }
        self.remember(vm, |o, name| o.set_share(name, share))?;
        self.set_share_now(vm, share)
    }

    /// [`Self::set_share`] (checked) without noting it in the overlay.
    pub(crate) fn set_share_now(&self, vm: VmId, share: crate::vdisk_overlay::Share) -> Result<(), OpError> {
        let every_interval = {
            let mut p = self.policy.lock().unwrap_or_else(|p| p.into_inner());
            let s = p.ctl.settings_mut(vm as usize);
            s.weight = share.weight.unwrap_or(s.weight);
            s.ratio = share.ratio.unwrap_or(s.ratio);
            p.ctl.allocator().every_interval()
        };
        if !every_interval {
            self.redivide();
        }
        Ok(())
    }

    /// [`Self::resize`] without saving it (a target the overlay already holds).
    fn set_target_now(&self, vm: VmId, blocks: u64) -> Result<(), OpError> {
        self.dp.run_job(|e, out| e.set_target(vm, blocks, out))?;
        // Write-backs of the shrink reach the backing store before the metadata says clean.
        self.dp.flush(vm).map_err(OpError::from)
    }

    /// Saves a change made through the API to the overlay (it survives restarts).
    fn remember(&self, vm: VmId, change: impl FnOnce(&mut crate::vdisk_overlay::Overlay, &str)) -> Result<(), OpError> {
        let Some(info) = self.export(vm) else { return Ok(()) };
        let mut overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        overlay.change(&self.meta_dir, |o| change(o, &info.name)).map_err(OpError::Unsaved)
    }

    /// Writes every dirty block of `vm` (or of every vDisk) back, in jobs with requests
    /// going on beside them, calling `progress(done, done + left)` after each; blocks stay
    /// cached, clean, and the result is durable.
    pub fn destage_all(&self, vm: Option<VmId>, progress: &mut dyn FnMut(u64, u64)) -> Result<u64, OpError> {
        Ok(self.dp.destage(vm, progress)?)
    }

    /// Writes every dirty block of export `vm` back to its backing store (blocks stay
    /// cached, clean) and makes that durable.
    pub fn destage(&self, vm: VmId) -> Result<(), OpError> {
        self.destage_all(Some(vm), &mut |_, _| {}).map(|_| ())
    }

    /// The destage job (progress of the running or last one).
    pub fn destage_job(&self) -> &crate::destage_job::Job {
        &self.job
    }

    /// Starts destaging `vm` (or every vDisk) as the background job; `Err` with the
    /// running job's progress when one is already running.
    pub fn start_destage(
        self: &std::sync::Arc<Self>,
        vm: Option<VmId>,
    ) -> Result<crate::destage_job::Progress, crate::destage_job::Progress> {
        let vdisk = vm.and_then(|v| self.export(v)).map(|e| e.name);
        let d = self.clone();
        self.job.start(
            vdisk,
            self.block_size,
            Box::new(move |progress| d.destage_all(vm, progress).map_err(|e| e.to_string())),
        )
    }

    /// Blocks written back since the start: by the background flusher, evictions and
    /// destage jobs.
    pub fn destaged_blocks(&self) -> u64 {
        self.dp.written_back()
    }
}
