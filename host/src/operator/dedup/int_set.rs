//! Sets of 64-bit integers stored as buckets of 4,096 consecutive values.
//!
//! Why it exists: deduplication on one integer key (order ids, sequence
//! numbers, offsets) is the common case, and those keys are usually dense.
//! One state entry per key costs a state-store lookup, a write, a changelog
//! record and several compaction rewrites per key; one entry per bucket of
//! 4,096 values holding which of them are present costs that per bucket,
//! so a batch of 50,000 new ids touches a dozen entries instead of 50,000,
//! and 10M keys take ~1 MB instead of ~150 MB. Sparse keys degrade to about
//! one entry per key, as before.
//!
//! A value `u` (an order-preserving unsigned image of the integer, see
//! [`ordered`]) lives in bucket `u >> 12` at offset `u & 4095`. A bucket's
//! members are encoded like a Roaring container: up to [`ARRAY_MAX`]
//! members as a sorted array of big-endian `u16` offsets after the tag
//! [`TAG_ARRAY`], more as a 4,096-bit bitmap (little-endian 64-bit words)
//! after [`TAG_BITMAP`], whichever is smaller.

//!
//! The layout of deduplication state it makes: `0x01 ‖ bucket (8 bytes,
//! big-endian) → container` per bucket, the null key as `0x02 → ∅`, and the
//! partition's key count under `0x00`. It applies to one integer key that
//! is never evicted ([`IntKey::of`]); a batch's keyed rows are sorted by
//! value, grouped by bucket, and each partition's buckets read in one
//! batched lookup, updated and written back.
use std::fmt;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use arrow_array::{Array, RecordBatch};
use arrow_buffer::{BooleanBuffer, BooleanBufferBuilder};
use arrow_schema::DataType;

use super::{DedupConfig, DedupOperator, Expiry, KeyColumn, Scratch, late_rows, state_error};
use crate::operator::key_encoding::{TAG_NULL, TAG_VALUE};
use crate::operator::stateful::OperatorError;
use crate::state::{StateError, StateStore};

/// Bits of a value that select its offset within its bucket.
pub(crate) const BUCKET_BITS: u32 = 12;
/// Values per bucket.
const BUCKET_SIZE: usize = 1 << BUCKET_BITS;
/// Words of a bitmap container.
const WORDS: usize = BUCKET_SIZE / 64;
/// The largest member count kept as an array: above it a bitmap is smaller.
pub(crate) const ARRAY_MAX: usize = BUCKET_SIZE / 16;
/// Tag of an array container.
const TAG_ARRAY: u8 = 0x01;
/// Tag of a bitmap container.
const TAG_BITMAP: u8 = 0x02;

/// The order-preserving unsigned image of a signed value: the bucket order
/// is then the integers' order.
#[inline]
pub(crate) fn ordered(v: i64) -> u64 {
    (v as u64) ^ (1 << 63)
}

/// The bucket of an ordered value.
#[inline]
pub(crate) fn bucket_of(u: u64) -> u64 {
    u >> BUCKET_BITS
}

/// The offset of an ordered value within its bucket.
#[inline]
fn offset_of(u: u64) -> u16 {
    (u & (BUCKET_SIZE as u64 - 1)) as u16
}

/// A stored container that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CorruptBucket(pub String);

impl fmt::Display for CorruptBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The members of one bucket while a batch updates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bucket {
    /// Sorted, distinct offsets (at most [`ARRAY_MAX`] once encoded).
    Array(Vec<u16>),
    /// Bit `o` of word `o / 64` is offset `o`; `len` members.
    Bitmap {
        words: Box<[u64; WORDS]>,
        len: usize,
    },
}

impl Default for Bucket {
    fn default() -> Self {
        Self::Array(Vec::new())
    }
}

