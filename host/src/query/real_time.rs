//! Real-time mode (`trigger = "real-time"`): rows go through the pipeline as they arrive,
//! while durability keeps the rhythm of a checkpoint interval.
//!
//! Why a batch is still the unit: exactly-once rests on `offsets/N` naming the input of batch
//! N before the sink's commit of N, and on the sink being idempotent by N. Making that durable
//! for every few rows would cost an fsync each (and a Kafka transaction, a Delta commit); so a
//! batch collects *parts* for a whole interval instead. A part is what arrived within
//! `max_latency` of its first row; it runs through the transforms and the stateful operator at
//! once and is handed to the sink, which writes it as it passes when it can (a Kafka sink,
//! inside the batch's transaction) or is handed the batch's rows when the interval ends (every
//! other sink: files, Delta, a Wasm foreachBatch plugin, which thus sees one batch id per
//! interval). When the interval ends, `offsets/N` records the batch's input *and where its
//! parts were cut*, then the sink commits, then the state, then `commits/N`.
//!
//! Why the cuts are recorded: a batch that crashed after `offsets/N` is run again part by part
//! with the same cuts, so an update-mode aggregation emits the same updates and a plugin is
//! called with the same rows as the first time. A crash before `offsets/N` left nothing
//! committed anywhere (the Kafka transaction is aborted when the sink starts again), and the
//! batch starts afresh from the end of the last one. A part that fails makes the parts taken
//! so far batch N and runs it again as a replay does, with the batch's retries.
//!
//! Spark's real-time mode refuses foreachBatch and Delta and its Kafka sink is at-least-once;
//! here every sink keeps its exactly-once contract, per interval.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{BatchRun, OffsetEntry, Query, QueryError, SourceOffset, millis};
use crate::failpoint::{Failpoint, Phase};
use crate::plugin::{BatchInfo, QueryEvent};
use crate::progress::{self, LatencyProgress};
use crate::source::{Part, Recorded};
use crate::spec::RealTime;

/// How long a wait for input may last before the query looks at its stop flag again.
const STOP_CHECK: Duration = Duration::from_millis(100);

impl Query {
    /// One batch of real-time mode: parts for one checkpoint interval (or until a stop is
    /// requested), then the batch made durable. An interval in which nothing arrived (and no
    /// watermark moved) leaves no batch.
    pub(super) fn run_interval(&mut self, settings: RealTime) -> Result<(), QueryError> {
        self.reload_if_asked();
        let n = self.next_batch;
        let trigger_start = Instant::now();
        let mut entry = self.new_entry(Vec::new())?;
        let info = BatchInfo {
            query_id: self.checkpoint.query_id().to_owned(),
            batch_id: n,
            attempt: 0,
            timestamp_micros: entry.batch_timestamp_ms.saturating_mul(1000),
            partition: 0,
        };
        let usage_before = self.plugin_usages();
        let mut run = BatchRun::new(self.sources.len());
        let mut parts = Vec::new();
        let mut latency = Latency::default();
        let deadline = trigger_start + settings.checkpoint_interval;
        let taken = self.take_parts(
            &info,
            &entry,
            settings,
            deadline,
            &mut run,
            &mut parts,
            &mut latency,
        );
        if taken.is_err() {
            self.sources[0].end_parts();
        }
        if parts.is_empty() {
            if let Err(e) = taken {
                return Err(e);
            }
            if !self.wants_no_data_batch() {
                self.note_idle();
                return Ok(());
            }
        }
        self.idle = false;
        let wal_started = Instant::now();
        let (whole, cuts) = self.sources[0].join_parts(&self.checkpoint, n, parts)?;
        entry.sources = vec![SourceOffset {
            name: self.sources[0].name().to_owned(),
            log_offset: n,
            watermark_ms: self.has_watermark().then(|| self.source_watermarks_ms[0]),
            parts: Some(cuts),
            recorded: whole,
        }];
        self.checkpoint.offsets().put(n, &entry)?;
        let wal_ms = millis(wal_started.elapsed());
        Failpoint::check(self.options.failpoint().as_ref(), Phase::AfterOffsets, n);
        self.next_batch = n + 1;
        let since_last = self.last_trigger.map(|t| trigger_start.duration_since(t));
        self.last_trigger = Some(trigger_start);
        let finished = taken.and_then(|()| {
            if run.sources.iter().all(Option::is_none) {
                // No input, but the watermark moved: the operator emits and evicts by it.
                self.run_part(&info, &entry, None, &mut run)?;
            }
            let held = !self.sink.writes_parts();
            self.finish_parts(&info, &mut run)?;
            if held {
                latency.add_held(self.options.clock.now_ms());
            }
            Ok(())
        });
        if let Err(e) = finished {
            // What the attempt wrote is not committed; the recorded parts run again.
            tracing::warn!(batch_id = n, error = %e, "batch {n} failed while its parts ran; running it again from its recorded parts");
            self.last_trigger = None;
            return self.run_planned(n, true, wal_ms, trigger_start);
        }
        let mut outcome = run.outcome();
        outcome.latency = latency.progress();
        self.commit_batch(
            n,
            &entry,
            outcome,
            usage_before,
            since_last,
            wal_ms,
            trigger_start,
        )
    }

