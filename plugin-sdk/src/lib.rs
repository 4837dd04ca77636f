//! Write Weir transforms, foreachBatch sinks and SQL scalar functions in plain Rust.
//!
//! Weir runs user code as WebAssembly components behind the contract in `wit/weir.wit`. This
//! crate exists so that a plugin author never sees that contract: a plugin is a type, an impl of
//! [`Transform`], [`Sink`] or [`ScalarFunctions`], and one macro ([`export_transform!`] /
//! [`export_sink!`] / [`export_scalar_function!`]). No
//! generated bindings, no `unsafe`, no ABI. The same code runs natively, so plugin logic is
//! unit-tested with `cargo test` through [`testing`].
//!
//! ```
//! use weir_plugin_sdk::{Batch, BatchInfo, Output, PluginError, Schema, Selection, Transform};
//!
//! #[derive(serde::Deserialize)]
//! struct Config { min: i64 }
//!
//! struct AtLeast { min: i64 }
//!
//! impl Transform for AtLeast {
//!     type Config = Config;
//!     fn new(config: Config, _input: &Schema) -> Result<Self, PluginError> {
//!         Ok(Self { min: config.min })
//!     }
//!     fn process(&mut self, batch: &Batch<'_>, _info: &BatchInfo) -> Result<Output, PluginError> {
//!         let amount = batch.column("amount")?;
//!         Ok(Output::keep(Selection::from_fn(batch.num_rows(), |row| {
//!             amount.i64(row).is_some_and(|a| a >= self.min)
//!         })))
//!     }
//! }
//! weir_plugin_sdk::export_transform!(AtLeast);
//!
//! # use weir_plugin_sdk::{Column, testing::{MemoryBatch, run_transform}};
//! let input = MemoryBatch::new(vec![Column::int64("amount", vec![5, 50, 500], None)]);
//! let output = run_transform::<AtLeast>(r#"{"min": 50}"#, &input).unwrap();
//! assert_eq!(output.num_rows(), 2);
//! ```
//!
//! A type that does not implement the trait is rejected at compile time:
//!
//! ```compile_fail,E0277
//! struct NotATransform;
//! weir_plugin_sdk::export_transform!(NotATransform); // error: `NotATransform` is not a Weir transform
//! ```
//!
//! # Layout
//! - [`schema`], [`column`], [`bitmap`]: the data types, in Arrow's layout, as plain Rust.
//! - [`batch`]: the batch handed to a plugin; pulls columns from the host lazily in the guest.
//! - [`output`]: a transform's result as edits of its input.
//! - [`error`]: [`PluginError`] and config parsing.
//! - [`host`]: logging and the replay-stable random source.
//! - [`state`]: keyed state for stateful transforms (feature `stateful-transform`), stored and
//!   versioned by the host.
//! - [`delta_merge`]: MERGE into granted Delta tables from a sink (feature `merge-sink`).
//! - [`function`]: scalar functions that a pipeline's SQL calls by name, one call per batch
//!   (feature `scalar-function`).
//! - [`testing`]: native harness that applies outputs like the host does.
//! - [`text`]: text forms of timestamps, dates and decimals (RFC 3339, exact decimals).
//! - `guest` (hidden, wasm32 only): the wit-bindgen glue, one `generate!` per cargo feature
//!   (`transform`, `sink`, `scalar-function`), because a component must export exactly the world
//!   it implements.

// The generated glue names this crate by its path from the plugin crate; inside the SDK the same
// path must resolve too.
extern crate self as weir_plugin_sdk;

pub mod batch;
pub mod bitmap;
pub mod column;
pub mod delta_merge;
pub mod error;
pub mod function;
pub mod host;
pub mod listener;
pub mod output;
pub mod schema;
#[cfg(any(not(target_arch = "wasm32"), feature = "stateful-transform"))]
pub mod state;
pub mod testing;
pub mod text;

#[cfg(all(
    target_arch = "wasm32",
    any(
        feature = "transform",
        feature = "sink",
        feature = "scalar-function",
        feature = "listener"
    )
))]
mod guest;

pub use batch::{Batch, BatchInfo};
pub use bitmap::Bitmap;
pub use column::{Column, Values};
pub use error::{ErrorKind, PluginError};
pub use function::{ScalarFunctions, Signature};
pub use host::{Level, log, log_debug, log_error, log_info, log_trace, log_warn, random_u64};
pub use listener::{Listener, Progress};
pub use output::{Edit, Output, Selection};
pub use schema::{DataType, Field, Schema};

