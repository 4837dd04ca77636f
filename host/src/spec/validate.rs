//! The semantic pass: from the raw, all-optional structs to a typed [`Pipeline`].
//!
//! Structure (unknown keys, wrong TOML types) is checked by serde in `raw.rs`; everything that
//! needs knowledge of the settings — required keys per kind, enum values, DDL, durations, sizes,
//! plugin files — is checked here, and every problem is collected instead of returning early, so
//! that one run of `weir run` lists all of them.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toml::{Table, Value};

mod kafka;
mod merge;

use super::duration::{format_duration, parse_duration};
use super::raw::{
    RawAggregate, RawCapabilities, RawCsv, RawDeduplicate, RawDeltaSink, RawDeltaSource,
    RawFilesSource, RawFunction, RawJoin, RawLimits, RawListener, RawPipeline, RawPluginSink,
    RawQuery, RawSink, RawSource, RawTable, RawTransform, RawWatermark, SINK_KINDS, SOURCE_KINDS,
    source_label,
};
use super::size::{format_byte_size, parse_byte_size};
use super::{
    AggregateSpec, DeduplicateSpec, StoreKind, WatermarkPolicy, WatermarkSpec, WindowKind,
    WindowSpec,
};
use super::{
    Capabilities, CommitEvery, DEFAULT_DELTA_TARGET_FILE_SIZE, DEFAULT_TABLE_MAX_BYTES,
    DeltaSinkSpec, DeltaSourceSpec, DirGrant, FilesSourceSpec, FunctionSpec, HttpGrant,
    InputFormat, JoinSpec, JoinType, ListenerKind, ListenerSpec, MalformedPolicy, MergeTableSpec,
    OutputFormat, OutputMode, Pipeline, PluginLimits, PluginSinkSpec, Problem, QuerySpec, RealTime,
    SinkSpec, SourceKind, SourceSpec, TableKind, TableSpec, TransformKind, TransformSpec, Trigger,
    WasmTransformSpec,
};

/// The largest linear memory a 32-bit Wasm instance can have.
const MAX_WASM_MEMORY: u64 = 4 << 30;

const DEFAULT_MAX_BATCH_RETRIES: u32 = 2;
const DEFAULT_CONSOLE_MAX_ROWS: usize = 20;

/// The most aggregates one `[aggregate]` may compute (the operator's state layout).
const MAX_AGGREGATES: usize = 255;

const TRIGGER_HINT: &str =
    "use \"available-now\", \"once\", \"real-time\" or a duration such as \"30s\"";

/// Collects problems, skipping those under a key whose value `raw.rs` already reported and
/// removed (so a badly typed required key is not also reported as missing).
#[derive(Debug)]
pub(super) struct Collector {
    pub problems: Vec<Problem>,
    suppressed: Vec<String>,
}

impl Collector {
    pub fn new(problems: Vec<Problem>) -> Self {
        Self {
            problems,
            suppressed: Vec::new(),
        }
    }

