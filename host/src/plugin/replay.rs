//! What a plugin sees of time and chance, chosen so that a replayed batch
//! produces byte-identical output, and so that nobody else can compute it.
//!
//! A batch that runs again (a retry, or after a crash) must give the sink the
//! same rows, or exactly-once output would differ between the first run and
//! the replay. So the guest never sees the machine's clock or its entropy:
//! WASI's wall clock and monotonic clock read the batch timestamp (recorded
//! in `offsets/N`, identical on replay), and WASI's random interfaces and the
//! `random-u64` host import all draw from one splitmix64 stream re-seeded at
//! the start of every call.
//!
//! # The seed
//!
//! The seed of a call is the first 8 bytes (little-endian) of
//! HMAC-SHA256(secret, [`SEED_LABEL`] ‖ batch id ‖ partition), both numbers
//! little-endian, where the secret is the query's `secret` file in its
//! checkpoint (see `checkpoint::secret`). Earlier builds seeded from
//! (query id, batch id, partition) alone, and the query id is no secret: it is
//! in `metadata`, in Kafka markers and Delta `txn` actions, so anyone who
//! could read those could compute a tenant's "secure" random numbers. The
//! secret lives as long as the checkpoint, so a replay still draws the same
//! numbers; two queries, even with the same id, draw unrelated ones. The
//! stream a new instance starts with (what instantiation and `open` draw, and
//! what Python and JavaScript seed their own generators from) is keyed the
//! same way, with `open` in place of the batch: fixed per query, not shared
//! by all queries. WASI's `insecure-random-seed`, read once per instance for
//! hash-map keys, stays a fixed constant: it is insecure by definition, and
//! fixed keeps iteration order identical on every run.
//!
//! What this does not give: splitmix64 is not a cryptographic generator, and
//! its state follows from one output. Within one call, whoever sees one
//! number a plugin drew can compute the ones it draws next; other calls,
//! batches, partitions and queries stay out of reach. A plugin that needs
//! real secrets needs a grant for them, not this stream.
//!
//! # Checkpoints of older builds
//!
//! A checkpoint created before the secret existed gets one at its next open
//! (`metadata` then records `secret_since`, one past its last planned batch).
//! Batches planned before that, in practice the one batch that may be planned
//! but not committed, keep the old seed from (query id, batch id, partition).
//! That batch may already have reached its sink before the crash: a Delta
//! commit or a foreachBatch plugin's write keyed by batch id is then kept and
//! the replay skipped, and a sink that wrote part of it (one of several
//! partitions, one of several MERGEs) is completed by the replay. Either is
//! only exactly-once if the replay draws the same numbers as the first run,
//! for instance the same generated keys; a new seed would silently mix two
//! different versions of one batch. Its numbers were computable from the
//! query id when it was planned and may already be in its output, so keeping
//! the old seed for it gives nothing away that was not already given. Batches
//! planned from then on use the secret.
//!
//! The `WasiCtx` is built once per store, so the clock and generator handed to
//! it are handles onto a [`BatchSeed`] that the host re-arms before each call.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtxBuilder};

use super::state::BatchInfo;
use crate::checkpoint::QuerySecret;
use crate::fnv;

/// What every keyed seed starts with, so that the secret's other uses (if any
/// come) can never produce the same bytes.
pub(crate) const SEED_LABEL: &[u8] = b"weir/plugin-random/v1\0";

/// What a query's plugins draw their random numbers from: its secret, and the
/// first batch the secret keys (see the module docs). Its `Debug` does not
/// show the secret.
#[derive(Clone)]
pub struct ReplayKey {
    /// HMAC-SHA256 keyed with the query's secret, cloned for every seed.
    keyed: Hmac<Sha256>,
    secret_since: u64,
}

impl std::fmt::Debug for ReplayKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayKey")
            .field("secret", &"<redacted>")
            .field("secret_since", &self.secret_since)
            .finish()
    }
}

