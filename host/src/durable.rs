//! Durable file writes: the one routine every writer of checkpoint, state,
//! sink and dead-letter files uses, so that none of them is ever seen
//! half-written, even after a power cut.
//!
//! A file is written under a hidden temporary name beside its target, fsynced,
//! renamed over the target, and the directory fsynced so that the rename
//! itself survives. Callers wrap [`FsError`] into their own error type, which
//! names what the file was for.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The mode a new file is created with, before the umask: the standard library's default.
const DEFAULT_MODE: u32 = 0o666;

/// A file-system step that failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {source}", path.display())]
pub(crate) struct FsError {
    pub path: PathBuf,
    pub action: &'static str,
    #[source]
    pub source: std::io::Error,
}

impl FsError {
    fn new(path: &Path, action: &'static str, source: std::io::Error) -> Self {
        Self {
            path: path.to_path_buf(),
            action,
            source,
        }
    }
}

/// Writes `bytes` to `path` atomically, replacing any existing file, and
/// creates the parent directory (durably) when it is missing.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_atomically_with_mode(path, bytes, DEFAULT_MODE)
}

/// As [`write_atomically`], for a file only its owner may read (mode 0600): the temporary
/// file is created with that mode, so the content is never readable by others, not even
/// for a moment.
pub(crate) fn write_private_atomically(path: &Path, bytes: &[u8]) -> Result<(), FsError> {
    write_atomically_with_mode(path, bytes, 0o600)
}

fn write_atomically_with_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), FsError> {
    replace_with_mode(path, mode, |file| {
        file.write_all(bytes)
            .map_err(|e| FsError::new(path, "write", e))
    })
}

/// As [`write_atomically`], with the content written by `write` into the
/// temporary file (which is synced afterwards). `write`'s own errors come
/// back as they are, so that a caller keeps its typed errors (e.g. Parquet's).
pub(crate) fn replace_with<E: From<FsError>>(
    path: &Path,
    write: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(), E> {
    replace_with_mode(path, DEFAULT_MODE, write)
}

fn replace_with_mode<E: From<FsError>>(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(), E> {
    let (dir, tmp) = write_temporary(path, mode, write)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        // Best effort: the temp file is hidden and ignored by readers, so a leftover is harmless.
        let _ = std::fs::remove_file(&tmp);
        return Err(FsError::new(path, "rename temporary file onto", e).into());
    }
    Ok(sync_dir(&dir)?)
}

/// What [`write_new`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// `path` did not exist and now holds the bytes, durably.
    New,
    /// `path` existed and was left as it was.
    Exists,
}

/// Writes `bytes` to `path` atomically unless `path` exists, as [`write_atomically`] does
/// otherwise. The check and the rename are one step (`renameat2` with `RENAME_NOREPLACE`, or a
/// hard link where the file system refuses that flag), so no lookup comes before the write.
/// An existing `path` is left as it is, whatever it is; its directory is synced all the same,
/// so that an entry renamed by a process that crashed before its own sync is durable before
/// it is relied on.
pub(crate) fn write_new(path: &Path, bytes: &[u8]) -> Result<Written, FsError> {
    let (dir, tmp) = write_temporary(path, DEFAULT_MODE, |file| {
        file.write_all(bytes)
            .map_err(|e| FsError::new(path, "write", e))
    })?;
    let written = match rename_new(&tmp, path) {
        Ok(()) => Written::New,
        Err(e) => {
            // Best effort, as in `replace_with_mode`.
            let _ = std::fs::remove_file(&tmp);
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(FsError::new(path, "rename temporary file onto", e));
            }
            Written::Exists
        }
    };
    sync_dir(&dir)?;
    Ok(written)
}

/// Gives file `from` the name `to` unless `to` exists (`AlreadyExists`, and `from` stays).
fn rename_new(from: &Path, to: &Path) -> std::io::Result<()> {
    match rename_no_replace(from, to) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
            link_new(from, to)
        }
        other => other,
    }
}