    pub fn push(&mut self, path: &str, message: impl Into<String>) {
        let covered = self.suppressed.iter().any(|s| {
            path.strip_prefix(s.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
        });
        if !covered {
            self.problems.push(Problem::new(path, message));
        }
    }

    pub fn suppress(&mut self, path: String) {
        self.suppressed.push(path);
    }

    fn required<T>(&mut self, path: &str, value: Option<T>) -> Option<T> {
        if value.is_none() {
            self.push(path, "required key is missing");
        }
        value
    }

    /// A required, non-empty path, resolved against `base`.
    fn path(&mut self, path: &str, value: Option<String>, base: &Path) -> Option<PathBuf> {
        let value = self.required(path, value)?;
        if value.trim().is_empty() {
            self.push(path, "must not be empty");
            return None;
        }
        Some(base.join(value))
    }

    fn positive(&mut self, path: &str, value: i64) -> Option<u64> {
        match u64::try_from(value) {
            Ok(n) if n > 0 => Some(n),
            _ => {
                self.push(path, format!("must be a positive integer, not {value}"));
                None
            }
        }
    }

    /// One of `options`, or a problem listing them.
    fn choice<T: Copy>(
        &mut self,
        path: &str,
        value: &str,
        what: &str,
        options: &[(&str, T)],
    ) -> Option<T> {
        let found = options.iter().find(|(name, _)| *name == value);
        if found.is_none() {
            let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
            self.push(
                path,
                format!("{value:?} is not {what}: use {}", quoted_list(&names)),
            );
        }
        found.map(|(_, v)| *v)
    }
}

/// `"a", "b" or "c"`.
fn quoted_list(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn check_name(c: &mut Collector, path: &str, name: String) -> Option<String> {
    if is_valid_name(&name) {
        Some(name)
    } else {
        c.push(
            path,
            format!("{name:?} is not a valid name: use letters, digits, '_', '.' and '-'"),
        );
        None
    }
}

/// Validates the whole file. `None` when any part is invalid (the problems are in `c`).
pub(super) fn pipeline(raw: RawPipeline, base: &Path, c: &mut Collector) -> Option<Pipeline> {
    // The output mode on its own (a bad value is reported by `query`), so that
    // the stateful rules run even when another key of [query] is wrong.
    let output_mode = raw
        .query
        .as_ref()
        .and_then(|q| match q.output_mode.as_deref() {
            None | Some("append") => Some(OutputMode::Append),
            Some("update") => Some(OutputMode::Update),
            Some("complete") => Some(OutputMode::Complete),
            Some(_) => None,
        });
    let query = query(raw.query, base, c);
    // A stream-stream join's sources are joined, not unioned: their columns differ.
    let raw_sources = raw.source.unwrap_or_default();
    let stream_join = raw.join.as_ref().is_some_and(|j| {
        let is_source = |n: &Option<String>| {
            n.as_deref()
                .is_some_and(|n| raw_sources.iter().any(|s| s.name() == Some(n)))
        };
        is_source(&j.left) && is_source(&j.right)
    });
    let sources = sources(raw_sources, !stream_join, base, c);
    let functions = functions(raw.function.unwrap_or_default(), base, c);
    let listeners = listeners(raw.listener.unwrap_or_default(), base, c);
    let tables = tables(raw.table.unwrap_or_default(), sources.as_deref(), base, c);
    let join = raw.join.map(|j| join(j, sources.as_deref(), &tables, c));
    if !matches!(join, Some(None)) {
        for (i, t) in tables.iter().enumerate() {
            let Some(t) = t else { continue };
            let joined = matches!(&join, Some(Some(j)) if j.left == t.name || j.right == t.name);
            if !joined {
                c.push(
                    &format!("table[{i}]"),
                    format!(
                        "{:?} is not an input of [join]: a [[table]] is read to be joined with the stream",
                        t.name
                    ),
                );
            }
        }
    }
    // The SQL is checked with the functions that are valid; an invalid one is reported above.
    let declared = crate::sql::PluginFunction::declared(
        &functions.iter().flatten().cloned().collect::<Vec<_>>(),
    );
    let transforms: Vec<Option<TransformSpec>> = raw
        .transform
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| transform(i, t, base, &declared, c))
        .collect();
    // Where the inputs meet: their union, or the join's output.
    let meet =
        |inputs: &[Option<arrow_schema::SchemaRef>], c: &mut Collector| match (&join, &sources) {
            (Some(Some(j)), Some(sources)) => join_schema(j, sources, inputs, &tables, c),
            _ => union_schema(inputs),
        };
    let rows = match &sources {
        Some(sources) => transform_inputs(sources, &transforms, &declared, &meet, c),
        None => None,
    };
    let has_watermark = raw.watermark.is_some();
    let watermark = raw.watermark.map(|w| watermark(w, c));
    let aggregate = raw.aggregate.map(|a| aggregate(a, &declared, c));
    let deduplicate = raw.deduplicate.map(|d| deduplicate(d, c));
    if stream_join {
        if has_watermark {
            c.push(
                "watermark",
                "the inputs of a stream-stream join have their own watermarks: set watermark = { column, delay } on each [[source]] instead",
            );
        }
        for (key, present) in [
            ("aggregate", aggregate.is_some()),
            ("deduplicate", deduplicate.is_some()),
        ] {
            if present {
                c.push(
                    key,
                    format!("[{key}] after a stream-stream join is not supported yet: write the joined rows to a sink and read them in a query of their own"),
                );
            }
        }
        if let Some(mode) = output_mode.filter(|m| *m != OutputMode::Append) {
            c.push(
                "query.output_mode",
                format!(
                    "a stream-stream join emits each joined row once: it runs in \"append\" output mode only, not {:?} (as in Spark)",
                    format!("{mode:?}").to_ascii_lowercase()
                ),
            );
        }
    }
    if aggregate.is_some() && deduplicate.is_some() {
        c.push(
            "deduplicate",
            "a query has one stateful operator: use [aggregate] or [deduplicate], not both",
        );
    }
    if let (Some(Some(w)), Some(Some(a))) = (&watermark, &aggregate)
        && let Some(window) = &a.window
        && window.column != w.column
    {
        c.push(
            "aggregate.window.column",
            format!(
                "the window is on {:?} but the watermark is on {:?}: windows of a watermarked query must use the watermark column",
                window.column, w.column
            ),
        );
    }
    super::stateful::check(
        output_mode,
        watermark.as_ref().map(Option::as_ref),
        aggregate.as_ref().map(Option::as_ref),
        deduplicate.as_ref().map(Option::as_ref),
        c,
    );
    let sink = sink(raw.sink, base, c);
    super::sink_modes::check(output_mode, sink.as_ref(), c);
    if let (Some(SinkSpec::DeltaMerge(spec)), Some(rows), None) = (&sink, &rows, &aggregate) {
        merge_columns(spec, rows, c);
    }
    let pipeline = Pipeline {
        query: query?,
        sources: sources?,
        transforms: transforms.into_iter().collect::<Option<Vec<_>>>()?,
        functions: functions.into_iter().collect::<Option<Vec<_>>>()?,
        listeners: listeners.into_iter().collect::<Option<Vec<_>>>()?,
        tables: tables.into_iter().collect::<Option<Vec<_>>>()?,
        join: present(join).ok()?,
        watermark: present(watermark).ok()?,
        aggregate: present(aggregate).ok()?,
        deduplicate: present(deduplicate).ok()?,
        sink: sink?,
        base_dir: base.to_path_buf(),
    };
    for problem in super::real_time::real_time_problems(&pipeline) {
        c.push(&problem.path, problem.message);
    }
    Some(pipeline)
}

/// Each `input` names a source, and the transforms of one input come before
/// those of the whole query (they run before the inputs meet). SQL is planned
/// against the input's schema wherever the file says it, so unknown columns
/// and bad types are found here rather than at start.
///
/// Returns the schema the transforms hand on once the inputs meet, when it is known.
fn transform_inputs(
    sources: &[SourceSpec],
    transforms: &[Option<TransformSpec>],
    functions: &[crate::sql::PluginFunction],
    meet: &Meet<'_>,
    c: &mut Collector,
) -> Option<arrow_schema::SchemaRef> {
    let mut inputs: Vec<Option<arrow_schema::SchemaRef>> = sources
        .iter()
        .map(crate::source::schema_before_open)
        .collect();
    // The schema after the inputs meet: known when every input's is, and they agree.
    let mut met: Option<Option<arrow_schema::SchemaRef>> = None;
    let mut first_of_all: Option<usize> = None;
    for (i, t) in transforms.iter().enumerate() {
        // An invalid transform is reported already; what follows it cannot be planned.
        let Some(t) = t else { return None };
        let schema = match &t.input {
            Some(name) => {
                let Some(j) = sources.iter().position(|s| &s.name == name) else {
                    let names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
                    c.push(
                        &format!("transform[{i}].input"),
                        format!(
                            "no [[source]] is named {name:?} (the sources are {})",
                            names.join(", ")
                        ),
                    );
                    return None;
                };
                if let Some(g) = first_of_all {
                    c.push(
                        &format!("transform[{i}].input"),
                        format!(
                            "comes after transform[{g}], which applies once the inputs meet: \
                             list the transforms of one input first"
                        ),
                    );
                    return None;
                }
                &mut inputs[j]
            }
            None => {
                first_of_all.get_or_insert(i);
                met.get_or_insert_with(|| meet(&inputs, c))
            }
        };
        match &t.kind {
            TransformKind::Sql { sql } => {
                if let Some(input) = schema.as_ref() {
                    match crate::sql::plan_sql(sql, input, functions) {
                        Ok(plan) => *schema = Some(Arc::clone(plan.output_schema())),
                        Err(e) => {
                            c.push(&format!("transform[{i}].sql"), e.to_string());
                            *schema = None;
                        }
                    }
                }
            }
            // A plugin's output schema is known once it is loaded.
            TransformKind::Wasm(_) => *schema = None,
        }
    }
    met.unwrap_or_else(|| meet(&inputs, c))
}

/// Where the inputs meet, given their schemas after their own transforms: the union's or the
/// join's schema, when known.
type Meet<'a> = dyn Fn(&[Option<arrow_schema::SchemaRef>], &mut Collector) -> Option<arrow_schema::SchemaRef>
    + 'a;

/// The schema of the unioned inputs: known when every input's is, and they agree.
fn union_schema(inputs: &[Option<arrow_schema::SchemaRef>]) -> Option<arrow_schema::SchemaRef> {
    let first = inputs.first().cloned().flatten()?;
    inputs
        .iter()
        .all(|s| s.as_ref() == Some(&first))
        .then_some(first)
}

/// A MERGE sink's keys and conditions against the rows it will be given, when the file says
/// what they are (no aggregation between, every schema known): a typo in a condition is found
/// by `weir validate`, not by the first batch.
fn merge_columns(spec: &MergeTableSpec, rows: &arrow_schema::SchemaRef, c: &mut Collector) {
    let columns = || {
        rows.fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for (i, key) in spec.keys.iter().enumerate() {
        if rows.field_with_name(key).is_err() {
            c.push(
                &format!("sink.keys[{i}]"),
                format!(
                    "{key:?} is not a column of the rows the sink is given ({})",
                    columns()
                ),
            );
        }
    }
    for (name, condition) in [
        ("when_matched_delete", &spec.when_matched_delete),
        ("when_matched_update", &spec.when_matched_update),
        ("when_not_matched_insert", &spec.when_not_matched_insert),
    ] {
        if let Some(condition) = condition
            && let Err(e) = condition.plan(rows)
        {
            c.push(
                &format!("sink.{name}"),
                format!("{:?}: {e}", condition.to_string()),
            );
        }
    }
}

fn query(raw: Option<RawQuery>, base: &Path, c: &mut Collector) -> Option<QuerySpec> {
    let Some(q) = raw else {
        c.push("query", "required table [query] is missing");
        return None;
    };
    let name = c
        .required("query.name", q.name)
        .and_then(|n| check_name(c, "query.name", n));
    let checkpoint = c.path("query.checkpoint", q.checkpoint, base);
    let trigger = trigger_value(c, q.trigger);
    let output_mode = match q.output_mode.as_deref() {
        None => Some(OutputMode::Append),
        Some(mode) => c.choice(
            "query.output_mode",
            mode,
            "an output mode",
            &[
                ("append", OutputMode::Append),
                ("update", OutputMode::Update),
                ("complete", OutputMode::Complete),
            ],
        ),
    };
    let max_batch_retries = match q.max_batch_retries {
        None => Some(DEFAULT_MAX_BATCH_RETRIES),
        Some(n) => u32::try_from(n).ok().or_else(|| {
            c.push(
                "query.max_batch_retries",
                format!("{n} is not a retry count: use 0 or a positive integer"),
            );
            None
        }),
    };
    let state_store = match q.state_store.as_deref() {
        None => Some(None),
        Some(kind) => c
            .choice(
                "query.state_store",
                kind,
                "a state store",
                &[
                    ("runs", StoreKind::Runs),
                    ("rocksdb", StoreKind::RocksDb),
                    ("memory", StoreKind::Memory),
                ],
            )
            .map(Some),
    };
    let state_partitions = match q.state_partitions {
        None => Some(DEFAULT_STATE_PARTITIONS),
        Some(n) => match u32::try_from(n) {
            Ok(p @ 1..=1024) => Some(p),
            _ => {
                c.push(
                    "query.state_partitions",
                    format!("{n} is not a partition count: use 1 to 1024"),
                );
                None
            }
        },
    };
    let watermark_policy = match q.watermark_policy.as_deref() {
        None => Some(WatermarkPolicy::Min),
        Some(p) => c.choice(
            "query.watermark_policy",
            p,
            "a watermark policy",
            &[("min", WatermarkPolicy::Min), ("max", WatermarkPolicy::Max)],
        ),
    };
    let threads = match q.threads {
        None => Some(None),
        Some(n) => match usize::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_THREADS).contains(n))
        {
            Some(n) => NonZeroUsize::new(n).map(Some),
            None => {
                c.push(
                    "query.threads",
                    format!("{n} is not a thread count: use 1 to {MAX_THREADS}"),
                );
                None
            }
        },
    };
    Some(QuerySpec {
        name: name?,
        checkpoint: checkpoint?,
        trigger: trigger?,
        output_mode: output_mode?,
        max_batch_retries: max_batch_retries?,
        state_store: state_store?,
        state_partitions: state_partitions?,
        watermark_policy: watermark_policy?,
        threads: threads?,
    })
}

const DEFAULT_STATE_PARTITIONS: u32 = 2;
/// The most threads `query.threads` may ask for.
const MAX_THREADS: usize = 1024;

/// A required, positive duration at `path`.
fn positive_duration(
    c: &mut Collector,
    path: &str,
    value: Option<&str>,
) -> Option<std::time::Duration> {
    let text = c.required(path, value)?;
    match parse_duration(text) {
        Ok(d) if !d.is_zero() => Some(d),
        Ok(_) => {
            c.push(path, "must be longer than zero");
            None
        }
        Err(e) => {
            c.push(path, e);
            None
        }
    }
}

fn non_empty_names(
    c: &mut Collector,
    path: &str,
    names: Option<Vec<String>>,
) -> Option<Vec<String>> {
    let names = c.required(path, names)?;
    if names.is_empty() {
        c.push(path, "must name at least one column");
        return None;
    }
    if let Some(blank) = names.iter().position(|n| n.trim().is_empty()) {
        c.push(&format!("{path}[{blank}]"), "must not be empty");
        return None;
    }
    Some(names)
}

/// `[watermark]`; the outer `Option` is `None` when a problem was reported.
fn watermark(w: RawWatermark, c: &mut Collector) -> Option<WatermarkSpec> {
    watermark_at("watermark", w, c)
}

/// A watermark at `label` (`watermark`, or `source.<name>.watermark`).
fn watermark_at(label: &str, w: RawWatermark, c: &mut Collector) -> Option<WatermarkSpec> {
    let key = |k: &str| format!("{label}.{k}");
    let column = c.required(&key("column"), w.column);
    let delay = match w.delay.as_deref() {
        None => {
            c.push(&key("delay"), "required key is missing");
            None
        }
        Some(text) => match parse_duration(text) {
            Ok(d) => Some(d),
            Err(e) => {
                c.push(&key("delay"), e);
                None
            }
        },
    };
    let idle_timeout = match w.idle_timeout.as_deref() {
        None => Some(None),
        Some(t) => positive_duration(c, &key("idle_timeout"), Some(t)).map(Some),
    };
    Some(WatermarkSpec {
        column: column?,
        delay: delay?,
        idle_timeout: idle_timeout?,
    })
}

