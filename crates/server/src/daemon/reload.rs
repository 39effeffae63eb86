//! Reloading the configuration file while the daemon runs (SIGHUP, `POST /reload`,
//! `cachevisor reload`). The file is read the way the start read it
//! ([`ConfigSource`]) and checked whole; then it is compared, key by key, with the file as
//! last read, and only what the file changed is applied:
//! - live: a `[[cache.device]]` added to the list or taken out of it (added or removed
//!   online: `device_add.rs`, `device_remove.rs`; one resized waits for a restart),
//!   `cache.size` within `cache.max_size` (the cache resized first:
//!   `cache_resize.rs`), vDisks added and removed, a vDisk's `write_policy`, `weight`, `ratio`, `admission`, `write_admission`, `prefetch` and `class`,
//!   `cache.write_policy` (the vDisks without their own), `cache.allocator`, `cache.params`,
//!   `cache.interval`, the flusher (`cache.flush_rate`, `cache.writeback_percent`,
//!   `cache.writeback_ahead`), `cache.error_threshold`, every `[prewarm]` key but
//!   `snapshot_dir` (the schedule at once, the rest for the next prewarm; `prewarm.from` is
//!   read at start only), `log.level`, and the TLS
//!   certificates' contents (re-read on every reload);
//! - fixed (the cache's layout — path, `max_size`, block size, replacement —, listeners, the API, vSSDs, the cluster, a vDisk's backing):
//!   a change is refused naming each key, before anything changes, and the daemon keeps
//!   running as it was.
//!
//! A setting the file changed wins over what the API set for it before: that API note
//! leaves the overlay (`vdisk_overlay.rs`), so a restart agrees with the file. Settings
//! the file did not change keep what the API set. Adds run first (a missing backing file
//! is the likeliest failure), then settings, then removals; a failing step stops the
//! reload and says what was applied before it; running it again after the fix applies
//! the rest (every step is idempotent against what runs).

use super::vdisks::ChangeError;
use super::Daemon;
use crate::config::{Config, VdiskConfig, DEFAULT};
use cachevisor_engine::{AdmissionPolicy, WritePolicy};
use std::path::PathBuf;

/// Where the daemon's configuration comes from, so that a reload reads it as the start did.
#[derive(Debug, Clone, Default)]
pub struct ConfigSource {
    /// The file; `None`: the embedded demo configuration (paths under ./var).
    pub path: Option<PathBuf>,
    /// `serve --tcp` over the file's `listen.tcp` (with `unix`, both replace the file's).
    pub tcp: Option<String>,
    /// `serve --unix` over the file's `listen.unix`.
    pub unix: Option<PathBuf>,
}

impl ConfigSource {
    /// Reads and parses the configuration (its values are checked by `Config::resolve`).
    pub fn load(&self) -> Result<Config, String> {
        let mut cfg = match &self.path {
            Some(p) => Config::load(p)?,
            None => Config::parse(DEFAULT, "embedded default config", std::path::Path::new("."))?,
        };
        if self.tcp.is_some() || self.unix.is_some() {
            cfg.listen.tcp = self.tcp.clone();
            cfg.listen.unix = self.unix.clone();
        }
        Ok(cfg)
    }

    /// The file's name for messages.
    pub fn name(&self) -> String {
        self.path.as_ref().map_or("the embedded default config".into(), |p| p.display().to_string())
    }
}

/// What a reload applied, one line per change.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReloadReport {
    /// The file read.
    pub file: String,
    /// Each change made, in order (empty: the file changed nothing).
    pub applied: Vec<String>,
}

/// Why a reload did not apply the whole file.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// Nothing was changed (the file cannot be read, a value is bad, or a key that cannot
    /// change while running changed).
    #[error("{0}")]
    Refused(String),
    /// A change failed after others were applied.
    #[error("{failed}; applied before it: {}", if applied.is_empty() { "nothing".to_string() } else { applied.join("; ") })]
    Partial {
        /// The changes made before it.
        applied: Vec<String>,
        /// The change that failed and why.
        failed: String,
    },
}

