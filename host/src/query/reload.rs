//! Loading new plugin builds into a running query, between batches.
//!
//! An operator replaces a plugin by overwriting its `.wasm` file and either
//! sending `weir run` a SIGHUP (every plugin file is hashed again) or running
//! it with `--watch-plugins` (every plugin file is `stat`ed before each
//! batch and hashed when it changed). A new build must pass what a start
//! checks (it compiles, implements its world, accepts its config and
//! input, matches a pinned `sha256`) plus the output-schema rule of
//! `plugin::reload`; a refused build is logged and the previous build keeps
//! running, because stopping a healthy query over a bad deploy is worse than
//! not deploying. Every `offsets/N` lists the builds (name and sha256) that
//! batch N runs with, written before it runs, so that a replay after a
//! restart knows — and logs — when it runs another build than the original.

use crate::plugin::{PluginEngine, PluginError, PluginFile};

/// Which stage of the query a watched plugin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// `[[transform]]` number i.
    Transform(usize),
    Sink,
}

/// A plugin file of the query and what may replace it.
#[derive(Debug)]
pub(super) struct Watched {
    pub(super) stage: Stage,
    pub(super) file: PluginFile,
    /// The pipeline's `sha256`, which every build must match.
    pub(super) pin: Option<String>,
}

/// What looking for new builds did to one plugin.
#[derive(Debug)]
pub enum ReloadOutcome {
    /// The new build runs from the next batch on.
    Replaced {
        plugin: String,
        from_sha256: String,
        to_sha256: String,
    },
    /// The new build was refused; the previous one keeps running.
    Refused(PluginError),
}

/// Loads a new build of `watched` if its file holds one and hands it to
/// `replace`, which opens it in place of the running one.
pub(super) fn check(
    engine: &PluginEngine,
    watched: &mut Watched,
    force: bool,
    replace: impl FnOnce(crate::plugin::LoadedPlugin) -> Result<(), PluginError>,
) -> Option<ReloadOutcome> {
    let name = watched.file.name().to_owned();
    let build = match watched.file.new_build(force) {
        Ok(Some(build)) => build,
        Ok(None) => return None,
        Err(e) => return Some(ReloadOutcome::Refused(e)),
    };
    let refused = |reason: String| PluginError::Replacement {
        plugin: name.clone(),
        path: watched.file.path().to_owned(),
        sha256: build.sha256.clone(),
        reason,
    };
    let loaded = match engine.load_bytes(&name, watched.file.path(), &build.bytes) {
        Ok(loaded) => loaded,
        Err(e) => return Some(ReloadOutcome::Refused(refused(e.to_string()))),
    };
    if let Err(e) = loaded.check_pin(watched.pin.as_deref()) {
        return Some(ReloadOutcome::Refused(refused(e.to_string())));
    }
    let from = watched.file.sha256().to_owned();
    match replace(loaded) {
        Ok(()) => {
            watched.file.adopted(&build.sha256);
            Some(ReloadOutcome::Replaced {
                plugin: name,
                from_sha256: from,
                to_sha256: build.sha256,
            })
        }
        Err(e) => Some(ReloadOutcome::Refused(e)),
    }
}