/// [`rename_new`] where `renameat2`'s flag is refused: a hard link refuses an existing name
/// (even a dangling link) in one step, and the temporary name is removed after it. A failure
/// to remove it leaves a hidden temporary file, which readers ignore. Where links are refused
/// too (some FUSE file systems), a lookup just before a plain rename stands in: sound for the
/// files this is used for, whose folder has one writer (the checkpoint lock).
fn link_new(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(from, to) {
        Ok(()) => {
            let _ = std::fs::remove_file(from);
            Ok(())
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS)
            ) =>
        {
            match std::fs::symlink_metadata(to) {
                Ok(_) => Err(std::io::ErrorKind::AlreadyExists.into()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::rename(from, to),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// `rename(from, to)` that fails with `AlreadyExists` instead of replacing `to`.
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both paths are NUL-terminated strings that outlive the call, and `renameat2`
    // only reads them.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Writes a hidden temporary file beside `path` with `write` and fsyncs it, creating the
/// directory (durably) when it is missing; returns the directory and the temporary file. The
/// directory is looked for only when the creation fails for want of it, not before each write.
fn write_temporary<E: From<FsError>>(
    path: &Path,
    mode: u32,
    write: impl FnOnce(&mut File) -> Result<(), E>,
) -> Result<(PathBuf, PathBuf), E> {
    let dir = parent_of(path);
    let tmp = temp_path(&dir, path);
    let create = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
    };
    let mut file = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&dir).map_err(|e| FsError::new(&dir, "create directory", e))?;
            // The new directory's own entry must be durable too, or the renamed file may vanish.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
            create()
        }
        other => other,
    }
    .map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTDIR) {
            // Something that is not a directory holds the name of the directory or of one
            // of the folders above it.
            FsError::new(&dir, "create a temporary file in", e)
        } else {
            FsError::new(&tmp, "create temporary file", e)
        }
    })?;
    let written = write(&mut file).and_then(|()| {
        file.sync_all()
            .map_err(|e| FsError::new(&tmp, "fsync temporary file", e).into())
    });
    drop(file);
    if let Err(e) = written {
        // Best effort, as in `replace_with_mode`.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok((dir, tmp))
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `.<name>.<uuid>.tmp` in `dir`: hidden, unique, and never a valid entry name
/// (the files sink removes leftovers of its own by this shape: `.batch-*.tmp`).
fn temp_path(dir: &Path, path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()))
}

/// Makes renames, creations and removals in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), FsError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| FsError::new(dir, "fsync directory", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names in `dir`.
    fn names(dir: &Path) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect()
    }

    #[test]
    fn replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/entry");
        write_atomically(&path, b"one").expect("first write");
        write_atomically(&path, b"two").expect("second write");
        assert_eq!(std::fs::read(&path).expect("read"), b"two");
        assert_eq!(names(&dir.path().join("sub")), ["entry"]);
    }

    #[test]
    fn a_new_file_is_written_once_and_never_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/entry");
        assert_eq!(write_new(&path, b"one").expect("first write"), Written::New);
        assert_eq!(
            write_new(&path, b"two").expect("second write"),
            Written::Exists
        );
        assert_eq!(std::fs::read(&path).expect("read"), b"one");
        assert_eq!(names(&dir.path().join("sub")), ["entry"]);
        // Whatever holds the name is left as it is, a directory too.
        let taken = dir.path().join("taken");
        std::fs::create_dir(&taken).expect("mkdir");
        assert_eq!(write_new(&taken, b"three").expect("write"), Written::Exists);
        assert!(taken.is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 2);
    }

    #[test]
    fn the_link_fallback_never_replaces_a_name_a_dangling_link_included() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (tmp, path) = (dir.path().join(".x.tmp"), dir.path().join("x"));
        std::fs::write(&tmp, b"one").expect("write");
        link_new(&tmp, &path).expect("link");
        assert_eq!(std::fs::read(&path).expect("read"), b"one");
        assert!(!tmp.exists(), "the temporary name is removed");
        std::fs::write(&tmp, b"two").expect("write");
        let err = link_new(&tmp, &path).expect_err("the name is taken");
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).expect("read"), b"one");
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).expect("symlink");
        let err = link_new(&tmp, &dangling).expect_err("a dangling link holds the name");
        assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(
            std::fs::symlink_metadata(&dangling)
                .expect("lstat")
                .is_symlink()
        );
    }

    #[test]
    fn a_file_where_the_directory_should_be_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_a_dir = dir.path().join("offsets");
        std::fs::write(&not_a_dir, b"x").expect("write");
        let err = write_new(&not_a_dir.join("3"), b"entry").expect_err("no directory");
        assert_eq!(err.path, not_a_dir);
        assert_eq!(err.action, "create a temporary file in");
        let err = write_atomically(&not_a_dir.join("3"), b"entry").expect_err("no directory");
        assert_eq!(err.path, not_a_dir);
    }

    #[test]
    fn a_private_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secret");
        write_private_atomically(&path, b"hush").expect("write");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).expect("read"), b"hush");
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("entry");
        write_atomically(&path, b"old").expect("write");
        let err = replace_with(&path, |_| {
            Err(FsError::new(
                &path,
                "write",
                std::io::Error::other("disk full"),
            ))
        })
        .expect_err("the write fails");
        assert_eq!(err.action, "write");
        assert_eq!(std::fs::read(&path).expect("read"), b"old");
        assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 1);
    }
}
