//! The one file format of the state store: a header, length-prefixed put/delete records and a
//! trailer with the record count, the row count and a checksum.
//!
//! Why it exists: changelogs are the durable record of every committed version and must be
//! recognisably whole before anything is applied from them. A file cut short by a crash or damaged
//! on disk fails its checksum or its record count and is reported as corrupt, naming the file,
//! instead of silently yielding half a batch. The same format carries the memory store's snapshot
//! dump and the metadata file of every snapshot, so there is one parser to trust.
//!
//! Layout (integers little-endian):
//!
//! ```text
//! header   "WEIRST01" | file kind u8 | store kind u8 | version u64 | has parent u8 | parent u64
//! records  1 | key len u32 | key | value len u32 | value      (put)
//!          2 | key len u32 | key                             (delete)
//! trailer  0xFF | record count u64 | row count u64 | FNV-1a 64 of every byte before it
//! ```

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use super::{StateError, StoreKind};
use crate::fnv;

const MAGIC: &[u8; 8] = b"WEIRST01";
const HEADER_LEN: usize = 8 + 1 + 1 + 8 + 1 + 8;
const TRAILER_LEN: usize = 1 + 8 + 8 + 8;
const OP_PUT: u8 = 1;
const OP_DELETE: u8 = 2;
const OP_END: u8 = 0xFF;

/// What a record file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileKind {
    /// The changes of one committed version.
    Changelog = 1,
    /// Every entry of a version (the memory store's snapshot).
    Dump = 2,
    /// A snapshot's version and row count (no records).
    SnapshotMeta = 3,
}

/// The fixed header of a record file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub kind: FileKind,
    /// The store that wrote it; `None` for files any store can read (changelogs).
    pub store: Option<StoreKind>,
    /// The state version the file describes.
    pub version: u64,
    /// For a changelog: the version it was applied on top of (`None`: the empty state).
    pub parent: Option<u64>,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(MAGIC);
        out[8] = self.kind as u8;
        out[9] = match self.store {
            None => 0,
            Some(StoreKind::Memory) => 1,
            Some(StoreKind::RocksDb) => 2,
            Some(StoreKind::Runs) => 3,
        };
        out[10..18].copy_from_slice(&self.version.to_le_bytes());
        out[18] = u8::from(self.parent.is_some());
        out[19..27].copy_from_slice(&self.parent.unwrap_or(0).to_le_bytes());
        out
    }

    fn decode(bytes: &[u8], file: &Path) -> Result<Self, StateError> {
        if bytes.len() < HEADER_LEN {
            return Err(StateError::corrupt(file, "shorter than the file header"));
        }
        if &bytes[..8] != MAGIC {
            return Err(StateError::corrupt(
                file,
                "not a Weir state file (bad magic)",
            ));
        }
        let kind = match bytes[8] {
            1 => FileKind::Changelog,
            2 => FileKind::Dump,
            3 => FileKind::SnapshotMeta,
            other => {
                return Err(StateError::corrupt(
                    file,
                    format!("unknown file kind {other}"),
                ));
            }
        };
        let store = match bytes[9] {
            0 => None,
            1 => Some(StoreKind::Memory),
            2 => Some(StoreKind::RocksDb),
            3 => Some(StoreKind::Runs),
            other => {
                return Err(StateError::corrupt(
                    file,
                    format!("unknown store kind {other}"),
                ));
            }
        };
        let parent = match bytes[18] {
            0 => None,
            1 => Some(le_u64(&bytes[19..27])),
            other => {
                return Err(StateError::corrupt(
                    file,
                    format!("bad parent flag {other}"),
                ));
            }
        };
        Ok(Self {
            kind,
            store,
            version: le_u64(&bytes[10..18]),
            parent,
        })
    }
}

/// Reads a little-endian u64 from exactly 8 bytes.
fn le_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(buf)
}

fn le_u32(bytes: &[u8]) -> u32 {
    let mut buf = [0u8; 4];
    buf.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(buf)
}

/// Streams records into a new file, hashing as it goes.
#[derive(Debug)]
pub(super) struct RecordWriter {
    out: BufWriter<File>,
    hash: u64,
    records: u64,
    bytes: u64,
}

