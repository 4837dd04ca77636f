//! The tenants' queries and plugins in one `weir serve` process: what exists, what runs, and
//! what survives a restart.
//!
//! Why each query has its own thread: a batch loop is synchronous (sources, plugins, state and
//! sinks block), and one tenant's slow batch must never hold up another's or the API, which runs
//! on tokio apart from all of them. A query's thread is the `weir run` loop itself
//! ([`Query::start`] and [`Query::run`]), given the tenant's confinement as its policy, so a
//! hosted query obeys exactly the rules `weir run --policy` enforces, and a panic in it fails
//! that query only.
//!
//! What survives a restart: each query's pipeline as the tenant sent it, and whether the tenant
//! stopped it, under `--home`'s `.weir/` (never inside a tenant's folder, which its pipelines
//! may write). A restarted server starts every query that was not stopped, each from its
//! checkpoint, so its sink receives exactly what an uninterrupted server would have written.

use std::collections::{BTreeMap, VecDeque};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::tenants::{Tenant, Tenants, valid_name};
use crate::progress::{Metrics, QueryProgress};
use crate::query::{Query, QueryOptions, ReloadOutcome};
use crate::spec::{self, Pipeline, Policy, Problem, SinkSpec, SpecErrors};

/// Progress records kept in memory per query (older ones are read from its checkpoint).
const RECENT: usize = 256;
/// How long a plugin upload waits for each running query to take the new build.
const RELOAD_WAIT: Duration = Duration::from_secs(30);
/// How long a stop waits for the current batch to end before answering.
const STOP_WAIT: Duration = Duration::from_secs(60);
/// The first wait before a failed query starts again; it doubles with each failure in a row.
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
/// The longest wait before a failed query starts again.
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// The nice value of a query's thread (see [`lower_priority`]).
const QUERY_NICE: i32 = 2;
/// The nice value of a query started again after failing.
const FAILING_NICE: i32 = 15;
/// How often the supervisor looks for failed queries to start again.
const SUPERVISE_EVERY: Duration = Duration::from_millis(200);
/// The folder of uploaded plugins inside a tenant's folder.
pub const PLUGINS: &str = "plugins";
/// What `--home` keeps for the server itself.
const SERVER_DIR: &str = ".weir";

/// A request that cannot be done, with what HTTP makes of it.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("{0}")]
    Invalid(SpecErrors),
    #[error("{message}")]
    BadRequest { message: String },
    #[error("over the quota {quota}: {message}")]
    Quota {
        quota: &'static str,
        message: String,
    },
    #[error("{message}")]
    Conflict { message: String },
    #[error("query {query} failed {failures} time(s) in a row: it starts again by itself in {}s (or after a PUT of a new pipeline)", retry_after.as_secs().max(1))]
    Backoff {
        query: String,
        failures: u32,
        retry_after: Duration,
    },
    #[error("plugin {plugin}: the new build was refused by every query that uses it, the previous build keeps running: {}", reasons.join("; "))]
    Refused {
        plugin: String,
        reasons: Vec<String>,
    },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ServeError {
    let path = path.to_path_buf();
    move |source| ServeError::Io {
        action,
        path,
        source,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a query stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Running,
    /// Asked to stop; its current batch is finishing.
    Stopping,
    Stopped,
    Failed(String),
}

impl Status {
    pub fn word(&self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Failed(_) => "failed",
        }
    }
}

/// Process-wide settings of the host.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// `--home`: one folder per tenant, and the server's own `.weir/`.
    pub home: PathBuf,
    /// The compiled-plugin cache.
    pub cache_dir: Option<PathBuf>,
    /// The largest plugin or pipeline a request may carry.
    pub max_upload_bytes: u64,
}

/// Every tenant's queries.
#[derive(Debug)]
pub struct Host {
    pub tenants: Tenants,
    spaces: BTreeMap<String, Arc<Space>>,
    cache_dir: Option<PathBuf>,
    pub max_upload_bytes: u64,
    pub metrics: Arc<Metrics>,
}

/// One tenant's folder, confinement and queries.
#[derive(Debug)]
struct Space {
    tenant: Tenant,
    /// `--home/<tenant>`, canonical: its pipelines' relative paths resolve here and no path of
    /// theirs may leave it.
    dir: PathBuf,
    /// `--home/.weir/<tenant>`: its saved pipelines.
    saved: PathBuf,
    policy: Arc<Policy>,
    queries: Mutex<BTreeMap<String, Arc<Hosted>>>,
    /// One plugin upload at a time per tenant.
    uploads: Mutex<()>,
    /// Failures in a row of each query that is failing, and when it may start again.
    backoff: Arc<Mutex<BTreeMap<String, Backoff>>>,
}

