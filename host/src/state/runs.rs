//! The sorted-runs backend: each commit's changes become one immutable sorted file (a run),
//! and runs of the same generation are merged four at a time.
//!
//! Why it exists: a streaming state is written in batches that arrive already sorted (a
//! commit applies its `BTreeMap` of changes), looked up mostly for keys that are absent
//! (deduplication's new keys, aggregation's new groups), and made durable by the store's own
//! changelogs. RocksDB pays for generality this workload never uses: every key goes through a
//! skip-list memtable, a flush into a table and a compaction rewriting it again, with the
//! checksums, indexes and bookkeeping of a database. At 10M composite keys that was about half
//! the CPU of the deduplication query (`BENCHMARKS.md` §12). Here a commit's changes are written
//! once, as a run, straight from the sorted batch; runs merge as a base-four counter does (four
//! runs of generation `g` become one of `g + 1`), so a key is rewritten about `log4(batches)`
//! times and a lookup searches at most three runs per generation. Every run carries a blocked
//! bloom filter (one cache line per key and run), held in memory with the first key of each
//! block, so a lookup of an absent key reads no file at all.
//!
//! The directory is a cache, like RocksDB's work directory: every load rebuilds it from a
//! snapshot plus changelogs, so runs are written without fsync until a snapshot needs them. A
//! snapshot hard-links the runs and lists them, oldest first, in a manifest. A run read from a
//! snapshot may be hostile: loading one reads all of it, checking its checksum, its index and
//! the order of its keys, and builds its filter from the keys it holds (the filter is not in the
//! file, so a forged one cannot hide a key), and every offset and length is bounds-checked
//! again when used: a damaged run is a [`StateError::Corrupt`] naming the file, never a panic,
//! and never a store whose lookups and scans disagree.
//!
//! Run file layout (integers little-endian):
//!
//! ```text
//! blocks   entries (varint key len | varint value len + 1, 0 for a delete | key | value)
//!          then the offset of each entry (u32 each) and the entry count (u32)
//! index    block count u32, then per block: offset u64 | length u32 | varint first-key len |
//!          first key; then varint last-key len | last key
//! footer   index offset u64 | entries u64 | CRC-32 of all bytes before it u32 | "WEIRRUN1"
//! ```

use std::cell::RefCell;
use std::cmp::Ordering;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::files;
use super::{Backend, ScanFn, StateError};

/// Entries are cut into blocks of about this size; a lookup that passes the filter reads one.
const BLOCK_BYTES: usize = 4096;
/// Runs of one generation merged into one of the next.
const FAN_IN: usize = 4;
/// Bloom filter bits per entry: about 1 % false positives with 6 probes in one cache line.
const FILTER_BITS_PER_ENTRY: usize = 10;
const FILTER_PROBES: u32 = 6;
/// Bytes of one filter block (a cache line).
const FILTER_BLOCK: usize = 64;
const MAGIC: &[u8; 8] = b"WEIRRUN1";
const FOOTER_LEN: usize = 8 + 8 + 4 + 8;
/// The list of a snapshot's runs.
const MANIFEST: &str = "runs.manifest";
const MANIFEST_MAGIC: &[u8; 8] = b"WEIRRMF1";
/// Run ids stay below this (a store makes a few per commit; a manifest listing more is damaged).
const MAX_RUN_ID: u64 = 1 << 48;
/// Blocks kept in memory per store (direct-mapped): repeated lookups of present keys in the
/// same blocks read no file.
const CACHE_SLOTS: usize = 128;
/// Bytes read at a time by a sequential cursor (merges and scans).
const READ_AHEAD: usize = 64 * 1024;

fn run_name(id: u64) -> String {
    format!("{id}.run")
}

/// The hash the filters use, eight bytes a step.
fn key_hash(key: &[u8]) -> u64 {
    const M: u64 = 0xbf58_476d_1ce4_e5b9;
    let mut h = 0x9e37_79b9_7f4a_7c15 ^ (key.len() as u64).wrapping_mul(M);
    let mut words = key.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        h = (h ^ w).wrapping_mul(M);
        h ^= h >> 31;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut tail = [0u8; 8];
        tail[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(M);
        h ^= h >> 31;
    }
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 29)
}

/// Byte order of two keys, eight bytes a step in registers: the keys here are short (tens of
/// bytes), and a call into libc's `memcmp` per comparison cost more than the comparing (it
/// was a third of a deduplication's CPU before runs compared this way).
#[inline]
fn compare(mut a: &[u8], mut b: &[u8]) -> Ordering {
    while let (Some((x, rest_a)), Some((y, rest_b))) =
        (a.split_first_chunk::<8>(), b.split_first_chunk::<8>())
    {
        if x != y {
            return u64::from_be_bytes(*x).cmp(&u64::from_be_bytes(*y));
        }
        a = rest_a;
        b = rest_b;
    }
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x.cmp(y);
        }
    }
    a.len().cmp(&b.len())
}

/// A blocked bloom filter: a key's probes all fall in one 64-byte block.
#[derive(Debug, Default)]
struct Filter {
    /// Eight words per block; empty: no filter (every key may be present).
    words: Vec<u64>,
}

impl Filter {
    fn for_entries(entries: usize) -> Self {
        let blocks = (entries * FILTER_BITS_PER_ENTRY)
            .div_ceil(FILTER_BLOCK * 8)
            .max(1);
        Self {
            words: vec![0; blocks * 8],
        }
    }

    fn block(&self, hash: u64) -> usize {
        let blocks = (self.words.len() / 8) as u64;
        // `(hash >> 32) * blocks >> 32 < blocks`, which fits a usize.
        ((((hash >> 32) * blocks) >> 32) as usize) * 8
    }

    fn insert(&mut self, hash: u64) {
        if self.words.is_empty() {
            return;
        }
        let base = self.block(hash);
        let mut bits = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for _ in 0..FILTER_PROBES {
            let bit = (bits & 511) as usize;
            self.words[base + bit / 64] |= 1 << (bit % 64);
            bits >>= 9;
        }
    }

    fn may_contain(&self, hash: u64) -> bool {
        if self.words.is_empty() {
            return true;
        }
        let base = self.block(hash);
        let mut bits = hash.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        for _ in 0..FILTER_PROBES {
            let bit = (bits & 511) as usize;
            if self.words[base + bit / 64] & (1 << (bit % 64)) == 0 {
                return false;
            }
            bits >>= 9;
        }
        true
    }

