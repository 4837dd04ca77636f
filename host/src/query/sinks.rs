//! The sink factory: the query's `[sink]` opened from the pipeline file, as sources are by
//! `source::open`. A plugin sink comes with the file the query watches for new builds.

use std::path::PathBuf;

use arrow_schema::SchemaRef;

use super::plugins::PluginContext;
use super::stage::QuerySink;
use super::{QueryError, QueryOptions, reload};
use crate::checkpoint::Checkpoint;
use crate::failpoint::Failpoint;
use crate::plugin::{PluginFile, PluginOptions, WasmSink};
use crate::sink::{self, ConsoleSink, FilesSink, PluginSink, SinkError};
use crate::spec::{self, OutputMode, Pipeline, SinkSpec};

/// What opening a sink needs besides the pipeline.
pub(super) struct SinkContext<'a> {
    pub plugins: &'a PluginContext<'a>,
    pub checkpoint: &'a Checkpoint,
    pub options: &'a mut QueryOptions,
    /// The query's threads, for sinks that write in parallel.
    pub threads: crate::threads::Threads,
}

/// Opens the sink of `pipeline` for rows of `schema`.
///
/// # Errors
/// When the sink cannot start (a plugin that does not load, a table that cannot be opened).
pub(super) fn open(
    pipeline: &Pipeline,
    schema: &SchemaRef,
    ctx: SinkContext<'_>,
) -> Result<(QuerySink, Option<reload::Watched>), QueryError> {
    let mut watched = None;
    let sink = match &pipeline.sink {
        SinkSpec::Plugin(p) => {
            let loaded = ctx.plugins.engine.load(&p.name, &p.plugin)?;
            loaded.check_pin(p.sha256.as_deref())?;
            watched = Some(reload::Watched {
                stage: reload::Stage::Sink,
                file: PluginFile::new(&p.name, &p.plugin, &loaded.sha256),
                pin: p.sha256.clone(),
            });
            let plugin = WasmSink::open(
                ctx.plugins.engine,
                loaded,
                PluginOptions {
                    name: p.name.clone(),
                    config_json: p.config.to_string(),
                    sandbox: ctx.plugins.sandbox(&p.name, &p.limits, &p.capabilities)?,
                    failpoint: ctx.options.failpoint(),
                    replay_key: ctx.plugins.replay_key.clone(),
                },
                schema,
            )?;
            QuerySink::wasm(Box::new(PluginSink::new(plugin)))
        }
        SinkSpec::Files { path, format } => QuerySink::native(Box::new(
            FilesSink::new(path.clone(), *format)?.with_threads(ctx.threads.clone()),
        )),
        SinkSpec::Console { max_rows } => QuerySink::native(Box::new(ConsoleSink::new(
            ctx.options
                .console
                .take()
                .unwrap_or_else(|| Box::new(std::io::stdout())),
            *max_rows,
        ))),
        SinkSpec::Memory => QuerySink::native(Box::new(
            ctx.options.memory_sink.clone().unwrap_or_default(),
        )),
        SinkSpec::Delta(d) => QuerySink::native(Box::new(delta_sink(
            d,
            &pipeline.query,
            ctx.checkpoint.sink_dir("delta").join("pending"),
            ctx.checkpoint.query_id(),
            ctx.options.failpoint(),
        )?)),
        SinkSpec::DeltaMerge(m) => QuerySink::native(Box::new(
            sink::delta_merge::DeltaMerge::new(sink::delta_merge::DeltaMergeOptions {
                table: m.clone(),
                app_id: ctx.checkpoint.query_id().to_owned(),
                failpoint: ctx.options.failpoint(),
            })
            .map_err(SinkError::from)?,
        )),
        SinkSpec::Kafka(k) => QuerySink::native(Box::new(
            sink::kafka::KafkaSink::new(
                k.clone(),
                schema,
                ctx.checkpoint.query_id(),
                ctx.options.failpoint(),
            )
            .map_err(SinkError::from)?,
        )),
    };
    Ok((sink, watched))
}

/// The Delta sink of the pipeline (its output mode and `commit_every` fit: `Query::start`
/// checked [`spec::sink_problems`]).
fn delta_sink(
    spec: &spec::DeltaSinkSpec,
    query: &spec::QuerySpec,
    pending_dir: PathBuf,
    query_id: &str,
    failpoint: Option<Failpoint>,
) -> Result<sink::delta::DeltaSink, QueryError> {
    use sink::delta::{DeltaSink, DeltaSinkOptions, WriteMode};
    let mode = match query.output_mode {
        OutputMode::Append => WriteMode::Append,
        OutputMode::Complete => WriteMode::Complete,
        // Refused by `spec::sink_problems` before any sink is opened; not reached.
        OutputMode::Update => {
            return Err(QueryError::Invalid {
                query: query.name.clone(),
                message: "a delta sink does not take output_mode \"update\"".into(),
            });
        }
    };
    let sink = DeltaSink::new(DeltaSinkOptions {
        spec: spec.clone(),
        query_id: query_id.to_owned(),
        mode,
        pending_dir,
        failpoint,
    })
    .map_err(SinkError::from)?;
    Ok(sink)
}
