//! The WebAssembly plugin host.
//!
//! User code (transforms and foreachBatch sinks) arrives as WebAssembly
//! components built against `wit/weir.wit`. This module is the only place
//! that knows about wasmtime: it compiles (and caches) components, gives each
//! plugin instance its own sandboxed `Store` (memory limit, per-call deadline,
//! optional fuel, no ambient capabilities), hands batches across the boundary
//! once per call, and turns every way a plugin can fail into a typed
//! [`PluginError`] so that a bad plugin fails its batch, never the host.
//!
//! # Layout
//! - `bindings`: host-side code generated from the WIT worlds.
//! - `engine`: the shared wasmtime engine and its epoch ticker.
//! - `cache`: the on-disk cache of compiled components, and the checks (owner,
//!   mode, MAC) that decide whether its native code may be loaded.
//! - `convert`: Arrow ⇄ WIT column conversion (buffers, not values).
//! - `ipc_check`: vets a guest's Arrow IPC stream before arrow-ipc reads it.
//! - `state`: what a plugin's store holds and the host functions it imports.
//! - `keyed_state`: the `keyed-state` import of stateful transforms.
//! - `instance`: one live plugin instance, its limits and its recovery from traps.
//! - `function`: a scalar-function plugin, which SQL calls once per batch and function.
//! - `deadline`: the per-call deadline for host calls (sleeps, HTTP, streams).
//! - `reload`: noticing a new build of a running plugin, and which builds may
//!   replace which.
//! - `grants`: folders, environment variables and HTTP hosts a plugin may reach.
//! - `http_connect`: resolving a granted name, checking its addresses, and
//!   sending the request to a checked one.
//! - `limiter`: the memory limit (memories and tables together), its
//!   high-water mark, and the budgets of what the host holds for a plugin.
//! - `logs`: the `log` import and stderr, forwarded to the log with a cap.
//! - `replay`: the batch clock and seeded random source that make replays identical.
//! - `merge_capability`: the `delta-merge` import of sinks (MERGE into granted Delta tables).
//! - `error`: [`PluginError`].

mod bindings;
mod cache;
mod convert;
mod deadline;
mod engine;
mod error;
mod function;
#[cfg(test)]
mod fuzz;
mod grants;
mod http_connect;
mod instance;
mod ipc_check;
mod keyed_state;
mod limiter;
mod listener;
mod logs;
mod merge_capability;
mod metadata;
mod reload;
mod replay;
mod state;

pub use crate::spec::DirGrant;
pub use engine::{EngineOptions, LoadedPlugin, PluginEngine, PoolOptions};
pub use error::{Budget, PluginError, PluginErrorKind};
pub use function::{FunctionSignature, SharedFunction, WasmFunction};
pub use grants::{HttpGrant, env_from_host};
pub use http_connect::special_address;
pub use instance::{PluginOptions, PluginUsage, Sandbox, WasmSink, WasmTransform};
pub use listener::{QueryEvent, WasmListener};
pub use metadata::{PluginMetadata, read_metadata};
pub use reload::{NewBuild, PluginFile};
pub use replay::ReplayKey;
pub use state::BatchInfo;