    fn bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// Asks the CPU to fetch the cache line `hash` will probe.
    fn prefetch(&self, hash: u64) {
        if self.words.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let line = self.words[self.block(hash)..].as_ptr().cast::<i8>();
            // SAFETY: a prefetch is a hint that never faults; `line` points into `words`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line);
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = hash;
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads a varint at `*at`, advancing it; `None` when it runs off `bytes` or overflows.
fn get_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn get_u32(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at.checked_add(4)?)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
}

fn get_u64(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at.checked_add(8)?)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// One entry of a block: where its key and value are (`None`: a delete).
#[derive(Debug, Clone, Copy)]
struct Entry {
    key: (usize, usize),
    value: Option<(usize, usize)>,
}

/// A block read into memory, with its entry count checked against its length.
#[derive(Debug, Default)]
struct Block {
    bytes: Vec<u8>,
    /// Where the entry offsets start (the end of the entries).
    offsets_at: usize,
    entries: usize,
}

impl Block {
    /// Checks the trailer of `bytes[..len]`; `None` when it cannot be a block.
    fn parse(&mut self, len: usize) -> Option<()> {
        let count = get_u32(&self.bytes, len.checked_sub(4)?)? as usize;
        let offsets_at = len.checked_sub(4)?.checked_sub(count.checked_mul(4)?)?;
        self.bytes.truncate(len);
        self.offsets_at = offsets_at;
        self.entries = count;
        Some(())
    }

    fn entry(&self, i: usize) -> Option<Entry> {
        let mut at = get_u32(&self.bytes, self.offsets_at + i * 4)? as usize;
        let data = &self.bytes[..self.offsets_at];
        let key_len = usize::try_from(get_varint(data, &mut at)?).ok()?;
        let value_len = usize::try_from(get_varint(data, &mut at)?).ok()?;
        let key_end = at.checked_add(key_len)?;
        let value = match value_len {
            0 => None,
            n => Some((key_end, key_end.checked_add(n - 1)?)),
        };
        let end = value.map_or(key_end, |v| v.1);
        if end > data.len() {
            return None;
        }
        Some(Entry {
            key: (at, key_end),
            value,
        })
    }

    fn key(&self, e: Entry) -> &[u8] {
        &self.bytes[e.key.0..e.key.1]
    }

    fn value(&self, e: Entry) -> Option<&[u8]> {
        e.value.map(|(s, t)| &self.bytes[s..t])
    }

    /// The first entry whose key is `>= key` (`entries` when none).
    fn lower_bound(&self, key: &[u8]) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.entries);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let e = self.entry(mid)?;
            if compare(self.key(e), key).is_lt() {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }
}

/// One immutable sorted file, with its index and filter in memory.
#[derive(Debug)]
struct Run {
    id: u64,
    /// How many merges made it: runs of one generation merge into the next.
    generation: u32,
    path: PathBuf,
    file: File,
    entries: u64,
    /// Offset and length of each block.
    blocks: Vec<(u64, u32)>,
    /// The first key of every block, back to back, and where each ends.
    firsts: Vec<u8>,
    first_ends: Vec<usize>,
    last: Vec<u8>,
    filter: Filter,
    /// Whether the file has been fsynced (a snapshot needs it).
    synced: bool,
}

impl Run {
    fn first_key(&self, block: usize) -> &[u8] {
        let start = if block == 0 {
            0
        } else {
            self.first_ends[block - 1]
        };
        &self.firsts[start..self.first_ends[block]]
    }

    /// The block that holds `key` if any does.
    fn block_of(&self, key: &[u8]) -> Option<usize> {
        if self.blocks.is_empty()
            || compare(key, &self.last).is_gt()
            || compare(key, self.first_key(0)).is_lt()
        {
            return None;
        }
        // The last block whose first key is <= key.
        let (mut lo, mut hi) = (0, self.blocks.len());
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if compare(self.first_key(mid), key).is_le() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(lo)
    }

