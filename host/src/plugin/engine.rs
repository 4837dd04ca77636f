//! One wasmtime [`Engine`] per process, shared by every plugin: compiling a
//! component is the expensive step (seconds under Cranelift), so compiled
//! artifacts are cached on disk by content hash and loaded by `mmap` on the
//! next start, which takes well under a millisecond.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::{Config, Engine};

use super::error::PluginError;

/// How often the epoch advances; per-call deadlines are counted in these ticks.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Settings of the shared engine.
#[derive(Debug, Clone, Default)]
pub struct EngineOptions {
    /// Where compiled components are kept; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Meter fuel (instructions) so that plugins can be given a fuel budget.
    /// Costs about a quarter of plugin speed, so it is off unless a plugin asks.
    pub fuel: bool,
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

struct Shared {
    engine: Engine,
    options: EngineOptions,
    stop_ticker: Arc<AtomicBool>,
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
            .finish()
    }
}

impl PluginEngine {
    /// Creates the engine and starts its epoch ticker thread.
    ///
    /// # Errors
    /// When wasmtime rejects the configuration (not expected on supported hosts).
    pub fn new(options: EngineOptions) -> Result<Self, PluginError> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.consume_fuel(options.fuel);
        config.wasm_component_model(true);
        let engine = Engine::new(&config).map_err(|e| PluginError::Instantiate {
            plugin: "(engine)".into(),
            reason: format!("{e:#}"),
        })?;
        let stop_ticker = Arc::new(AtomicBool::new(false));
        // The ticker must be its own OS thread: a spinning guest only stops
        // when the epoch moves, so nothing on the calling thread can move it.
        {
            let engine = engine.clone();
            let stop = Arc::clone(&stop_ticker);
            std::thread::Builder::new()
                .name("weir-epoch".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })
                .map_err(|e| PluginError::Instantiate {
                    plugin: "(engine)".into(),
                    reason: format!("cannot start the epoch thread: {e}"),
                })?;
        }
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                options,
                stop_ticker,
            }),
        })
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.shared.engine
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
    /// the cache directory cannot be written.
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
        let Some(dir) = &self.shared.options.cache_dir else {
            let component =
                Component::new(self.engine(), bytes).map_err(|e| compile_err(format!("{e:#}")))?;
            return Ok(LoadedPlugin {
                name: name.to_owned(),
                path: path.to_owned(),
                component,
                sha256,
                cached: false,
            });
        };
        let artifact = dir.join(format!("{sha256}-{}.cwasm", self.compatibility_key()));
        if artifact.is_file() {
            // SAFETY: the artifact was written by `precompile_component` of an
            // engine with the same compatibility key (it is in the file name),
            // into a cache directory that only this host writes; wasmtime
            // also checks the header and refuses a mismatched artifact.
            if let Ok(component) = unsafe { Component::deserialize_file(self.engine(), &artifact) }
            {
                return Ok(LoadedPlugin {
                    name: name.to_owned(),
                    path: path.to_owned(),
                    component,
                    sha256,
                    cached: true,
                });
            }
            tracing::warn!(artifact = %artifact.display(), "discarding an unusable compiled plugin");
        }
        let compiled = self
            .engine()
            .precompile_component(bytes)
            .map_err(|e| compile_err(format!("{e:#}")))?;
        let cache_err = |source| PluginError::Cache {
            plugin: name.to_owned(),
            dir: dir.clone(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(cache_err)?;
        let tmp = dir.join(format!(".{sha256}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &compiled).map_err(cache_err)?;
        std::fs::rename(&tmp, &artifact).map_err(cache_err)?;
        // SAFETY: the bytes were produced just now by this engine.
        let component = unsafe { Component::deserialize(self.engine(), &compiled) }
            .map_err(|e| compile_err(format!("{e:#}")))?;
        Ok(LoadedPlugin {
            name: name.to_owned(),
            path: path.to_owned(),
            component,
            sha256,
            cached: false,
        })
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
