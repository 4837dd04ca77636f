//! Cleans up a status-like string column (trim, lowercase, then map spellings onto one), the
//! example of a transform that replaces a column: only that column crosses the boundary back,
//! and the host keeps the others as they are.
//!
//! Config: `{ "column": "status", "lowercase": true, "trim": true, "map": { "canceled": "cancelled" } }`;
//! every key is optional (`column` defaults to `status`, the rest to off / empty). The map is
//! looked up after trimming and lowercasing. Nulls stay null.

use std::collections::BTreeMap;

use serde::Deserialize;
use weir_plugin_sdk::{
    Batch, BatchInfo, Column, DataType, Output, PluginError, Schema, Transform, Values,
};

/// The plugin's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The utf8 column to normalise.
    #[serde(default = "default_column")]
    pub column: String,
    /// Lowercase every value (Unicode-aware; ASCII without allocating).
    #[serde(default)]
    pub lowercase: bool,
    /// Remove leading and trailing whitespace.
    #[serde(default)]
    pub trim: bool,
    /// Replace a (trimmed, lowercased) value by another.
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

fn default_column() -> String {
    "status".to_owned()
}

/// The transform.
#[derive(Debug)]
pub struct NormalizeStatus {
    config: Config,
}

impl Transform for NormalizeStatus {
    type Config = Config;

    fn new(config: Config, input: &Schema) -> Result<Self, PluginError> {
        match input.field(&config.column) {
            None => Err(PluginError::invalid_input(format!(
                "normalize_status: the input has no column `{}`",
                config.column
            ))),
            Some(f) if f.data_type != DataType::Utf8 => Err(PluginError::invalid_input(format!(
                "normalize_status: column `{}` is {}, not utf8",
                config.column, f.data_type
            ))),
            Some(_) => Ok(Self { config }),
        }
    }

    fn process(&mut self, batch: &Batch<'_>, _info: &BatchInfo) -> Result<Output, PluginError> {
        let column = batch.column(&self.config.column)?;
        let Values::Utf8 { offsets, data } = &column.values else {
            return Err(PluginError::invalid_input(format!(
                "normalize_status: column `{}` is {}, not utf8",
                column.name, column.data_type
            )));
        };
        let rows = column.len();
        let mut new_offsets = Vec::with_capacity(rows + 1);
        let mut new_data = Vec::with_capacity(data.len());
        new_offsets.push(0i32);
        for i in 0..rows {
            if !column.is_null(i) {
                let start = usize::try_from(offsets[i]).unwrap_or(0);
                let end = usize::try_from(offsets[i + 1]).unwrap_or(0);
                let bytes = data.get(start..end).unwrap_or_default();
                let value = std::str::from_utf8(bytes).map_err(|_| {
                    PluginError::invalid_input(format!(
                        "normalize_status: column `{}` is not UTF-8",
                        column.name
                    ))
                    .at_row(i)
                })?;
                self.normalize_into(value, &mut new_data);
            }
            new_offsets.push(i32::try_from(new_data.len()).map_err(|_| {
                PluginError::fatal(format!(
                    "normalize_status: column `{}` grew past 2 GiB",
                    column.name
                ))
                .at_row(i)
            })?);
        }
        // Same rows, same nulls: only the values change.
        let normalized = Column::utf8(
            column.name.clone(),
            new_offsets,
            new_data,
            column.validity.clone(),
        );
        Ok(Output::edit().set_column(normalized).into())
    }
}

