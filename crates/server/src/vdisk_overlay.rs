//! vDisks added and removed through the API, kept in `vdisks.toml` in the metadata
//! directory (replaced atomically) so they survive restarts without the daemon rewriting
//! the operator's config file. At start the overlay is laid over the config: removed names
//! leave, added vDisks join (an added vDisk wins over a config entry of the same name).

use crate::config::{Config, VdiskConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The API's changes to the configured vDisks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// Configured vDisks removed through the API.
    #[serde(default)]
    pub removed: Vec<String>,
    /// vDisks added through the API.
    #[serde(default)]
    pub vdisk: Vec<VdiskConfig>,
}

/// The overlay file in metadata directory `dir`.
pub fn path(dir: &Path) -> PathBuf {
    dir.join("vdisks.toml")
}

impl Overlay {
    /// Reads the overlay of metadata directory `dir` (empty when there is none).
    pub fn load(dir: &Path) -> Result<Overlay, String> {
        let p = path(dir);
        match std::fs::read_to_string(&p) {
            Ok(t) => toml::from_str(&t).map_err(|e| format!("{}: {e}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Overlay::default()),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    }

    /// Writes the overlay to metadata directory `dir`, all or nothing.
    pub fn save(&self, dir: &Path) -> std::io::Result<()> {
        let text = toml::to_string(self).map_err(std::io::Error::other)?;
        let header = "# vDisks added and removed through cachevisor's API; laid over the config file at start.\n";
        crate::journal::replace_file(&path(dir), &mut |w| {
            w.write_all(header.as_bytes())?;
            w.write_all(text.as_bytes())
        })
    }

    /// Lays the overlay over `cfg`'s vDisks; returns a note per change for the log.
    pub fn apply(&self, cfg: &mut Config) -> Vec<String> {
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
        notes
    }

    /// Notes that `v` was added.
    pub fn add(&mut self, v: VdiskConfig) {
        self.removed.retain(|n| *n != v.name);
        self.vdisk.retain(|o| o.name != v.name);
        self.vdisk.push(v);
    }

    /// Notes that `name` was removed.
    pub fn remove(&mut self, name: &str) {
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
        std::fs::write(path(dir.path()), "removed = 3").unwrap();
        assert!(Overlay::load(dir.path()).unwrap_err().contains("vdisks.toml"));
    }
}
