//! Runs plugin logic natively, the way the host runs it, so that authors test with `cargo test`
//! and plain Rust values instead of building a component for every change.
//!
//! [`run_transform`] applies a transform's [`Output`] exactly as the host does (set columns,
//! then drop columns, then keep rows) and checks what the host checks, so a test that passes here
//! fails in the host only for boundary reasons. [`call_function`] does the same for a scalar
//! function: it checks the arguments against the declared signature and the result as the host
//! checks it.

use crate::batch::{Batch, BatchInfo};
use crate::column::Column;
use crate::error::{PluginError, parse_config};
use crate::function::{ScalarFunctions, Signature};
use crate::host::Level;
use crate::output::{Edit, Output, Selection};
use crate::schema::Schema;
use crate::{Sink, Transform};

/// A batch held in memory: what native tests hand to plugins.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemoryBatch {
    columns: Vec<Column>,
    rows: usize,
    ipc: Option<Vec<u8>>,
}

impl MemoryBatch {
    /// A batch of `columns`, which must all have the same length.
    ///
    /// # Panics
    /// When the columns are inconsistent (see [`MemoryBatch::try_new`]); meant for tests.
    pub fn new(columns: Vec<Column>) -> Self {
        match Self::try_new(columns) {
            Ok(batch) => batch,
            Err(e) => panic!("MemoryBatch::new: {e}"),
        }
    }

    /// A batch of `columns`.
    ///
    /// # Errors
    /// [`PluginError::fatal`] naming the first column whose length, type or validity disagrees.
    pub fn try_new(columns: Vec<Column>) -> Result<Self, PluginError> {
        let rows = columns.first().map_or(0, Column::len);
        for column in &columns {
            column.validate(rows)?;
        }
        Ok(Self {
            columns,
            rows,
            ipc: None,
        })
    }

    /// This batch, answering [`Batch::to_ipc`] with `bytes`.
    #[must_use]
    pub fn with_ipc(mut self, bytes: Vec<u8>) -> Self {
        self.ipc = Some(bytes);
        self
    }

    /// Number of rows.
    pub fn num_rows(&self) -> usize {
        self.rows
    }

    /// The schema (a column is nullable when it has a validity bitmap).
    pub fn schema(&self) -> Schema {
        Schema::new(self.columns.iter().map(Column::field).collect())
    }

