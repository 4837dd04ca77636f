//! One wasmtime [`Engine`] per process, shared by every plugin: compiling a
//! component is the expensive step (seconds under Cranelift), so compiled
//! artifacts are cached on disk by content hash and loaded from there on the
//! next start, after the checks of `cache` (a compiled artifact is native
//! code, so only a folder and files that nobody else can have written count).
//!
//! Instances come from wasmtime's pooling allocator: the engine reserves
//! address space for a fixed number of instances up front, so a new
//! instance (a new query, a replaced build, a store thrown away after a
//! trap) reuses a slot instead of mapping and unmapping memory, which halves
//! instantiation. The pool is sized by [`PoolOptions`]: how many plugin
//! instances may be alive at once and the largest memory any of them may
//! reach. Per-plugin memory limits stay with each store's limiter; the pool
//! only caps what no plugin of this engine may exceed. Where the pool cannot
//! be reserved (a process with a small address-space limit), the engine
//! falls back to allocating on demand and says so.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::cache::CompiledCache;
use super::error::PluginError;

/// How often the epoch advances; per-call deadlines are counted in these ticks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The one thread that moves the epoch of every engine in the process.
///
/// Why one: a spinning guest only stops when its engine's epoch moves, so the mover must be an
/// OS thread of its own; but every query has an engine, and `weir serve` runs many queries, so
/// a thread per engine was a thread and 100 wake-ups a second per query. This one parks while
/// no engine is alive.
mod ticker {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
    use std::thread::Thread;

    use wasmtime::Engine;

    use super::{EPOCH_TICK, PluginError};

    /// The engines whose epoch moves, each with the flag its owner sets when it is dropped.
    type Ticked = Vec<(Engine, Arc<AtomicBool>)>;

    static TICKED: Mutex<Ticked> = Mutex::new(Vec::new());
    /// The ticker thread, once started.
    static THREAD: Mutex<Option<Thread>> = Mutex::new(None);

    fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
        // What the lock guards stays consistent at every step, even after a panic.
        m.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves `engine`'s epoch every tick until `stop` is set.
    pub(super) fn add(engine: &Engine, stop: Arc<AtomicBool>) -> Result<(), PluginError> {
        let mut thread = lock(&THREAD);
        if thread.is_none() {
            let started = std::thread::Builder::new()
                .name("weir-epoch".into())
                .spawn(run)
                .map_err(|e| PluginError::Instantiate {
                    plugin: "(engine)".into(),
                    reason: format!("cannot start the epoch thread: {e}"),
                })?;
            *thread = Some(started.thread().clone());
        }
        lock(&TICKED).push((engine.clone(), stop));
        if let Some(t) = thread.as_ref() {
            t.unpark();
        }
        Ok(())
    }

    fn run() {
        loop {
            let idle = {
                let mut ticked = lock(&TICKED);
                ticked.retain(|(_, stop)| !stop.load(Ordering::Relaxed));
                ticked.is_empty()
            };
            if idle {
                // `add` unparks after it pushes, so an engine added meanwhile is not missed.
                std::thread::park();
                continue;
            }
            std::thread::sleep(EPOCH_TICK);
            for (engine, _) in lock(&TICKED).iter() {
                engine.increment_epoch();
            }
        }
    }

    /// Whether the engine that set `stop` when dropped is still ticked.
    #[cfg(test)]
    pub(super) fn ticks(stop: &Arc<AtomicBool>) -> bool {
        lock(&TICKED).iter().any(|(_, s)| Arc::ptr_eq(s, stop))
    }
}

/// Settings of the shared engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Where compiled components are kept; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Meter fuel (instructions) so that plugins can be given a fuel budget.
    /// Costs about a quarter of plugin speed, so it is off unless a plugin asks.
    pub fuel: bool,
    /// The instance pool; `None` allocates every instance on demand.
    pub pool: Option<PoolOptions>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            cache_dir: None,
            fuel: false,
            pool: Some(PoolOptions::default()),
        }
    }
}

