//! The checkpoint directory of one query: the durable record that makes a restart resume exactly
//! where the last run stopped (DESIGN.md §3).
//!
//! Why it exists: exactly-once output needs a write-ahead log of what each batch reads (`offsets/N`),
//! a record of which batches finished (`commits/N`), per-source logs, and one process at a time
//! writing them. This module owns the on-disk layout, the atomic writes and the lock, and nothing
//! about what the entries mean: payloads are serde types chosen by the query loop.
//!
//! # Layout
//!
//! ```text
//! metadata        {"version":1,"id":"<query id>","fingerprint":<json or null>,"secret_since":<N>}
//! secret          32 random bytes (mode 0600) keying plugins' random numbers from batch
//!                 `secret_since` on (see `secret` and `plugin::replay`)
//! offsets/<N>     write-ahead log entry for batch N, written before batch N runs
//! commits/<N>     batch N finished
//! sources/<i>/<N> per-source log entries (a files source: the files taken since its previous
//!                 entry, one entry per 50 batches; the batches since list theirs in offsets/N)
//! state/<op>/     state stores of stateful operator <op> (handed out by `state_dir`)
//! sinks/<sink>/   a sink's own recovery records, e.g. `sinks/delta/pending/` (`sink_dir`)
//! progress.jsonl  one JSON progress record per batch
//! lock            advisory lock held by the running process, with its pid, host and start time
//! ```
//!
//! Every log entry is `v1\n<compact JSON>\n`, as in Spark. Every file except `progress.jsonl` is
//! written atomically: a hidden temporary file in the same directory, fsync, rename, fsync of the
//! directory. A reader therefore sees either no entry or a whole one; anything else is damage and is
//! reported as [`CheckpointError::Corrupt`] naming the file.
//!
//! Writers open a [`Checkpoint`] (which takes the lock); `weir checkpoint inspect`, tools and
//! tests read through a [`CheckpointReader`], which takes no lock and writes nothing, so nobody
//! outside this module needs to know the file names.
//!
//! Submodules: `log` (the numbered entry logs), `lock` (who holds the checkpoint), `fsio` (atomic
//! writes and timestamps), `secret` (the query's secret).
//!
//! A checkpoint written by a Weir without `secret` (no `secret_since` in `metadata`) gets one
//! at its next open, with `secret_since` one past its last planned batch: batches planned
//! before keep the random numbers they were planned with (`plugin::replay` says why).

mod fsio;
mod lock;
mod log;
mod secret;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub(crate) use self::fsio::write_atomically;
pub use self::log::{BatchLog, LogReader};
pub use self::secret::{QuerySecret, SECRET_LEN};

/// Version of the `metadata` file and of the log-entry format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// The largest batch id a checkpoint holds. Delta's `txn` versions (the exactly-once record of
/// the Delta sinks) are `i64`, and the query plans batch `N + 1` after batch `N`: bounding ids by
/// `i64::MAX` keeps both sound. A log entry named above it was not written by Weir (counting up
/// from 0, one batch at a time, it would take millennia) and is reported as
/// [`CheckpointError::Corrupt`] instead of overflowing.
pub const MAX_BATCH_ID: u64 = i64::MAX.unsigned_abs();

const METADATA_FILE: &str = "metadata";
const SECRET_FILE: &str = "secret";
const PROGRESS_FILE: &str = "progress.jsonl";
const OFFSETS_DIR: &str = "offsets";
const COMMITS_DIR: &str = "commits";
const SOURCES_DIR: &str = "sources";
const STATE_DIR: &str = "state";
const SINKS_DIR: &str = "sinks";

/// What went wrong with a checkpoint directory; every variant names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Another live process (or another `Checkpoint` in this process) holds the lock.
    #[error("checkpoint {} is in use by {holder}; stop that query first", dir.display())]
    Locked {
        /// The checkpoint directory.
        dir: PathBuf,
        /// Who holds it, e.g. `pid 1234 on host h since 2024-03-01T00:00:00Z`.
        holder: String,
    },
    /// A file of the checkpoint cannot be read back as what was written.
    #[error(
        "{}: {reason}: the checkpoint is damaged; restore it or start a new checkpoint",
        file.display()
    )]
    Corrupt {
        /// The damaged file.
        file: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A log entry exists already with different content.
    #[error(
        "{}: batch {batch} was already written with different content; refusing to overwrite it \
         (was the query or its sources changed while a batch was in flight?)",
        file.display()
    )]
    Conflict {
        /// The existing entry.
        file: PathBuf,
        /// Its batch id.
        batch: u64,
    },
    /// An entry could not be encoded as JSON.
    #[error("{}: cannot encode the entry as JSON: {source}", file.display())]
    Encode {
        /// The entry that was to be written.
        file: PathBuf,
        /// The encoder's error.
        source: serde_json::Error,
    },
    /// The file system refused an operation.
    #[error("{}: cannot {op}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// What was being done, e.g. `create directory`.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl CheckpointError {
    /// Whether the same step may succeed later: only I/O may pass; a lock held by
    /// another process, a damaged or foreign file and an encoding failure stay as
    /// they are. Every variant is listed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io { .. } => true,
            Self::Locked { .. }
            | Self::Corrupt { .. }
            | Self::Conflict { .. }
            | Self::Encode { .. } => false,
        }
    }

    fn io(path: &Path, op: &'static str, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }

    /// A [`CheckpointError::Corrupt`] naming `file`; also used by the sources and sinks, which
    /// validate what their own entries say (file names, sizes, paths) before using it.
    pub(crate) fn corrupt(file: &Path, reason: impl Into<String>) -> Self {
        Self::Corrupt {
            file: file.to_path_buf(),
            reason: reason.into(),
        }
    }
}

