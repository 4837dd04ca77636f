//! Property-based fuzzing of every reader of untrusted input (issue 13, point 6).
//!
//! Why it exists: the pipeline file, the checkpoint (a long-lived directory that crashes, disks
//! and people damage), input files and a guest's output are all input the host does not control.
//! Each target here feeds a reader arbitrary bytes and structured mutations of valid input (lines
//! deleted, duplicated or rewritten, bytes flipped, length fields overwritten with huge or
//! negative values) and checks that it never panics and returns either a value or its typed error
//! naming the bad thing; where a writer exists, valid input must also round-trip.
//!
//! This is proptest on the stable toolchain rather than `cargo fuzz` (nightly, libFuzzer), so the
//! targets run in every `cargo test --workspace --locked`. Every target has a fixed case count,
//! chosen so that the whole suite (`cargo test --workspace --locked --lib -- fuzz`) takes about
//! 15 s on a 2-core machine (the budget is a minute); seeds are random, so each CI run explores new inputs.
//! A longer local run: `PROPTEST_CASES=50000 cargo test --workspace --locked --lib -- fuzz`;
//! replaying one failure: `PROPTEST_RNG_SEED=<seed>`. A failure prints its shrunk input, which
//! becomes a plain `#[test]` regression case next to the target (none is kept in proptest's own
//! regression files: `failure_persistence` is off so that tests never write into the source tree).
//!
//! # Layout
//! - `mod.rs`: the shared configuration and byte-level mutations.
//! - `spec`: the pipeline file (TOML text, `--set` overrides, the value sub-parsers).
//! - `decode`: the JSON-lines and CSV decoders under every malformed-line policy.
//! - `checkpoint`: `metadata`, the `offsets/`, `commits/` and source logs, and the files and
//!   Delta sources reading their log entries (and the Delta table's own commit files).
//! - `state`: the state store's changelogs, snapshot dumps and snapshot metadata.
//! - `query`: restarts of stateful queries over a checkpoint with one file damaged or deleted.
//! - The guest-output reader (Arrow IPC) and the typed-column path live in `plugin::fuzz`, since
//!   `plugin::convert` is private to the plugin module.

mod checkpoint;
mod decode;
mod query;
mod spec;
mod state;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The configuration of one target: `cases` inputs (unless `PROPTEST_CASES` asks for another
/// count), shrinking bounded in iterations and time, no regression files written.
pub(crate) fn config(cases: u32) -> Config {
    let base = Config::default();
    Config {
        cases: if std::env::var_os("PROPTEST_CASES").is_some() {
            base.cases
        } else {
            cases
        },
        max_shrink_iters: 4_096,
        max_shrink_time: 20_000,
        failure_persistence: None,
        ..base
    }
}

/// Runs `test` on `cases` inputs of `strategy`; a failure panics with the shrunk input.
pub(crate) fn run<S: Strategy>(
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let mut runner = TestRunner::new(config(cases));
    if let Err(failure) = runner.run(&strategy, test) {
        panic!("{failure}");
    }
}

/// Counts the cases of a target that reached a deep outcome (a valid result among mutated
/// inputs, an error past a checksum), so that a target whose inputs all bounce off the first
/// check fails instead of passing vacuously.
#[derive(Debug, Default)]
pub(crate) struct Reach(std::sync::atomic::AtomicUsize);

impl Reach {
    pub(crate) fn hit(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Asserts that at least one case in a run of `cases` (when it has at least 100) got there.
    #[expect(
        clippy::print_stderr,
        reason = "WEIR_FUZZ_STATS=1 prints how deep each target gets, to tune its inputs"
    )]
    pub(crate) fn check(&self, what: &str, cases: u32) {
        let hits = self.0.load(std::sync::atomic::Ordering::Relaxed);
        if std::env::var_os("WEIR_FUZZ_STATS").is_some() {
            eprintln!("{what}: {hits} of {} cases", config(cases).cases);
        }
        assert!(
            hits > 0 || config(cases).cases < 100,
            "no case reached {what}: the inputs are too shallow"
        );
    }
}

/// Integers that break length and offset arithmetic, little-endian, in widths 1, 2, 4 and 8.
const INTERESTING: &[(u64, usize)] = &[
    (0, 8),
    (1, 8),
    (u64::MAX, 8),
    (i64::MAX as u64, 8),
    (i64::MIN as u64, 8),
    (1 << 40, 8),
    (1 << 31, 8),
    (0x7fff_ffff, 4),
    (0x8000_0000, 4),
    (0xffff_ffff, 4),
    (0, 4),
    (0x7fff, 2),
    (0xffff, 2),
    (0x7f, 1),
    (0x80, 1),
    (0xff, 1),
    (0, 1),
];

/// A position in an input of any length: taken modulo the length (shrinks towards the start).
pub(crate) type Index = usize;

/// `i` as a position in `0..len` (`0` when `len` is 0).
fn at(i: Index, len: usize) -> usize {
    if len == 0 { 0 } else { i % len }
}

