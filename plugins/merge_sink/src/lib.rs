//! A foreachBatch sink that upserts each batch into Delta tables through the host's
//! `delta-merge` capability: the example of a sink that decides *what* to merge (here: it drops
//! rows whose status is one of `drop_statuses`) while the host does the MERGE natively and
//! exactly once per batch.
//!
//! Config: `{ "tables": ["orders"], "status_column": "status", "drop_statuses": ["cancelled"] }`.
//! Every table named must be granted in the pipeline file:
//!
//! ```toml
//! [sink.capabilities.delta_merge.orders]
//! path = "tables/orders"
//! keys = ["order_id"]
//! when_matched_update = "s.occurred_at > t.occurred_at"
//! ```

use serde::Deserialize;
use weir_plugin_sdk::{Batch, BatchInfo, Output, PluginError, Schema, Selection, Sink, log_info};

/// The plugin's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The granted tables to merge every batch into, in order.
    pub tables: Vec<String>,
    /// The column whose value decides whether a row is merged (default `status`).
    #[serde(default = "default_status_column")]
    pub status_column: String,
    /// Rows with one of these statuses are left out.
    #[serde(default)]
    pub drop_statuses: Vec<String>,
}

fn default_status_column() -> String {
    "status".into()
}

/// The sink.
#[derive(Debug)]
pub struct MergeSink {
    config: Config,
}

impl Sink for MergeSink {
    type Config = Config;

    fn new(config: Config, input: &Schema) -> Result<Self, PluginError> {
        if config.tables.is_empty() {
            return Err(PluginError::invalid_config(
                "merge_sink: `tables` must name at least one granted table",
            ));
        }
        if !config.drop_statuses.is_empty() && input.index_of(&config.status_column).is_none() {
            return Err(PluginError::invalid_config(format!(
                "merge_sink: status_column `{}` is not a column of the input",
                config.status_column
            )));
        }
        Ok(Self { config })
    }

    fn write_batch(&mut self, batch: &Batch<'_>, info: &BatchInfo) -> Result<(), PluginError> {
        let rows = if self.config.drop_statuses.is_empty() {
            None
        } else {
            let status = batch.column(&self.config.status_column)?;
            let drop = &self.config.drop_statuses;
            Some(Output::keep(Selection::from_fn(batch.num_rows(), |r| {
                status.str(r).is_none_or(|s| !drop.iter().any(|d| d == s))
            })))
        };
        for table in &self.config.tables {
            let result = weir_plugin_sdk::delta_merge::merge(table, batch, rows.clone())?;
            log_info(&format!(
                "merge_sink: batch {} into {table}: {} updated, {} inserted{}",
                info.batch_id,
                result.updated,
                result.inserted,
                if result.skipped {
                    " (already merged)"
                } else {
                    ""
                }
            ));
        }
        Ok(())
    }
}

weir_plugin_sdk::export_sink!(MergeSink);

#[cfg(test)]
mod tests {
    use weir_plugin_sdk::testing::MemoryBatch;
    use weir_plugin_sdk::{Column, DataType, Field};

    use super::*;

    #[test]
    fn a_config_without_tables_is_refused_and_natively_merge_says_why_it_cannot() {
        let schema = Schema::new(vec![Field {
            name: "status".into(),
            data_type: DataType::Utf8,
            nullable: true,
        }]);
        let err = MergeSink::new(
            Config {
                tables: Vec::new(),
                status_column: "status".into(),
                drop_statuses: Vec::new(),
            },
            &schema,
        )
        .unwrap_err();
        assert!(err.message.contains("`tables` must name"), "{err}");

        let mut sink = MergeSink::new(
            Config {
                tables: vec!["orders".into()],
                status_column: "status".into(),
                drop_statuses: vec!["cancelled".into()],
            },
            &schema,
        )
        .unwrap();
        let input = MemoryBatch::new(vec![Column::utf8_from_iter("status", [Some("paid")])]);
        let err = sink
            .write_batch(&Batch::from_memory(&input), &BatchInfo::new(0))
            .unwrap_err();
        assert!(
            err.message.contains("only the Weir host can merge"),
            "{err}"
        );
    }
}
