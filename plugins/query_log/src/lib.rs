//! The Structured Streaming guide's example listener as a Weir plugin (world `listener`): one line
//! per event, and per batch the query's name, batch id, input rows, processed rate and state rows,
//! appended to a file in a folder the pipeline grants it.
//!
//! ```toml
//! [[listener]]
//! name = "log"
//! plugin = "plugins/query_log.wasm"
//! config = { path = "/logs/queries.log" }
//! capabilities = { dirs = [ { host = "logs", guest = "/logs", writable = true } ] }
//! ```
//!
//! Lines look like
//!
//! ```text
//! started orders id=… run=…
//! orders batch=3 input=300 processed=15000.0/s state=42
//! idle orders at 2026-12-05T16:28:49.000Z
//! terminated orders error=none
//! ```

use std::io::Write;

use serde::Deserialize;
use weir_plugin_sdk::{Listener, PluginError, Progress};

/// Where the lines go (a path inside a granted folder).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub path: String,
}

/// The listener: the file's path and the query's name (from its start).
#[derive(Debug)]
pub struct QueryLog {
    path: String,
    name: String,
}

impl QueryLog {
    fn line(&self, text: &str) -> Result<(), PluginError> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| {
                PluginError::fatal(format!("query_log: cannot open {}: {e}", self.path))
            })?;
        writeln!(file, "{text}")
            .map_err(|e| PluginError::fatal(format!("query_log: cannot write {}: {e}", self.path)))
    }
}

impl Listener for QueryLog {
    type Config = Config;

    fn new(config: Config) -> Result<Self, PluginError> {
        if config.path.is_empty() {
            return Err(PluginError::invalid_config("query_log: `path` is empty"));
        }
        Ok(Self {
            path: config.path,
            name: String::new(),
        })
    }

    fn on_started(&mut self, id: &str, run_id: &str, name: &str) -> Result<(), PluginError> {
        self.name = name.to_owned();
        self.line(&format!("started {name} id={id} run={run_id}"))
    }

    fn on_progress(&mut self, p: &Progress) -> Result<(), PluginError> {
        self.line(&format!(
            "{} batch={} input={} processed={:.1}/s state={}",
            p.name, p.batch_id, p.num_input_rows, p.processed_rows_per_second, p.state_rows
        ))
    }

    fn on_idle(&mut self, _id: &str, _run_id: &str, timestamp: &str) -> Result<(), PluginError> {
        self.line(&format!("idle {} at {timestamp}", self.name))
    }

    fn on_terminated(
        &mut self,
        _id: &str,
        _run_id: &str,
        error: Option<&str>,
    ) -> Result<(), PluginError> {
        self.line(&format!(
            "terminated {} error={}",
            self.name,
            error.unwrap_or("none")
        ))
    }
}

weir_plugin_sdk::export_listener!(QueryLog);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_one_line_per_event() {
        let dir = std::env::temp_dir().join(format!("weir-query-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("q.log");
        let mut log = QueryLog::new(Config {
            path: path.display().to_string(),
        })
        .unwrap();
        log.on_started("i", "r", "orders").unwrap();
        let p = Progress::parse(
            r#"{"name":"orders","batchId":2,"numInputRows":300,"processedRowsPerSecond":1500,"stateOperators":[{"numRowsTotal":7}]}"#,
        )
        .unwrap();
        log.on_progress(&p).unwrap();
        log.on_terminated("i", "r", None).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            text,
            "started orders id=i run=r\norders batch=2 input=300 processed=1500.0/s state=7\nterminated orders error=none\n"
        );
    }
}