/// One mutation of a byte string; positions are [`Index`]es, so a mutation applies to an input
/// of any length.
#[derive(Debug, Clone)]
pub(crate) enum ByteEdit {
    /// XOR one byte with a non-zero mask.
    Flip(Index, u8),
    /// Overwrite one byte.
    Set(Index, u8),
    /// Cut the input at a position.
    Truncate(Index),
    /// Insert bytes at a position.
    Insert(Index, Vec<u8>),
    /// Remove up to this many bytes at a position.
    Remove(Index, u8),
    /// Repeat up to this many bytes at a position.
    Duplicate(Index, u8),
    /// Overwrite the bytes at a position with one of [`INTERESTING`].
    Interesting(Index, Index),
}

pub(crate) fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        3 => (any::<usize>(), 1..=255u8).prop_map(|(i, m)| ByteEdit::Flip(i, m)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| ByteEdit::Set(i, b)),
        1 => any::<usize>().prop_map(ByteEdit::Truncate),
        1 => (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| ByteEdit::Insert(i, b)),
        1 => (any::<usize>(), 1..=64u8).prop_map(|(i, n)| ByteEdit::Remove(i, n)),
        1 => (any::<usize>(), 1..=64u8).prop_map(|(i, n)| ByteEdit::Duplicate(i, n)),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(i, v)| ByteEdit::Interesting(i, v)),
    ]
}

/// One to `max` mutations.
pub(crate) fn byte_edits(max: usize) -> impl Strategy<Value = Vec<ByteEdit>> {
    proptest::collection::vec(byte_edit(), 1..=max)
}

/// `seed` with `edits` applied in order.
pub(crate) fn mutate(seed: &[u8], edits: &[ByteEdit]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for edit in edits {
        // Positions in 0..len (or 0..=len for insertions and cuts).
        match edit {
            ByteEdit::Flip(i, mask) if !out.is_empty() => {
                let p = at(*i, out.len());
                out[p] ^= mask;
            }
            ByteEdit::Set(i, b) if !out.is_empty() => {
                let p = at(*i, out.len());
                out[p] = *b;
            }
            ByteEdit::Truncate(i) => out.truncate(at(*i, out.len() + 1)),
            ByteEdit::Insert(i, bytes) => {
                let p = at(*i, out.len() + 1);
                out.splice(p..p, bytes.iter().copied());
            }
            ByteEdit::Remove(i, n) if !out.is_empty() => {
                let p = at(*i, out.len());
                let end = (p + usize::from(*n)).min(out.len());
                out.drain(p..end);
            }
            ByteEdit::Duplicate(i, n) if !out.is_empty() => {
                let p = at(*i, out.len());
                let end = (p + usize::from(*n)).min(out.len());
                let copy = out[p..end].to_vec();
                out.splice(end..end, copy);
            }
            ByteEdit::Interesting(i, v) if !out.is_empty() => {
                let (value, width) = INTERESTING[*v % INTERESTING.len()];
                let p = at(*i, out.len());
                let bytes = value.to_le_bytes();
                let end = (p + width).min(out.len());
                out[p..end].copy_from_slice(&bytes[..end - p]);
            }
            _ => {}
        }
    }
    out
}

/// Writes `value` little-endian over the 8 bytes at `at` (a targeted length-field mutation).
pub(crate) fn overwrite_u64(bytes: &mut [u8], at: usize, value: u64) {
    if let Some(slot) = bytes.get_mut(at..at + 8) {
        slot.copy_from_slice(&value.to_le_bytes());
    }
}

/// Values written over 8-byte length and offset fields.
pub(crate) fn huge_or_negative() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(u64::MAX),
        Just(i64::MAX as u64),
        Just(i64::MIN as u64),
        Just(1 << 40),
        Just(1 << 32),
        Just(1 << 31),
        Just((-8i64) as u64),
        0..4096u64,
        any::<u64>(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_mutations_apply_to_any_length() {
        let edits = [
            ByteEdit::Flip(0, 1),
            ByteEdit::Insert(2, vec![9]),
            ByteEdit::Interesting(usize::MAX, 0),
            ByteEdit::Remove(0, 64),
            ByteEdit::Duplicate(0, 64),
            ByteEdit::Truncate(usize::MAX),
        ];
        assert!(mutate(b"", &edits).is_empty());
        assert_eq!(mutate(b"ab", &edits[..1]), b"`b");
        assert_eq!(mutate(b"ab", &edits[..2]), b"`b\x09");
        assert_eq!(
            mutate(b"abcdefghij", &[ByteEdit::Interesting(1, 2)]),
            b"a\xff\xff\xff\xff\xff\xff\xff\xffj"
        );
        assert_eq!(mutate(b"abc", &[ByteEdit::Duplicate(1, 64)]), b"abcbc");
        let mut bytes = vec![0u8; 10];
        overwrite_u64(&mut bytes, 1, u64::MAX);
        assert_eq!(bytes, [0, 255, 255, 255, 255, 255, 255, 255, 255, 0]);
        // A field that does not fit is left alone.
        overwrite_u64(&mut bytes, 5, 0);
        assert_eq!(bytes[5..], [255, 255, 255, 255, 0]);
    }
}