impl Bucket {
    /// Decodes a stored container.
    ///
    /// # Errors
    /// When the bytes are not a container this module wrote.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, CorruptBucket> {
        match bytes.split_first() {
            Some((&TAG_ARRAY, body)) => {
                if body.len() % 2 != 0 || body.len() / 2 > ARRAY_MAX {
                    return Err(CorruptBucket(format!(
                        "array container of {} bytes (expected an even count up to {})",
                        body.len(),
                        2 * ARRAY_MAX
                    )));
                }
                let offsets: Vec<u16> = body
                    .chunks_exact(2)
                    .map(|c| u16::from_be_bytes([c[0], c[1]]))
                    .collect();
                let ascending = offsets.windows(2).all(|w| w[0] < w[1]);
                if !ascending
                    || offsets
                        .last()
                        .is_some_and(|&o| usize::from(o) >= BUCKET_SIZE)
                {
                    return Err(CorruptBucket(
                        "array container offsets are not ascending within the bucket".into(),
                    ));
                }
                Ok(Self::Array(offsets))
            }
            Some((&TAG_BITMAP, body)) => {
                if body.len() != WORDS * 8 {
                    return Err(CorruptBucket(format!(
                        "bitmap container of {} bytes (expected {})",
                        body.len(),
                        WORDS * 8
                    )));
                }
                let mut words = Box::new([0u64; WORDS]);
                for (w, c) in words.iter_mut().zip(body.chunks_exact(8)) {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(c);
                    *w = u64::from_le_bytes(b);
                }
                let len = words.iter().map(|w| w.count_ones() as usize).sum();
                Ok(Self::Bitmap { words, len })
            }
            Some((tag, _)) => Err(CorruptBucket(format!("unknown container tag {tag:#04x}"))),
            None => Err(CorruptBucket("empty container".into())),
        }
    }

    /// How many values the bucket holds.
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Array(a) => a.len(),
            Self::Bitmap { len, .. } => *len,
        }
    }

    /// Adds the value `u` (of this bucket); returns whether it was absent.
    /// Values added in ascending order append to an array without moving it.
    pub(crate) fn insert(&mut self, u: u64) -> bool {
        let o = offset_of(u);
        match self {
            Self::Array(a) => {
                let at = match a.last() {
                    Some(&last) if last < o => a.len(),
                    None => 0,
                    Some(_) => match a.binary_search(&o) {
                        Ok(_) => return false,
                        Err(at) => at,
                    },
                };
                a.insert(at, o);
                if a.len() > ARRAY_MAX {
                    let mut words = Box::new([0u64; WORDS]);
                    for &o in a.iter() {
                        words[usize::from(o) / 64] |= 1 << (o % 64);
                    }
                    *self = Self::Bitmap {
                        words,
                        len: ARRAY_MAX + 1,
                    };
                }
                true
            }
            Self::Bitmap { words, len } => {
                let (w, bit) = (usize::from(o) / 64, 1u64 << (o % 64));
                if words[w] & bit != 0 {
                    return false;
                }
                words[w] |= bit;
                *len += 1;
                true
            }
        }
    }

    /// Whether the bucket holds the value `u` (of this bucket).
    #[cfg(test)]
    pub(crate) fn contains(&self, u: u64) -> bool {
        let o = offset_of(u);
        match self {
            Self::Array(a) => a.binary_search(&o).is_ok(),
            Self::Bitmap { words, .. } => words[usize::from(o) / 64] & (1 << (o % 64)) != 0,
        }
    }

    /// Writes the container into `out` (cleared first).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        match self {
            Self::Array(a) => {
                out.reserve(1 + 2 * a.len());
                out.push(TAG_ARRAY);
                for o in a {
                    out.extend_from_slice(&o.to_be_bytes());
                }
            }
            Self::Bitmap { words, .. } => {
                out.reserve(1 + 8 * WORDS);
                out.push(TAG_BITMAP);
                for w in words.iter() {
                    out.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
    }
}

/// Integer-set layout: the key of a partition's key count.
pub(super) const COUNT_KEY: &[u8] = &[0x00];
/// Integer-set layout: the value column recorded in the state schema.
pub const BUCKET_MEMBERS: &str = "bucket_members";

/// How one integer key column maps to the ordered values of a set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum IntKey {
    /// Any signed or unsigned type up to 32 bits, and Int64: as an i64.
    Signed,
    /// UInt64: the value itself.
    Unsigned,
}

impl IntKey {
    /// The integer-set layout applies to one integer key that is never
    /// evicted, unless `config` keeps one entry per key.
    pub(super) fn of(config: &DedupConfig, keys: &[KeyColumn], expiry: Expiry) -> Option<Self> {
        use DataType as D;
        let [key] = keys else { return None };
        if expiry != Expiry::Never || config.one_entry_per_key {
            return None;
        }
        match key.data_type {
            D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32 => {
                Some(Self::Signed)
            }
            D::UInt64 => Some(Self::Unsigned),
            _ => None,
        }
    }
}

