//! Query listeners (WIT world `listener`, cargo feature `listener`), Spark's
//! `StreamingQueryListener`: a pipeline's `[[listener]]` hears when its query starts, commits a
//! batch (with the batch's progress record), goes idle and ends.
//!
//! The host calls a listener from a thread of its own, never from the batch loop: what a
//! listener does (write a line, call a service it was granted) never slows its query, and an
//! error it returns is logged and counted, never the query's failure.
//!
//! ```
//! use weir_plugin_sdk::{Listener, PluginError, Progress};
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct NoConfig {}
//!
//! /// Counts the rows its query read.
//! struct Rows(u64);
//!
//! impl Listener for Rows {
//!     type Config = NoConfig;
//!     fn new(_config: NoConfig) -> Result<Self, PluginError> {
//!         Ok(Self(0))
//!     }
//!     fn on_progress(&mut self, progress: &Progress) -> Result<(), PluginError> {
//!         self.0 += progress.num_input_rows;
//!         Ok(())
//!     }
//! }
//! weir_plugin_sdk::export_listener!(Rows);
//!
//! let mut rows = Rows::new(NoConfig {}).unwrap();
//! let record = r#"{"name":"orders","batchId":3,"numInputRows":300,"processedRowsPerSecond":1500.5,
//!                  "stateOperators":[{"numRowsTotal":40},{"numRowsTotal":2}]}"#;
//! let progress = Progress::parse(record).unwrap();
//! assert_eq!((progress.batch_id, progress.state_rows), (3, 42));
//! rows.on_progress(&progress).unwrap();
//! assert_eq!(rows.0, 300);
//! ```

use serde::Deserialize;

use crate::error::PluginError;

/// A batch's progress record: the figures most listeners read, and the whole record (Spark's
/// `StreamingQueryProgress` as JSON) for the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub name: String,
    pub batch_id: u64,
    pub num_input_rows: u64,
    pub input_rows_per_second: f64,
    pub processed_rows_per_second: f64,
    /// `numRowsTotal` summed over the state operators.
    pub state_rows: u64,
    /// The record as the host sent it.
    pub json: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    #[serde(default)]
    name: String,
    #[serde(default)]
    batch_id: u64,
    #[serde(default)]
    num_input_rows: u64,
    #[serde(default)]
    input_rows_per_second: f64,
    #[serde(default)]
    processed_rows_per_second: f64,
    #[serde(default)]
    state_operators: Vec<Operator>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Operator {
    #[serde(default)]
    num_rows_total: u64,
}

impl Progress {
    /// Reads a progress record.
    ///
    /// # Errors
    /// When `json` is not a progress record.
    pub fn parse(json: &str) -> Result<Self, PluginError> {
        let r: Record = serde_json::from_str(json)
            .map_err(|e| PluginError::invalid_input(format!("not a progress record: {e}")))?;
        Ok(Self {
            name: r.name,
            batch_id: r.batch_id,
            num_input_rows: r.num_input_rows,
            input_rows_per_second: r.input_rows_per_second,
            processed_rows_per_second: r.processed_rows_per_second,
            state_rows: r.state_operators.iter().map(|o| o.num_rows_total).sum(),
            json: json.to_owned(),
        })
    }
}

/// A query listener: every event has a default that does nothing, so a listener implements only
/// the ones it wants.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Weir listener",
    label = "this type does not implement `weir_plugin_sdk::Listener`",
    note = "add `impl weir_plugin_sdk::Listener for {Self} {{ type Config = ...; fn new(...) }}`"
)]
pub trait Listener: Sized + 'static {
    /// The listener's `config` from the pipeline file, deserialised from JSON.
    type Config: serde::de::DeserializeOwned;

    /// Creates the instance.
    ///
    /// # Errors
    /// [`PluginError::invalid_config`] for a config that makes no sense.
    fn new(config: Self::Config) -> Result<Self, PluginError>;

    /// The query started or resumed (`id` is stable across restarts, `run_id` is this run's).
    ///
    /// # Errors
    /// Any [`PluginError`]: logged and counted by the host.
    fn on_started(&mut self, _id: &str, _run_id: &str, _name: &str) -> Result<(), PluginError> {
        Ok(())
    }

    /// A batch committed.
    ///
    /// # Errors
    /// As for [`Listener::on_started`].
    fn on_progress(&mut self, _progress: &Progress) -> Result<(), PluginError> {
        Ok(())
    }

    /// A trigger found no new data after the query had some (`timestamp`: RFC 3339 UTC).
    ///
    /// # Errors
    /// As for [`Listener::on_started`].
    fn on_idle(&mut self, _id: &str, _run_id: &str, _timestamp: &str) -> Result<(), PluginError> {
        Ok(())
    }

    /// The query ended; `error` says why when it failed.
    ///
    /// # Errors
    /// As for [`Listener::on_started`].
    fn on_terminated(
        &mut self,
        _id: &str,
        _run_id: &str,
        _error: Option<&str>,
    ) -> Result<(), PluginError> {
        Ok(())
    }
}