/// `[aggregate]` with expressions, as far as it can be checked without the
/// input's schema: each entry parses, the lowering holds, its SQL is a valid
/// transform and its aggregates are the operator's.
fn check_aggregate_expressions(
    group_by: &[String],
    select: &[String],
    functions: &[crate::sql::PluginFunction],
    c: &mut Collector,
) -> bool {
    let empty = Arc::new(arrow_schema::Schema::empty());
    let lower =
        |select: &[String]| crate::sql::lower_aggregate(group_by, select, &empty, &[], false);
    // The grouping entries alone, then each select entry, so that a problem is reported at its
    // own key.
    if let Err(e) = lower(&[]) {
        c.push("aggregate.group_by", e.to_string());
        return false;
    }
    let mut ok = true;
    for (i, text) in select.iter().enumerate() {
        if let Err(e) = lower(std::slice::from_ref(text)) {
            c.push(&format!("aggregate.select[{i}]"), e.to_string());
            ok = false;
        }
    }
    if !ok {
        return false;
    }
    let lowered = match lower(select) {
        Ok(l) => l,
        Err(e) => {
            c.push("aggregate.select", e.to_string());
            return false;
        }
    };
    let mut ok = true;
    for (part, sql) in [("group_by", &lowered.before), ("select", &lowered.after)] {
        if let Err(e) = crate::sql::check_sql(sql, functions) {
            c.push(&format!("aggregate.{part}"), e.to_string());
            ok = false;
        }
    }
    for text in &lowered.select {
        if let Err(e) = crate::operator::aggregate::parse_agg_expr(text) {
            c.push("aggregate.select", e.to_string());
            ok = false;
        }
    }
    ok
}

fn aggregate(
    a: RawAggregate,
    functions: &[crate::sql::PluginFunction],
    c: &mut Collector,
) -> Option<AggregateSpec> {
    let window = match a.window {
        None => Some(None),
        Some(w) => {
            let column = c.required("aggregate.window.column", w.column);
            let kind = match (w.size.as_deref(), w.slide.as_deref(), w.gap.as_deref()) {
                (Some(size), None, None) => {
                    positive_duration(c, "aggregate.window.size", Some(size))
                        .map(|size| WindowKind::Tumbling { size })
                }
                (Some(size), Some(slide), None) => {
                    let size = positive_duration(c, "aggregate.window.size", Some(size));
                    let slide = positive_duration(c, "aggregate.window.slide", Some(slide));
                    match (size, slide) {
                        (Some(size), Some(slide)) if slide > size => {
                            c.push(
                                "aggregate.window.slide",
                                "must not be longer than the window size",
                            );
                            None
                        }
                        (Some(size), Some(slide)) => Some(WindowKind::Sliding { size, slide }),
                        _ => None,
                    }
                }
                (None, None, Some(gap)) => positive_duration(c, "aggregate.window.gap", Some(gap))
                    .map(|gap| WindowKind::Session { gap }),
                _ => {
                    c.push(
                        "aggregate.window",
                        "give size (tumbling), size and slide (sliding), or gap (session)",
                    );
                    None
                }
            };
            Some(Some(WindowSpec {
                column: column?,
                kind: kind?,
            }))
        }
    };
    let group_by = a.group_by.unwrap_or_default();
    let select = non_empty_names(c, "aggregate.select", a.select).and_then(|select| {
        // Parsed here as well as by the operator, so that `weir validate` reports a typo.
        let mut ok = true;
        if crate::sql::needs_lowering(&group_by, &select) {
            // Expressions: lowered around the operator; each part checked as SQL.
            ok = check_aggregate_expressions(&group_by, &select, functions, c);
        } else {
            for (i, text) in select.iter().enumerate() {
                if let Err(err) = crate::operator::aggregate::parse_agg_expr(text) {
                    ok = false;
                    c.push(&format!("aggregate.select[{i}]"), err.to_string());
                }
            }
        }
        if select.len() > MAX_AGGREGATES {
            ok = false;
            c.push(
                "aggregate.select",
                format!(
                    "{} aggregates; at most {MAX_AGGREGATES} are supported",
                    select.len()
                ),
            );
        }
        ok.then_some(select)
    });
    Some(AggregateSpec {
        window: window?,
        group_by,
        select: select?,
    })
}

fn deduplicate(d: RawDeduplicate, c: &mut Collector) -> Option<DeduplicateSpec> {
    let keys = non_empty_names(c, "deduplicate.keys", d.keys);
    Some(DeduplicateSpec {
        keys: keys?,
        within_watermark: d.within_watermark.unwrap_or(false),
    })
}

/// An optional table: `None` when absent, `Some(None)` when it had problems (already
/// reported); this keeps the second case from passing as "absent".
fn present<T>(table: Option<Option<T>>) -> Result<Option<T>, ()> {
    match table {
        None => Ok(None),
        Some(Some(t)) => Ok(Some(t)),
        Some(None) => Err(()),
    }
}

/// `query.trigger` as the file has it: a string, or the real-time trigger's table.
fn trigger_value(c: &mut Collector, value: Option<Value>) -> Option<Trigger> {
    match value {
        None => trigger(c, None),
        Some(Value::String(text)) => trigger(c, Some(&text)),
        Some(Value::Table(table)) => real_time_trigger(c, table),
        Some(other) => {
            c.push(
                "query.trigger",
                format!(
                    "expected a string or a table such as {{ real_time = \"5 minutes\" }}, found {}",
                    other.type_str()
                ),
            );
            None
        }
    }
}

/// `trigger = { real_time = "5 minutes", max_latency = "10ms" }`.
fn real_time_trigger(c: &mut Collector, table: Table) -> Option<Trigger> {
    let mut settings = RealTime {
        checkpoint_interval: RealTime::DEFAULT_INTERVAL,
        max_latency: RealTime::DEFAULT_MAX_LATENCY,
    };
    let mut ok = true;
    if !table.contains_key("real_time") {
        c.push(
            "query.trigger.real_time",
            "required in a trigger table: the checkpoint interval, such as \"5 minutes\"",
        );
        ok = false;
    }
    for (key, value) in table {
        let path = format!("query.trigger.{key}");
        let slot = match key.as_str() {
            "real_time" => &mut settings.checkpoint_interval,
            "max_latency" => &mut settings.max_latency,
            _ => {
                c.push(
                    &path,
                    "unknown key: a trigger table takes real_time and max_latency",
                );
                ok = false;
                continue;
            }
        };
        let parsed = match &value {
            Value::String(text) => parse_duration(text),
            other => Err(format!(
                "expected a duration such as \"10ms\", found {}",
                other.type_str()
            )),
        };
        match parsed {
            Ok(d) if d.is_zero() => {
                c.push(&path, "must be longer than zero");
                ok = false;
            }
            Ok(d) => *slot = d,
            Err(e) => {
                c.push(&path, e);
                ok = false;
            }
        }
    }
    if ok && settings.max_latency >= settings.checkpoint_interval {
        c.push(
            "query.trigger.max_latency",
            format!(
                "{} is not below the checkpoint interval ({}): a part must end within its batch",
                format_duration(settings.max_latency),
                format_duration(settings.checkpoint_interval)
            ),
        );
        ok = false;
    }
    ok.then_some(Trigger::RealTime(settings))
}

fn trigger(c: &mut Collector, text: Option<&str>) -> Option<Trigger> {
    const PATH: &str = "query.trigger";
    let text = match text {
        None => return Some(Trigger::Continuous),
        Some("available-now") => return Some(Trigger::AvailableNow),
        Some("once") => return Some(Trigger::Once),
        Some("real-time") => {
            return Some(Trigger::RealTime(RealTime {
                checkpoint_interval: RealTime::DEFAULT_INTERVAL,
                max_latency: RealTime::DEFAULT_MAX_LATENCY,
            }));
        }
        Some(text) => text,
    };
    match parse_duration(text) {
        Ok(interval) if interval.is_zero() => {
            c.push(
                PATH,
                format!(
                    "{text:?} is not a trigger interval: use a duration longer than zero, or leave \
                     trigger out to start each batch as soon as the previous one ends"
                ),
            );
            None
        }
        Ok(interval) => Some(Trigger::ProcessingTime(interval)),
        Err(err) => {
            let mut message = format!("{text:?} is not a trigger: {TRIGGER_HINT}");
            // Something that starts like a duration gets the duration's own explanation too.
            if text
                .trim_start()
                .starts_with(|ch: char| ch.is_ascii_digit())
            {
                let prefix = format!("{text:?} is not a duration: ");
                let why = err.strip_prefix(prefix.as_str()).unwrap_or(&err);
                message.push_str(&format!(" ({why})"));
            }
            c.push(PATH, message);
            None
        }
    }
}

fn sources(
    raw: Vec<RawSource>,
    unioned: bool,
    base: &Path,
    c: &mut Collector,
) -> Option<Vec<SourceSpec>> {
    if raw.is_empty() {
        c.push("source", "required: one [[source]] table (none given)");
        return None;
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, s) in raw.iter().enumerate() {
        if let Some(name) = s.name().filter(|n| !n.is_empty()) {
            if let Some(first) = seen.get(name) {
                c.push(
                    &format!("{}.name", source_label(i, Some(name))),
                    format!(
                        "duplicate source name {name:?} (also source number {}): source names must be unique",
                        first + 1
                    ),
                );
            } else {
                seen.insert(name.to_string(), i);
            }
        }
    }
    let specs: Vec<Option<SourceSpec>> = raw
        .into_iter()
        .enumerate()
        .map(|(i, s)| source(i, s, base, c))
        .collect();
    let specs: Vec<SourceSpec> = specs.into_iter().collect::<Option<_>>()?;
    if unioned {
        union_compatible(&specs, c);
        for s in &specs {
            if s.watermark.is_some() {
                c.push(
                    &format!("source.{}.watermark", s.name),
                    "a source's own watermark is for the inputs of a stream-stream [join]; for the event time of the whole query use [watermark]",
                );
            }
        }
    }
    Some(specs)
}