impl NormalizeStatus {
    /// Appends the normalised `value` to `out`, allocating only to lowercase non-ASCII text.
    fn normalize_into(&self, value: &str, out: &mut Vec<u8>) {
        let value = if self.config.trim {
            value.trim()
        } else {
            value
        };
        let start = out.len();
        if self.config.lowercase && !value.is_ascii() {
            out.extend_from_slice(value.to_lowercase().as_bytes());
        } else if self.config.lowercase {
            out.extend(value.bytes().map(|b| b.to_ascii_lowercase()));
        } else {
            out.extend_from_slice(value.as_bytes());
        }
        if self.config.map.is_empty() {
            return;
        }
        // `out[start..]` holds whole UTF-8 text written just above.
        let written = std::str::from_utf8(&out[start..]).ok();
        if let Some(replacement) = written.and_then(|w| self.config.map.get(w)) {
            out.truncate(start);
            out.extend_from_slice(replacement.as_bytes());
        }
    }
}

weir_plugin_sdk::export_transform!(NormalizeStatus);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin_sdk::ErrorKind;
    use weir_plugin_sdk::testing::{MemoryBatch, run_transform};

    fn batch() -> MemoryBatch {
        MemoryBatch::new(vec![
            Column::int64("order_id", vec![1, 2, 3, 4, 5, 6], None),
            Column::utf8_from_iter(
                "status",
                [
                    Some("  Completed "),
                    None,
                    Some("CANCELED"),
                    Some("Ärger"),
                    Some(""),
                    Some("pending"),
                ],
            ),
        ])
    }

    fn statuses(config: &str) -> Vec<Option<String>> {
        let out = run_transform::<NormalizeStatus>(config, &batch()).unwrap();
        assert_eq!(out.num_rows(), 6);
        assert_eq!(out.column("order_id").unwrap().i64(5), Some(6));
        out.column("status")
            .unwrap()
            .strs()
            .map(|s| s.map(str::to_owned))
            .collect()
    }

    fn owned(v: &[Option<&str>]) -> Vec<Option<String>> {
        v.iter().map(|s| s.map(str::to_owned)).collect()
    }

    #[test]
    fn trims_lowercases_and_maps_keeping_nulls() {
        assert_eq!(
            statuses(r#"{"lowercase":true,"trim":true,"map":{"canceled":"cancelled"}}"#),
            owned(&[
                Some("completed"),
                None,
                Some("cancelled"),
                Some("ärger"),
                Some(""),
                Some("pending")
            ])
        );
    }

    #[test]
    fn each_step_is_optional() {
        assert_eq!(
            statuses(r#"{"map":{"pending":"open"}}"#),
            owned(&[
                Some("  Completed "),
                None,
                Some("CANCELED"),
                Some("Ärger"),
                Some(""),
                Some("open")
            ])
        );
        assert_eq!(
            statuses(r#"{"trim":true}"#)[0].as_deref(),
            Some("Completed")
        );
        assert_eq!(statuses("{}")[2].as_deref(), Some("CANCELED"));
    }

    #[test]
    fn another_column_can_be_named() {
        let batch = MemoryBatch::new(vec![Column::utf8_from_iter("state", [Some("A ")])]);
        let out = run_transform::<NormalizeStatus>(
            r#"{"column":"state","lowercase":true,"trim":true}"#,
            &batch,
        )
        .unwrap();
        assert_eq!(out.column("state").unwrap().str(0), Some("a"));
    }

    #[test]
    fn wrong_columns_and_configs_are_rejected() {
        let e = run_transform::<NormalizeStatus>(r#"{"column":"order_id"}"#, &batch()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert_eq!(
            e.message,
            "normalize_status: column `order_id` is int64, not utf8"
        );
        let e = run_transform::<NormalizeStatus>(r#"{"column":"x"}"#, &batch()).unwrap_err();
        assert_eq!(e.message, "normalize_status: the input has no column `x`");
        let e = run_transform::<NormalizeStatus>(r#"{"lowercase":"yes"}"#, &batch()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(
            e.message.starts_with("config.lowercase: invalid type"),
            "{e}"
        );
        let e = run_transform::<NormalizeStatus>(r#"{"map":{"a":1}}"#, &batch()).unwrap_err();
        assert!(e.message.starts_with("config.map.a: invalid type"), "{e}");
    }
}
