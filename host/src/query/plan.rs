//! The query as a small plan of stages, made from the pipeline file: each input → its own
//! transforms → where the inputs meet (a union, a stream-static or a stream-stream join) → the
//! transforms of them all → the stateful operator (`[aggregate]`, with the projections its
//! expressions need around it, or `[deduplicate]`). Planning loads the plugins and checks every
//! schema; no state store is opened before the checkpoint's fingerprint is checked.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_schema::SchemaRef;

use super::plugins::PluginContext;
use super::stage::Transform;
use super::{MakeTransform, QueryError, fingerprint, millis_i64, reload};
use crate::checkpoint::Checkpoint;
use crate::operator::TransformError;
use crate::operator::aggregate::{AggregateConfig, AggregateOperator};
use crate::operator::dedup::{DedupConfig, DedupOperator};
use crate::operator::join::{
    JoinError, JoinInput, StaticJoin, StaticTable, StreamJoin, StreamJoinState,
};
use crate::operator::stateful::{StateSchema, StatefulOperator};
use crate::plugin::{PluginFile, PluginOptions, WasmTransform};
use crate::source::Source;
use crate::spec::{self, Pipeline, TransformKind};
use crate::sql::{PluginFunction, SqlTransform};
use crate::state::StateOptions;
use crate::watermark::Watermark;

/// The stages of a query, planned.
pub(super) struct Stages {
    pub transforms: Vec<Transform>,
    /// The source each transform applies to (`input`), or `None` for every one.
    pub transform_inputs: Vec<Option<usize>>,
    pub join: Option<StaticJoin>,
    pub stream_join: Option<StreamJoin>,
    /// Where the inputs meet: before `transforms[join_at]`.
    pub join_at: usize,
    /// With a stream-stream join, each source's own watermark.
    pub input_watermarks: Vec<Option<Watermark>>,
    /// The plugin files the query watches for new builds.
    pub watched: Vec<reload::Watched>,
    /// What the last transform hands on.
    pub schema: SchemaRef,
    /// The transforms that keep keyed state, by position and name.
    pub stateful_plugins: Vec<(usize, String)>,
    /// The pipeline with `[aggregate]` lowered to plain aggregates, when it had expressions.
    pub lowered_pipeline: Option<Pipeline>,
    /// What surrounds those aggregates after the operator (SQL).
    pub after_aggregate: Option<String>,
}

