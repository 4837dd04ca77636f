//! What a plugin sees of time and chance, chosen so that a replayed batch
//! produces byte-identical output.
//!
//! A batch that runs again (a retry, or after a crash) must give the sink the
//! same rows, or exactly-once output would differ between the first run and
//! the replay. So the guest never sees the machine's clock or its entropy:
//! WASI's wall clock and monotonic clock read the batch timestamp (recorded
//! in `offsets/N`, identical on replay), and WASI's random interfaces and the
//! `random-u64` host import all draw from one splitmix64 stream seeded from
//! (query id, batch id, partition) at the start of every call.
//!
//! The `WasiCtx` is built once per store, so the clock and generator handed to
//! it are handles onto a [`BatchSeed`] that the host re-arms before each call.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use super::state::BatchInfo;
use crate::fnv;

/// The current call's timestamp and random state, shared by the store's
/// clocks and generators. Atomics rather than a lock: a store is used by one
/// thread at a time, they only make the handles `Send + Sync`.
#[derive(Debug, Default)]
pub(crate) struct BatchSeed {
    timestamp_micros: AtomicI64,
    rng: AtomicU64,
}

impl BatchSeed {
    /// A seed for a new store: the epoch as its time and a fixed stream, so
    /// that even `open` (before any batch) is deterministic.
    pub(crate) fn new() -> Arc<Self> {
        let seed = Arc::new(Self::default());
        seed.rng.store(fnv::OFFSET, Ordering::Relaxed);
        seed
    }

    /// Re-arms the clock and the random stream for a call on `info`'s batch.
    pub(crate) fn begin(&self, info: &BatchInfo) {
        let mut seed = fnv::hash(info.query_id.as_bytes());
        seed = fnv::extend(seed, &info.batch_id.to_le_bytes());
        seed = fnv::extend(seed, &info.partition.to_le_bytes());
        self.rng.store(seed, Ordering::Relaxed);
        self.timestamp_micros
            .store(info.timestamp_micros, Ordering::Relaxed);
    }

    /// The next number of the call's stream.
    pub(crate) fn next_u64(&self) -> u64 {
        let mut state = self.rng.load(Ordering::Relaxed);
        let value = splitmix64(&mut state);
        self.rng.store(state, Ordering::Relaxed);
        value
    }

    fn timestamp_micros(&self) -> i64 {
        self.timestamp_micros.load(Ordering::Relaxed)
    }

    /// Gives `wasi` this seed's clocks and generators in place of the host's.
    pub(crate) fn install(self: &Arc<Self>, wasi: &mut WasiCtxBuilder) {
        wasi.wall_clock(BatchClock(Arc::clone(self)))
            .monotonic_clock(BatchClock(Arc::clone(self)))
            .secure_random(BatchRng(Arc::clone(self)))
            .insecure_random(BatchRng(Arc::clone(self)))
            // Read once per instance (hash-map keys): fixed, so that iteration
            // order is the same on every run.
            .insecure_random_seed(u128::from(fnv::OFFSET));
    }
}

/// splitmix64: tiny, fast, and identical on every platform, which is what a
/// replayable random source needs.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Both WASI clocks: the batch timestamp, standing still during a call.
struct BatchClock(Arc<BatchSeed>);

impl HostWallClock for BatchClock {
    fn resolution(&self) -> Duration {
        Duration::from_micros(1)
    }

    fn now(&self) -> Duration {
        // Before 1970 is not a batch time; such a clock reads the epoch.
        Duration::from_micros(u64::try_from(self.0.timestamp_micros()).unwrap_or(0))
    }
}

impl HostMonotonicClock for BatchClock {
    fn resolution(&self) -> u64 {
        1_000
    }

    fn now(&self) -> u64 {
        u64::try_from(self.0.timestamp_micros())
            .unwrap_or(0)
            .saturating_mul(1_000)
    }
}

/// WASI's `random` and `insecure` generators.
struct BatchRng(Arc<BatchSeed>);

impl rand_core::TryRng for BatchRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        // The high half: splitmix64's best bits.
        Ok((self.0.next_u64() >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.0.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(batch_id: u64) -> BatchInfo {
        BatchInfo {
            query_id: "q".into(),
            batch_id,
            attempt: 0,
            timestamp_micros: 1_700_000_000_123_456,
            partition: 0,
        }
    }

    #[test]
    fn a_batch_always_draws_the_same_numbers_and_another_batch_others() {
        let seed = BatchSeed::new();
        seed.begin(&info(7));
        let first: Vec<u64> = (0..4).map(|_| seed.next_u64()).collect();
        seed.begin(&BatchInfo {
            attempt: 3,
            ..info(7)
        });
        let again: Vec<u64> = (0..4).map(|_| seed.next_u64()).collect();
        assert_eq!(first, again, "the attempt does not change the stream");
        seed.begin(&info(8));
        let other: Vec<u64> = (0..4).map(|_| seed.next_u64()).collect();
        assert_ne!(first, other);
    }

    #[test]
    fn the_clocks_read_the_batch_timestamp() {
        let seed = BatchSeed::new();
        seed.begin(&info(1));
        let clock = BatchClock(Arc::clone(&seed));
        assert_eq!(
            HostWallClock::now(&clock),
            Duration::from_micros(1_700_000_000_123_456)
        );
        assert_eq!(HostMonotonicClock::now(&clock), 1_700_000_000_123_456_000);
        let mut bytes = [0u8; 11];
        rand_core::TryRng::try_fill_bytes(&mut BatchRng(Arc::clone(&seed)), &mut bytes)
            .unwrap_or_else(|e| match e {});
        seed.begin(&info(1));
        let mut again = [0u8; 11];
        rand_core::TryRng::try_fill_bytes(&mut BatchRng(seed), &mut again)
            .unwrap_or_else(|e| match e {});
        assert_eq!(bytes, again);
    }
}
