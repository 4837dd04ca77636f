//! Dead-letter files: the malformed lines of one micro-batch, kept for inspection and replay.
//!
//! A batch can be re-run after a crash (DESIGN.md §3), so the file is named by batch id and
//! written atomically (temporary file, fsync, rename, fsync of the directory): a replay replaces
//! the file of its first attempt instead of appending a second copy, and a reader never sees a
//! half-written file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{DecodeError, MalformedRecord};

/// One line of a dead-letter file (field order is the file format).
#[derive(Serialize)]
struct Letter<'a> {
    origin: &'a str,
    line: u64,
    error: &'a str,
    raw: &'a str,
}

/// The dead-letter file of `batch_id` in `dir`: `batch-<batch_id, 20 digits>.jsonl`.
pub fn dead_letter_path(dir: &Path, batch_id: u64) -> PathBuf {
    dir.join(format!("batch-{batch_id:020}.jsonl"))
}

/// Writes `records` as JSON lines `{"origin":..,"line":..,"error":..,"raw":..}` to
/// [`dead_letter_path`], atomically replacing a file of an earlier attempt of the same batch.
/// Creates `dir` if needed. Writes nothing and returns `None` when `records` is empty.
///
/// # Errors
///
/// [`DecodeError::DeadLetterIo`] naming the path that could not be created, written, synced or
/// renamed.
pub fn write_dead_letters(
    dir: &Path,
    batch_id: u64,
    records: &[MalformedRecord],
) -> Result<Option<PathBuf>, DecodeError> {
    if records.is_empty() {
        return Ok(None);
    }
    let path = dead_letter_path(dir, batch_id);
    crate::durable::replace_with(&path, |file| {
        write_records(file, records).map_err(|source| DecodeError::DeadLetterIo {
            path: path.clone(),
            source,
        })
    })?;
    Ok(Some(path))
}

fn write_records(file: &mut File, records: &[MalformedRecord]) -> std::io::Result<()> {
    let mut w = BufWriter::new(file);
    for r in records {
        let letter = Letter {
            origin: &r.origin,
            line: r.line,
            error: &r.error,
            raw: &r.raw,
        };
        serde_json::to_writer(&mut w, &letter)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

impl From<crate::durable::FsError> for DecodeError {
    fn from(e: crate::durable::FsError) -> Self {
        DecodeError::DeadLetterIo {
            path: e.path,
            source: e.source,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn record(line: u64, raw: &str) -> MalformedRecord {
        MalformedRecord {
            origin: "in/orders-00001.json".into(),
            line,
            raw: raw.into(),
            error: "not a JSON object: expected '{' at column 1".into(),
        }
    }

    #[test]
    fn writes_json_lines_and_replaces_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("dead/letters");
        assert_eq!(write_dead_letters(&dir, 7, &[]).unwrap(), None);
        assert!(!dir.exists(), "nothing written for an empty slice");

        let first = [record(3, "garbage \"quoted\" ##"), record(9, "{\"a\":")];
        let path = write_dead_letters(&dir, 7, &first).unwrap().unwrap();
        assert_eq!(path, dir.join("batch-00000000000000000007.jsonl"));
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[0],
            r#"{"origin":"in/orders-00001.json","line":3,"error":"not a JSON object: expected '{' at column 1","raw":"garbage \"quoted\" ##"}"#
        );
        let v: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
        assert_eq!(v["raw"], "{\"a\":");
        assert_eq!(v["line"], 9);

        // A replay of batch 7 replaces its file; no temporary file is left behind.
        let replay = [record(4, "x")];
        write_dead_letters(&dir, 7, &replay).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("\"line\":4"));
        let names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["batch-00000000000000000007.jsonl".to_string()]);
    }

    #[test]
    fn names_the_path_on_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        fs::write(&blocker, "x").unwrap();
        let err = write_dead_letters(&blocker.join("sub"), 1, &[record(1, "x")]).unwrap_err();
        assert!(err.to_string().contains("file/sub"), "{err}");
    }
}