impl DedupOperator {
    /// Deduplication of one input batch in the integer-set layout: the batch's keyed
    /// rows sorted by value (the first row of each value wins), grouped by
    /// bucket, each partition's buckets read in one batched lookup, updated
    /// and written back.
    pub(super) fn dedup_int_set(
        &mut self,
        kind: IntKey,
        late_micros: i64,
        batch: &RecordBatch,
        scratch: &mut Scratch,
    ) -> Result<BooleanBuffer, OperatorError> {
        let n = batch.num_rows();
        let late = match self.event_time {
            Some(i) => {
                let ts = batch
                    .column(i)
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| self.invalid(self.event_time_type_error(i)))?;
                let (mask, dropped) = late_rows(ts, late_micros);
                self.rows_dropped_late += dropped;
                Some(mask)
            }
            None => None,
        };
        let column = batch.column(self.keys[0].index);
        let nulls = column.logical_nulls();
        let on_time = |row: usize| late.as_ref().is_none_or(|l| !l.value(row));
        let values = &mut scratch.values;
        values.clear();
        values.reserve(n);
        let mut null_row = None;
        macro_rules! collect {
            ($t:ty, $image:expr) => {{
                let array = column
                    .as_primitive_opt::<$t>()
                    .ok_or_else(|| self.invalid(self.key_type_error()))?;
                for (row, &v) in array.values().iter().enumerate() {
                    if !on_time(row) {
                        continue;
                    }
                    if nulls.as_ref().is_some_and(|nulls| nulls.is_null(row)) {
                        null_row.get_or_insert(row);
                        continue;
                    }
                    // `row < n <= u32::MAX`, checked by the caller.
                    values.push(($image(v), row as u32));
                }
            }};
        }
        {
            use arrow_array::types::{
                Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type,
                UInt64Type,
            };
            match (kind, column.data_type()) {
                (IntKey::Signed, DataType::Int8) => {
                    collect!(Int8Type, |v: i8| ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::Int16) => {
                    collect!(Int16Type, |v: i16| ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::Int32) => {
                    collect!(Int32Type, |v: i32| ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::Int64) => collect!(Int64Type, ordered),
                (IntKey::Signed, DataType::UInt8) => {
                    collect!(UInt8Type, |v: u8| ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::UInt16) => {
                    collect!(UInt16Type, |v: u16| ordered(i64::from(v)))
                }
                (IntKey::Signed, DataType::UInt32) => {
                    collect!(UInt32Type, |v: u32| ordered(i64::from(v)))
                }
                (IntKey::Unsigned, DataType::UInt64) => collect!(UInt64Type, |v: u64| v),
                _ => return Err(self.invalid(self.key_type_error())),
            }
        }
        // Equal values end up ordered by row, so the first occurrence stays.
        values.sort_unstable();
        values.dedup_by_key(|v| v.0);

        let buckets = &mut scratch.buckets;
        buckets.clear();
        let mut start = 0;
        while start < values.len() {
            let bucket = bucket_of(values[start].0);
            let mut end = start + 1;
            while end < values.len() && bucket_of(values[end].0) == bucket {
                end += 1;
            }
            let mut key = [0u8; 9];
            key[0] = TAG_VALUE;
            key[1..].copy_from_slice(&bucket.to_be_bytes());
            // The partition is below `num_partitions: u32`.
            let partition = self.state.partition_of(&key) as u32;
            buckets.push((key, partition, start..end));
            start = end;
        }
        // Stable: each partition's buckets stay in key order.
        buckets.sort_by_key(|b| b.1);

        let mut keep = BooleanBufferBuilder::new(n);
        keep.append_n(n, false);
        for part in buckets.chunk_by(|a, b| a.1 == b.1) {
            let p = part[0].1 as usize;
            let store = self.state.store_mut(p);
            let keys: Vec<&[u8]> = part.iter().map(|b| b.0.as_slice()).collect();
            store
                .get_many(&keys, true, &mut scratch.containers)
                .map_err(|e| state_error(self.name, e))?;
            let mut added = 0u64;
            for ((key, _, range), stored) in part.iter().zip(scratch.containers.iter()) {
                let mut bucket = match stored {
                    Some(bytes) => Bucket::decode(bytes)
                        .map_err(|e| corrupt_bucket(self.name, store, key, &e))?,
                    None => Bucket::default(),
                };
                let before = bucket.len();
                for &(value, row) in &values[range.clone()] {
                    if bucket.insert(value) {
                        keep.set_bit(row as usize, true);
                    }
                }
                let new = (bucket.len() - before) as u64;
                if new > 0 {
                    added += new;
                    bucket.encode(&mut scratch.encoded);
                    // The lookup above said whether the bucket exists: a new
                    // one is stored without asking the store again.
                    let written = if stored.is_none() {
                        store.put_new(key, &scratch.encoded)
                    } else {
                        store.put(key, &scratch.encoded)
                    };
                    written.map_err(|e| state_error(self.name, e))?;
                }
            }
            self.state.updated(added);
            self.state.add_keys(p, added);
        }
        if let Some(row) = null_row {
            let p = self.state.partition_of(&[TAG_NULL]);
            let store = self.state.store_mut(p);
            if !store
                .contains(&[TAG_NULL])
                .map_err(|e| state_error(self.name, e))?
            {
                store
                    .put_new(&[TAG_NULL], &[])
                    .map_err(|e| state_error(self.name, e))?;
                keep.set_bit(row, true);
                self.state.updated(1);
                self.state.add_keys(p, 1);
            }
        }
        Ok(keep.finish())
    }
}

/// A stored container of the integer-set layout that cannot be read.
fn corrupt_bucket(
    operator: &str,
    store: &StateStore,
    key: &[u8; 9],
    e: &CorruptBucket,
) -> OperatorError {
    let mut bucket = [0u8; 8];
    bucket.copy_from_slice(&key[1..]);
    state_error(
        operator,
        StateError::corrupt(
            store.dir(),
            format!("the entry of bucket {}: {e}", u64::from_be_bytes(bucket)),
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn round_trip(b: &Bucket) -> Bucket {
        let mut bytes = Vec::new();
        b.encode(&mut bytes);
        Bucket::decode(&bytes).expect("decodes what it encoded")
    }

    #[test]
    fn ordered_values_keep_the_integer_order_and_buckets_split_at_4096() {
        let values = [
            i64::MIN,
            i64::MIN + 1,
            -4097,
            -1,
            0,
            1,
            4095,
            4096,
            i64::MAX,
        ];
        let images: Vec<u64> = values.iter().map(|&v| ordered(v)).collect();
        assert!(images.windows(2).all(|w| w[0] < w[1]), "{images:?}");
        assert_eq!(bucket_of(ordered(0)), bucket_of(ordered(4095)));
        assert_ne!(bucket_of(ordered(4095)), bucket_of(ordered(4096)));
        assert_ne!(bucket_of(ordered(-1)), bucket_of(ordered(0)));
        assert_eq!(bucket_of(ordered(i64::MAX)), (1 << 52) - 1);
        assert_eq!(bucket_of(ordered(i64::MIN)), 0);
    }

    #[test]
    fn an_array_becomes_a_bitmap_past_256_members_and_stays_exact() {
        let mut b = Bucket::default();
        let mut model = BTreeSet::new();
        // Descending, then interleaved, so that inserts land mid-array too.
        let offsets: Vec<u64> = (0..200u64)
            .rev()
            .map(|i| i * 7)
            .chain((0..400u64).map(|i| i * 3 + 1))
            .collect();
        for (i, &o) in offsets.iter().enumerate() {
            assert_eq!(b.insert(o), model.insert(o), "insert #{i} of {o}");
            assert_eq!(b.len(), model.len());
            let expect_bitmap = model.len() > ARRAY_MAX;
            assert_eq!(matches!(b, Bucket::Bitmap { .. }), expect_bitmap, "at {i}");
            let back = round_trip(&b);
            assert_eq!(back, b);
        }
        for o in 0..BUCKET_SIZE as u64 {
            assert_eq!(b.contains(o), model.contains(&o), "offset {o}");
        }
        let mut bytes = Vec::new();
        b.encode(&mut bytes);
        assert_eq!(bytes.len(), 1 + 512);
    }

    #[test]
    fn an_array_of_256_members_takes_513_bytes_at_most() {
        let mut b = Bucket::default();
        for o in 0..ARRAY_MAX as u64 {
            assert!(b.insert(o * 16));
            assert!(!b.insert(o * 16), "a second insert of {o} finds it");
        }
        let mut bytes = Vec::new();
        b.encode(&mut bytes);
        assert_eq!(bytes.len(), 1 + 2 * ARRAY_MAX);
        assert!(matches!(Bucket::decode(&bytes), Ok(Bucket::Array(a)) if a.len() == ARRAY_MAX));
    }

    #[test]
    fn corrupt_containers_are_refused_with_the_reason() {
        let cases: [(&[u8], &str); 5] = [
            (&[], "empty container"),
            (&[0x07, 1], "unknown container tag 0x07"),
            (&[TAG_ARRAY, 0, 1, 0], "array container of 3 bytes"),
            (&[TAG_ARRAY, 0, 5, 0, 2], "not ascending"),
            (
                &[TAG_BITMAP, 0, 0],
                "bitmap container of 2 bytes (expected 512)",
            ),
        ];
        for (bytes, reason) in cases {
            let err = Bucket::decode(bytes).expect_err("corrupt");
            assert!(err.0.contains(reason), "{bytes:?}: {err}");
        }
    }
}