/// A transform: called once per micro-batch with the batch, returns which rows to keep and
/// which columns to add, replace or drop.
///
/// One value of the type lives per plugin instance, from `new` (the host's `open`) on, so it may
/// keep state across batches (replays then see it too: keep it derivable from the batch).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Weir transform",
    label = "this type does not implement `weir_plugin_sdk::Transform`",
    note = "add `impl weir_plugin_sdk::Transform for {Self} {{ type Config = ...; fn new(...); fn process(...) }}`"
)]
pub trait Transform: Sized + 'static {
    /// The plugin's `config` from the pipeline file, deserialised from JSON.
    type Config: serde::de::DeserializeOwned;

    /// Creates the instance for input batches of schema `input`.
    ///
    /// # Errors
    /// [`PluginError::invalid_config`] for a config that makes no sense for `input`, and
    /// [`PluginError::invalid_input`] for an input it cannot handle (a missing column).
    fn new(config: Self::Config, input: &Schema) -> Result<Self, PluginError>;

    /// The schema of the output batches; by default the input's.
    ///
    /// # Errors
    /// As for [`Transform::new`].
    fn output_schema(&self, input: &Schema) -> Result<Schema, PluginError> {
        Ok(input.clone())
    }

    /// Transforms one batch.
    ///
    /// # Errors
    /// Any [`PluginError`]; [`PluginError::retryable`] lets the host retry the batch.
    fn process(&mut self, batch: &Batch<'_>, info: &BatchInfo) -> Result<Output, PluginError>;
}

/// A foreachBatch sink: called once per micro-batch with the batch and its id.
///
/// The same `batch_id` may come again after a failure (with a higher `attempt`): the sink must then
/// leave its output as if the batch came once.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Weir sink",
    label = "this type does not implement `weir_plugin_sdk::Sink`",
    note = "add `impl weir_plugin_sdk::Sink for {Self} {{ type Config = ...; fn new(...); fn write_batch(...) }}`"
)]
pub trait Sink: Sized + 'static {
    /// The plugin's `config` from the pipeline file, deserialised from JSON.
    type Config: serde::de::DeserializeOwned;

    /// Creates the instance for batches of schema `input`.
    ///
    /// # Errors
    /// As for [`Transform::new`].
    fn new(config: Self::Config, input: &Schema) -> Result<Self, PluginError>;

    /// Writes one batch, idempotently by `info.batch_id`.
    ///
    /// # Errors
    /// Any [`PluginError`]; [`PluginError::retryable`] lets the host retry the batch.
    fn write_batch(&mut self, batch: &Batch<'_>, info: &BatchInfo) -> Result<(), PluginError>;
}

/// Glue for the macros; not part of the API.
#[doc(hidden)]
pub mod __private {
    #[cfg(all(target_arch = "wasm32", feature = "listener"))]
    pub use crate::guest::listener;
    #[cfg(all(target_arch = "wasm32", feature = "scalar-function"))]
    pub use crate::guest::scalar;
    #[cfg(all(target_arch = "wasm32", feature = "sink"))]
    pub use crate::guest::sink;
    #[cfg(all(target_arch = "wasm32", feature = "transform"))]
    pub use crate::guest::transform;

    /// Compile-time check behind the macros: names the missing trait in the error.
    pub const fn assert_transform<T: crate::Transform>() {}
    /// Compile-time check behind the macros: names the missing trait in the error.
    pub const fn assert_sink<T: crate::Sink>() {}
    /// Compile-time check behind the macros: names the missing trait in the error.
    pub const fn assert_scalar_functions<T: crate::ScalarFunctions>() {}
    /// Compile-time check behind the macros: names the missing trait in the error.
    pub const fn assert_listener<T: crate::Listener>() {}
}

/// Makes `$ty` (an implementation of [`Transform`]) the plugin's transform.
///
/// In a `wasm32` build with the SDK's `transform` feature this exports the `transform` world;
/// natively it only checks that `$ty` implements [`Transform`], so that the plugin crate builds and
/// tests natively.
#[cfg(not(target_arch = "wasm32"))]
#[macro_export]
macro_rules! export_transform {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_transform::<$ty>();
    };
}

/// Makes `$ty` (an implementation of [`Sink`]) the plugin's sink.
///
/// In a `wasm32` build with the SDK's `sink` feature this exports the `sink` world; natively it
/// only checks that `$ty` implements [`Sink`].
#[cfg(not(target_arch = "wasm32"))]
#[macro_export]
macro_rules! export_sink {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_sink::<$ty>();
    };
}

