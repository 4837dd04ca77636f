//! Scalar functions for a pipeline's SQL (WIT world `scalar-function`, cargo feature
//! `scalar-function`): the pipeline file declares each function with `[[function]]` (its SQL name,
//! argument types and result type), and SQL calls it by name, once per batch with the arguments
//! as columns, never once per row.
//!
//! ```
//! use weir_plugin_sdk::{
//!     Batch, BatchInfo, Column, DataType, PluginError, ScalarFunctions, Signature,
//! };
//!
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct NoConfig {}
//!
//! /// `double(x BIGINT) -> BIGINT`
//! struct Double;
//!
//! impl ScalarFunctions for Double {
//!     type Config = NoConfig;
//!     fn new(_config: NoConfig, functions: &[Signature]) -> Result<Self, PluginError> {
//!         for f in functions {
//!             f.expect("double", &[DataType::Int64], DataType::Int64)?;
//!         }
//!         Ok(Self)
//!     }
//!     fn call(&mut self, _name: &str, args: &Batch<'_>, _info: &BatchInfo) -> Result<Column, PluginError> {
//!         let x = args.column_at(0)?;
//!         let values = (0..args.num_rows()).map(|i| x.i64(i).unwrap_or(0).wrapping_mul(2)).collect();
//!         Ok(Column::int64("double", values, x.validity.clone()))
//!     }
//! }
//! weir_plugin_sdk::export_scalar_function!(Double);
//!
//! # use weir_plugin_sdk::testing::{MemoryBatch, call_function};
//! let double = [Signature::new("double", vec![DataType::Int64], DataType::Int64)];
//! let args = MemoryBatch::new(vec![Column::int64("x", vec![1, 2, 3], None)]);
//! let out = call_function::<Double>("{}", &double, "double", &args).unwrap();
//! assert_eq!(out.i64(2), Some(6));
//! ```

use crate::batch::{Batch, BatchInfo};
use crate::column::Column;
use crate::error::PluginError;
use crate::schema::DataType;

/// A function as the pipeline file declares it: its SQL name, the types its arguments are cast to
/// before the call, and the type of its result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Signature {
    /// The function's name in SQL.
    pub name: String,
    /// The argument types, in order: column `i` of the call's batch has type `arguments[i]`.
    pub arguments: Vec<DataType>,
    /// The type of the column the call returns.
    pub returns: DataType,
}

impl Signature {
    /// The signature `name(arguments...) -> returns`.
    pub fn new(name: impl Into<String>, arguments: Vec<DataType>, returns: DataType) -> Self {
        Self {
            name: name.into(),
            arguments,
            returns,
        }
    }

    /// Checks that this declaration is the function `name(arguments...) -> returns`, which is
    /// what a plugin implementing exactly that function does for each declared signature in
    /// [`ScalarFunctions::new`].
    ///
    /// # Errors
    /// [`PluginError::invalid_config`] naming the declared function: another name (`this plugin
    /// has no function `x``), or other argument or result types (both signatures quoted).
    pub fn expect(
        &self,
        name: &str,
        arguments: &[DataType],
        returns: DataType,
    ) -> Result<(), PluginError> {
        if self.name != name {
            return Err(PluginError::invalid_config(format!(
                "function `{}`: this plugin has no function of that name (it implements `{name}`)",
                self.name
            )));
        }
        if self.arguments != arguments || self.returns != returns {
            let wanted = Signature::new(name, arguments.to_vec(), returns);
            return Err(PluginError::invalid_config(format!(
                "function `{}` is declared as {self}, the plugin implements {wanted}",
                self.name
            )));
        }
        Ok(())
    }
}

/// `count_char(utf8, utf8) -> int32`
impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}(", self.name)?;
        for (i, argument) in self.arguments.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{argument}")?;
        }
        write!(f, ") -> {}", self.returns)
    }
}

/// A component of scalar functions: opened once per instance with the functions the pipeline
/// declares from it, then called once per batch and function with the arguments as columns.
///
/// One value of the type lives per plugin instance, from `new` (the host's `open`) on. A function
/// should be pure: a replayed batch must give the same result (use `info.timestamp_micros` as the
/// clock and [`crate::random_u64`] for randomness if it needs either).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a set of Weir scalar functions",
    label = "this type does not implement `weir_plugin_sdk::ScalarFunctions`",
    note = "add `impl weir_plugin_sdk::ScalarFunctions for {Self} {{ type Config = ...; fn new(...); fn call(...) }}`"
)]
pub trait ScalarFunctions: Sized + 'static {
    /// The plugin's `config` from the pipeline file, deserialised from JSON.
    type Config: serde::de::DeserializeOwned;

    /// Creates the instance for the declared `functions` (each declared once).
    ///
    /// # Errors
    /// [`PluginError::invalid_config`] naming the function for a declaration the plugin cannot
    /// serve: a name it does not implement, argument or result types it cannot take
    /// ([`Signature::expect`] checks one fixed signature).
    fn new(config: Self::Config, functions: &[Signature]) -> Result<Self, PluginError>;

    /// Calls function `name` on one batch of arguments: column `i` of `args` is argument `i`, of
    /// the declared type (a constant argument arrives as a column of one repeated value).
    /// Returns one value per row of `args`, of the declared result type; its name is ignored.
    ///
    /// # Errors
    /// Any [`PluginError`] (`.at_row(i)` when one row is to blame); [`PluginError::retryable`]
    /// lets the host retry the batch.
    fn call(
        &mut self,
        name: &str,
        args: &Batch<'_>,
        info: &BatchInfo,
    ) -> Result<Column, PluginError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn expect_names_the_function_and_both_signatures() {
        let declared = Signature::new("f", vec![DataType::Utf8], DataType::Int64);
        assert_eq!(declared.to_string(), "f(utf8) -> int64");
        assert!(
            declared
                .expect("f", &[DataType::Utf8], DataType::Int64)
                .is_ok()
        );
        let e = declared
            .expect("g", &[DataType::Utf8], DataType::Int64)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert_eq!(
            e.message,
            "function `f`: this plugin has no function of that name (it implements `g`)"
        );
        let e = declared
            .expect("f", &[DataType::Utf8, DataType::Utf8], DataType::Int32)
            .unwrap_err();
        assert_eq!(
            e.message,
            "function `f` is declared as f(utf8) -> int64, the plugin implements \
             f(utf8, utf8) -> int32"
        );
    }
}
