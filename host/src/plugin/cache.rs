//! The on-disk cache of compiled plugins, trusted only as far as it can be checked.
//!
//! A compiled artifact is native code: wasmtime maps it and jumps into it, checking only its
//! header. Whoever can write one file into the cache folder therefore runs code as the host, so
//! the folder is treated like `~/.ssh`, not like a scratch directory:
//!
//! - The folder is used only when it is owned by the host's effective uid and not writable by
//!   group or others; the host creates it with mode 0700. Otherwise the host says why (a
//!   warning naming the folder) and compiles without the cache: a slow start beats a refused
//!   plugin, and nothing is written to a folder someone else controls.
//! - The folder holds a key, `cache.key` (32 random bytes, mode 0600, owned by the uid; any
//!   other key file makes the whole cache untrusted, since a key others can read lets them
//!   forge artifacts). It is written under a temporary name and linked into place, so a
//!   concurrent writer never sees half a key, and the first writer's key wins.
//! - Each artifact is a file of the same owner, not writable by group or others, ending with
//!   a trailer: [`MAC_MAGIC`] and HMAC-SHA256 under the key over the artifact's file name and
//!   its bytes. The name is covered so that a valid artifact cannot be renamed into the place
//!   of another plugin's (a pinned `sha256` names the `.wasm`, not what the cache returns).
//!   The trailer is appended rather than kept beside the artifact so that one rename publishes
//!   both: there is no half-written pair. A crash may still leave a truncated file (artifacts
//!   are not fsynced: losing one costs a compile); its MAC fails and it is compiled again.
//! - Loading reads the file once, checks ownership and mode on the opened handle (not on the
//!   path, which could be swapped), verifies the MAC, and deserializes those very bytes. An
//!   artifact that fails any check is deleted, compiled again from the `.wasm` and rewritten,
//!   with a warning naming the file and the reason.
//!
//! Reading and hashing the artifact costs more than mapping it (milliseconds for tens of
//! megabytes), still far below a compile.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime::Engine;
use wasmtime::component::Component;

/// The key file in the cache folder.
pub(super) const KEY_FILE: &str = "cache.key";
/// Length of the key and of a MAC.
const KEY_LEN: usize = 32;
/// Marks an artifact that carries a MAC, so that an artifact of an older Weir (none) is told
/// apart from a damaged one in the warning.
pub(super) const MAC_MAGIC: &[u8; 8] = b"weirmac1";
/// What follows the compiled bytes: the magic and the MAC.
pub(super) const TRAILER_LEN: usize = MAC_MAGIC.len() + KEY_LEN;

/// Numbers the temporary files of this process.
static NEXT_TMP: AtomicU64 = AtomicU64::new(0);

/// Why a folder or file of the cache is not trusted.
#[derive(Debug, thiserror::Error)]
pub(super) enum Distrust {
    #[error("it is not a regular file")]
    NotFile,
    #[error("it is a symbolic link")]
    Symlink,
    #[error("it is owned by uid {owner}, not by this process's uid {euid}")]
    Owner { owner: u32, euid: u32 },
    #[error("its mode {mode:04o} lets group or others write it")]
    Writable { mode: u32 },
    #[error("its mode {mode:04o} is not 0600 (group or others may read or write the key)")]
    KeyMode { mode: u32 },
    #[error("it holds {len} bytes, not a key of {KEY_LEN}")]
    KeyLength { len: u64 },
    #[error("it has no MAC (written by an older Weir, or not by Weir)")]
    NoMac,
    #[error("its MAC does not match its bytes (changed after it was written)")]
    BadMac,
    #[error("wasmtime refused it: {0}")]
    Refused(String),
    #[error("it cannot be read: {0}")]
    Unreadable(std::io::Error),
}

/// A cache folder that passed its checks, with its key.
pub(super) struct CompiledCache {
    dir: PathBuf,
    /// HMAC-SHA256 keyed with the folder's key, cloned for every MAC.
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for CompiledCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledCache")
            .field("dir", &self.dir)
            .field("keyed", &"<redacted>")
            .finish()
    }
}