/// Makes `$ty` (an implementation of [`ScalarFunctions`]) the plugin's scalar functions.
///
/// In a `wasm32` build with the SDK's `scalar-function` feature this exports the
/// `scalar-function` world; natively it only checks that `$ty` implements [`ScalarFunctions`].
#[cfg(not(target_arch = "wasm32"))]
#[macro_export]
macro_rules! export_scalar_function {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_scalar_functions::<$ty>();
    };
}

/// Makes `$ty` (an implementation of [`Transform`]) the plugin's transform.
#[cfg(all(target_arch = "wasm32", feature = "transform"))]
#[macro_export]
macro_rules! export_transform {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_transform::<$ty>();
        const _: () = {
            struct WeirTransformExport;

            ::std::thread_local! {
                static WEIR_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            impl $crate::__private::transform::Guest for WeirTransformExport {
                fn open(
                    config: $crate::__private::transform::WitString,
                    input_schema: $crate::__private::transform::WitFields,
                ) -> $crate::__private::transform::OpenResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::transform::open::<$ty>(instance, config, input_schema)
                    })
                }

                fn process(
                    info: $crate::__private::transform::WitBatchInfo,
                    input: &$crate::__private::transform::WitBatch,
                ) -> $crate::__private::transform::ProcessResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::transform::process::<$ty>(instance, info, input)
                    })
                }
            }

            $crate::__private::transform::bindings::export_world!(
                WeirTransformExport with_types_in $crate::__private::transform::bindings
            );
        };
    };
}

/// Makes `$ty` (an implementation of [`Sink`]) the plugin's sink.
#[cfg(all(target_arch = "wasm32", feature = "sink"))]
#[macro_export]
macro_rules! export_sink {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_sink::<$ty>();
        const _: () = {
            struct WeirSinkExport;

            ::std::thread_local! {
                static WEIR_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            impl $crate::__private::sink::Guest for WeirSinkExport {
                fn open(
                    config: $crate::__private::sink::WitString,
                    input_schema: $crate::__private::sink::WitFields,
                ) -> $crate::__private::sink::OpenResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::sink::open::<$ty>(instance, config, input_schema)
                    })
                }

                fn write_batch(
                    info: $crate::__private::sink::WitBatchInfo,
                    input: &$crate::__private::sink::WitBatch,
                ) -> $crate::__private::sink::WriteResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::sink::write_batch::<$ty>(instance, info, input)
                    })
                }
            }

            $crate::__private::sink::bindings::export_world!(
                WeirSinkExport with_types_in $crate::__private::sink::bindings
            );
        };
    };
}

/// Makes `$ty` (an implementation of [`ScalarFunctions`]) the plugin's scalar functions.
#[cfg(all(target_arch = "wasm32", feature = "scalar-function"))]
#[macro_export]
macro_rules! export_scalar_function {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_scalar_functions::<$ty>();
        const _: () = {
            struct WeirScalarExport;

            ::std::thread_local! {
                static WEIR_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            impl $crate::__private::scalar::Guest for WeirScalarExport {
                fn open(
                    config: $crate::__private::scalar::WitString,
                    functions: $crate::__private::scalar::WitSignatures,
                ) -> $crate::__private::scalar::OpenResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::scalar::open::<$ty>(instance, config, functions)
                    })
                }

                fn call(
                    name: $crate::__private::scalar::WitString,
                    info: $crate::__private::scalar::WitBatchInfo,
                    args: &$crate::__private::scalar::WitBatch,
                ) -> $crate::__private::scalar::CallResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::scalar::call::<$ty>(instance, name, info, args)
                    })
                }
            }

            $crate::__private::scalar::bindings::export_world!(
                WeirScalarExport with_types_in $crate::__private::scalar::bindings
            );
        };
    };
}

/// Without the `transform` feature a wasm32 build cannot export a transform.
#[cfg(all(target_arch = "wasm32", not(feature = "transform")))]
#[macro_export]
macro_rules! export_transform {
    ($ty:ty) => {
        ::core::compile_error!(
            "export_transform! needs the `transform` feature: weir-plugin-sdk = { ..., features = [\"transform\"] }"
        );
    };
}

/// Without the `sink` feature a wasm32 build cannot export a sink.
#[cfg(all(target_arch = "wasm32", not(feature = "sink")))]
#[macro_export]
macro_rules! export_sink {
    ($ty:ty) => {
        ::core::compile_error!(
            "export_sink! needs the `sink` feature: weir-plugin-sdk = { ..., features = [\"sink\"] }"
        );
    };
}

