//! The daemon's configuration for a test, built instead of written as a TOML literal:
//! `ServeConfig::new("8MiB")` is a cache file `cache.img` of that size, NBD on a free
//! loopback port, no vDisk yet; each call adds what the test is about (a vDisk, the API,
//! a key of any section), and `toml()` / `write()` give the file the daemon reads. Values
//! are TOML values (`"8MiB"`, `0`, `true`), quoted by the `toml` crate.

use std::path::{Path, PathBuf};
use toml::Value;

/// One `[[vdisk]]` or section: its keys in the order given.
type Keys = Vec<(String, Value)>;

/// A daemon configuration under construction.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    cache: Keys,
    listen: Keys,
    api: Option<Keys>,
    sections: Vec<(String, Keys)>,
    vdisks: Vec<Keys>,
    arrays: Vec<(String, Keys)>,
}

fn keys(pairs: &[(&str, Value)]) -> Keys {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// Sets `key` in `keys` (replacing an earlier value).
fn set(keys: &mut Keys, key: &str, value: Value) {
    match keys.iter_mut().find(|(k, _)| k == key) {
        Some(slot) => slot.1 = value,
        None => keys.push((key.to_string(), value)),
    }
}

impl ServeConfig {
    /// A cache file `cache.img` of `size`, NBD on `127.0.0.1:0`.
    pub fn new(size: &str) -> Self {
        ServeConfig {
            cache: keys(&[("path", "cache.img".into()), ("size", size.into())]),
            listen: keys(&[("tcp", "127.0.0.1:0".into())]),
            api: None,
            sections: Vec::new(),
            vdisks: Vec::new(),
            arrays: Vec::new(),
        }
    }

    /// No background write-back (flusher and write-back ahead off), so dirty blocks stay
    /// until the test writes them back.
    pub fn no_writeback(self) -> Self {
        self.cache("flush_rate", "0").cache("writeback_ahead", 0)
    }

    /// `[cache] key = value`.
    pub fn cache(mut self, key: &str, value: impl Into<Value>) -> Self {
        set(&mut self.cache, key, value.into());
        self
    }

    /// `[listen] key = value` (`tcp`, `unix`, `tls`, …).
    pub fn listen(mut self, key: &str, value: impl Into<Value>) -> Self {
        set(&mut self.listen, key, value.into());
        self
    }

    /// No TCP listener (a unix socket or vhost-user only; set those with [`Self::listen`]).
    pub fn no_tcp(mut self) -> Self {
        self.listen.retain(|(k, _)| k != "tcp");
        self
    }

    /// The HTTP API on a free loopback port.
    pub fn api(self) -> Self {
        self.api_key("listen", "127.0.0.1:0")
    }

    /// `[api] key = value` (the API on a free loopback port unless `listen` is set).
    pub fn api_key(mut self, key: &str, value: impl Into<Value>) -> Self {
        let api = self.api.get_or_insert_with(|| keys(&[("listen", "127.0.0.1:0".into())]));
        set(api, key, value.into());
        self
    }

    /// A `[[vdisk]]` named `name` on backing `backing`, with more keys (`size`,
    /// `write_policy`, …).
    pub fn vdisk(mut self, name: &str, backing: &str, more: &[(&str, Value)]) -> Self {
        let mut v = keys(&[("name", name.into()), ("backing", backing.into())]);
        for (k, val) in more {
            set(&mut v, k, val.clone());
        }
        self.vdisks.push(v);
        self
    }

    /// A `[[vdisk]]` whose other keys are TOML lines, as a test writes them inline.
    pub fn vdisk_toml(self, name: &str, backing: &str, lines: &str) -> Self {
        let t: toml::Table = lines.parse().unwrap_or_else(|e| panic!("[[vdisk]] lines {lines:?}: {e}"));
        let more: Vec<(&str, Value)> = t.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        self.vdisk(name, backing, &more)
    }

    /// `[section] key = value` for any section (`prewarm`, `vssd`, `cluster`, …; `cache`,
    /// `listen` and `api` are [`Self::cache`], [`Self::listen`] and [`Self::api_key`]).
    pub fn section(mut self, section: &str, key: &str, value: impl Into<Value>) -> Self {
        match section {
            "cache" => return self.cache(key, value),
            "listen" => return self.listen(key, value),
            "api" => return self.api_key(key, value),
            _ => {}
        }
        let i = match self.sections.iter().position(|(s, _)| s == section) {
            Some(i) => i,
            None => {
                self.sections.push((section.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        set(&mut self.sections[i].1, key, value.into());
        self
    }

    /// Every key of `lines` (TOML `key = value` lines, as a test writes them inline) in
    /// `[section]`.
    pub fn section_toml(mut self, section: &str, lines: &str) -> Self {
        let t: toml::Table = lines.parse().unwrap_or_else(|e| panic!("[{section}] lines {lines:?}: {e}"));
        for (k, v) in t {
            self = self.section(section, &k, v);
        }
        self
    }

    /// One `[[name]]` table of an array (`vssd.device`, …), after the vDisks.
    pub fn array_item(mut self, name: &str, item: &[(&str, Value)]) -> Self {
        self.arrays.push((name.to_string(), keys(item)));
        self
    }

    /// The configuration file's text.
    pub fn toml(&self) -> String {
        let mut out = String::new();
        let mut table = |header: &str, keys: &Keys| {
            out += &format!("{header}\n");
            for (k, v) in keys {
                out += &format!("{k} = {v}\n");
            }
        };
        table("[cache]", &self.cache);
        table("[listen]", &self.listen);
        if let Some(api) = &self.api {
            table("[api]", api);
        }
        for (name, keys) in &self.sections {
            table(&format!("[{name}]"), keys);
        }
        for v in &self.vdisks {
            table("[[vdisk]]", v);
        }
        for (name, keys) in &self.arrays {
            table(&format!("[[{name}]]"), keys);
        }
        out
    }

    /// Writes the file `name` in `dir`; returns its path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.toml()).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        p
    }
}

/// A TOML string value (for [`ServeConfig::vdisk`]'s keys).
pub fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

/// A TOML array of strings (`allow = [...]`).
pub fn strings(v: &[&str]) -> Value {
    Value::Array(v.iter().map(|x| s(x)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_parses_as_toml_with_every_key_in_its_section() {
        let c = ServeConfig::new("8MiB")
            .no_writeback()
            .api()
            .section("prewarm", "rate", "2MiB")
            .vdisk("vm1", "vm1.img", &[("size", s("4MiB")), ("write_policy", s("wb"))])
            .vdisk("vm2", "vm2.img", &[]);
        let t: toml::Table = c.toml().parse().unwrap();
        assert_eq!(t["cache"]["size"].as_str(), Some("8MiB"));
        assert_eq!(t["cache"]["writeback_ahead"].as_integer(), Some(0));
        assert_eq!(t["listen"]["tcp"].as_str(), Some("127.0.0.1:0"));
        assert_eq!(t["api"]["listen"].as_str(), Some("127.0.0.1:0"));
        assert_eq!(t["prewarm"]["rate"].as_str(), Some("2MiB"));
        let v = t["vdisk"].as_array().unwrap();
        assert_eq!((v.len(), v[0]["write_policy"].as_str(), v[1].get("size")), (2, Some("wb"), None));
        let c = c.cache("size", "16MiB").no_tcp().listen("unix", "nbd.sock");
        let t: toml::Table = c.toml().parse().unwrap();
        assert_eq!(t["cache"]["size"].as_str(), Some("16MiB"), "a key set twice keeps the last value");
        assert!(t["listen"].get("tcp").is_none() && t["listen"]["unix"].as_str() == Some("nbd.sock"));
        let c = ServeConfig::new("1MiB")
            .section_toml("vssd", "size = \"8MiB\"\ndeflate_grace = \"200ms\"")
            .array_item("vssd.device", &[("name", s("ssd")), ("persist", true.into())]);
        let t: toml::Table = c.toml().parse().unwrap();
        assert_eq!(t["vssd"]["deflate_grace"].as_str(), Some("200ms"));
        assert_eq!(t["vssd"]["device"][0]["persist"].as_bool(), Some(true));
    }
}
