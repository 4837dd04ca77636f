//! The progress records of running queries as Prometheus metrics, for `weir serve` and
//! `weir run --metrics`.
//!
//! Why a collector and not registered families: a tenant may read only its own queries'
//! series, so each scrape encodes the figures of the queries its caller may see, through
//! `prometheus-client`'s encoder (the text format is never written by hand). The figures are
//! the alerting ones of the Structured Streaming guide (input against processed rows per
//! second, each state operator's `numRowsTotal`, `durationMs.addBatch`,
//! `numRowsDroppedByWatermark`), the batch duration as a histogram, counts of batches and
//! rows, the watermark's lag behind the batch clock, and each plugin's calls, time, fuel and
//! memory peak. They are updated once per batch from its progress record, so a scrape never
//! waits for a batch.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::QueryProgress;

/// The content type of [`Metrics::render`]: Prometheus' text format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

type FloatGauge = Gauge<f64, AtomicU64>;
type FloatCounter = Counter<f64, AtomicU64>;

/// The figures of every query a process runs, by tenant and query name.
#[derive(Debug, Default)]
pub struct Metrics {
    queries: RwLock<BTreeMap<(String, String), Arc<QueryFigures>>>,
}

#[derive(Debug)]
struct QueryFigures {
    input_rate: FloatGauge,
    processed_rate: FloatGauge,
    add_batch_seconds: FloatGauge,
    watermark_lag_seconds: FloatGauge,
    batch_seconds: Histogram,
    batches: Counter,
    input_rows: Counter,
    output_rows: Counter,
    malformed_rows: Counter,
    operators: Mutex<BTreeMap<String, OperatorFigures>>,
    plugins: Mutex<BTreeMap<String, PluginFigures>>,
}

impl Default for QueryFigures {
    fn default() -> Self {
        Self {
            input_rate: FloatGauge::default(),
            processed_rate: FloatGauge::default(),
            add_batch_seconds: FloatGauge::default(),
            watermark_lag_seconds: FloatGauge::default(),
            // 1 ms to ~65 s.
            batch_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            batches: Counter::default(),
            input_rows: Counter::default(),
            output_rows: Counter::default(),
            malformed_rows: Counter::default(),
            operators: Mutex::default(),
            plugins: Mutex::default(),
        }
    }
}

#[derive(Debug, Default)]
struct OperatorFigures {
    rows: Gauge,
    dropped: Counter,
}

#[derive(Debug, Default)]
struct PluginFigures {
    calls: Counter,
    seconds: FloatCounter,
    fuel: Counter,
    memory_peak: Gauge,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Takes in batch `progress` of `query` of `tenant` (`""` for `weir run`).
    pub fn observe(&self, tenant: &str, query: &str, progress: &QueryProgress) {
        let figures = {
            let key = (tenant.to_owned(), query.to_owned());
            let known = self
                .queries
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(&key)
                .cloned();
            match known {
                Some(f) => f,
                None => Arc::clone(
                    self.queries
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .entry(key)
                        .or_default(),
                ),
            }
        };
        let f = &figures;
        f.input_rate.set(progress.input_rows_per_second);
        f.processed_rate.set(progress.processed_rows_per_second);
        let add_batch = progress.duration_ms.get("addBatch").copied().unwrap_or(0);
        f.add_batch_seconds.set(add_batch as f64 / 1000.0);
        f.batch_seconds
            .observe(progress.batch_duration as f64 / 1000.0);
        if let Some(wm) = progress.watermark_ms.filter(|wm| *wm > 0) {
            let lag_ms = progress.timestamp_ms.saturating_sub(wm).max(0);
            f.watermark_lag_seconds.set(lag_ms as f64 / 1000.0);
        }
        f.batches.inc();
        f.input_rows.inc_by(progress.num_input_rows);
        f.output_rows.inc_by(progress.sink.num_output_rows);
        f.malformed_rows.inc_by(progress.malformed_rows());
        let mut operators = lock(&f.operators);
        for op in &progress.state_operators {
            let name = op
                .get("operatorName")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("stateful")
                .to_owned();
            let figure = |key: &str| op.get(key).and_then(serde_json::Value::as_u64);
            let entry = operators.entry(name).or_default();
            if let Some(rows) = figure("numRowsTotal") {
                entry.rows.set(to_i64(rows));
            }
            entry
                .dropped
                .inc_by(figure("numRowsDroppedByWatermark").unwrap_or(0));
        }
        drop(operators);
        let mut plugins = lock(&f.plugins);
        for p in &progress.plugins {
            let entry = plugins.entry(p.name.clone()).or_default();
            entry.calls.inc_by(p.calls);
            entry.seconds.inc_by(p.call_time_ms / 1000.0);
            entry.fuel.inc_by(p.fuel_consumed);
            entry.memory_peak.set(to_i64(p.memory_peak_bytes));
        }
    }

