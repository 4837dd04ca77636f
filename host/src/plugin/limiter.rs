//! The memory limit of a plugin instance (`limits.memory`), its high-water
//! mark for the progress record, and the budgets of what the host holds on
//! the plugin's behalf.
//!
//! # One limit for the whole instance
//! A component holds several core instances, each with its own linear
//! memories and tables (a componentize-py build has a dozen), and wasmtime's
//! `StoreLimits` holds each memory to the limit separately: N memories could
//! take N times the limit, and tables were not counted at all. So the
//! limiter keeps the total of every memory and table of the store, a table
//! element costing [`TABLE_ELEMENT_BYTES`] (the pointer wasmtime keeps per
//! element), and refuses the growth that would take that total past
//! `limits.memory`. A refused growth traps the call, and the limiter records
//! that it refused ([`MemoryLimiter::refusal`]): the instance reports the
//! memory-limit error from that record, not from the text of the trap. Wasm
//! memories and tables only grow, so watching each growth also gives the peak
//! an operator sizing `limits.memory` needs.
//!
//! # Host budgets
//! What the host builds or keeps for a plugin is host memory the limit above
//! does not see, and a plugin can make it large at no cost to itself. Each is
//! bounded, and going over fails the call with [`BudgetExceeded`], reported as
//! `PluginError::HostBudget` naming the plugin and the limit:
//! - results the host builds for the guest (`keyed-state.get`, `get-many`):
//!   at most what is left of `limits.memory` ([`MemoryLimiter::headroom`]).
//!   They are copied into the guest's memory, which could not take more, and
//!   the host stops building them there instead of holding, say, 10,000
//!   copies of a 1 MiB value first;
//! - the keyed-state write buffer of a batch (its puts and deletes, held in
//!   host memory until the commit): at most `limits.memory`;
//! - live host resources (streams, pollables, HTTP requests and bodies, the
//!   batch): at most [`MAX_RESOURCES`] per instance (wasmtime allows a million);
//! - logs and stderr: see `logs`, which drops what is over instead of failing.

use wasmtime::ResourceLimiter;

use super::error::Budget;

/// What one table element counts against `limits.memory`: wasmtime keeps a
/// pointer per element (a function reference, or a GC reference slot).
pub(crate) const TABLE_ELEMENT_BYTES: usize = size_of::<usize>();

/// Live host resources one instance may hold at once.
pub(crate) const MAX_RESOURCES: usize = 100_000;

/// A host call would take the host past one of the plugin's budgets.
#[derive(Debug, thiserror::Error)]
#[error("{reason} (its {budget})")]
pub(crate) struct BudgetExceeded {
    pub(crate) budget: Budget,
    /// What the plugin asked for, and how much it came to.
    pub(crate) reason: String,
}

/// What kind of growth the limiter refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Growth {
    Memory,
    Table,
}

/// A growth the limiter refused: the instance was over its memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) growth: Growth,
    /// The bytes of memories and tables the store would have held.
    pub(crate) total: usize,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.growth {
            Growth::Memory => "a linear memory",
            Growth::Table => "a table",
        };
        write!(
            f,
            "growing {what} would take its memories and tables to {} bytes",
            self.total
        )
    }
}

/// The trap of a refused growth.
#[derive(Debug, thiserror::Error)]
#[error("{refusal}, past its memory limit of {limit} bytes")]
struct GrowthRefused {
    refusal: Refusal,
    limit: usize,
}

/// The total of a store's memories and tables, held to `limits.memory`.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    /// `limits.memory`, in bytes.
    limit: usize,
    /// Bytes of the store's memories and tables now.
    total: usize,
    /// The most `total` has been.
    peak: usize,
    /// The growth just permitted, taken back if the grow then fails.
    pending: usize,
    /// The growth refused in the call in progress, if any.
    refused: Option<Refusal>,
}

