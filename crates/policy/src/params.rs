//! Numeric policy parameters by name (a scenario's `[cache.params]`), read with defaults
//! and checked: an unknown key or a value out of range is an error naming the key, the
//! policy and what is allowed.

use std::collections::BTreeMap;

/// Parameters as given.
pub type Params = BTreeMap<String, f64>;

/// Reads the parameters one policy knows, then rejects the rest.
pub struct ParamReader<'a> {
    policy: &'static str,
    params: &'a Params,
    known: Vec<&'static str>,
}

impl<'a> ParamReader<'a> {
    /// Reader for `policy`.
    pub fn new(policy: &'static str, params: &'a Params) -> Self {
        ParamReader { policy, params, known: Vec::new() }
    }

    /// `key`, or `default`, which must lie in `lo..=hi`.
    pub fn get(&mut self, key: &'static str, default: f64, lo: f64, hi: f64) -> Result<f64, String> {
        self.known.push(key);
        let v = self.params.get(key).copied().unwrap_or(default);
        if !(lo..=hi).contains(&v) {
            return Err(format!("{}: parameter `{key}` = {v} is outside {lo}..={hi}", self.policy));
        }
        Ok(v)
    }

    /// Fails on any key not read.
    pub fn finish(self) -> Result<(), String> {
        match self.params.keys().find(|k| !self.known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) if self.known.is_empty() => {
                Err(format!("{}: parameter `{k}` is unknown (this policy takes none)", self.policy))
            }
            Some(k) => Err(format!("{}: parameter `{k}` is unknown (it takes {})", self.policy, self.known.join(", "))),
        }
    }
}