/// Contents of the `metadata` file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Format version; this build reads and writes [`FORMAT_VERSION`].
    pub version: u32,
    /// The query id (a UUID v4), fixed at the first start of the query.
    pub id: String,
    /// The query's fingerprint (DESIGN.md §3.3), `None` until the query loop records one.
    #[serde(default)]
    pub fingerprint: Option<serde_json::Value>,
    /// The first batch whose plugins' random numbers are keyed by the `secret` file: 0 for a
    /// checkpoint created with one, later for one created by an older Weir. `None` only in a
    /// `metadata` file an older Weir wrote; an open [`Checkpoint`] always has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_since: Option<u64>,
}

/// An open checkpoint directory, locked for the life of this value.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    metadata: Metadata,
    /// The `secret` file's content (its `Debug` is redacted).
    secret: QuerySecret,
    /// Holds the advisory lock; closing it (on drop) releases the lock.
    _lock: File,
}

impl Checkpoint {
    /// Opens (creating if needed) the checkpoint directory `dir`, takes its lock and reads or
    /// creates its `metadata` with a fresh query id and its `secret`.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Locked`] when another holder has the lock (naming its pid, host and start
    /// time), [`CheckpointError::Corrupt`] when `metadata` is damaged, or missing while batches were
    /// already logged, or when `secret` is damaged, or missing while `metadata` records one,
    /// [`CheckpointError::Io`] when the directory or a file cannot be created or read.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| CheckpointError::io(dir, "create the checkpoint directory", e))?;
        let lock = lock::acquire(dir)?;
        let dir = dir.to_path_buf();
        let metadata_path = dir.join(METADATA_FILE);
        let secret_path = dir.join(SECRET_FILE);
        let (metadata, secret) = match std::fs::read(&metadata_path) {
            Ok(bytes) => {
                let metadata = parse_metadata(&metadata_path, &bytes)?;
                Self::open_secret(&dir, &metadata_path, &secret_path, metadata)?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Self::create_metadata(&dir, &metadata_path, &secret_path)?
            }
            Err(e) => return Err(CheckpointError::io(&metadata_path, "read", e)),
        };
        Ok(Self {
            dir,
            metadata,
            secret,
            _lock: lock,
        })
    }

    /// Reads the secret `metadata` records, or gives a checkpoint of an older Weir its secret.
    fn open_secret(
        dir: &Path,
        metadata_path: &Path,
        secret_path: &Path,
        mut metadata: Metadata,
    ) -> Result<(Metadata, QuerySecret), CheckpointError> {
        let next_planned = BatchLog::new(dir.join(OFFSETS_DIR))
            .latest()?
            .map_or(0, |n| n + 1);
        match metadata.secret_since {
            Some(since) => {
                // `secret_since` is one past the last planned batch when it is recorded, and
                // batches are only ever added: a later one was not written by Weir.
                if since > next_planned {
                    return Err(CheckpointError::corrupt(
                        metadata_path,
                        format!(
                            "secret_since is {since}, past the next batch to plan ({next_planned})"
                        ),
                    ));
                }
                let secret = secret::read(secret_path)?.ok_or_else(|| {
                    CheckpointError::corrupt(
                        secret_path,
                        format!(
                            "the file is missing although metadata keys batches from {since} on by it"
                        ),
                    )
                })?;
                Ok((metadata, secret))
            }
            None => {
                // Written by an older Weir. A secret may be there already (an older Weir ran
                // the checkpoint after this one): keep it, but the batches planned meanwhile
                // drew from the older seed, so they stay on it too.
                let secret = match secret::read(secret_path)? {
                    Some(secret) => secret,
                    None => secret::create(secret_path)?,
                };
                metadata.secret_since = Some(next_planned);
                write_metadata(metadata_path, &metadata)?;
                tracing::info!(
                    checkpoint = %dir.display(),
                    "gave the checkpoint a secret for plugins' random numbers: batches from                      {next_planned} on draw from it, earlier ones replay as they were planned"
                );
                Ok((metadata, secret))
            }
        }
    }

    fn create_metadata(
        dir: &Path,
        metadata_path: &Path,
        secret_path: &Path,
    ) -> Result<(Metadata, QuerySecret), CheckpointError> {
        // A checkpoint that logged batches but lost its metadata would get a new query id, which
        // silently breaks the idempotence of sinks keyed by query id: refuse instead.
        for sub in [OFFSETS_DIR, COMMITS_DIR] {
            let log = BatchLog::new(dir.join(sub));
            if let Some(n) = log.latest()? {
                return Err(CheckpointError::corrupt(
                    metadata_path,
                    format!("the file is missing although {sub}/{n} exists"),
                ));
            }
        }
        // The secret first: a crash before `metadata` leaves a checkpoint that is still new,
        // and the next open keeps that secret.
        let secret = match secret::read(secret_path)? {
            Some(secret) => secret,
            None => secret::create(secret_path)?,
        };
        let metadata = Metadata {
            version: FORMAT_VERSION,
            id: uuid::Uuid::new_v4().to_string(),
            fingerprint: None,
            secret_since: Some(0),
        };
        write_metadata(metadata_path, &metadata)?;
        Ok((metadata, secret))
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The query id recorded at the first start.
    pub fn query_id(&self) -> &str {
        &self.metadata.id
    }

    /// The contents of the `metadata` file.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The query's secret (the `secret` file), which keys its plugins' random numbers.
    pub fn secret(&self) -> &QuerySecret {
        &self.secret
    }

    /// The first batch whose plugins' random numbers are keyed by [`Self::secret`].
    pub fn secret_since(&self) -> u64 {
        self.metadata.secret_since.unwrap_or(0)
    }

    /// Records the query's fingerprint, rewriting `metadata` atomically.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] or [`CheckpointError::Encode`] when the file cannot be written; the
    /// in-memory metadata is then unchanged.
    pub fn set_fingerprint(&mut self, fp: serde_json::Value) -> Result<(), CheckpointError> {
        let mut metadata = self.metadata.clone();
        metadata.fingerprint = Some(fp);
        write_metadata(&self.dir.join(METADATA_FILE), &metadata)?;
        self.metadata = metadata;
        Ok(())
    }

    /// The write-ahead log: `offsets/<N>`.
    pub fn offsets(&self) -> BatchLog<'_> {
        BatchLog::new(self.dir.join(OFFSETS_DIR))
    }

    /// The commit log: `commits/<N>`.
    pub fn commits(&self) -> BatchLog<'_> {
        BatchLog::new(self.dir.join(COMMITS_DIR))
    }

    /// The log of source number `source_index`: `sources/<i>/<N>`.
    pub fn source_log(&self, source_index: usize) -> BatchLog<'_> {
        BatchLog::new(self.dir.join(SOURCES_DIR).join(source_index.to_string()))
    }

    /// The folder of stateful operator `operator`'s state stores: `state/<operator>/`.
    pub fn state_dir(&self, operator: &str) -> PathBuf {
        self.dir.join(STATE_DIR).join(operator)
    }

    /// The folder of sink `sink`'s own recovery records: `sinks/<sink>/`.
    pub fn sink_dir(&self, sink: &str) -> PathBuf {
        self.dir.join(SINKS_DIR).join(sink)
    }

    /// Appends `record` as one line to `progress.jsonl`.
    ///
    /// The line is written with a single `write` on a file opened for appending, so concurrent
    /// readers see whole lines; it is not fsynced (progress is informational, not recovery data).
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] when the file cannot be opened or written, [`CheckpointError::Encode`]
    /// when the record cannot be encoded.
    pub fn append_progress(&self, record: &serde_json::Value) -> Result<(), CheckpointError> {
        let path = self.dir.join(PROGRESS_FILE);
        let mut line = serde_json::to_vec(record).map_err(|source| CheckpointError::Encode {
            file: path.clone(),
            source,
        })?;
        line.push(b'\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| CheckpointError::io(&path, "open for appending", e))?;
        file.write_all(&line)
            .and_then(|()| file.flush())
            .map_err(|e| CheckpointError::io(&path, "append to", e))
    }
}

