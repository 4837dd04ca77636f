//! A folder of files as a stream, like Spark's file source: each batch takes
//! the files not seen before, oldest modification time first (then by
//! name), at most `max_files_per_trigger` of them. The files a batch takes
//! are recorded in its `offsets/N` entry before the batch runs, so that a
//! replay reads exactly the same files — and the same bytes: the size
//! recorded then is what is read, even if a file grew since.
//!
//! Which files were ever taken must outlive the offsets log, which keeps only
//! the last 100 batches: every [`LOG_EVERY`] batches the source writes the
//! files taken since its previous entry to its own log (`sources/<i>/<N>`).
//! Opening reads that log and the offsets entries after its last entry. Spark
//! writes a source log entry every batch (and compacts the log every ten); one
//! entry per fifty batches spares a batch a file to create, fsync and later
//! delete, the largest part of a small batch's cost (BENCHMARKS.md §11).
//! A checkpoint written before the lists moved to `offsets/N` has a source
//! log entry for every batch, and reads as before.
//!
//! JSON-lines and CSV files are decoded line by line ([`Decoder`]); Parquet files whole
//! ([`ParquetDecoder`]), from the recorded bytes too (a Parquet file rewritten since no longer
//! reads as one, and fails the batch naming it).
//!
//! With more than one thread, decoding is most of a small batch's work but only part of it:
//! the operator, the sink and the commit come after it, on the batch's thread and whatever
//! helpers the query's thread budget has free. So while they run, the other threads decode
//! the files the next batch will most likely take ([`FilesSource::read_ahead`]); it has the
//! helpers first, and gives each back as soon as its part of the decoding is done.
//! Nothing about the next batch is decided by that: its files are still chosen and recorded
//! first, and a read-ahead of other files (or of the same names with other sizes) is dropped.
//!
//! The lists are input like any other: an entry naming a file outside the
//! folder (a path, `..`), a file twice, or more bytes than the file holds is
//! refused as [`CheckpointError::Corrupt`] naming the entry, before anything
//! is read.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::{Recorded, Source, SourceBatch};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::decode::{DecodeError, Decoded, Decoder, ParquetDecoder, Part};
use crate::threads::{Helper, Threads, lock};

/// One file a batch reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// The file's name inside the source folder.
    pub name: String,
    /// Bytes to read: the size when the batch was planned.
    pub size: u64,
    /// Modification time (ms since the epoch) when the batch was planned.
    pub mtime_ms: i64,
}

/// How many batches may take files before the source log gets an entry; below the
/// query's offsets retention, so that no file list is only in a purged entry.
pub(crate) const LOG_EVERY: u64 = 50;

/// The key of a files source's part of `offsets/N` that lists the batch's files.
const RECORDED_FILES: &str = "files";

/// A source log entry (`sources/<i>/<N>`): the files taken by the batches since the
/// previous entry, up to and including batch N (before the lists moved to `offsets/N`:
/// by batch N alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesLogEntry {
    pub files: Vec<FileEntry>,
}

impl FilesLogEntry {
    /// Refuses an entry that names a file outside the source folder (a name
    /// that is empty, absolute, or has a path separator or `..`) or one
    /// file twice; `entry` is the log file, named in the error.
    fn check(&self, entry: &Path) -> Result<(), CheckpointError> {
        let mut names = HashSet::with_capacity(self.files.len());
        for file in &self.files {
            if let Err(why) = check_name(&file.name) {
                return Err(CheckpointError::corrupt(
                    entry,
                    format!(
                        "file name {:?} {why}; a source log names files inside the source folder only",
                        file.name
                    ),
                ));
            }
            if !names.insert(file.name.as_str()) {
                return Err(CheckpointError::corrupt(
                    entry,
                    format!("file {:?} is listed twice", file.name),
                ));
            }
        }
        Ok(())
    }
}

/// Why `name` is not the name of a file directly inside a folder, if it is not.
fn check_name(name: &str) -> Result<(), &'static str> {
    use std::path::Component;
    if name.is_empty() {
        return Err("is empty");
    }
    if name.contains('\0') {
        return Err("contains a NUL byte");
    }
    if name.contains('/') || name.contains(std::path::MAIN_SEPARATOR) {
        return Err("has a path separator");
    }
    let mut components = Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(n)), None) if n == std::ffi::OsStr::new(name) => Ok(()),
        (Some(Component::ParentDir | Component::CurDir), None) => Err("is `..` or `.`"),
        _ => Err("is not a plain file name"),
    }
}

/// A files source failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("source {source_name}: cannot list {}: {error}", dir.display())]
    List {
        source_name: String,
        dir: PathBuf,
        error: std::io::Error,
    },
    #[error("source {source_name}: cannot read {}: {error}", file.display())]
    Read {
        source_name: String,
        file: PathBuf,
        error: std::io::Error,
    },
    #[error("source {source_name}: {} holds {actual} bytes, but batch {batch_id} recorded {expected}; the input was changed under the query", file.display())]
    Shrunk {
        source_name: String,
        file: PathBuf,
        batch_id: u64,
        expected: u64,
        actual: u64,
    },
    #[error(
        "source {source_name}: batch {batch_id} has no entry in the source log; the checkpoint is damaged"
    )]
    MissingLog { source_name: String, batch_id: u64 },
    /// A real-time batch's parts, as `offsets/N` records them, do not fit its input.
    #[error(
        "source {source_name}: batch {batch_id}: the parts recorded in offsets/{batch_id} {problem}; the checkpoint is damaged"
    )]
    Parts {
        source_name: String,
        batch_id: u64,
        problem: String,
    },
    /// The source has no schema: none declared, and none to take from its files.
    #[error("source {source_name}: {reason}")]
    NoSchema { source_name: String, reason: String },
    #[error("source {source_name}: {error}")]
    Decode {
        source_name: String,
        error: DecodeError,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Kafka(#[from] Box<super::kafka::KafkaSourceError>),
    #[error(transparent)]
    Delta(#[from] Box<super::delta::DeltaSourceError>),
}

impl SourceError {
    /// Whether reading the batch again may succeed: I/O and broker trouble may pass;
    /// changed input, damaged logs and bad records do not. Every variant is listed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Read { .. } => true,
            Self::Kafka(e) => e.is_retryable(),
            Self::Delta(e) => e.is_retryable(),
            Self::List { .. }
            | Self::Parts { .. }
            | Self::Shrunk { .. }
            | Self::MissingLog { .. }
            | Self::NoSchema { .. }
            | Self::Decode { .. }
            | Self::Checkpoint(_) => false,
        }
    }
}

/// How a files source decodes its files.
#[allow(
    clippy::large_enum_variant,
    reason = "one per source, made once: boxing would cost a pointer chase per file for nothing"
)]
#[derive(Debug)]
pub enum FileDecoder {
    /// JSON lines or CSV, line by line.
    Lines(Decoder),
    /// Parquet, whole files.
    Parquet(ParquetDecoder),
}

impl From<Decoder> for FileDecoder {
    fn from(decoder: Decoder) -> Self {
        Self::Lines(decoder)
    }
}

impl From<ParquetDecoder> for FileDecoder {
    fn from(decoder: ParquetDecoder) -> Self {
        Self::Parquet(decoder)
    }
}

impl FileDecoder {
    /// A decoder of the same files with buffers of its own, for another thread.
    fn fork(&self) -> Self {
        match self {
            Self::Lines(d) => Self::Lines(d.fork()),
            Self::Parquet(d) => Self::Parquet(d.clone()),
        }
    }

    /// The parts `input` can be decoded in on threads of their own ([`Decoder::parts`]); a
    /// Parquet file is one part.
    fn parts(&self, input: &[u8]) -> Vec<Part> {
        match self {
            Self::Lines(d) => d.parts(input),
            Self::Parquet(_) => vec![Part {
                range: 0..input.len(),
                header: false,
            }],
        }
    }

    /// Decodes `part` of the file `input`, named `origin` ([`Decoder::decode_part`]). A
    /// Parquet part is the whole file, copied out of `input`: read whole files into a buffer
    /// of their own instead (see `BatchFiles::read`).
    fn decode_part(
        &mut self,
        input: &[u8],
        part: &Part,
        origin: &str,
        out: &mut Decoded,
    ) -> Result<(), DecodeError> {
        match self {
            Self::Lines(d) => d.decode_part(input, part, origin, out),
            Self::Parquet(d) => d.decode(
                bytes::Bytes::copy_from_slice(&input[part.range.clone()]),
                origin,
                out,
            ),
        }
    }

    /// The schema of the batches decoded.
    pub fn output_schema(&self) -> &arrow_schema::SchemaRef {
        match self {
            Self::Lines(d) => d.output_schema(),
            Self::Parquet(d) => d.output_schema(),
        }
    }
}

/// The decoder of a `format = "parquet"` source without a declared schema: the schema is the
/// Parquet footer's of the folder's first file in the order batches take files (oldest
/// modification time first, then by name; hidden and `_` files left out), whether or not a
/// batch took it already — on a restart, the file batch 0 read while it is still there.
///
/// # Errors
/// [`SourceError::NoSchema`] when the folder has no file yet; when it cannot be listed, the
/// file cannot be opened, or its footer names a column no Weir type holds.
pub fn infer_parquet(
    source_name: &str,
    dir: &Path,
    batch_size: usize,
) -> Result<ParquetDecoder, SourceError> {
    let files = list_files(dir, &HashSet::new()).map_err(|error| SourceError::List {
        source_name: source_name.to_owned(),
        dir: dir.to_path_buf(),
        error,
    })?;
    let Some(first) = files.first() else {
        return Err(SourceError::NoSchema {
            source_name: source_name.to_owned(),
            reason: format!(
                "format = \"parquet\" without `schema` takes its schema from the first file, \
                 and {} has none yet: declare `schema` in the pipeline file, or start the query \
                 once a file is there",
                dir.display()
            ),
        });
    };
    let path = dir.join(&first.name);
    let file = std::fs::File::open(&path).map_err(|error| SourceError::Read {
        source_name: source_name.to_owned(),
        file: path.clone(),
        error,
    })?;
    ParquetDecoder::infer(file, &path.display().to_string(), batch_size).map_err(|error| {
        SourceError::Decode {
            source_name: source_name.to_owned(),
            error,
        }
    })
}