impl RecordWriter {
    /// Writes the header to `file` (which must be new and empty).
    pub fn new(file: File, header: &Header) -> std::io::Result<Self> {
        let mut writer = Self {
            out: BufWriter::with_capacity(256 * 1024, file),
            hash: fnv::OFFSET,
            records: 0,
            bytes: 0,
        };
        writer.write(&header.encode())?;
        Ok(writer)
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.hash = fnv::extend(self.hash, bytes);
        self.bytes += bytes.len() as u64;
        self.out.write_all(bytes)
    }

    fn write_len(&mut self, len: usize) -> std::io::Result<()> {
        let len = u32::try_from(len).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a state key or value is larger than 4 GiB",
            )
        })?;
        self.write(&len.to_le_bytes())
    }

    /// Appends one record: `Some(value)` is a put, `None` a delete.
    pub fn record(&mut self, key: &[u8], value: Option<&[u8]>) -> std::io::Result<()> {
        match value {
            Some(value) => {
                self.write(&[OP_PUT])?;
                self.write_len(key.len())?;
                self.write(key)?;
                self.write_len(value.len())?;
                self.write(value)?;
            }
            None => {
                self.write(&[OP_DELETE])?;
                self.write_len(key.len())?;
                self.write(key)?;
            }
        }
        self.records += 1;
        Ok(())
    }

    /// Writes the trailer, flushes and fsyncs. Returns the file size in bytes.
    pub fn finish(mut self, rows_total: u64) -> std::io::Result<u64> {
        let mut trailer = [0u8; TRAILER_LEN - 8];
        trailer[0] = OP_END;
        trailer[1..9].copy_from_slice(&self.records.to_le_bytes());
        trailer[9..17].copy_from_slice(&rows_total.to_le_bytes());
        self.write(&trailer)?;
        let checksum = self.hash.to_le_bytes();
        self.out.write_all(&checksum)?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(self.bytes + 8)
    }
}

/// A whole record file, read and verified.
#[derive(Debug)]
pub(super) struct RecordFile {
    pub header: Header,
    /// The row count the writer recorded (rows of the state after this version).
    pub rows_total: u64,
    data: Vec<u8>,
}

impl RecordFile {
    /// The file's size in bytes, as read.
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// Reads `file` and checks its header kind, checksum, record structure and record count.
    pub fn read(file: &Path, expected: FileKind) -> Result<Self, StateError> {
        let mut data = Vec::new();
        File::open(file)
            .and_then(|mut f| f.read_to_end(&mut data))
            .map_err(|e| StateError::io(file, "read", e))?;
        let header = Header::decode(&data, file)?;
        if header.kind != expected {
            return Err(StateError::corrupt(
                file,
                format!("is a {:?} file, expected {expected:?}", header.kind),
            ));
        }
        if data.len() < HEADER_LEN + TRAILER_LEN {
            return Err(StateError::corrupt(
                file,
                format!(
                    "truncated: {} bytes, shorter than header and trailer",
                    data.len()
                ),
            ));
        }
        let sum_at = data.len() - 8;
        if fnv::hash(&data[..sum_at]) != le_u64(&data[sum_at..]) {
            return Err(StateError::corrupt(
                file,
                "checksum mismatch (torn or damaged file)",
            ));
        }
        let trailer = data.len() - TRAILER_LEN;
        if data[trailer] != OP_END {
            return Err(StateError::corrupt(file, "missing end-of-records marker"));
        }
        let count = le_u64(&data[trailer + 1..trailer + 9]);
        let rows_total = le_u64(&data[trailer + 9..trailer + 17]);
        let found = Records::new(&data[HEADER_LEN..trailer], file)
            .try_fold(0u64, |n, r| r.map(|_| n + 1))?;
        if found != count {
            return Err(StateError::corrupt(
                file,
                format!("holds {found} records, its trailer says {count}"),
            ));
        }
        Ok(Self {
            header,
            rows_total,
            data,
        })
    }

    /// The records in file order as `(key, Some(value))` for a put, `(key, None)` for a delete.
    pub fn records(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let body = &self.data[HEADER_LEN..self.data.len() - TRAILER_LEN];
        // `read` parsed every record successfully, so the errors filtered here cannot occur.
        Records::new(body, Path::new("")).map_while(Result::ok)
    }
}