/// Without the `scalar-function` feature a wasm32 build cannot export scalar functions.
#[cfg(all(target_arch = "wasm32", not(feature = "scalar-function")))]
#[macro_export]
macro_rules! export_scalar_function {
    ($ty:ty) => {
        ::core::compile_error!(
            "export_scalar_function! needs the `scalar-function` feature: weir-plugin-sdk = { ..., features = [\"scalar-function\"] }"
        );
    };
}

/// Makes `$ty` (an implementation of [`Listener`]) the plugin's query listener.
///
/// In a `wasm32` build with the SDK's `listener` feature this exports the `listener` world;
/// natively it only checks that `$ty` implements [`Listener`].
#[cfg(not(target_arch = "wasm32"))]
#[macro_export]
macro_rules! export_listener {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_listener::<$ty>();
    };
}

/// Makes `$ty` (an implementation of [`Listener`]) the plugin's query listener.
#[cfg(all(target_arch = "wasm32", feature = "listener"))]
#[macro_export]
macro_rules! export_listener {
    ($ty:ty) => {
        const _: () = $crate::__private::assert_listener::<$ty>();
        const _: () = {
            struct WeirListenerExport;

            ::std::thread_local! {
                static WEIR_INSTANCE: ::core::cell::RefCell<::core::option::Option<$ty>> =
                    const { ::core::cell::RefCell::new(::core::option::Option::None) };
            }

            impl $crate::__private::listener::Guest for WeirListenerExport {
                fn open(config: ::std::string::String) -> $crate::__private::listener::EventResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::listener::open::<$ty>(instance, config)
                    })
                }

                fn query_started(
                    id: ::std::string::String,
                    run_id: ::std::string::String,
                    name: ::std::string::String,
                ) -> $crate::__private::listener::EventResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::listener::started::<$ty>(instance, &id, &run_id, &name)
                    })
                }

                fn query_progress(
                    progress: ::std::string::String,
                ) -> $crate::__private::listener::EventResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::listener::progress::<$ty>(instance, &progress)
                    })
                }

                fn query_idle(
                    id: ::std::string::String,
                    run_id: ::std::string::String,
                    timestamp: ::std::string::String,
                ) -> $crate::__private::listener::EventResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::listener::idle::<$ty>(instance, &id, &run_id, &timestamp)
                    })
                }

                fn query_terminated(
                    id: ::std::string::String,
                    run_id: ::std::string::String,
                    error: ::core::option::Option<::std::string::String>,
                ) -> $crate::__private::listener::EventResult {
                    WEIR_INSTANCE.with_borrow_mut(|instance| {
                        $crate::__private::listener::terminated::<$ty>(
                            instance,
                            &id,
                            &run_id,
                            error.as_deref(),
                        )
                    })
                }
            }

            $crate::__private::listener::bindings::export_world!(
                WeirListenerExport with_types_in $crate::__private::listener::bindings
            );
        };
    };
}

/// Gives the plugin its metadata: a JSON object with `name`, `version`, `description` and
/// `config_schema` (a JSON Schema of its `config`), stored in the component's custom section
/// `weir:metadata`. `weir plugin inspect` prints it, and `weir validate` checks a pipeline's
/// `config` for the plugin against the schema (the keywords `plugin-sdk/README.md` lists).
///
/// ```
/// weir_plugin_sdk::plugin_metadata!(r#"{
///     "name": "double", "version": "1.0.0", "description": "Doubles a column.",
///     "config_schema": {"type": "object", "properties": {"column": {"type": "string"}},
///                       "required": ["column"], "additionalProperties": false}
/// }"#);
/// ```
#[macro_export]
macro_rules! plugin_metadata {
    ($json:expr) => {
        const _: () = {
            const WEIR_METADATA_JSON: &str = $json;
            #[cfg(target_arch = "wasm32")]
            #[used]
            #[unsafe(link_section = "weir:metadata")]
            static WEIR_METADATA: [u8; WEIR_METADATA_JSON.len()] = {
                let bytes = WEIR_METADATA_JSON.as_bytes();
                let mut out = [0u8; WEIR_METADATA_JSON.len()];
                let mut i = 0;
                while i < bytes.len() {
                    out[i] = bytes[i];
                    i += 1;
                }
                out
            };
        };
    };
}