/// Keys a reload applies (a key equal to one, or under it).
const LIVE: [&str; 23] = [
    "log.level",
    "cache.size",
    "cache.write_policy",
    "cache.allocator",
    "cache.params",
    "cache.interval",
    "cache.flush_rate",
    "cache.writeback_percent",
    "cache.writeback_ahead",
    "cache.error_threshold",
    "cache.congested_read_threshold",
    "cache.congested_write_threshold",
    "cache.write_budget",
    "prewarm.snapshot_every",
    "prewarm.snapshots_kept",
    "prewarm.heuristic",
    "prewarm.limit",
    "prewarm.rate",
    "prewarm.busy_rate",
    "prewarm.max_read",
    "prewarm.online",
    "prewarm.protect",
    "prewarm.minute",
];

/// Keys a reload takes without acting on them now.
const AT_START: [&str; 1] = ["prewarm.from"];

/// A vDisk's keys a reload applies.
const LIVE_VDISK: [&str; 7] = ["write_policy", "weight", "ratio", "admission", "write_admission", "prefetch", "class"];

fn under(key: &str, list: &[&str]) -> bool {
    list.iter().any(|k| key == *k || key.strip_prefix(k).is_some_and(|rest| rest.starts_with('.')))
}

/// Every dotted key whose value differs between `old` and `new` (a table's keys one by
/// one; anything else, arrays included, as one value).
fn changed_keys(old: Option<&toml::Value>, new: Option<&toml::Value>, at: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let sub = if at.is_empty() { k.clone() } else { format!("{at}.{k}") };
                changed_keys(a.get(k), b.get(k), &sub, out);
            }
        }
        (a, b) if a != b => out.push(at.to_string()),
        _ => {}
    }
}

fn value(v: &impl serde::Serialize) -> toml::Value {
    toml::Value::try_from(v).expect("a configuration serializes")
}

fn show(v: Option<&toml::Value>) -> String {
    v.map_or("(unset)".into(), |v| v.to_string())
}

fn lookup<'a>(v: &'a toml::Value, key: &str) -> Option<&'a toml::Value> {
    key.split('.').try_fold(v, |v, k| v.get(k))
}

/// A vDisk's write policy in force under `cfg`.
fn policy_of(v: &VdiskConfig, cfg: &Config) -> WritePolicy {
    v.write_policy.unwrap_or(cfg.cache.write_policy)
}

/// What the file changed, sorted into what a reload does.
#[derive(Debug, Default)]
struct Plan {
    added: Vec<VdiskConfig>,
    removed: Vec<String>,
    write_policy: Vec<(String, WritePolicy, WritePolicy)>,
    share: Vec<(String, f64, f64)>,
    /// vDisks whose admission changed, with the new read and write policies.
    admission: Vec<(String, AdmissionPolicy, AdmissionPolicy)>,
    /// vDisks whose prefetch changed, with the new policy.
    prefetch: Vec<(String, cachevisor_engine::PrefetchPolicy)>,
    /// vDisks whose I/O classes changed, with the new ones.
    classes: Vec<(String, Vec<cachevisor_engine::IoClassSection>)>,
    /// Settings keys (cache and prewarm) with their old and new values.
    settings: Vec<(String, String, String)>,
    /// Cache devices the file no longer lists.
    removed_devices: Vec<PathBuf>,
    /// Cache devices the file lists anew.
    added_devices: Vec<crate::config::CacheDevice>,
}