/// How large the pooling allocator's pool is.
///
/// A plugin instance (one component) holds several core instances, linear
/// memories and tables: a componentize-py build has a dozen core modules and
/// tables of tens of thousands of functions. The pool's per-component limits
/// are sized for those, so that every language's plugins fit; what is
/// reserved per memory is address space, not resident memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolOptions {
    /// Plugin instances alive at once. A query needs one per plugin, and one
    /// more per plugin while a new build replaces an old one.
    pub instances: u32,
    /// The most linear memory any one memory of any instance may grow to:
    /// at least the largest per-plugin memory limit of the engine.
    pub max_memory_bytes: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            instances: 16,
            max_memory_bytes: MAX_MEMORY_BYTES,
        }
    }
}

impl PoolOptions {
    /// A pool for `plugins` plugins, each of which may be replaced by a new
    /// build while running, whose memory limits are at most `max_memory_bytes`.
    pub fn for_plugins(plugins: usize, max_memory_bytes: u64) -> Self {
        let instances = u32::try_from(plugins.max(1).saturating_mul(2)).unwrap_or(u32::MAX);
        Self {
            instances,
            max_memory_bytes: max_memory_bytes.clamp(1 << 16, MAX_MEMORY_BYTES),
        }
    }
}

/// What a 32-bit Wasm memory can address.
const MAX_MEMORY_BYTES: u64 = 4 << 30;
/// Core instances, memories and tables one component may hold in the pool.
const CORE_INSTANCES_PER_COMPONENT: u32 = 32;
const MEMORIES_PER_COMPONENT: u32 = 4;
const TABLES_PER_COMPONENT: u32 = 32;
/// Elements of one table: CPython's function table is tens of thousands.
const TABLE_ELEMENTS: usize = 1 << 17;
/// Metadata (`VMContext`) of one instance; allocated as needed, only capped.
const INSTANCE_METADATA_BYTES: usize = 16 << 20;

fn pooling(options: &PoolOptions) -> PoolingAllocationConfig {
    let n = options.instances.max(1);
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
        .total_memories(n.saturating_mul(MEMORIES_PER_COMPONENT))
        .total_tables(n.saturating_mul(TABLES_PER_COMPONENT))
        // Plugins are called synchronously: no fiber stacks are taken.
        .total_stacks(n)
        .max_core_instances_per_component(CORE_INSTANCES_PER_COMPONENT)
        .max_memories_per_component(MEMORIES_PER_COMPONENT)
        .max_tables_per_component(TABLES_PER_COMPONENT)
        .max_memories_per_module(1)
        .max_tables_per_module(TABLES_PER_COMPONENT)
        .table_elements(TABLE_ELEMENTS)
        .max_component_instance_size(INSTANCE_METADATA_BYTES)
        .max_core_instance_size(INSTANCE_METADATA_BYTES)
        .max_memory_size(usize::try_from(options.max_memory_bytes).unwrap_or(usize::MAX));
    pool
}

/// A compiled component, ready to instantiate.
#[derive(Clone)]
pub struct LoadedPlugin {
    pub(crate) name: String,
    pub(crate) path: PathBuf,
    pub(crate) component: Component,
    /// Hex sha256 of the `.wasm` bytes: the plugin's identity in checkpoints.
    pub sha256: String,
    /// Whether the compiled artifact came from the cache.
    pub cached: bool,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("sha256", &self.sha256)
            .field("cached", &self.cached)
            .finish()
    }
}

impl LoadedPlugin {
    /// Refuses a build whose hash is not the one the pipeline pinned.
    ///
    /// # Errors
    /// [`PluginError::HashMismatch`], naming the plugin, both hashes and the file.
    pub fn check_pin(&self, expected: Option<&str>) -> Result<(), PluginError> {
        match expected {
            Some(expected) if !expected.eq_ignore_ascii_case(&self.sha256) => {
                Err(PluginError::HashMismatch {
                    plugin: self.name.clone(),
                    path: self.path.clone(),
                    expected: expected.to_owned(),
                    actual: self.sha256.clone(),
                })
            }
            _ => Ok(()),
        }
    }
}

