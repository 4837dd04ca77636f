//! A running total per key (e.g. of `amount` per `customer_id`), the example of a stateful
//! transform: the totals live in the host's keyed state, so they survive restarts and a replayed
//! batch starts from exactly the totals the previous batch committed.
//!
//! Config: `{ "key": "customer_id", "value": "amount", "output": "running_total",
//! "event_time": "occurred_at", "expire_after_ms": 3600000 }`. `key` (int64 or utf8) and `value`
//! (int64 or decimal) are required; `output` defaults to `running_total`. With
//! `expire_after_ms` (which needs `event_time`), a key's total expires that long (in event time)
//! after its latest row, once the watermark passes: the next row of that key starts from zero —
//! a total per session of activity. Each row gets the total of its key up to and including it;
//! a null value adds nothing, a null key gets a null total. A decimal total keeps the value's
//! scale at precision 38.
//!
//! Per call the state is asked once (`get_many` of the batch's distinct keys) and written once
//! per key.

use std::collections::HashMap;

use serde::Deserialize;
use weir_plugin_sdk::{
    Batch, BatchInfo, Bitmap, Column, DataType, Field, Output, PluginError, Schema, Transform,
    state,
};

/// The plugin's `config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The column the totals are kept per (int64 or utf8).
    pub key: String,
    /// The column summed (int64 or decimal).
    pub value: String,
    /// The column added with each row's running total.
    #[serde(default = "default_output")]
    pub output: String,
    /// The event-time column (timestamp), needed by `expire_after_ms`.
    #[serde(default)]
    pub event_time: Option<String>,
    /// Expire a key's total this long after its latest event time.
    #[serde(default)]
    pub expire_after_ms: Option<i64>,
}

fn default_output() -> String {
    "running_total".to_owned()
}

/// The transform.
#[derive(Debug)]
pub struct RunningTotal {
    config: Config,
    /// The output type: int64, or decimal(38, scale of the value).
    output: DataType,
}

fn invalid(message: String) -> PluginError {
    PluginError::invalid_input(format!("running_total: {message}"))
}

impl Transform for RunningTotal {
    type Config = Config;

    fn new(config: Config, input: &Schema) -> Result<Self, PluginError> {
        match input.field(&config.key).map(|f| f.data_type) {
            Some(DataType::Int64 | DataType::Utf8) => {}
            Some(t) => {
                return Err(invalid(format!(
                    "key column `{}` is {t}, not int64 or utf8",
                    config.key
                )));
            }
            None => return Err(invalid(format!("the input has no column `{}`", config.key))),
        }
        let output = match input.field(&config.value).map(|f| f.data_type) {
            Some(DataType::Int64) => DataType::Int64,
            Some(DataType::Decimal128 { scale, .. }) => DataType::Decimal128 {
                precision: 38,
                scale,
            },
            Some(t) => {
                return Err(invalid(format!(
                    "value column `{}` is {t}, not int64 or decimal",
                    config.value
                )));
            }
            None => {
                return Err(invalid(format!(
                    "the input has no column `{}`",
                    config.value
                )));
            }
        };
        match (&config.event_time, config.expire_after_ms) {
            (None, Some(_)) => {
                return Err(PluginError::invalid_config(
                    "running_total: expire_after_ms needs event_time (the column its expiry is counted from)",
                ));
            }
            (_, Some(ms)) if ms < 0 => {
                return Err(PluginError::invalid_config(format!(
                    "running_total: expire_after_ms is {ms}, expected 0 or more"
                )));
            }
            (Some(column), _) => match input.field(column).map(|f| f.data_type) {
                Some(DataType::TimestampMicros) => {}
                Some(t) => {
                    return Err(invalid(format!(
                        "event_time column `{column}` is {t}, not a timestamp"
                    )));
                }
                None => return Err(invalid(format!("the input has no column `{column}`"))),
            },
            (None, None) => {}
        }
        Ok(Self { config, output })
    }

    fn output_schema(&self, input: &Schema) -> Result<Schema, PluginError> {
        Ok(input
            .clone()
            .with_field(Field::new(self.config.output.clone(), self.output, true)))
    }

