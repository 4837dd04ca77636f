//! Every way a plugin can fail, as data, so that the query decides retry or
//! stop from the variant rather than from message text.

use std::path::PathBuf;

/// How a plugin classified its own failure (`error-kind` in the WIT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginErrorKind {
    /// Retrying will not help.
    Fatal,
    /// A transient failure: the batch may be retried.
    Retryable,
    /// The batch did not have the shape the plugin needs.
    InvalidInput,
}

impl std::fmt::Display for PluginErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Fatal => "fatal",
            Self::Retryable => "retryable",
            Self::InvalidInput => "invalid input",
        })
    }
}

/// A limit on what the host holds for a plugin (see [`PluginError::HostBudget`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// `limits.memory`, which also bounds the results the host builds for
    /// the plugin and the keyed-state writes it buffers for a batch.
    Memory { limit: u64 },
    /// The host resources (streams, pollables, requests...) an instance may hold at once.
    Resources { limit: u64 },
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Memory { limit } => write!(f, "memory limit of {limit} bytes"),
            Self::Resources { limit } => write!(f, "limit of {limit} live host resources"),
        }
    }
}

/// A plugin failed to load, open or process a batch. Every variant names the plugin.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("plugin {plugin}: cannot read {}: {source}", path.display())]
    Read {
        plugin: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin {plugin}: {} is not a usable Wasm component: {reason}", path.display())]
    Compile {
        plugin: String,
        path: PathBuf,
        reason: String,
    },
    #[error("plugin {plugin}: compiled-component cache {}: {source}", dir.display())]
    Cache {
        plugin: String,
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("plugin {plugin}: {} has sha256 {actual}, but the pipeline pins sha256 = \"{expected}\"; refusing to run a build that is not the pinned one", path.display())]
    HashMismatch {
        plugin: String,
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("plugin {plugin}: the new build {} (sha256 {sha256}) is refused: {reason}; still running the previous build", path.display())]
    Replacement {
        plugin: String,
        path: PathBuf,
        sha256: String,
        reason: String,
    },
    #[error("plugin {plugin}: cannot instantiate: {reason}")]
    Instantiate { plugin: String, reason: String },
    #[error("plugin {plugin}: cannot grant directory {}: {reason}", host.display())]
    Grant {
        plugin: String,
        host: PathBuf,
        reason: String,
    },
    #[error("plugin {plugin}: environment variable {name} is granted but not set on the host")]
    EnvNotSet { plugin: String, name: String },
    #[error("plugin {plugin} broke its sandbox in batch {batch_id}: {reason}")]
    Denied {
        plugin: String,
        batch_id: u64,
        reason: String,
    },
    #[error("plugin {plugin} rejected its config: {message}")]
    InvalidConfig { plugin: String, message: String },
    #[error("plugin {plugin}: column {column} has type {data_type}, which plugins cannot receive")]
    UnsupportedType {
        plugin: String,
        column: String,
        data_type: String,
    },
    #[error("plugin {plugin} failed batch {batch_id} ({kind}){}: {message}", row.map(|r| format!(" at row {r}")).unwrap_or_default())]
    Failed {
        plugin: String,
        batch_id: u64,
        kind: PluginErrorKind,
        message: String,
        row: Option<u32>,
    },
    #[error("plugin {plugin} trapped in batch {batch_id}: {trap}{}", if stderr.is_empty() { String::new() } else { format!("; its stderr: {stderr}") })]
    Trap {
        plugin: String,
        batch_id: u64,
        trap: String,
        stderr: String,
    },
    #[error("plugin {plugin} exceeded its time limit of {limit_ms} ms in batch {batch_id}")]
    Timeout {
        plugin: String,
        batch_id: u64,
        limit_ms: u64,
    },
    #[error("plugin {plugin} exceeded its memory limit of {limit} bytes in batch {batch_id}")]
    MemoryExceeded {
        plugin: String,
        batch_id: u64,
        limit: u64,
    },
    /// A host call would have taken the host past a budget derived from
    /// the plugin's limits (a result too large for its memory, too many
    /// buffered writes or live resources).
    #[error("plugin {plugin} exceeded its {budget} in batch {batch_id}: {reason}")]
    HostBudget {
        plugin: String,
        batch_id: u64,
        budget: Budget,
        reason: String,
    },
    #[error("plugin {plugin} used up its fuel ({fuel}) in batch {batch_id}")]
    OutOfFuel {
        plugin: String,
        batch_id: u64,
        fuel: u64,
    },
    #[error("plugin {plugin} declared an output schema the host cannot use: {reason}")]
    MalformedSchema { plugin: String, reason: String },
    #[error("plugin {plugin} returned a malformed batch in batch {batch_id}: {reason}")]
    MalformedOutput {
        plugin: String,
        batch_id: u64,
        reason: String,
    },
}

impl PluginError {
    /// Whether running the same batch again may succeed.
    ///
    /// Only the plugin can say so (a `retryable` error value); limits, traps and bad output
    /// would recur on the same input. Every variant is listed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Failed { kind, .. } => match kind {
                PluginErrorKind::Retryable => true,
                PluginErrorKind::Fatal | PluginErrorKind::InvalidInput => false,
            },
            Self::Read { .. }
            | Self::Compile { .. }
            | Self::Cache { .. }
            | Self::HashMismatch { .. }
            | Self::Replacement { .. }
            | Self::Instantiate { .. }
            | Self::Grant { .. }
            | Self::EnvNotSet { .. }
            | Self::Denied { .. }
            | Self::InvalidConfig { .. }
            | Self::UnsupportedType { .. }
            | Self::Trap { .. }
            | Self::Timeout { .. }
            | Self::MemoryExceeded { .. }
            | Self::HostBudget { .. }
            | Self::OutOfFuel { .. }
            | Self::MalformedSchema { .. }
            | Self::MalformedOutput { .. } => false,
        }
    }

    /// The plugin this error is about.
    pub fn plugin(&self) -> &str {
        match self {
            Self::Read { plugin, .. }
            | Self::Compile { plugin, .. }
            | Self::Cache { plugin, .. }
            | Self::HashMismatch { plugin, .. }
            | Self::Replacement { plugin, .. }
            | Self::Instantiate { plugin, .. }
            | Self::Grant { plugin, .. }
            | Self::EnvNotSet { plugin, .. }
            | Self::Denied { plugin, .. }
            | Self::InvalidConfig { plugin, .. }
            | Self::UnsupportedType { plugin, .. }
            | Self::Failed { plugin, .. }
            | Self::Trap { plugin, .. }
            | Self::Timeout { plugin, .. }
            | Self::MemoryExceeded { plugin, .. }
            | Self::HostBudget { plugin, .. }
            | Self::OutOfFuel { plugin, .. }
            | Self::MalformedSchema { plugin, .. }
            | Self::MalformedOutput { plugin, .. } => plugin,
        }
    }
}
