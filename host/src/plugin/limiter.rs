//! The memory limit of a plugin instance, and its high-water mark for the
//! progress record.
//!
//! wasmtime's [`StoreLimits`] enforces the limit but does not say how close a
//! plugin came to it; an operator sizing `limits.memory` needs exactly that.
//! Wasm memories only grow, so watching each growth is enough to know the peak.

use wasmtime::{ResourceLimiter, StoreLimits};

/// [`StoreLimits`] plus the largest total of linear memory the store held.
pub(crate) struct MemoryLimiter {
    limits: StoreLimits,
    /// Bytes of linear memory across the store's memories now.
    total: usize,
    /// The most `total` has been.
    peak: usize,
    /// The growth just permitted, taken back if the grow then fails.
    pending: usize,
}

impl MemoryLimiter {
    pub(crate) fn new(limits: StoreLimits) -> Self {
        Self {
            limits,
            total: 0,
            peak: 0,
            pending: 0,
        }
    }

    /// The high-water mark of linear memory, in bytes.
    pub(crate) fn peak_bytes(&self) -> u64 {
        u64::try_from(self.peak).unwrap_or(u64::MAX)
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        if allowed {
            // A new memory "grows" from 0 to its initial size.
            self.pending = desired.saturating_sub(current);
            self.total = self.total.saturating_add(self.pending);
            self.peak = self.peak.max(self.total);
        }
        Ok(allowed)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.total = self.total.saturating_sub(std::mem::take(&mut self.pending));
        self.limits.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::StoreLimitsBuilder;

    use super::*;

    #[test]
    fn the_peak_is_the_largest_total_and_refused_growth_does_not_count() -> wasmtime::Result<()> {
        let mut limiter = MemoryLimiter::new(
            StoreLimitsBuilder::new()
                .memory_size(4 << 20)
                .trap_on_grow_failure(true)
                .build(),
        );
        assert!(limiter.memory_growing(0, 1 << 20, None)?);
        assert!(limiter.memory_growing(0, 64 << 10, None)?);
        assert!(limiter.memory_growing(1 << 20, 3 << 20, None)?);
        assert_eq!(limiter.peak_bytes(), (3 << 20) + (64 << 10));
        let refused = limiter.memory_growing(3 << 20, 8 << 20, None);
        assert!(refused.is_err(), "over the limit traps");
        assert_eq!(limiter.peak_bytes(), (3 << 20) + (64 << 10));
        assert!(limiter.memory_growing(3 << 20, 4 << 20, None)?);
        let _ = limiter.memory_grow_failed(wasmtime::Error::msg("no memory"));
        assert_eq!(limiter.total, (3 << 20) + (64 << 10));
        Ok(())
    }
}