/// The files of `dir` not in `seen`, in the order batches take them: oldest modification
/// time first, then by name. Hidden and `_`-prefixed files (in progress, or metadata) and
/// anything but plain files are left out; a folder that does not exist has no files.
fn list_files(dir: &Path, seen: &HashSet<String>) -> std::io::Result<Vec<FileEntry>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        // A folder that does not exist yet simply has no files.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Hidden and underscore files are in-progress or metadata, as in Spark.
        if name.starts_with('.') || name.starts_with('_') || seen.contains(&name) {
            continue;
        }
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        let mtime_ms = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        files.push(FileEntry {
            name,
            size: meta.len(),
            mtime_ms,
        });
    }
    files.sort_by(|a, b| {
        a.mtime_ms
            .cmp(&b.mtime_ms)
            .then_with(|| a.name.cmp(&b.name))
    });
    Ok(files)
}

/// A folder of files read as a stream.
#[derive(Debug)]
pub struct FilesSource {
    name: String,
    index: usize,
    dir: PathBuf,
    max_files: Option<NonZeroUsize>,
    seen: HashSet<String>,
    decoder: FileDecoder,
    dead_letter: Option<PathBuf>,
    /// What the next batch takes, chosen by [`Source::poll`].
    staged: Vec<FileEntry>,
    /// Available-now: the files present when the trigger started.
    frozen: Option<Vec<FileEntry>>,
    /// Files present and not yet taken at the last poll (Spark's latestOffset, in files).
    backlog: usize,
    /// This thread's read buffer, kept between batches (a fresh one per file costs a page
    /// fault per 4 KB read): the piece of a JSON-lines or CSV file being decoded, or a whole
    /// Parquet file.
    buf: Vec<u8>,
    /// Files taken since the last source log entry, and by how many batches.
    unlogged: Vec<FileEntry>,
    batches_unlogged: u64,
    /// The batch of the last [`Source::record`]: a real-time batch records one part after
    /// another under one id, and the source log gets at most one entry per id.
    last_recorded: Option<u64>,
    /// The query's threads, which decode a batch's files (this one included).
    threads: Threads,
    /// The other threads' decoders and read buffers, made when first needed (lent to a
    /// decoding under way).
    workers: Vec<(FileDecoder, Vec<u8>)>,
    /// Files after those the last poll staged, in the order batches take them.
    upcoming: Vec<FileEntry>,
    /// The next batch's likely files, being decoded ([`Self::read_ahead`]).
    ahead: Option<Decoding>,
    /// Batches whose files a read-ahead decoded.
    ahead_used: u64,
}

/// What reading one file of a batch needs to know, shared by the threads decoding the batch.
#[derive(Debug, Clone)]
struct BatchFiles {
    name: String,
    dir: PathBuf,
    /// The offsets entry that lists the files.
    entry: PathBuf,
    batch_id: u64,
}

impl BatchFiles {
    /// Reads `file` into `buf`.
    fn load(&self, file: &FileEntry, buf: &mut Vec<u8>) -> Result<(), SourceError> {
        let path = self.dir.join(&file.name);
        read_prefix(&path, file.size, buf).map_err(|e| self.read_error(file, &path, e))
    }

    /// What a failed read of `file` (at `path`) is to the batch.
    fn read_error(&self, file: &FileEntry, path: &Path, error: ReadError) -> SourceError {
        match error {
            ReadError::Io(error) => SourceError::Read {
                source_name: self.name.clone(),
                file: path.to_path_buf(),
                error,
            },
            ReadError::TooLarge(actual) => SourceError::Checkpoint(CheckpointError::corrupt(
                &self.entry,
                format!(
                    "batch {} records {} bytes of {}, which holds {actual} bytes \
                     (the entry was altered, or the file truncated under the query)",
                    self.batch_id,
                    file.size,
                    path.display()
                ),
            )),
            ReadError::Short(actual) => SourceError::Shrunk {
                source_name: self.name.clone(),
                file: path.to_path_buf(),
                batch_id: self.batch_id,
                expected: file.size,
                actual,
            },
        }
    }

    /// How errors and dead letters name `file`.
    fn origin(&self, file: &FileEntry) -> String {
        self.dir.join(&file.name).display().to_string()
    }

    fn decode_error(&self, error: DecodeError) -> SourceError {
        SourceError::Decode {
            source_name: self.name.clone(),
            error,
        }
    }

    /// Reads `file` into `buf` and decodes it into `decoded`.
    fn read(
        &self,
        decoder: &mut FileDecoder,
        file: &FileEntry,
        buf: &mut Vec<u8>,
        decoded: &mut Decoded,
    ) -> Result<(), SourceError> {
        let decoder = match decoder {
            FileDecoder::Lines(decoder) => return self.read_in_pieces(decoder, file, buf, decoded),
            FileDecoder::Parquet(decoder) => decoder,
        };
        self.load(file, buf)?;
        let origin = self.origin(file);
        // The recorded bytes, handed over without a copy (the buffer is not reused).
        decoder
            .decode(bytes::Bytes::from(std::mem::take(buf)), &origin, decoded)
            .map_err(|error| self.decode_error(error))
    }

    /// Reads `file` a piece of about [`PIECE_BYTES`] at a time into `buf` and decodes each
    /// piece's whole lines while they are in the cache ([`Decoder::decode_piece`]): the rows,
    /// counts and errors are those of the whole file decoded at once, with one exception: a
    /// file that shrinks while it is read fails with the first error met, so a malformed
    /// line under `fail` before the missing bytes is reported instead of
    /// [`SourceError::Shrunk`] (which a whole read reports). A cut-off last line is never
    /// decoded.
    fn read_in_pieces(
        &self,
        decoder: &mut Decoder,
        file: &FileEntry,
        buf: &mut Vec<u8>,
        decoded: &mut Decoded,
    ) -> Result<(), SourceError> {
        let path = self.dir.join(&file.name);
        let origin = self.origin(file);
        let mut reader =
            open_prefix(&path, file.size).map_err(|e| self.read_error(file, &path, e))?;
        let mut pieces = decoder.start_pieces();
        // `buf[..filled]` is read and not yet decoded: the start of a line at most.
        let mut filled = 0;
        let mut total = 0u64;
        loop {
            let read = grow(buf, filled + PIECE_BYTES)
                .and_then(|()| read_full(&mut reader, &mut buf[filled..filled + PIECE_BYTES]));
            let read = match read {
                Ok(read) => read,
                Err(error) => {
                    decoder.cancel_pieces(pieces);
                    return Err(self.read_error(file, &path, ReadError::Io(error)));
                }
            };
            let fresh = filled;
            filled += read;
            total += read as u64;
            let last = read < PIECE_BYTES;
            if last && total < file.size {
                // The file shrank under the batch: its cut-off last line is not decoded.
                decoder.cancel_pieces(pieces);
                return Err(self.read_error(file, &path, ReadError::Short(total)));
            }
            let end = if last {
                filled
            } else {
                // The bytes kept from before hold no line end.
                match memchr::memrchr(b'\n', &buf[fresh..filled]) {
                    Some(k) => fresh + k + 1,
                    // A line longer than what was read of it: read on.
                    None => continue,
                }
            };
            pieces = decoder
                .decode_piece(pieces, &buf[..end], &origin)
                .map_err(|error| self.decode_error(error))?;
            buf.copy_within(end..filled, 0);
            filled -= end;
            if last {
                break;
            }
        }
        decoder
            .finish_pieces(pieces, &origin, decoded)
            .map_err(|error| self.decode_error(error))
    }
}

/// One unit of a [`Job`] and what decoding it gave.
type UnitResult = (usize, Result<Decoded, SourceError>);

/// A batch's files, decoded by several threads that take units of work one at a time in
/// order: whole files, or (with fewer files than threads) parts of files that start where a
/// batch starts ([`Decoder::parts`]), read first by whichever thread comes first. Each unit is
/// decoded into a result of its own. No unit past one that failed is started, so the results
/// up to the first error are all there.
#[derive(Debug)]
struct Job {
    batch: BatchFiles,
    files: Vec<FileEntry>,
    /// Parts of files rather than whole files.
    split: bool,
    /// With `split`: the files read, and their parts.
    loaded: OnceLock<Loaded>,
    /// With `split`: the buffers to read the files into.
    spare: Mutex<Vec<Vec<u8>>>,
    next: AtomicUsize,
    failed_at: AtomicUsize,
    /// Set when the job's result is not wanted after all: no file is read and no unit starts
    /// after it. (A stopped job is only ever cancelled, never finished.)
    stop: AtomicBool,
}

/// The files of a split [`Job`], read, and their parts.
#[derive(Debug)]
struct Loaded {
    texts: Vec<Vec<u8>>,
    units: Vec<(usize, Part)>,
    origins: Vec<String>,
    /// Why the file after the last of `texts` could not be read.
    read_error: Mutex<Option<SourceError>>,
}

