//! A stateful transform that asks the host for more than its memory limit
//! allows through `keyed-state`, so that tests can prove the host holds
//! what it builds for a plugin to the plugin's limits (see `plugins/hostile`
//! for the stateless misbehaviour).
//!
//! Config: `{ "mode": "get-many", "batch": 1, "value_bytes": 1048576,
//! "copies": 10000 }`. Every batch it makes sure the key `big` holds
//! `value_bytes` bytes (putting them when absent); in batch `batch` (every
//! batch when not given) it misbehaves as `mode` says, and otherwise passes
//! the batch through. Modes: `ok`, `get-many` (`get_many` of `copies`
//! copies of the key `big`: `copies` × `value_bytes` bytes of result),
//! `put-many` (puts `copies` distinct keys of `value_bytes` bytes each).

use serde::Deserialize;
use weir_plugin_sdk::{Batch, BatchInfo, Output, PluginError, Schema, Transform, state};

/// The key of the large value.
const BIG: &[u8] = b"big";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub mode: String,
    #[serde(default)]
    pub batch: Option<u64>,
    #[serde(default = "default_value_bytes")]
    pub value_bytes: usize,
    #[serde(default = "default_copies")]
    pub copies: usize,
}

fn default_value_bytes() -> usize {
    1 << 20
}

fn default_copies() -> usize {
    10_000
}

#[derive(Debug)]
pub struct HostileState {
    config: Config,
}

impl Transform for HostileState {
    type Config = Config;

    fn new(config: Config, _input: &Schema) -> Result<Self, PluginError> {
        let known = ["ok", "get-many", "put-many"];
        if !known.contains(&config.mode.as_str()) {
            return Err(PluginError::invalid_config(format!(
                "mode {:?} is not one of {known:?}",
                config.mode
            )));
        }
        Ok(Self { config })
    }

    fn process(&mut self, _batch: &Batch<'_>, info: &BatchInfo) -> Result<Output, PluginError> {
        let size = self.config.value_bytes;
        match state::get(BIG) {
            Some(value) if value.len() == size => {}
            Some(value) => {
                return Err(PluginError::fatal(format!(
                    "hostile_state: `big` holds {} bytes, not {size}",
                    value.len()
                )));
            }
            None => state::put(BIG, &vec![7; size]),
        }
        if self.config.batch.is_some_and(|b| b != info.batch_id) {
            return Ok(Output::unchanged());
        }
        match self.config.mode.as_str() {
            "get-many" => {
                let keys = vec![BIG.to_vec(); self.config.copies];
                let values = state::get_many(&keys);
                let bytes: usize = values.iter().flatten().map(Vec::len).sum();
                Err(PluginError::fatal(format!(
                    "hostile_state: the host handed over all {bytes} bytes of {} values",
                    values.len()
                )))
            }
            "put-many" => {
                let value = vec![1; size];
                for i in 0..self.config.copies {
                    state::put(format!("key-{i}").as_bytes(), &value);
                }
                Err(PluginError::fatal(format!(
                    "hostile_state: the host buffered all {} puts of {size} bytes",
                    self.config.copies
                )))
            }
            _ => Ok(Output::unchanged()),
        }
    }
}

weir_plugin_sdk::export_transform!(HostileState);