/// Why a failing query is not started again at once: a plugin that spins until its deadline or
/// grows to its memory limit in every batch would otherwise cost its limits again and again.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    retry_at: Instant,
}

/// One query of a tenant.
#[derive(Debug)]
pub struct Hosted {
    pub name: String,
    tenant: String,
    /// The pipeline as the tenant sent it.
    text: String,
    /// The sum of its plugins' `limits.memory`.
    memory_bytes: u64,
    /// The uploaded plugins (`plugin = "name"`) it uses.
    plugins: Vec<String>,
    checkpoint: PathBuf,
    run: Mutex<Run>,
    recent: Mutex<VecDeque<serde_json::Value>>,
    reloads: Mutex<Reloads>,
    reloaded: Condvar,
    /// Its failures in a row (0 once a batch commits).
    failures: AtomicU32,
}

#[derive(Debug)]
struct Run {
    status: Status,
    stop: Arc<AtomicBool>,
    reload: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The reloads a query did since it was created: how many, and what the last one did.
#[derive(Debug, Default)]
struct Reloads {
    done: u64,
    last: Vec<(bool, String)>,
}

/// A pipeline checked for a tenant, ready to run.
struct Prepared {
    pipeline: Pipeline,
    memory_bytes: u64,
    plugins: Vec<String>,
}

impl Host {
    /// Opens `--home`, creating each tenant's folder, and starts every saved query that was not
    /// stopped.
    ///
    /// # Errors
    /// When `--home` or a tenant's folder cannot be created.
    pub fn open(
        tenants: Tenants,
        options: &HostOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, ServeError> {
        std::fs::create_dir_all(&options.home).map_err(io("create", &options.home))?;
        let home = std::fs::canonicalize(&options.home).map_err(io("open", &options.home))?;
        let mut spaces = BTreeMap::new();
        for tenant in &tenants.tenants {
            let dir = home.join(&tenant.name);
            std::fs::create_dir_all(dir.join(PLUGINS)).map_err(io("create", &dir))?;
            let dir = std::fs::canonicalize(&dir).map_err(io("open", &dir))?;
            let saved = home.join(SERVER_DIR).join(&tenant.name);
            std::fs::create_dir_all(&saved).map_err(io("create", &saved))?;
            let policy = Policy {
                origin: format!("tenant {}", tenant.name),
                roots: Some(vec![dir.clone()]),
                env: Some(Vec::new()),
                max_memory: None,
                max_timeout: Some(tenant.max_timeout),
                max_fuel: tenant.max_fuel,
                private_networks: false,
                webhooks: tenant.webhooks,
            };
            spaces.insert(
                tenant.name.clone(),
                Arc::new(Space {
                    tenant: tenant.clone(),
                    dir,
                    saved,
                    policy: Arc::new(policy),
                    queries: Mutex::default(),
                    uploads: Mutex::default(),
                    backoff: Arc::default(),
                }),
            );
        }
        let host = Arc::new(Self {
            tenants,
            spaces,
            cache_dir: options.cache_dir.clone(),
            max_upload_bytes: options.max_upload_bytes,
            metrics,
        });
        for space in host.spaces.values() {
            host.resume(space)?;
        }
        let weak = Arc::downgrade(&host);
        std::thread::Builder::new()
            .name("weir-supervisor".into())
            .spawn(move || {
                while let Some(host) = weak.upgrade() {
                    host.restart_failed();
                    drop(host);
                    std::thread::sleep(SUPERVISE_EVERY);
                }
            })
            .map_err(io("start the supervisor thread", &options.home))?;
        Ok(host)
    }

    fn space(&self, tenant: &str) -> Result<&Arc<Space>, ServeError> {
        self.spaces.get(tenant).ok_or_else(|| ServeError::NotFound {
            what: format!("tenant {tenant}"),
        })
    }

    /// Loads the tenant's saved queries; starts those that were not stopped.
    fn resume(&self, space: &Arc<Space>) -> Result<(), ServeError> {
        let entries = std::fs::read_dir(&space.saved).map_err(io("list", &space.saved))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".toml").map(str::to_owned)
            })
            .filter(|n| valid_name(n))
            .collect();
        names.sort();
        for name in names {
            let file = space.saved.join(format!("{name}.toml"));
            let text = std::fs::read_to_string(&file).map_err(io("read", &file))?;
            let stopped = space.saved.join(format!("{name}.stopped")).exists();
            let hosted = match self.prepare(space, &name, &text) {
                Ok(prepared) => {
                    let hosted = Hosted::new(&space.tenant.name, &name, text, &prepared);
                    if stopped {
                        lock(&hosted.run).status = Status::Stopped;
                    } else {
                        self.spawn(space, &hosted, prepared.pipeline);
                    }
                    hosted
                }
                // A pipeline that no longer passes (a plugin deleted, a quota lowered) is
                // listed as failed, with why.
                Err(e) => {
                    let hosted = Hosted::failed(&space.tenant.name, &name, text, e.to_string());
                    tracing::warn!(tenant = %space.tenant.name, query = %name, "not resumed: {e}");
                    hosted
                }
            };
            lock(&space.queries).insert(name, hosted);
        }
        Ok(())
    }

    /// Checks `text` as query `name` of the tenant: every problem of `weir validate`, a path
    /// that leaves the tenant's folder, a limit over its ceilings. `plugin = "NAME"` (no `/`, no
    /// `.wasm`) names an uploaded plugin.
    fn prepare(&self, space: &Space, name: &str, text: &str) -> Result<Prepared, ServeError> {
        let origin = format!("query {name}");
        let mut plugins = Vec::new();
        let text = match text.parse::<toml::Table>() {
            Ok(mut table) => {
                uploaded_plugins(&mut table, &mut plugins);
                toml::to_string(&table).map_err(|e| ServeError::BadRequest {
                    message: format!("{origin}: {e}"),
                })?
            }
            // `spec::parse` reports the syntax error with its line and column.
            Err(_) => text.to_owned(),
        };
        let mut pipeline =
            spec::parse(&text, &space.dir, &origin, &[]).map_err(ServeError::Invalid)?;
        let confinement = spec::Confinement {
            policy: Some(&space.policy),
            cache_dir: self.cache_dir.as_deref(),
        };
        let mut problems = spec::confinement_problems(&pipeline, confinement);
        // A query decodes on the threads the tenant may use: its ceiling, or fewer if asked.
        let max_threads = space.tenant.max_threads;
        match pipeline.query.threads {
            Some(n) if n > max_threads => problems.push(Problem::new(
                "query.threads",
                format!(
                    "{n} threads is over tenant {}'s max_threads of {max_threads}",
                    space.tenant.name
                ),
            )),
            Some(_) => {}
            None => pipeline.query.threads = Some(max_threads),
        }
        for plugin in &plugins {
            let path = space.dir.join(PLUGINS).join(format!("{plugin}.wasm"));
            if !path.is_file() {
                problems.push(Problem::new(
                    "plugin",
                    format!("{plugin}: no such plugin: upload it first (PUT /v1/plugins/{plugin})"),
                ));
            }
        }
        if !problems.is_empty() {
            return Err(ServeError::Invalid(SpecErrors { origin, problems }));
        }
        let memory_bytes = plugin_memory(&pipeline);
        Ok(Prepared {
            pipeline,
            memory_bytes,
            plugins,
        })
    }

    /// Whether `text` would be accepted as query `name`, with `weir validate`'s warnings.
    ///
    /// # Errors
    /// Every problem found.
    pub fn validate(
        &self,
        tenant: &str,
        name: &str,
        text: &str,
    ) -> Result<Vec<String>, ServeError> {
        check_name("query", name)?;
        let space = self.space(tenant)?;
        let prepared = self.prepare(space, name, text)?;
        Ok(spec::stateful_warnings(&prepared.pipeline))
    }

    /// Creates query `name` from `text` and starts it, or replaces a stopped or failed one.
    ///
    /// # Errors
    /// Every problem of the pipeline; a quota it would exceed; a running query of that name.
    pub fn create(&self, tenant: &str, name: &str, text: &str) -> Result<Arc<Hosted>, ServeError> {
        check_name("query", name)?;
        let space = self.space(tenant)?;
        let prepared = self.prepare(space, name, text)?;
        let mut queries = lock(&space.queries);
        if let Some(old) = queries.get(name) {
            let status = lock(&old.run).status.clone();
            if matches!(status, Status::Running | Status::Stopping) {
                return Err(ServeError::Conflict {
                    message: format!(
                        "query {name} is {}: stop it before replacing it",
                        status.word()
                    ),
                });
            }
        }
        let others = queries.iter().filter(|(n, _)| *n != name);
        let (count, memory) = others.fold((0usize, 0u64), |(c, m), (_, q)| {
            (c + 1, m.saturating_add(q.memory_bytes))
        });
        let tenant_quota = &space.tenant;
        if count + 1 > tenant_quota.max_queries {
            return Err(ServeError::Quota {
                quota: "max_queries",
                message: format!(
                    "tenant {} may have {} queries and has {count}",
                    tenant_quota.name, tenant_quota.max_queries
                ),
            });
        }
        let wanted = memory.saturating_add(prepared.memory_bytes);
        if wanted > tenant_quota.memory_bytes {
            return Err(ServeError::Quota {
                quota: "memory",
                message: format!(
                    "its plugins' memory limits come to {}, and with those of the tenant's other queries ({}) to {}, over the tenant's {}",
                    spec::format_byte_size(prepared.memory_bytes),
                    spec::format_byte_size(memory),
                    spec::format_byte_size(wanted),
                    spec::format_byte_size(tenant_quota.memory_bytes)
                ),
            });
        }
        let file = space.saved.join(format!("{name}.toml"));
        write_atomic(&file, text.as_bytes())?;
        remove_if_there(&space.saved.join(format!("{name}.stopped")))?;
        lock(&space.backoff).remove(name);
        let hosted = Hosted::new(&space.tenant.name, name, text.to_owned(), &prepared);
        self.spawn(space, &hosted, prepared.pipeline);
        queries.insert(name.to_owned(), Arc::clone(&hosted));
        Ok(hosted)
    }

    /// Starts the query's batch loop on its own thread.
    fn spawn(&self, space: &Space, hosted: &Arc<Hosted>, pipeline: Pipeline) {
        let stop = Arc::new(AtomicBool::new(false));
        let reload = Arc::new(AtomicBool::new(false));
        let on_progress = {
            let (hosted, metrics) = (Arc::clone(hosted), Arc::clone(&self.metrics));
            let backoff = Arc::clone(&space.backoff);
            Arc::new(move |p: &QueryProgress, json: &serde_json::Value| {
                // A batch that commits ends a run of failures (and of low priority, where the
                // host may raise it again).
                lock(&backoff).remove(&hosted.name);
                if hosted.failures.swap(0, Ordering::Relaxed) > 0 {
                    restore_priority();
                }
                metrics.observe(&hosted.tenant, &hosted.name, p);
                let mut recent = lock(&hosted.recent);
                if recent.len() == RECENT {
                    recent.pop_front();
                }
                recent.push_back(json.clone());
            })
        };
        let on_reload = {
            let hosted = Arc::clone(hosted);
            Arc::new(move |outcomes: &[ReloadOutcome]| {
                let mut reloads = lock(&hosted.reloads);
                reloads.done += 1;
                reloads.last = outcomes
                    .iter()
                    .map(|o| match o {
                        ReloadOutcome::Replaced {
                            plugin,
                            from_sha256,
                            to_sha256,
                        } => (true, format!("{plugin}: build {from_sha256} → {to_sha256}")),
                        ReloadOutcome::Refused(e) => (false, e.to_string()),
                    })
                    .collect();
                hosted.reloaded.notify_all();
            })
        };
        let (cache_dir, policy) = (self.cache_dir.clone(), Arc::clone(&space.policy));
        let (thread_stop, thread_reload) = (Arc::clone(&stop), Arc::clone(&reload));
        let mut run = lock(&hosted.run);
        *run = Run {
            status: Status::Running,
            stop,
            reload,
            thread: None,
        };
        let thread_hosted = Arc::clone(hosted);
        let thread_backoff = Arc::clone(&space.backoff);
        let spawned = std::thread::Builder::new()
            .name(format!("{}/{}", hosted.tenant, hosted.name))
            .spawn(move || {
                let hosted = thread_hosted;
                let nice = if hosted.failures.load(Ordering::Relaxed) > 0 {
                    FAILING_NICE
                } else {
                    QUERY_NICE
                };
                lower_priority(&hosted, nice);
                let options = QueryOptions {
                    cache_dir,
                    stop: thread_stop,
                    reload: thread_reload,
                    policy: Some(policy),
                    on_progress: Some(on_progress),
                    on_reload: Some(on_reload),
                    ..QueryOptions::default()
                };
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    Query::start(pipeline, options).and_then(|mut q| q.run())
                }));
                let status = match result {
                    Ok(Ok(_)) => Status::Stopped,
                    Ok(Err(e)) => Status::Failed(e.to_string()),
                    Err(panic) => Status::Failed(format!(
                        "the query's thread panicked: {}",
                        panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                            .unwrap_or("(no message)")
                    )),
                };
                match &status {
                    Status::Failed(e) => {
                        let mut backoff = lock(&thread_backoff);
                        let failures = backoff.get(&hosted.name).map_or(0, |b| b.failures) + 1;
                        let wait = BACKOFF_FIRST
                            .saturating_mul(1 << (failures - 1).min(16))
                            .min(BACKOFF_MAX);
                        backoff.insert(
                            hosted.name.clone(),
                            Backoff {
                                failures,
                                retry_at: Instant::now() + wait,
                            },
                        );
                        hosted.failures.store(failures, Ordering::Relaxed);
                        tracing::warn!(tenant = %hosted.tenant, query = %hosted.name, "query failed ({failures} in a row, starting again in {wait:?}): {e}");
                    }
                    _ => {
                        tracing::info!(tenant = %hosted.tenant, query = %hosted.name, "query stopped");
                    }
                }
                lock(&hosted.run).status = status;
                // Wakes an upload waiting for this query to reload: it never will now.
                hosted.reloaded.notify_all();
            });
        match spawned {
            Ok(handle) => run.thread = Some(handle),
            Err(e) => run.status = Status::Failed(format!("cannot start its thread: {e}")),
        }
    }

    /// The tenant's queries, by name.
    pub fn queries(&self, tenant: &str) -> Result<Vec<Arc<Hosted>>, ServeError> {
        Ok(lock(&self.space(tenant)?.queries)
            .values()
            .cloned()
            .collect())
    }

    /// One of the tenant's queries.
    ///
    /// # Errors
    /// [`ServeError::NotFound`] when it has none of that name.
    pub fn query(&self, tenant: &str, name: &str) -> Result<Arc<Hosted>, ServeError> {
        lock(&self.space(tenant)?.queries)
            .get(name)
            .cloned()
            .ok_or_else(|| ServeError::NotFound {
                what: format!("query {name}"),
            })
    }

    /// Starts again every failed query whose backoff has passed, unless its tenant stopped it.
    fn restart_failed(&self) {
        let now = Instant::now();
        for space in self.spaces.values() {
            let due: Vec<String> = lock(&space.backoff)
                .iter()
                .filter(|(_, b)| b.retry_at <= now)
                .map(|(name, _)| name.clone())
                .collect();
            for name in due {
                let failed = lock(&space.queries)
                    .get(&name)
                    .is_some_and(|q| matches!(q.status(), Status::Failed(_)));
                let stopped = space.saved.join(format!("{name}.stopped")).exists();
                if !failed || stopped {
                    continue;
                }
                match self.start(&space.tenant.name, &name) {
                    Ok(_) => {
                        tracing::info!(tenant = %space.tenant.name, query = %name, "started again after its backoff")
                    }
                    Err(e) => {
                        tracing::warn!(tenant = %space.tenant.name, query = %name, "cannot start again: {e}")
                    }
                }
            }
        }
    }

    /// Stops the query after its current batch and waits (a while) for it; it stays stopped
    /// across restarts until started.
    ///
    /// # Errors
    /// When it does not exist or its marker cannot be written.
    pub fn stop(&self, tenant: &str, name: &str) -> Result<Status, ServeError> {
        let space = self.space(tenant)?;
        let hosted = self.query(tenant, name)?;
        write_atomic(&space.saved.join(format!("{name}.stopped")), b"")?;
        Ok(hosted.stop_and_wait(STOP_WAIT))
    }

    /// Starts a stopped or failed query again, from its checkpoint.
    ///
    /// # Errors
    /// When it does not exist, is running, or no longer passes its checks.
    pub fn start(&self, tenant: &str, name: &str) -> Result<Arc<Hosted>, ServeError> {
        let space = self.space(tenant)?;
        let hosted = self.query(tenant, name)?;
        let status = hosted.status();
        if matches!(status, Status::Running | Status::Stopping) {
            return Err(ServeError::Conflict {
                message: format!("query {name} is {}", status.word()),
            });
        }
        if let Some(b) = lock(&space.backoff).get(name)
            && b.retry_at > Instant::now()
        {
            return Err(ServeError::Backoff {
                query: name.to_owned(),
                failures: b.failures,
                retry_after: b.retry_at - Instant::now(),
            });
        }
        // Its thread has ended (stopped or failed): join it before starting another.
        if let Some(thread) = lock(&hosted.run).thread.take() {
            let _ = thread.join();
        }
        // Checked again: a plugin may have gone, the tenant's ceilings may have changed.
        let prepared = self.prepare(space, name, &hosted.text)?;
        remove_if_there(&space.saved.join(format!("{name}.stopped")))?;
        let fresh = Hosted::new(&space.tenant.name, name, hosted.text.clone(), &prepared);
        *lock(&fresh.recent) = lock(&hosted.recent).clone();
        fresh
            .failures
            .store(hosted.failures.load(Ordering::Relaxed), Ordering::Relaxed);
        self.spawn(space, &fresh, prepared.pipeline);
        lock(&space.queries).insert(name.to_owned(), Arc::clone(&fresh));
        Ok(fresh)
    }

    /// Stops the query and removes it with its checkpoint.
    ///
    /// # Errors
    /// When it does not exist, does not stop in time, or its files cannot be removed.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<(), ServeError> {
        let space = self.space(tenant)?;
        let hosted = self.query(tenant, name)?;
        let status = hosted.stop_and_wait(STOP_WAIT);
        if status == Status::Stopping {
            return Err(ServeError::Conflict {
                message: format!("query {name} is still finishing its batch: try again"),
            });
        }
        if !hosted.checkpoint.as_os_str().is_empty() && hosted.checkpoint.exists() {
            std::fs::remove_dir_all(&hosted.checkpoint)
                .map_err(io("remove", &hosted.checkpoint))?;
        }
        remove_if_there(&space.saved.join(format!("{name}.toml")))?;
        remove_if_there(&space.saved.join(format!("{name}.stopped")))?;
        lock(&space.queries).remove(name);
        lock(&space.backoff).remove(name);
        self.metrics.forget(tenant, name);
        Ok(())
    }

    /// Stores a plugin; running queries that use it load the new build before their next batch.
    /// When every one of them refuses it, the previous build is put back and the upload refused.
    ///
    /// # Errors
    /// A bad name, bytes that are not a component, a build every user refused.
    pub fn put_plugin(
        &self,
        tenant: &str,
        name: &str,
        bytes: &[u8],
    ) -> Result<serde_json::Value, ServeError> {
        check_name("plugin", name)?;
        let space = self.space(tenant)?;
        // A component's preamble: `\0asm`, then version 0x0d and layer 1 (a core module has
        // layer 0); everything else is checked by the queries that load it.
        if bytes.get(..8) != Some(&[0, b'a', b's', b'm', 0x0d, 0, 1, 0][..]) {
            return Err(ServeError::BadRequest {
                message: format!(
                    "plugin {name}: not a WebAssembly component (build it for wasm32-wasip2, or adapt a core module with `wasm-tools component new`)"
                ),
            });
        }
        let _one_at_a_time = lock(&space.uploads);
        let path = space.dir.join(PLUGINS).join(format!("{name}.wasm"));
        let previous = std::fs::read(&path).ok();
        write_atomic(&path, bytes)?;
        let sha256 = hex::encode(Sha256::digest(bytes));
        let users: Vec<Arc<Hosted>> = lock(&space.queries)
            .values()
            .filter(|q| q.plugins.iter().any(|p| p == name) && q.status() == Status::Running)
            .cloned()
            .collect();
        let mut answers = Vec::new();
        let (mut replaced, mut refused) = (0, Vec::new());
        for q in users {
            let (state, details) = q.reload_and_wait(RELOAD_WAIT);
            match state {
                "replaced" => replaced += 1,
                "refused" => refused.extend(details.iter().cloned()),
                _ => {}
            }
            answers
                .push(serde_json::json!({"query": q.name, "outcome": state, "details": details}));
        }
        if replaced == 0 && !refused.is_empty() {
            match previous {
                Some(old) => write_atomic(&path, &old)?,
                None => remove_if_there(&path)?,
            }
            return Err(ServeError::Refused {
                plugin: name.to_owned(),
                reasons: refused,
            });
        }
        Ok(serde_json::json!({"name": name, "sha256": sha256, "queries": answers}))
    }

    /// The tenant's uploaded plugins with their builds' SHA-256.
    ///
    /// # Errors
    /// When its plugins folder cannot be read.
    pub fn plugins(&self, tenant: &str) -> Result<Vec<serde_json::Value>, ServeError> {
        let dir = self.space(tenant)?.dir.join(PLUGINS);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io("list", &dir))? {
            let entry = entry.map_err(io("list", &dir))?;
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(".wasm") else {
                continue;
            };
            let bytes = std::fs::read(entry.path()).map_err(io("read", &entry.path()))?;
            out.push(serde_json::json!({
                "name": name,
                "sha256": hex::encode(Sha256::digest(&bytes)),
                "bytes": bytes.len(),
            }));
        }
        out.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(out)
    }

    /// Asks every query to stop after its batch and waits for them (the server is stopping;
    /// what was running resumes with it).
    pub fn shutdown(&self) {
        let all: Vec<Arc<Hosted>> = self
            .spaces
            .values()
            .flat_map(|s| lock(&s.queries).values().cloned().collect::<Vec<_>>())
            .collect();
        for q in &all {
            lock(&q.run).stop.store(true, Ordering::Relaxed);
        }
        for q in &all {
            let thread = lock(&q.run).thread.take();
            if let Some(thread) = thread {
                let _ = thread.join();
            }
        }
    }
}