impl Job {
    /// Takes units on this thread, with `decoder` (and `buf` for whole files), until none is
    /// left; returns what it decoded.
    fn work(&self, decoder: &mut FileDecoder, buf: &mut Vec<u8>) -> Vec<UnitResult> {
        let mut done = Vec::new();
        if self.stop.load(Ordering::Relaxed) {
            return done;
        }
        let loaded = self
            .split
            .then(|| self.loaded.get_or_init(|| self.load(decoder)));
        let units = loaded.map_or(self.files.len(), |l| l.units.len());
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return done;
            }
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= units || i > self.failed_at.load(Ordering::Relaxed) {
                return done;
            }
            let mut one = Decoded::default();
            let result = match loaded {
                None => self.batch.read(decoder, &self.files[i], buf, &mut one),
                Some(loaded) => {
                    let (f, part) = &loaded.units[i];
                    decoder
                        .decode_part(&loaded.texts[*f], part, &loaded.origins[*f], &mut one)
                        .map_err(|error| self.batch.decode_error(error))
                }
            };
            if result.is_err() {
                self.failed_at.fetch_min(i, Ordering::Relaxed);
            }
            done.push((i, result.map(|()| one)));
        }
    }

    /// Reads the files of a split job (up to the first that cannot be read, or until the job
    /// is stopped) and cuts them into parts.
    fn load(&self, decoder: &FileDecoder) -> Loaded {
        let mut spare = std::mem::take(&mut *lock(&self.spare));
        let mut texts = Vec::with_capacity(self.files.len());
        let mut read_error = None;
        for file in &self.files {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let mut text = spare.pop().unwrap_or_default();
            if let Err(error) = self.batch.load(file, &mut text) {
                spare.push(text);
                read_error = Some(error);
                break;
            }
            texts.push(text);
        }
        *lock(&self.spare) = spare;
        let units = (0..texts.len())
            .flat_map(|f| decoder.parts(&texts[f]).into_iter().map(move |p| (f, p)))
            .collect();
        let origins = self.files[..texts.len()]
            .iter()
            .map(|f| self.batch.origin(f))
            .collect();
        Loaded {
            texts,
            units,
            origins,
            read_error: Mutex::new(read_error),
        }
    }
}

/// A worker lent to a helper thread: its decoder and read buffer.
type Worker = (FileDecoder, Vec<u8>);

/// A helper thread of a [`Decoding`]: its worker, back, and what it decoded. (Its place in the
/// query's thread budget is given back when the thread ends.)
type HelperThread = std::thread::JoinHandle<(Worker, Vec<UnitResult>)>;

/// A [`Job`] under way on helper threads. The thread that wants the batch joins in with
/// [`Decoding::finish`]; a read-ahead that is not wanted is stopped and its workers taken
/// back with [`Decoding::cancel`] (or on drop).
struct Decoding {
    job: Arc<Job>,
    helpers: Vec<HelperThread>,
}

impl std::fmt::Debug for Decoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoding")
            .field("batch_id", &self.job.batch.batch_id)
            .field("files", &self.job.files.len())
            .field("helpers", &self.helpers.len())
            .finish()
    }
}

/// A finished [`Decoding`]: each unit's result in unit order (`None` after the first error),
/// the workers and the buffers the files were read into, to keep for the next batch.
struct Finished {
    results: Vec<Option<Result<Decoded, SourceError>>>,
    read_error: Option<SourceError>,
    workers: Vec<Worker>,
    buffers: Vec<Vec<u8>>,
}

impl Finished {
    /// Forgets what was decoded, keeping the workers and buffers.
    fn discard(&mut self) {
        self.results.clear();
        self.read_error = None;
    }

    /// Whether every unit decoded and every file was read.
    fn complete(&self) -> bool {
        self.read_error.is_none() && self.results.iter().all(|r| matches!(r, Some(Ok(_))))
    }

    /// Appends the results to `decoded` in order, up to the first error; a file that could
    /// not be read fails the batch after the errors of those before it.
    fn join_in_order(&mut self, decoded: &mut Decoded) -> Result<(), SourceError> {
        for result in std::mem::take(&mut self.results) {
            match result {
                Some(Ok(one)) => decoded.append(one),
                Some(Err(error)) => return Err(error),
                // Only after an error, which came first.
                None => break,
            }
        }
        self.read_error.take().map_or(Ok(()), Err)
    }
}

impl Decoding {
    /// Starts `job` on one thread per worker, each holding its place in the query's budget.
    fn start(job: Job, workers: Vec<(Worker, Helper)>) -> Self {
        let job = Arc::new(job);
        let helpers = workers
            .into_iter()
            .filter_map(|((mut decoder, mut buf), place)| {
                let job = Arc::clone(&job);
                // A thread that cannot be started leaves its units to the others (and its
                // worker is made again for the next batch).
                std::thread::Builder::new()
                    .name("weir-decode".into())
                    .spawn(move || {
                        let done = job.work(&mut decoder, &mut buf);
                        drop(place);
                        ((decoder, buf), done)
                    })
                    .ok()
            })
            .collect();
        Self { job, helpers }
    }

    /// Whether this decodes exactly `files`.
    fn decodes(&self, files: &[FileEntry]) -> bool {
        self.job.files == files
    }

    /// Takes units on this thread (with `decoder` and `buf`) until none is left, then waits
    /// for the helpers (a helper's panic is this thread's).
    fn finish(mut self, decoder: &mut FileDecoder, buf: &mut Vec<u8>) -> Finished {
        let mine = self.job.work(decoder, buf);
        self.join(mine, true)
    }

    /// Stops the job after the units under way, and takes its workers and buffers back.
    fn cancel(mut self) -> Finished {
        self.job.stop.store(true, Ordering::Relaxed);
        let mut finished = self.join(Vec::new(), false);
        finished.discard();
        finished
    }

    /// Waits for the helpers. A helper that panicked is forgotten with its worker (a new one
    /// is made when needed); with `propagate`, once every helper is joined (the others told
    /// to stop), its panic is resumed here. Without, a read-ahead nobody wants does not fail
    /// the batch that drops it.
    fn join(&mut self, mine: Vec<UnitResult>, propagate: bool) -> Finished {
        let mut workers = Vec::with_capacity(self.helpers.len());
        let mut done = mine;
        let mut panicked = None;
        for helper in self.helpers.drain(..) {
            match helper.join() {
                Ok((worker, theirs)) => {
                    workers.push(worker);
                    done.extend(theirs);
                }
                Err(panic) => {
                    self.job.stop.store(true, Ordering::Relaxed);
                    panicked.get_or_insert(panic);
                }
            }
        }
        if let Some(panic) = panicked.filter(|_| propagate) {
            std::panic::resume_unwind(panic);
        }
        let units = done.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
        let mut results: Vec<Option<Result<Decoded, SourceError>>> =
            std::iter::repeat_with(|| None).take(units).collect();
        for (i, result) in done {
            results[i] = Some(result);
        }
        let read_error = self
            .job
            .loaded
            .get()
            .and_then(|loaded| lock(&loaded.read_error).take());
        // The helpers are gone, so the job is this thread's alone and its buffers come back.
        let buffers = match Arc::get_mut(&mut self.job) {
            Some(job) => {
                let mut buffers: Vec<Vec<u8>> = std::mem::take(&mut *lock(&job.spare));
                if let Some(loaded) = job.loaded.take() {
                    buffers.extend(loaded.texts);
                }
                buffers
            }
            None => Vec::new(),
        };
        Finished {
            results,
            read_error,
            workers,
            buffers,
        }
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        if !self.helpers.is_empty() {
            self.job.stop.store(true, Ordering::Relaxed);
            self.join(Vec::new(), false);
        }
    }
}

/// A read buffer larger than this is released after its batch.
const KEEP_BUFFER_BYTES: usize = 64 * 1024 * 1024;

/// A read-ahead decodes at most this many bytes of files: the next batch's rows wait in
/// memory beside the current batch's.
const READ_AHEAD_BYTES: u64 = 64 * 1024 * 1024;

impl FilesSource {
    /// Reads and decodes `files`, one batch's, as `batch` names them (the files already
    /// checked by [`FilesLogEntry::check`]).
    ///
    /// With more than one thread, the files are a [`Job`] for this thread and the query's
    /// free ones: the batch's rows, its sub-batches, counts, dead letters and first error are
    /// those of one thread reading the files in turn. A read-ahead of the same files
    /// ([`Self::read_ahead`]) is finished instead of starting again; one that failed is
    /// dropped, and the files read again here, so that an error is always this batch's own.
    fn read_files(
        &mut self,
        files: &[FileEntry],
        batch: BatchFiles,
        buf: &mut Vec<u8>,
        decoded: &mut Decoded,
    ) -> Result<(), SourceError> {
        match self.ahead.take() {
            Some(ahead) if ahead.decodes(files) => {
                let mut finished = ahead.finish(&mut self.decoder, buf);
                if finished.complete() {
                    self.ahead_used += 1;
                    let result = finished.join_in_order(decoded);
                    self.keep(finished, buf);
                    return result;
                }
                finished.discard();
                self.keep(finished, buf);
            }
            Some(ahead) => {
                let finished = ahead.cancel();
                self.keep(finished, buf);
            }
            None => {}
        }
        if self.threads.get() <= 1 || files.is_empty() {
            for file in files {
                batch.read(&mut self.decoder, file, buf, decoded)?;
            }
            return Ok(());
        }
        let decoding = self.start(batch, files.to_vec(), buf, false);
        let mut finished = decoding.finish(&mut self.decoder, buf);
        let result = finished.join_in_order(decoded);
        self.keep(finished, buf);
        result
    }