    /// The entry of `key` in this run (a value or a delete), its block read through `cache`.
    fn find<'c>(
        &self,
        key: &[u8],
        cache: &'c mut BlockCache,
    ) -> Result<Option<(&'c Block, Entry)>, StateError> {
        let Some(b) = self.block_of(key) else {
            return Ok(None);
        };
        let block = cache.get(self, b)?;
        let damaged = || self.corrupt(format!("block {b} is damaged"));
        let at = block.lower_bound(key).ok_or_else(damaged)?;
        if at >= block.entries {
            return Ok(None);
        }
        let e = block.entry(at).ok_or_else(damaged)?;
        Ok(compare(block.key(e), key).is_eq().then_some((block, e)))
    }

    fn corrupt(&self, reason: impl Into<String>) -> StateError {
        StateError::corrupt(&self.path, reason)
    }

    /// Reads block `b` into `block`.
    fn read_block(&self, b: usize, block: &mut Block) -> Result<(), StateError> {
        let (offset, len) = self.blocks[b];
        let len = len as usize;
        block.bytes.resize(len, 0);
        self.file
            .read_exact_at(&mut block.bytes, offset)
            .map_err(|e| StateError::io(&self.path, "read", e))?;
        block
            .parse(len)
            .ok_or_else(|| self.corrupt(format!("block {b} has a bad entry count")))
    }

    /// Opens the run file `path` (`synced`: already durable) and checks all of it: the
    /// checksum, the index, and every block (entries in ascending key order, each block's first
    /// key the one the index holds), building the filter from the keys read. A file that passes is one the store
    /// could have written, so lookups and scans of it agree.
    fn open(path: PathBuf, id: u64, generation: u32, synced: bool) -> Result<Self, StateError> {
        let corrupt = |reason: String| StateError::corrupt(&path, reason);
        let read_err = |e| StateError::io(&path, "read", e);
        let file = File::open(&path).map_err(|e| StateError::io(&path, "open", e))?;
        let len = file.metadata().map_err(read_err)?.len();
        let Some(body) = len.checked_sub(FOOTER_LEN as u64) else {
            return Err(corrupt("shorter than a run footer".into()));
        };
        let mut footer = [0u8; FOOTER_LEN];
        file.read_exact_at(&mut footer, body).map_err(read_err)?;
        if &footer[FOOTER_LEN - 8..] != MAGIC {
            return Err(corrupt("not a Weir run (bad magic)".into()));
        }
        let (index_at, entries) = (
            get_u64(&footer, 0).unwrap_or(u64::MAX),
            get_u64(&footer, 8).unwrap_or(u64::MAX),
        );
        if index_at > body {
            return Err(corrupt("index offset out of range".into()));
        }
        // The checksum covers every byte before it, read a slice at a time.
        let mut crc = crc32fast::Hasher::new();
        let mut chunk = vec![0u8; 1 << 20];
        let mut at = 0u64;
        let mut index = Vec::new();
        while at < body {
            let n = (body - at).min(chunk.len() as u64) as usize;
            file.read_exact_at(&mut chunk[..n], at).map_err(read_err)?;
            crc.update(&chunk[..n]);
            let end = at + n as u64;
            if end > index_at {
                let from = index_at.saturating_sub(at) as usize;
                index.extend_from_slice(&chunk[from..n]);
            }
            at = end;
        }
        crc.update(&footer[..16]);
        if crc.finalize() != get_u32(&footer, 16).unwrap_or(0) {
            return Err(corrupt("checksum mismatch".into()));
        }
        let bad_index = || corrupt("its block index is damaged".into());
        let count = get_u32(&index, 0).ok_or_else(bad_index)? as usize;
        let mut at = 4;
        let mut blocks = Vec::with_capacity(count.min(index.len() / 13));
        let mut firsts = Vec::new();
        let mut first_ends = Vec::with_capacity(blocks.capacity());
        for _ in 0..count {
            let offset = get_u64(&index, at).ok_or_else(bad_index)?;
            let len = get_u32(&index, at + 8).ok_or_else(bad_index)?;
            at += 12;
            let end = offset.checked_add(u64::from(len)).ok_or_else(bad_index)?;
            if end > index_at {
                return Err(bad_index());
            }
            let key_len = get_varint(&index, &mut at).ok_or_else(bad_index)?;
            let key = usize::try_from(key_len)
                .ok()
                .and_then(|n| index.get(at..at.checked_add(n)?))
                .ok_or_else(bad_index)?;
            at += key.len();
            blocks.push((offset, len));
            firsts.extend_from_slice(key);
            first_ends.push(firsts.len());
        }
        let last_len = get_varint(&index, &mut at).ok_or_else(bad_index)?;
        let last = usize::try_from(last_len)
            .ok()
            .and_then(|n| index.get(at..at.checked_add(n)?))
            .ok_or_else(bad_index)?
            .to_vec();
        // The filter's size from the entry count, which cannot exceed a third of the bytes
        // (an entry takes at least two length bytes and an offset of four).
        let sized = usize::try_from(entries.min(index_at / 3)).unwrap_or(0);
        let mut run = Self {
            id,
            generation,
            path,
            file,
            entries,
            blocks,
            firsts,
            first_ends,
            last,
            filter: Filter::for_entries(sized),
            synced,
        };
        run.check_blocks()?;
        Ok(run)
    }

    /// Reads every block: see [`Self::open`].
    fn check_blocks(&mut self) -> Result<(), StateError> {
        let mut block = Block::default();
        let mut previous: Vec<u8> = Vec::new();
        let mut seen = 0u64;
        for b in 0..self.blocks.len() {
            self.read_block(b, &mut block)?;
            if block.entries == 0 {
                return Err(self.corrupt(format!("block {b} is empty")));
            }
            for i in 0..block.entries {
                let e = block
                    .entry(i)
                    .ok_or_else(|| self.corrupt(format!("an entry of block {b} is damaged")))?;
                let key = block.key(e);
                if i == 0 && key != self.first_key(b) {
                    return Err(self.corrupt(format!(
                        "block {b} does not start with the key its index holds"
                    )));
                }
                if seen > 0 && key <= previous.as_slice() {
                    return Err(self.corrupt(format!("the keys of block {b} do not ascend")));
                }
                self.filter.insert(key_hash(key));
                previous.clear();
                previous.extend_from_slice(key);
                seen += 1;
            }
        }
        if seen != self.entries || previous != self.last {
            return Err(self.corrupt(format!(
                "it holds {seen} entries ending at another key than its footer and index say"
            )));
        }
        Ok(())
    }

    fn memory_bytes(&self) -> usize {
        self.filter.bytes()
            + self.firsts.len()
            + self.first_ends.len() * 8
            + self.blocks.len() * 16
            + self.last.len()
    }
}

/// Writes one run: entries in ascending key order, then index and footer.
struct RunWriter {
    path: PathBuf,
    out: BufWriter<File>,
    crc: crc32fast::Hasher,
    written: u64,
    block: Vec<u8>,
    offsets: Vec<u32>,
    blocks: Vec<(u64, u32)>,
    firsts: Vec<u8>,
    first_ends: Vec<usize>,
    last: Vec<u8>,
    filter: Filter,
    entries: u64,
}