impl Run {
    fn idle(status: Status) -> Self {
        Self {
            status,
            stop: Arc::default(),
            reload: Arc::default(),
            thread: None,
        }
    }
}

impl Hosted {
    fn new(tenant: &str, name: &str, text: String, prepared: &Prepared) -> Arc<Self> {
        Self::with(
            tenant,
            name,
            text,
            prepared.memory_bytes,
            prepared.plugins.clone(),
            prepared.pipeline.query.checkpoint.clone(),
        )
    }

    fn with(
        tenant: &str,
        name: &str,
        text: String,
        memory_bytes: u64,
        plugins: Vec<String>,
        checkpoint: PathBuf,
    ) -> Arc<Self> {
        Arc::new(Self {
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            text,
            memory_bytes,
            plugins,
            checkpoint,
            run: Mutex::new(Run::idle(Status::Stopped)),
            recent: Mutex::default(),
            reloads: Mutex::default(),
            reloaded: Condvar::new(),
            failures: AtomicU32::new(0),
        })
    }

    /// A saved query whose pipeline no longer passes its checks: listed, failed, not run.
    fn failed(tenant: &str, name: &str, text: String, error: String) -> Arc<Self> {
        let hosted = Self::with(tenant, name, text, 0, Vec::new(), PathBuf::new());
        lock(&hosted.run).status = Status::Failed(error);
        hosted
    }

