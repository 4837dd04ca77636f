//! A folder of files as a stream, like Spark's file source: each batch takes
//! the files not seen before, oldest modification time first (then by
//! name), at most `max_files_per_trigger` of them. The files a batch takes
//! are written to the source's log in the checkpoint before the batch runs,
//! so that a replay reads exactly the same files — and the same bytes: the
//! size recorded then is what is read, even if a file grew since.

use std::collections::HashSet;
use std::io::Read;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

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
    /// Time spent listing the folder (µs) since the last
    /// [`FilesSource::take_listing_time`]: Spark's `durationMs.latestOffset`.
    listing_micros: AtomicU64,
}

impl FilesSource {
    /// Opens the source, learning from the checkpoint which files earlier
    /// batches took. Log entries past `last_planned` (a crash between writing
    /// the source log and the offsets log) are dropped: that batch was never
    /// planned, so its files are not seen.
    ///
    /// # Errors
    /// When the source log cannot be read.
    pub fn open(
        name: String,
        index: usize,
        dir: PathBuf,
        max_files: Option<NonZeroUsize>,
        decoder: Decoder,
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
            listing_micros: AtomicU64::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Spark's `sources[].description`.
    pub fn description(&self) -> String {
        format!("FileStreamSource[{}]", self.dir.display())
    }

    /// The decoded schema (with `_corrupt_record` under the permissive policy).
    pub fn schema(&self) -> &arrow_schema::SchemaRef {
        self.decoder.output_schema()
    }

    /// Files present and not yet taken, in the order batches take them.
    ///
    /// # Errors
    /// When the folder cannot be listed.
    pub fn list_new(&self) -> Result<Vec<FileEntry>, SourceError> {
        let started = Instant::now();
        let listed = self.list_unseen();
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.listing_micros.fetch_add(micros, Ordering::Relaxed);
        listed
    }

    /// The time [`Self::list_new`] spent since the last call of this
    /// function (what finding a batch's input cost), then zero again.
    pub fn take_listing_time(&self) -> Duration {
        Duration::from_micros(self.listing_micros.swap(0, Ordering::Relaxed))
    }

    fn list_unseen(&self) -> Result<Vec<FileEntry>, SourceError> {
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

    /// Chooses the files of the next batch from `candidates` (from
    /// [`Self::list_new`]), honouring `max_files_per_trigger` unless `unlimited`.
    pub fn take(&self, candidates: &[FileEntry], unlimited: bool) -> Vec<FileEntry> {
        let n = match (unlimited, self.max_files) {
            (false, Some(max)) => max.get().min(candidates.len()),
            _ => candidates.len(),
        };
        candidates[..n].to_vec()
    }

    /// Records the files of batch `batch_id` in the source log and marks them seen.
    ///
    /// # Errors
    /// When the log entry cannot be written.
    pub fn record(
        &mut self,
        checkpoint: &Checkpoint,
        batch_id: u64,
        files: &[FileEntry],
    ) -> Result<(), SourceError> {
        checkpoint.source_log(self.index).put(
            batch_id,
            &FilesLogEntry {
                files: files.to_vec(),
            },
        )?;
        self.seen.extend(files.iter().map(|f| f.name.clone()));
        Ok(())
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

    /// Reads and decodes exactly the recorded bytes of `files`.
    ///
    /// # Errors
    /// When a file cannot be read or shrank, or a record is malformed under
    /// the `fail` policy.
    pub fn read(&mut self, batch_id: u64, files: &[FileEntry]) -> Result<Decoded, SourceError> {
        let mut out = Decoded::default();
        let mut buf = Vec::new();
        for file in files {
            let path = self.dir.join(&file.name);
            read_prefix(&path, file.size, &mut buf).map_err(|e| match e {
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
                .decode(&buf, &origin, &mut out)
                .map_err(|error| SourceError::Decode {
                    source_name: self.name.clone(),
                    error,
                })?;
        }
        Ok(out)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use crate::decode::DecoderOptions;

    #[test]
    fn listing_time_is_measured_and_taken_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data folder");
        for i in 0..50 {
            std::fs::write(data.join(format!("f{i:03}.json")), b"{\"a\":1}\n").expect("file");
        }
        let checkpoint = Checkpoint::open(&dir.path().join("cp")).expect("checkpoint");
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let decoder = Decoder::new(schema, DecoderOptions::default()).expect("decoder");
        let source = FilesSource::open("s".into(), 0, data, None, decoder, &checkpoint, None)
            .expect("source opens");
        assert_eq!(source.take_listing_time(), Duration::ZERO);
        let files = source.list_new().expect("listing");
        assert_eq!(files.len(), 50);
        let first = source.take_listing_time();
        assert!(first > Duration::ZERO, "listing 50 files takes time");
        assert_eq!(source.take_listing_time(), Duration::ZERO, "taken");
        source.list_new().expect("listing");
        source.list_new().expect("listing");
        assert!(
            source.take_listing_time() > Duration::ZERO,
            "both listings add up"
        );
    }
}