    fn process(&mut self, batch: &Batch<'_>, _info: &BatchInfo) -> Result<Output, PluginError> {
        let rows = batch.num_rows();
        let keys = batch.column(&self.config.key)?;
        let values = batch.column(&self.config.value)?;
        let event_time = match (&self.config.event_time, self.config.expire_after_ms) {
            (Some(column), Some(_)) => Some(batch.column(column)?),
            _ => None,
        };
        // The batch's distinct keys, in order of first appearance, and each row's key slot.
        let mut slots: HashMap<Vec<u8>, usize> = HashMap::new();
        let mut distinct: Vec<Vec<u8>> = Vec::new();
        let mut row_slot: Vec<Option<usize>> = Vec::with_capacity(rows);
        let mut key = Vec::new();
        for row in 0..rows {
            key.clear();
            match (keys.i64(row), keys.str(row)) {
                (Some(k), _) => key.extend_from_slice(&k.to_le_bytes()),
                (None, Some(s)) => key.extend_from_slice(s.as_bytes()),
                (None, None) => {
                    row_slot.push(None);
                    continue;
                }
            }
            let next = distinct.len();
            let slot = *slots.entry(key.clone()).or_insert(next);
            if slot == next {
                distinct.push(key.clone());
            }
            row_slot.push(Some(slot));
        }
        let mut totals: Vec<i128> = state::get_many(&distinct)
            .into_iter()
            .map(|v| {
                v.and_then(|b| <[u8; 16]>::try_from(b.as_slice()).ok())
                    .map_or(0, i128::from_le_bytes)
            })
            .collect();
        let mut latest: Vec<Option<i64>> = vec![None; distinct.len()];
        let mut out = Vec::with_capacity(rows);
        let mut validity = Bitmap::new_set(rows);
        for (row, slot) in row_slot.iter().enumerate() {
            let Some(slot) = *slot else {
                validity.set(row, false);
                out.push(0);
                continue;
            };
            let add = values
                .i64(row)
                .map(i128::from)
                .or_else(|| values.decimal(row));
            totals[slot] = totals[slot].saturating_add(add.unwrap_or(0));
            out.push(totals[slot]);
            if let Some(t) = event_time.as_ref().and_then(|c| c.timestamp_micros_at(row)) {
                latest[slot] = Some(latest[slot].map_or(t, |l| l.max(t)));
            }
        }
        for (slot, key) in distinct.iter().enumerate() {
            let bytes = totals[slot].to_le_bytes();
            match (self.config.expire_after_ms, latest[slot]) {
                (Some(ms), Some(t)) => {
                    state::put_expiring(key, &bytes, t.saturating_add(ms.saturating_mul(1000)));
                }
                _ => state::put(key, &bytes),
            }
        }
        let validity = (validity.count_ones() < rows).then_some(validity);
        let column = match self.output {
            DataType::Decimal128 { precision, scale } => {
                Column::decimal128(self.config.output.clone(), precision, scale, out, validity)
            }
            _ => Column::int64(
                self.config.output.clone(),
                out.into_iter()
                    .map(|t| i64::try_from(t).unwrap_or(if t < 0 { i64::MIN } else { i64::MAX }))
                    .collect(),
                validity,
            ),
        };
        Ok(Output::edit().set_column(column).into())
    }
}

weir_plugin_sdk::export_transform!(RunningTotal);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin_sdk::testing::{
        MemoryBatch, reset_state, run_transform, set_state_watermark, state_len,
    };

    fn batch(customers: &[Option<i64>], cents: &[i128], at: &[i64]) -> MemoryBatch {
        let validity = customers.iter().any(Option::is_none).then(|| {
            let mut b = Bitmap::new_set(customers.len());
            for (i, c) in customers.iter().enumerate() {
                b.set(i, c.is_some());
            }
            b
        });
        MemoryBatch::new(vec![
            Column::int64(
                "customer_id",
                customers.iter().map(|c| c.unwrap_or(0)).collect(),
                validity,
            ),
            Column::decimal128("amount", 12, 2, cents.to_vec(), None),
            Column::timestamp_micros("occurred_at", at.to_vec(), None),
        ])
    }

    fn totals(config: &str, input: &MemoryBatch) -> Vec<Option<i128>> {
        let out = run_transform::<RunningTotal>(config, input).unwrap();
        let c = out.column("running_total").unwrap();
        assert_eq!(
            c.data_type,
            DataType::Decimal128 {
                precision: 38,
                scale: 2
            }
        );
        (0..out.num_rows()).map(|i| c.decimal(i)).collect()
    }

    const CONFIG: &str = r#"{"key":"customer_id","value":"amount"}"#;

    #[test]
    fn totals_run_on_across_batches() {
        reset_state();
        let first = batch(
            &[Some(1), Some(2), Some(1), None],
            &[100, 5, 250, 7],
            &[0; 4],
        );
        assert_eq!(
            totals(CONFIG, &first),
            [Some(100), Some(5), Some(350), None]
        );
        let second = batch(&[Some(2), Some(1)], &[10, 1], &[0; 2]);
        assert_eq!(totals(CONFIG, &second), [Some(15), Some(351)]);
        assert_eq!(state_len(), 2);
    }

    #[test]
    fn totals_expire_after_the_watermark_passes_the_last_event() {
        reset_state();
        let config = r#"{"key":"customer_id","value":"amount","event_time":"occurred_at","expire_after_ms":10}"#;
        assert_eq!(
            totals(config, &batch(&[Some(1)], &[100], &[1_000])),
            [Some(100)]
        );
        set_state_watermark(10_999);
        assert_eq!(
            totals(config, &batch(&[Some(1)], &[1], &[2_000])),
            [Some(101)]
        );
        // Now due at 12 000 µs.
        set_state_watermark(12_000);
        assert_eq!(state_len(), 0);
        assert_eq!(
            totals(config, &batch(&[Some(1)], &[1], &[20_000])),
            [Some(1)]
        );
    }

    #[test]
    fn bad_configs_are_rejected() {
        reset_state();
        let input = batch(&[Some(1)], &[1], &[0]);
        let e = run_transform::<RunningTotal>(r#"{"key":"amount","value":"amount"}"#, &input)
            .unwrap_err();
        assert_eq!(
            e.message,
            "running_total: key column `amount` is decimal128(12, 2), not int64 or utf8"
        );
        let e = run_transform::<RunningTotal>(
            r#"{"key":"customer_id","value":"amount","expire_after_ms":5}"#,
            &input,
        )
        .unwrap_err();
        assert!(
            e.message.contains("expire_after_ms needs event_time"),
            "{e}"
        );
    }
}