    pub fn status(&self) -> Status {
        lock(&self.run).status.clone()
    }

    /// Asks the query to stop after its batch; waits up to `wait` for its thread to end.
    fn stop_and_wait(&self, wait: Duration) -> Status {
        let thread = {
            let mut run = lock(&self.run);
            run.stop.store(true, Ordering::Relaxed);
            if run.status == Status::Running {
                run.status = Status::Stopping;
            }
            run.thread.take()
        };
        let Some(thread) = thread else {
            return self.status();
        };
        let deadline = Instant::now() + wait;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            lock(&self.run).thread = Some(thread);
        }
        self.status()
    }

    /// Asks the query to look for new builds before its next batch, and waits for it to do so:
    /// `replaced`, `refused` (with why), `unchanged`, or `pending` when it did not in time.
    fn reload_and_wait(&self, wait: Duration) -> (&'static str, Vec<String>) {
        let before = lock(&self.reloads).done;
        lock(&self.run).reload.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + wait;
        let mut reloads = lock(&self.reloads);
        while reloads.done == before {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.status() != Status::Running {
                return ("pending", Vec::new());
            }
            let step = left.min(Duration::from_millis(100));
            reloads = self
                .reloaded
                .wait_timeout(reloads, step)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        let details: Vec<String> = reloads.last.iter().map(|(_, d)| d.clone()).collect();
        let state = if reloads.last.iter().any(|(ok, _)| !ok) {
            "refused"
        } else if reloads.last.is_empty() {
            "unchanged"
        } else {
            "replaced"
        };
        (state, details)
    }

    /// Its status, last error and last progress record; with `builds`, which plugin builds each
    /// of its recent batches ran.
    pub fn describe(&self, builds: bool) -> serde_json::Value {
        let status = self.status();
        let error = match &status {
            Status::Failed(e) => Some(e.clone()),
            _ => None,
        };
        let recent: Vec<serde_json::Value> = lock(&self.recent).iter().cloned().collect();
        let last = match recent.last() {
            Some(p) => Some(p.clone()),
            None => self.progress_after(None, 1).pop(),
        };
        let mut out = serde_json::json!({
            "name": self.name,
            "status": status.word(),
            "error": error,
            "failures_in_a_row": self.failures.load(Ordering::Relaxed),
            "progress": last,
        });
        if builds {
            let batches: Vec<serde_json::Value> = recent
                .iter()
                .map(|p| {
                    let plugins: Vec<serde_json::Value> = p["plugins"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|x| serde_json::json!({"name": x["name"], "sha256": x["sha256"]}))
                        .collect();
                    serde_json::json!({"batchId": p["batchId"], "plugins": plugins})
                })
                .collect();
            out["batches"] = serde_json::Value::Array(batches);
            out["pipeline"] = serde_json::Value::String(self.text.clone());
        }
        out
    }

    /// Progress records of batches after `after` (all with `None`), at most `limit`, oldest
    /// first: from memory when it holds them, else from the checkpoint's `progress.jsonl`.
    pub fn progress_after(&self, after: Option<u64>, limit: usize) -> Vec<serde_json::Value> {
        let wanted = |p: &serde_json::Value| {
            after.is_none_or(|n| p["batchId"].as_u64().is_some_and(|b| b > n))
        };
        {
            let recent = lock(&self.recent);
            let first = recent.front().and_then(|p| p["batchId"].as_u64());
            let covered = match (after, first) {
                (Some(n), Some(first)) => n + 1 >= first,
                _ => false,
            };
            if covered {
                return recent
                    .iter()
                    .filter(|p| wanted(p))
                    .take(limit)
                    .cloned()
                    .collect();
            }
        }
        let path = self.checkpoint.join("progress.jsonl");
        let Ok(file) = std::fs::File::open(&path) else {
            return Vec::new();
        };
        let mut out: VecDeque<serde_json::Value> = VecDeque::new();
        for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
            let Ok(p) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if wanted(&p) {
                // `after = None` asks for the newest `limit`.
                if after.is_none() && out.len() == limit {
                    out.pop_front();
                }
                out.push_back(p);
                if after.is_some() && out.len() == limit {
                    break;
                }
            }
        }
        out.into()
    }
}