impl Plan {
    /// The plan from `old` to `new`, or the refusal naming every fixed key that changed.
    fn of(old: &Config, new: &Config) -> Result<Plan, String> {
        let (mut a, mut b) = (value(old), value(new));
        for t in [&mut a, &mut b] {
            if let Some(t) = t.as_table_mut() {
                t.remove("vdisk");
                // The cache's devices: compared by path below.
                if let Some(c) = t.get_mut("cache").and_then(|c| c.as_table_mut()) {
                    c.remove("device");
                }
            }
        }
        let mut keys = Vec::new();
        changed_keys(Some(&a), Some(&b), "", &mut keys);
        let mut fixed = Vec::new();
        let mut plan = Plan::default();
        for k in keys {
            let (was, now) = (show(lookup(&a, &k)), show(lookup(&b, &k)));
            if under(&k, &LIVE) || under(&k, &AT_START) {
                plan.settings.push((k, was, now));
            } else {
                fixed.push(format!("{k} ({was} → {now})"));
            }
        }
        for v in &new.vdisk {
            match old.vdisk.iter().find(|o| o.name == v.name) {
                None => plan.added.push(v.clone()),
                Some(o) => {
                    let mut keys = Vec::new();
                    changed_keys(Some(&value(o)), Some(&value(v)), "", &mut keys);
                    for k in keys.iter().filter(|k| !under(k, &LIVE_VDISK)) {
                        let (was, now) = (show(lookup(&value(o), k)), show(lookup(&value(v), k)));
                        fixed.push(format!("vdisk ({}).{k} ({was} → {now})", v.name));
                    }
                    let (p, q) = (policy_of(o, old), policy_of(v, new));
                    if p != q {
                        plan.write_policy.push((v.name.clone(), p, q));
                    }
                    if o.weight != v.weight || o.ratio != v.ratio {
                        plan.share.push((v.name.clone(), v.weight, v.ratio));
                    }
                    if o.admissions() != v.admissions() {
                        let (r, w) = v.admissions();
                        plan.admission.push((v.name.clone(), r, w));
                    }
                    if o.prefetch != v.prefetch {
                        plan.prefetch.push((v.name.clone(), v.prefetch.unwrap_or_default()));
                    }
                    if o.class != v.class {
                        plan.classes.push((v.name.clone(), v.class.clone()));
                    }
                }
            }
        }
        // Unset, the replacement policy is the allocator's own: a new allocator must not
        // bring another one in (the slots' order is laid out at start).
        let (was, now) = (old.cache.replacement(), new.cache.replacement());
        if was != now && !fixed.iter().any(|k| k.starts_with("cache.replacement ")) {
            fixed.push(format!(
                "cache.replacement ({was:?} → {now:?}, the replacement of cache.allocator = \"{}\"; set cache.replacement to keep {was:?})",
                new.cache.allocator
            ));
        }
        plan.removed =
            old.vdisk.iter().filter(|o| !new.vdisk.iter().any(|v| v.name == o.name)).map(|o| o.name.clone()).collect();
        // A device the file no longer lists is removed online (`device_remove.rs`), one it
        // adds is added (`device_add.rs`); one it resizes waits for a restart (which keeps
        // the cache warm: each device is found by its label); a new order changes nothing
        // now.
        for d in &new.cache.device {
            match old.cache.device.iter().find(|o| o.path == d.path) {
                None => plan.added_devices.push(d.clone()),
                Some(o) if o.size != d.size => {
                    fixed.push(format!("cache.device {} size ({} → {})", d.path.display(), o.size, d.size))
                }
                Some(_) => {}
            }
        }
        plan.removed_devices = old
            .cache
            .device
            .iter()
            .filter(|o| !new.cache.device.iter().any(|d| d.path == o.path))
            .map(|o| o.path.clone())
            .collect();
        if !fixed.is_empty() {
            return Err(format!(
                "{} cannot change while the daemon runs: {}. Nothing was changed; restart the daemon to use {}",
                if fixed.len() == 1 { "this setting" } else { "these settings" },
                fixed.join(", "),
                if fixed.len() == 1 { "it" } else { "them" }
            ));
        }
        Ok(plan)
    }

    fn has(&self, key: &str) -> bool {
        self.settings.iter().any(|(k, ..)| under(k, &[key]))
    }
}

impl Daemon {
    /// Re-reads the configuration from where the start read it and applies what changed
    /// (see the top comment).
    pub fn reload(&self) -> Result<ReloadReport, ReloadError> {
        let source = self.source.clone().ok_or_else(|| {
            ReloadError::Refused("this daemon was not started from a configuration source: nothing to re-read".into())
        })?;
        let new = source.load().map_err(ReloadError::Refused)?;
        self.reload_with(&source.name(), new)
    }

