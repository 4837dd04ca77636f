//! The `weir` command line: the only place that prints for people and
//! chooses exit codes. Everything it does is a thin layer over the library,
//! so that programs embedding the host get the same behaviour.
//!
//! Exit codes: 0 done, 1 the query failed, 2 the pipeline file or the
//! command line is invalid.

mod demo;
mod plugin;
mod plugin_new;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::{Parser, Subcommand, ValueEnum};

use crate::checkpoint::{CheckpointError, CheckpointReader};
use crate::failpoint::Failpoint;
use crate::query::{Query, QueryOptions, SystemClock};

/// Weir: micro-batch stream processing with WebAssembly plugins.
#[derive(Debug, Parser)]
#[command(name = "weir", version)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    /// Where compiled plugins are cached (default: $WEIR_CACHE_DIR, else
    /// $XDG_CACHE_HOME/weir/plugins, else ~/.cache/weir/plugins).
    #[arg(long, global = true)]
    cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the query of a pipeline file.
    Run {
        /// The pipeline file (TOML).
        file: PathBuf,
        /// Override a key of the file, e.g. `--set source.orders.path=/data`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Crash injection for recovery tests: PHASE@BATCH (the `failpoints`
        /// feature only: a shipped binary has no such flag).
        #[cfg(feature = "failpoints")]
        #[arg(long, hide = true)]
        failpoint: Option<Failpoint>,
        /// Before every batch, load a new build of any plugin whose file
        /// changed (SIGHUP does it once, for every plugin file).
        #[arg(long)]
        watch_plugins: bool,
        /// The operator's policy (TOML): the folders, variables, limits and
        /// networks a pipeline may use (see SECURITY.md).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Serve the query's Prometheus metrics at http://ADDR/metrics (port 0: any free port;
        /// the address is printed).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
    },
    /// Host many tenants' queries behind an HTTP API (see docs/serve.md).
    Serve {
        /// The API's address (port 0: any free port; the address is printed).
        #[arg(long, default_value = "127.0.0.1:7070")]
        listen: String,
        /// One folder per tenant: its plugins, its pipelines' paths, checkpoints and outputs.
        #[arg(long)]
        home: PathBuf,
        /// The tenants file: names, token digests and quotas.
        #[arg(long)]
        tenants: PathBuf,
        /// The largest plugin or pipeline a request may carry.
        #[arg(long, default_value = "64 MiB")]
        max_upload: crate::spec::ByteSize,
    },
    /// Work with plugin components.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Write the example plugins and sample data beside the pipelines of `examples/`, so that
    /// each runs as written.
    Examples {
        #[arg(long, default_value = "examples")]
        dir: PathBuf,
    },
    /// Check a pipeline file and print every problem at once.
    Validate {
        file: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        overrides: Vec<String>,
        /// Check it against the operator's policy too, as `weir run --policy` does.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Look into a query's checkpoint.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// Generate sample orders and run a pipeline with a Wasm transform and a
    /// Wasm foreachBatch sink on them (no server, no setup).
    Demo {
        /// Where to put the data, plugins, pipeline, checkpoint and output
        /// (default: a new temporary folder, kept and printed).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// How many files of orders to generate.
        #[arg(long, default_value_t = 5)]
        files: usize,
        /// Lines per file.
        #[arg(long, default_value_t = 2_000)]
        lines: usize,
    },
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Print a component's hash, Weir world, metadata, imports and exports.
    Inspect {
        file: PathBuf,
        /// Print JSON instead.
        #[arg(long)]
        json: bool,
    },
    /// Write a plugin project to start from (a transform, its test, a pipeline using it).
    New {
        /// The project's folder; its last part is the plugin's name.
        dir: PathBuf,
        /// rust, python or js.
        #[arg(long, default_value = "rust")]
        lang: String,
    },
    /// Build the plugin project in DIR (default: here) into DIR/<name>.wasm.
    Build {
        #[arg(default_value = ".")]
        dir: PathBuf,
    },
    /// Run a transform (stateful too, on a throw-away state store), a sink or a listener in
    /// the real host on batches of sample orders, and print what came out and what it cost
    /// (time, fuel, memory).
    Test {
        file: PathBuf,
        /// The plugin's config, as JSON.
        #[arg(long, default_value = "{}")]
        config: String,
        /// Rows per batch.
        #[arg(long, default_value_t = 1_000)]
        rows: usize,
        /// How many batches.
        #[arg(long, default_value_t = 3)]
        batches: usize,
        /// Grant a writable folder: HOST=GUEST (e.g. out=/out), as `capabilities.dirs` does.
        #[arg(long = "dir", value_name = "HOST=GUEST")]
        dirs: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
enum CheckpointCommand {
    /// Show the offsets, commits and last progress of a checkpoint.
    Inspect { dir: PathBuf },
}

/// Runs the command line of this process and returns its exit code.
pub fn main() -> ExitCode {
    crate::malloc::tune();
    main_from(std::env::args_os())
}

/// Runs the command line given by `args` (the first one is the program name).
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    init_logging(cli.log_format);
    let cache_dir = cli.cache_dir.or_else(default_cache_dir);
    match cli.command {
        Command::Run {
            file,
            overrides,
            #[cfg(feature = "failpoints")]
            failpoint,
            watch_plugins,
            policy,
            metrics,
        } => {
            #[cfg(not(feature = "failpoints"))]
            let failpoint = None;
            let policy = match policy.as_deref().map(crate::spec::load_policy).transpose() {
                Ok(policy) => policy.map(Arc::new),
                Err(e) => {
                    complain(&e.to_string());
                    return ExitCode::from(2);
                }
            };
            let options = RunOptions {
                cache_dir,
                failpoint,
                watch_plugins,
                policy,
                metrics,
            };
            run(&file, &overrides, options)
        }
        Command::Serve {
            listen,
            home,
            tenants,
            max_upload,
        } => {
            let options = crate::serve::ServeOptions {
                listen,
                tenants,
                host: crate::serve::HostOptions {
                    home,
                    cache_dir,
                    max_upload_bytes: max_upload.0,
                },
            };
            let bound = |addr| say(&format!("weir serve: listening on http://{addr}"));
            match crate::serve::serve(&options, stop_flag(), bound) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    complain(&e.to_string());
                    ExitCode::from(1)
                }
            }
        }
        Command::Validate {
            file,
            overrides,
            policy,
        } => match validate(&file, &overrides, policy.as_deref(), cache_dir.as_deref()) {
            Ok(p) => {
                let warnings = crate::spec::stateful_warnings(&p);
                for warning in &warnings {
                    warn(&format!("{}: {warning}", file.display()));
                }
                say(&format!(
                    "{}: ok (query {}, {} transform(s), {} warning(s))",
                    file.display(),
                    p.query.name,
                    p.transforms.len(),
                    warnings.len()
                ));
                ExitCode::SUCCESS
            }
            Err(e) => {
                complain(&e.to_string());
                ExitCode::from(2)
            }
        },
        Command::Checkpoint {
            command: CheckpointCommand::Inspect { dir },
        } => match inspect(&dir) {
            Ok(text) => {
                say(&text);
                ExitCode::SUCCESS
            }
            Err(e) => {
                complain(&format!("{}: {e}", dir.display()));
                ExitCode::from(1)
            }
        },
        Command::Demo { dir, files, lines } => demo::run(dir, files, lines, cache_dir),
        Command::Plugin {
            command: PluginCommand::Inspect { file, json },
        } => plugin::inspect(&file, json),
        Command::Plugin {
            command: PluginCommand::New { dir, lang },
        } => plugin_new::new(&lang, &dir),
        Command::Plugin {
            command: PluginCommand::Build { dir },
        } => plugin_new::build(&dir),
        Command::Plugin {
            command:
                PluginCommand::Test {
                    file,
                    config,
                    rows,
                    batches,
                    dirs,
                },
        } => plugin::test(
            &file,
            plugin::TestOptions {
                config,
                rows,
                batches,
                dirs,
                cache_dir,
            },
        ),
        Command::Examples { dir } => match crate::examples::write_examples(&dir) {
            Ok(orders) => {
                say(&format!(
                    "{}: the example plugins in plugins/, {} order lines in data/orders, the customers in data/customers, clicks in data/clicks\n\
                     run any pipeline there, e.g. weir run {}/orders_sql.toml --set query.trigger=available-now",
                    dir.display(),
                    orders.lines,
                    dir.display()
                ));
                ExitCode::SUCCESS
            }
            Err(e) => {
                complain(&format!("examples: {}: {e}", dir.display()));
                ExitCode::from(1)
            }
        },
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    match format {
        LogFormat::Text => builder.compact().init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("WEIR_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(dir).join("weir/plugins"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/weir/plugins"))
}

