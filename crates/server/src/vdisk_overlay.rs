//! What the API changed, kept in `vdisks.toml` in the metadata directory (replaced
//! atomically) so it survives restarts without the daemon rewriting the operator's config
//! file: vDisks added and removed, write policies switched, partition targets, weights
//! and ratios set, the allocator switched. At start the overlay is laid over the config (each change logged):
//! removed names leave, added vDisks join (an added vDisk wins over a config entry of the
//! same name), write policies, weights, ratios and the allocator replace the config's;
//! targets are applied
//! once the daemon runs.

use crate::config::{Config, VdiskConfig};
use crate::own_files::same_path;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The API's changes to the configured vDisks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Overlay {
    /// Configured vDisks removed through the API.
    #[serde(default)]
    pub removed: Vec<String>,
    /// Allocation policy switched through the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator: Option<AllocatorChoice>,
    /// Write policies switched through the API, by vDisk name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub write_policy: std::collections::BTreeMap<String, cachevisor_engine::WritePolicy>,
    /// Partition targets set through the API, in cache blocks, by vDisk name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub target_blocks: std::collections::BTreeMap<String, u64>,
    /// Weights and ratios set through the API, by vDisk name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub share: std::collections::BTreeMap<String, Share>,
    /// vDisks added through the API.
    #[serde(default)]
    pub vdisk: Vec<VdiskConfig>,
    /// Cache devices (`[[cache.device]]` paths) removed online (`cachevisor cache
    /// remove`): left out at start until the configuration file no longer lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed_devices: Vec<PathBuf>,
    /// Cache devices added online (`cachevisor cache add`): joined at start until the
    /// configuration file lists them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub added_devices: Vec<crate::config::CacheDevice>,
}

/// An allocator and its parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AllocatorChoice {
    /// Registry name.
    pub name: String,
    /// Parameters over its seed's defaults.
    #[serde(default)]
    pub params: cachevisor_policy::params::Params,
}

/// A vDisk's share settings set through the API (SymFlex's phases, live): what is not set
/// stays the config's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// Share of the cache relative to the others (static, symflex-weighted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// Target share of hit throughput (symflex-proportional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
}

/// The overlay file in metadata directory `dir`.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join("vdisks.toml")
}