impl ReplayKey {
    /// The key of a query whose checkpoint has `secret`, which keys batches from
    /// `secret_since` on (`Checkpoint::secret_since`; 0 for every checkpoint
    /// created with its secret).
    pub fn new(secret: &QuerySecret, secret_since: u64) -> Self {
        Self {
            keyed: crate::mac::hmac_sha256(secret.expose()),
            secret_since,
        }
    }

    /// The seed of a call on `info`'s batch.
    fn batch_seed(&self, info: &BatchInfo) -> u64 {
        if info.batch_id < self.secret_since {
            let mut seed = fnv::hash(info.query_id.as_bytes());
            seed = fnv::extend(seed, &info.batch_id.to_le_bytes());
            return fnv::extend(seed, &info.partition.to_le_bytes());
        }
        self.derive(&[
            b"batch",
            &info.batch_id.to_le_bytes(),
            &info.partition.to_le_bytes(),
        ])
    }

    /// The seed a new instance starts with.
    fn open_seed(&self) -> u64 {
        self.derive(&[b"open"])
    }

    fn derive(&self, parts: &[&[u8]]) -> u64 {
        let mut mac = self.keyed.clone();
        mac.update(SEED_LABEL);
        for part in parts {
            mac.update(part);
        }
        let tag = mac.finalize().into_bytes();
        let mut first = [0u8; 8];
        first.copy_from_slice(&tag[..8]);
        u64::from_le_bytes(first)
    }
}

/// The current call's timestamp and random state, shared by the store's
/// clocks and generators. Atomics rather than a lock: a store is used by one
/// thread at a time, they only make the handles `Send + Sync`.
#[derive(Debug)]
pub(crate) struct BatchSeed {
    key: ReplayKey,
    timestamp_micros: AtomicI64,
    rng: AtomicU64,
}

impl BatchSeed {
    /// A seed for a new store: the epoch as its time and the query's `open`
    /// stream, so that even `open` (before any batch) is deterministic.
    pub(crate) fn new(key: &ReplayKey) -> Arc<Self> {
        Arc::new(Self {
            rng: AtomicU64::new(key.open_seed()),
            key: key.clone(),
            timestamp_micros: AtomicI64::new(0),
        })
    }