/// The effective uid of the host process.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// The checks every file and the folder of the cache pass: this uid's, not writable by others.
fn check_owner_and_mode(meta: &std::fs::Metadata) -> Result<(), Distrust> {
    let euid = euid();
    if meta.uid() != euid {
        return Err(Distrust::Owner {
            owner: meta.uid(),
            euid,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(Distrust::Writable { mode });
    }
    Ok(())
}

/// Opens a file of the cache without following a symbolic link (`O_NOFOLLOW`), so that what
/// is checked and read is the entry itself.
fn open_nofollow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// A symbolic link opened with `O_NOFOLLOW` fails with `ELOOP`.
fn is_symlink_error(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

impl CompiledCache {
    /// Opens the cache folder `dir`, creating it (mode 0700) and its key when missing.
    ///
    /// `Ok(None)`: the folder or its key is not safe to load native code from; the reason is
    /// logged and nothing has been written.
    ///
    /// # Errors
    /// When the folder or the key cannot be created or read.
    pub(super) fn open(dir: &Path, plugin: &str) -> std::io::Result<Option<Self>> {
        let meta = match std::fs::metadata(dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                create_private_dir(dir)?;
                std::fs::metadata(dir)?
            }
            Err(e) => return Err(e),
        };
        if !meta.is_dir() {
            // As before the checks: a folder that cannot be written is the operator's to fix.
            return Err(std::io::Error::new(
                ErrorKind::NotADirectory,
                "it is not a directory",
            ));
        }
        if let Err(why) = check_owner_and_mode(&meta) {
            tracing::warn!(
                plugin,
                dir = %dir.display(),
                "not using the compiled-plugin cache {}: {why}; compiling without it \
                 (make it owned by this user with mode 0700 to use it)",
                dir.display()
            );
            return Ok(None);
        }
        let key_path = dir.join(KEY_FILE);
        match read_key(&key_path) {
            Ok(Some(key)) => Ok(Some(Self::new(dir, &key))),
            Ok(None) => match create_key(dir, &key_path)? {
                Some(key) => Ok(Some(Self::new(dir, &key))),
                // Another writer linked its key first: theirs is the cache's.
                None => match read_key(&key_path) {
                    Ok(Some(key)) => Ok(Some(Self::new(dir, &key))),
                    Ok(None) => Err(std::io::Error::new(
                        ErrorKind::NotFound,
                        format!("{} vanished while it was created", key_path.display()),
                    )),
                    Err(why) => Ok(untrusted_key(plugin, &key_path, &why)),
                },
            },
            Err(why) => Ok(untrusted_key(plugin, &key_path, &why)),
        }
    }

    fn new(dir: &Path, key: &[u8; KEY_LEN]) -> Self {
        Self {
            dir: dir.to_path_buf(),
            keyed: crate::mac::hmac_sha256(key),
        }
    }

    fn mac(&self, name: &str, bytes: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        mac.update(&(name.len() as u64).to_le_bytes());
        mac.update(name.as_bytes());
        mac.update(bytes);
        mac
    }

    /// The path of artifact `name` in the folder.
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The component stored as `name`, when it passes every check. An artifact that fails
    /// one is deleted, with a warning naming it and why; the caller compiles again.
    pub(super) fn load(&self, engine: &Engine, name: &str, plugin: &str) -> Option<Component> {
        let path = self.path(name);
        let why = match self.read_checked(&path, name) {
            Ok(None) => return None,
            Ok(Some(compiled)) => {
                // SAFETY: these bytes are the ones whose MAC was just verified under the key
                // of a folder and key file owned by this uid and closed to others, and a MAC
                // is only ever written over bytes `precompile_component` produced with this
                // engine's compatibility key (in `name`, which the MAC covers). wasmtime
                // also checks the header and refuses a mismatched engine or version.
                match unsafe { Component::deserialize(engine, &compiled) } {
                    Ok(component) => return Some(component),
                    Err(e) => Distrust::Refused(format!("{e:#}")),
                }
            }
            Err(why) => why,
        };
        tracing::warn!(
            plugin,
            artifact = %path.display(),
            "discarding the compiled plugin {}: {why}; compiling it again",
            path.display()
        );
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != ErrorKind::NotFound
        {
            // The rewrite renames over it anyway.
            tracing::warn!(artifact = %path.display(), "cannot delete {}: {e}", path.display());
        }
        None
    }

    /// The compiled bytes of artifact `name`; `Ok(None)` when there is none.
    fn read_checked(&self, path: &Path, name: &str) -> Result<Option<Vec<u8>>, Distrust> {
        let mut file = match open_nofollow(path) {
            Ok(file) => file,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) if is_symlink_error(&e) => return Err(Distrust::Symlink),
            Err(e) => return Err(Distrust::Unreadable(e)),
        };
        let meta = file.metadata().map_err(Distrust::Unreadable)?;
        if !meta.is_file() {
            return Err(Distrust::NotFile);
        }
        check_owner_and_mode(&meta)?;
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(Distrust::Unreadable)?;
        let Some(body_len) = bytes.len().checked_sub(TRAILER_LEN) else {
            return Err(Distrust::NoMac);
        };
        let (body, trailer) = bytes.split_at(body_len);
        let (magic, tag) = trailer.split_at(MAC_MAGIC.len());
        if magic != MAC_MAGIC {
            return Err(Distrust::NoMac);
        }
        self.mac(name, body)
            .verify_slice(tag)
            .map_err(|_| Distrust::BadMac)?;
        bytes.truncate(body_len);
        Ok(Some(bytes))
    }

    /// Writes `compiled` as artifact `name` with its MAC: a private temporary file renamed
    /// into place, so that readers see the whole artifact or the previous one.
    ///
    /// Not `crate::durable`, on purpose: nothing is fsynced, because the cache is only a cache.
    /// An artifact torn by a power cut fails its MAC in [`Self::load`], which deletes it and
    /// compiles again, so an fsync of every (multi-megabyte) artifact would buy nothing.
    pub(super) fn store(&self, name: &str, compiled: &[u8]) -> std::io::Result<()> {
        let tag = self.mac(name, compiled).finalize().into_bytes();
        let tmp = self.dir.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            NEXT_TMP.fetch_add(1, Ordering::Relaxed)
        ));
        let written = write_new_private(&tmp, &[compiled, MAC_MAGIC, &tag])
            .and_then(|()| std::fs::rename(&tmp, self.path(name)));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

fn untrusted_key(plugin: &str, key_path: &Path, why: &Distrust) -> Option<CompiledCache> {
    tracing::warn!(
        plugin,
        key = %key_path.display(),
        "not using the compiled-plugin cache: its key {}: {why}; compiling without it \
         (delete the key file to start the cache afresh)",
        key_path.display()
    );
    None
}

/// Creates `dir` with mode 0700 (its parents with the default mode); another creator
/// winning the race is fine, the folder is checked afterwards either way.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// The key in `path`; `Ok(None)` when there is no key file yet.
fn read_key(path: &Path) -> Result<Option<[u8; KEY_LEN]>, Distrust> {
    let mut file = match open_nofollow(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if is_symlink_error(&e) => return Err(Distrust::Symlink),
        Err(e) => return Err(Distrust::Unreadable(e)),
    };
    let meta = file.metadata().map_err(Distrust::Unreadable)?;
    if !meta.is_file() {
        return Err(Distrust::NotFile);
    }
    check_owner_and_mode(&meta)?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(Distrust::KeyMode { mode });
    }
    if meta.len() != KEY_LEN as u64 {
        return Err(Distrust::KeyLength { len: meta.len() });
    }
    let mut key = [0u8; KEY_LEN];
    file.read_exact(&mut key).map_err(Distrust::Unreadable)?;
    Ok(Some(key))
}

