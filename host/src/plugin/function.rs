//! A scalar-function plugin (world `scalar-function`): the instance a pipeline's SQL calls
//! once per batch and function, with the arguments as columns.
//!
//! It runs in the same sandbox as transforms and sinks (`instance::Runtime`: memory limit,
//! deadline, fuel, grants, the batch clock and seeded random numbers), because a function is
//! tenant code like any other. SQL evaluation holds expressions behind shared references, so
//! the instance sits behind a mutex ([`SharedFunction`]); a batch's calls are sequential.

use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::DataType;
use wasmtime::component::HasSelf;

use super::bindings::scalar_function::{self, exports::weir::plugin::scalar};
use super::convert;
use super::engine::{LoadedPlugin, PluginEngine};
use super::error::PluginError;
use super::instance::{Live, PluginOptions, PluginUsage, Runtime, wit_info};
use super::state::{BatchInfo, HostState};
use crate::failpoint::Phase;

/// A function as the pipeline file declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionSignature {
    /// The SQL name, lower case.
    pub name: String,
    /// The types the arguments are cast to.
    pub arguments: Vec<DataType>,
    /// The type of the result.
    pub returns: DataType,
}

/// A live scalar-function plugin.
pub struct WasmFunction {
    rt: Runtime,
    pre: scalar_function::ScalarFunctionPre<HostState>,
    signatures: Vec<FunctionSignature>,
    declared: Vec<scalar::Signature>,
    live: Option<Live<scalar_function::ScalarFunction>>,
}

impl std::fmt::Debug for WasmFunction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmFunction")
            .field("plugin", &self.rt.plugin)
            .field("signatures", &self.signatures)
            .finish_non_exhaustive()
    }
}

impl WasmFunction {
    /// Instantiates the plugin and opens it with its config and the functions the pipeline
    /// declares from it.
    ///
    /// # Errors
    /// When the component is not of world `scalar-function`, a declared type is one the WIT
    /// does not carry, it traps while starting, or it refuses the declarations.
    pub fn open(
        engine: &PluginEngine,
        plugin: LoadedPlugin,
        options: PluginOptions,
        signatures: Vec<FunctionSignature>,
    ) -> Result<Self, PluginError> {
        let wit_type = |name: &str, t: &DataType| {
            convert::wit_type(t).ok_or_else(|| PluginError::UnsupportedType {
                plugin: options.name.clone(),
                column: name.to_owned(),
                data_type: t.to_string(),
            })
        };
        let declared = signatures
            .iter()
            .map(|s| {
                Ok(scalar::Signature {
                    name: s.name.clone(),
                    arguments: s
                        .arguments
                        .iter()
                        .enumerate()
                        .map(|(i, t)| wit_type(&format!("{}() argument {i}", s.name), t))
                        .collect::<Result<_, PluginError>>()?,
                    returns: wit_type(&format!("{}() result", s.name), &s.returns)?,
                })
            })
            .collect::<Result<Vec<_>, PluginError>>()?;
        let rt = Runtime::new(engine, plugin, options);
        let mut linker = rt.linker()?;
        scalar_function::ScalarFunction::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(|e| rt.err_instantiate(format!("{e:#}")))?;
        let pre = linker
            .instantiate_pre(&rt.plugin.component)
            .and_then(scalar_function::ScalarFunctionPre::new)
            .map_err(|e| rt.err_instantiate(format!("not a Weir scalar-function plugin: {e:#}")))?;
        let mut this = Self {
            rt,
            pre,
            signatures,
            declared,
            live: None,
        };
        this.start()?;
        Ok(this)
    }

    fn start(&mut self) -> Result<(), PluginError> {
        let (live, ()) = self.rt.start(
            |store| self.pre.instantiate(store),
            |bindings: &scalar_function::ScalarFunction, store, config| {
                bindings
                    .weir_plugin_scalar()
                    .call_open(store, config, &self.declared)
            },
        )?;
        self.live = Some(live);
        Ok(())
    }

    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.rt.options.name
    }

    /// The plugin's content hash.
    pub fn sha256(&self) -> &str {
        &self.rt.plugin.sha256
    }

    /// Calls and resources used so far.
    pub fn usage(&self) -> &PluginUsage {
        &self.rt.usage
    }

    /// Calls function `name` on `args` (one column per argument, of the declared types).
    ///
    /// # Errors
    /// The plugin's own error, a trap, a limit, or a result that is not one value per row of
    /// the declared type; the instance is replaced after anything but the plugin's own error.
    pub fn call(
        &mut self,
        name: &str,
        args: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<ArrayRef, PluginError> {
        let plugin = self.rt.options.name.clone();
        let malformed = |reason: String| PluginError::MalformedOutput {
            plugin: plugin.clone(),
            batch_id: info.batch_id,
            reason,
        };
        let Some(returns) = self
            .signatures
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.returns.clone())
        else {
            return Err(malformed(format!(
                "{name}() is not one of its declared functions"
            )));
        };
        if self.live.is_none() {
            self.start()?;
        }
        let column = self.rt.call(
            &mut self.live,
            args,
            info,
            Phase::InTransform,
            |bindings: &scalar_function::ScalarFunction, store, rep| {
                bindings
                    .weir_plugin_scalar()
                    .call_call(store, name, &wit_info(info), rep)
            },
        )?;
        let (_, array) = convert::arrow_column(column, args.num_rows(), Some(&returns))
            .map_err(|reason| malformed(format!("{name}() returned a bad column: {reason}")))?;
        if array.data_type() != &returns {
            return Err(malformed(format!(
                "{name}() returned {} values, it is declared to return {returns}",
                array.data_type()
            )));
        }
        Ok(array)
    }
}

/// A [`WasmFunction`] that SQL expressions call through a shared reference.
#[derive(Debug)]
pub struct SharedFunction(Mutex<WasmFunction>);

impl SharedFunction {
    pub fn new(function: WasmFunction) -> Arc<Self> {
        Arc::new(Self(Mutex::new(function)))
    }

    /// The plugin's name, build and usage, for progress.
    pub fn usage(&self) -> (String, String, PluginUsage) {
        let f = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        (
            f.name().to_owned(),
            f.sha256().to_owned(),
            f.usage().clone(),
        )
    }
}

impl crate::sql::PluginCall for SharedFunction {
    fn call(
        &self,
        name: &str,
        args: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<ArrayRef, Box<dyn std::error::Error + Send + Sync>> {
        let mut f = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f.call(name, args, info).map_err(Into::into)
    }
}