/// Several sources are unioned: they must bring the same columns, and each
/// keeps its own dead letters (files are named by batch id).
fn union_compatible(specs: &[SourceSpec], c: &mut Collector) {
    let Some(first) = specs.first() else {
        return;
    };
    // The columns a source brings: its schema (None: Kafka's raw record
    // columns) and whether the permissive policy adds `_corrupt_record`;
    // nothing for a Delta table, whose schema is known only when it is read
    // (the query checks it then).
    let columns = |s: &SourceSpec| match &s.kind {
        // A Parquet source without `schema`: known once its first file is read.
        SourceKind::Files(f) => f.schema.as_ref().map(|schema| {
            (
                Some(Arc::clone(schema)),
                f.on_malformed == MalformedPolicy::Permissive && f.format != InputFormat::Parquet,
            )
        }),
        SourceKind::Kafka(k) => Some(match &k.value_format {
            super::KafkaValueFormat::Raw => (None, false),
            super::KafkaValueFormat::Json(schema) => (
                Some(Arc::clone(schema)),
                k.on_malformed == MalformedPolicy::Permissive,
            ),
        }),
        SourceKind::Delta(_) => None,
    };
    let first_columns = columns(first);
    let mut dead_letters: HashMap<&Path, &str> = HashMap::new();
    for s in specs {
        let dead_letter = match &s.kind {
            SourceKind::Files(f) => f.dead_letter_path.as_deref(),
            SourceKind::Kafka(k) => k.dead_letter_path.as_deref(),
            SourceKind::Delta(_) => None,
        };
        if let Some(dir) = dead_letter
            && let Some(other) = dead_letters.insert(dir, &s.name)
        {
            c.push(
                &format!("source.{}.dead_letter_path", s.name),
                format!(
                    "{} is also the dead-letter folder of source {other}: give each source its own",
                    dir.display()
                ),
            );
        }
        if s.name == first.name {
            continue;
        }
        let (Some((first_schema, first_corrupt)), Some((schema, corrupt))) =
            (&first_columns, columns(s))
        else {
            continue;
        };
        if schema != *first_schema {
            c.push(
                &format!("source.{}.schema", s.name),
                format!(
                    "differs from the schema of source {}: the sources of a query are unioned and must have the same columns",
                    first.name
                ),
            );
        } else if corrupt != *first_corrupt {
            c.push(
                &format!("source.{}.on_malformed", s.name),
                format!(
                    "only one of this source and source {} is permissive, which adds a _corrupt_record column: the sources of a query are unioned and must have the same columns",
                    first.name
                ),
            );
        }
    }
}

fn source(index: usize, mut s: RawSource, base: &Path, c: &mut Collector) -> Option<SourceSpec> {
    let label = source_label(index, s.name());
    let key = |k: &str| format!("{label}.{k}");
    let name = c
        .required(&key("name"), s.name().map(str::to_owned))
        .and_then(|n| check_name(c, &key("name"), n));
    let watermark = match s.take_watermark() {
        None => Some(None),
        Some(w) => watermark_at(&key("watermark"), w, c).map(Some),
    };
    let spec = source_of_kind(index, s, name, base, c);
    Some(SourceSpec {
        watermark: watermark?,
        ..spec?
    })
}

fn source_of_kind(
    index: usize,
    s: RawSource,
    name: Option<String>,
    base: &Path,
    c: &mut Collector,
) -> Option<SourceSpec> {
    let label = source_label(index, s.name());
    let key = |k: &str| format!("{label}.{k}");
    match s {
        RawSource::Files(f) => files_source(&label, name, f, base, c),
        RawSource::Kafka(k) => kafka::source(&label, name, k, base, c),
        RawSource::Delta(d) => delta_source(&label, name, d, base, c),
        RawSource::NoKind(f) => {
            c.push(
                &key("kind"),
                format!(
                    "required key is missing: use {}",
                    quoted_list(&SOURCE_KINDS)
                ),
            );
            // Checked as files all the same, so that its other problems are in the same list.
            let _ = files_source(&label, name, f, base, c);
            None
        }
        RawSource::UnknownKind { kind, .. } => {
            c.push(
                &key("kind"),
                format!(
                    "{kind:?} is not a source kind: use {}",
                    quoted_list(&SOURCE_KINDS)
                ),
            );
            None
        }
    }
}

/// A `kind = "files"` source labelled `label`.
fn files_source(
    label: &str,
    name: Option<String>,
    s: RawFilesSource,
    base: &Path,
    c: &mut Collector,
) -> Option<SourceSpec> {
    let key = |k: &str| format!("{label}.{k}");
    let path = c.path(&key("path"), s.path, base);
    let parquet = s.format.as_deref() == Some("parquet");
    let format = input_format(c, label, s.format.as_deref(), s.csv);
    // Parquet files carry their schema: `schema` is optional there (the first file's).
    let schema = match s.schema {
        None if parquet => Some(None),
        ddl => c.required(&key("schema"), ddl).and_then(|ddl| {
            super::ddl::parse_schema(&ddl)
                .map(|schema| Some(Arc::new(schema)))
                .map_err(|err| c.push(&key("schema"), err))
                .ok()
        }),
    };
    let max_files_per_trigger = match s.max_files_per_trigger {
        None => Some(None),
        Some(n) => c
            .positive(&key("max_files_per_trigger"), n)
            .and_then(|n| usize::try_from(n).ok())
            .and_then(NonZeroUsize::new)
            .map(Some),
    };
    let (on_malformed, dead_letter_path) = if parquet {
        // A Parquet file has no malformed rows: one that cannot be read fails the batch.
        let does_not_apply = "does not apply to format = \"parquet\": Parquet files have no \
                              malformed rows (a file that cannot be read fails the batch, naming it)";
        if s.on_malformed.as_deref().is_some_and(|m| m != "permissive") {
            c.push(&key("on_malformed"), does_not_apply);
        }
        if s.dead_letter_path.is_some() {
            c.push(&key("dead_letter_path"), does_not_apply);
        }
        (Some(MalformedPolicy::Permissive), Some(None))
    } else {
        malformed_policy(c, label, s.on_malformed, s.dead_letter_path, base)
    };
    Some(SourceSpec {
        name: name?,
        watermark: None,
        kind: SourceKind::Files(FilesSourceSpec {
            path: path?,
            format: format?,
            schema: schema?,
            max_files_per_trigger: max_files_per_trigger?,
            on_malformed: on_malformed?,
            dead_letter_path: dead_letter_path?,
        }),
    })
}

/// `on_malformed` and the `dead_letter_path` it may require, for the source labelled `label`.
fn malformed_policy(
    c: &mut Collector,
    label: &str,
    raw_mode: Option<String>,
    dead_letter_path: Option<String>,
    base: &Path,
) -> (Option<MalformedPolicy>, Option<Option<PathBuf>>) {
    let key = |k: &str| format!("{label}.{k}");
    let on_malformed = match raw_mode.as_deref() {
        None => Some(MalformedPolicy::Permissive),
        Some(mode) => c.choice(
            &key("on_malformed"),
            mode,
            "an on_malformed mode",
            &[
                ("permissive", MalformedPolicy::Permissive),
                ("drop", MalformedPolicy::Drop),
                ("fail", MalformedPolicy::Fail),
                ("dead-letter", MalformedPolicy::DeadLetter),
            ],
        ),
    };
    let dead_letter_path = match (on_malformed, dead_letter_path) {
        (Some(MalformedPolicy::DeadLetter), raw) => {
            if raw.is_none() {
                c.push(
                    &key("dead_letter_path"),
                    "required when on_malformed = \"dead-letter\": the folder for malformed rows",
                );
                None
            } else {
                c.path(&key("dead_letter_path"), raw, base).map(Some)
            }
        }
        (Some(_), Some(_)) => {
            let mode = raw_mode.as_deref().unwrap_or("permissive");
            c.push(
                &key("dead_letter_path"),
                format!(
                    "only used with on_malformed = \"dead-letter\" (on_malformed is {mode:?}); \
                     remove it or set on_malformed = \"dead-letter\""
                ),
            );
            None
        }
        (Some(_), None) => Some(None),
        (None, _) => None,
    };
    (on_malformed, dead_letter_path)
}

/// `[[source]]` of kind "delta": a table path and where to start; the schema is the table's.
fn delta_source(
    label: &str,
    name: Option<String>,
    s: RawDeltaSource,
    base: &Path,
    c: &mut Collector,
) -> Option<SourceSpec> {
    let key = |k: &str| format!("{label}.{k}");
    let path = c.path(&key("path"), s.path, base);
    let max_files_per_trigger = match s.max_files_per_trigger {
        None => Some(None),
        Some(n) => c
            .positive(&key("max_files_per_trigger"), n)
            .and_then(|n| usize::try_from(n).ok())
            .and_then(NonZeroUsize::new)
            .map(Some),
    };
    let starting_version = match s.starting_version {
        None => Some(None),
        Some(v) => match u64::try_from(v) {
            Ok(v) => Some(Some(v)),
            Err(_) => {
                c.push(
                    &key("starting_version"),
                    format!("must be a table version (0 or more), not {v}"),
                );
                None
            }
        },
    };
    Some(SourceSpec {
        name: name?,
        watermark: None,
        kind: SourceKind::Delta(DeltaSourceSpec {
            path: path?,
            max_files_per_trigger: max_files_per_trigger?,
            starting_version: starting_version?,
        }),
    })
}

