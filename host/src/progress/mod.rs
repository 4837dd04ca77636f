//! The progress record of each batch, with the field names of Spark's
//! `StreamingQueryProgress`, so that dashboards and alerts written for Spark
//! read Weir's records unchanged. Fields Spark does not have (malformed
//! counts, plugin usage) are additions, never renames.

mod metrics;

use std::collections::BTreeMap;

use serde::Serialize;

pub use metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, Metrics};

/// One batch's progress (Spark's `StreamingQueryProgress`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryProgress {
    pub id: String,
    pub run_id: String,
    pub name: String,
    /// When the trigger started, RFC 3339 UTC.
    pub timestamp: String,
    pub batch_id: u64,
    pub batch_duration: u64,
    pub num_input_rows: u64,
    pub input_rows_per_second: f64,
    pub processed_rows_per_second: f64,
    pub duration_ms: BTreeMap<&'static str, u64>,
    pub event_time: BTreeMap<&'static str, String>,
    pub state_operators: Vec<serde_json::Value>,
    pub sources: Vec<SourceProgress>,
    pub sink: SinkProgress,
    /// Weir's addition: what each plugin used in this batch.
    pub plugins: Vec<PluginProgress>,
    /// Weir's addition: what each `[[listener]]` heard so far.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<ListenerProgress>,
    /// Weir's addition, real-time mode: how long the batch's rows took from their source
    /// (a Kafka record's timestamp, else when the part was read) to the sink's write, in ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<LatencyProgress>,
    /// `timestamp` and `eventTime.watermark` in ms since the epoch, for the metrics (not in the
    /// record: Spark's has only the strings).
    #[serde(skip)]
    pub timestamp_ms: i64,
    #[serde(skip)]
    pub watermark_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceProgress {
    pub description: String,
    pub start_offset: Option<serde_json::Value>,
    pub end_offset: serde_json::Value,
    pub latest_offset: serde_json::Value,
    pub num_input_rows: u64,
    pub input_rows_per_second: f64,
    pub processed_rows_per_second: f64,
    pub metrics: BTreeMap<&'static str, String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LatencyProgress {
    pub rows: u64,
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SinkProgress {
    pub description: String,
    pub num_output_rows: u64,
    pub metrics: BTreeMap<&'static str, String>,
}

/// What a listener heard so far, in the progress record.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerProgress {
    pub name: String,
    /// Events it took.
    pub events: u64,
    /// Events it failed on (an error, a trap, a limit, a refused or failed request).
    pub failures: u64,
    /// Events it never heard: the listeners were too far behind (the queue is shared).
    pub dropped: u64,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginProgress {
    pub name: String,
    pub sha256: String,
    pub calls: u64,
    pub call_time_ms: f64,
    pub instantiations: u64,
    pub fuel_consumed: u64,
    /// The most linear memory the plugin's instances held so far (high-water mark).
    pub memory_peak_bytes: u64,
    /// Its limits: `limits.memory`, `limits.timeout` (per call), `limits.fuel` (per call,
    /// null when not metered).
    pub memory_limit_bytes: u64,
    pub timeout_ms: u64,
    pub fuel_limit: Option<u64>,
}

impl QueryProgress {
    /// The malformed rows of all sources.
    pub fn malformed_rows(&self) -> u64 {
        self.sources
            .iter()
            .filter_map(|s| s.metrics.get("numMalformedRows"))
            .filter_map(|v| v.parse::<u64>().ok())
            .sum()
    }

    /// The one log line a batch gets.
    pub fn summary(&self) -> String {
        let malformed = self.malformed_rows();
        format!(
            "batch {}: {} rows in, {} rows out, {} malformed, {} ms ({:.0} rows/s)",
            self.batch_id,
            self.num_input_rows,
            self.sink.num_output_rows,
            malformed,
            self.duration_ms
                .get("triggerExecution")
                .copied()
                .unwrap_or(0),
            self.processed_rows_per_second
        )
    }
}

/// Rows per second, 0 when no time passed.
pub fn rate(rows: u64, millis: u64) -> f64 {
    if millis == 0 {
        0.0
    } else {
        rows as f64 * 1000.0 / millis as f64
    }
}

/// RFC 3339 UTC with milliseconds, from ms since the epoch (no chrono needed).
pub fn rfc3339_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = crate::calendar::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        (sod % 3600) / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_timestamps() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_709_251_387_123), "2024-03-01T00:03:07.123Z");
        assert_eq!(rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn rates() {
        assert_eq!(rate(1000, 0), 0.0);
        assert_eq!(rate(1000, 500), 2000.0);
    }
}