/// A checkpoint read without its lock and never written: what `weir checkpoint inspect`, tools
/// and tests see of a query, stopped or running.
///
/// Entries are written atomically, so a reader racing a running query sees each entry whole
/// or not at all; the set of entries may of course move on between two calls.
#[derive(Debug, Clone)]
pub struct CheckpointReader {
    dir: PathBuf,
    metadata: Option<Metadata>,
}

impl CheckpointReader {
    /// Reads the checkpoint at `dir`; its `metadata` is `None` when the query never started.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] when `dir` or its `metadata` cannot be read (a missing `dir`
    /// included), [`CheckpointError::Corrupt`] when `metadata` is damaged.
    pub fn open(dir: &Path) -> Result<Self, CheckpointError> {
        std::fs::metadata(dir).map_err(|e| CheckpointError::io(dir, "read", e))?;
        let metadata_path = dir.join(METADATA_FILE);
        let metadata = match std::fs::read(&metadata_path) {
            Ok(bytes) => Some(parse_metadata(&metadata_path, &bytes)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(CheckpointError::io(&metadata_path, "read", e)),
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            metadata,
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The contents of `metadata`, `None` before the first start.
    pub fn metadata(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }

    /// The write-ahead log: `offsets/<N>`.
    pub fn offsets(&self) -> LogReader {
        LogReader::new(self.dir.join(OFFSETS_DIR))
    }

    /// The commit log: `commits/<N>`.
    pub fn commits(&self) -> LogReader {
        LogReader::new(self.dir.join(COMMITS_DIR))
    }

    /// The log of source number `source_index`: `sources/<i>/<N>`.
    pub fn source_log(&self, source_index: usize) -> LogReader {
        LogReader::new(self.dir.join(SOURCES_DIR).join(source_index.to_string()))
    }

    /// The folder of stateful operator `operator`'s state stores.
    pub fn state_dir(&self, operator: &str) -> PathBuf {
        self.dir.join(STATE_DIR).join(operator)
    }

    /// Every progress record in `progress.jsonl`, oldest first (none when the file is missing).
    /// A last line without its newline (a record being appended now) is left out.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] when the file cannot be read, [`CheckpointError::Corrupt`]
    /// naming it and the line when a whole line is not JSON.
    pub fn progress(&self) -> Result<Vec<serde_json::Value>, CheckpointError> {
        let path = self.dir.join(PROGRESS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::io(&path, "read", e)),
        };
        let whole = match text.rfind('\n') {
            Some(end) => &text[..end],
            None => "",
        };
        whole
            .lines()
            .enumerate()
            .filter(|(_, line)| !line.trim().is_empty())
            .map(|(i, line)| {
                serde_json::from_str(line)
                    .map_err(|e| CheckpointError::corrupt(&path, format!("line {}: {e}", i + 1)))
            })
            .collect()
    }
}

fn write_metadata(path: &Path, metadata: &Metadata) -> Result<(), CheckpointError> {
    let mut bytes = serde_json::to_vec(metadata).map_err(|source| CheckpointError::Encode {
        file: path.to_path_buf(),
        source,
    })?;
    bytes.push(b'\n');
    write_atomically(path, &bytes)
}

fn parse_metadata(path: &Path, bytes: &[u8]) -> Result<Metadata, CheckpointError> {
    if bytes.is_empty() {
        return Err(CheckpointError::corrupt(path, "the file is empty"));
    }
    if !bytes.ends_with(b"\n") {
        return Err(CheckpointError::corrupt(
            path,
            "the file is truncated (no final newline)",
        ));
    }
    let metadata: Metadata = serde_json::from_slice(bytes)
        .map_err(|e| CheckpointError::corrupt(path, format!("invalid metadata JSON: {e}")))?;
    if metadata.version != FORMAT_VERSION {
        return Err(CheckpointError::corrupt(
            path,
            format!(
                "metadata version {} is not supported (this build reads version {FORMAT_VERSION})",
                metadata.version
            ),
        ));
    }
    if metadata.id.is_empty() {
        return Err(CheckpointError::corrupt(path, "the query id is empty"));
    }
    Ok(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Entry {
        batch: u64,
        files: Vec<String>,
    }

    fn entry(batch: u64) -> Entry {
        Entry {
            batch,
            files: vec![format!("part-{batch}.json"), "a\"b".to_owned()],
        }
    }

    #[test]
    fn open_creates_metadata_with_uuid_and_reopen_keeps_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cp");
        let id = {
            let cp = Checkpoint::open(&dir).unwrap();
            assert_eq!(cp.dir(), dir);
            assert_eq!(cp.metadata().version, 1);
            assert!(cp.metadata().fingerprint.is_none());
            let parsed = uuid::Uuid::parse_str(cp.query_id()).unwrap();
            assert_eq!(parsed.get_version_num(), 4);
            let text = std::fs::read_to_string(dir.join("metadata")).unwrap();
            assert_eq!(
                text,
                format!(
                    "{{\"version\":1,\"id\":\"{}\",\"fingerprint\":null,\"secret_since\":0}}\n",
                    cp.query_id()
                )
            );
            cp.query_id().to_owned()
        };
        let cp = Checkpoint::open(&dir).unwrap();
        assert_eq!(cp.query_id(), id);
    }

    #[test]
    fn fingerprint_is_persisted() {
        let tmp = tempfile::tempdir().unwrap();
        {
            let mut cp = Checkpoint::open(tmp.path()).unwrap();
            cp.set_fingerprint(json!({"sources": ["kafka:t"], "sink": "files"}))
                .unwrap();
            assert_eq!(
                cp.metadata().fingerprint,
                Some(json!({"sources": ["kafka:t"], "sink": "files"}))
            );
        }
        let cp = Checkpoint::open(tmp.path()).unwrap();
        assert_eq!(
            cp.metadata().fingerprint,
            Some(json!({"sources": ["kafka:t"], "sink": "files"}))
        );
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn log_round_trip_latest_ids_and_format() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        let offsets = cp.offsets();
        assert_eq!(offsets.latest().unwrap(), None);
        assert_eq!(offsets.ids().unwrap(), Vec::<u64>::new());
        assert_eq!(offsets.get::<Entry>(0).unwrap(), None);
        for n in [0, 1, 2, 10] {
            offsets.put(n, &entry(n)).unwrap();
        }
        // Non-numeric names and temp files are ignored.
        std::fs::write(tmp.path().join("offsets/.11.abc.tmp"), "junk").unwrap();
        std::fs::write(tmp.path().join("offsets/notes"), "junk").unwrap();
        std::fs::write(tmp.path().join("offsets/012"), "junk").unwrap();
        assert_eq!(offsets.latest().unwrap(), Some(10));
        assert_eq!(offsets.ids().unwrap(), vec![0, 1, 2, 10]);
        assert_eq!(offsets.get::<Entry>(2).unwrap(), Some(entry(2)));
        assert_eq!(offsets.get::<Entry>(3).unwrap(), None);
        let text = std::fs::read_to_string(tmp.path().join("offsets/10")).unwrap();
        assert_eq!(
            text,
            "v1\n{\"batch\":10,\"files\":[\"part-10.json\",\"a\\\"b\"]}\n"
        );

        cp.commits()
            .put(0, &json!({"nextBatchWatermarkMs": 0}))
            .unwrap();
        assert_eq!(cp.commits().latest().unwrap(), Some(0));
        assert_eq!(cp.offsets().latest().unwrap(), Some(10));

        cp.source_log(1).put(4, &vec!["f1", "f2"]).unwrap();
        assert_eq!(
            cp.source_log(1).get::<Vec<String>>(4).unwrap(),
            Some(vec!["f1".into(), "f2".into()])
        );
        assert!(tmp.path().join("sources/1/4").is_file());
        assert_eq!(cp.source_log(0).latest().unwrap(), None);
    }

    #[test]
    fn put_same_content_is_ok_and_different_content_conflicts() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        cp.offsets().put(3, &entry(3)).unwrap();
        cp.offsets().put(3, &entry(3)).unwrap();
        // Same JSON value with keys in another order is the same entry.
        cp.commits().put(1, &json!({"a": 1, "b": 2})).unwrap();
        std::fs::write(tmp.path().join("commits/2"), "v1\n{\"b\":2,\"a\":1}\n").unwrap();
        cp.commits().put(2, &json!({"a": 1, "b": 2})).unwrap();

        let err = cp.offsets().put(3, &entry(4)).unwrap_err();
        assert!(
            matches!(err, CheckpointError::Conflict { batch: 3, .. }),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&tmp.path().join("offsets/3").display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("batch 3"), "{msg}");
        assert_eq!(cp.offsets().get::<Entry>(3).unwrap(), Some(entry(3)));
    }

    #[test]
    fn put_and_get_returns_the_entry_as_the_log_holds_it_and_leaves_no_temporary_file() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        let got: Entry = cp.offsets().put_and_get(5, &entry(5)).unwrap();
        assert_eq!(got, entry(5));
        assert_eq!(cp.offsets().get::<Entry>(5).unwrap(), Some(entry(5)));
        // An entry that exists with the same value in another key order is the same entry,
        // and is left as it is.
        std::fs::create_dir_all(tmp.path().join("commits")).unwrap();
        std::fs::write(tmp.path().join("commits/7"), "v1\n{\"b\":2,\"a\":1}\n").unwrap();
        let got: serde_json::Value = cp
            .commits()
            .put_and_get(7, &json!({"a": 1, "b": 2}))
            .unwrap();
        assert_eq!(got, json!({"a": 1, "b": 2}));
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("commits/7")).unwrap(),
            "v1\n{\"b\":2,\"a\":1}\n"
        );
        let err = cp
            .offsets()
            .put_and_get::<_, Entry>(5, &entry(6))
            .unwrap_err();
        assert!(
            matches!(err, CheckpointError::Conflict { batch: 5, .. }),
            "{err:?}"
        );
        assert_eq!(cp.offsets().get::<Entry>(5).unwrap(), Some(entry(5)));
        // A dangling link where an entry should be is left, and reported as corrupt.
        let link = tmp.path().join("offsets/9");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &link).unwrap();
        let err = cp.offsets().put(9, &entry(9)).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("dangling link"), "{err}");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        // Reading it says the same: the listing counts the name, so it is not a missing entry.
        assert_eq!(cp.offsets().latest().unwrap(), Some(9));
        let err = cp.offsets().get::<Entry>(9).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("dangling link"), "{err}");
        assert!(
            err.to_string().contains(&link.display().to_string()),
            "{err}"
        );
        assert_eq!(cp.offsets().get::<Entry>(10).unwrap(), None);
        for log in ["offsets", "commits"] {
            let names: Vec<_> = std::fs::read_dir(tmp.path().join(log))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert!(
                names.iter().all(|n| !n.ends_with(".tmp")),
                "{log}: {names:?}"
            );
        }
    }

    #[test]
    fn put_over_a_damaged_entry_reports_the_damage() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        std::fs::create_dir_all(tmp.path().join("offsets")).unwrap();
        std::fs::write(tmp.path().join("offsets/0"), "v1\n{\"bat").unwrap();
        let err = cp.offsets().put(0, &entry(0)).unwrap_err();
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");
    }

    #[test]
    fn every_kind_of_damage_is_corrupt_naming_the_file() {
        let cases: &[(&str, &[u8], &str)] = &[
            ("empty", b"", "empty"),
            ("version line cut", b"v1", "truncated"),
            ("json cut", b"v1\n{\"batch\":1,\"fil", "truncated"),
            (
                "json cut with newline",
                b"v1\n{\"batch\":1,\"fil\n",
                "invalid JSON",
            ),
            (
                "no final newline",
                b"v1\n{\"batch\":1,\"files\":[]}",
                "truncated",
            ),
            ("garbage", b"\x00\xff\xfe garbage\n", "version line"),
            (
                "garbage after version",
                b"v1\n\x00\xff\xfe\n",
                "invalid JSON",
            ),
            ("wrong version", b"v2\n{\"batch\":1,\"files\":[]}\n", "v2"),
            ("wrong shape", b"v1\n{\"batch\":\"x\"}\n", "expected form"),
            (
                "two values",
                b"v1\n{\"batch\":1,\"files\":[]}\n{}\n",
                "invalid JSON",
            ),
            ("no json", b"v1\n\n", "invalid JSON"),
        ];
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        std::fs::create_dir_all(tmp.path().join("offsets")).unwrap();
        for (n, (name, bytes, reason)) in cases.iter().enumerate() {
            let file = tmp.path().join(format!("offsets/{n}"));
            std::fs::write(&file, bytes).unwrap();
            let err = cp.offsets().get::<Entry>(n as u64).unwrap_err();
            let CheckpointError::Corrupt {
                file: named,
                reason: why,
            } = &err
            else {
                panic!("{name}: expected Corrupt, got {err:?}");
            };
            assert_eq!(named, &file, "{name}");
            assert!(why.contains(reason), "{name}: {why}");
            let msg = err.to_string();
            assert!(
                msg.starts_with(&file.display().to_string()),
                "{name}: {msg}"
            );
            assert!(
                msg.ends_with("the checkpoint is damaged; restore it or start a new checkpoint"),
                "{name}: {msg}"
            );
        }
        // latest/ids only look at names, so damage is found when the entry is read.
        assert_eq!(cp.offsets().latest().unwrap(), Some(cases.len() as u64 - 1));
    }

    #[test]
    fn batch_ids_near_the_top_of_u64_are_corrupt_not_overflowing() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        // The largest id is an ordinary entry; the next one cannot be written.
        cp.commits().put(MAX_BATCH_ID, &1).unwrap();
        assert_eq!(cp.commits().latest().unwrap(), Some(MAX_BATCH_ID));
        let err = cp.commits().put(MAX_BATCH_ID + 1, &1).unwrap_err();
        let CheckpointError::Corrupt { file, reason } = &err else {
            panic!("expected Corrupt, got {err:?}");
        };
        assert_eq!(file, &tmp.path().join("commits/9223372036854775808"));
        assert!(reason.contains("above the largest batch id"), "{reason}");
        assert!(!file.exists());

        for name in [
            "18446744073709551615",
            "9223372036854775808",
            "1".repeat(30).as_str(),
        ] {
            let victim = tmp.path().join("offsets").join(name);
            std::fs::create_dir_all(tmp.path().join("offsets")).unwrap();
            std::fs::write(&victim, "v1\n{}\n").unwrap();
            for err in [
                cp.offsets().latest().unwrap_err(),
                cp.offsets().ids().unwrap_err(),
                cp.offsets().purge_before(3).unwrap_err(),
            ] {
                let CheckpointError::Corrupt { file, reason } = &err else {
                    panic!("{name}: expected Corrupt, got {err:?}");
                };
                assert_eq!(file, &victim, "{name}");
                assert!(
                    reason.contains(&format!("batch id {name} is above")),
                    "{reason}"
                );
                assert!(err.to_string().ends_with("start a new checkpoint"), "{err}");
            }
            std::fs::remove_file(&victim).unwrap();
        }
        drop(cp);
        // Opening a checkpoint whose metadata is missing lists the logs: the same error.
        std::fs::write(tmp.path().join("offsets/18446744073709551615"), "v1\n{}\n").unwrap();
        std::fs::remove_file(tmp.path().join("metadata")).unwrap();
        let err = Checkpoint::open(tmp.path()).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt { file, .. } if file.ends_with("offsets/18446744073709551615")),
            "{err:?}"
        );
    }

    #[test]
    fn corrupt_metadata_is_reported() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "empty"),
            (b"{\"version\":1,\"id\":\"x\"", "truncated"),
            (b"not json\n", "invalid metadata JSON"),
            (
                b"{\"version\":2,\"id\":\"x\",\"fingerprint\":null}\n",
                "version 2",
            ),
            (
                b"{\"version\":1,\"id\":\"\",\"fingerprint\":null}\n",
                "empty",
            ),
        ];
        for (bytes, reason) in cases {
            let tmp = tempfile::tempdir().unwrap();
            let file = tmp.path().join("metadata");
            std::fs::write(&file, bytes).unwrap();
            let err = Checkpoint::open(tmp.path()).unwrap_err();
            let CheckpointError::Corrupt {
                file: named,
                reason: why,
            } = &err
            else {
                panic!("expected Corrupt, got {err:?}");
            };
            assert_eq!(named, &file);
            assert!(why.contains(reason), "{why}");
            assert!(
                err.to_string()
                    .contains("restore it or start a new checkpoint")
            );
        }
    }

    #[test]
    fn missing_metadata_with_logged_batches_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        {
            let cp = Checkpoint::open(tmp.path()).unwrap();
            cp.offsets().put(0, &entry(0)).unwrap();
        }
        std::fs::remove_file(tmp.path().join("metadata")).unwrap();
        let err = Checkpoint::open(tmp.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("missing although offsets/0 exists"),
            "{err}"
        );
    }

    #[test]
    fn a_new_checkpoint_has_a_private_secret_that_survives_reopen() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("secret");
        let first = {
            let cp = Checkpoint::open(tmp.path()).unwrap();
            assert_eq!(cp.secret_since(), 0);
            *cp.secret().expose()
        };
        assert_eq!(std::fs::read(&path).unwrap(), first);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let cp = Checkpoint::open(tmp.path()).unwrap();
        assert_eq!(cp.secret().expose(), &first);
        assert_ne!(first, [0; SECRET_LEN]);
        let other = Checkpoint::open(&tmp.path().join("other")).unwrap();
        assert_ne!(
            other.secret().expose(),
            &first,
            "each checkpoint its own secret"
        );
        let shown = format!("{cp:?}");
        assert!(shown.contains("QuerySecret(<redacted>)"), "{shown}");
        assert!(!shown.contains(&format!("{:?}", &first[..4])), "{shown}");
    }

    #[test]
    fn a_truncated_secret_is_corrupt_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        drop(Checkpoint::open(tmp.path()).unwrap());
        let path = tmp.path().join("secret");
        let secret = std::fs::read(&path).unwrap();
        for damaged in [
            &secret[..31],
            &[][..],
            &[secret.as_slice(), b"\n"].concat()[..],
        ] {
            std::fs::write(&path, damaged).unwrap();
            let err = Checkpoint::open(tmp.path()).unwrap_err();
            assert!(
                matches!(&err, CheckpointError::Corrupt { file, .. } if file == &path),
                "{err:?}"
            );
            assert!(
                err.to_string().contains(&format!(
                    "holds {} bytes, not a secret of 32",
                    damaged.len()
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn a_missing_secret_is_corrupt_once_metadata_records_one() {
        let tmp = tempfile::tempdir().unwrap();
        drop(Checkpoint::open(tmp.path()).unwrap());
        let path = tmp.path().join("secret");
        std::fs::remove_file(&path).unwrap();
        let err = Checkpoint::open(tmp.path()).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt { file, .. } if file == &path),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("missing although metadata"),
            "{err}"
        );
        assert!(!path.exists(), "no new secret replaces the lost one");
    }

    #[test]
    fn a_checkpoint_of_an_older_weir_gets_a_secret_from_its_next_batch_on() {
        let tmp = tempfile::tempdir().unwrap();
        let id = {
            let cp = Checkpoint::open(tmp.path()).unwrap();
            cp.offsets().put(0, &entry(0)).unwrap();
            cp.commits().put(0, &entry(0)).unwrap();
            cp.offsets().put(1, &entry(1)).unwrap();
            cp.query_id().to_owned()
        };
        // As an older Weir left it: no secret, no secret_since.
        std::fs::remove_file(tmp.path().join("secret")).unwrap();
        let old = format!("{{\"version\":1,\"id\":\"{id}\",\"fingerprint\":null}}\n");
        std::fs::write(tmp.path().join("metadata"), &old).unwrap();
        let secret = {
            let cp = Checkpoint::open(tmp.path()).unwrap();
            assert_eq!(cp.query_id(), id);
            assert_eq!(
                cp.secret_since(),
                2,
                "batch 1, planned before, keeps its seed"
            );
            *cp.secret().expose()
        };
        let text = std::fs::read_to_string(tmp.path().join("metadata")).unwrap();
        assert!(text.contains("\"secret_since\":2"), "{text}");
        let cp = Checkpoint::open(tmp.path()).unwrap();
        assert_eq!(cp.secret().expose(), &secret);
        assert_eq!(cp.secret_since(), 2);
    }

    #[test]
    fn a_secret_since_past_the_planned_batches_is_corrupt() {
        let tmp = tempfile::tempdir().unwrap();
        let id = Checkpoint::open(tmp.path()).unwrap().query_id().to_owned();
        let path = tmp.path().join("metadata");
        let forged =
            format!("{{\"version\":1,\"id\":\"{id}\",\"fingerprint\":null,\"secret_since\":9}}\n");
        std::fs::write(&path, forged).unwrap();
        let err = Checkpoint::open(tmp.path()).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Corrupt { file, .. } if file == &path),
            "{err:?}"
        );
        assert!(err.to_string().contains("secret_since is 9"), "{err}");
    }

    #[test]
    fn second_open_is_locked_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let first = Checkpoint::open(tmp.path()).unwrap();
        let err = Checkpoint::open(tmp.path()).unwrap_err();
        let CheckpointError::Locked { dir, holder } = &err else {
            panic!("expected Locked, got {err:?}");
        };
        assert_eq!(dir, tmp.path());
        assert!(
            holder.starts_with(&format!("pid {} on host ", std::process::id())),
            "{holder}"
        );
        assert!(holder.contains(" since "), "{holder}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!(
            "checkpoint {} is in use by pid ",
            tmp.path().display()
        )));
        assert!(msg.ends_with("; stop that query first"), "{msg}");
        // The holder's record is what the file says.
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.path().join("lock")).unwrap())
                .unwrap();
        assert_eq!(record["pid"], json!(std::process::id()));
        let started = record["started_at"].as_str().unwrap();
        assert!(started.len() == 20 && started.ends_with('Z') && started.as_bytes()[10] == b'T');
        drop(first);
        let again = Checkpoint::open(tmp.path()).unwrap();
        drop(again);
    }

    #[test]
    fn a_stale_lock_file_does_not_block() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("lock"),
            r#"{"pid":999999,"host":"gone","started_at":"2020-01-01T00:00:00Z"}"#,
        )
        .unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        let text = std::fs::read_to_string(tmp.path().join("lock")).unwrap();
        assert!(
            text.contains(&format!("\"pid\":{}", std::process::id())),
            "{text}"
        );
        drop(cp);
    }

    #[test]
    fn purge_before_deletes_older_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        assert_eq!(cp.commits().purge_before(5).unwrap(), 0);
        for n in 0..6 {
            cp.commits().put(n, &n).unwrap();
        }
        std::fs::write(tmp.path().join("commits/.1.x.tmp"), "").unwrap();
        assert_eq!(cp.commits().purge_before(4).unwrap(), 4);
        assert_eq!(cp.commits().ids().unwrap(), vec![4, 5]);
        assert_eq!(cp.commits().get::<u64>(4).unwrap(), Some(4));
        assert_eq!(cp.commits().purge_before(4).unwrap(), 0);
    }

    #[test]
    fn progress_lines_are_appended() {
        let tmp = tempfile::tempdir().unwrap();
        let cp = Checkpoint::open(tmp.path()).unwrap();
        cp.append_progress(&json!({"batchId": 0, "numInputRows": 3}))
            .unwrap();
        cp.append_progress(&json!({"batchId": 1, "numInputRows": 0}))
            .unwrap();
        let text = std::fs::read_to_string(tmp.path().join("progress.jsonl")).unwrap();
        assert_eq!(
            text,
            "{\"batchId\":0,\"numInputRows\":3}\n{\"batchId\":1,\"numInputRows\":0}\n"
        );
    }
}