fn delimiter(c: &mut Collector, path: &str, text: &str) -> Option<u8> {
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(ch), None) if ch.is_ascii() && !matches!(ch, '\n' | '\r' | '"') => {
            // An ASCII char is one byte.
            u8::try_from(ch).ok()
        }
        _ => {
            c.push(
                path,
                format!(
                    "{text:?} is not a delimiter: use one ASCII character other than a quote or a \
                     line break, such as \",\", \";\" or \"\\t\""
                ),
            );
            None
        }
    }
}

fn transform(
    index: usize,
    t: RawTransform,
    base: &Path,
    functions: &[crate::sql::PluginFunction],
    c: &mut Collector,
) -> Option<TransformSpec> {
    let label = format!("transform[{index}]");
    let key = |k: &str| format!("{label}.{k}");
    let input = match t.input {
        Some(i) if i.trim().is_empty() => {
            c.push(
                &key("input"),
                "must name a [[source]] (leave it out to apply to every input)",
            );
            None
        }
        other => Some(other),
    };
    if let Some(sql) = t.sql {
        // The plugin's keys mean nothing to a SQL transform: say so rather than ignore them.
        let plugin_keys = [
            ("plugin", t.plugin.is_some()),
            ("config", t.config.is_some()),
            ("limits", t.limits.is_some()),
            ("sha256", t.sha256.is_some()),
            ("capabilities", t.capabilities.is_some()),
        ];
        for (k, present) in plugin_keys {
            if present {
                c.push(
                    &key(k),
                    "is a plugin's key: a [[transform]] runs either `sql` or a `plugin`, not both",
                );
            }
        }
        if let Err(e) = crate::sql::check_sql(&sql, functions) {
            c.push(&key("sql"), e.to_string());
            return None;
        }
        let name = match t.name {
            Some(n) if n.trim().is_empty() => {
                c.push(
                    &key("name"),
                    "must not be empty (leave it out for sql_<index>)",
                );
                None
            }
            Some(n) => Some(n),
            None => Some(format!("sql_{index}")),
        };
        if plugin_keys.iter().any(|(_, present)| *present) {
            return None;
        }
        return Some(TransformSpec {
            name: name?,
            input: input?,
            kind: TransformKind::Sql { sql },
        });
    }
    if t.plugin.is_none() {
        c.push(
            &key("plugin"),
            "required key is missing: a [[transform]] runs a `plugin` (a .wasm component) or `sql`",
        );
        return None;
    }
    let name = plugin_name(c, &key("name"), t.name, t.plugin.as_deref());
    let plugin = transform_plugin(
        c,
        &label,
        RawPluginKeys {
            plugin: t.plugin,
            config: t.config,
            limits: t.limits,
            sha256: t.sha256,
            capabilities: t.capabilities,
        },
        base,
    );
    Some(TransformSpec {
        name: name?,
        input: input?,
        kind: TransformKind::Wasm(plugin?),
    })
}

/// The keys of a plugin that is not a sink (`[[transform]]`, `[[function]]`), as read.
struct RawPluginKeys {
    plugin: Option<String>,
    config: Option<Table>,
    limits: Option<RawLimits>,
    sha256: Option<String>,
    capabilities: Option<RawCapabilities>,
}

/// A transform's or a function's plugin under `label`: its file, config, limits, pin and
/// grants, MERGE refused (a sink's capability: nothing else has a batch to commit).
fn transform_plugin(
    c: &mut Collector,
    label: &str,
    raw: RawPluginKeys,
    base: &Path,
) -> Option<WasmTransformSpec> {
    let key = |k: &str| format!("{label}.{k}");
    let plugin = plugin_path(c, &key("plugin"), raw.plugin, base);
    let config = config(c, &key("config"), raw.config);
    let limits = limits(c, &key("limits"), raw.limits);
    let sha256 = sha256(c, &key("sha256"), raw.sha256);
    let capabilities =
        capabilities(c, &key("capabilities"), raw.capabilities, base).filter(|caps| {
            if caps.delta_merge.is_empty() {
                return true;
            }
            c.push(
                &key("capabilities.delta_merge"),
                "MERGE into Delta tables is a sink capability: grant it under [sink.capabilities]",
            );
            false
        });
    Some(WasmTransformSpec {
        plugin: plugin?,
        config: config?,
        limits: limits?,
        sha256: sha256?,
        capabilities: capabilities?,
    })
}

/// The `[[table]]`s: static inputs of a join, each named apart from the sources.
fn tables(
    raw: Vec<RawTable>,
    sources: Option<&[SourceSpec]>,
    base: &Path,
    c: &mut Collector,
) -> Vec<Option<TableSpec>> {
    let mut seen: Vec<String> = Vec::new();
    raw.into_iter()
        .enumerate()
        .map(|(i, t)| {
            let spec = table(i, t, base, c)?;
            let label = format!("table[{i}].name");
            if seen.contains(&spec.name) {
                c.push(&label, format!("{:?} is the name of another [[table]]", spec.name));
                return None;
            }
            if sources.is_some_and(|s| s.iter().any(|s| s.name == spec.name)) {
                c.push(&label, format!("{:?} is the name of a [[source]]: a join names its inputs, give them other names", spec.name));
                return None;
            }
            seen.push(spec.name.clone());
            Some(spec)
        })
        .collect()
}

/// One `[[table]]`.
fn table(index: usize, t: RawTable, base: &Path, c: &mut Collector) -> Option<TableSpec> {
    let label = format!("table[{index}]");
    let key = |k: &str| format!("{label}.{k}");
    let name = c
        .required(&key("name"), t.name)
        .and_then(|n| check_name(c, &key("name"), n));
    let path = c.path(&key("path"), t.path, base);
    let max_bytes = size_or(c, &key("max_size"), t.max_size, DEFAULT_TABLE_MAX_BYTES);
    let kind = match c.required(&key("kind"), t.kind).as_deref() {
        None => None,
        Some("files") => {
            let format = input_format(c, &label, t.format.as_deref(), t.csv);
            let schema = match (t.schema, format) {
                (Some(ddl), _) => super::ddl::parse_schema(&ddl)
                    .map(|s| Some(Arc::new(s)))
                    .map_err(|err| c.push(&key("schema"), err))
                    .ok(),
                (None, Some(InputFormat::Parquet)) => Some(None),
                (None, Some(_)) => {
                    c.push(
                        &key("schema"),
                        "required key is missing: JSON and CSV tables declare their columns (\"customer_id BIGINT, name STRING\")",
                    );
                    None
                }
                (None, None) => None,
            };
            Some(TableKind::Files {
                path: path.clone()?,
                format: format?,
                schema: schema?,
            })
        }
        Some("delta") => {
            for (k, present) in [
                ("format", t.format.is_some()),
                ("schema", t.schema.is_some()),
                ("csv", t.csv.is_some()),
            ] {
                if present {
                    c.push(
                        &key(k),
                        "applies to kind = \"files\": a Delta table has its own format and schema",
                    );
                }
            }
            Some(TableKind::Delta {
                path: path.clone()?,
            })
        }
        Some(other) => {
            c.push(
                &key("kind"),
                format!("{other:?} is not a table kind: use \"files\" or \"delta\""),
            );
            None
        }
    };
    Some(TableSpec {
        name: name?,
        kind: kind?,
        max_bytes: max_bytes?,
    })
}