impl Overlay {
    /// Reads the overlay of metadata directory `dir` (empty when there is none).
    pub(crate) fn load(dir: &Path) -> Result<Overlay, String> {
        let p = path(dir);
        match cachevisor_files::bounded_read::read_to_string(&p, cachevisor_files::bounded_read::STATE_CAP) {
            Ok(t) => toml::from_str(&t).map_err(|e| format!("{}: {e}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Overlay::default()),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }

    /// Writes the overlay to metadata directory `dir`, all or nothing.
    pub(crate) fn save(&self, dir: &Path) -> std::io::Result<()> {
        let text = toml::to_string(self).map_err(std::io::Error::other)?;
        let header = "# vDisks added and removed through cachevisor's API; laid over the config file at start.\n";
        cachevisor_store::journal::replace_file(&path(dir), &mut |w| {
            w.write_all(header.as_bytes())?;
            w.write_all(text.as_bytes())
        })
    }

    /// Applies `change` and saves the result to metadata directory `dir`, all or nothing:
    /// when saving fails the overlay is left as it was. The error names the file.
    pub(crate) fn change(&mut self, dir: &Path, change: impl FnOnce(&mut Overlay)) -> Result<(), String> {
        let mut next = self.clone();
        change(&mut next);
        next.save(dir).map_err(|e| format!("{}: {e}", path(dir).display()))?;
        *self = next;
        Ok(())
    }

    /// Lays the overlay over `cfg`'s vDisks; returns a note per change for the log.
    pub(crate) fn apply(&self, cfg: &mut Config) -> Vec<String> {
        let mut notes = Vec::new();
        cfg.vdisk.retain(|v| {
            let gone = self.removed.contains(&v.name) || self.vdisk.iter().any(|a| a.name == v.name);
            if gone {
                notes.push(format!("vDisk `{}` of the config file was removed or replaced through the API", v.name));
            }
            !gone
        });
        for v in &self.vdisk {
            notes.push(format!("vDisk `{}` was added through the API", v.name));
            cfg.vdisk.push(v.clone());
        }
        for v in cfg.vdisk.iter_mut() {
            if let Some(&p) = self.write_policy.get(&v.name) {
                notes.push(format!("vDisk `{}`: write policy {p:?} set through the API (over the config's)", v.name));
                v.write_policy = Some(p);
            }
            if let Some(s) = self.share.get(&v.name) {
                v.weight = s.weight.unwrap_or(v.weight);
                v.ratio = s.ratio.unwrap_or(v.ratio);
                notes.push(format!(
                    "vDisk `{}`: weight {} and ratio {} set through the API (over the config's)",
                    v.name, v.weight, v.ratio
                ));
            }
        }
        if let Some(a) = &self.allocator {
            notes.push(format!(
                "allocator `{}` set through the API (over the config's `{}`)",
                a.name, cfg.cache.allocator
            ));
            cfg.cache.allocator = a.name.clone();
            cfg.cache.params = a.params.clone();
        }
        notes
    }

    /// Leaves the devices removed online out of `cfg`'s `[[cache.device]]` (applied at
    /// start before the devices are opened); returns a note per device left out.
    pub(crate) fn apply_devices(&self, cfg: &mut Config) -> Vec<String> {
        let mut notes = Vec::new();
        cfg.cache.device.retain(|d| {
            let gone = self.removed_devices.iter().any(|p| same_path(p, &d.path));
            if gone {
                notes.push(format!(
                    "cache device {} was removed with `cachevisor cache remove`: left out (take it out of the configuration file)",
                    d.path.display()
                ));
            }
            !gone
        });
        let listed: Vec<PathBuf> = cfg.cache.device.iter().map(|c| c.path.clone()).collect();
        for d in self.added_devices.iter().filter(|d| !listed.iter().any(|p| same_path(p, &d.path))) {
            notes.push(format!(
                "cache device {} ({}) was added with `cachevisor cache add`: joined (add it to the configuration file)",
                d.path.display(),
                d.size
            ));
            cfg.cache.device.push(d.clone());
        }
        notes
    }

    /// Notes that cache device `d` was added online.
    pub(crate) fn add_device(&mut self, d: crate::config::CacheDevice) {
        self.removed_devices.retain(|p| !same_path(p, &d.path));
        self.added_devices.retain(|o| !same_path(&o.path, &d.path));
        self.added_devices.push(d);
    }

    /// Notes that cache device `path` was removed online.
    pub(crate) fn remove_device(&mut self, path: &Path) {
        self.added_devices.retain(|d| !same_path(&d.path, path));
        if !self.removed_devices.iter().any(|p| same_path(p, path)) {
            self.removed_devices.push(path.to_path_buf());
        }
    }

    /// Forgets removals of devices `listed` no longer names (the configuration file
    /// caught up).
    pub(crate) fn forget_devices_not_in(&mut self, listed: &[PathBuf]) {
        self.removed_devices.retain(|p| listed.iter().any(|l| same_path(l, p)));
        self.added_devices.retain(|d| !listed.iter().any(|l| same_path(l, &d.path)));
    }

    /// Notes `name`'s write policy.
    pub(crate) fn set_write_policy(&mut self, name: &str, p: cachevisor_engine::WritePolicy) {
        self.write_policy.insert(name.to_string(), p);
    }

    /// Notes `name`'s partition target.
    pub(crate) fn set_target(&mut self, name: &str, blocks: u64) {
        self.target_blocks.insert(name.to_string(), blocks);
    }

    /// Notes `name`'s weight and/or ratio (what is `None` keeps its earlier value).
    pub(crate) fn set_share(&mut self, name: &str, share: Share) {
        let s = self.share.entry(name.to_string()).or_default();
        s.weight = share.weight.or(s.weight);
        s.ratio = share.ratio.or(s.ratio);
    }

    /// Notes the allocator (its decisions replace targets set before).
    pub(crate) fn set_allocator(&mut self, name: &str, params: &cachevisor_policy::params::Params) {
        self.allocator = Some(AllocatorChoice { name: name.to_string(), params: params.clone() });
        self.target_blocks.clear();
    }

    /// Forgets what was set for `name` (it was removed, or added anew).
    fn forget(&mut self, name: &str) {
        self.write_policy.remove(name);
        self.target_blocks.remove(name);
        self.share.remove(name);
    }

    /// Notes that `v` was added.
    pub(crate) fn add(&mut self, v: VdiskConfig) {
        self.forget(&v.name);
        self.removed.retain(|n| *n != v.name);
        self.vdisk.retain(|o| o.name != v.name);
        self.vdisk.push(v);
    }

    /// Forgets everything noted about `name`: the configuration file now says what it is
    /// (added to it, or removed from it, and reloaded).
    pub(crate) fn drop_name(&mut self, name: &str) {
        self.forget(name);
        self.adopt(name);
    }

    /// The configuration file now lists `name` (an API-added vDisk of that name, on the
    /// same backing, is the file's; a removal noted before no longer holds). Settings the
    /// API made for it stay.
    pub(crate) fn adopt(&mut self, name: &str) {
        self.removed.retain(|n| n != name);
        self.vdisk.retain(|o| o.name != name);
    }

    /// Notes that `name` was removed.
    pub(crate) fn remove(&mut self, name: &str) {
        self.forget(name);
        self.vdisk.retain(|o| o.name != name);
        if !self.removed.iter().any(|n| n == name) {
            self.removed.push(name.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overlay_round_trips_and_lays_over_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = Config::parse(crate::config::DEFAULT, "default", dir.path()).unwrap();
        assert_eq!(Overlay::load(dir.path()).unwrap(), Overlay::default());
        let mut o = Overlay::default();
        let mut extra = cfg.vdisk[0].clone();
        extra.name = "vm3".into();
        o.add(extra);
        o.remove("vm1");
        o.save(dir.path()).unwrap();
        let back = Overlay::load(dir.path()).unwrap();
        assert_eq!(back, o);
        let notes = back.apply(&mut cfg);
        let names: Vec<&str> = cfg.vdisk.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["vm2", "vm3"]);
        assert_eq!(notes.len(), 2);
        // Removing an added vDisk, then adding a removed name back.
        o.remove("vm3");
        let mut again = cfg.vdisk[0].clone();
        again.name = "vm1".into();
        o.add(again);
        assert_eq!((o.removed.clone(), o.vdisk.len()), (vec!["vm3".to_string()], 1));
        // Settings made through the API lay over the config's; removing forgets them.
        let mut o = Overlay::default();
        o.set_write_policy("vm2", cachevisor_engine::WritePolicy::Ro);
        o.set_target("vm2", 77);
        o.set_allocator("s-cave", &[("m".to_string(), 3.0)].into_iter().collect());
        o.set_target("vm1", 5);
        o.save(dir.path()).unwrap();
        let back = Overlay::load(dir.path()).unwrap();
        assert_eq!(back, o);
        let mut cfg = Config::parse(crate::config::DEFAULT, "default", dir.path()).unwrap();
        back.apply(&mut cfg);
        assert_eq!(
            (cfg.vdisk[1].write_policy, cfg.cache.allocator.as_str(), cfg.cache.params.get("m")),
            (Some(cachevisor_engine::WritePolicy::Ro), "s-cave", Some(&3.0))
        );
        o.remove("vm2");
        assert!(o.write_policy.is_empty() && o.target_blocks.keys().collect::<Vec<_>>() == ["vm1"]);
        std::fs::write(path(dir.path()), "removed = 3").unwrap();
        assert!(Overlay::load(dir.path()).unwrap_err().contains("vdisks.toml"));
    }
}
