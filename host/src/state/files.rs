//! Names and durable file operations of a store directory.
//!
//! Why it exists: recovery is only as good as the order in which files become durable. Everything
//! the store publishes (a changelog, a snapshot directory) is first written under a hidden
//! temporary name, fsynced, then renamed into place and the directory fsynced, so a crash leaves
//! either the old set of files or the new one plus a `.tmp-` leftover that `open` removes.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};

use super::StateError;

/// Prefix of in-flight files and directories; anything with it is garbage after a crash.
pub(super) const TMP_PREFIX: &str = ".tmp-";
/// The RocksDB store's working database (rebuilt from snapshot + changelogs by every `open`).
pub(super) const WORK_DIR: &str = "work";
/// The metadata file inside every snapshot directory.
pub(super) const SNAPSHOT_META: &str = "snapshot.meta";

pub(super) fn changelog_name(version: u64) -> String {
    format!("{version}.changelog")
}

pub(super) fn snapshot_name(version: u64) -> String {
    format!("snapshot-{version}")
}

/// The versions that have a changelog file or a snapshot directory.
#[derive(Debug, Default)]
pub(super) struct FileIndex {
    pub changelogs: BTreeSet<u64>,
    pub snapshots: BTreeSet<u64>,
}

/// Lists `dir`, removing leftovers of interrupted writes and the RocksDB working directory.
pub(super) fn scan_dir(dir: &Path) -> Result<FileIndex, StateError> {
    let mut index = FileIndex::default();
    let entries = std::fs::read_dir(dir).map_err(|e| StateError::io(dir, "list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StateError::io(dir, "list", e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(TMP_PREFIX) || name == WORK_DIR {
            remove_path(&entry.path())?;
        } else if let Some(v) = name.strip_suffix(".changelog") {
            if let Ok(v) = v.parse::<u64>() {
                index.changelogs.insert(v);
            }
        } else if let Some(v) = name.strip_prefix("snapshot-")
            && let Ok(v) = v.parse::<u64>()
        {
            index.snapshots.insert(v);
        }
    }
    Ok(index)
}

/// Removes a file or a directory tree; a path that does not exist is not an error.
pub(super) fn remove_path(path: &Path) -> Result<(), StateError> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(StateError::io(path, "remove", e))
        }
        _ => Ok(()),
    }
}

/// Makes renames and removals in `dir` durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), StateError> {
    crate::durable::sync_dir(dir).map_err(|e| StateError::io(&e.path, e.action, e.source))
}

/// Creates a new file for writing (failing if it exists).
pub(super) fn create_new(path: &Path) -> Result<File, StateError> {
    File::options()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| StateError::io(path, "create", e))
}

/// Renames `from` to `to` (replacing a file `to`) and fsyncs their directory.
pub(super) fn publish(from: &Path, to: &Path) -> Result<(), StateError> {
    std::fs::rename(from, to).map_err(|e| StateError::io(to, "rename into place", e))?;
    sync_dir(to.parent().unwrap_or(Path::new(".")))
}

/// Fills the empty directory `to` with the files of the snapshot `from`: immutable table files
/// (`.sst`, `.blob`) are hard-linked (copied if linking fails, e.g. across file systems); every
/// other file is copied, because the database opened in `to` may rewrite it and a snapshot must
/// stay untouched. `skip` names a file of `from` not to take.
pub(super) fn link_or_copy_dir(from: &Path, to: &Path, skip: &str) -> Result<(), StateError> {
    let entries = std::fs::read_dir(from).map_err(|e| StateError::io(from, "list", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StateError::io(from, "list", e))?;
        let name = entry.file_name();
        if name == skip {
            continue;
        }
        let src = entry.path();
        let dst: PathBuf = to.join(&name);
        let immutable = name
            .to_str()
            .is_some_and(|n| n.ends_with(".sst") || n.ends_with(".blob"));
        if immutable && std::fs::hard_link(&src, &dst).is_ok() {
            continue;
        }
        std::fs::copy(&src, &dst).map_err(|e| StateError::io(&src, "copy", e))?;
    }
    Ok(())
}