fn say(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}");
}

fn warn(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "warning: {text}");
}

fn complain(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "error: {text}");
}

/// Stops the query after the current batch on SIGINT or SIGTERM.
fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(signal, Arc::clone(&stop)) {
            tracing::warn!("cannot watch signal {signal}: {e}");
        }
    }
    stop
}

/// Loads new plugin builds before the next batch on SIGHUP.
fn reload_flag() -> Arc<AtomicBool> {
    let reload = Arc::new(AtomicBool::new(false));
    if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&reload)) {
        tracing::warn!("cannot watch SIGHUP, plugins are only reloaded with --watch-plugins: {e}");
    }
    reload
}

/// `weir validate`: the pipeline file's own problems, then those of its confinement (the
/// policy, the host's folders), all in one report as `weir run` would find them.
fn validate(
    file: &Path,
    overrides: &[String],
    policy: Option<&Path>,
    cache_dir: Option<&Path>,
) -> Result<crate::spec::Pipeline, crate::spec::SpecErrors> {
    let policy = policy.map(crate::spec::load_policy).transpose()?;
    let pipeline = crate::spec::load(file, overrides)?;
    let confinement = crate::spec::Confinement {
        policy: policy.as_ref(),
        cache_dir,
    };
    let problems = crate::spec::confinement_problems(&pipeline, confinement);
    if problems.is_empty() {
        Ok(pipeline)
    } else {
        Err(crate::spec::SpecErrors {
            origin: file.display().to_string(),
            problems,
        })
    }
}