    /// Starts decoding `files` on the query's free threads: to be finished on this one, or,
    /// `ahead`, by the next batch (then a file can have a helper of its own).
    fn start(
        &mut self,
        batch: BatchFiles,
        files: Vec<FileEntry>,
        buf: &mut Vec<u8>,
        ahead: bool,
    ) -> Decoding {
        let threads = self.threads.get();
        let lines = matches!(self.decoder, FileDecoder::Lines(_));
        let split = lines && files.len() < threads;
        let want = match (split, ahead) {
            (true, _) => threads - 1,
            (false, false) => threads.min(files.len()) - 1,
            (false, true) => (threads - 1).min(files.len()),
        };
        let places = self.threads.helpers(want);
        while self.workers.len() < places.len() {
            self.workers.push((self.decoder.fork(), Vec::new()));
        }
        let mut workers: Vec<Worker> = self.workers.drain(..places.len()).collect();
        // Parts of files are decoded from the files' bytes: the threads' buffers hold them.
        let mut spare = Vec::new();
        if split {
            spare.push(std::mem::take(buf));
            spare.extend(workers.iter_mut().map(|(_, b)| std::mem::take(b)));
        }
        Decoding::start(
            Job {
                batch,
                files,
                split,
                loaded: OnceLock::new(),
                spare: Mutex::new(spare),
                next: AtomicUsize::new(0),
                failed_at: AtomicUsize::new(usize::MAX),
                stop: AtomicBool::new(false),
            },
            workers.into_iter().zip(places).collect(),
        )
    }

    /// Takes back a finished job's workers and buffers; buffers above
    /// [`KEEP_BUFFER_BYTES`] are released.
    fn keep(&mut self, finished: Finished, buf: &mut Vec<u8>) {
        let mut buffers = finished
            .buffers
            .into_iter()
            .filter(|b| b.capacity() > 0 && b.capacity() <= KEEP_BUFFER_BYTES);
        if buf.capacity() == 0 {
            *buf = buffers.next().unwrap_or_default();
        }
        for (decoder, mut b) in finished.workers {
            if b.capacity() > KEEP_BUFFER_BYTES {
                b = Vec::new();
            }
            if b.capacity() == 0 {
                b = buffers.next().unwrap_or_default();
            }
            self.workers.push((decoder, b));
        }
    }

    /// Starts decoding the files the next batch will most likely take, on the query's free
    /// threads, while the query runs batch `batch_id`: the first files after this batch's in
    /// the last listing (all of them when the trigger froze the listing). Only after a batch
    /// this source planned (not a replay), with a cap on the files a batch takes, at most
    /// [`READ_AHEAD_BYTES`] of them and a thread free; the next batch uses it only if it
    /// takes exactly those files.
    fn read_ahead(&mut self, checkpoint: &Checkpoint, batch_id: u64) {
        let Some(max) = self.max_files else { return };
        if self.threads.get() <= 1 || self.last_recorded != Some(batch_id) {
            return;
        }
        let next: Vec<FileEntry> = self
            .upcoming
            .iter()
            .filter(|f| !self.seen.contains(&f.name))
            .take(max.get())
            .cloned()
            .collect();
        if next.is_empty() || next.iter().map(|f| f.size).sum::<u64>() > READ_AHEAD_BYTES {
            return;
        }
        let batch = BatchFiles {
            name: self.name.clone(),
            dir: self.dir.clone(),
            entry: checkpoint.offsets().entry_path(batch_id + 1),
            batch_id: batch_id + 1,
        };
        let mut buf = std::mem::take(&mut self.buf);
        let decoding = self.start(batch, next, &mut buf, true);
        self.buf = buf;
        if decoding.helpers.is_empty() {
            // No thread was free: the next batch reads its files itself.
            self.drop_ahead(decoding);
        } else {
            self.ahead = Some(decoding);
        }
    }

    /// Stops a read-ahead and keeps its workers and buffers.
    fn drop_ahead(&mut self, ahead: Decoding) {
        let finished = ahead.cancel();
        let mut buf = std::mem::take(&mut self.buf);
        self.keep(finished, &mut buf);
        self.buf = buf;
    }

    /// Opens the source, learning from the checkpoint which files earlier
    /// batches took: the source log, then the offsets entries after its last
    /// entry. Log entries past `last_planned` (a crash between writing the
    /// source log and the offsets log) are dropped: that batch was never
    /// planned, and the batches before it keep their lists in `offsets/N`.
    ///
    /// # Errors
    /// When the source log or an offsets entry cannot be read, or a batch's
    /// files are recorded in neither.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site (source::open); each is a distinct setting"
    )]
    pub fn open(
        name: String,
        index: usize,
        dir: PathBuf,
        max_files: Option<NonZeroUsize>,
        decoder: impl Into<FileDecoder>,
        dead_letter: Option<PathBuf>,
        checkpoint: &Checkpoint,
        last_planned: Option<u64>,
    ) -> Result<Self, SourceError> {
        let log = checkpoint.source_log(index);
        let mut seen = HashSet::new();
        let mut last_logged = None;
        for id in log.ids()? {
            if last_planned.is_none_or(|last| id > last) {
                log.remove(id)?;
                continue;
            }
            let entry: Option<FilesLogEntry> = log.get(id)?;
            if let Some(entry) = entry {
                entry.check(&log.entry_path(id))?;
                seen.extend(entry.files.into_iter().map(|f| f.name));
            }
            last_logged = Some(id);
        }
        let mut unlogged = Vec::new();
        let mut batches_unlogged = 0;
        let first = last_logged.map_or(0, |l: u64| l.saturating_add(1));
        if let Some(last) = last_planned.filter(|&last| last >= first) {
            let offsets = checkpoint.offsets();
            let ids: Vec<u64> = offsets
                .ids()?
                .into_iter()
                .filter(|id| (first..=last).contains(id))
                .collect();
            // Every batch after the last log entry has its offsets entry (they are
            // retained for longer than LOG_EVERY batches).
            if ids.len() as u64 != last - first + 1 {
                let missing = (first..)
                    .zip(&ids)
                    .find(|(want, got)| want != *got)
                    .map_or(first + ids.len() as u64, |(want, _)| want);
                return Err(CheckpointError::corrupt(
                    &offsets.entry_path(missing),
                    format!(
                        "batch {missing} was planned, but neither this offsets entry nor the \
                         source log of {name:?} records its files"
                    ),
                )
                .into());
            }
            for id in ids {
                let files = recorded_files(checkpoint, index, id, &name)?;
                seen.extend(files.iter().map(|f| f.name.clone()));
                unlogged.extend(files);
                batches_unlogged += 1;
            }
        }
        Ok(Self {
            name,
            index,
            dir,
            max_files,
            seen,
            decoder: decoder.into(),
            dead_letter,
            staged: Vec::new(),
            frozen: None,
            backlog: 0,
            buf: Vec::new(),
            unlogged,
            batches_unlogged,
            last_recorded: None,
            threads: Threads::default(),
            workers: Vec::new(),
            upcoming: Vec::new(),
            ahead: None,
            ahead_used: 0,
        })
    }

    /// Decodes a batch's files on this thread and the free ones of `threads` (on this one
    /// alone until this is called).
    #[must_use]
    pub fn with_threads(mut self, threads: Threads) -> Self {
        self.threads = threads;
        self
    }

    /// Files present and not yet taken, in the order batches take them.
    ///
    /// # Errors
    /// When the folder cannot be listed.
    pub fn list_new(&self) -> Result<Vec<FileEntry>, SourceError> {
        list_files(&self.dir, &self.seen).map_err(|error| SourceError::List {
            source_name: self.name.clone(),
            dir: self.dir.clone(),
            error,
        })
    }

    /// The files batch `batch_id` took, from its offsets entry (`recorded`) or, in a
    /// checkpoint written before the lists moved there, from the source log; and the
    /// entry's file.
    ///
    /// # Errors
    /// When the entry is missing or unreadable, or names a file outside the
    /// source folder ([`CheckpointError::Corrupt`]).
    pub fn planned(
        &self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        recorded: &Recorded,
    ) -> Result<(Vec<FileEntry>, PathBuf), SourceError> {
        if let Some(files) = recorded.get(RECORDED_FILES) {
            let path = checkpoint.offsets().entry_path(batch_id);
            let entry = FilesLogEntry {
                files: parse_files(files, &path, &self.name)?,
            };
            entry.check(&path)?;
            return Ok((entry.files, path));
        }
        let log = checkpoint.source_log(self.index);
        let path = log.entry_path(batch_id);
        let entry: FilesLogEntry = log.get(batch_id)?.ok_or_else(|| SourceError::MissingLog {
            source_name: self.name.clone(),
            batch_id,
        })?;
        entry.check(&path)?;
        Ok((entry.files, path))
    }
}