/// Plans the stages of `pipeline` over `sources`.
///
/// # Errors
/// A transform that does not plan or load, inputs that do not meet, a join that cannot be made.
pub(super) fn stages(
    pipeline: &Pipeline,
    sources: &[Box<dyn Source>],
    checkpoint: &Checkpoint,
    plugins_ctx: &PluginContext<'_>,
    functions: &[PluginFunction],
    extra_transforms: Vec<MakeTransform>,
    state: &StateOptions,
) -> Result<Stages, QueryError> {
    // The transforms of one input first, each on its input's schema; then
    // the inputs meet (a union: they must agree) and the rest apply to all.
    let mut input_schemas: Vec<SchemaRef> =
        sources.iter().map(|s| Arc::clone(s.schema())).collect();
    let mut schema: Option<SchemaRef> = None;
    // With a [join], the inputs meet in it, before the first transform of them all.
    let mut join: Option<StaticJoin> = None;
    let mut stream_join: Option<StreamJoin> = None;
    let mut join_at = pipeline.transforms.len();
    let mut transforms: Vec<Transform> = Vec::new();
    let mut transform_inputs: Vec<Option<usize>> = Vec::new();
    let mut watched = Vec::new();
    for (i, t) in pipeline.transforms.iter().enumerate() {
        let input = t
            .input
            .as_ref()
            .map(|name| {
                pipeline
                    .sources
                    .iter()
                    .position(|s| &s.name == name)
                    .ok_or_else(|| QueryError::Invalid {
                        query: pipeline.query.name.clone(),
                        message: format!("transform {} reads no source named {name:?}", t.name),
                    })
            })
            .transpose()?;
        let in_schema = match input {
            Some(j) => &mut input_schemas[j],
            None => {
                if schema.is_none() {
                    let (met, joined) = meet(pipeline, sources, &input_schemas, checkpoint, state)?;
                    schema = Some(met);
                    (join, stream_join) = joined;
                    join_at = i;
                }
                schema.as_mut().unwrap_or_else(|| unreachable!("set above"))
            }
        };
        let transform = match &t.kind {
            TransformKind::Sql { sql } => Transform::Sql(Box::new(
                SqlTransform::new(&t.name, sql, in_schema, functions)
                    .map_err(|e| QueryError::Transform(TransformError::Sql(e)))?,
            )),
            TransformKind::Wasm(w) => {
                let loaded = plugins_ctx.engine.load(&t.name, &w.plugin)?;
                loaded.check_pin(w.sha256.as_deref())?;
                watched.push(reload::Watched {
                    stage: reload::Stage::Transform(i),
                    file: PluginFile::new(&t.name, &w.plugin, &loaded.sha256),
                    pin: w.sha256.clone(),
                });
                Transform::Wasm(Box::new(WasmTransform::open(
                    plugins_ctx.engine,
                    loaded,
                    PluginOptions {
                        name: t.name.clone(),
                        config_json: w.config.to_string(),
                        sandbox: plugins_ctx.sandbox(&t.name, &w.limits, &w.capabilities)?,
                        failpoint: plugins_ctx.failpoint,
                        replay_key: plugins_ctx.replay_key.clone(),
                    },
                    Arc::clone(in_schema),
                )?))
            }
        };
        *in_schema = Arc::clone(transform.output_schema());
        transforms.push(transform);
        transform_inputs.push(input);
    }
    let mut schema = match schema {
        Some(s) => s,
        None => {
            let (met, joined) = meet(pipeline, sources, &input_schemas, checkpoint, state)?;
            (join, stream_join) = joined;
            met
        }
    };
    // A stream-stream join's inputs each have their own watermark, where they reach it.
    let input_watermarks: Vec<Option<Watermark>> = if stream_join.is_some() {
        pipeline
            .sources
            .iter()
            .zip(&input_schemas)
            .map(|(s, schema)| {
                s.watermark
                    .as_ref()
                    .map(|w| Watermark::new(&w.column, millis_i64(w.delay), schema))
                    .transpose()
            })
            .collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    // Stateful transforms in pipeline order: their rank names their state folder.
    let stateful_plugins: Vec<(usize, String)> = transforms
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_stateful())
        .map(|(i, t)| (i, t.name().to_owned()))
        .collect();
    for make in extra_transforms {
        let transform = make(&schema);
        schema = Arc::clone(transform.output_schema());
        transforms.push(Transform::Native(transform));
        transform_inputs.push(None);
    }

    // Expressions in [aggregate] run as projections around the operator (`sql::aggregate`).
    let mut lowered_pipeline = None;
    let mut after_aggregate = None;
    if let Some(a) = &pipeline.aggregate
        && crate::sql::needs_lowering(&a.group_by, &a.select)
    {
        let keep: Vec<&str> = a
            .window
            .iter()
            .map(|w| w.column.as_str())
            .chain(pipeline.watermark.iter().map(|w| w.column.as_str()))
            .collect();
        let plan_error = |error| {
            QueryError::Transform(TransformError::Sql(crate::sql::SqlError::Plan {
                transform: "[aggregate]".into(),
                error,
            }))
        };
        let lowered =
            crate::sql::lower_aggregate(&a.group_by, &a.select, &schema, &keep, a.window.is_some())
                .map_err(plan_error)?;
        let before =
            SqlTransform::new("[aggregate] arguments", &lowered.before, &schema, functions)
                .map_err(|e| QueryError::Transform(TransformError::Sql(e)))?;
        schema = Arc::clone(before.output_schema());
        transforms.push(Transform::Sql(Box::new(before)));
        transform_inputs.push(None);
        let mut p = pipeline.clone();
        p.aggregate = Some(spec::AggregateSpec {
            group_by: lowered.group_by,
            select: lowered.select,
            ..a.clone()
        });
        lowered_pipeline = Some(p);
        after_aggregate = Some(lowered.after);
    }
    Ok(Stages {
        transforms,
        transform_inputs,
        join,
        stream_join,
        join_at,
        input_watermarks,
        watched,
        schema,
        stateful_plugins,
        lowered_pipeline,
        after_aggregate,
    })
}

/// The joins where the inputs meet: a stream-static or a stream-stream one.
type Joins = (Option<StaticJoin>, Option<StreamJoin>);

/// Where the inputs meet: a join of the two inputs (after their own transforms), or the union of
/// the sources.
fn meet(
    pipeline: &Pipeline,
    sources: &[Box<dyn Source>],
    input_schemas: &[SchemaRef],
    checkpoint: &Checkpoint,
    state: &StateOptions,
) -> Result<(SchemaRef, Joins), QueryError> {
    let Some(spec) = &pipeline.join else {
        return Ok((
            union_schema(&pipeline.query.name, sources, input_schemas)?,
            (None, None),
        ));
    };
    let invalid = |message: String| QueryError::Invalid {
        query: pipeline.query.name.clone(),
        message,
    };
    let source_of = |name: &str| pipeline.sources.iter().position(|s| s.name == name);
    if let (Some(l), Some(r)) = (source_of(&spec.left), source_of(&spec.right)) {
        if input_schemas.len() != 2 {
            return Err(invalid(
                "a stream-stream join reads exactly two [[source]]s".to_owned(),
            ));
        }
        let input = |i: usize| JoinInput {
            schema: Arc::clone(&input_schemas[i]),
            watermark: pipeline.sources[i]
                .watermark
                .as_ref()
                .map(|w| w.column.clone()),
        };
        let join = StreamJoin::new(
            spec.clone(),
            &input(l),
            &input(r),
            &StreamJoinState {
                dir: &checkpoint.state_dir("join"),
                partitions: pipeline.query.state_partitions,
                options: state,
            },
        )?;
        return Ok((Arc::clone(join.output_schema()), (None, Some(join))));
    }
    let table = pipeline
        .tables
        .iter()
        .find(|t| t.name == spec.left || t.name == spec.right)
        .ok_or_else(|| {
            invalid(format!(
                "[join] names no [[table]] ({} and {})",
                spec.left, spec.right
            ))
        })?;
    let [stream] = input_schemas else {
        return Err(invalid(
            "a stream-static join reads exactly one [[source]]".to_owned(),
        ));
    };
    let join = StaticJoin::new(
        spec.clone(),
        StaticTable::open(table.clone()).map_err(JoinError::from)?,
        Arc::clone(stream),
    )?;
    Ok((Arc::clone(join.output_schema()), (Some(join), None)))
}

