//! The functions a transform's SQL can call, by lower-case name.
//!
//! Spark's versions win: `datafusion-spark`'s functions are added after
//! DataFusion's and replace those of the same name. The clock functions are
//! Weir's own, because DataFusion's `now()` reads the wall clock at planning
//! time: here they read the batch timestamp at evaluation, so a replayed batch
//! computes the same values as its first run.

use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch, RecordBatchOptions, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use datafusion_common::cast::as_string_array;
use datafusion_common::{DataFusionError, Result as DfResult, ScalarValue, exec_err};
use datafusion_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::plugin::BatchInfo;

/// The time zone of timestamps Weir's decoders produce.
pub(crate) const UTC_OFFSET: &str = "+00:00";

/// The scalar functions, and the names of aggregate and window functions
/// (which a transform refuses with a pointer to where they belong).
pub(crate) struct Functions {
    scalar: HashMap<String, Arc<ScalarUDF>>,
    aggregate: BTreeSet<String>,
}

impl Functions {
    /// Every built-in function, with the clock functions reading `clock` (µs since the epoch).
    pub(crate) fn new(clock: &BatchClock) -> Self {
        Self::with_plugins(clock, &[])
    }

    /// The built-in functions and the plugins' (`[[function]]`), which read the batch they are
    /// called for from `clock`. A plugin's function never replaces a built-in one: validation
    /// refuses such a name.
    pub(crate) fn with_plugins(clock: &BatchClock, plugins: &[PluginFunction]) -> Self {
        let mut scalar = HashMap::new();
        let mut add = |f: Arc<ScalarUDF>| {
            for name in std::iter::once(f.name()).chain(f.aliases().iter().map(String::as_str)) {
                scalar.insert(name.to_ascii_lowercase(), Arc::clone(&f));
            }
        };
        datafusion_functions::all_default_functions()
            .into_iter()
            .for_each(&mut add);
        datafusion_spark::all_default_scalar_functions()
            .into_iter()
            .for_each(&mut add);
        for kind in [
            ClockKind::Timestamp("current_timestamp"),
            ClockKind::Timestamp("now"),
            ClockKind::Date("current_date"),
            ClockKind::Date("curdate"),
        ] {
            add(Arc::new(ScalarUDF::new_from_impl(ClockFunction::new(
                kind,
                clock.clone(),
            ))));
        }
        add(Arc::new(ScalarUDF::new_from_impl(GetJsonObject::new())));
        // Spark's round with Spark's result type for decimals (DataFusion's keeps the scale).
        if let Some(inner) = datafusion_spark::all_default_scalar_functions()
            .into_iter()
            .find(|f| f.name() == "round")
        {
            add(Arc::new(ScalarUDF::new_from_impl(DecimalRound { inner })));
        }
        add(Arc::new(ScalarUDF::new_from_impl(SparkRegex::new(
            RegexKind::Replace,
        ))));
        add(Arc::new(ScalarUDF::new_from_impl(SparkRegex::new(
            RegexKind::Extract,
        ))));
        for f in plugins {
            add(Arc::new(ScalarUDF::new_from_impl(WasmScalar::new(
                f.clone(),
                clock.clone(),
            ))));
        }
        let aggregate = datafusion_functions_aggregate::all_default_aggregate_functions()
            .iter()
            .flat_map(|f| std::iter::once(f.name().to_owned()).chain(f.aliases().iter().cloned()))
            .chain(
                // Spark's aggregates that DataFusion spells otherwise or lacks.
                [
                    "count_if",
                    "collect_list",
                    "collect_set",
                    "first",
                    "last",
                    "any_value",
                    "bool_and",
                    "bool_or",
                    "every",
                    "some",
                    "max_by",
                    "min_by",
                    "percentile",
                    "percentile_approx",
                    "approx_count_distinct",
                    "try_avg",
                    "try_sum",
                ]
                .into_iter()
                .map(str::to_owned),
            )
            .map(|n| n.to_ascii_lowercase())
            .collect();
        Self { scalar, aggregate }
    }