    /// Re-arms the clock and the random stream for a call on `info`'s batch.
    pub(crate) fn begin(&self, info: &BatchInfo) {
        self.rng.store(self.key.batch_seed(info), Ordering::Relaxed);
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
    use crate::checkpoint::Checkpoint;

    fn info(batch_id: u64) -> BatchInfo {
        BatchInfo {
            query_id: "q".into(),
            batch_id,
            attempt: 0,
            timestamp_micros: 1_700_000_000_123_456,
            partition: 0,
        }
    }

    fn key(byte: u8) -> ReplayKey {
        ReplayKey::new(&QuerySecret::from_bytes([byte; 32]), 0)
    }

    fn draw(seed: &BatchSeed, info: &BatchInfo) -> Vec<u64> {
        seed.begin(info);
        (0..4).map(|_| seed.next_u64()).collect()
    }

    #[test]
    fn a_batch_always_draws_the_same_numbers_and_another_batch_others() {
        let seed = BatchSeed::new(&key(1));
        let first = draw(&seed, &info(7));
        let again = draw(
            &seed,
            &BatchInfo {
                attempt: 3,
                ..info(7)
            },
        );
        assert_eq!(first, again, "the attempt does not change the stream");
        // A replay after a restart: another instance with the same secret.
        assert_eq!(draw(&BatchSeed::new(&key(1)), &info(7)), first);
        assert_ne!(draw(&seed, &info(8)), first);
        let partition = BatchInfo {
            partition: 1,
            ..info(7)
        };
        assert_ne!(
            draw(&seed, &partition),
            first,
            "each partition its own stream"
        );
    }

    #[test]
    fn the_seed_is_the_hmac_of_the_batch_under_the_secret() {
        // Python: int.from_bytes(hmac.new(bytes([1] * 32), b"weir/plugin-random/v1\0batch"
        //   + (7).to_bytes(8, "little") + (0).to_bytes(4, "little"), "sha256").digest()[:8],
        //   "little")
        assert_eq!(key(1).batch_seed(&info(7)), 0x8a23_e583_4ea6_700a);
    }

    #[test]
    fn the_query_id_alone_does_not_give_the_numbers() {
        let info = info(7);
        let a = draw(&BatchSeed::new(&key(1)), &info);
        let b = draw(&BatchSeed::new(&key(2)), &info);
        assert_ne!(a, b, "the same query id and batch under two secrets");
        let legacy = ReplayKey::new(&QuerySecret::from_bytes([1; 32]), 8);
        assert_ne!(
            a,
            draw(
                &BatchSeed::new(&legacy),
                &BatchInfo {
                    batch_id: 8,
                    ..info.clone()
                }
            )
        );
        // The stream a new instance starts with is keyed too.
        assert_ne!(
            BatchSeed::new(&key(1)).next_u64(),
            BatchSeed::new(&key(2)).next_u64()
        );
        assert_eq!(
            BatchSeed::new(&key(1)).next_u64(),
            BatchSeed::new(&key(1)).next_u64()
        );
    }

    #[test]
    fn batches_planned_before_the_secret_keep_the_query_id_seed() {
        let legacy = ReplayKey::new(&QuerySecret::from_bytes([9; 32]), 5);
        // What builds before the secret seeded batch 4 with: fnv(query id, batch, partition).
        let mut old = fnv::hash(b"q");
        old = fnv::extend(old, &4u64.to_le_bytes());
        old = fnv::extend(old, &0u32.to_le_bytes());
        assert_eq!(legacy.batch_seed(&info(4)), old);
        assert_eq!(legacy.batch_seed(&info(5)), key(9).batch_seed(&info(5)));
    }

    #[test]
    fn two_checkpoints_with_the_same_query_id_draw_different_numbers() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let a = Checkpoint::open(&tmp.path().join("a")).expect("checkpoint a");
        // Checkpoint b has a's query id in a `metadata` as an older Weir wrote it: b gets a
        // secret of its own at its first open.
        let mut metadata: serde_json::Value = serde_json::from_slice(
            &std::fs::read(tmp.path().join("a/metadata")).expect("read metadata"),
        )
        .expect("metadata is JSON");
        metadata
            .as_object_mut()
            .expect("an object")
            .remove("secret_since");
        std::fs::create_dir_all(tmp.path().join("b")).expect("mkdir");
        std::fs::write(tmp.path().join("b/metadata"), format!("{metadata}\n"))
            .expect("write metadata");
        let b = Checkpoint::open(&tmp.path().join("b")).expect("checkpoint b");
        assert_eq!(a.query_id(), b.query_id());
        let info = BatchInfo {
            query_id: a.query_id().to_owned(),
            ..info(0)
        };
        let from = |cp: &Checkpoint| {
            draw(
                &BatchSeed::new(&ReplayKey::new(cp.secret(), cp.secret_since())),
                &info,
            )
        };
        assert_ne!(from(&a), from(&b));
        // And a reopened checkpoint draws what it drew before.
        let before = from(&a);
        drop(a);
        let a = Checkpoint::open(&tmp.path().join("a")).expect("reopen a");
        assert_eq!(from(&a), before);
    }

    #[test]
    fn the_key_does_not_show_the_secret() {
        let text = format!(
            "{:?}",
            ReplayKey::new(&QuerySecret::from_bytes([0xab; 32]), 3)
        );
        assert!(!text.contains("171"), "{text}");
        assert!(
            text.contains("<redacted>") && text.contains("secret_since: 3"),
            "{text}"
        );
        let seed = format!("{:?}", BatchSeed::new(&key(0xab)));
        assert!(
            seed.contains("<redacted>") && !seed.contains("171"),
            "{seed}"
        );
    }

    #[test]
    fn the_clocks_read_the_batch_timestamp() {
        let seed = BatchSeed::new(&key(1));
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
