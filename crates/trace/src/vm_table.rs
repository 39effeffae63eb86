//! Interning of VM / vDisk names within one trace source: one VM per file, or one per
//! device key found in the records (MSR `Hostname_DiskNumber`, MQSim device number, ...).

use crate::request::VmId;
use rustc_hash::FxHashMap;

/// How a source maps records to VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VmMode {
    /// Every record of a file belongs to one VM named after the file.
    File,
    /// One VM per device key found in the records (formats without one use the file).
    #[default]
    Device,
}

/// Local VM names of one source, in first-seen order.
#[derive(Debug, Clone)]
pub struct VmTable {
    mode: VmMode,
    stem: String,
    prefix_keys: bool,
    names: Vec<String>,
    ids: FxHashMap<Vec<u8>, VmId>,
    last: Option<(Vec<u8>, VmId)>,
}

impl VmTable {
    /// A table for a file whose stem is `stem`. In device mode, names are the device key,
    /// or `stem:key` when `prefix_keys` (keys that mean nothing alone, like `3`).
    pub fn new(mode: VmMode, stem: &str, prefix_keys: bool) -> Self {
        let names = if mode == VmMode::File { vec![stem.to_string()] } else { Vec::new() };
        VmTable { mode, stem: stem.to_string(), prefix_keys, names, ids: FxHashMap::default(), last: None }
    }

    /// The VM of a record whose device key is `key`.
    #[inline]
    pub fn id(&mut self, key: &[u8]) -> VmId {
        if self.mode == VmMode::File {
            return 0;
        }
        if let Some((k, id)) = &self.last {
            if k.as_slice() == key {
                return *id;
            }
        }
        let id = match self.ids.get(key) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as VmId;
                let key_str = String::from_utf8_lossy(key);
                let name = if self.prefix_keys { format!("{}:{key_str}", self.stem) } else { key_str.into_owned() };
                self.names.push(name);
                self.ids.insert(key.to_vec(), id);
                id
            }
        };
        self.last = Some((key.to_vec(), id));
        id
    }

    /// The VM of a format that has no device key: always the file's VM.
    pub fn file_vm(&mut self) -> VmId {
        if self.names.is_empty() {
            self.names.push(self.stem.clone());
        }
        0
    }

    /// Names by local id.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}