/// Runs the calling thread (a query's batch loop) at nice value `nice`: [`QUERY_NICE`], a little
/// below the API's threads, so that a saturated host still answers its API promptly;
/// [`FAILING_NICE`] for a query started again after failing, so that a plugin that burns its
/// limits every batch takes little from its neighbours (until a batch commits, where the host
/// may raise it back, or the query is started afresh). Linux sets a thread's nice value by its
/// thread id.
fn lower_priority(hosted: &Hosted, nice: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` has no preconditions; `setpriority` only changes this thread's nice
        // value (raising it needs no privilege).
        let done = unsafe {
            let tid = libc::gettid();
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice)
        };
        if done != 0 {
            tracing::warn!(tenant = %hosted.tenant, query = %hosted.name, "cannot lower the priority of a failing query: {}", std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (hosted, nice);
}

/// Gives the calling thread back the normal priority, where the host is allowed to (raising a
/// priority needs `CAP_SYS_NICE` or a `RLIMIT_NICE`; otherwise the query keeps the low one until
/// it is started afresh).
fn restore_priority() {
    #[cfg(target_os = "linux")]
    // SAFETY: as in `lower_priority`; a refusal leaves the priority as it was.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, QUERY_NICE);
    }
}

fn check_name(what: &str, name: &str) -> Result<(), ServeError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(ServeError::BadRequest {
            message: format!(
                "{name:?} is not a {what} name: 1 to 64 lower-case letters, digits, '_' or '-', starting with a letter or digit"
            ),
        })
    }
}

/// Rewrites `plugin = "NAME"` (an uploaded plugin) to its file, and notes the names.
fn uploaded_plugins(table: &mut toml::Table, names: &mut Vec<String>) {
    let mut rewrite = |t: &mut toml::Table| {
        if let Some(toml::Value::String(p)) = t.get_mut("plugin")
            && valid_name(p)
        {
            names.push(p.clone());
            *p = format!("{PLUGINS}/{p}.wasm");
        }
    };
    for key in ["transform", "function", "listener"] {
        if let Some(toml::Value::Array(items)) = table.get_mut(key) {
            for item in items {
                if let toml::Value::Table(t) = item {
                    rewrite(t);
                }
            }
        }
    }
    if let Some(toml::Value::Table(sink)) = table.get_mut("sink") {
        rewrite(sink);
    }
    names.sort();
    names.dedup();
}

/// The sum of the `limits.memory` of the pipeline's plugins.
fn plugin_memory(pipeline: &Pipeline) -> u64 {
    let transforms = pipeline
        .transforms
        .iter()
        .filter_map(|t| t.wasm())
        .map(|w| w.limits.memory_bytes);
    let functions = pipeline
        .functions
        .iter()
        .map(|f| f.plugin.limits.memory_bytes);
    let listeners = pipeline.listeners.iter().filter_map(|l| match &l.kind {
        spec::ListenerKind::Plugin(p) => Some(p.limits.memory_bytes),
        spec::ListenerKind::Webhook { .. } => None,
    });
    let sink = match &pipeline.sink {
        SinkSpec::Plugin(p) => Some(p.limits.memory_bytes),
        _ => None,
    };
    transforms
        .chain(functions)
        .chain(listeners)
        .chain(sink)
        .fold(0u64, u64::saturating_add)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ServeError> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, bytes).map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename", path))
}

fn remove_if_there(path: &Path) -> Result<(), ServeError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("remove", path)(e)),
        _ => Ok(()),
    }
}