struct Shared {
    engine: Engine,
    options: EngineOptions,
    stop_ticker: Arc<AtomicBool>,
    /// Whether instances come from the pool (false after a fallback).
    pooled: bool,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

/// The engine all plugins of a process run on. Cheap to clone.
#[derive(Clone)]
pub struct PluginEngine {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PluginEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginEngine")
            .field("options", &self.shared.options)
            .field("pooled", &self.shared.pooled)
            .finish()
    }
}

impl PluginEngine {
    /// Creates the engine and has the process's epoch thread move its epoch.
    ///
    /// # Errors
    /// When wasmtime rejects the configuration (not expected on supported hosts).
    pub fn new(options: EngineOptions) -> Result<Self, PluginError> {
        super::grants::install_tls_provider();
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.consume_fuel(options.fuel);
        config.wasm_component_model(true);
        let engine_err = |e: wasmtime::Error| PluginError::Instantiate {
            plugin: "(engine)".into(),
            reason: format!("{e:#}"),
        };
        let (engine, pooled) = match &options.pool {
            Some(pool) => {
                config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(pool)));
                match Engine::new(&config) {
                    Ok(engine) => (engine, true),
                    Err(e) => {
                        tracing::warn!(
                            instances = pool.instances,
                            "cannot reserve the plugin instance pool ({e:#}); allocating instances on demand"
                        );
                        config.allocation_strategy(InstanceAllocationStrategy::OnDemand);
                        (Engine::new(&config).map_err(engine_err)?, false)
                    }
                }
            }
            None => (Engine::new(&config).map_err(engine_err)?, false),
        };
        let stop_ticker = Arc::new(AtomicBool::new(false));
        ticker::add(&engine, Arc::clone(&stop_ticker))?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                options,
                stop_ticker,
                pooled,
            }),
        })
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.shared.engine
    }

    /// Whether instances come from the pooling allocator.
    pub fn pooled(&self) -> bool {
        self.shared.pooled
    }

    /// Whether fuel metering is on.
    pub fn fuel_enabled(&self) -> bool {
        self.shared.options.fuel
    }

    /// Reads, hashes and compiles (or loads from the cache) the component at `path`.
    ///
    /// # Errors
    /// [`PluginError::Read`] when the file cannot be read, [`PluginError::Compile`]
    /// when it is not a component this host can run, [`PluginError::Cache`] when
    /// the cache directory cannot be created or written. A cache directory or
    /// artifact that fails the checks of `cache` is not an error: it is logged,
    /// and the plugin is compiled instead.
    pub fn load(&self, name: &str, path: &Path) -> Result<LoadedPlugin, PluginError> {
        let bytes = std::fs::read(path).map_err(|source| PluginError::Read {
            plugin: name.to_owned(),
            path: path.to_owned(),
            source,
        })?;
        self.load_bytes(name, path, &bytes)
    }

    /// Like [`Self::load`], for bytes already in memory; `path` only names them.
    ///
    /// # Errors
    /// As [`Self::load`].
    pub fn load_bytes(
        &self,
        name: &str,
        path: &Path,
        bytes: &[u8],
    ) -> Result<LoadedPlugin, PluginError> {
        let sha256 = hex::encode(Sha256::digest(bytes));
        let compile_err = |reason: String| PluginError::Compile {
            plugin: name.to_owned(),
            path: path.to_owned(),
            reason,
        };
        let loaded = |component, cached| {
            prepare_memory_images(name, &component);
            LoadedPlugin {
                name: name.to_owned(),
                path: path.to_owned(),
                component,
                sha256: sha256.clone(),
                cached,
            }
        };
        let compile =
            || Component::new(self.engine(), bytes).map_err(|e| compile_err(format!("{e:#}")));
        let Some(dir) = &self.shared.options.cache_dir else {
            return Ok(loaded(compile()?, false));
        };
        let cache_err = |source| PluginError::Cache {
            plugin: name.to_owned(),
            dir: dir.clone(),
            source,
        };
        let Some(cache) = CompiledCache::open(dir, name).map_err(cache_err)? else {
            // Not safe to load native code from (the reason is logged): compile every time.
            return Ok(loaded(compile()?, false));
        };
        let artifact = format!("{sha256}-{}.cwasm", self.compatibility_key());
        if let Some(component) = cache.load(self.engine(), &artifact, name) {
            return Ok(loaded(component, true));
        }
        let compiled = self
            .engine()
            .precompile_component(bytes)
            .map_err(|e| compile_err(format!("{e:#}")))?;
        cache.store(&artifact, &compiled).map_err(cache_err)?;
        // SAFETY: the bytes were produced just now by this engine.
        let component = unsafe { Component::deserialize(self.engine(), &compiled) }
            .map_err(|e| compile_err(format!("{e:#}")))?;
        Ok(loaded(component, false))
    }

    /// A short key that changes whenever compiled artifacts stop being loadable
    /// (another wasmtime version or engine configuration).
    fn compatibility_key(&self) -> String {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine()
            .precompile_compatibility_hash()
            .hash(&mut hasher);
        format!("{:016x}", hasher.finish())
    }
}