    /// The columns, in order.
    pub fn columns(&self) -> &[Column] {
        &self.columns
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The IPC bytes given with [`MemoryBatch::with_ipc`].
    pub fn ipc(&self) -> Option<&[u8]> {
        self.ipc.as_deref()
    }

    /// This batch with `edit` applied as the host applies it: each set column replaces the column
    /// of its name in place or is appended, then the dropped columns go, then the rows are selected.
    ///
    /// # Errors
    /// [`PluginError::fatal`] naming the offending column or selection (a wrong length, a dropped
    /// column that does not exist, a mask too short, indices not ascending or out of range).
    pub fn apply(&self, edit: &Edit) -> Result<MemoryBatch, PluginError> {
        let rows = self.rows;
        let mut columns = self.columns.clone();
        for column in &edit.set_columns {
            column.validate(rows)?;
            match columns.iter_mut().find(|c| c.name == column.name) {
                Some(existing) => *existing = column.clone(),
                None => columns.push(column.clone()),
            }
        }
        for name in &edit.drop_columns {
            let before = columns.len();
            columns.retain(|c| &c.name != name);
            if columns.len() == before {
                return Err(PluginError::fatal(format!(
                    "drop-columns names `{name}`, which the batch does not have"
                )));
            }
        }
        let kept_rows = match &edit.keep {
            None => None,
            Some(selection) => Some(selected_rows(selection, rows)?),
        };
        let (columns, rows) = match kept_rows {
            None => (columns, rows),
            Some(kept) => {
                let taken = columns
                    .iter()
                    .map(|c| c.take(&kept))
                    .collect::<Result<Vec<_>, _>>()?;
                (taken, kept.len())
            }
        };
        Ok(MemoryBatch {
            columns,
            rows,
            ipc: None,
        })
    }
}

fn selected_rows(selection: &Selection, rows: usize) -> Result<Vec<usize>, PluginError> {
    match selection {
        Selection::Mask(mask) => {
            if mask.as_bytes().len() < rows.div_ceil(8) {
                return Err(PluginError::fatal(format!(
                    "the keep mask has {} bytes, a batch of {rows} rows needs {}",
                    mask.as_bytes().len(),
                    rows.div_ceil(8)
                )));
            }
            Ok((0..rows).filter(|&i| mask.get(i)).collect())
        }
        Selection::Indices(indices) => {
            let mut previous: Option<u32> = None;
            for &i in indices {
                if (i as usize) >= rows || previous.is_some_and(|p| p >= i) {
                    return Err(PluginError::fatal(format!(
                        "keep index {i} is out of range or not ascending (batch of {rows} rows)"
                    )));
                }
                previous = Some(i);
            }
            Ok(indices.iter().map(|&i| i as usize).collect())
        }
    }
}

/// Opens transform `T` with `config_json` on `batch`'s schema and returns what `process` returns,
/// unapplied (for IPC outputs, or to inspect the edit itself).
///
/// # Errors
/// The plugin's error from `Config` deserialisation, `new`, `output_schema` or `process`.
pub fn transform_output<T: Transform>(
    config_json: &str,
    batch: &MemoryBatch,
) -> Result<Output, PluginError> {
    let schema = batch.schema();
    let mut transform = T::new(parse_config(config_json)?, &schema)?;
    transform.output_schema(&schema)?;
    transform.process(&Batch::from_memory(batch), &BatchInfo::new(0))
}

/// Runs transform `T` on `batch` as the host would (config → `new` → `output_schema` →
/// `process` as batch 0 → apply the output) and returns the output batch.
///
/// # Errors
/// The plugin's own error; or [`PluginError::fatal`] when the output is malformed (see
/// [`MemoryBatch::apply`]), when its columns' names and types differ from `output_schema`, or when
/// it is IPC bytes (which this harness cannot decode: use [`transform_output`]).
pub fn run_transform<T: Transform>(
    config_json: &str,
    batch: &MemoryBatch,
) -> Result<MemoryBatch, PluginError> {
    let schema = batch.schema();
    let mut transform = T::new(parse_config(config_json)?, &schema)?;
    let declared = transform.output_schema(&schema)?;
    let output = transform.process(&Batch::from_memory(batch), &BatchInfo::new(0))?;
    let result = match output {
        Output::Edit(edit) => batch.apply(&edit)?,
        Output::Ipc(_) => {
            return Err(PluginError::fatal(
                "run_transform cannot decode an IPC output natively; use testing::transform_output",
            ));
        }
    };
    let shape = |s: &Schema| -> Vec<(String, crate::DataType)> {
        s.fields()
            .iter()
            .map(|f| (f.name.clone(), f.data_type))
            .collect()
    };
    let actual = result.schema();
    if shape(&actual) != shape(&declared) {
        return Err(PluginError::fatal(format!(
            "the output's columns {:?} differ from output_schema {:?}",
            shape(&actual),
            shape(&declared)
        )));
    }
    Ok(result)
}

/// Opens sink `S` with `config_json` on the first batch's schema (empty when there is none) and
/// writes every batch in order: one instance's life, as the host runs it. Call it again for a
/// restarted instance.
///
/// # Errors
/// The plugin's first error.
pub fn run_sink<S: Sink>(
    config_json: &str,
    batches: &[(BatchInfo, MemoryBatch)],
) -> Result<(), PluginError> {
    let schema = batches.first().map(|(_, b)| b.schema()).unwrap_or_default();
    let mut sink = S::new(parse_config(config_json)?, &schema)?;
    for (info, batch) in batches {
        sink.write_batch(&Batch::from_memory(batch), info)?;
    }
    Ok(())
}

/// Opens scalar functions `F` with `config_json` and the declared `functions`, then calls function
/// `name` on the argument columns of `args` as batch 0 and returns the result, checked as the host
/// checks it. Construct `F` with [`ScalarFunctions::new`] yourself to call it on several batches.
///
/// # Errors
/// The plugin's own error from `Config` deserialisation, `new` or `call`; or
/// [`PluginError::fatal`] when `name` is not among `functions`, when `args` does not have the
/// declared argument types (the host casts them before the call), or when the result does not
/// have one value per row of `args` of the declared result type.
pub fn call_function<F: ScalarFunctions>(
    config_json: &str,
    functions: &[Signature],
    name: &str,
    args: &MemoryBatch,
) -> Result<Column, PluginError> {
    let signature = functions.iter().find(|f| f.name == name).ok_or_else(|| {
        PluginError::fatal(format!(
            "call_function: `{name}` is not among the declared functions"
        ))
    })?;
    let given: Vec<crate::DataType> = args.columns().iter().map(|c| c.data_type).collect();
    if given != signature.arguments {
        return Err(PluginError::fatal(format!(
            "call_function: {signature} called with arguments {given:?}"
        )));
    }
    let mut plugin = F::new(parse_config(config_json)?, functions)?;
    let result = plugin.call(name, &Batch::from_memory(args), &BatchInfo::new(0))?;
    result.validate(args.num_rows())?;
    if result.data_type != signature.returns {
        return Err(PluginError::fatal(format!(
            "function `{name}` returned a {} column, it is declared {signature}",
            result.data_type
        )));
    }
    Ok(result)
}

/// The messages plugins logged on this thread since the last call (natively, `log` records them
/// instead of printing).
pub fn take_logs() -> Vec<(Level, String)> {
    log_imp::take_records()
}

/// Calls `hook` on every later `log` on this thread (after recording it). A hook that panics
/// simulates the process dying inside that host call: catch it with `std::panic::catch_unwind`.
pub fn on_log(hook: impl Fn(Level, &str) + 'static) {
    log_imp::set_hook(Some(Box::new(hook)));
}

/// Removes the hook set by [`on_log`].
pub fn clear_log_hook() {
    log_imp::set_hook(None);
}

/// Restarts this thread's native `random_u64` sequence from `seed` (0 selects the default seed).
pub fn reset_random(seed: u64) {
    log_imp::reset_random(seed);
}

/// Sets the watermark (µs) that native [`crate::state`] calls see, and removes the entries it
/// expired, as the host does between batches.
#[cfg(not(target_arch = "wasm32"))]
pub fn set_state_watermark(micros: i64) {
    crate::state::imp::set_watermark(micros);
}

/// How many entries native [`crate::state`] holds on this thread (expired ones included until
/// [`set_state_watermark`] removes them).
#[cfg(not(target_arch = "wasm32"))]
pub fn state_len() -> usize {
    crate::state::imp::len()
}

/// Empties native [`crate::state`] on this thread and resets its watermark to 0, as a new query.
#[cfg(not(target_arch = "wasm32"))]
pub fn reset_state() {
    crate::state::imp::clear();
}

#[cfg(not(all(
    target_arch = "wasm32",
    any(feature = "transform", feature = "sink", feature = "scalar-function")
)))]
use crate::host::imp as log_imp;