impl MemoryLimiter {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            total: 0,
            peak: 0,
            pending: 0,
            refused: None,
        }
    }

    /// The high-water mark of memories and tables, in bytes.
    pub(crate) fn peak_bytes(&self) -> u64 {
        u64::try_from(self.peak).unwrap_or(u64::MAX)
    }

    /// `limits.memory`, in bytes.
    pub(crate) fn limit_bytes(&self) -> u64 {
        u64::try_from(self.limit).unwrap_or(u64::MAX)
    }

    /// What is left of the limit: the most the guest's memory could still
    /// take, and so the most the host builds for it in one result.
    pub(crate) fn headroom(&self) -> usize {
        self.limit.saturating_sub(self.total)
    }

    /// The memory budget, for a [`BudgetExceeded`].
    pub(crate) fn budget(&self) -> Budget {
        Budget::Memory {
            limit: self.limit_bytes(),
        }
    }

    /// Forgets the refusal of an earlier call (a call that traps leaves its
    /// instance unusable, so this only matters to instantiation's).
    pub(crate) fn begin_call(&mut self) {
        self.refused = None;
    }

    /// The growth refused since [`Self::begin_call`], if any.
    pub(crate) fn refusal(&self) -> Option<Refusal> {
        self.refused
    }

    /// Permits growing by `delta` bytes, or records the refusal and fails.
    fn grow(&mut self, growth: Growth, delta: usize) -> wasmtime::Result<bool> {
        let total = self.total.saturating_add(delta);
        if total > self.limit {
            let refusal = Refusal { growth, total };
            self.refused = Some(refusal);
            self.pending = 0;
            return Err(wasmtime::Error::new(GrowthRefused {
                refusal,
                limit: self.limit,
            }));
        }
        self.pending = delta;
        self.total = total;
        self.peak = self.peak.max(total);
        Ok(true)
    }

    /// Takes back the growth just permitted. A failure wasmtime reports
    /// without asking first (growth past what the memory's type allows)
    /// may take back an earlier growth instead; it traps all the same, and
    /// a trapped instance is never used again.
    fn grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total = self.total.saturating_sub(std::mem::take(&mut self.pending));
        // As `StoreLimits` with `trap_on_grow_failure`: a failed growth traps.
        Err(error.context("a growth of the plugin's memory or table failed"))
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // A new memory "grows" from 0 to its initial size. wasmtime itself
        // refuses growth past the memory's declared maximum.
        self.grow(Growth::Memory, desired.saturating_sub(current))
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let elements = desired.saturating_sub(current);
        self.grow(Growth::Table, elements.saturating_mul(TABLE_ELEMENT_BYTES))
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.grow_failed(error)
    }

    fn instances(&self) -> usize {
        wasmtime::DEFAULT_INSTANCE_LIMIT
    }

    fn tables(&self) -> usize {
        wasmtime::DEFAULT_TABLE_LIMIT
    }

    fn memories(&self) -> usize {
        wasmtime::DEFAULT_MEMORY_LIMIT
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::{Engine, Instance, Module, Store};

    use super::*;

    const PAGE: usize = 64 << 10;

    #[test]
    fn the_peak_is_the_largest_total_and_refused_growth_does_not_count() -> wasmtime::Result<()> {
        let mut limiter = MemoryLimiter::new(4 << 20);
        assert!(limiter.memory_growing(0, 1 << 20, None)?);
        assert!(limiter.memory_growing(0, 64 << 10, None)?);
        assert!(limiter.memory_growing(1 << 20, 3 << 20, None)?);
        assert_eq!(limiter.peak_bytes(), (3 << 20) + (64 << 10));
        assert_eq!(limiter.refusal(), None);
        let refused = limiter.memory_growing(3 << 20, 8 << 20, None);
        let err = refused.expect_err("over the limit traps");
        assert_eq!(
            err.to_string(),
            "growing a linear memory would take its memories and tables to 8454144 bytes, \
             past its memory limit of 4194304 bytes"
        );
        assert_eq!(
            limiter.refusal(),
            Some(Refusal {
                growth: Growth::Memory,
                total: (8 << 20) + (64 << 10)
            })
        );
        assert_eq!(limiter.peak_bytes(), (3 << 20) + (64 << 10));
        limiter.begin_call();
        assert_eq!(limiter.refusal(), None);
        assert!(limiter.memory_growing(3 << 20, (3 << 20) + (1 << 19), None)?);
        let _ = limiter.memory_grow_failed(wasmtime::Error::msg("no memory"));
        assert_eq!(limiter.total, (3 << 20) + (64 << 10));
        assert_eq!(limiter.headroom(), (4 << 20) - (3 << 20) - (64 << 10));
        Ok(())
    }

    #[test]
    fn memories_and_tables_count_together() -> wasmtime::Result<()> {
        let mut limiter = MemoryLimiter::new(4 << 20);
        assert!(limiter.memory_growing(0, 2 << 20, None)?);
        assert!(limiter.memory_growing(0, 1 << 20, None)?);
        // 3 MiB of memories: a table of 2^17 elements (1 MiB) still fits...
        assert!(limiter.table_growing(0, 1 << 17, None)?);
        assert_eq!(limiter.peak_bytes(), 4 << 20);
        // ...and not one element more, though each memory alone is well under.
        assert!(limiter.table_growing(1 << 17, (1 << 17) + 1, None).is_err());
        assert_eq!(
            limiter.refusal(),
            Some(Refusal {
                growth: Growth::Table,
                total: (4 << 20) + TABLE_ELEMENT_BYTES
            })
        );
        Ok(())
    }

    /// A core module with `memories` memories of `pages` pages each and a
    /// funcref table of `elements` elements, in the binary format.
    fn module(memories: u8, pages: u8, elements: u32) -> Vec<u8> {
        let mut wasm = b"\0asm\x01\0\0\0".to_vec();
        let mut table = vec![1, 0x70, 0x00];
        let mut n = elements;
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                table.push(byte);
                break;
            }
            table.push(byte | 0x80);
        }
        wasm.push(4);
        wasm.push(u8::try_from(table.len()).unwrap());
        wasm.extend(table);
        wasm.extend([5, 1 + 2 * memories, memories]);
        for _ in 0..memories {
            assert!(pages < 0x80, "one LEB byte");
            wasm.extend([0x00, pages]);
        }
        wasm
    }

    fn instantiate(wasm: &[u8], limit: usize) -> (wasmtime::Result<Instance>, Option<Refusal>) {
        let engine = Engine::default();
        let module = Module::new(&engine, wasm).expect("a valid module");
        let mut store = Store::new(&engine, MemoryLimiter::new(limit));
        store.limiter(|l| l);
        let instance = Instance::new(&mut store, &module, &[]);
        (instance, store.data().refusal())
    }

    #[test]
    fn a_real_instance_is_held_to_the_total_of_its_memories_and_tables() {
        let limit = 6 << 20;
        // Three memories of 2.5 MiB each, every one well under 6 MiB.
        let (three, refusal) = instantiate(&module(3, 40, 0), limit);
        assert!(three.is_err(), "7.5 MiB of memories in a 6 MiB limit");
        assert_eq!(
            refusal,
            Some(Refusal {
                growth: Growth::Memory,
                total: 120 * PAGE
            })
        );
        let (two, refusal) = instantiate(&module(2, 40, 0), limit);
        assert!(two.is_ok(), "5 MiB fits: {:?}", two.err());
        assert_eq!(refusal, None);
        // Two memories (5 MiB) and a table of 200,000 elements (1.6 MB).
        let (with_table, refusal) = instantiate(&module(2, 40, 200_000), limit);
        assert!(with_table.is_err(), "the table counts too");
        assert!(refusal.is_some(), "refused by the limiter");
    }
}