/// Creates the key file with fresh random bytes; `Ok(None)` when another writer created it
/// first. The key is written whole under a temporary name and hard-linked to `path`, which
/// fails when `path` exists: the key file appears complete or not at all.
fn create_key(dir: &Path, path: &Path) -> std::io::Result<Option<[u8; KEY_LEN]>> {
    let mut key = [0u8; KEY_LEN];
    getrandom::fill(&mut key)
        .map_err(|e| std::io::Error::other(format!("no random bytes for the cache key: {e}")))?;
    let tmp = dir.join(format!(
        ".{KEY_FILE}.{}.{}.tmp",
        std::process::id(),
        NEXT_TMP.fetch_add(1, Ordering::Relaxed)
    ));
    let linked = write_new_private(&tmp, &[&key]).and_then(|()| {
        File::open(&tmp)?.sync_all()?;
        std::fs::hard_link(&tmp, path)
    });
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(Some(key)),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes `parts` to a new file at `path` with mode 0600 (never an existing one).
fn write_new_private(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    for part in parts {
        file.write_all(part)?;
    }
    file.flush()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;
    use crate::plugin::{EngineOptions, LoadedPlugin, PluginEngine};

    /// Everything the log writes, in one buffer.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Self;

        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }

    /// Runs `f` with warnings captured; returns its result and the log's text.
    fn capture<T>(f: impl FnOnce() -> T) -> (T, String) {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(out.clone())
            .finish();
        let value = tracing::subscriber::with_default(subscriber, f);
        let text = String::from_utf8_lossy(&out.0.lock().expect("log buffer")).into_owned();
        (value, text)
    }

    fn engine(dir: &Path) -> PluginEngine {
        PluginEngine::new(EngineOptions {
            cache_dir: Some(dir.to_path_buf()),
            pool: None,
            ..EngineOptions::default()
        })
        .expect("engine")
    }

    fn load(engine: &PluginEngine) -> LoadedPlugin {
        engine
            .load_bytes(
                "filter",
                Path::new("filter_rows.wasm"),
                crate::examples::FILTER_ROWS_WASM,
            )
            .expect("the example plugin loads")
    }

    /// The one artifact in `dir` (besides the key).
    fn artifact(dir: &Path) -> PathBuf {
        let found: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("list the cache")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|x| x == "cwasm"))
            .collect();
        assert_eq!(found.len(), 1, "{found:?}");
        found[0].clone()
    }

    /// Whether the file's trailer is a MAC over its bytes under the folder's key.
    fn mac_verifies(dir: &Path, artifact: &Path) -> bool {
        let key: [u8; KEY_LEN] = std::fs::read(dir.join(KEY_FILE))
            .expect("key")
            .try_into()
            .expect("32 bytes");
        let cache = CompiledCache::new(dir, &key);
        let name = artifact
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a file name");
        matches!(cache.read_checked(artifact, name), Ok(Some(_)))
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_new_cache_is_private_keyed_and_its_artifacts_carry_a_mac() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/cache");
        let engine = engine(&dir);
        assert!(!load(&engine).cached, "an empty cache compiles");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(KEY_FILE)), 0o600);
        assert_eq!(
            std::fs::metadata(dir.join(KEY_FILE)).expect("key").len(),
            32
        );
        let artifact = artifact(&dir);
        assert_eq!(mode(&artifact), 0o600);
        assert!(mac_verifies(&dir, &artifact));
        let bytes = std::fs::read(&artifact).expect("artifact");
        assert_eq!(&bytes[bytes.len() - TRAILER_LEN..][..8], MAC_MAGIC);
        assert_eq!(
            names(&dir).len(),
            2,
            "no temporary file is left: {:?}",
            names(&dir)
        );
        // A second start: another engine, the same folder.
        assert!(load(&self::engine(&dir)).cached);
    }

    #[test]
    fn a_tampered_artifact_is_discarded_compiled_again_and_rewritten() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let artifact = artifact(&dir);
        let original = std::fs::read(&artifact).expect("artifact");
        let mut tampered = original.clone();
        tampered[original.len() / 2] ^= 0x40;
        std::fs::write(&artifact, &tampered).expect("tamper");

        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached, "a tampered artifact is not loaded");
        assert!(log.contains(&artifact.display().to_string()), "{log}");
        assert!(log.contains("MAC does not match"), "{log}");
        let rewritten = std::fs::read(&artifact).expect("rewritten");
        assert_ne!(rewritten, tampered);
        assert!(
            mac_verifies(&dir, &artifact),
            "the rewrite carries a valid MAC"
        );
        assert!(load(&engine(&dir)).cached, "and is loaded from then on");
    }

    #[test]
    fn an_artifact_without_a_mac_is_discarded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let artifact = artifact(&dir);
        // As an older Weir wrote it: the compiled bytes alone, a valid artifact for wasmtime.
        let bytes = std::fs::read(&artifact).expect("artifact");
        std::fs::write(&artifact, &bytes[..bytes.len() - TRAILER_LEN]).expect("strip");

        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached);
        assert!(log.contains("it has no MAC"), "{log}");
        assert!(log.contains(&artifact.display().to_string()), "{log}");
        assert!(mac_verifies(&dir, &artifact));
    }

    #[test]
    fn a_valid_artifact_renamed_into_another_plugins_place_is_discarded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let artifact = artifact(&dir);
        let name = artifact.file_name().and_then(|n| n.to_str()).expect("name");
        let other = dir.join(format!("{}{}", "0".repeat(64), &name[64..]));
        std::fs::copy(&artifact, &other).expect("copy");
        let key: [u8; KEY_LEN] = std::fs::read(dir.join(KEY_FILE))
            .expect("key")
            .try_into()
            .expect("32 bytes");
        let cache = CompiledCache::new(&dir, &key);
        let other_name = other.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(matches!(
            cache.read_checked(&other, other_name),
            Err(Distrust::BadMac)
        ));
    }

    #[test]
    fn an_artifact_writable_by_others_is_discarded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let artifact = artifact(&dir);
        std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached);
        assert!(
            log.contains("mode 0666 lets group or others write it"),
            "{log}"
        );
        assert_eq!(mode(&artifact), 0o600, "rewritten with its own mode");
        assert!(mac_verifies(&dir, &artifact));
    }

    #[test]
    fn an_artifact_owned_by_another_user_is_discarded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let artifact = artifact(&dir);
        let stranger = euid().wrapping_add(4242);
        // Only root may give a file away; elsewhere the owner check is not reachable here.
        if std::os::unix::fs::chown(&artifact, Some(stranger), None).is_err() {
            return;
        }
        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached);
        assert!(log.contains(&format!("owned by uid {stranger}")), "{log}");
        assert_eq!(std::fs::metadata(&artifact).expect("stat").uid(), euid());
    }

    #[test]
    fn a_cache_folder_writable_by_others_is_not_used() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("shared");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached);
        assert!(
            log.contains(&format!(
                "not using the compiled-plugin cache {}: its mode 0777 lets group or others write it",
                dir.display()
            )),
            "{log}"
        );
        assert!(
            names(&dir).is_empty(),
            "nothing is written there: {:?}",
            names(&dir)
        );
        // Not even once an artifact would be there: a second load compiles again.
        assert!(!load(&engine(&dir)).cached);
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn a_cache_folder_that_is_a_file_fails_the_plugin_naming_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("cache");
        std::fs::write(&file, b"not a folder").expect("write");
        let err = engine(&file)
            .load_bytes(
                "filter",
                Path::new("f.wasm"),
                crate::examples::FILTER_ROWS_WASM,
            )
            .expect_err("a file is not a cache folder");
        assert!(
            matches!(&err, crate::plugin::PluginError::Cache { dir, .. } if dir == &file),
            "{err:?}"
        );
        assert!(err.to_string().contains("it is not a directory"), "{err}");
        assert_eq!(std::fs::read(&file).expect("read"), b"not a folder");
    }

    #[test]
    fn a_key_file_others_can_read_makes_the_cache_untrusted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let key = dir.join(KEY_FILE);
        let artifact = artifact(&dir);
        let before = std::fs::read(&artifact).expect("artifact");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(
            !loaded.cached,
            "an artifact under a readable key is not trusted"
        );
        assert!(log.contains(&key.display().to_string()), "{log}");
        assert!(log.contains("mode 0644 is not 0600"), "{log}");
        // Nothing is touched: neither the key nor the artifact.
        assert_eq!(mode(&key), 0o644);
        assert_eq!(std::fs::read(&artifact).expect("artifact"), before);
    }

    #[test]
    fn a_key_of_the_wrong_length_makes_the_cache_untrusted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let key = dir.join(KEY_FILE);
        let mut short = std::fs::read(&key).expect("key");
        short.truncate(16);
        std::fs::write(&key, &short).expect("truncate");
        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached);
        assert!(log.contains("it holds 16 bytes, not a key of 32"), "{log}");
    }

    #[test]
    fn a_symlinked_artifact_is_discarded_and_its_target_left_alone() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        load(&engine(&dir));
        let artifact = artifact(&dir);
        let elsewhere = tmp.path().join("elsewhere.cwasm");
        std::fs::rename(&artifact, &elsewhere).expect("move");
        std::os::unix::fs::symlink(&elsewhere, &artifact).expect("symlink");
        let (loaded, log) = capture(|| load(&engine(&dir)));
        assert!(!loaded.cached);
        assert!(log.contains("it is a symbolic link"), "{log}");
        assert!(elsewhere.is_file());
        let meta = std::fs::symlink_metadata(&artifact).expect("stat");
        assert!(meta.is_file(), "the link was replaced by an artifact");
    }

    #[test]
    fn two_writers_of_the_key_agree_on_the_first() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("cache");
        create_private_dir(&dir).expect("mkdir");
        let path = dir.join(KEY_FILE);
        let first = create_key(&dir, &path)
            .expect("create")
            .expect("the first wins");
        assert!(create_key(&dir, &path).expect("create").is_none());
        assert_eq!(read_key(&path).expect("trusted"), Some(first));
        assert_eq!(names(&dir), [KEY_FILE], "no temporary file is left");
    }
}