impl RunWriter {
    /// A writer of a run of at most `entries` entries (the filter's size).
    fn create(path: PathBuf, entries: usize) -> Result<Self, StateError> {
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| StateError::io(&path, "create", e))?;
        Ok(Self {
            path,
            out: BufWriter::with_capacity(READ_AHEAD, file),
            crc: crc32fast::Hasher::new(),
            written: 0,
            block: Vec::with_capacity(BLOCK_BYTES * 2),
            offsets: Vec::new(),
            blocks: Vec::new(),
            firsts: Vec::new(),
            first_ends: Vec::new(),
            last: Vec::new(),
            filter: Filter::for_entries(entries),
            entries: 0,
        })
    }

    fn io(&self, e: std::io::Error) -> StateError {
        StateError::io(&self.path, "write", e)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        self.crc.update(bytes);
        self.written += bytes.len() as u64;
        self.out.write_all(bytes).map_err(|e| self.io(e))
    }

    /// Appends an entry; keys must ascend.
    fn add(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), StateError> {
        debug_assert!(self.entries == 0 || key > self.last.as_slice());
        if self.offsets.is_empty() {
            self.firsts.extend_from_slice(key);
            self.first_ends.push(self.firsts.len());
        }
        let offset = u32::try_from(self.block.len()).map_err(|_| {
            StateError::corrupt(&self.path, "an entry does not fit a block (over 4 GB)")
        })?;
        self.offsets.push(offset);
        put_varint(&mut self.block, key.len() as u64);
        put_varint(&mut self.block, value.map_or(0, |v| v.len() as u64 + 1));
        self.block.extend_from_slice(key);
        if let Some(v) = value {
            self.block.extend_from_slice(v);
        }
        self.last.clear();
        self.last.extend_from_slice(key);
        self.filter.insert(key_hash(key));
        self.entries += 1;
        if self.block.len() >= BLOCK_BYTES {
            self.end_block()?;
        }
        Ok(())
    }

    fn end_block(&mut self) -> Result<(), StateError> {
        if self.offsets.is_empty() {
            return Ok(());
        }
        let mut block = std::mem::take(&mut self.block);
        for o in &self.offsets {
            block.extend_from_slice(&o.to_le_bytes());
        }
        block.extend_from_slice(&(self.offsets.len() as u32).to_le_bytes());
        let len = u32::try_from(block.len())
            .map_err(|_| StateError::corrupt(&self.path, "a block is over 4 GB"))?;
        self.blocks.push((self.written, len));
        self.write(&block)?;
        block.clear();
        self.block = block;
        self.offsets.clear();
        Ok(())
    }

    /// Writes index, filter and footer; returns the run, open for reading.
    fn finish(mut self, id: u64, generation: u32) -> Result<Run, StateError> {
        self.end_block()?;
        let index_at = self.written;
        let mut index = Vec::with_capacity(self.firsts.len() + self.blocks.len() * 14 + 16);
        index.extend_from_slice(&(self.blocks.len() as u32).to_le_bytes());
        let mut start = 0;
        for (&(offset, len), &end) in self.blocks.iter().zip(&self.first_ends) {
            index.extend_from_slice(&offset.to_le_bytes());
            index.extend_from_slice(&len.to_le_bytes());
            put_varint(&mut index, (end - start) as u64);
            index.extend_from_slice(&self.firsts[start..end]);
            start = end;
        }
        put_varint(&mut index, self.last.len() as u64);
        index.extend_from_slice(&self.last);
        self.write(&index)?;
        let mut footer = Vec::with_capacity(FOOTER_LEN);
        footer.extend_from_slice(&index_at.to_le_bytes());
        footer.extend_from_slice(&self.entries.to_le_bytes());
        self.crc.update(&footer);
        footer.extend_from_slice(&self.crc.clone().finalize().to_le_bytes());
        footer.extend_from_slice(MAGIC);
        self.out.write_all(&footer).map_err(|e| self.io(e))?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| StateError::io(&self.path, "write", e.into_error()))?;
        Ok(Run {
            id,
            generation,
            path: self.path,
            file,
            entries: self.entries,
            blocks: self.blocks,
            firsts: self.firsts,
            first_ends: self.first_ends,
            last: self.last,
            filter: self.filter,
            synced: false,
        })
    }
}

/// Reads one run in key order from a starting key, a few blocks per read.
struct Cursor<'r> {
    run: &'r Run,
    /// The next block to read into `block`.
    next_block: usize,
    block: Block,
    /// The current entry of `block`.
    at: usize,
    current: Option<Entry>,
    /// Blocks read ahead: bytes and the blocks' lengths.
    ahead: Vec<u8>,
    ahead_at: usize,
    ahead_lens: std::collections::VecDeque<usize>,
}

impl<'r> Cursor<'r> {
    fn seek(run: &'r Run, start: &[u8]) -> Result<Self, StateError> {
        let first = if start.is_empty() || run.blocks.is_empty() || start <= run.first_key(0) {
            0
        } else {
            run.block_of(start).unwrap_or(run.blocks.len())
        };
        let mut cursor = Self {
            run,
            next_block: first,
            block: Block::default(),
            at: 0,
            current: None,
            ahead: Vec::new(),
            ahead_at: 0,
            ahead_lens: std::collections::VecDeque::new(),
        };
        if cursor.load_next()? {
            cursor.at = cursor
                .block
                .lower_bound(start)
                .ok_or_else(|| run.corrupt(format!("block {first} is damaged")))?;
            cursor.settle()?;
        }
        Ok(cursor)
    }

    /// Moves to the next block; false at the end of the run.
    fn load_next(&mut self) -> Result<bool, StateError> {
        let run = self.run;
        if self.ahead_lens.is_empty() {
            if self.next_block >= run.blocks.len() {
                self.current = None;
                return Ok(false);
            }
            // Read consecutive blocks up to READ_AHEAD bytes in one call; the first read of a
            // cursor only its block (a short scan may need no more).
            let offset = run.blocks[self.next_block].0;
            let mut end = self.next_block;
            let mut bytes = 0usize;
            let limit = if self.ahead.is_empty() { 1 } else { READ_AHEAD };
            while end < run.blocks.len() && (end == self.next_block || bytes < limit) {
                let (o, l) = run.blocks[end];
                if o != offset + bytes as u64 {
                    break;
                }
                bytes += l as usize;
                self.ahead_lens.push_back(l as usize);
                end += 1;
            }
            self.ahead.resize(bytes, 0);
            run.file
                .read_exact_at(&mut self.ahead, offset)
                .map_err(|e| StateError::io(&run.path, "read", e))?;
            self.ahead_at = 0;
        }
        let len = self.ahead_lens.pop_front().unwrap_or(0);
        self.block.bytes.clear();
        self.block
            .bytes
            .extend_from_slice(&self.ahead[self.ahead_at..self.ahead_at + len]);
        self.ahead_at += len;
        let b = self.next_block;
        self.block
            .parse(len)
            .ok_or_else(|| run.corrupt(format!("block {b} has a bad entry count")))?;
        self.next_block += 1;
        self.at = 0;
        Ok(true)
    }

    /// Sets `current` to the entry at `at`, moving on to later blocks past a block's end.
    fn settle(&mut self) -> Result<(), StateError> {
        while self.at >= self.block.entries {
            if !self.load_next()? {
                return Ok(());
            }
        }
        let b = self.next_block - 1;
        self.current = Some(self.block.entry(self.at).ok_or_else(|| {
            self.run
                .corrupt(format!("an entry of block {b} is damaged"))
        })?);
        Ok(())
    }

    fn key(&self) -> Option<&[u8]> {
        self.current.map(|e| self.block.key(e))
    }

    fn advance(&mut self) -> Result<(), StateError> {
        self.at += 1;
        self.settle()
    }
}