/// `[join]`: its inputs, type, keys and condition, and Spark's rules for a stream-static join.
fn join(
    raw: RawJoin,
    sources: Option<&[SourceSpec]>,
    tables: &[Option<TableSpec>],
    c: &mut Collector,
) -> Option<JoinSpec> {
    let source_names: Vec<&str> = sources
        .unwrap_or_default()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    let table_names: Vec<&str> = tables.iter().flatten().map(|t| t.name.as_str()).collect();
    let mut input = |k: &str, name: Option<String>| -> Option<(String, bool)> {
        let name = c.required(&format!("join.{k}"), name)?;
        if source_names.contains(&name.as_str()) {
            Some((name, true))
        } else if table_names.contains(&name.as_str()) {
            Some((name, false))
        } else {
            let all: Vec<&str> = source_names.iter().chain(&table_names).copied().collect();
            c.push(
                &format!("join.{k}"),
                format!(
                    "no [[source]] or [[table]] is named {name:?} (the inputs are {})",
                    all.join(", ")
                ),
            );
            None
        }
    };
    let left = input("left", raw.left);
    let right = input("right", raw.right);
    let kind = match raw.kind.as_deref() {
        None => Some(JoinType::Inner),
        Some(text) => {
            let folded = text.to_ascii_lowercase().replace('_', "");
            let kind = match folded.as_str() {
                "inner" => Some(JoinType::Inner),
                "left" | "leftouter" => Some(JoinType::Left),
                "right" | "rightouter" => Some(JoinType::Right),
                "full" | "fullouter" | "outer" => Some(JoinType::Full),
                "leftsemi" | "semi" => Some(JoinType::LeftSemi),
                "leftanti" | "anti" => Some(JoinType::LeftAnti),
                _ => None,
            };
            if kind.is_none() {
                c.push(
                    "join.type",
                    format!(
                        "{text:?} is not a join type: use \"inner\", \"left\", \"right\", \"full\", \"left_semi\" or \"left_anti\" (Spark's \"leftOuter\" spellings too)"
                    ),
                );
            }
            kind
        }
    };
    let on = match c.required("join.on", raw.on) {
        None => None,
        Some(on) if on.is_empty() => {
            c.push(
                "join.on",
                "must name at least one column that both inputs have",
            );
            None
        }
        Some(on) => {
            let mut ok = true;
            for (i, column) in on.iter().enumerate() {
                if column.trim().is_empty() {
                    ok = false;
                    c.push(&format!("join.on[{i}]"), "must not be empty");
                } else if on[..i].contains(column) {
                    ok = false;
                    c.push(
                        &format!("join.on[{i}]"),
                        format!("column {column:?} is listed twice"),
                    );
                }
            }
            ok.then_some(on)
        }
    };
    let (left, left_stream) = left?;
    let (right, right_stream) = right?;
    let kind = kind?;
    if left == right {
        c.push(
            "join.right",
            format!("joins {left:?} with itself: a join has two inputs"),
        );
        return None;
    }
    match (left_stream, right_stream) {
        (true, true) => return stream_join(raw.condition, left, right, kind, on, sources, c),
        (false, false) => {
            c.push(
                "join",
                format!("{left} and {right} are both [[table]]s: a join needs a stream, a [[source]], on one side"),
            );
            return None;
        }
        _ => {}
    }
    let refused = match (kind, left_stream) {
        (JoinType::Inner, _)
        | (JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti, true)
        | (JoinType::Right, false) => None,
        (JoinType::Right, true) => Some(format!(
            "a right outer join with the stream ({left}) on the left is not supported, as in Spark: the table's unmatched rows would be emitted by every batch; put the stream on the right, or use \"left\""
        )),
        (JoinType::Full, _) => Some(
            "a full outer join of a stream with a static table is not supported, as in Spark: the table's unmatched rows would be emitted by every batch".to_owned(),
        ),
        (JoinType::Left | JoinType::LeftSemi | JoinType::LeftAnti, false) => Some(format!(
            "a {} join with the table ({left}) on the left is not supported, as in Spark: the table's unmatched rows would be emitted by every batch; put the stream on the left",
            kind.name()
        )),
    };
    if let Some(why) = refused {
        c.push("join.type", why);
        return None;
    }
    let stream = if left_stream { &left } else { &right };
    if source_names.len() > 1 {
        c.push(
            "join",
            format!(
                "a stream-static join reads one [[source]] ({stream}); this query has {}: union them in a query of their own",
                source_names.len()
            ),
        );
        return None;
    }
    let condition = match raw.condition {
        None => Some(None),
        Some(text) => match crate::sql::RowCondition::parse_join(&text, &left, &right) {
            Ok(cond) => Some(Some(cond)),
            Err(e) => {
                c.push("join.condition", format!("{text:?}: {e}"));
                None
            }
        },
    };
    Some(JoinSpec {
        left,
        right,
        kind,
        on: on?,
        condition: condition?,
    })
}

/// A `[join]` of two `[[source]]`s, and Spark's rules for it: two inputs, no left anti join, and
/// an outer or semi join only when the watermarks and the condition let the state of the side
/// whose unmatched rows are emitted be evicted (else they would never be).
#[allow(clippy::too_many_arguments, reason = "the parts of [join] read so far")]
fn stream_join(
    condition: Option<String>,
    left: String,
    right: String,
    kind: JoinType,
    on: Option<Vec<String>>,
    sources: Option<&[SourceSpec]>,
    c: &mut Collector,
) -> Option<JoinSpec> {
    let sources = sources.unwrap_or_default();
    if sources.len() != 2 {
        c.push(
            "join",
            format!(
                "a stream-stream join reads two [[source]]s ({left} and {right}); this query has {}: union the others in a query of their own",
                sources.len()
            ),
        );
        return None;
    }
    if kind == JoinType::LeftAnti {
        c.push(
            "join.type",
            "a left anti join of two streams is not supported, as in Spark: a row could only be emitted once no row of the other input can ever match it",
        );
        return None;
    }
    let condition = match condition {
        None => None,
        Some(text) => match crate::sql::RowCondition::parse_join(&text, &left, &right) {
            Ok(cond) => Some(cond),
            Err(e) => {
                c.push("join.condition", format!("{text:?}: {e}"));
                return None;
            }
        },
    };
    let spec = JoinSpec {
        left,
        right,
        kind,
        on: on?,
        condition,
    };
    let watermark_of = |name: &str| {
        sources
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.watermark.as_ref())
            .map(|w| w.column.clone())
    };
    let (lw, rw) = (watermark_of(&spec.left), watermark_of(&spec.right));
    let rules = crate::operator::join::eviction_rules(&spec, lw.as_deref(), rw.as_deref());
    let bounded = |this_is_left: bool| rules[usize::from(!this_is_left)].is_some();
    let needs: &[bool] = match kind {
        JoinType::Left | JoinType::LeftSemi => &[true],
        JoinType::Right => &[false],
        JoinType::Full => &[true, false],
        _ => &[],
    };
    for &this_is_left in needs {
        if !bounded(this_is_left) {
            let (this, other) = if this_is_left {
                (&spec.left, &spec.right)
            } else {
                (&spec.right, &spec.left)
            };
            c.push(
                "join.type",
                format!(
                    "a {} join of two streams needs what Spark needs to know when a row of {this} can no longer match: a watermark on both [[source]]s and a condition that bounds the event time of {this} by that of {other} (e.g. {this}.t BETWEEN {other}.t - INTERVAL 1 HOUR AND {other}.t), or a watermark column among `on`; without it the unmatched rows of {this} would never be emitted",
                    kind.name()
                ),
            );
        }
    }
    // Returned even when refused, so that its columns are checked too.
    Some(spec)
}

