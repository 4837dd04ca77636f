//! The `keyed-state` import of a stateful transform, answered from the
//! [`KeyedState`] the host lends the instance's store for one call.
//!
//! The state belongs to the query, not to the instance: an instance that
//! trapped is dropped and replaced, while the state must survive until the
//! batch is loaded again. So the state is moved into the store just before
//! `process` and out right after; between calls the instance holds none.
//! A state store failure is a trap here, which fails the batch naming the
//! plugin (the batch is then retried or replayed from version N−1).
//!
//! The store is local (RocksDB), so one key's read or write is short, but a
//! call may carry any number of keys: every call checks the call's deadline
//! before and after, and `get-many` between keys, so that a call past the
//! plugin's time limit fails with the time-limit error (see `deadline`).
//!
//! What the host builds and keeps here is host memory the plugin's memory
//! limit does not see, so it is held to budgets derived from that limit (see
//! `limiter`): a value or a `get-many` result is built only up to what is
//! left of the limit (it is copied into the guest's memory, which could not
//! take more), and the writes of a batch, buffered in host memory until its
//! commit, may take at most `limits.memory`. Going over fails the batch naming
//! the plugin and the limit.

use super::bindings::stateful_transform::weir::plugin::keyed_state;
use super::deadline;
use super::error::Budget;
use super::limiter::BudgetExceeded;
use super::state::HostState;
use crate::operator::wasm_state::KeyedState;

/// The WIT name of the interface; a component importing it gets a state store.
pub(crate) const INTERFACE: &str = "weir:plugin/keyed-state@0.1.0";

/// What one entry of a `get-many` result takes beyond its value: its slot
/// in the guest's list (an option tag, a pointer and a length).
const RESULT_SLOT_BYTES: usize = 12;

/// What a buffered write takes in host memory beyond its key and value: for
/// the entry and an expiry-index entry, a map node each (64 bytes, as the
/// state store counts them), the prefix and the value's header.
fn write_bytes(key: usize, value: usize) -> u64 {
    let key = key as u64 + 64 + 10;
    2 * key + value as u64
}

impl HostState {
    /// The state lent for this call, once the call's deadline is checked.
    fn keyed(&mut self, during: &'static str) -> wasmtime::Result<&mut KeyedState> {
        self.at_host_call();
        deadline::check(self.deadline, during)?;
        let plugin = std::sync::Arc::clone(&self.plugin);
        self.keyed.as_mut().ok_or_else(|| {
            wasmtime::Error::msg(format!(
                "plugin {plugin} called keyed-state outside of a batch, or without a state store"
            ))
        })
    }
}

/// Checks that a write of `bytes` more keeps the batch's write buffer in
/// `state` within `limit` (`limits.memory`).
fn check_buffer(
    state: &KeyedState,
    budget: Budget,
    limit: u64,
    during: &'static str,
    bytes: u64,
) -> wasmtime::Result<()> {
    let total = state.pending_memory_bytes().saturating_add(bytes);
    if total > limit {
        return Err(wasmtime::Error::new(BudgetExceeded {
            budget,
            reason: format!(
                "{during}: the keyed-state writes of this batch, held in host memory until its \
                 commit, would take {total} bytes"
            ),
        }));
    }
    Ok(())
}

fn trap(e: crate::state::StateError) -> wasmtime::Error {
    wasmtime::Error::msg(e.to_string())
}

impl keyed_state::Host for HostState {
    fn get(&mut self, key: Vec<u8>) -> wasmtime::Result<Option<Vec<u8>>> {
        const DURING: &str = "keyed-state.get";
        let room = self.limits.headroom();
        let budget = self.limits.budget();
        let value = self.keyed(DURING)?.get(&key).map_err(trap)?;
        if let Some(v) = &value
            && v.len() > room
        {
            return Err(wasmtime::Error::new(BudgetExceeded {
                budget,
                reason: format!(
                    "{DURING}: the value of its key is {} bytes, more than the {room} bytes \
                     left of it",
                    v.len()
                ),
            }));
        }
        deadline::check(self.deadline, DURING)?;
        Ok(value)
    }

    fn get_many(&mut self, keys: Vec<Vec<u8>>) -> wasmtime::Result<Vec<Option<Vec<u8>>>> {
        const DURING: &str = "keyed-state.get-many";
        let until = self.deadline;
        let room = self.limits.headroom();
        let budget = self.limits.budget();
        let state = self.keyed(DURING)?;
        let mut values = Vec::with_capacity(keys.len());
        let mut bytes = 0usize;
        for (i, key) in keys.iter().enumerate() {
            let value = state.get(key).map_err(trap)?;
            bytes = bytes.saturating_add(RESULT_SLOT_BYTES + value.as_ref().map_or(0, Vec::len));
            if bytes > room {
                // Stop building here: the host never holds more than fits.
                return Err(wasmtime::Error::new(BudgetExceeded {
                    budget,
                    reason: format!(
                        "{DURING}: the values of the first {} of its {} keys already take \
                         {bytes} bytes, more than the {room} bytes left of it",
                        i + 1,
                        keys.len()
                    ),
                }));
            }
            deadline::check(until, DURING)?;
            values.push(value);
        }
        Ok(values)
    }

    fn put(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
        expires_at_micros: Option<i64>,
    ) -> wasmtime::Result<()> {
        const DURING: &str = "keyed-state.put";
        let (budget, limit) = (self.limits.budget(), self.limits.limit_bytes());
        let state = self.keyed(DURING)?;
        check_buffer(
            state,
            budget,
            limit,
            DURING,
            write_bytes(key.len(), value.len()),
        )?;
        state.put(&key, &value, expires_at_micros).map_err(trap)?;
        deadline::check(self.deadline, DURING)
    }

    fn delete(&mut self, key: Vec<u8>) -> wasmtime::Result<()> {
        const DURING: &str = "keyed-state.delete";
        let (budget, limit) = (self.limits.budget(), self.limits.limit_bytes());
        let state = self.keyed(DURING)?;
        check_buffer(state, budget, limit, DURING, write_bytes(key.len(), 0))?;
        state.delete(&key).map_err(trap)?;
        deadline::check(self.deadline, DURING)
    }

    fn watermark_micros(&mut self) -> wasmtime::Result<i64> {
        Ok(self
            .keyed("keyed-state.watermark-micros")?
            .watermark_micros())
    }
}