/// What [`merge_runs`] calls with each key and its value (`None`: deleted); false stops it.
type EntryFn<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> Result<bool, StateError> + 'a;

/// Walks the union of `runs` (newest last) from `start` to before `end`: each key once, with its
/// newest entry.
/// `f` gets the key and the value (`None`: deleted) and returns false to stop.
fn merge_runs(
    runs: &[Run],
    start: &[u8],
    end: Option<&[u8]>,
    f: &mut EntryFn<'_>,
) -> Result<(), StateError> {
    // Newest first, so that the first cursor on a key is the one that wins; runs wholly
    // outside `start..end` are not read.
    let mut cursors = runs
        .iter()
        .rev()
        .filter(|r| {
            !r.blocks.is_empty()
                && r.last.as_slice() >= start
                && end.is_none_or(|end| r.first_key(0) < end)
        })
        .map(|r| Cursor::seek(r, start))
        .collect::<Result<Vec<_>, _>>()?;
    let mut key = Vec::new();
    loop {
        let mut best: Option<(usize, &[u8])> = None;
        for (i, c) in cursors.iter().enumerate() {
            if let Some(k) = c.key()
                && best.is_none_or(|(_, bk)| compare(k, bk).is_lt())
            {
                best = Some((i, k));
            }
        }
        let Some((b, k)) = best else { return Ok(()) };
        if end.is_some_and(|end| compare(k, end).is_ge()) {
            return Ok(());
        }
        key.clear();
        key.extend_from_slice(k);
        let go_on = {
            let c = &cursors[b];
            let value = c.current.and_then(|e| c.block.value(e));
            f(&key, value)?
        };
        if !go_on {
            return Ok(());
        }
        // Older entries of the same key are shadowed.
        for c in &mut cursors {
            while c.key().is_some_and(|k| compare(k, &key).is_le()) {
                c.advance()?;
            }
        }
    }
}

/// A direct-mapped cache of blocks, keyed by run id and block number.
#[derive(Debug)]
struct BlockCache {
    slots: Vec<Option<(u64, usize, Block)>>,
}

impl BlockCache {
    fn new() -> Self {
        Self {
            slots: (0..CACHE_SLOTS).map(|_| None).collect(),
        }
    }

    fn clear(&mut self) {
        for s in &mut self.slots {
            *s = None;
        }
    }

    fn bytes(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .map(|(_, _, b)| b.bytes.capacity())
            .sum()
    }

    /// The block `b` of `run`, read on a miss.
    fn get(&mut self, run: &Run, b: usize) -> Result<&Block, StateError> {
        let slot = (run.id.wrapping_mul(0x9e37_79b9) as usize ^ b) % CACHE_SLOTS;
        let hit = matches!(&self.slots[slot], Some((id, at, _)) if *id == run.id && *at == b);
        if !hit {
            let mut block = match self.slots[slot].take() {
                Some((_, _, block)) => block,
                None => Block::default(),
            };
            run.read_block(b, &mut block)?;
            self.slots[slot] = Some((run.id, b, block));
        }
        match &self.slots[slot] {
            Some((_, _, block)) => Ok(block),
            None => Err(run.corrupt("block cache slot is empty")),
        }
    }
}

pub(super) struct RunsBackend {
    dir: PathBuf,
    /// Oldest first.
    runs: Vec<Run>,
    next_id: u64,
    cache: RefCell<BlockCache>,
}

impl std::fmt::Debug for RunsBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunsBackend")
            .field("dir", &self.dir)
            .field("runs", &self.runs.len())
            .finish_non_exhaustive()
    }
}

/// How far ahead of the key being probed a batched lookup fetches filter lines.
const PREFETCH_AHEAD: usize = 8;

/// A batched lookup's answer for one key so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Unknown,
    Present,
    Deleted,
}

/// What the newest entry of a key in the runs says.
enum Found<'b> {
    Absent,
    Deleted,
    Value(&'b [u8]),
}

impl RunsBackend {
    /// Opens an empty store of runs in `dir` (which is emptied). Every run has a filter,
    /// whatever the operator's [`Lookups`](super::Lookups): besides answering for absent keys,
    /// it spares a lookup of an old key the search of every newer run.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        let mut backend = Self {
            dir: dir.to_path_buf(),
            runs: Vec::new(),
            next_id: 0,
            cache: RefCell::new(BlockCache::new()),
        };
        backend.reset(None)?;
        Ok(backend)
    }

    /// Looks `key` up in the runs, newest first, and hands the answer to `f`.
    fn lookup<T>(
        &self,
        key: &[u8],
        hash: u64,
        f: impl FnOnce(Found<'_>) -> T,
    ) -> Result<T, StateError> {
        let mut cache = self.cache.borrow_mut();
        for run in self.runs.iter().rev() {
            if !run.filter.may_contain(hash) {
                continue;
            }
            if let Some((block, e)) = run.find(key, &mut cache)? {
                return Ok(f(match block.value(e) {
                    Some(v) => Found::Value(v),
                    None => Found::Deleted,
                }));
            }
        }
        Ok(f(Found::Absent))
    }

    /// Writes a new run of generation `generation` from entries in ascending key order.
    fn write_run(
        &mut self,
        entries: usize,
        generation: u32,
        source: &mut dyn FnMut(&mut RunWriter) -> Result<(), StateError>,
    ) -> Result<Run, StateError> {
        let id = self.next_id;
        self.next_id = id
            .checked_add(1)
            .filter(|&next| next <= MAX_RUN_ID)
            .ok_or_else(|| StateError::corrupt(&self.dir, "run ids are exhausted"))?;
        let mut writer = RunWriter::create(self.dir.join(run_name(id)), entries)?;
        source(&mut writer)?;
        writer.finish(id, generation)
    }

    /// Merges the newest runs while the newest `FAN_IN` are of one generation.
    fn compact(&mut self) -> Result<(), StateError> {
        loop {
            let n = self.runs.len();
            if n < FAN_IN {
                return Ok(());
            }
            let generation = self.runs[n - 1].generation;
            if self.runs[n - FAN_IN..]
                .iter()
                .any(|r| r.generation != generation)
            {
                return Ok(());
            }
            let first = n - FAN_IN;
            // Deletes only shadow older runs; with none left they can go.
            let keep_deletes = first > 0;
            let inputs = self.runs.split_off(first);
            let entries: u64 = inputs.iter().map(|r| r.entries).sum();
            let entries = usize::try_from(entries).unwrap_or(usize::MAX);
            let merged = self.write_run(entries, generation + 1, &mut |w| {
                merge_runs(&inputs, &[], None, &mut |k, v| {
                    if v.is_some() || keep_deletes {
                        w.add(k, v)?;
                    }
                    Ok(true)
                })
            })?;
            if merged.entries == 0 {
                files::remove_path(&merged.path)?;
            } else {
                self.runs.push(merged);
            }
            for run in inputs {
                files::remove_path(&run.path)?;
            }
        }
    }
}

