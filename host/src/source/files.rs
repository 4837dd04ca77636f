//! A folder of files as a stream, like Spark's file source: each batch takes
//! the files not seen before, oldest modification time first (then by
//! name), at most `max_files_per_trigger` of them. The files a batch takes
//! are written to the source's log in the checkpoint before the batch runs,
//! so that a replay reads exactly the same files — and the same bytes: the
//! size recorded then is what is read, even if a file grew since.

use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::{Recorded, Source, SourceBatch};
use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::decode::{DecodeError, Decoded, Decoder};

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

/// The source log entry of one batch (`sources/<i>/<N>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesLogEntry {
    pub files: Vec<FileEntry>,
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

/// A folder of files read as a stream.
#[derive(Debug)]
pub struct FilesSource {
    name: String,
    index: usize,
    dir: PathBuf,
    max_files: Option<NonZeroUsize>,
    seen: HashSet<String>,
    decoder: Decoder,
    dead_letter: Option<PathBuf>,
    /// What the next batch takes, chosen by [`Source::poll`].
    staged: Vec<FileEntry>,
    /// Available-now: the files present when the trigger started.
    frozen: Option<Vec<FileEntry>>,
    /// Files present and not yet taken at the last poll (Spark's latestOffset, in files).
    backlog: usize,
    /// The bytes of the file being decoded, kept between batches: a fresh
    /// buffer per file costs a page fault per 4 KB read.
    buf: Vec<u8>,
}

/// A read buffer larger than this is released after its batch.
const KEEP_BUFFER_BYTES: usize = 64 * 1024 * 1024;

impl FilesSource {
    /// Reads and decodes the files of one batch.
    fn read_files(
        &mut self,
        files: &[FileEntry],
        batch_id: u64,
        buf: &mut Vec<u8>,
        decoded: &mut Decoded,
    ) -> Result<(), SourceError> {
        for file in files {
            let path = self.dir.join(&file.name);
            read_prefix(&path, file.size, buf).map_err(|e| match e {
                ReadError::Io(error) => SourceError::Read {
                    source_name: self.name.clone(),
                    file: path.clone(),
                    error,
                },
                ReadError::Short(actual) => SourceError::Shrunk {
                    source_name: self.name.clone(),
                    file: path.clone(),
                    batch_id,
                    expected: file.size,
                    actual,
                },
            })?;
            let origin = path.display().to_string();
            self.decoder
                .decode(buf, &origin, decoded)
                .map_err(|error| SourceError::Decode {
                    source_name: self.name.clone(),
                    error,
                })?;
        }
        Ok(())
    }

    /// Opens the source, learning from the checkpoint which files earlier
    /// batches took. Log entries past `last_planned` (a crash between writing
    /// the source log and the offsets log) are dropped: that batch was never
    /// planned, so its files are not seen.
    ///
    /// # Errors
    /// When the source log cannot be read.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call site (source::open); each is a distinct setting"
    )]
    pub fn open(
        name: String,
        index: usize,
        dir: PathBuf,
        max_files: Option<NonZeroUsize>,
        decoder: Decoder,
        dead_letter: Option<PathBuf>,
        checkpoint: &Checkpoint,
        last_planned: Option<u64>,
    ) -> Result<Self, SourceError> {
        let log = checkpoint.source_log(index);
        let mut seen = HashSet::new();
        for id in log.ids()? {
            if last_planned.is_none_or(|last| id > last) {
                log.remove(id)?;
                continue;
            }
            let entry: Option<FilesLogEntry> = log.get(id)?;
            if let Some(entry) = entry {
                seen.extend(entry.files.into_iter().map(|f| f.name));
            }
        }
        Ok(Self {
            name,
            index,
            dir,
            max_files,
            seen,
            decoder,
            dead_letter,
            staged: Vec::new(),
            frozen: None,
            backlog: 0,
            buf: Vec::new(),
        })
    }

    /// Files present and not yet taken, in the order batches take them.
    ///
    /// # Errors
    /// When the folder cannot be listed.
    pub fn list_new(&self) -> Result<Vec<FileEntry>, SourceError> {
        let list_err = |error| SourceError::List {
            source_name: self.name.clone(),
            dir: self.dir.clone(),
            error,
        };
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            // A folder that does not exist yet simply has no files.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(list_err(e)),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(list_err)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Hidden and underscore files are in-progress or metadata, as in Spark.
            if name.starts_with('.') || name.starts_with('_') || self.seen.contains(&name) {
                continue;
            }
            let meta = entry.metadata().map_err(list_err)?;
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

    /// The files batch `batch_id` took, from the source log.
    ///
    /// # Errors
    /// When the entry is missing or unreadable.
    pub fn planned(
        &self,
        checkpoint: &Checkpoint,
        batch_id: u64,
    ) -> Result<Vec<FileEntry>, SourceError> {
        let entry: Option<FilesLogEntry> = checkpoint.source_log(self.index).get(batch_id)?;
        entry
            .map(|e| e.files)
            .ok_or_else(|| SourceError::MissingLog {
                source_name: self.name.clone(),
                batch_id,
            })
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
        self.staged.truncate(n);
        Ok(n as u64)
    }

    fn record(&mut self, checkpoint: &Checkpoint, batch_id: u64) -> Result<Recorded, SourceError> {
        let entry = FilesLogEntry {
            files: std::mem::take(&mut self.staged),
        };
        checkpoint.source_log(self.index).put(batch_id, &entry)?;
        // The entry is written: only now are its files taken.
        self.backlog = self.backlog.saturating_sub(entry.files.len());
        self.seen.extend(entry.files.into_iter().map(|f| f.name));
        Ok(Recorded::new())
    }

    fn read(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        _recorded: &Recorded,
    ) -> Result<SourceBatch, SourceError> {
        let files = self.planned(checkpoint, batch_id)?;
        let mut decoded = Decoded::default();
        let mut buf = std::mem::take(&mut self.buf);
        let result = self.read_files(&files, batch_id, &mut buf, &mut decoded);
        if buf.capacity() <= KEEP_BUFFER_BYTES {
            self.buf = buf;
        }
        result?;
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

    fn dead_letter_dir(&self) -> Option<&Path> {
        self.dead_letter.as_deref()
    }
}

enum ReadError {
    Io(std::io::Error),
    Short(u64),
}

fn read_prefix(path: &Path, size: u64, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    buf.clear();
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let reserve = usize::try_from(size).unwrap_or(usize::MAX);
    buf.reserve(reserve);
    file.take(size).read_to_end(buf).map_err(ReadError::Io)?;
    if (buf.len() as u64) < size {
        return Err(ReadError::Short(buf.len() as u64));
    }
    Ok(())
}