    /// Drops the series of a query that was deleted.
    pub fn forget(&self, tenant: &str, query: &str) {
        self.queries
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&(tenant.to_owned(), query.to_owned()));
    }

    /// The series of `tenant`'s queries (every tenant's with `None`), in Prometheus' text format.
    pub fn render(self: &Arc<Self>, tenant: Option<&str>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(View {
            metrics: Arc::clone(self),
            tenant: tenant.map(str::to_owned),
        }));
        let mut text = String::new();
        // Writing into a String cannot fail; the collector's own encoding errors are the
        // encoder's, which only come from the writer.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
        text
    }
}

/// What one scrape may see.
#[derive(Debug)]
struct View {
    metrics: Arc<Metrics>,
    tenant: Option<String>,
}

/// One family: its name, help, and how to reach its metric(s) in a query's figures.
struct Family<'a> {
    name: &'static str,
    help: &'static str,
    queries: &'a [(&'a (String, String), &'a Arc<QueryFigures>)],
}

impl Family<'_> {
    /// A family with one metric per query.
    fn per_query<M: EncodeMetric>(
        &self,
        encoder: &mut DescriptorEncoder,
        metric: impl Fn(&QueryFigures) -> &M,
    ) -> Result<(), std::fmt::Error> {
        let Some((_, first)) = self.queries.first() else {
            return Ok(());
        };
        let mut family =
            encoder.encode_descriptor(self.name, self.help, None, metric(first).metric_type())?;
        for ((tenant, query), figures) in self.queries {
            let labels = [("tenant", tenant.as_str()), ("query", query.as_str())];
            metric(figures).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// A family with one metric per query and named part (an operator, a plugin).
    fn per_part<P, M: EncodeMetric + Default>(
        &self,
        encoder: &mut DescriptorEncoder,
        label: &'static str,
        parts: impl Fn(&QueryFigures) -> &Mutex<BTreeMap<String, P>>,
        metric: impl Fn(&P) -> &M,
    ) -> Result<(), std::fmt::Error> {
        let any = self.queries.iter().any(|(_, f)| !lock(parts(f)).is_empty());
        if !any {
            return Ok(());
        }
        let metric_type = M::default().metric_type();
        let mut family = encoder.encode_descriptor(self.name, self.help, None, metric_type)?;
        for ((tenant, query), figures) in self.queries {
            for (part, p) in lock(parts(figures)).iter() {
                let labels = [
                    ("tenant", tenant.as_str()),
                    ("query", query.as_str()),
                    (label, part.as_str()),
                ];
                metric(p).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for View {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let all = self
            .metrics
            .queries
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let queries: Vec<_> = all
            .iter()
            .filter(|((tenant, _), _)| self.tenant.as_ref().is_none_or(|t| t == tenant))
            .collect();
        let family = |name, help| Family {
            name,
            help,
            queries: &queries,
        };
        let e = &mut encoder;
        family(
            "weir_input_rows_per_second",
            "Rows per second arriving, over the last batch (inputRowsPerSecond).",
        )
        .per_query(e, |f| &f.input_rate)?;
        family(
            "weir_processed_rows_per_second",
            "Rows per second processed by the last batch (processedRowsPerSecond).",
        )
        .per_query(e, |f| &f.processed_rate)?;
        family(
            "weir_add_batch_seconds",
            "Time the last batch spent in its transforms, operators and sink (durationMs.addBatch).",
        )
        .per_query(e, |f| &f.add_batch_seconds)?;
        family(
            "weir_watermark_lag_seconds",
            "How far the watermark is behind the batch clock.",
        )
        .per_query(e, |f| &f.watermark_lag_seconds)?;
        family(
            "weir_batch_duration_seconds",
            "Duration of each batch (durationMs.triggerExecution).",
        )
        .per_query(e, |f| &f.batch_seconds)?;
        family("weir_batches", "Batches run.").per_query(e, |f| &f.batches)?;
        family("weir_input_rows", "Rows read (numInputRows).").per_query(e, |f| &f.input_rows)?;
        family("weir_output_rows", "Rows written by the sink.").per_query(e, |f| &f.output_rows)?;
        family(
            "weir_malformed_rows",
            "Input lines that could not be decoded (numMalformedRows).",
        )
        .per_query(e, |f| &f.malformed_rows)?;
        family(
            "weir_state_rows",
            "Rows held by a state operator (numRowsTotal).",
        )
        .per_part(e, "operator", |f| &f.operators, |o| &o.rows)?;
        family(
            "weir_state_rows_dropped_by_watermark",
            "Rows a state operator dropped as later than the watermark (numRowsDroppedByWatermark).",
        )
        .per_part(e, "operator", |f| &f.operators, |o| &o.dropped)?;
        family("weir_plugin_calls", "Calls into a plugin.").per_part(
            e,
            "plugin",
            |f| &f.plugins,
            |p| &p.calls,
        )?;
        family(
            "weir_plugin_call_seconds",
            "Time spent in a plugin's calls.",
        )
        .per_part(e, "plugin", |f| &f.plugins, |p| &p.seconds)?;
        family(
            "weir_plugin_fuel",
            "Fuel a plugin consumed (metered plugins).",
        )
        .per_part(e, "plugin", |f| &f.plugins, |p| &p.fuel)?;
        family(
            "weir_plugin_memory_peak_bytes",
            "The most linear memory a plugin's instances held.",
        )
        .per_part(e, "plugin", |f| &f.plugins, |p| &p.memory_peak)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::{PluginProgress, SinkProgress};

    fn progress(batch: u64) -> QueryProgress {
        QueryProgress {
            latency_ms: None,
            id: "id".into(),
            run_id: "run".into(),
            name: "q".into(),
            timestamp: String::new(),
            batch_id: batch,
            batch_duration: 12,
            num_input_rows: 100,
            input_rows_per_second: 50.0,
            processed_rows_per_second: 2000.0,
            duration_ms: BTreeMap::from([("addBatch", 7)]),
            event_time: BTreeMap::new(),
            state_operators: vec![serde_json::json!({
                "operatorName": "dedupe", "numRowsTotal": 42, "numRowsDroppedByWatermark": 3
            })],
            sources: Vec::new(),
            sink: SinkProgress {
                description: "files".into(),
                num_output_rows: 90,
                metrics: BTreeMap::new(),
            },
            plugins: vec![PluginProgress {
                name: "filter".into(),
                sha256: "ab".into(),
                calls: 2,
                call_time_ms: 1.5,
                instantiations: 0,
                fuel_consumed: 10,
                memory_peak_bytes: 65536,
                memory_limit_bytes: 1 << 20,
                timeout_ms: 1000,
                fuel_limit: None,
            }],
            listeners: Vec::new(),
            timestamp_ms: 10_000,
            watermark_ms: Some(4_000),
        }
    }

    #[test]
    fn renders_each_tenants_own_series() {
        let m = Metrics::new();
        m.observe("acme", "orders", &progress(0));
        m.observe("acme", "orders", &progress(1));
        m.observe("zeta", "clicks", &progress(0));
        let acme = m.render(Some("acme"));
        assert!(
            acme.contains(r#"weir_batches_total{tenant="acme",query="orders"} 2"#),
            "{acme}"
        );
        assert!(
            acme.contains(r#"weir_state_rows{tenant="acme",query="orders",operator="dedupe"} 42"#)
        );
        assert!(acme.contains(
            r#"weir_state_rows_dropped_by_watermark_total{tenant="acme",query="orders",operator="dedupe"} 6"#
        ));
        assert!(acme.contains(r#"weir_watermark_lag_seconds{tenant="acme",query="orders"} 6"#));
        assert!(!acme.contains("zeta"), "{acme}");
        let all = m.render(None);
        assert!(all.contains(r#"query="clicks""#) && all.contains(r#"query="orders""#));
        m.forget("acme", "orders");
        assert!(!m.render(None).contains("orders"));
        assert_eq!(m.render(Some("nobody")), "");
    }
}