impl Backend for RunsBackend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.lookup(key, key_hash(key), |found| match found {
            Found::Value(v) => Some(v.to_vec()),
            Found::Absent | Found::Deleted => None,
        })
    }

    fn contains(&self, key: &[u8]) -> Result<bool, StateError> {
        self.lookup(key, key_hash(key), |found| matches!(found, Found::Value(_)))
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, f: &mut ScanFn<'_>) -> Result<(), StateError> {
        merge_runs(&self.runs, start, end, &mut |k, v| match v {
            Some(v) => f(k, v),
            None => Ok(true),
        })
    }

    fn exist(
        &self,
        keys: &[&[u8]],
        _sorted: bool,
        found: &mut Vec<bool>,
    ) -> Result<(), StateError> {
        // Run by run, newest first, each key until a run answers for it: a run's filter is
        // probed for all keys in a row, its cache line fetched a few keys ahead.
        let hashes: Vec<u64> = keys.iter().map(|k| key_hash(k)).collect();
        let mut answer = vec![Answer::Unknown; keys.len()];
        let mut cache = self.cache.borrow_mut();
        for run in self.runs.iter().rev() {
            for i in 0..keys.len() {
                if let Some(&ahead) = hashes.get(i + PREFETCH_AHEAD) {
                    run.filter.prefetch(ahead);
                }
                if answer[i] != Answer::Unknown || !run.filter.may_contain(hashes[i]) {
                    continue;
                }
                if let Some((_, e)) = run.find(keys[i], &mut cache)? {
                    answer[i] = match e.value {
                        Some(_) => Answer::Present,
                        None => Answer::Deleted,
                    };
                }
            }
        }
        found.extend(answer.iter().map(|&a| a == Answer::Present));
        Ok(())
    }

    fn get_many(
        &self,
        keys: &[&[u8]],
        _sorted: bool,
        values: &mut Vec<Option<Vec<u8>>>,
    ) -> Result<(), StateError> {
        values.reserve(keys.len());
        for key in keys {
            values.push(self.get(key)?);
        }
        Ok(())
    }

    fn apply<'a>(
        &mut self,
        changes: &mut dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<(), StateError> {
        let changes: Vec<(&[u8], Option<&[u8]>)> = changes.collect();
        if changes.is_empty() {
            return Ok(());
        }
        let sorted = changes.windows(2).all(|w| compare(w[0].0, w[1].0).is_lt());
        let mut sorted_changes;
        let changes = if sorted {
            &changes
        } else {
            // Not the store's own commits (they come from a sorted map): sort, the last write
            // of a key winning.
            sorted_changes = changes.clone();
            sorted_changes.reverse();
            sorted_changes.sort_by(|a, b| a.0.cmp(b.0));
            sorted_changes.dedup_by(|later, earlier| later.0 == earlier.0);
            &sorted_changes
        };
        // With no older run, deletes have nothing to shadow.
        let keep_deletes = !self.runs.is_empty();
        let run = self.write_run(changes.len(), 0, &mut |w| {
            for &(k, v) in changes {
                if v.is_some() || keep_deletes {
                    w.add(k, v)?;
                }
            }
            Ok(())
        })?;
        if run.entries == 0 {
            files::remove_path(&run.path)?;
        } else {
            self.runs.push(run);
        }
        self.compact()
    }

    fn reset(&mut self, snapshot: Option<&Path>) -> Result<(), StateError> {
        self.runs.clear();
        self.cache.borrow_mut().clear();
        files::remove_path(&self.dir)?;
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| StateError::io(&self.dir, "create directory", e))?;
        self.next_id = 0;
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let manifest = snapshot.join(MANIFEST);
        let bytes = std::fs::read(&manifest).map_err(|e| StateError::io(&manifest, "read", e))?;
        let listed = parse_manifest(&bytes).ok_or_else(|| {
            StateError::corrupt(&manifest, "damaged (bad magic, length or checksum)")
        })?;
        for (id, generation) in listed {
            let name = run_name(id);
            let (from, to) = (snapshot.join(&name), self.dir.join(&name));
            if !std::fs::symlink_metadata(&from).is_ok_and(|m| m.file_type().is_file()) {
                return Err(StateError::corrupt(
                    &manifest,
                    format!("it lists run {id}, which the snapshot does not hold"),
                ));
            }
            let linked = std::fs::hard_link(&from, &to).is_ok();
            if !linked {
                std::fs::copy(&from, &to).map_err(|e| StateError::io(&from, "copy", e))?;
            }
            // Errors name the snapshot's file, the one to restore. A copy is a new file, not
            // yet durable.
            let run = Run::open(to, id, generation, linked).map_err(|e| match e {
                StateError::Corrupt { reason, .. } => StateError::corrupt(&from, reason),
                other => other,
            })?;
            self.runs.push(run);
            self.next_id = self.next_id.max(id.saturating_add(1));
        }
        Ok(())
    }

    fn write_snapshot(&mut self, dir: &Path, _version: u64) -> Result<(), StateError> {
        std::fs::create_dir(dir).map_err(|e| StateError::io(dir, "create directory", e))?;
        let mut manifest = Vec::with_capacity(16 + self.runs.len() * 12);
        manifest.extend_from_slice(MANIFEST_MAGIC);
        manifest.extend_from_slice(&(self.runs.len() as u32).to_le_bytes());
        for run in &mut self.runs {
            if !run.synced {
                run.file
                    .sync_all()
                    .map_err(|e| StateError::io(&run.path, "fsync", e))?;
                run.synced = true;
            }
            let to = dir.join(run_name(run.id));
            if std::fs::hard_link(&run.path, &to).is_err() {
                std::fs::copy(&run.path, &to).map_err(|e| StateError::io(&to, "copy", e))?;
                File::open(&to)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| StateError::io(&to, "fsync", e))?;
            }
            manifest.extend_from_slice(&run.id.to_le_bytes());
            manifest.extend_from_slice(&run.generation.to_le_bytes());
        }
        let crc = crc32fast::hash(&manifest);
        manifest.extend_from_slice(&crc.to_le_bytes());
        let path = dir.join(MANIFEST);
        let mut file = files::create_new(&path)?;
        file.write_all(&manifest)
            .and_then(|()| file.sync_all())
            .map_err(|e| StateError::io(&path, "write", e))
    }

    fn memory_used_bytes(&self) -> u64 {
        let runs: usize = self.runs.iter().map(Run::memory_bytes).sum();
        (runs + self.cache.borrow().bytes()) as u64
    }
}