impl Source for FilesSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        format!("FileStreamSource[{}]", self.dir.display())
    }

    fn schema(&self) -> &arrow_schema::SchemaRef {
        self.decoder.output_schema()
    }

    fn freeze_available(&mut self) -> Result<(), SourceError> {
        self.frozen = Some(self.list_new()?);
        Ok(())
    }

    fn poll(&mut self, _checkpoint: &Checkpoint, unlimited: bool) -> Result<u64, SourceError> {
        let candidates = match &mut self.frozen {
            Some(frozen) => {
                frozen.retain(|f| !self.seen.contains(&f.name));
                frozen.clone()
            }
            None => self.list_new()?,
        };
        let n = match (unlimited, self.max_files) {
            (false, Some(max)) => max.get().min(candidates.len()),
            _ => candidates.len(),
        };
        self.backlog = candidates.len();
        self.staged = candidates;
        self.upcoming = self.staged.split_off(n);
        Ok(n as u64)
    }

    fn record(&mut self, checkpoint: &Checkpoint, batch_id: u64) -> Result<Recorded, SourceError> {
        let files = std::mem::take(&mut self.staged);
        let listed = serde_json::to_value(&files).map_err(|source| CheckpointError::Encode {
            file: checkpoint.offsets().entry_path(batch_id),
            source,
        })?;
        let mut recorded = Recorded::new();
        recorded.insert(RECORDED_FILES.into(), listed);
        let before = self.unlogged.len();
        self.unlogged.extend(files.iter().cloned());
        let new_batch = self.last_recorded != Some(batch_id);
        self.last_recorded = Some(batch_id);
        if !new_batch {
            // Another part of a real-time batch: logged with a later batch.
        } else if self.batches_unlogged + 1 >= LOG_EVERY {
            let entry = FilesLogEntry {
                files: std::mem::take(&mut self.unlogged),
            };
            if let Err(e) = checkpoint.source_log(self.index).put(batch_id, &entry) {
                // Not taken: the next poll lists them again.
                self.unlogged = entry.files;
                self.unlogged.truncate(before);
                return Err(e.into());
            }
            self.batches_unlogged = 0;
        } else {
            self.batches_unlogged += 1;
        }
        // Only now are its files taken (the query writes `offsets/N` next; a crash
        // before that forgets them again at open).
        self.backlog = self.backlog.saturating_sub(files.len());
        self.seen.extend(files.into_iter().map(|f| f.name));
        Ok(recorded)
    }

    fn read(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        recorded: &Recorded,
    ) -> Result<SourceBatch, SourceError> {
        let (files, entry) = self.planned(checkpoint, batch_id, recorded)?;
        let batch = BatchFiles {
            name: self.name.clone(),
            dir: self.dir.clone(),
            entry,
            batch_id,
        };
        let mut decoded = Decoded::default();
        let mut buf = std::mem::take(&mut self.buf);
        let result = self.read_files(&files, batch, &mut buf, &mut decoded);
        if buf.capacity() <= KEEP_BUFFER_BYTES {
            self.buf = buf;
        }
        result?;
        self.read_ahead(checkpoint, batch_id);
        let mut metrics = BTreeMap::new();
        metrics.insert("numFiles", files.len().to_string());
        metrics.insert("numMalformedRows", decoded.num_malformed.to_string());
        metrics.insert("numFilesBehindLatest", self.backlog.to_string());
        Ok(SourceBatch {
            decoded,
            start_offset: batch_id
                .checked_sub(1)
                .map(|p| serde_json::json!({ "logOffset": p })),
            end_offset: serde_json::json!({ "logOffset": batch_id }),
            latest_offset: serde_json::json!({ "logOffset": batch_id }),
            metrics,
        })
    }

    /// The read-ahead is dropped: the query stops, or the batch's parts are replayed.
    fn end_parts(&mut self) {
        if let Some(ahead) = self.ahead.take() {
            self.drop_ahead(ahead);
        }
        self.upcoming.clear();
    }

    fn dead_letter_dir(&self) -> Option<&Path> {
        self.dead_letter.as_deref()
    }

    fn join_parts(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        parts: Vec<Recorded>,
    ) -> Result<(Recorded, serde_json::Value), SourceError> {
        if parts.is_empty() {
            self.staged.clear();
            return Ok((self.record(checkpoint, batch_id)?, serde_json::json!([])));
        }
        let mut files = Vec::new();
        let mut counts = Vec::with_capacity(parts.len());
        for part in parts {
            let Some(serde_json::Value::Array(list)) = part.get(RECORDED_FILES).cloned() else {
                return Err(SourceError::Parts {
                    source_name: self.name.clone(),
                    batch_id,
                    problem: "lack a file list".to_owned(),
                });
            };
            counts.push(list.len());
            files.extend(list);
        }
        let mut whole = Recorded::new();
        whole.insert(RECORDED_FILES.into(), serde_json::Value::Array(files));
        Ok((whole, serde_json::json!(counts)))
    }

    fn split_parts(
        &self,
        batch_id: u64,
        whole: &Recorded,
        cuts: &serde_json::Value,
    ) -> Result<Vec<Recorded>, SourceError> {
        let problem = |p: &str| SourceError::Parts {
            source_name: self.name.clone(),
            batch_id,
            problem: p.to_owned(),
        };
        let files = match whole.get(RECORDED_FILES) {
            Some(serde_json::Value::Array(files)) => files,
            _ => return Err(problem("lack the batch's file list")),
        };
        let counts: Vec<usize> = serde_json::from_value(cuts.clone())
            .map_err(|_| problem("are not a list of file counts"))?;
        if counts.iter().sum::<usize>() != files.len() {
            return Err(problem(&format!(
                "count {} files, but the batch has {}",
                counts.iter().sum::<usize>(),
                files.len()
            )));
        }
        let mut at = 0;
        Ok(counts
            .into_iter()
            .map(|n| {
                let mut part = Recorded::new();
                part.insert(
                    RECORDED_FILES.into(),
                    serde_json::Value::Array(files[at..at + n].to_vec()),
                );
                at += n;
                part
            })
            .collect())
    }
}

enum ReadError {
    Io(std::io::Error),
    /// The file holds fewer bytes (this many) than the size to read.
    TooLarge(u64),
    /// The file held enough bytes when opened but fewer (this many) were read.
    Short(u64),
}

/// The files that `offsets/<batch_id>` records for source `index`.
fn recorded_files(
    checkpoint: &Checkpoint,
    index: usize,
    batch_id: u64,
    name: &str,
) -> Result<Vec<FileEntry>, SourceError> {
    let offsets = checkpoint.offsets();
    let path = offsets.entry_path(batch_id);
    let entry: serde_json::Value = offsets.get(batch_id)?.unwrap_or_default();
    let files = entry
        .get("sources")
        .and_then(|s| s.get(index))
        .and_then(|s| s.get(RECORDED_FILES))
        .ok_or_else(|| {
            CheckpointError::corrupt(
                &path,
                format!(
                    "it records no files for source {name:?}, and the source log has no entry \
                     for batch {batch_id}"
                ),
            )
        })?;
    let entry = FilesLogEntry {
        files: parse_files(files, &path, name)?,
    };
    entry.check(&path)?;
    Ok(entry.files)
}

/// A recorded list of files, or why `path` does not hold one.
fn parse_files(
    files: &serde_json::Value,
    path: &Path,
    name: &str,
) -> Result<Vec<FileEntry>, SourceError> {
    Vec::<FileEntry>::deserialize(files).map_err(|e| {
        CheckpointError::corrupt(
            path,
            format!("the files of source {name:?} are not a list of files: {e}"),
        )
        .into()
    })
}

/// Bytes read at a time when a file is decoded as it is read (`BatchFiles::read_in_pieces`).
/// A piece this size stays in the core's cache between the copy out of the page cache and
/// the scanner. Read whole into one buffer, the file's text went out of the cache with the
/// copy and came back for the scanner: the copy was 5.0 % of the CPU of files → JSON →
/// Parquet with files of 1.5 MB read whole, 3.5 % in pieces (BENCHMARKS §13.5).
const PIECE_BYTES: usize = 128 * 1024;

/// The first `size` bytes of `path`, to read. The size comes from the checkpoint, so it is
/// checked against the file's length first.
fn open_prefix(path: &Path, size: u64) -> Result<std::io::Take<std::fs::File>, ReadError> {
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let len = file.metadata().map_err(ReadError::Io)?.len();
    if size > len {
        return Err(ReadError::TooLarge(len));
    }
    Ok(file.take(size))
}

/// Makes `buf` at least `len` bytes long (zeros added), or says that memory ran out.
fn grow(buf: &mut Vec<u8>, len: usize) -> std::io::Result<()> {
    if let Some(more) = len.checked_sub(buf.len()).filter(|&n| n > 0) {
        buf.try_reserve(more).map_err(out_of_memory)?;
        buf.resize(len, 0);
    }
    Ok(())
}

/// A reservation the allocator refused, as the read error it is.
fn out_of_memory(error: std::collections::TryReserveError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::OutOfMemory, error)
}