/// Builds the component's copy-on-write memory images now, retrying a transient refusal.
///
/// On Linux wasmtime writes a module's initial memory into a memfd and seals it; the
/// kernel refuses the write seal with `EBUSY` while another part of the kernel (page
/// migration, compaction) briefly holds a reference to one of its pages, and wasmtime
/// passes that refusal on as a failed instantiation. Building the images at load, with a
/// few short retries, keeps that kernel transient from failing a plugin's batch; an image
/// still refused is left for instantiation to build (wasmtime does not cache the failure).
fn prepare_memory_images(plugin: &str, component: &Component) {
    const ATTEMPTS: u32 = 6;
    for attempt in 1..=ATTEMPTS {
        let Err(e) = component.initialize_copy_on_write_image() else {
            return;
        };
        let busy = e
            .chain()
            .filter_map(|cause| cause.downcast_ref::<std::io::Error>())
            .any(|io| io.raw_os_error() == Some(libc::EBUSY));
        if !busy || attempt == ATTEMPTS {
            tracing::warn!(
                plugin,
                "cannot prepare the plugin's memory image yet ({e:#}); instantiation will try again"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(5 << attempt));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_that_cannot_be_reserved_falls_back_to_allocating_on_demand() {
        let sized = PluginEngine::new(EngineOptions::default()).unwrap();
        assert!(sized.pooled());
        // 400,000 memories of 4 GiB each: more address space than x86-64 user space has.
        let huge = PluginEngine::new(EngineOptions {
            pool: Some(PoolOptions {
                instances: 100_000,
                max_memory_bytes: MAX_MEMORY_BYTES,
            }),
            ..EngineOptions::default()
        })
        .unwrap();
        assert!(!huge.pooled());
        let none = PluginEngine::new(EngineOptions {
            pool: None,
            ..EngineOptions::default()
        })
        .unwrap();
        assert!(!none.pooled());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn one_thread_ticks_every_engine_and_lets_a_dropped_one_go() {
        let engines: Vec<PluginEngine> = (0..3)
            .map(|_| {
                PluginEngine::new(EngineOptions {
                    pool: None,
                    ..EngineOptions::default()
                })
                .unwrap()
            })
            .collect();
        let epoch_threads = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|name| name.trim() == "weir-epoch")
            })
            .count();
        assert_eq!(epoch_threads, 1);
        let stops: Vec<Arc<AtomicBool>> = engines
            .iter()
            .map(|e| Arc::clone(&e.shared.stop_ticker))
            .collect();
        assert!(stops.iter().all(ticker::ticks));
        drop(engines);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while stops.iter().any(ticker::ticks) {
            assert!(
                std::time::Instant::now() < deadline,
                "dropped engines still ticked"
            );
            std::thread::sleep(EPOCH_TICK);
        }
    }

    #[test]
    fn a_query_pool_holds_two_instances_per_plugin_and_its_largest_memory_limit() {
        assert_eq!(
            PoolOptions::for_plugins(3, 64 << 20),
            PoolOptions {
                instances: 6,
                max_memory_bytes: 64 << 20
            }
        );
        assert_eq!(PoolOptions::for_plugins(0, 0).instances, 2);
        assert_eq!(
            PoolOptions::for_plugins(1, u64::MAX).max_memory_bytes,
            MAX_MEMORY_BYTES
        );
    }
}