/// The runs a manifest lists, oldest first: `(id, generation)`.
fn parse_manifest(bytes: &[u8]) -> Option<Vec<(u64, u32)>> {
    let body = bytes.len().checked_sub(4)?;
    if bytes.get(..8)? != MANIFEST_MAGIC || crc32fast::hash(&bytes[..body]) != get_u32(bytes, body)?
    {
        return None;
    }
    let count = get_u32(bytes, 8)? as usize;
    if count.checked_mul(12)?.checked_add(12)? != body {
        return None;
    }
    let runs: Vec<(u64, u32)> = (0..count)
        .map(|i| {
            let at = 12 + i * 12;
            (
                get_u64(bytes, at).unwrap_or(0),
                get_u32(bytes, at + 8).unwrap_or(0),
            )
        })
        .collect();
    // Runs are numbered in the order they were made, so ids ascend, oldest first; a repeated
    // id would link one file over itself. Ids stay far below the counter's end.
    let ascending = runs.windows(2).all(|w| w[0].0 < w[1].0);
    let bounded = runs.iter().all(|&(id, _)| id < MAX_RUN_ID);
    (ascending && bounded).then_some(runs)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn key(i: u64) -> Vec<u8> {
        // Keys of several lengths, so that blocks hold different counts.
        let mut k = format!("k{i:06}").into_bytes();
        k.extend(std::iter::repeat_n(b'x', (i % 7) as usize));
        k
    }

    fn entries(backend: &RunsBackend, start: &[u8], end: Option<&[u8]>) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        backend
            .scan(start, end, &mut |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                Ok(true)
            })
            .unwrap();
        out
    }

    fn model_range(
        model: &BTreeMap<Vec<u8>, Vec<u8>>,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        model
            .iter()
            .filter(|(k, _)| k.as_slice() >= start && end.is_none_or(|e| k.as_slice() < e))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn check(backend: &RunsBackend, model: &BTreeMap<Vec<u8>, Vec<u8>>, rng: &mut Rng) {
        assert_eq!(entries(backend, b"", None), model_range(model, b"", None));
        let (a, b) = (key(rng.below(3000)), key(rng.below(3000)));
        let (start, end) = if a <= b { (a, b) } else { (b, a) };
        assert_eq!(
            entries(backend, &start, Some(&end)),
            model_range(model, &start, Some(&end)),
            "range {start:?}..{end:?}"
        );
        let probes: Vec<Vec<u8>> = (0..200).map(|_| key(rng.below(3000))).collect();
        let refs: Vec<&[u8]> = probes.iter().map(Vec::as_slice).collect();
        let mut found = Vec::new();
        backend.exist(&refs, false, &mut found).unwrap();
        let mut values = Vec::new();
        backend.get_many(&refs, false, &mut values).unwrap();
        for ((k, f), v) in probes.iter().zip(found).zip(values) {
            assert_eq!(f, model.contains_key(k), "{k:?}");
            assert_eq!(v.as_ref(), model.get(k), "{k:?}");
            assert_eq!(backend.get(k).unwrap().as_ref(), model.get(k), "{k:?}");
        }
    }

    /// Random batches of puts and deletes, applied as commits are (sorted, one run each), agree
    /// with an ordered map at every step: through merges of several generations, deletes that
    /// shadow older runs and are dropped when merged into the oldest, and a snapshot restored
    /// into a fresh store.
    #[test]
    fn runs_agree_with_an_ordered_map_through_merges_and_snapshots() {
        let tmp = tempfile::tempdir().unwrap();
        let mut backend = RunsBackend::open(&tmp.path().join("work")).unwrap();
        let mut model = BTreeMap::new();
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for batch in 0..70u64 {
            let mut changes: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
            for _ in 0..rng.below(400) {
                let k = key(rng.below(3000));
                if rng.below(4) == 0 {
                    changes.insert(k, None);
                } else {
                    // Values from empty to two blocks long.
                    let len = if rng.below(50) == 0 {
                        9000
                    } else {
                        rng.below(40) as usize
                    };
                    changes.insert(k, Some(vec![(batch % 251) as u8; len]));
                }
            }
            backend
                .apply(&mut changes.iter().map(|(k, v)| (k.as_slice(), v.as_deref())))
                .unwrap();
            for (k, v) in changes {
                match v {
                    Some(v) => model.insert(k, v),
                    None => model.remove(&k),
                };
            }
            check(&backend, &model, &mut rng);
            if batch == 45 {
                let snap = tmp.path().join("snap");
                backend.write_snapshot(&snap, 45).unwrap();
                let mut restored = RunsBackend::open(&tmp.path().join("work2")).unwrap();
                restored.reset(Some(&snap)).unwrap();
                check(&restored, &model, &mut rng);
                assert_eq!(
                    restored
                        .runs
                        .iter()
                        .map(|r| r.generation)
                        .collect::<Vec<_>>(),
                    backend
                        .runs
                        .iter()
                        .map(|r| r.generation)
                        .collect::<Vec<_>>()
                );
                backend = restored;
            }
        }
        // 70 commits: merges reached the third generation, and at most three runs of each
        // generation remain.
        let generations: Vec<u32> = backend.runs.iter().map(|r| r.generation).collect();
        assert!(generations.iter().any(|&g| g >= 2), "{generations:?}");
        assert!(
            generations.windows(2).all(|w| w[0] >= w[1]),
            "{generations:?}"
        );
        for g in 0..4 {
            assert!(generations.iter().filter(|&&x| x == g).count() < FAN_IN);
        }
        // Only the runs on the list are on disk.
        let on_disk = std::fs::read_dir(&backend.dir).unwrap().count();
        assert_eq!(on_disk, backend.runs.len());
    }

    #[test]
    fn keys_compare_as_byte_strings_do() {
        let mut rng = Rng(0x00c0_ffee_1234_5678);
        let alphabet = [0u8, 1, 0x7f, 0x80, 0xff];
        for _ in 0..50_000 {
            let len = rng.below(40) as usize;
            let a: Vec<u8> = (0..len).map(|_| alphabet[rng.below(5) as usize]).collect();
            // `b` is `a` with one byte changed, or cut short, or made longer: keys that agree
            // for many 8-byte steps and differ in any position of any step, or not at all.
            let mut b = a.clone();
            match rng.below(4) {
                0 if !b.is_empty() => {
                    let at = rng.below(b.len() as u64) as usize;
                    b[at] = alphabet[rng.below(5) as usize];
                }
                1 => b.truncate(rng.below(len as u64 + 1) as usize),
                2 => b.extend((0..=rng.below(9)).map(|_| alphabet[rng.below(5) as usize])),
                _ => {}
            }
            assert_eq!(compare(&a, &b), a.cmp(&b), "{a:?} {b:?}");
            assert_eq!(compare(&b, &a), b.cmp(&a), "{b:?} {a:?}");
        }
    }

    /// Commits that are not sorted (replays of other writers) are sorted, the last write of a
    /// key winning.
    #[test]
    fn unsorted_changes_keep_the_last_write() {
        let tmp = tempfile::tempdir().unwrap();
        let mut backend = RunsBackend::open(&tmp.path().join("work")).unwrap();
        let writes: [(&[u8], Option<&[u8]>); 4] = [
            (b"b", Some(b"1")),
            (b"a", Some(b"2")),
            (b"b", Some(b"3")),
            (b"c", None),
        ];
        backend.apply(&mut writes.into_iter()).unwrap();
        assert_eq!(
            entries(&backend, b"", None),
            vec![
                (b"a".to_vec(), b"2".to_vec()),
                (b"b".to_vec(), b"3".to_vec())
            ]
        );
        assert!(backend.runs[0].filter.bytes() >= FILTER_BLOCK);
        backend.apply(&mut [(&b"a"[..], None)].into_iter()).unwrap();
        assert!(!backend.contains(b"a").unwrap());
        assert!(backend.contains(b"b").unwrap());
    }

    /// The filter answers "absent" for most keys it never saw, and never for a key it holds.
    #[test]
    fn the_filter_has_no_false_negatives_and_few_false_positives() {
        let mut filter = Filter::for_entries(10_000);
        for i in 0..10_000u64 {
            filter.insert(key_hash(&key(i)));
        }
        assert!((0..10_000u64).all(|i| filter.may_contain(key_hash(&key(i)))));
        let false_positives = (10_000..110_000u64)
            .filter(|&i| filter.may_contain(key_hash(&key(i))))
            .count();
        // About 1 % at 10 bits an entry.
        assert!(false_positives < 2_000, "{false_positives} of 100,000");
    }

    fn snapshot_of_two_runs(tmp: &Path) -> (PathBuf, PathBuf) {
        let mut backend = RunsBackend::open(&tmp.join("work")).unwrap();
        for batch in 0..2u64 {
            let keys: Vec<Vec<u8>> = (0..500).map(|i| key(batch * 1000 + i)).collect();
            backend
                .apply(&mut keys.iter().map(|k| (k.as_slice(), Some(&b"v"[..]))))
                .unwrap();
        }
        let snap = tmp.join("snap");
        backend.write_snapshot(&snap, 1).unwrap();
        let run = snap.join(run_name(backend.runs[0].id));
        (snap, run)
    }

    fn reset_error(tmp: &Path, snap: &Path) -> String {
        let mut backend = RunsBackend::open(&tmp.join("other")).unwrap();
        let err = backend.reset(Some(snap)).unwrap_err();
        assert!(
            matches!(err, StateError::Corrupt { .. } | StateError::Io { .. }),
            "{err}"
        );
        err.to_string()
    }

    /// A snapshot is hostile input: a flipped byte in a run, a run cut short, a damaged
    /// manifest or one that lists a run twice is an error naming the file, never a panic or a
    /// wrong answer.
    #[test]
    fn damaged_snapshots_are_errors_that_name_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (snap, run) = snapshot_of_two_runs(tmp.path());
        let original = std::fs::read(&run).unwrap();
        // Each of these damages the run in a different place: a block, the index, the footer.
        for at in [
            10,
            original.len() - 60,
            original.len() - 20,
            original.len() - 3,
        ] {
            let mut bytes = original.clone();
            bytes[at] ^= 0x40;
            std::fs::remove_file(&run).unwrap();
            std::fs::write(&run, &bytes).unwrap();
            let text = reset_error(tmp.path(), &snap);
            assert!(text.contains(&run.display().to_string()), "{text}");
        }
        for len in [0, 20, original.len() - 1] {
            std::fs::remove_file(&run).unwrap();
            std::fs::write(&run, &original[..len]).unwrap();
            let text = reset_error(tmp.path(), &snap);
            assert!(text.contains(&run.display().to_string()), "{text}");
        }
        std::fs::remove_file(&run).unwrap();
        std::fs::write(&run, &original).unwrap();
        let manifest = snap.join(MANIFEST);
        let listed = std::fs::read(&manifest).unwrap();
        let mut damaged = listed.clone();
        damaged[13] ^= 1;
        std::fs::write(&manifest, &damaged).unwrap();
        let text = reset_error(tmp.path(), &snap);
        assert!(text.contains(&manifest.display().to_string()), "{text}");
        // The second run listed as the first one again, with a valid checksum.
        let mut twice = listed[..listed.len() - 4].to_vec();
        let first = twice[12..20].to_vec();
        twice[24..32].copy_from_slice(&first);
        let crc = crc32fast::hash(&twice);
        twice.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(&manifest, &twice).unwrap();
        let text = reset_error(tmp.path(), &snap);
        assert!(text.contains("damaged"), "{text}");
        // The undamaged snapshot still loads, and the run file is unchanged.
        std::fs::write(&manifest, &listed).unwrap();
        let mut backend = RunsBackend::open(&tmp.path().join("good")).unwrap();
        backend.reset(Some(&snap)).unwrap();
        assert_eq!(entries(&backend, b"", None).len(), 1000);
        assert_eq!(std::fs::read(&run).unwrap(), original);
    }
}