/// Reads into `buf` until it is full or `reader` ends; how many bytes it read.
fn read_full(reader: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut read = 0;
    while read < buf.len() {
        match reader.read(&mut buf[read..]) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(read)
}

/// Reads the first `size` bytes of `path` into `buf`. The size comes from
/// the checkpoint, so it is checked against the file's length before any
/// memory is reserved for it.
fn read_prefix(path: &Path, size: u64, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    buf.clear();
    let mut reader = open_prefix(path, size)?;
    buf.try_reserve(usize::try_from(size).unwrap_or(usize::MAX))
        .map_err(|e| ReadError::Io(out_of_memory(e)))?;
    reader.read_to_end(buf).map_err(ReadError::Io)?;
    if (buf.len() as u64) < size {
        return Err(ReadError::Short(buf.len() as u64));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::decode::{DecoderOptions, MalformedPolicy};

    /// A source over `dir/in`, checkpoint in `dir/cp`, after one batch (0) took `a.json`.
    fn setup(dir: &Path) -> Checkpoint {
        std::fs::create_dir_all(dir.join("in")).unwrap();
        std::fs::write(dir.join("in/a.json"), "{\"id\":1}\n{\"id\":2}\n").unwrap();
        std::fs::write(dir.join("outside.json"), "{\"id\":666}\n").unwrap();
        let checkpoint = Checkpoint::open(&dir.join("cp")).unwrap();
        let mut source = open(dir, &checkpoint, None).unwrap();
        assert_eq!(source.poll(&checkpoint, false).unwrap(), 1);
        plan(&mut source, &checkpoint, 0);
        checkpoint
    }

    /// Records batch `n` and writes its offsets entry, as the query does.
    fn plan(source: &mut FilesSource, checkpoint: &Checkpoint, n: u64) {
        let recorded = source.record(checkpoint, n).unwrap();
        checkpoint
            .offsets()
            .put(n, &serde_json::json!({ "sources": [recorded] }))
            .unwrap();
    }

    /// What batch `n`'s offsets entry records for the source.
    fn recorded(checkpoint: &Checkpoint, n: u64) -> Recorded {
        let entry: serde_json::Value = checkpoint.offsets().get(n).unwrap().unwrap();
        serde_json::from_value(entry["sources"][0].clone()).unwrap()
    }

    /// Edits the files that batch 0's offsets entry records; returns the entry's path.
    fn edit_files(checkpoint: &Checkpoint, edit: impl FnOnce(&mut Vec<FileEntry>)) -> PathBuf {
        let offsets = checkpoint.offsets();
        let mut entry: serde_json::Value = offsets.get(0).unwrap().unwrap();
        let mut files: Vec<FileEntry> =
            serde_json::from_value(entry["sources"][0]["files"].clone()).unwrap();
        edit(&mut files);
        entry["sources"][0]["files"] = serde_json::to_value(files).unwrap();
        let path = offsets.entry_path(0);
        std::fs::remove_file(&path).unwrap();
        offsets.put(0, &entry).unwrap();
        path
    }

    fn open(
        dir: &Path,
        checkpoint: &Checkpoint,
        last: Option<u64>,
    ) -> Result<FilesSource, SourceError> {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        FilesSource::open(
            "orders".into(),
            0,
            dir.join("in"),
            None,
            Decoder::new(schema, DecoderOptions::default()).unwrap(),
            None,
            checkpoint,
            last,
        )
    }

    /// Rewrites the name and size of the first file that batch 0 records.
    fn tamper(checkpoint: &Checkpoint, name: &str, size: Option<u64>) -> PathBuf {
        edit_files(checkpoint, |files| {
            files[0].name = name.to_owned();
            if let Some(size) = size {
                files[0].size = size;
            }
        })
    }

    fn assert_corrupt(err: &SourceError, entry: &Path, reason: &str) {
        let SourceError::Checkpoint(CheckpointError::Corrupt { file, reason: why }) = err else {
            panic!("expected Corrupt, got {err:?}");
        };
        assert_eq!(file, entry);
        assert!(why.contains(reason), "{why}");
    }

    #[test]
    fn names_outside_the_folder_are_corrupt_at_open_and_at_read() {
        let absolute = tempfile::tempdir().unwrap().path().join("outside.json");
        let absolute = absolute.display().to_string();
        for (name, reason) in [
            (absolute.as_str(), "has a path separator"),
            ("../outside.json", "has a path separator"),
            ("..", "is `..` or `.`"),
            (".", "is `..` or `.`"),
            ("", "is empty"),
            ("a\0b", "NUL"),
            ("sub/a.json", "has a path separator"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let checkpoint = setup(dir.path());
            // Opened before the damage: reading the entry refuses it.
            let mut source = open(dir.path(), &checkpoint, Some(0)).unwrap();
            let entry = tamper(&checkpoint, name, None);
            let err = source
                .read(&checkpoint, 0, &recorded(&checkpoint, 0))
                .unwrap_err();
            assert_corrupt(&err, &entry, reason);
            assert!(err.to_string().contains(&format!("{name:?}")), "{err}");
            // Opened after it: refused before anything is read.
            let err = open(dir.path(), &checkpoint, Some(0)).unwrap_err();
            assert_corrupt(&err, &entry, reason);
        }
    }

    /// What reading a batch gave: its rows as JSON values, its sub-batches' sizes, its input
    /// and malformed counts, its dead letters (file, line).
    type BatchRead = (
        Vec<serde_json::Value>,
        Vec<usize>,
        u64,
        u64,
        Vec<(String, u64)>,
    );

    /// Batch 0 of nine files (two with a malformed line) read with `policy` on `threads`
    /// threads, or the error.
    fn read_nine(threads: usize, policy: MalformedPolicy) -> Result<BatchRead, String> {
        let files = (0..9)
            .map(|f| {
                let mut text = String::new();
                for r in 0..(1 + f * 700) {
                    if (f == 3 || f == 6) && r == 5 {
                        text.push_str("{\"id\": oops}\n");
                    }
                    text.push_str(&format!("{{\"id\":{}}}\n", f * 10_000 + r));
                }
                text
            })
            .collect();
        read_batch(files, threads, policy)
    }

    /// A source over `texts` written as `dir/in/f0.json`, ... (oldest first, in name order),
    /// decoding `{"id": …}` lines with `policy` into batches of 1,000 rows on `threads`
    /// threads, taking at most `max_files` a batch; its checkpoint in `dir/cp`.
    fn source_over(
        dir: &Path,
        texts: &[String],
        threads: usize,
        max_files: Option<usize>,
        policy: MalformedPolicy,
    ) -> (Checkpoint, FilesSource) {
        let input = dir.join("in");
        std::fs::create_dir_all(&input).unwrap();
        for (f, text) in texts.iter().enumerate() {
            let path = input.join(format!("f{f}.json"));
            std::fs::write(&path, text).unwrap();
            let mtime = std::time::SystemTime::UNIX_EPOCH
                + std::time::Duration::from_secs(1_000_000 + f as u64);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
        }
        let checkpoint = Checkpoint::open(&dir.join("cp")).unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let options = DecoderOptions {
            policy,
            // Several batches per file, so that the order of batches shows.
            batch_size: 1000,
            ..DecoderOptions::default()
        };
        let source = FilesSource::open(
            "orders".into(),
            0,
            input,
            max_files.and_then(NonZeroUsize::new),
            Decoder::new(schema, options).unwrap(),
            None,
            &checkpoint,
            None,
        )
        .unwrap()
        .with_threads(Threads::new(NonZeroUsize::new(threads).unwrap()));
        (checkpoint, source)
    }

    /// The rows of `batches` as JSON objects, in order.
    fn json_rows(batches: &[RecordBatch]) -> Vec<serde_json::Value> {
        let mut rows = Vec::new();
        for b in batches {
            let mut json = arrow_json::ArrayWriter::new(Vec::new());
            json.write(b).unwrap();
            json.finish().unwrap();
            rows.extend(
                serde_json::from_slice::<Vec<serde_json::Value>>(&json.into_inner()).unwrap(),
            );
        }
        rows
    }

    /// Batch 0 of `files` (named `f0.json`, ...) read with `policy` on `threads` threads.
    fn read_batch(
        files: Vec<String>,
        threads: usize,
        policy: MalformedPolicy,
    ) -> Result<BatchRead, String> {
        let count = files.len();
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let (checkpoint, mut source) = source_over(dir.path(), &files, threads, None, policy);
        assert_eq!(source.poll(&checkpoint, false).unwrap(), count as u64);
        plan(&mut source, &checkpoint, 0);
        let batch = source
            .read(&checkpoint, 0, &recorded(&checkpoint, 0))
            .map_err(|e| e.to_string().replace(&input.display().to_string(), "IN"))?;
        // The other threads' decoders were made and kept: the batch was read on them (on
        // every thread when there are fewer files than threads).
        let used = if count < threads {
            threads
        } else {
            threads.min(count)
        };
        assert_eq!(source.workers.len(), used - 1);
        let decoded = batch.decoded;
        let sizes = decoded.batches.iter().map(RecordBatch::num_rows).collect();
        assert!(decoded.batches.iter().all(|b| b.num_rows() <= 1000));
        let rows = json_rows(&decoded.batches);
        let letters = decoded
            .malformed
            .iter()
            .map(|m| (m.origin.replace(&input.display().to_string(), "IN"), m.line))
            .collect();
        Ok((
            rows,
            sizes,
            decoded.num_input_rows,
            decoded.num_malformed,
            letters,
        ))
    }

    #[test]
    fn threads_decode_a_batch_as_one_thread_does() {
        for policy in [
            MalformedPolicy::Permissive,
            MalformedPolicy::Drop,
            MalformedPolicy::DeadLetter,
            MalformedPolicy::Fail,
        ] {
            let one = read_nine(1, policy);
            for threads in [2, 3, 16] {
                assert_eq!(
                    read_nine(threads, policy),
                    one,
                    "{policy:?}, {threads} threads"
                );
            }
            match policy {
                MalformedPolicy::Fail => {
                    // The first malformed line in file order, whichever thread met it.
                    let err = one.unwrap_err();
                    assert!(err.contains("IN/f3.json:6"), "{err}");
                }
                _ => {
                    let (rows, _, input, malformed, letters) = one.unwrap();
                    assert_eq!(input, (0..9).map(|f| 1 + f * 700).sum::<u64>() + 2);
                    assert_eq!(malformed, 2);
                    let kept = if policy == MalformedPolicy::Permissive {
                        2
                    } else {
                        0
                    };
                    assert_eq!(rows.len() as u64, input - 2 + kept);
                    assert_eq!(rows[0]["id"], 0);
                    assert_eq!(rows.last().unwrap()["id"], 80_000 + 8 * 700);
                    if policy == MalformedPolicy::DeadLetter {
                        assert_eq!(
                            letters,
                            [("IN/f3.json".to_owned(), 6), ("IN/f6.json".to_owned(), 6)]
                        );
                    }
                }
            }
        }
    }

    /// A batch's rows as JSON, its input and malformed counts and its sub-batches' sizes, or
    /// its error.
    type BatchOutcome = Result<(Vec<serde_json::Value>, u64, u64, Vec<u64>), String>;

    /// Each batch of a source taking `per_batch` files a batch from `texts` (named `f0.json`,
    /// ...), read with `policy` on `threads` threads: its rows as JSON and its counts, or the
    /// error; and how many batches a read-ahead served. `between(n, dir)` runs after batch `n`
    /// was read, before batch `n + 1` is planned; `frozen`: as with `available-now`, the
    /// files listed at the start.
    fn read_batches(
        texts: &[String],
        threads: usize,
        per_batch: usize,
        frozen: bool,
        policy: MalformedPolicy,
        between: impl Fn(&FilesSource, u64, &Path),
    ) -> (Vec<BatchOutcome>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let (checkpoint, mut source) =
            source_over(dir.path(), texts, threads, Some(per_batch), policy);
        if frozen {
            source.freeze_available().unwrap();
        }
        let mut out = Vec::new();
        for n in 0.. {
            if source.poll(&checkpoint, false).unwrap() == 0 {
                break;
            }
            plan(&mut source, &checkpoint, n);
            let read = source.read(&checkpoint, n, &recorded(&checkpoint, n));
            out.push(
                read.map(|batch| {
                    let decoded = batch.decoded;
                    let rows = json_rows(&decoded.batches);
                    let sizes = decoded
                        .batches
                        .iter()
                        .map(|b| b.num_rows() as u64)
                        .collect();
                    (rows, decoded.num_input_rows, decoded.num_malformed, sizes)
                })
                .map_err(|e| e.to_string().replace(&input.display().to_string(), "IN")),
            );
            between(&source, n, &input);
        }
        source.end_parts();
        assert!(source.ahead.is_none() && source.upcoming.is_empty());
        (out, source.ahead_used)
    }

    /// Five files of 1 to 3 MB (so that two threads split each into parts), the third with a
    /// malformed line.
    fn five_files() -> Vec<String> {
        (0..5)
            .map(|f| {
                let mut text = String::new();
                for r in 0..(60_000 + f * 30_000) {
                    if f == 2 && r == 40_000 {
                        text.push_str("{\"id\": oops}\n");
                    }
                    text.push_str(&format!("{{\"id\":{}}}\n", f * 1_000_000 + r));
                }
                text
            })
            .collect()
    }

    /// The names of the files a read-ahead decodes.
    fn ahead_names(source: &FilesSource) -> Option<Vec<String>> {
        let ahead = source.ahead.as_ref()?;
        Some(ahead.job.files.iter().map(|f| f.name.clone()).collect())
    }

    #[test]
    fn the_next_batch_is_decoded_ahead_as_it_would_be_read() {
        let texts = five_files();
        // One file a batch: parts of it on two threads; two files a batch: whole files.
        // The batches a read-ahead serves: all but the first, except one holding a malformed
        // line under `fail` (dropped, and read again by the batch) and the one after a failed
        // batch (nothing was read ahead for it).
        for (per_batch, policy, served) in [
            (1, MalformedPolicy::Permissive, 4),
            (1, MalformedPolicy::Fail, 2),
            (2, MalformedPolicy::Permissive, 2),
            (2, MalformedPolicy::Fail, 0),
        ] {
            let case = format!("{per_batch} a batch, {policy:?}");
            let (one, none) = read_batches(&texts, 1, per_batch, true, policy, |source, _, _| {
                assert!(source.ahead.is_none(), "one thread reads nothing ahead");
            });
            assert_eq!(none, 0);
            let (two, used) = read_batches(&texts, 2, per_batch, true, policy, |source, n, _| {
                // After each batch but the last (and a failed one), the next files are being
                // decoded.
                let first = (n as usize + 1) * per_batch;
                let want = (first < 5).then(|| {
                    (first..(first + per_batch).min(5))
                        .map(|f| format!("f{f}.json"))
                        .collect::<Vec<_>>()
                });
                let failed = policy == MalformedPolicy::Fail && n as usize == 2 / per_batch;
                if !failed {
                    assert_eq!(ahead_names(source), want, "after batch {n}");
                }
            });
            assert_eq!(two, one, "{case}");
            assert_eq!(used, served, "{case}: batches served by a read-ahead");
            let bad = 2 / per_batch;
            if policy == MalformedPolicy::Fail {
                // The batch of f2.json fails on its own line, read ahead or not.
                let err = one[bad].as_ref().unwrap_err();
                assert!(err.contains("IN/f2.json:40001"), "{err}");
            } else {
                let (rows, input, malformed, _) = one[bad].as_ref().unwrap();
                // f2.json's 120,001 lines, and with two a batch f3.json's 150,000.
                let lines = if per_batch == 2 { 270_001 } else { 120_001 };
                assert_eq!((*input, *malformed), (lines, 1));
                assert_eq!(rows.len() as u64, lines);
                assert_eq!(one.last().unwrap().as_ref().unwrap().0[0]["id"], 4_000_000);
            }
        }
    }

    #[test]
    fn a_read_ahead_of_files_the_batch_does_not_take_is_dropped() {
        let texts = five_files();
        // Listed anew each batch, as with a processing-time trigger.
        let (grown, used) = read_batches(
            &texts,
            2,
            1,
            false,
            MalformedPolicy::Permissive,
            |source, n, dir| {
                if n == 0 {
                    // f1.json is being read ahead; it grows before batch 1 is planned, so batch
                    // 1 takes more bytes of it than were read ahead.
                    assert_eq!(ahead_names(source), Some(vec!["f1.json".to_owned()]));
                    let mut file = std::fs::File::options()
                        .append(true)
                        .open(dir.join("f1.json"))
                        .unwrap();
                    std::io::Write::write_all(&mut file, b"{\"id\":-1}\n").unwrap();
                    file.set_modified(
                        std::time::SystemTime::UNIX_EPOCH
                            + std::time::Duration::from_secs(1_000_001),
                    )
                    .unwrap();
                }
            },
        );
        let (rows, input, _, _) = grown[1].as_ref().unwrap();
        assert_eq!(*input, 90_001);
        assert_eq!(rows.last().unwrap()["id"], -1);
        assert_eq!(grown.len(), 5);
        // Batches 2, 3 and 4 were read ahead; batch 1 was not served by the read-ahead of the
        // file before it grew.
        assert_eq!(used, 3);
    }

    #[test]
    fn threads_decode_parts_of_one_large_file_as_one_thread_does() {
        // 200,000 lines of about 14 bytes: three parts of 1 MB or less, batches of 1,000 rows.
        let mut text = String::new();
        for r in 0..200_000 {
            if r % 1_001 == 17 {
                text.push_str("{\"id\": oops}\n");
            }
            text.push_str(&format!("{{\"id\":{r}}}\n"));
        }
        for policy in [
            MalformedPolicy::Permissive,
            MalformedPolicy::Drop,
            MalformedPolicy::DeadLetter,
            MalformedPolicy::Fail,
        ] {
            let one = read_batch(vec![text.clone()], 1, policy);
            for threads in [2, 4] {
                assert_eq!(
                    read_batch(vec![text.clone()], threads, policy),
                    one,
                    "{policy:?}, {threads} threads"
                );
            }
            if policy == MalformedPolicy::DeadLetter {
                let (_, sizes, input, malformed, letters) = one.unwrap();
                assert_eq!(malformed, 200);
                assert_eq!(input, 200_200);
                // Cut every 1,000 rows and at each megabyte: two batches are shorter.
                assert_eq!(sizes.iter().sum::<usize>(), 200_000);
                assert_eq!(sizes.iter().filter(|&&n| n < 1_000).count(), 3);
                assert_eq!(letters[199], ("IN/f0.json".to_owned(), 199 * 1_002 + 18));
            }
        }
    }

    /// One thread reads a file a piece at a time; four threads read these two files whole
    /// and decode the first, of more than a megabyte, in two parts. Both give the same rows,
    /// batches, counts and line numbers, for a line longer than a piece, a file exactly two
    /// pieces long without a last newline, and lines ending on either side of a piece's end.
    #[test]
    fn a_file_read_in_pieces_is_decoded_as_read_whole() {
        let mut long = String::new();
        for r in 0..3_000 {
            long.push_str(&format!("{{\"id\":{r}}}\n"));
        }
        // Line 3,001: longer than a piece, then a malformed line.
        long.push_str(&format!(
            "{{\"id\":3000,\"pad\":\"{}\"}}\n",
            "x".repeat(3 * PIECE_BYTES)
        ));
        long.push_str("{\"id\":oops}\n");
        // More than a megabyte in all: four threads decode it in two parts.
        for r in 3_001..80_000 {
            long.push_str(&format!("{{\"id\":{r}}}\r\n"));
        }
        assert!(long.len() > crate::decode::PART_BYTES);
        let mut exact = String::new();
        let mut r = 0;
        while exact.len() < 2 * PIECE_BYTES - 64 {
            exact.push_str(&format!("{{\"id\":{r}}}\n"));
            r += 1;
        }
        let last = format!("{{\"id\":{r},\"p\":\"\"}}");
        let pad = 2 * PIECE_BYTES - exact.len() - last.len();
        exact.push_str(&format!("{{\"id\":{r},\"p\":\"{}\"}}", "y".repeat(pad)));
        assert_eq!(exact.len(), 2 * PIECE_BYTES);
        let texts = vec![long, exact];
        for policy in [
            MalformedPolicy::Permissive,
            MalformedPolicy::DeadLetter,
            MalformedPolicy::Fail,
        ] {
            let pieces = read_batch(texts.clone(), 1, policy);
            assert_eq!(read_batch(texts.clone(), 4, policy), pieces, "{policy:?}");
            // The malformed line fails the batch under `fail` only.
            assert_eq!(
                pieces.is_err(),
                policy == MalformedPolicy::Fail,
                "{policy:?}"
            );
            match pieces {
                Ok((rows, _, input, malformed, letters)) => {
                    assert_eq!(input, 80_001 + r + 1);
                    assert_eq!(malformed, 1);
                    assert_eq!(
                        rows.len() as u64,
                        input - u64::from(policy != MalformedPolicy::Permissive)
                    );
                    assert_eq!(rows[3_000]["id"], 3_000);
                    assert_eq!(rows.last().unwrap()["id"], r);
                    if policy == MalformedPolicy::DeadLetter {
                        assert_eq!(letters, [("IN/f0.json".to_owned(), 3_002)]);
                    }
                }
                Err(e) => {
                    assert!(e.contains("IN/f0.json:3002:"), "{e}");
                }
            }
        }
    }

    #[test]
    fn the_source_log_keeps_what_the_purged_offsets_entries_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        std::fs::create_dir_all(&input).unwrap();
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
        let mut source = open(dir.path(), &checkpoint, None).unwrap();
        let batches = LOG_EVERY * 2 + 7;
        for n in 0..batches {
            std::fs::write(input.join(format!("f{n:04}.json")), "{\"id\":1}\n").unwrap();
            assert_eq!(source.poll(&checkpoint, false).unwrap(), 1);
            plan(&mut source, &checkpoint, n);
        }
        // One log entry per LOG_EVERY batches, holding the files of all of them.
        let log = checkpoint.source_log(0);
        assert_eq!(log.ids().unwrap(), [LOG_EVERY - 1, LOG_EVERY * 2 - 1]);
        let entry: FilesLogEntry = log.get(LOG_EVERY * 2 - 1).unwrap().unwrap();
        assert_eq!(entry.files.len() as u64, LOG_EVERY);
        assert_eq!(entry.files[0].name, format!("f{LOG_EVERY:04}.json"));
        // The offsets entries before the last log entry purged, a reopened source still
        // knows every file taken and takes only the new one.
        checkpoint.offsets().purge_before(LOG_EVERY * 2).unwrap();
        std::fs::write(input.join("new.json"), "{\"id\":2}\n").unwrap();
        let mut reopened = open(dir.path(), &checkpoint, Some(batches - 1)).unwrap();
        assert_eq!(reopened.poll(&checkpoint, false).unwrap(), 1);
        assert_eq!(reopened.staged[0].name, "new.json");
        // Its next log entry comes LOG_EVERY batches after the last one, with all seven
        // batches since.
        for n in batches..LOG_EVERY * 3 {
            plan(&mut reopened, &checkpoint, n);
            reopened.poll(&checkpoint, false).unwrap();
        }
        let entry: FilesLogEntry = log.get(LOG_EVERY * 3 - 1).unwrap().unwrap();
        assert_eq!(entry.files.len(), 8);
        // A planned batch after the last log entry without its offsets entry: refused.
        std::fs::remove_file(checkpoint.offsets().entry_path(LOG_EVERY * 3)).ok();
        let last = LOG_EVERY * 3 + 1;
        let err = open(dir.path(), &checkpoint, Some(last)).unwrap_err();
        assert_corrupt(
            &err,
            &checkpoint.offsets().entry_path(LOG_EVERY * 3),
            "neither this offsets entry nor the source log",
        );
    }

    #[test]
    fn a_checkpoint_with_a_log_entry_per_batch_reads_as_before() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("in")).unwrap();
        std::fs::write(dir.path().join("in/a.json"), "{\"id\":1}\n").unwrap();
        std::fs::write(dir.path().join("in/b.json"), "{\"id\":2}\n").unwrap();
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
        let entry = |name: &str| FilesLogEntry {
            files: vec![FileEntry {
                name: name.into(),
                size: 9,
                mtime_ms: 0,
            }],
        };
        // What an earlier Weir wrote for batch 0: the list in the log, none in offsets.
        checkpoint.source_log(0).put(0, &entry("a.json")).unwrap();
        checkpoint
            .offsets()
            .put(
                0,
                &serde_json::json!({ "sources": [{ "name": "orders", "logOffset": 0 }] }),
            )
            .unwrap();
        let mut source = open(dir.path(), &checkpoint, Some(0)).unwrap();
        let read = source
            .read(&checkpoint, 0, &recorded(&checkpoint, 0))
            .unwrap();
        assert_eq!(read.decoded.num_input_rows, 1);
        assert_eq!(source.poll(&checkpoint, false).unwrap(), 1);
        assert_eq!(source.staged[0].name, "b.json");
    }

    #[test]
    fn a_file_listed_twice_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = setup(dir.path());
        let entry = edit_files(&checkpoint, |files| files.push(files[0].clone()));
        let err = open(dir.path(), &checkpoint, Some(0)).unwrap_err();
        assert_corrupt(&err, &entry, "\"a.json\" is listed twice");
    }

    #[test]
    fn a_recorded_size_above_the_file_is_corrupt_and_reserves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let checkpoint = setup(dir.path());
        let mut source = open(dir.path(), &checkpoint, Some(0)).unwrap();
        let rows = source
            .read(&checkpoint, 0, &recorded(&checkpoint, 0))
            .unwrap();
        assert_eq!(rows.decoded.num_input_rows, 2);
        for size in [19, u64::MAX] {
            let entry = tamper(&checkpoint, "a.json", Some(size));
            let err = source
                .read(&checkpoint, 0, &recorded(&checkpoint, 0))
                .unwrap_err();
            assert_corrupt(
                &err,
                &entry,
                &format!(
                    "batch 0 records {size} bytes of {}",
                    dir.path().join("in/a.json").display()
                ),
            );
            assert!(err.to_string().contains("which holds 18 bytes"), "{err}");
        }
        // A smaller size reads that prefix only (the file grew since).
        tamper(&checkpoint, "a.json", Some(9));
        let rows = source
            .read(&checkpoint, 0, &recorded(&checkpoint, 0))
            .unwrap();
        assert_eq!(rows.decoded.num_input_rows, 1);
    }

    #[test]
    fn plain_names_pass() {
        for name in [
            "a.json",
            "part-0001.csv",
            ".hidden",
            "..json",
            "a b",
            "ü.json",
        ] {
            assert_eq!(check_name(name), Ok(()), "{name}");
        }
    }

    fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    #[test]
    fn parquet_files_are_read_by_column_name() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in");
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).unwrap();
        // No file yet and no schema: nothing to take the schema from.
        let err = infer_parquet("orders", &input, 10).unwrap_err();
        assert!(matches!(err, SourceError::NoSchema { .. }), "{err}");
        assert!(err.to_string().contains("has none yet"), "{err}");
        std::fs::create_dir_all(&input).unwrap();
        write_parquet(
            &input.join("a.parquet"),
            vec![
                ("id", Arc::new(Int32Array::from(vec![1, 2])) as ArrayRef),
                (
                    "extra",
                    Arc::new(StringArray::from(vec!["x", "y"])) as ArrayRef,
                ),
            ],
        );
        write_parquet(
            &input.join("b.parquet"),
            vec![("id", Arc::new(Int64Array::from(vec![3_i64])) as ArrayRef)],
        );
        // Without a schema: the first file's.
        let inferred = infer_parquet("orders", &input, 10).unwrap();
        let fields: Vec<(&str, DataType)> = inferred
            .output_schema()
            .fields()
            .iter()
            .map(|f| (f.name().as_str(), f.data_type().clone()))
            .collect();
        assert_eq!(fields, [("id", DataType::Int32), ("extra", DataType::Utf8)]);
        // With one: `id` widened to BIGINT, `extra` not read, no `_corrupt_record`.
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let mut source = FilesSource::open(
            "orders".into(),
            0,
            input.clone(),
            None,
            ParquetDecoder::new(schema, 10).unwrap(),
            None,
            &checkpoint,
            None,
        )
        .unwrap();
        assert_eq!(source.schema().fields().len(), 1);
        assert_eq!(source.poll(&checkpoint, false).unwrap(), 2);
        plan(&mut source, &checkpoint, 0);
        let read = source
            .read(&checkpoint, 0, &recorded(&checkpoint, 0))
            .unwrap();
        assert_eq!(read.decoded.num_input_rows, 3);
        assert_eq!(read.decoded.num_malformed, 0);
        let ids: Vec<i64> = read
            .decoded
            .batches
            .iter()
            .flat_map(|b| {
                assert_eq!(b.schema().field(0).data_type(), &DataType::Int64);
                let ids = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                ids.values().to_vec()
            })
            .collect();
        assert_eq!(ids, [1, 2, 3]);
        // A file that is not Parquet fails its batch, naming it.
        std::fs::write(input.join("c.parquet"), "{\"id\":4}\n").unwrap();
        assert_eq!(source.poll(&checkpoint, false).unwrap(), 1);
        plan(&mut source, &checkpoint, 1);
        let err = source
            .read(&checkpoint, 1, &recorded(&checkpoint, 1))
            .unwrap_err();
        assert!(matches!(err, SourceError::Decode { .. }), "{err}");
        let named = format!(
            "cannot read {} as Parquet",
            input.join("c.parquet").display()
        );
        assert!(err.to_string().contains(&named), "{err}");
    }
}
