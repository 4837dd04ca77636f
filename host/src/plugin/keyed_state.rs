//! The `keyed-state` import of a stateful transform, answered from the
//! [`KeyedState`] the host lends the instance's store for one call.
//!
//! The state belongs to the query, not to the instance: an instance that
//! trapped is dropped and replaced, while the state must survive until the
//! batch is loaded again. So the state is moved into the store just before
//! `process` and out right after; between calls the instance holds none.
//! A state store failure is a trap here, which fails the batch naming the
//! plugin (the batch is then retried or replayed from version N−1).

use super::bindings::stateful_transform::weir::plugin::keyed_state;
use super::state::HostState;
use crate::operator::wasm_state::KeyedState;

/// The WIT name of the interface; a component importing it gets a state store.
pub(crate) const INTERFACE: &str = "weir:plugin/keyed-state@0.1.0";

impl HostState {
    fn keyed(&mut self) -> wasmtime::Result<&mut KeyedState> {
        self.at_host_call();
        let plugin = std::sync::Arc::clone(&self.plugin);
        self.keyed.as_mut().ok_or_else(|| {
            wasmtime::Error::msg(format!(
                "plugin {plugin} called keyed-state outside of a batch, or without a state store"
            ))
        })
    }
}

fn trap(e: crate::state::StateError) -> wasmtime::Error {
    wasmtime::Error::msg(e.to_string())
}

impl keyed_state::Host for HostState {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        self.keyed()?.get(&key).map_err(trap)
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        let state = self.keyed()?;
        keys.iter().map(|k| state.get(k).map_err(trap)).collect()
    }

    fn put(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at_micros: Option<i64>,
    ) -> wasmtime::Result<()> {
        self.keyed()?
            .put(&key, &value, expires_at_micros)
            .map_err(trap)
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        self.keyed()?.delete(&key).map_err(trap)
    }

    fn watermark_micros(&mut self) -> wasmtime::Result<i64> {
        Ok(self.keyed()?.watermark_micros())
    }
}