/// In the guest there is nothing to record: these are inert.
#[cfg(all(
    target_arch = "wasm32",
    any(feature = "transform", feature = "sink", feature = "scalar-function")
))]
mod log_imp {
    use crate::host::{Level, LogHook};

    pub(super) fn take_records() -> Vec<(Level, String)> {
        Vec::new()
    }
    pub(super) fn set_hook(_hook: Option<LogHook>) {}
    pub(super) fn reset_random(_seed: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bitmap::Bitmap;

    fn orders() -> MemoryBatch {
        MemoryBatch::new(vec![
            Column::int64("id", vec![1, 2, 3, 4], None),
            Column::utf8_from_iter("status", [Some("a"), None, Some("b"), Some("c")]),
        ])
    }

    #[test]
    fn apply_sets_drops_then_selects() {
        let batch = orders();
        let edit = Output::edit()
            .set_column(Column::int64("id", vec![10, 20, 30, 40], None))
            .set_column(Column::float64("x", vec![0.5; 4], None))
            .drop_column("status")
            .keep(Selection::indices(vec![1, 3]));
        let out = batch.apply(&edit).unwrap();
        assert_eq!(out.num_rows(), 2);
        let names: Vec<&str> = out.columns().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "x"]);
        assert_eq!(
            out.column("id").unwrap().values,
            crate::Values::Int64(vec![20, 40])
        );
    }

    #[test]
    fn apply_rejects_what_the_host_rejects() {
        let batch = orders();
        let e = batch
            .apply(&Output::edit().drop_column("nope"))
            .unwrap_err();
        assert_eq!(
            e.message,
            "drop-columns names `nope`, which the batch does not have"
        );
        let e = batch
            .apply(&Output::edit().set_column(Column::int64("y", vec![1], None)))
            .unwrap_err();
        assert_eq!(e.message, "column `y` has 1 rows, the batch has 4");
        let e = batch
            .apply(&Output::edit().keep(Selection::indices(vec![2, 1])))
            .unwrap_err();
        assert!(
            e.message
                .contains("keep index 1 is out of range or not ascending"),
            "{e}"
        );
        let e = batch
            .apply(&Output::edit().keep(Selection::mask(Bitmap::from_bytes(vec![], 0))))
            .unwrap_err();
        assert!(e.message.contains("the keep mask has 0 bytes"), "{e}");
    }

    /// `len(s STRING) -> INT`, and `len_wrong` that returns a BIGINT in spite of its declaration.
    struct Len;

    impl ScalarFunctions for Len {
        type Config = std::collections::BTreeMap<String, String>;
        fn new(_config: Self::Config, functions: &[Signature]) -> Result<Self, PluginError> {
            for f in functions {
                if f.name != "len_wrong" {
                    f.expect("len", &[crate::DataType::Utf8], crate::DataType::Int32)?;
                }
            }
            Ok(Self)
        }
        fn call(
            &mut self,
            name: &str,
            args: &Batch<'_>,
            _info: &BatchInfo,
        ) -> Result<Column, PluginError> {
            let s = args.column_at(0)?;
            let lengths = (0..args.num_rows()).map(|i| s.str(i).map_or(0, str::len));
            Ok(if name == "len_wrong" {
                Column::int64(
                    "r",
                    lengths
                        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
                        .collect(),
                    None,
                )
            } else {
                Column::int32(
                    "r",
                    lengths
                        .map(|n| i32::try_from(n).unwrap_or(i32::MAX))
                        .collect(),
                    s.validity.clone(),
                )
            })
        }
    }

    #[test]
    fn call_function_checks_arguments_and_result() {
        let len = Signature::new("len", vec![crate::DataType::Utf8], crate::DataType::Int32);
        let args = MemoryBatch::new(vec![Column::utf8_from_iter(
            "s",
            [Some("ab"), None, Some("")],
        )]);
        let out = call_function::<Len>("", std::slice::from_ref(&len), "len", &args).unwrap();
        assert_eq!(out.values, crate::Values::Int32(vec![2, 0, 0]));
        assert_eq!(out.null_count(), 1);

        let e = call_function::<Len>("", std::slice::from_ref(&len), "nope", &args).unwrap_err();
        assert_eq!(
            e.message,
            "call_function: `nope` is not among the declared functions"
        );
        let ints = MemoryBatch::new(vec![Column::int64("n", vec![1], None)]);
        let e = call_function::<Len>("", std::slice::from_ref(&len), "len", &ints).unwrap_err();
        assert_eq!(
            e.message,
            "call_function: len(utf8) -> int32 called with arguments [Int64]"
        );
        let wrong = Signature::new(
            "len_wrong",
            vec![crate::DataType::Utf8],
            crate::DataType::Int32,
        );
        let e = call_function::<Len>("", &[wrong], "len_wrong", &args).unwrap_err();
        assert_eq!(
            e.message,
            "function `len_wrong` returned a int64 column, it is declared \
             len_wrong(utf8) -> int32"
        );
        let bigint = Signature::new("len", vec![crate::DataType::Utf8], crate::DataType::Int64);
        let e = call_function::<Len>("", &[bigint], "len", &args).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::InvalidConfig);
    }

    #[test]
    fn memory_batch_rejects_ragged_columns() {
        let e = MemoryBatch::try_new(vec![
            Column::int64("a", vec![1, 2], None),
            Column::int64("b", vec![1], None),
        ])
        .unwrap_err();
        assert_eq!(e.message, "column `b` has 1 rows, the batch has 2");
    }
}