    /// Applies configuration `new` (read from `file`) over the one the daemon runs.
    pub fn reload_with(&self, file: &str, new: Config) -> Result<ReloadReport, ReloadError> {
        let refused = |e: String| ReloadError::Refused(format!("{file}: {e}"));
        let mut last = self.file_config.lock().unwrap_or_else(|e| e.into_inner());
        let r = new.resolve().map_err(refused)?;
        let plan = Plan::of(&last, &new).map_err(refused)?;
        for v in &plan.added {
            self.check_file_add(v).map_err(refused)?;
        }
        if plan.has("cache.size") {
            self.check_cache_resize(r.cache.cache_bytes).map_err(refused)?;
        }
        let mut applied = Vec::new();
        let mut step = |what: String, r: Result<(), String>| match r {
            Ok(()) => {
                tracing::info!("reload: {what}");
                applied.push(what);
                Ok(())
            }
            Err(e) => Err(format!("{what}: {e}")),
        };
        let result = (|| -> Result<(), String> {
            if plan.has("cache.size") {
                match self.resize_cache(r.cache.cache_bytes) {
                    Ok(done) => step(done, Ok(()))?,
                    Err(e) => step("cache.size".into(), Err(e))?,
                }
            }
            for d in &plan.added_devices {
                if let Some(what) = self.add_file_device(d, &new.cache)? {
                    step(what, Ok(()))?;
                }
            }
            for v in &plan.added {
                let what = format!("vDisk `{}` added (backing {})", v.name, v.backing.display());
                // Its write policy as the new file says (its own, or the new default).
                let v = VdiskConfig { write_policy: Some(policy_of(v, &new)), ..v.clone() };
                step(what, self.add_file_vdisk(v))?;
            }
            for (name, was, now) in &plan.write_policy {
                let what = format!("vdisk ({name}).write_policy: {was:?} → {now:?}");
                step(what, self.file_write_policy(name, *now))?;
            }
            for (name, read, write) in &plan.admission {
                let what = format!("vdisk ({name}): admission {read}, write_admission {write}");
                step(what, self.file_admission(name, *read, *write))?;
            }
            for (name, p) in &plan.prefetch {
                let what = format!("vdisk ({name}): prefetch {p}");
                step(what, self.file_prefetch(name, *p))?;
            }
            for (name, classes) in &plan.classes {
                let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
                let what = format!("vdisk ({name}): I/O classes [{}]", names.join(", "));
                step(what, self.file_classes(name, classes))?;
            }
            for (name, weight, ratio) in &plan.share {
                let what = format!("vdisk ({name}): weight {weight}, ratio {ratio}");
                step(what, self.file_share(name, *weight, *ratio))?;
            }
            if plan.has("cache.allocator") || plan.has("cache.params") {
                let what = format!("cache.allocator: {} {:?}", new.cache.allocator, new.cache.params);
                let params = new.cache.params.clone().into_iter().collect();
                step(what, self.file_allocator(&new.cache.allocator, &params))?;
            }
            if ["cache.interval", "cache.flush_rate", "cache.writeback_percent"].iter().any(|k| plan.has(k)) {
                let what = format!(
                    "allocation interval {}, flusher: flush_rate {}, writeback_percent {}",
                    new.cache.interval, new.cache.flush_rate, new.cache.writeback_percent
                );
                step(what, self.set_schedule(&r))?;
            }
            if plan.has("cache.writeback_ahead") {
                let n = new.cache.writeback_ahead;
                self.dp.with_engine_mut(|e| e.set_writeback_ahead(n));
                step(format!("cache.writeback_ahead: {n}"), Ok(()))?;
            }
            if plan.has("cache.congested_read_threshold") || plan.has("cache.congested_write_threshold") {
                let (read, write) = new.cache.congestion_thresholds()?;
                self.dp.with_engine_mut(|e| e.set_congestion(read, write));
                let show = |t: &Option<String>| t.clone().unwrap_or_else(|| "off".into());
                let what = format!(
                    "cache.congested_read_threshold {}, congested_write_threshold {}",
                    show(&new.cache.congested_read_threshold),
                    show(&new.cache.congested_write_threshold)
                );
                step(what, Ok(()))?;
            }
            // A rate in drive writes per day is of the cache's size: set again when it changes.
            let dwpd = matches!(new.cache.write_budget()?, Some(cachevisor_engine::BudgetRate::Dwpd(_)));
            if plan.has("cache.write_budget") || (dwpd && plan.has("cache.size")) {
                let rate = new.cache.write_budget()?;
                self.dp.with_engine_mut(|e| e.set_write_budget(rate));
                let shown = new.cache.write_budget.clone().unwrap_or_else(|| "off".into());
                step(format!("cache.write_budget {shown}"), Ok(()))?;
            }
            if plan.has("cache.error_threshold") {
                let n = new.cache.error_threshold;
                self.dp.with_engine_mut(|e| e.set_error_threshold(n));
                step(format!("cache.error_threshold: {n}"), Ok(()))?;
            }
            for (k, was, now) in plan.settings.iter().filter(|(k, ..)| under(k, &["prewarm"])) {
                let note = if under(k, &AT_START) { " (read at the next start)" } else { "" };
                step(format!("{k}: {was} → {now}{note}"), Ok(()))?;
            }
            if plan.has("prewarm") {
                self.set_prewarm_config(&new.prewarm);
            }
            if plan.has("log.level") {
                let what = match crate::log_filter::set(&new.log.level) {
                    Ok(Some(now)) => Ok(format!("log.level: {now}")),
                    Ok(None) if std::env::var_os("RUST_LOG").is_some() => {
                        Ok(format!("log.level: {} (RUST_LOG is set and wins)", new.log.level))
                    }
                    Ok(None) => Ok(format!("log.level: {}", new.log.level)),
                    Err(e) => Err(format!("log.level: {e}")),
                }?;
                step(what, Ok(()))?;
            }
            for name in &plan.removed {
                step(format!("vDisk `{name}` removed"), self.remove_file_vdisk(name))?;
            }
            for path in &plan.removed_devices {
                if let Some(what) = self.remove_file_device(path)? {
                    step(what, Ok(()))?;
                }
            }
            if self.tls.is_some() {
                step("TLS certificates re-read".into(), self.reload_tls())?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                *last = new;
                Ok(ReloadReport { file: file.to_string(), applied })
            }
            Err(failed) => {
                tracing::error!("reload stopped: {failed}");
                Err(ReloadError::Partial { applied, failed })
            }
        }
    }

    /// A vDisk the file adds may already be served only as one the API added on the same
    /// backing (the file now lists it).
    fn check_file_add(&self, v: &VdiskConfig) -> Result<(), String> {
        if self.vdisk(&v.name).is_none() {
            return Ok(());
        }
        let overlay = self.overlay.lock().unwrap_or_else(|e| e.into_inner());
        match overlay.vdisk.iter().find(|a| a.name == v.name) {
            Some(a) if same_backing(&a.backing, &v.backing) => Ok(()),
            Some(a) => Err(format!(
                "vdisk ({}): already served on backing {} (added through the API), the file says {}; remove it through the API first. Nothing was changed",
                v.name,
                a.backing.display(),
                v.backing.display()
            )),
            None => Err(format!("vdisk ({}): a vDisk of that name is already served. Nothing was changed", v.name)),
        }
    }

    fn add_file_vdisk(&self, v: VdiskConfig) -> Result<(), String> {
        if self.vdisk(&v.name).is_some() {
            // Added through the API on this backing (checked): the file owns it now.
            let name = v.name.clone();
            return self.overlay_change(move |o| o.adopt(&name));
        }
        self.add_vdisk_as(v, false, super::vdisks::Origin::File).map(|_| ()).map_err(|e| e.to_string())
    }

    fn remove_file_vdisk(&self, name: &str) -> Result<(), String> {
        match self.vdisk(name) {
            // Removed through the API already: the file says so now.
            None => {
                let n = name.to_string();
                self.overlay_change(move |o| o.drop_name(&n))
            }
            Some(vm) => self.remove_vdisk_as(vm, super::vdisks::Origin::File).map_err(|e: ChangeError| e.to_string()),
        }
    }

    fn served(&self, name: &str) -> Result<cachevisor_trace::VmId, String> {
        self.vdisk(name).ok_or_else(|| format!("vDisk `{name}` is not served (removed through the API)"))
    }

    fn file_write_policy(&self, name: &str, p: WritePolicy) -> Result<(), String> {
        let Ok(vm) = self.served(name) else { return Ok(()) };
        let n = name.to_string();
        self.overlay_change(move |o| {
            o.write_policy.remove(&n);
        })?;
        self.set_write_policy_now(vm, p).map_err(|e| e.to_string())
    }

    /// A served vDisk's admission, from now (its history of misses starts afresh).
    fn file_admission(&self, name: &str, read: AdmissionPolicy, write: AdmissionPolicy) -> Result<(), String> {
        let Ok(vm) = self.served(name) else { return Ok(()) };
        self.dp.with_engine_mut(|e| e.set_admission(vm, read, write));
        Ok(())
    }

    /// A served vDisk's prefetch, from now (its stream starts afresh).
    fn file_prefetch(&self, name: &str, p: cachevisor_engine::PrefetchPolicy) -> Result<(), String> {
        let Ok(vm) = self.served(name) else { return Ok(()) };
        self.dp.with_engine_mut(|e| e.set_prefetch_policy(vm, p));
        Ok(())
    }

    /// A served vDisk's I/O classes, from now (their counts start afresh).
    fn file_classes(&self, name: &str, classes: &[cachevisor_engine::IoClassSection]) -> Result<(), String> {
        let Ok(vm) = self.served(name) else { return Ok(()) };
        let classes = cachevisor_engine::IoClassSection::resolve_all(classes)?;
        self.dp.with_engine_mut(|e| e.set_io_classes(vm, classes))
    }

    fn file_share(&self, name: &str, weight: f64, ratio: f64) -> Result<(), String> {
        let Ok(vm) = self.served(name) else { return Ok(()) };
        let n = name.to_string();
        self.overlay_change(move |o| {
            o.share.remove(&n);
        })?;
        let share = crate::vdisk_overlay::Share { weight: Some(weight), ratio: Some(ratio) };
        self.set_share_now(vm, share).map_err(|e| e.to_string())
    }

    fn file_allocator(&self, name: &str, params: &cachevisor_policy::params::Params) -> Result<(), String> {
        self.switch_allocator(name, params, |o| {
            o.allocator = None;
            o.target_blocks.clear();
        })
        .map_err(|e| e.to_string())
    }

    /// The allocation interval and the flusher of `r`, from now.
    fn set_schedule(&self, r: &crate::config::Resolved) -> Result<(), String> {
        let schedule = cachevisor_engine::Schedule {
            interval_ns: r.interval_ns,
            samples: cachevisor_policy::controller::RECS_PERIODS,
            flusher: r.cache.writeback.flusher(r.cache.block_size),
            ..Default::default()
        };
        self.dp.set_schedule(schedule);
        Ok(())
    }

    /// The snapshot schedule, how many are kept and the next prewarm's settings (the
    /// snapshot directory stays).
    fn set_prewarm_config(&self, p: &crate::config::PrewarmConfig) {
        let mut s = self.snapshots.lock().unwrap_or_else(|e| e.into_inner());
        let dir = s.config.snapshot_dir.clone();
        s.config = crate::config::PrewarmConfig { snapshot_dir: dir, ..p.clone() };
        s.kept = p.snapshots_kept;
    }

    fn overlay_change(&self, f: impl FnOnce(&mut crate::vdisk_overlay::Overlay)) -> Result<(), String> {
        self.overlay.lock().unwrap_or_else(|e| e.into_inner()).change(&self.meta_dir, f)
    }
}

/// Whether two backing paths (or URIs) name the same place.
fn same_backing(a: &std::path::Path, b: &std::path::Path) -> bool {
    let abs = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    a == b || abs(a) == abs(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::parse(text, "test", std::path::Path::new("/srv")).unwrap()
    }

    const BASE: &str = "[cache]\npath = \"c.img\"\nsize = \"64MiB\"\n[[vdisk]]\nname = \"vm1\"\nbacking = \"vm1.img\"\n[[vdisk]]\nname = \"vm2\"\nbacking = \"vm2.img\"\n";

    #[test]
    fn a_plan_names_every_fixed_key_and_sorts_the_live_ones() {
        let old = cfg(BASE);
        let same = Plan::of(&old, &cfg(BASE)).unwrap();
        assert!(same.added.is_empty() && same.removed.is_empty() && same.settings.is_empty());
        let e = Plan::of(
            &old,
            &cfg(&BASE
                .replace("size = \"64MiB\"\n", "size = \"64MiB\"\nblock_size = \"8KiB\"\n")
                .replace("vm2.img", "other.img")),
        )
        .unwrap_err();
        assert!(e.contains("cache.block_size (\"4KiB\" → \"8KiB\")"), "{e}");
        assert!(e.contains("vdisk (vm2).backing (\"/srv/vm2.img\" → \"/srv/other.img\")"), "{e}");
        assert!(e.contains("Nothing was changed"), "{e}");
        // cache.size is live (a reload resizes the cache within cache.max_size); the
        // layout's bound is not.
        let p = Plan::of(&old, &cfg(&BASE.replace("64MiB", "32MiB"))).unwrap();
        assert!(p.has("cache.size"));
        let e = Plan::of(&old, &cfg(&BASE.replace("size = \"64MiB\"\n", "size = \"64MiB\"\nmax_size = \"1GiB\"\n")))
            .unwrap_err();
        assert!(e.contains("cache.max_size"), "{e}");
        let e = Plan::of(&old, &cfg(&format!("{BASE}[listen]\ntcp = \"127.0.0.1:1\"\n"))).unwrap_err();
        assert!(e.contains("listen.tcp"), "{e}");
        let live = BASE.replace(
            "size = \"64MiB\"\n",
            "size = \"64MiB\"\nwrite_policy = \"wb\"\nallocator = \"eci-cache\"\nflush_rate = \"0\"\n",
        ) + "[[vdisk]]\nname = \"vm3\"\nbacking = \"vm3.img\"\nwrite_policy = \"ro\"\n";
        let live = live.replace("name = \"vm1\"\nbacking = \"vm1.img\"\n", "");
        let live = live.replace("[[vdisk]]\n[[vdisk]]", "[[vdisk]]");
        let p = Plan::of(&old, &cfg(&live)).unwrap();
        assert_eq!(p.added.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["vm3"]);
        assert_eq!(p.removed, ["vm1"]);
        assert_eq!(p.write_policy, [("vm2".to_string(), WritePolicy::Wt, WritePolicy::Wb)]);
        let keys: Vec<&str> = p.settings.iter().map(|(k, ..)| k.as_str()).collect();
        assert_eq!(keys, ["cache.allocator", "cache.flush_rate", "cache.write_policy"]);
        assert!(p.has("cache.allocator") && !p.has("cache.params"));
        // S-CAVE's cleaner runs on CLOCK: with cache.replacement unset, that is a new
        // replacement policy, refused; with it set to the running one, the check is the
        // allocator switch's.
        let e = Plan::of(&old, &cfg(&BASE.replace("64MiB\"\n", "64MiB\"\nallocator = \"s-cave\"\n"))).unwrap_err();
        assert!(e.contains("cache.replacement (Lru → Clock"), "{e}");
    }

    #[test]
    fn changed_keys_walks_tables_and_takes_arrays_whole() {
        let a: toml::Value = toml::from_str("x = 1\n[t]\ny = [1, 2]\nz = 'a'\n").unwrap();
        let b: toml::Value = toml::from_str("x = 1\nw = 2\n[t]\ny = [1, 3]\n").unwrap();
        let mut out = Vec::new();
        changed_keys(Some(&a), Some(&b), "", &mut out);
        assert_eq!(out, ["t.y", "t.z", "w"]);
        assert!(under("cache.params.m", &["cache.params"]) && !under("cache.paramsx", &["cache.params"]));
    }
}