    /// The scalar function called `name` (any case).
    pub(crate) fn scalar(&self, name: &str) -> Option<Arc<ScalarUDF>> {
        self.scalar.get(&name.to_ascii_lowercase()).cloned()
    }

    /// Whether `name` (any case) is an aggregate function.
    pub(crate) fn is_aggregate(&self, name: &str) -> bool {
        self.aggregate.contains(&name.to_ascii_lowercase())
    }

    /// Every scalar function's name, for "did you mean".
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.scalar.keys().map(String::as_str)
    }
}

/// The batch the functions are evaluated for, set before each batch: its timestamp for the
/// clock functions, the whole of it for plugins' functions.
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchClock(Arc<AtomicI64>, Arc<Mutex<Option<BatchInfo>>>);

impl BatchClock {
    /// Before evaluating a batch.
    pub(crate) fn begin(&self, info: &BatchInfo) {
        self.0.store(info.timestamp_micros, Ordering::Relaxed);
        *self.1.lock().unwrap_or_else(PoisonError::into_inner) = Some(info.clone());
    }

    fn micros(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    fn info(&self) -> Option<BatchInfo> {
        self.1
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// Calls a plugin's scalar function on one batch of arguments (`plugin::WasmFunction`).
pub trait PluginCall: Send + Sync + std::fmt::Debug {
    /// `args` holds one column per argument, of the declared types; the result has one value
    /// per row of `args`, of the declared type.
    ///
    /// # Errors
    /// The plugin's failure (its own error, a limit, a malformed result), which fails the batch.
    fn call(
        &self,
        name: &str,
        args: &RecordBatch,
        info: &BatchInfo,
    ) -> Result<ArrayRef, Box<dyn std::error::Error + Send + Sync>>;
}

/// A plugin's scalar function as SQL sees it: its name and types, and the instance that
/// computes it (`None` in validation, which plans but never evaluates).
#[derive(Debug, Clone)]
pub struct PluginFunction {
    /// The SQL name, lower case.
    pub name: String,
    pub arguments: Vec<DataType>,
    pub returns: DataType,
    pub call: Option<Arc<dyn PluginCall>>,
}

impl PluginFunction {
    /// The functions the pipeline file declares, for planning without their plugins.
    pub fn declared(specs: &[crate::spec::FunctionSpec]) -> Vec<Self> {
        specs
            .iter()
            .map(|f| Self {
                name: f.name.clone(),
                arguments: f.arguments.clone(),
                returns: f.returns.clone(),
                call: None,
            })
            .collect()
    }
}

/// A plugin's function: its arguments cast to the declared types and handed over as one batch,
/// one call per batch (a constant argument becomes a column of one repeated value).
#[derive(Debug)]
struct WasmScalar {
    function: PluginFunction,
    signature: Signature,
    clock: BatchClock,
}

impl WasmScalar {
    fn new(function: PluginFunction, clock: BatchClock) -> Self {
        // Volatile: a call with constant arguments is not folded at planning time, when there
        // is no batch to call the plugin for.
        let signature = if function.arguments.is_empty() {
            Signature::nullary(Volatility::Volatile)
        } else {
            Signature::exact(function.arguments.clone(), Volatility::Volatile)
        };
        Self {
            function,
            signature,
            clock,
        }
    }
}

impl PartialEq for WasmScalar {
    fn eq(&self, other: &Self) -> bool {
        self.function.name == other.function.name && Arc::ptr_eq(&self.clock.1, &other.clock.1)
    }
}

impl Eq for WasmScalar {}

impl Hash for WasmScalar {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.function.name.hash(state);
    }
}

impl ScalarUDFImpl for WasmScalar {
    fn name(&self) -> &str {
        &self.function.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(self.function.returns.clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let name = &self.function.name;
        let Some(call) = &self.function.call else {
            return exec_err!("{name}() is declared, but its plugin is not running");
        };
        let Some(info) = self.clock.info() else {
            return exec_err!("{name}() was called outside a batch");
        };
        let rows = args.number_rows;
        let mut fields = Vec::with_capacity(args.args.len());
        let mut columns = Vec::with_capacity(args.args.len());
        for (i, (value, declared)) in args.args.iter().zip(&self.function.arguments).enumerate() {
            let mut array = value.to_array(rows)?;
            if array.data_type() != declared {
                array = arrow_cast::cast(&array, declared)?;
            }
            fields.push(Field::new(format!("arg{i}"), declared.clone(), true));
            columns.push(array);
        }
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?;
        let out = call
            .call(name, &batch, &info)
            .map_err(DataFusionError::External)?;
        Ok(ColumnarValue::Array(out))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ClockKind {
    /// A timestamp (µs, UTC), as Spark's `current_timestamp()`.
    Timestamp(&'static str),
    /// The UTC date, as Spark's `current_date()` with the session zone UTC.
    Date(&'static str),
}

/// `current_timestamp()`, `now()`, `current_date()`: the batch's timestamp,
/// the same for every row of the batch and for every attempt of it.
#[derive(Debug)]
struct ClockFunction {
    kind: ClockKind,
    signature: Signature,
    clock: BatchClock,
}

impl ClockFunction {
    fn new(kind: ClockKind, clock: BatchClock) -> Self {
        Self {
            kind,
            // Volatile: never folded into a constant at planning time.
            signature: Signature::nullary(Volatility::Volatile),
            clock,
        }
    }
}

impl PartialEq for ClockFunction {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && Arc::ptr_eq(&self.clock.0, &other.clock.0)
    }
}

impl Eq for ClockFunction {}

impl Hash for ClockFunction {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
    }
}

impl ScalarUDFImpl for ClockFunction {
    fn name(&self) -> &str {
        match self.kind {
            ClockKind::Timestamp(name) | ClockKind::Date(name) => name,
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(match self.kind {
            ClockKind::Timestamp(_) => {
                DataType::Timestamp(TimeUnit::Microsecond, Some(UTC_OFFSET.into()))
            }
            ClockKind::Date(_) => DataType::Date32,
        })
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let micros = self.clock.micros();
        Ok(ColumnarValue::Scalar(match self.kind {
            ClockKind::Timestamp(_) => {
                ScalarValue::TimestampMicrosecond(Some(micros), Some(UTC_OFFSET.into()))
            }
            ClockKind::Date(_) => {
                let days = micros.div_euclid(86_400_000_000);
                ScalarValue::Date32(Some(i32::try_from(days).unwrap_or(i32::MAX)))
            }
        }))
    }
}

/// Spark's `get_json_object(json, path)`: the value at a JSONPath (`$`,
/// `.name`, `['name']`, `[index]`) as a string, JSON text for objects and
/// arrays; NULL when the text is not JSON, the path does not match, or
/// either argument is NULL.
#[derive(Debug, PartialEq, Eq, Hash)]
struct GetJsonObject {
    signature: Signature,
}

impl GetJsonObject {
    fn new() -> Self {
        Self {
            signature: Signature::exact(
                vec![DataType::Utf8, DataType::Utf8],
                Volatility::Immutable,
            ),
        }
    }
}

impl ScalarUDFImpl for GetJsonObject {
    fn name(&self) -> &str {
        "get_json_object"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let [json, path] = args.args.as_slice() else {
            return exec_err!("get_json_object takes two arguments: the JSON text and a path");
        };
        // A constant path (the usual case) is parsed once per batch.
        let constant = match path {
            ColumnarValue::Scalar(s) => Some(match s {
                ScalarValue::Utf8(Some(p)) => parse_json_path(p),
                _ => None,
            }),
            ColumnarValue::Array(_) => None,
        };
        let json = json.to_array(rows)?;
        let json = as_string_array(&json)?;
        let paths = match (&constant, path) {
            (None, p) => Some(p.to_array(rows)?),
            _ => None,
        };
        let paths = paths.as_ref().map(|p| as_string_array(p)).transpose()?;
        let mut out = StringBuilder::with_capacity(rows, json.value_data().len() / 2);
        for row in 0..rows {
            let steps = match (&constant, paths) {
                (Some(steps), _) => steps.clone(),
                (None, Some(p)) if p.is_valid(row) => parse_json_path(p.value(row)),
                _ => None,
            };
            match (steps, json.is_valid(row)) {
                (Some(steps), true) => match select_json(json.value(row), &steps) {
                    Some(text) => out.append_value(text),
                    None => out.append_null(),
                },
                _ => out.append_null(),
            }
        }
        let array: StringArray = out.finish();
        Ok(ColumnarValue::Array(Arc::new(array) as ArrayRef))
    }
}

/// `round(decimal(p, s), d)` typed as Spark types it: `decimal(p - s + 1 + d', d')`
/// with `d' = min(d, s)`, so `round(x, 2)` prints two decimals. The values are
/// `datafusion-spark`'s (HALF_UP, as Spark).
#[derive(Debug, PartialEq, Eq, Hash)]
struct DecimalRound {
    inner: Arc<ScalarUDF>,
}

impl ScalarUDFImpl for DecimalRound {
    fn name(&self) -> &str {
        "round"
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(args)
    }

    fn return_field_from_args(
        &self,
        args: datafusion_expr::ReturnFieldArgs,
    ) -> DfResult<arrow_schema::FieldRef> {
        let scalars = args.scalar_arguments;
        let inner = self.inner.return_field_from_args(args)?;
        let digits = scalars.get(1).copied().flatten().and_then(|v| match v {
            ScalarValue::Int8(Some(d)) => Some(i64::from(*d)),
            ScalarValue::Int16(Some(d)) => Some(i64::from(*d)),
            ScalarValue::Int32(Some(d)) => Some(i64::from(*d)),
            ScalarValue::Int64(Some(d)) => Some(*d),
            _ => None,
        });
        match (inner.data_type(), digits) {
            (DataType::Decimal128(p, s), Some(d)) if d >= 0 => {
                let scale = i8::try_from(d).unwrap_or(i8::MAX).min(*s);
                let integral = i16::from(*p) - i16::from(*s) + 1;
                let precision =
                    u8::try_from((integral + i16::from(scale)).clamp(1, 38)).unwrap_or(38);
                Ok(Arc::new(Field::new(
                    self.name(),
                    DataType::Decimal128(precision, scale),
                    inner.is_nullable(),
                )))
            }
            _ => Ok(inner),
        }
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let target = args.return_field.data_type().clone();
        let rows = args.number_rows;
        // The inner function is held to the type it promises itself.
        let types: Vec<DataType> = args
            .arg_fields
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        args.return_field = Arc::new(Field::new(
            self.name(),
            self.inner.return_type(&types)?,
            true,
        ));
        let out = self.inner.invoke_with_args(args)?;
        if out.data_type() == target {
            return Ok(out);
        }
        let array = out.to_array(rows)?;
        Ok(ColumnarValue::Array(arrow_cast::cast(&array, &target)?))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum RegexKind {
    /// `regexp_replace(str, regexp, rep)`: every match replaced (DataFusion's
    /// replaces the first unless given the `g` flag).
    Replace,
    /// `regexp_extract(str, regexp[, idx])`: group `idx` (default 1) of the
    /// first match, `''` when nothing matches (DataFusion has no such function).
    Extract,
}

/// Spark's `regexp_replace` and `regexp_extract`, on Rust's `regex` syntax.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SparkRegex {
    kind: RegexKind,
    signature: Signature,
}

impl SparkRegex {
    fn new(kind: RegexKind) -> Self {
        let s = || DataType::Utf8;
        let signature = match kind {
            RegexKind::Replace => Signature::exact(vec![s(), s(), s()], Volatility::Immutable),
            RegexKind::Extract => Signature::one_of(
                vec![
                    datafusion_expr::TypeSignature::Exact(vec![s(), s()]),
                    datafusion_expr::TypeSignature::Exact(vec![s(), s(), DataType::Int64]),
                ],
                Volatility::Immutable,
            ),
        };
        Self { kind, signature }
    }
}

impl ScalarUDFImpl for SparkRegex {
    fn name(&self) -> &str {
        match self.kind {
            RegexKind::Replace => "regexp_replace",
            RegexKind::Extract => "regexp_extract",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _args: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<DfResult<Vec<_>>>()?;
        let text = as_string_array(&arrays[0])?;
        let pattern = as_string_array(&arrays[1])?;
        // A constant pattern (the usual case) compiles once per batch.
        let constant = match &args.args[1] {
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(p))) => Some(compile(p)?),
            _ => None,
        };
        let mut out = StringBuilder::with_capacity(rows, text.value_data().len());
        for row in 0..rows {
            let nulls = arrays.iter().any(|a| a.is_null(row));
            if nulls {
                out.append_null();
                continue;
            }
            let owned;
            let re = match &constant {
                Some(re) => re,
                None => {
                    owned = compile(pattern.value(row))?;
                    &owned
                }
            };
            let value = text.value(row);
            match self.kind {
                RegexKind::Replace => {
                    let rep = as_string_array(&arrays[2])?.value(row);
                    out.append_value(re.replace_all(value, rep));
                }
                RegexKind::Extract => {
                    let group = match arrays.get(2) {
                        Some(a) => datafusion_common::cast::as_int64_array(a)?.value(row),
                        None => 1,
                    };
                    let Ok(group) = usize::try_from(group) else {
                        return exec_err!("regexp_extract: group index {group} is negative");
                    };
                    if group >= re.captures_len() {
                        return exec_err!(
                            "regexp_extract: the pattern has {} groups, group {group} was asked for",
                            re.captures_len() - 1
                        );
                    }
                    let found = re
                        .captures(value)
                        .and_then(|c| c.get(group))
                        .map_or("", |m| m.as_str());
                    out.append_value(found);
                }
            }
        }
        let array: StringArray = out.finish();
        Ok(ColumnarValue::Array(Arc::new(array) as ArrayRef))
    }
}

fn compile(pattern: &str) -> DfResult<regex::Regex> {
    regex::Regex::new(pattern).map_err(|e| {
        DataFusionError::Execution(format!("invalid regular expression {pattern:?}: {e}"))
    })
}

#[derive(Debug, Clone, PartialEq)]
enum JsonStep {
    Key(String),
    Index(usize),
}

/// `$.a.b[0]['c']` as steps; `None` for a path Spark would not accept.
fn parse_json_path(path: &str) -> Option<Vec<JsonStep>> {
    let mut rest = path.trim().strip_prefix('$')?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end == 0 {
                return None;
            }
            steps.push(JsonStep::Key(after[..end].to_owned()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix("['") {
            let end = after.find("']")?;
            steps.push(JsonStep::Key(after[..end].to_owned()));
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            steps.push(JsonStep::Index(after[..end].trim().parse().ok()?));
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(steps)
}

fn select_json(text: &str, steps: &[JsonStep]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    let mut at = &value;
    for step in steps {
        at = match step {
            JsonStep::Key(k) => at.as_object()?.get(k)?,
            JsonStep::Index(i) => at.as_array()?.get(*i)?,
        };
    }
    match at {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_paths_select_like_spark() {
        let doc = r#"{"a":{"b":[10,{"c":"x"}]},"n":null,"s":"t"}"#;
        let at = |p: &str| select_json(doc, &parse_json_path(p)?);
        assert_eq!(at("$.a.b[0]").as_deref(), Some("10"));
        assert_eq!(at("$.a.b[1].c").as_deref(), Some("x"));
        assert_eq!(at("$['a']['b'][1]").as_deref(), Some(r#"{"c":"x"}"#));
        assert_eq!(at("$.s").as_deref(), Some("t"));
        assert_eq!(at("$.n"), None);
        assert_eq!(at("$.missing"), None);
        assert_eq!(at("a.b"), None, "a path starts with $");
        assert_eq!(select_json("not json", &[]), None);
    }
}
