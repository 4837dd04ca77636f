//! Numbered entry logs: `offsets/`, `commits/` and `sources/<i>/`.
//!
//! Why it exists: the three logs share one discipline (entry N is written once, atomically, in
//! Spark's `v1` format, and is checked on read) and differ only in payload.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{CheckpointError, MAX_BATCH_ID, fsio};

/// The first line of every entry.
const VERSION_LINE: &[u8] = b"v1";

/// One directory of numbered entries inside an open [`super::Checkpoint`].
///
/// Borrowing the checkpoint ties the log to the lock: entries are written only while it is held.
#[derive(Debug, Clone)]
pub struct BatchLog<'a> {
    dir: PathBuf,
    _checkpoint: PhantomData<&'a super::Checkpoint>,
}

impl BatchLog<'_> {
    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            _checkpoint: PhantomData,
        }
    }

    /// The directory of this log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of entry `n` (whether or not it exists).
    pub fn entry_path(&self, n: u64) -> PathBuf {
        self.dir.join(n.to_string())
    }

    /// The highest batch id present, `None` when the log is empty or does not exist yet.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] when the directory cannot be listed.
    pub fn latest(&self) -> Result<Option<u64>, CheckpointError> {
        Ok(self.ids()?.last().copied())
    }

    /// All batch ids present, ascending. Names that are not a canonical decimal number (temporary
    /// files, `012`, anything else) are ignored.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] when the directory cannot be listed, [`CheckpointError::Corrupt`]
    /// naming an entry whose number is above [`MAX_BATCH_ID`].
    pub fn ids(&self) -> Result<Vec<u64>, CheckpointError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::io(&self.dir, "list", e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(&self.dir, "list", e))?;
            let name = entry.file_name();
            match name.to_str().map_or(EntryName::Other, parse_entry_name) {
                EntryName::Id(n) => ids.push(n),
                EntryName::TooLarge => {
                    return Err(CheckpointError::corrupt(
                        &self.dir.join(&name),
                        format!(
                            "batch id {} is above the largest batch id {MAX_BATCH_ID}; \
                             the entry was not written by Weir",
                            name.to_string_lossy()
                        ),
                    ));
                }
                EntryName::Other => {}
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Reads entry `n`, `None` when it does not exist.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Corrupt`] naming the file when it is empty, truncated, of another
    /// version, not JSON or not of type `T`, or when its name is held by a dangling link;
    /// [`CheckpointError::Io`] when it cannot be read.
    pub fn get<T: DeserializeOwned>(&self, n: u64) -> Result<Option<T>, CheckpointError> {
        let path = self.entry_path(n);
        read_entry(&path)?
            .map(|bytes| parse_entry(&path, &bytes))
            .transpose()
    }

    /// Writes entry `n` atomically. Writing the same value again (a replayed batch) leaves the
    /// entry as it is.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Conflict`] naming the file when entry `n` exists with a different value,
    /// [`CheckpointError::Corrupt`] when the existing entry is damaged or `n` is above
    /// [`MAX_BATCH_ID`] (the ids before it were altered), [`CheckpointError::Encode`] or
    /// [`CheckpointError::Io`] when the entry cannot be written.
    pub fn put<T: Serialize>(&self, n: u64, value: &T) -> Result<(), CheckpointError> {
        self.put_bytes(n, value).map(drop)
    }

    /// As [`put`](Self::put), and returns entry `n` as [`get`](Self::get) would read it back
    /// (parsed from the bytes on disk, which a replayed batch may have written with another key
    /// order), without reading the file again.
    ///
    /// # Errors
    ///
    /// As [`put`](Self::put), and [`CheckpointError::Corrupt`] when the entry does not parse
    /// as a `U`.
    pub fn put_and_get<T: Serialize, U: DeserializeOwned>(
        &self,
        n: u64,
        value: &T,
    ) -> Result<U, CheckpointError> {
        let bytes = self.put_bytes(n, value)?;
        parse_entry(&self.entry_path(n), &bytes)
    }

    /// Writes entry `n` unless it exists with the same value; returns the entry's bytes.
    ///
    /// The existence check is the rename itself, or the hard link that stands in for it (it
    /// never replaces an entry, not even a dangling link, which is reported), so a new entry
    /// costs no lookup before it is written; the checkpoint lock admits one writer besides.
    fn put_bytes<T: Serialize>(&self, n: u64, value: &T) -> Result<Vec<u8>, CheckpointError> {
        let path = self.entry_path(n);
        if n > MAX_BATCH_ID {
            return Err(CheckpointError::corrupt(
                &path,
                format!(
                    "batch id {n} would be above the largest batch id {MAX_BATCH_ID}; \
                     the ids of the entries before it were altered"
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(128);
        bytes.extend_from_slice(VERSION_LINE);
        bytes.push(b'\n');
        serde_json::to_writer(&mut bytes, value).map_err(|source| CheckpointError::Encode {
            file: path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        if fsio::write_new(&path, &bytes)? {
            return Ok(bytes);
        }
        // The entry existed a moment ago: if it is gone now, something else removed it.
        let existing = read_entry(&path)?.ok_or_else(|| {
            CheckpointError::io(
                &path,
                "read",
                std::io::Error::from_raw_os_error(libc::ENOENT),
            )
        })?;
        if existing == bytes {
            return Ok(existing);
        }
        // Same value with another key order (e.g. from a map) is the same entry.
        let old: serde_json::Value = parse_entry(&path, &existing)?;
        let new: serde_json::Value = parse_entry(&path, &bytes)?;
        if old == new {
            return Ok(existing);
        }
        Err(CheckpointError::Conflict {
            file: path,
            batch: n,
        })
    }

    /// Deletes entry `n` if it exists (an entry written for a batch that was
    /// never planned, found after a crash).
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] naming the entry that could not be deleted.
    pub fn remove(&self, n: u64) -> Result<(), CheckpointError> {
        let path = self.entry_path(n);
        match std::fs::remove_file(&path) {
            Ok(()) => fsio::sync_dir(&self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CheckpointError::io(&path, "delete", e)),
        }
    }

    /// Deletes every entry with an id below `n` and returns how many were deleted.
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Io`] naming the entry that could not be deleted.
    pub fn purge_before(&self, n: u64) -> Result<usize, CheckpointError> {
        let mut deleted = 0;
        for id in self.ids()?.into_iter().take_while(|&id| id < n) {
            let path = self.entry_path(id);
            match std::fs::remove_file(&path) {
                Ok(()) => deleted += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(CheckpointError::io(&path, "delete", e)),
            }
        }
        if deleted > 0 {
            fsio::sync_dir(&self.dir)?;
        }
        Ok(deleted)
    }
}

/// One log of a [`super::CheckpointReader`]: the read side of [`BatchLog`], with no way to
/// write (the reader holds no lock).
#[derive(Debug, Clone)]
pub struct LogReader(BatchLog<'static>);

impl LogReader {
    pub(super) fn new(dir: PathBuf) -> Self {
        Self(BatchLog::new(dir))
    }

    /// The directory of this log.
    pub fn dir(&self) -> &Path {
        self.0.dir()
    }

    /// The file of entry `n` (whether or not it exists).
    pub fn entry_path(&self, n: u64) -> PathBuf {
        self.0.entry_path(n)
    }

    /// As [`BatchLog::latest`].
    ///
    /// # Errors
    ///
    /// As [`BatchLog::ids`].
    pub fn latest(&self) -> Result<Option<u64>, CheckpointError> {
        self.0.latest()
    }

    /// As [`BatchLog::ids`].
    ///
    /// # Errors
    ///
    /// As [`BatchLog::ids`].
    pub fn ids(&self) -> Result<Vec<u64>, CheckpointError> {
        self.0.ids()
    }

    /// As [`BatchLog::get`]; `T = serde_json::Value` reads any entry.
    ///
    /// # Errors
    ///
    /// As [`BatchLog::get`].
    pub fn get<T: DeserializeOwned>(&self, n: u64) -> Result<Option<T>, CheckpointError> {
        self.0.get(n)
    }
}

/// What a file name in a log directory is.
#[derive(Debug, PartialEq, Eq)]
enum EntryName {
    /// A canonical decimal number (no sign, no leading zero except `0` itself) up to
    /// [`MAX_BATCH_ID`]: an entry.
    Id(u64),
    /// A canonical decimal number above [`MAX_BATCH_ID`] (or above `u64::MAX`).
    TooLarge,
    /// Anything else (temporary files, `012`): not an entry.
    Other,
}

fn parse_entry_name(name: &str) -> EntryName {
    let canonical = !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_digit())
        && (name == "0" || !name.starts_with('0'));
    if !canonical {
        return EntryName::Other;
    }
    match name.parse::<u64>() {
        Ok(n) if n <= MAX_BATCH_ID => EntryName::Id(n),
        _ => EntryName::TooLarge,
    }
}

/// The bytes of the entry at `path`, `None` when nothing holds its name. A dangling link
/// holds the name without an entry to read through it: the listing counts it and `put`
/// cannot write there, so it is reported as corrupt, never as a missing entry.
fn read_entry(path: &Path) -> Result<Option<Vec<u8>>, CheckpointError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_symlink()) {
                Err(CheckpointError::corrupt(
                    path,
                    "the entry's name is held by a dangling link",
                ))
            } else {
                Ok(None)
            }
        }
        Err(e) => Err(CheckpointError::io(path, "read", e)),
    }
}

fn parse_entry<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, CheckpointError> {
    if bytes.is_empty() {
        return Err(CheckpointError::corrupt(path, "the file is empty"));
    }
    let Some(eol) = bytes.iter().position(|&b| b == b'\n') else {
        return Err(CheckpointError::corrupt(
            path,
            "the file is truncated (no newline after the version line)",
        ));
    };
    let version = &bytes[..eol];
    if version != VERSION_LINE {
        let is_version =
            version.len() > 1 && version[0] == b'v' && version[1..].iter().all(u8::is_ascii_digit);
        let reason = if is_version {
            format!(
                "the entry is in format {} but this build reads only v1",
                String::from_utf8_lossy(version)
            )
        } else {
            "the file does not start with the version line `v1`".to_owned()
        };
        return Err(CheckpointError::corrupt(path, reason));
    }
    let body = &bytes[eol + 1..];
    let Some(body) = body.strip_suffix(b"\n") else {
        return Err(CheckpointError::corrupt(
            path,
            "the file is truncated (no final newline)",
        ));
    };
    serde_json::from_slice(body).map_err(|e| {
        let reason = if e.is_data() {
            format!("the entry does not have the expected form (line 2 of the file): {e}")
        } else {
            format!("invalid JSON on line 2 of the file: {e}")
        };
        CheckpointError::corrupt(path, reason)
    })
}

#[cfg(test)]
mod tests {
    use super::{EntryName, MAX_BATCH_ID, parse_entry_name};

    #[test]
    fn entry_names() {
        assert_eq!(parse_entry_name("0"), EntryName::Id(0));
        assert_eq!(parse_entry_name("17"), EntryName::Id(17));
        assert_eq!(
            parse_entry_name("9223372036854775807"),
            EntryName::Id(MAX_BATCH_ID)
        );
        for huge in [
            "9223372036854775808",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999",
        ] {
            assert_eq!(parse_entry_name(huge), EntryName::TooLarge, "{huge}");
        }
        for other in ["", "+1", "01", ".1.tmp", "1.tmp", "-1", "x"] {
            assert_eq!(parse_entry_name(other), EntryName::Other, "{other}");
        }
    }
}
