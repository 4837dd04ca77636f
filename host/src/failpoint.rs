//! Deterministic crash injection for recovery tests.
//!
//! Exactly-once is only proven by killing the process at every phase of a
//! batch and checking the output after a restart. Racing an external
//! `kill -9` against a running batch makes such tests flaky; instead the
//! `weir` binary takes a hidden `--failpoint PHASE@BATCH` flag and sends
//! itself SIGKILL when batch BATCH reaches PHASE. Nothing runs after the
//! signal: no destructor, no flush, exactly like a power cut of the process.
//!
//! A shipped binary must not be able to kill itself on request, so the flag and
//! [`QueryOptions::failpoint`](crate::query::QueryOptions) exist only with the
//! `failpoints` cargo feature, which the test crate turns on. Without it
//! [`Failpoint`] has no values: every `Option<Failpoint>` is `None` and every
//! check compiles to nothing.

#[cfg(feature = "failpoints")]
use std::str::FromStr;

/// A point in the life of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `offsets/N` is durable; nothing of the batch has run.
    AfterOffsets,
    /// A transform plugin is executing (it has called into the host).
    InTransform,
    /// The sink is writing (a plugin sink has called into the host).
    InSink,
    /// The sink has finished; `commits/N` is not written yet.
    BeforeCommit,
}

impl Phase {
    /// Every phase with its `--failpoint` name, in the order a batch reaches them (the
    /// crash-recovery tests kill a batch at each).
    pub const ALL: [(&'static str, Phase); 4] = [
        ("after-offsets", Phase::AfterOffsets),
        ("in-transform", Phase::InTransform),
        ("in-sink", Phase::InSink),
        ("before-commit", Phase::BeforeCommit),
    ];
}

/// Crash when batch `batch_id` reaches `phase`.
#[cfg(feature = "failpoints")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failpoint {
    pub phase: Phase,
    pub batch_id: u64,
}

/// Without the `failpoints` feature no failpoint can be made.
#[cfg(not(feature = "failpoints"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {}

#[cfg(feature = "failpoints")]
impl FromStr for Failpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (phase, batch) = s
            .split_once('@')
            .ok_or_else(|| format!("failpoint {s:?}: expected PHASE@BATCH"))?;
        let phase = Phase::ALL
            .iter()
            .find(|(name, _)| *name == phase)
            .map(|(_, p)| *p)
            .ok_or_else(|| {
                let names: Vec<_> = Phase::ALL.iter().map(|(n, _)| *n).collect();
                format!(
                    "failpoint {s:?}: unknown phase, use one of {}",
                    names.join(", ")
                )
            })?;
        let batch_id = batch
            .parse()
            .map_err(|_| format!("failpoint {s:?}: {batch:?} is not a batch id"))?;
        Ok(Self { phase, batch_id })
    }
}

#[cfg(not(feature = "failpoints"))]
impl Failpoint {
    /// Never kills: no failpoint exists without the `failpoints` feature.
    pub fn check(failpoint: Option<&Failpoint>, _phase: Phase, _batch_id: u64) {
        if let Some(never) = failpoint {
            match *never {}
        }
    }
}

#[cfg(feature = "failpoints")]
impl Failpoint {
    /// Kills the process if `failpoint` is set for this phase and batch.
    pub fn check(failpoint: Option<&Failpoint>, phase: Phase, batch_id: u64) {
        if let Some(fp) = failpoint
            && fp.phase == phase
            && fp.batch_id == batch_id
        {
            tracing::warn!(?phase, batch_id, "failpoint reached: killing the process");
            // SAFETY: kill(2) on our own pid with a valid signal number has no
            // memory-safety preconditions.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            // SIGKILL cannot be caught; this is only reached if kill failed.
            std::process::abort();
        }
    }
}