fn union_schema(
    query: &str,
    sources: &[Box<dyn Source>],
    schemas: &[SchemaRef],
) -> Result<SchemaRef, QueryError> {
    let first = &schemas[0];
    for (i, other) in schemas.iter().enumerate().skip(1) {
        if other != first {
            return Err(QueryError::Invalid {
                query: query.to_owned(),
                message: format!(
                    "sources {} and {} have different schemas ({} vs {}); the sources of a query are unioned and must produce the same columns",
                    sources[0].name(),
                    sources[i].name(),
                    schema_text(first),
                    schema_text(other),
                ),
            });
        }
    }
    Ok(Arc::clone(first))
}

fn schema_text(schema: &SchemaRef) -> String {
    schema
        .fields()
        .iter()
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The stateful operator of a pipeline, checked against its input schema
/// and Spark's rules for output modes, but not opened.
pub(super) struct PlannedStateful {
    config: StatefulConfig,
    pub state_schema: StateSchema,
}

enum StatefulConfig {
    Aggregate(AggregateConfig),
    Dedup(DedupConfig),
}

impl PlannedStateful {
    /// Keeps the state layout that the checkpoint's fingerprint `recorded`
    /// says the operator's state was written with (deduplication decides).
    pub(super) fn keep_recorded_layout(
        &mut self,
        recorded: &serde_json::Value,
        schema: &SchemaRef,
    ) -> Result<(), QueryError> {
        let StatefulConfig::Dedup(config) = &mut self.config else {
            return Ok(());
        };
        let Some(value) = fingerprint::recorded_dedup_value(recorded) else {
            return Ok(());
        };
        if let Some(state_schema) =
            crate::operator::dedup::keep_recorded_layout(config, &value, schema)?
        {
            self.state_schema = state_schema;
        }
        Ok(())
    }

    /// Opens the operator's state stores (creating them on a first start).
    pub(super) fn open(self, schema: &SchemaRef) -> Result<Box<dyn StatefulOperator>, QueryError> {
        Ok(match self.config {
            StatefulConfig::Aggregate(config) => Box::new(AggregateOperator::new(config, schema)?),
            StatefulConfig::Dedup(config) => Box::new(DedupOperator::new(config, schema)?),
        })
    }
}

/// The stateful operator of the pipeline, if any, checked against Spark's
/// rules for output modes; touches no file.
pub(super) fn plan_stateful(
    pipeline: &Pipeline,
    state_dir: PathBuf,
    schema: &SchemaRef,
    state: &StateOptions,
) -> Result<Option<PlannedStateful>, QueryError> {
    let query = &pipeline.query;
    let invalid = |message: String| QueryError::Invalid {
        query: query.name.clone(),
        message,
    };
    // The rules were checked by `Query::start`; the warnings are logged for the operator.
    for warning in spec::stateful_warnings(pipeline) {
        tracing::warn!(query = %query.name, "{warning}");
    }
    let delay_ms = pipeline.watermark.as_ref().map_or(0, |w| {
        i64::try_from(w.delay.as_millis()).unwrap_or(i64::MAX)
    });
    if let Some(a) = &pipeline.aggregate {
        let aggregates = a
            .select
            .iter()
            .enumerate()
            .map(|(i, text)| {
                crate::operator::aggregate::parse_agg_expr(text)
                    .map_err(|e| invalid(format!("aggregate.select[{i}]: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let config = AggregateConfig {
            window: a.window.clone(),
            group_by: a.group_by.clone(),
            aggregates,
            output_mode: query.output_mode,
            watermark_column: pipeline.watermark.as_ref().map(|w| w.column.clone()),
            num_partitions: query.state_partitions,
            state_dir,
            state: state.clone(),
        };
        let state_schema = crate::operator::aggregate::state_schema(&config, schema)?;
        return Ok(Some(PlannedStateful {
            config: StatefulConfig::Aggregate(config),
            state_schema,
        }));
    }
    if let Some(d) = &pipeline.deduplicate {
        let event_time = pipeline.watermark.as_ref().map(|w| w.column.clone());
        let config = DedupConfig {
            keys: d.keys.clone(),
            within_watermark: d.within_watermark,
            event_time,
            delay_ms,
            num_partitions: query.state_partitions,
            state_dir,
            state: state.clone(),
            one_entry_per_key: false,
        };
        let state_schema = crate::operator::dedup::state_schema(&config, schema)?;
        return Ok(Some(PlannedStateful {
            config: StatefulConfig::Dedup(config),
            state_schema,
        }));
    }
    Ok(None)
}