/// The join's output, when both inputs' schemas are known: the key and column checks, and the
/// condition planned against both.
fn join_schema(
    j: &JoinSpec,
    sources: &[SourceSpec],
    inputs: &[Option<arrow_schema::SchemaRef>],
    tables: &[Option<TableSpec>],
    c: &mut Collector,
) -> Option<arrow_schema::SchemaRef> {
    let schema_of = |name: &str| -> Option<arrow_schema::SchemaRef> {
        if let Some(i) = sources.iter().position(|s| s.name == name) {
            return inputs.get(i).cloned().flatten();
        }
        tables
            .iter()
            .flatten()
            .find(|t| t.name == name)
            .and_then(|t| match &t.kind {
                TableKind::Files { schema, .. } => schema.clone(),
                TableKind::Delta { .. } => None,
            })
    };
    // Each input's own watermark column, where the input reaches the join.
    for (i, s) in sources.iter().enumerate() {
        let (Some(w), Some(Some(schema))) = (&s.watermark, inputs.get(i)) else {
            continue;
        };
        let key = format!("source.{}.watermark.column", s.name);
        match schema.field_with_name(&w.column) {
            Err(_) => c.push(
                &key,
                format!(
                    "{:?} is not a column of {} where it reaches the join ({})",
                    w.column,
                    s.name,
                    schema
                        .fields()
                        .iter()
                        .map(|f| f.name().as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            Ok(f) if !matches!(f.data_type(), arrow_schema::DataType::Timestamp(_, _)) => c.push(
                &key,
                format!("{:?} is {}, not TIMESTAMP", w.column, f.data_type()),
            ),
            Ok(_) => {}
        }
    }
    let (left, right) = (schema_of(&j.left)?, schema_of(&j.right)?);
    let out = match crate::operator::join::output_schema(j, &left, &right) {
        Ok(out) => out,
        Err(e) => {
            c.push("join.on", e);
            return None;
        }
    };
    if let Some(condition) = &j.condition
        && let Err(e) = condition.plan_two(&left, &right)
    {
        c.push(
            "join.condition",
            format!("{:?}: {e}", condition.to_string()),
        );
    }
    Some(out)
}

/// `format` (json, csv, parquet) and its `csv` options, of a files source or table at `label`.
fn input_format(
    c: &mut Collector,
    label: &str,
    format: Option<&str>,
    csv: Option<RawCsv>,
) -> Option<InputFormat> {
    let key = |k: &str| format!("{label}.{k}");
    let format = match format {
        None => {
            c.push(
                &key("format"),
                "required key is missing: use \"json\", \"csv\" or \"parquet\"",
            );
            None
        }
        Some(f) => c.choice(
            &key("format"),
            f,
            "a file format",
            &[("json", "json"), ("csv", "csv"), ("parquet", "parquet")],
        ),
    };
    match (format, csv) {
        (Some(name @ ("json" | "parquet")), Some(_)) => {
            c.push(
                &key("csv"),
                format!("csv options apply only to format = \"csv\" (format is {name:?})"),
            );
            None
        }
        (Some("json"), None) => Some(InputFormat::Json),
        (Some("parquet"), None) => Some(InputFormat::Parquet),
        (Some(_), csv) => {
            let csv = csv.unwrap_or_default();
            let delimiter = match csv.delimiter.as_deref() {
                None => Some(b','),
                Some(d) => delimiter(c, &key("csv.delimiter"), d),
            };
            delimiter.map(|delimiter| InputFormat::Csv {
                // Spark's default: the first line is data unless `header = true`.
                header: csv.header.unwrap_or(false),
                delimiter,
            })
        }
        (None, _) => None,
    }
}

/// The `[[function]]` tables: each a plugin's scalar function with its SQL name and types.
fn functions(raw: Vec<RawFunction>, base: &Path, c: &mut Collector) -> Vec<Option<FunctionSpec>> {
    let mut seen: Vec<String> = Vec::new();
    raw.into_iter()
        .enumerate()
        .map(|(i, f)| {
            let spec = function(i, f, base, c)?;
            if seen.contains(&spec.name) {
                c.push(
                    &format!("function[{i}].name"),
                    format!("{:?} is declared twice", spec.name),
                );
                return None;
            }
            seen.push(spec.name.clone());
            Some(spec)
        })
        .collect()
}

fn listeners(raw: Vec<RawListener>, base: &Path, c: &mut Collector) -> Vec<Option<ListenerSpec>> {
    let mut seen: Vec<String> = Vec::new();
    raw.into_iter()
        .enumerate()
        .map(|(i, l)| {
            let spec = listener(i, l, base, c)?;
            if seen.contains(&spec.name) {
                c.push(
                    &format!("listener[{i}].name"),
                    format!("{:?} is named twice", spec.name),
                );
                return None;
            }
            seen.push(spec.name.clone());
            Some(spec)
        })
        .collect()
}

/// One `[[listener]]`: a plugin (with the keys of any plugin) or a webhook `url`.
fn listener(index: usize, l: RawListener, base: &Path, c: &mut Collector) -> Option<ListenerSpec> {
    let label = format!("listener[{index}]");
    let key = |k: &str| format!("{label}.{k}");
    let name = c.required(&key("name"), l.name);
    let kind = match (l.plugin, l.url) {
        (Some(_), Some(_)) => {
            c.push(
                &label,
                "has both `plugin` and `url`: a listener is a plugin or a webhook",
            );
            None
        }
        (None, None) => {
            c.push(
                &label,
                "needs `plugin` (a component of world `listener`) or `url` (a webhook)",
            );
            None
        }
        (Some(plugin), None) => transform_plugin(
            c,
            &label,
            RawPluginKeys {
                plugin: Some(plugin),
                config: l.config,
                limits: l.limits,
                sha256: l.sha256,
                capabilities: l.capabilities,
            },
            base,
        )
        .map(ListenerKind::Plugin),
        (None, Some(url)) => {
            for (k, present) in [
                ("config", l.config.is_some()),
                ("limits", l.limits.is_some()),
                ("sha256", l.sha256.is_some()),
                ("capabilities", l.capabilities.is_some()),
            ] {
                if present {
                    c.push(&key(k), "is a plugin's key: a webhook takes only `url`");
                }
            }
            match crate::query::webhook_target(&url) {
                Ok(_) => Some(ListenerKind::Webhook { url }),
                Err(e) => {
                    c.push(&key("url"), e);
                    None
                }
            }
        }
    };
    Some(ListenerSpec {
        name: name?,
        kind: kind?,
    })
}

/// One `[[function]]`.
fn function(index: usize, f: RawFunction, base: &Path, c: &mut Collector) -> Option<FunctionSpec> {
    let label = format!("function[{index}]");
    let key = |k: &str| format!("{label}.{k}");
    let name = c.required(&key("name"), f.name).and_then(|name| {
        let valid = name
            .chars()
            .next()
            .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
            && name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        if !valid {
            c.push(
                &key("name"),
                format!(
                    "{name:?} is not a SQL function name: use letters, digits and '_', not starting with a digit"
                ),
            );
            None
        } else if crate::sql::is_builtin_function(&name) {
            c.push(
                &key("name"),
                format!(
                    "{name:?} is a built-in SQL function (docs/sql.md): give the plugin's function another name"
                ),
            );
            None
        } else {
            Some(name.to_ascii_lowercase())
        }
    });
    let sql_type = |c: &mut Collector, path: &str, text: &str| match super::ddl::parse_schema(
        &format!("value {text}"),
    ) {
        Ok(schema) if schema.fields().len() == 1 => Some(schema.field(0).data_type().clone()),
        Ok(_) => {
            c.push(path, format!("{text:?} is not one type"));
            None
        }
        Err(err) => {
            c.push(path, format!("{text:?}: {err}"));
            None
        }
    };
    let arguments = c.required(&key("arguments"), f.arguments).and_then(|list| {
        let types: Vec<Option<arrow_schema::DataType>> = list
            .iter()
            .enumerate()
            .map(|(i, t)| sql_type(c, &format!("{label}.arguments[{i}]"), t))
            .collect();
        types.into_iter().collect::<Option<Vec<_>>>()
    });
    let returns = c
        .required(&key("returns"), f.returns)
        .and_then(|t| sql_type(c, &key("returns"), &t));
    let plugin = transform_plugin(
        c,
        &label,
        RawPluginKeys {
            plugin: f.plugin,
            config: f.config,
            limits: f.limits,
            sha256: f.sha256,
            capabilities: f.capabilities,
        },
        base,
    );
    Some(FunctionSpec {
        name: name?,
        arguments: arguments?,
        returns: returns?,
        plugin: plugin?,
    })
}

/// A pinned content hash: 64 hex digits, kept in lower case (the form
/// `weir` prints and checkpoints record).
fn sha256(c: &mut Collector, path: &str, raw: Option<String>) -> Option<Option<String>> {
    let Some(text) = raw else {
        return Some(None);
    };
    let hex = text.trim();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Some(Some(hex.to_ascii_lowercase()))
    } else {
        c.push(
            path,
            format!(
                "{text:?} is not a sha256: write the 64 hex digits of the plugin file's hash \
                 (`sha256sum plugin.wasm`)"
            ),
        );
        None
    }
}

/// `name`, or by default the plugin's file stem.
fn plugin_name(
    c: &mut Collector,
    path: &str,
    name: Option<String>,
    plugin: Option<&str>,
) -> Option<String> {
    match name {
        Some(name) if name.trim().is_empty() => {
            c.push(
                path,
                "must not be empty (leave it out to use the plugin's file name)",
            );
            None
        }
        Some(name) => Some(name),
        None => plugin
            .and_then(|p| Path::new(p).file_stem())
            .map(|stem| stem.to_string_lossy().into_owned()),
    }
}

/// A required `.wasm` path that exists, resolved against `base`.
fn plugin_path(
    c: &mut Collector,
    path: &str,
    plugin: Option<String>,
    base: &Path,
) -> Option<PathBuf> {
    let Some(plugin) = plugin else {
        c.push(
            path,
            "required key is missing: the path of a .wasm component",
        );
        return None;
    };
    if !plugin.ends_with(".wasm") {
        c.push(
            path,
            format!("{plugin:?} is not a Wasm component: the path must end in .wasm"),
        );
        return None;
    }
    let resolved = base.join(&plugin);
    match std::fs::metadata(&resolved) {
        Ok(meta) if meta.is_file() => Some(resolved),
        Ok(_) => {
            c.push(
                path,
                format!("{} is a folder, not a .wasm file", resolved.display()),
            );
            None
        }
        Err(err) => {
            let why = if err.kind() == std::io::ErrorKind::NotFound {
                "no such file".to_string()
            } else {
                format!("cannot read it: {err}")
            };
            c.push(path, format!("{why}: {}", resolved.display()));
            None
        }
    }
}

/// A granted host folder, which must exist when the query starts: WASI preopens it then.
fn existing_folder(c: &mut Collector, path: &str, folder: PathBuf) -> Option<PathBuf> {
    match std::fs::metadata(&folder) {
        Ok(meta) if meta.is_dir() => Some(folder),
        Ok(_) => {
            c.push(
                path,
                format!("{} is a file, not a folder", folder.display()),
            );
            None
        }
        Err(err) => {
            let why = if err.kind() == std::io::ErrorKind::NotFound {
                "no such folder (create it before the query starts)".to_string()
            } else {
                format!("cannot read it: {err}")
            };
            c.push(path, format!("{why}: {}", folder.display()));
            None
        }
    }
}

/// The plugin `config` table as JSON (`{}` when absent).
fn config(c: &mut Collector, path: &str, table: Option<Table>) -> Option<serde_json::Value> {
    let table = table.unwrap_or_default();
    to_json(c, path, Value::Table(table))
}

fn to_json(c: &mut Collector, path: &str, value: Value) -> Option<serde_json::Value> {
    Some(match value {
        Value::String(s) => serde_json::Value::String(s),
        Value::Integer(i) => serde_json::Value::from(i),
        Value::Float(f) => match serde_json::Number::from_f64(f) {
            Some(n) => serde_json::Value::Number(n),
            None => {
                c.push(
                    path,
                    format!("{f} cannot be handed to a plugin as JSON: use a finite number"),
                );
                return None;
            }
        },
        Value::Boolean(b) => serde_json::Value::Bool(b),
        Value::Datetime(d) => serde_json::Value::String(d.to_string()),
        Value::Array(items) => {
            let converted: Vec<Option<serde_json::Value>> = items
                .into_iter()
                .enumerate()
                .map(|(i, item)| to_json(c, &format!("{path}[{i}]"), item))
                .collect();
            serde_json::Value::Array(converted.into_iter().collect::<Option<Vec<_>>>()?)
        }
        Value::Table(table) => {
            let mut map = serde_json::Map::new();
            let mut ok = true;
            for (key, item) in table {
                match to_json(c, &format!("{path}.{key}"), item) {
                    Some(v) => {
                        map.insert(key, v);
                    }
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            serde_json::Value::Object(map)
        }
    })
}

fn limits(c: &mut Collector, path: &str, raw: Option<RawLimits>) -> Option<PluginLimits> {
    let defaults = PluginLimits::default();
    let Some(raw) = raw else {
        return Some(defaults);
    };
    let key = |k: &str| format!("{path}.{k}");
    let memory_bytes = match raw.memory {
        None => Some(defaults.memory_bytes),
        Some(Value::Integer(n)) => c.positive(&key("memory"), n),
        Some(Value::String(text)) => parse_byte_size(&text)
            .map_err(|err| c.push(&key("memory"), err))
            .ok(),
        Some(other) => {
            c.push(
                &key("memory"),
                format!(
                    "expected a size such as \"64 MiB\" or a number of bytes, found a {}",
                    other.type_str()
                ),
            );
            None
        }
    };
    let memory_bytes = memory_bytes.and_then(|bytes| match bytes {
        0 => {
            c.push(&key("memory"), "must be more than zero");
            None
        }
        b if b > MAX_WASM_MEMORY => {
            c.push(
                &key("memory"),
                format!(
                    "{} is more than a 32-bit Wasm memory can hold: use at most 4 GiB",
                    format_byte_size(b)
                ),
            );
            None
        }
        b => Some(b),
    });
    let timeout = match raw.timeout {
        None => Some(defaults.timeout),
        Some(text) => match parse_duration(&text) {
            Ok(d) if d.is_zero() => {
                c.push(&key("timeout"), "must be longer than zero");
                None
            }
            Ok(d) => Some(d),
            Err(err) => {
                c.push(&key("timeout"), err);
                None
            }
        },
    };
    let fuel = match raw.fuel {
        None => Some(None),
        Some(n) => c.positive(&key("fuel"), n).map(Some),
    };
    Some(PluginLimits {
        memory_bytes: memory_bytes?,
        timeout: timeout?,
        fuel: fuel?,
    })
}

fn sink(raw: Option<RawSink>, base: &Path, c: &mut Collector) -> Option<SinkSpec> {
    let Some(s) = raw else {
        c.push("sink", "required table [sink] is missing");
        return None;
    };
    match s {
        RawSink::NoKind => {
            c.push(
                "sink.kind",
                format!("required key is missing: use {}", quoted_list(&SINK_KINDS)),
            );
            None
        }
        RawSink::UnknownKind(other) => {
            c.push(
                "sink.kind",
                format!(
                    "{other:?} is not a sink kind: use {}",
                    quoted_list(&SINK_KINDS)
                ),
            );
            None
        }
        RawSink::Files(s) => {
            let path = c.path("sink.path", s.path, base);
            let format = match s.format.as_deref() {
                None => Some(OutputFormat::Parquet),
                Some(f) => c.choice(
                    "sink.format",
                    f,
                    "a files sink format",
                    &[
                        ("json", OutputFormat::Json),
                        ("csv", OutputFormat::Csv),
                        ("parquet", OutputFormat::Parquet),
                    ],
                ),
            };
            Some(SinkSpec::Files {
                path: path?,
                format: format?,
            })
        }
        RawSink::Console(s) => {
            let max_rows = match s.max_rows {
                None => Some(DEFAULT_CONSOLE_MAX_ROWS),
                Some(n) => c
                    .positive("sink.max_rows", n)
                    .and_then(|n| usize::try_from(n).ok()),
            };
            Some(SinkSpec::Console {
                max_rows: max_rows?,
            })
        }
        RawSink::Memory(_) => Some(SinkSpec::Memory),
        RawSink::Kafka(s) => kafka::sink(s, c),
        RawSink::Delta(s) => delta_sink(c, s, base),
        RawSink::DeltaMerge(s) => merge::table(c, "sink", s, base).map(SinkSpec::DeltaMerge),
        RawSink::Plugin(s) => plugin_sink(c, s, base),
    }
}

/// A `kind = "plugin"` sink: a Wasm foreachBatch sink.
fn plugin_sink(c: &mut Collector, s: RawPluginSink, base: &Path) -> Option<SinkSpec> {
    let name = plugin_name(c, "sink.name", s.name, s.plugin.as_deref());
    let plugin = plugin_path(c, "sink.plugin", s.plugin, base);
    let config = config(c, "sink.config", s.config);
    let limits = limits(c, "sink.limits", s.limits);
    let capabilities = capabilities(c, "sink.capabilities", s.capabilities, base);
    let sha256 = sha256(c, "sink.sha256", s.sha256);
    Some(SinkSpec::Plugin(PluginSinkSpec {
        name: name?,
        plugin: plugin?,
        config: config?,
        limits: limits?,
        capabilities: capabilities?,
        sha256: sha256?,
    }))
}

/// A `kind = "delta"` sink.
fn delta_sink(c: &mut Collector, s: RawDeltaSink, base: &Path) -> Option<SinkSpec> {
    let path = c.path("sink.path", s.path, base);
    let partition_by = s.partition_by.unwrap_or_default();
    let mut columns_ok = true;
    for (i, column) in partition_by.iter().enumerate() {
        if column.trim().is_empty() {
            columns_ok = false;
            c.push(&format!("sink.partition_by[{i}]"), "must not be empty");
        } else if partition_by[..i].contains(column) {
            columns_ok = false;
            c.push(
                &format!("sink.partition_by[{i}]"),
                format!("column {column:?} is listed twice"),
            );
        }
    }
    let target_file_size = file_size(c, "sink.target_file_size", s.target_file_size);
    let commit_every = match s.commit_every {
        None => std::num::NonZeroU64::new(1).map(CommitEvery::Batches),
        Some(Value::Integer(n)) => c
            .positive("sink.commit_every", n)
            .and_then(std::num::NonZeroU64::new)
            .map(CommitEvery::Batches),
        Some(Value::String(text)) => match parse_duration(&text) {
            Ok(d) if d.is_zero() => {
                c.push(
                    "sink.commit_every",
                    "must be longer than zero (or 1 for a commit per batch)",
                );
                None
            }
            Ok(d) => Some(CommitEvery::Interval(d)),
            Err(err) => {
                c.push(
                    "sink.commit_every",
                    format!("{err}; or an integer number of batches"),
                );
                None
            }
        },
        Some(other) => {
            c.push(
                "sink.commit_every",
                format!(
                    "expected a number of batches or a duration such as \"30s\", found a {}",
                    other.type_str()
                ),
            );
            None
        }
    };
    if !columns_ok {
        return None;
    }
    Some(SinkSpec::Delta(DeltaSinkSpec {
        path: path?,
        partition_by,
        target_file_size: target_file_size?,
        commit_every: commit_every?,
    }))
}

/// `target_file_size` of a Delta writer: a size such as "128 MiB" or a number of bytes.
pub(super) fn file_size(c: &mut Collector, path: &str, value: Option<Value>) -> Option<u64> {
    size_or(c, path, value, DEFAULT_DELTA_TARGET_FILE_SIZE)
}

/// A size such as "128 MiB" or a number of bytes, more than zero; `default` when absent.
fn size_or(c: &mut Collector, path: &str, value: Option<Value>, default: u64) -> Option<u64> {
    match value {
        None => Some(default),
        Some(Value::Integer(n)) => c.positive(path, n),
        Some(Value::String(text)) => match parse_byte_size(&text) {
            Ok(0) => {
                c.push(path, "must be more than zero");
                None
            }
            Ok(n) => Some(n),
            Err(err) => {
                c.push(path, err);
                None
            }
        },
        Some(other) => {
            c.push(
                path,
                format!(
                    "expected a size such as \"128 MiB\" or a number of bytes, found a {}",
                    other.type_str()
                ),
            );
            None
        }
    }
}

fn capabilities(
    c: &mut Collector,
    path: &str,
    raw: Option<RawCapabilities>,
    base: &Path,
) -> Option<Capabilities> {
    let raw = raw.unwrap_or_default();
    let dirs = raw.dirs.unwrap_or_default();
    let merges = raw.delta_merge.unwrap_or_default();
    let mut grants = Vec::new();
    let mut ok = true;
    let mut guests: HashMap<String, usize> = HashMap::new();
    for (i, dir) in dirs.into_iter().enumerate() {
        let label = format!("{path}.dirs[{i}]");
        let host_key = format!("{label}.host");
        let host = c
            .path(&host_key, dir.host, base)
            .and_then(|host| existing_folder(c, &host_key, host));
        let guest_path = format!("{label}.guest");
        let guest = c.required(&guest_path, dir.guest).and_then(|guest| {
            if !guest.starts_with('/') {
                c.push(
                    &guest_path,
                    format!(
                        "{guest:?} is not an absolute guest path: write it as \"/{}\"",
                        guest.trim_start_matches("./")
                    ),
                );
                None
            } else if let Some(first) = guests.get(&guest) {
                c.push(
                    &guest_path,
                    format!("{guest:?} is granted twice (also dirs[{first}])"),
                );
                None
            } else {
                guests.insert(guest.clone(), i);
                Some(guest)
            }
        });
        match (host, guest) {
            (Some(host), Some(guest)) => grants.push(DirGrant {
                host,
                guest,
                writable: dir.writable.unwrap_or(false),
            }),
            _ => ok = false,
        }
    }
    let mut env: Vec<String> = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, name) in raw.env.unwrap_or_default().into_iter().enumerate() {
        let key = format!("{path}.env[{i}]");
        if name.is_empty() || name.contains(['=', '\0']) {
            c.push(
                &key,
                format!("{name:?} is not an environment variable name"),
            );
            ok = false;
        } else if let Some(first) = seen.get(&name) {
            c.push(
                &key,
                format!("{name:?} is granted twice (also env[{first}])"),
            );
            ok = false;
        } else {
            seen.insert(name.clone(), i);
            env.push(name);
        }
    }
    let mut http: Vec<HttpGrant> = Vec::new();
    for (i, entry) in raw.http.unwrap_or_default().into_iter().enumerate() {
        let key = format!("{path}.http[{i}]");
        match HttpGrant::parse(&entry) {
            Ok(grant) if http.contains(&grant) => {
                c.push(&key, format!("{entry:?} is granted twice"));
                ok = false;
            }
            Ok(grant) => http.push(grant),
            Err(err) => {
                c.push(&key, err);
                ok = false;
            }
        }
    }
    let mut delta_merge = std::collections::BTreeMap::new();
    for (name, table) in merges {
        let label = format!("{path}.delta_merge.{name}");
        if !is_valid_name(&name) {
            ok = false;
            c.push(
                &label,
                format!("{name:?} is not a table name: use letters, digits, '_', '.' and '-'"),
            );
            continue;
        }
        match merge::table(c, &label, table, base) {
            Some(spec) => {
                delta_merge.insert(name, spec);
            }
            None => ok = false,
        }
    }
    ok.then_some(Capabilities {
        dirs: grants,
        env,
        http,
        delta_merge,
    })
}
