//! Atomic file replacement and wall-clock stamps for the checkpoint.
//!
//! Why it exists: a checkpoint file must never be seen half-written, even after a power cut, so
//! every write goes through one routine that writes a hidden temporary file next to the target,
//! fsyncs it, renames it over the target and fsyncs the directory.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::CheckpointError;

/// Writes `bytes` to `path` atomically, replacing any existing file. Creates the parent directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = parent_of(path);
    if !dir.is_dir() {
        std::fs::create_dir_all(&dir)
            .map_err(|e| CheckpointError::io(&dir, "create directory", e))?;
        // The new directory's own entry must be durable too, or the renamed file may vanish.
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    let tmp = temp_path(&dir, path);
    let result = write_and_rename(&tmp, path, bytes);
    if result.is_err() {
        // Best effort: the temp file is hidden and ignored by readers, so a leftover is harmless.
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    sync_dir(&dir)
}

fn write_and_rename(tmp: &Path, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| CheckpointError::io(tmp, "create temporary file", e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| CheckpointError::io(tmp, "write temporary file", e))?;
    drop(file);
    std::fs::rename(tmp, path)
        .map_err(|e| CheckpointError::io(path, "rename temporary file onto", e))
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `.<name>.<uuid>.tmp` in `dir`: hidden, unique, and never a valid entry name.
fn temp_path(dir: &Path, path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()))
}

/// Makes a rename in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CheckpointError::io(dir, "fsync directory", e))
}

/// The current time as RFC 3339 UTC with seconds, e.g. `2024-03-01T00:03:07Z`.
pub(super) fn now_rfc3339() -> String {
    // A clock before 1970 is reported as the epoch rather than failing the lock.
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let secs = i64::try_from(secs).unwrap_or(i64::MAX);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    // d is in 1..=31 and m in 1..=12 by construction, so the casts are lossless.
    (y, m as u32, d as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("sub/file");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(tmp.path().join("sub")).unwrap().count(),
            1
        );
    }
}