/// How `weir run` (and the demo) runs a query.
pub(crate) struct RunOptions {
    pub cache_dir: Option<PathBuf>,
    pub failpoint: Option<Failpoint>,
    pub watch_plugins: bool,
    pub policy: Option<Arc<crate::spec::Policy>>,
    /// `--metrics ADDR`.
    pub metrics: Option<String>,
}

pub(crate) fn run(file: &Path, overrides: &[String], run: RunOptions) -> ExitCode {
    let RunOptions {
        cache_dir,
        failpoint,
        watch_plugins,
        policy,
        metrics,
    } = run;
    // Without the `failpoints` feature `Failpoint` has no values: this is always `None`.
    #[cfg(not(feature = "failpoints"))]
    let _ = failpoint;
    let pipeline = match crate::spec::load(file, overrides) {
        Ok(p) => p,
        Err(e) => {
            complain(&e.to_string());
            return ExitCode::from(2);
        }
    };
    // Refused the way `weir validate --policy` refuses it: the same problems, exit code 2.
    let confinement = crate::spec::Confinement {
        policy: policy.as_deref(),
        cache_dir: cache_dir.as_deref(),
    };
    let problems = crate::spec::confinement_problems(&pipeline, confinement);
    if !problems.is_empty() {
        complain(
            &crate::spec::SpecErrors {
                origin: file.display().to_string(),
                problems,
            }
            .to_string(),
        );
        return ExitCode::from(2);
    }
    let on_progress = match metrics {
        None => None,
        Some(addr) => {
            let metrics = crate::progress::Metrics::new();
            match crate::serve::serve_metrics(&addr, Arc::clone(&metrics)) {
                Ok(bound) => say(&format!("weir run: metrics on http://{bound}/metrics")),
                Err(e) => {
                    complain(&e.to_string());
                    return ExitCode::from(2);
                }
            }
            let query = pipeline.query.name.clone();
            let hook: crate::query::ProgressHook =
                Arc::new(move |p, _| metrics.observe("", &query, p));
            Some(hook)
        }
    };
    let options = QueryOptions {
        cache_dir,
        on_progress,
        #[cfg(feature = "failpoints")]
        failpoint,
        stop: stop_flag(),
        clock: Arc::new(SystemClock),
        reload: reload_flag(),
        watch_plugins,
        policy,
        ..QueryOptions::default()
    };
    let name = pipeline.query.name.clone();
    let result = Query::start(pipeline, options).and_then(|mut q| q.run());
    match result {
        Ok(summary) => {
            tracing::info!(
                query = %name,
                batches = summary.batches,
                input_rows = summary.input_rows,
                output_rows = summary.output_rows,
                malformed_rows = summary.malformed_rows,
                "query stopped"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            complain(&format!("query {name}: {e}"));
            ExitCode::from(1)
        }
    }
}

/// A readable summary of a checkpoint, without taking its lock.
/// What `weir checkpoint inspect` prints: the query id and fingerprint, each log's extent and
/// latest entry, and the last progress record, all read through the checkpoint's own reader.
fn inspect(dir: &Path) -> Result<String, CheckpointError> {
    let reader = CheckpointReader::open(dir)?;
    let mut text = String::new();
    match reader.metadata() {
        Some(metadata) => {
            let json = serde_json::to_string(metadata).unwrap_or_default();
            text.push_str(&format!("metadata: {json}\n"));
        }
        None => text.push_str("metadata: none (the query never started)\n"),
    }
    for (name, log) in [("offsets", reader.offsets()), ("commits", reader.commits())] {
        let ids = log.ids()?;
        match (ids.first(), ids.last()) {
            (Some(first), Some(&last)) => {
                let entry: serde_json::Value = log.get(last)?.unwrap_or_default();
                text.push_str(&format!(
                    "{name}: {} entries ({first}..={last}); latest {last}: {entry}\n",
                    ids.len()
                ));
            }
            _ => text.push_str(&format!("{name}: none\n")),
        }
    }
    if let Some(last) = reader.progress()?.last() {
        text.push_str(&format!("last progress: {last}\n"));
    }
    Ok(text)
}
