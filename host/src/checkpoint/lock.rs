//! The `lock` file: one writer per checkpoint.
//!
//! Why it exists: two processes appending to the same offset and commit logs would break
//! exactly-once output. An advisory `flock` (through `File::try_lock`) is held for the life of the
//! [`super::Checkpoint`]; the OS drops it when the process dies, so a stale file from a crash never
//! blocks a restart. The holder writes who it is into the file so that the refusal can say whom to stop.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{CheckpointError, fsio};

const LOCK_FILE: &str = "lock";

/// How often, and how long apart, a held lock is tried again before it counts as held.
const RELEASE_RETRIES: u32 = 5;
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// What the holder writes into the lock file.
#[derive(Debug, Serialize, Deserialize)]
struct Holder {
    pid: u32,
    host: String,
    started_at: String,
}

/// Takes the lock of the checkpoint in `dir` and records this process as its holder.
pub(super) fn acquire(dir: &Path) -> Result<File, CheckpointError> {
    let path = dir.join(LOCK_FILE);
    // Not truncated on open: the current holder's record must survive a failed attempt.
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| CheckpointError::io(&path, "open", e))?;
    let mut attempt = 0;
    loop {
        match file.try_lock() {
            Ok(()) => break,
            // A child forked by another thread of this process shares the lock's open file
            // description until it execs (close-on-exec acts only then), so a lock released a
            // moment ago can still look held: look again briefly before naming a holder.
            Err(TryLockError::WouldBlock) if attempt < RELEASE_RETRIES => {
                attempt += 1;
                std::thread::sleep(RELEASE_WAIT);
            }
            Err(TryLockError::WouldBlock) => {
                return Err(CheckpointError::Locked {
                    dir: dir.to_path_buf(),
                    holder: describe_holder(&mut file, &path),
                });
            }
            Err(TryLockError::Error(e)) => return Err(CheckpointError::io(&path, "lock", e)),
        }
    }
    let holder = Holder {
        pid: std::process::id(),
        host: host_name(),
        started_at: fsio::now_rfc3339(),
    };
    let mut record = serde_json::to_vec(&holder).map_err(|source| CheckpointError::Encode {
        file: path.clone(),
        source,
    })?;
    record.push(b'\n');
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(&record))
        .and_then(|()| file.flush())
        .map_err(|e| CheckpointError::io(&path, "write the holder into", e))?;
    Ok(file)
}

fn describe_holder(file: &mut File, path: &Path) -> String {
    let mut text = String::new();
    let read = file
        .seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_string(&mut text));
    match read
        .ok()
        .and_then(|_| serde_json::from_str::<Holder>(text.trim()).ok())
    {
        Some(h) => format!("pid {} on host {} since {}", h.pid, h.host, h.started_at),
        // The holder may be between taking the lock and writing its record.
        None => format!(
            "another process (its lock file {} does not say which)",
            path.display()
        ),
    }
}

#[cfg(unix)]
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is a valid writable buffer of the given length; gethostname writes at most
    // that many bytes and we do not rely on NUL termination beyond the buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_owned();
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

#[cfg(not(unix))]
fn host_name() -> String {
    std::env::var("COMPUTERNAME").unwrap_or_else(|_| "unknown".to_owned())
}