    /// Reads parts until `deadline` (or a stop) and runs each through the pipeline into the
    /// sink; `parts` gets what each recorded, also when one fails.
    #[allow(
        clippy::too_many_arguments,
        reason = "the interval's accumulators, one call site"
    )]
    fn take_parts(
        &mut self,
        info: &BatchInfo,
        entry: &OffsetEntry,
        settings: RealTime,
        deadline: Instant,
        run: &mut BatchRun,
        parts: &mut Vec<Recorded>,
        latency: &mut Latency,
    ) -> Result<(), QueryError> {
        self.begin_batch(info.batch_id, entry, run)?;
        self.sink.begin_parts(info)?;
        let streams = self.sink.writes_parts();
        while !self.stopped() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let wait = (deadline - now).min(STOP_CHECK);
            let started = Instant::now();
            let arrived = self.sources[0].arrive(
                &self.checkpoint,
                info.batch_id,
                wait,
                settings.max_latency,
            )?;
            let Some(Part {
                recorded,
                batch,
                event_ms,
            }) = arrived
            else {
                continue;
            };
            run.get_batch += started.elapsed();
            parts.push(recorded);
            let read_ms = self.options.clock.now_ms();
            let rows = batch.decoded.num_input_rows;
            self.run_part(info, entry, Some(batch), run)?;
            if streams {
                let written_ms = self.options.clock.now_ms();
                if event_ms.is_empty() {
                    latency.add(written_ms - read_ms, rows);
                } else {
                    for e in event_ms {
                        latency.add(written_ms - e, 1);
                    }
                }
            } else {
                let first = event_ms.iter().copied().min().unwrap_or(read_ms);
                latency.hold(first, rows);
            }
        }
        Ok(())
    }

    /// The query found nothing to do: the listeners hear it once.
    pub(super) fn note_idle(&mut self) {
        if !self.idle && self.summary.batches > 0 {
            self.idle = true;
            self.listeners.send(QueryEvent::Idle {
                id: self.checkpoint.query_id().to_owned(),
                run_id: self.run_id.clone(),
                timestamp: progress::rfc3339_ms(self.options.clock.now_ms()),
            });
        }
    }
}

/// The latency of a batch's rows, in whole milliseconds: exact below [`EXACT_MS`], with at
/// most 1/64 relative error above.
#[derive(Debug, Default)]
pub(super) struct Latency {
    exact: Vec<u64>,
    above: BTreeMap<u64, u64>,
    rows: u64,
    max: u64,
    /// Parts a sink will be handed when the batch ends: their earliest row's time, and rows.
    held: Vec<(i64, u64)>,
}

const EXACT_MS: u64 = 1024;

impl Latency {
    pub(super) fn add(&mut self, ms: i64, rows: u64) {
        if rows == 0 {
            return;
        }
        let ms = u64::try_from(ms).unwrap_or(0);
        self.rows += rows;
        self.max = self.max.max(ms);
        if ms < EXACT_MS {
            if self.exact.is_empty() {
                self.exact = vec![0; EXACT_MS as usize];
            }
            self.exact[ms as usize] += rows;
        } else {
            let shift = (63 - ms.leading_zeros()).saturating_sub(6);
            *self.above.entry((ms >> shift) << shift).or_default() += rows;
        }
    }

    fn hold(&mut self, first_ms: i64, rows: u64) {
        self.held.push((first_ms, rows));
    }

    /// The held parts were written at `written_ms`.
    fn add_held(&mut self, written_ms: i64) {
        for (first, rows) in std::mem::take(&mut self.held) {
            self.add(written_ms - first, rows);
        }
    }

    fn quantile(&self, q: f64) -> f64 {
        let target = ((self.rows as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        let exact = self.exact.iter().enumerate().map(|(ms, &c)| (ms as u64, c));
        let above = self.above.iter().map(|(&ms, &c)| (ms, c));
        for (ms, count) in exact.chain(above) {
            seen += count;
            if seen >= target {
                return ms as f64;
            }
        }
        self.max as f64
    }

    pub(super) fn progress(&self) -> Option<LatencyProgress> {
        (self.rows > 0).then(|| LatencyProgress {
            rows: self.rows,
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: self.max as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Latency;

    #[test]
    fn latency_quantiles_are_exact_below_a_second_and_close_above() {
        let mut l = Latency::default();
        assert!(l.progress().is_none());
        for ms in 1..=1000 {
            l.add(ms, 1);
        }
        let p = l.progress().unwrap();
        assert_eq!(
            (p.rows, p.p50, p.p99, p.p999, p.max),
            (1000, 500.0, 990.0, 999.0, 1000.0)
        );
        let mut l = Latency::default();
        l.add(5, 998);
        l.add(70_000, 2);
        l.add(-3, 0);
        let p = l.progress().unwrap();
        assert_eq!((p.p50, p.p99, p.max), (5.0, 5.0, 70_000.0));
        let p999 = p.p999;
        assert!((69_000.0..=70_000.0).contains(&p999), "{p999}");
        // A clock step backwards counts as no latency, not as a huge one.
        let mut l = Latency::default();
        l.add(-3, 2);
        assert_eq!(l.progress().unwrap().max, 0.0);
    }
}