/// Reads only the header of `file` (to follow a changelog's parent without reading its records).
pub(super) fn read_header(file: &Path) -> Result<Header, StateError> {
    let mut bytes = [0u8; HEADER_LEN];
    File::open(file)
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => {
                StateError::corrupt(file, "shorter than the file header")
            }
            _ => StateError::io(file, "read", e),
        })?;
    Header::decode(&bytes, file)
}

/// Parses records from a body (the bytes between header and trailer).
struct Records<'a> {
    body: &'a [u8],
    pos: usize,
    file: &'a Path,
}

impl<'a> Records<'a> {
    fn new(body: &'a [u8], file: &'a Path) -> Self {
        Self { body, pos: 0, file }
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], StateError> {
        let end = self.pos.checked_add(len).filter(|&e| e <= self.body.len());
        match end {
            Some(end) => {
                let out = &self.body[self.pos..end];
                self.pos = end;
                Ok(out)
            }
            None => Err(StateError::corrupt(
                self.file,
                format!(
                    "record at byte {} runs past the end of the records",
                    HEADER_LEN + self.pos
                ),
            )),
        }
    }

    fn take_sized(&mut self) -> Result<&'a [u8], StateError> {
        let len = le_u32(self.take(4)?) as usize;
        self.take(len)
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<(&'a [u8], Option<&'a [u8]>), StateError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.body.len() {
            return None;
        }
        let at = self.pos;
        let op = self.body[at];
        self.pos += 1;
        let record = match op {
            OP_PUT => self
                .take_sized()
                .and_then(|k| self.take_sized().map(|v| (k, Some(v)))),
            OP_DELETE => self.take_sized().map(|k| (k, None)),
            other => Err(StateError::corrupt(
                self.file,
                format!("unknown record type {other} at byte {}", HEADER_LEN + at),
            )),
        };
        if record.is_err() {
            // Stop after the first error.
            self.pos = self.body.len();
        }
        Some(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, records: &[(&[u8], Option<&[u8]>)]) -> u64 {
        let header = Header {
            kind: FileKind::Changelog,
            store: None,
            version: 7,
            parent: Some(6),
        };
        let mut w = RecordWriter::new(File::create(path).unwrap(), &header).unwrap();
        for (k, v) in records {
            w.record(k, *v).unwrap();
        }
        w.finish(42).unwrap()
    }

    #[test]
    fn round_trip_and_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.changelog");
        let size = write(&path, &[(b"a", Some(b"1")), (b"b", None), (b"", Some(b""))]);
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        let file = RecordFile::read(&path, FileKind::Changelog).unwrap();
        assert_eq!(file.rows_total, 42);
        assert_eq!(file.header.version, 7);
        assert_eq!(file.header.parent, Some(6));
        let got: Vec<_> = file.records().collect();
        assert_eq!(
            got,
            vec![
                (&b"a"[..], Some(&b"1"[..])),
                (&b"b"[..], None),
                (&b""[..], Some(&b""[..]))
            ]
        );
        assert_eq!(read_header(&path).unwrap().parent, Some(6));
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.changelog");
        write(&path, &[(b"key-1", Some(b"value-1")), (b"key-2", None)]);
        let whole = std::fs::read(&path).unwrap();
        for cut in 0..whole.len() {
            std::fs::write(&path, &whole[..cut]).unwrap();
            let err = RecordFile::read(&path, FileKind::Changelog).unwrap_err();
            assert!(
                matches!(&err, StateError::Corrupt { file, .. } if file == &path),
                "cut at {cut}: {err}"
            );
        }
        for at in 0..whole.len() {
            let mut bad = whole.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                RecordFile::read(&path, FileKind::Changelog).is_err(),
                "flip at {at}"
            );
        }
    }

    #[test]
    fn wrong_kind_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.changelog");
        write(&path, &[]);
        let err = RecordFile::read(&path, FileKind::Dump).unwrap_err();
        assert!(err.to_string().contains("7.changelog"), "{err}");
        assert!(err.to_string().contains("expected Dump"), "{err}");
    }
}
