//! Resolves an [`AggregateConfig`] against the input schema: which columns
//! are read, what each aggregate keeps and outputs, which key carries event
//! time, and the output schema — refusing, with the reason and the way out,
//! every combination Spark refuses or that could never produce output.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::AggregateConfig;
use super::decimal;
use super::expr::{AggExpr, AggFunction};
use crate::operator::key_encoding::key_type_supported;
use crate::operator::stateful::{StateSchema, resolve};
use crate::spec::{self, OutputMode};
use std::time::Duration;

/// Spark's operator names (`StateStoreSaveExec.shortName`,
/// `SessionWindowStateStoreSaveExec.shortName`).
pub(super) const NAME: &str = "stateStoreSave";
pub(super) const NAME_SESSION: &str = "sessionWindowStateStoreSaveExec";

/// What is wrong with a configuration, an input batch or a group's values.
#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    #[error("num_partitions is 0: aggregation state needs at least one partition")]
    NoPartitions,
    #[error("{role} column {column:?} is not in the input (columns: {available})")]
    UnknownColumn {
        role: &'static str,
        column: String,
        available: String,
    },
    #[error(
        "window column {column:?} has type {data_type}; windows need an event time of type \
         TIMESTAMP (Timestamp(Microsecond))"
    )]
    WindowColumnType { column: String, data_type: DataType },
    #[error(
        "watermark column {column:?} has type {data_type}; an event-time grouping key must be a \
         TIMESTAMP (Timestamp(Microsecond))"
    )]
    WatermarkColumnType { column: String, data_type: DataType },
    #[error("window: {0}")]
    Window(String),
    #[error(
        "output_mode = \"append\" needs a watermark: a group is emitted once, when the \
         watermark passes its window's end, and without a watermark that never happens. Add a \
         [watermark] on the event-time column{window_hint}, or use output_mode = \"update\" or \
         \"complete\""
    )]
    AppendWithoutWatermark { window_hint: String },
    #[error(
        "output_mode = \"append\" needs the watermark column {column:?} to be the window column \
         or a group_by key: otherwise no group is ever complete and nothing would be emitted. \
         Window on {column:?}, add it to group_by, or use output_mode = \"update\" or \
         \"complete\""
    )]
    AppendWatermarkNotKey { column: String },
    #[error(
        "the watermark column {watermark:?} is a group_by key while the window is on \
         {window:?}; window on {watermark:?} (the watermark's column) so that windows can be \
         finalized, or use output_mode = \"complete\""
    )]
    WatermarkKeyBesideWindow { watermark: String, window: String },
    #[error(
        "session windows do not support output_mode = \"update\" (as in Spark: a session's \
         bounds change as it merges, so there is no stable row to update); use \"append\" or \
         \"complete\""
    )]
    SessionUpdate,
    #[error(
        "session windows need at least one group_by key (Spark refuses a global aggregation \
         over session windows); add the column that identifies a session's owner, e.g. a user id"
    )]
    SessionWithoutKeys,
    #[error(
        "aggregate {expr:?}: count(DISTINCT) is not supported with session windows (its values \
         would have to move with every session merge); use approx_count_distinct"
    )]
    DistinctWithSession { expr: String },
    #[error("group_by column {column:?} has type {data_type}, which cannot be a grouping key")]
    UnsupportedKeyType { column: String, data_type: DataType },
    #[error(
        "aggregate {expr:?}: {function} does not accept column {column:?} of type {data_type} \
         ({accepted})"
    )]
    UnsupportedType {
        expr: String,
        function: String,
        column: String,
        data_type: DataType,
        accepted: &'static str,
    },
    #[error("input column {index} is {found:?} ({found_type}), expected {column:?} ({data_type})")]
    InputMismatch {
        index: usize,
        column: String,
        data_type: DataType,
        found: String,
        found_type: DataType,
    },
    #[error("event time {micros} µs of column {column:?} is out of range for its windows")]
    EventTimeRange { column: String, micros: i64 },
    #[error(
        "aggregate {expr:?} overflowed {result_type} in group {group} (Spark's ANSI mode fails \
         the query likewise); aggregate a wider type, e.g. cast to DECIMAL(38, s) in a transform"
    )]
    Overflow {
        expr: String,
        result_type: String,
        group: String,
    },
    #[error("aggregation state entry {key} is corrupt: {reason}")]
    CorruptState { key: String, reason: String },
}

/// Window assignment, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WindowKind {
    Tumbling { size: i64 },
    Sliding { size: i64, slide: i64 },
    Session { gap: i64 },
}

#[derive(Debug, Clone)]
pub(super) struct WindowPlan {
    pub column: usize,
    pub name: String,
    pub data_type: DataType,
    pub kind: WindowKind,
}

/// Which part of a group's key is its event time, compared with watermarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimeKey {
    /// No watermark on a key: nothing is late, nothing is evicted.
    None,
    /// The window's end (sessions: the session's end).
    Window,
    /// The first key column (`keys[0]`) is the watermark's column.
    Column,
}

/// One grouping column, in state-key order.
#[derive(Debug, Clone)]
pub(super) struct KeyColumn {
    pub index: usize,
    pub name: String,
    pub data_type: DataType,
    /// Position among the output's group columns (group_by order).
    pub output: usize,
}

/// The value shape an extreme (`min`/`max`) keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// Booleans, signed integers, dates, timestamps.
    Int,
    UInt,
    Float,
    Decimal,
    Bytes,
}

/// What an aggregate keeps per group and outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AggKind {
    CountAll,
    Count,
    CountDistinct,
    ApproxCountDistinct,
    SumInt,
    SumFloat,
    /// The result type `DECIMAL(precision, scale)`.
    SumDecimal {
        precision: u8,
        scale: i8,
    },
    AvgFloat,
    /// Sum buffer `DECIMAL(sum_precision, scale)`, result `result`.
    AvgDecimal {
        sum_precision: u8,
        scale: i8,
        result: (u8, i8),
    },
    Min(Shape),
    Max(Shape),
}

#[derive(Debug, Clone)]
pub(super) struct AggPlan {
    pub expr: AggExpr,
    pub column: Option<usize>,
    pub kind: AggKind,
    /// The output field (name, type, nullability).
    pub field: Field,
}

/// Everything [`super::AggregateOperator`] needs to know, resolved once.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub name: &'static str,
    pub mode: OutputMode,
    pub input: SchemaRef,
    pub output: SchemaRef,
    pub window: Option<WindowPlan>,
    pub keys: Vec<KeyColumn>,
    pub aggs: Vec<AggPlan>,
    pub time_key: TimeKey,
    /// Drop partial aggregates whose event time is `<= wm(b-1)`.
    pub late_filter: bool,
    /// Evict (and in append mode emit) groups whose event time is `<= wm(b)`.
    pub evicts: bool,
    pub has_distinct: bool,
}

impl Plan {
    pub fn is_session(&self) -> bool {
        matches!(
            self.window,
            Some(WindowPlan {
                kind: WindowKind::Session { .. },
                ..
            })
        )
    }

    /// The input columns a batch must have, by index, with their names and types.
    pub fn used_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.window
            .iter()
            .map(|w| w.column)
            .chain(self.keys.iter().map(|k| k.index))
            .chain(self.aggs.iter().filter_map(|a| a.column))
    }
}

fn micros(what: &str, d: Duration) -> Result<i64, AggregateError> {
    if d.is_zero() {
        return Err(AggregateError::Window(format!("{what} must be positive")));
    }
    i64::try_from(d.as_micros())
        .map_err(|_| AggregateError::Window(format!("{what} of {d:?} is too large")))
}

/// Resolves and checks `config` against `input`.
pub(super) fn plan(config: &AggregateConfig, input: &SchemaRef) -> Result<Plan, AggregateError> {
    if config.num_partitions == 0 {
        return Err(AggregateError::NoPartitions);
    }
    let available = || {
        input
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let find = |role: &'static str, column: &str| {
        resolve(input, column).ok_or_else(|| AggregateError::UnknownColumn {
            role,
            column: column.to_owned(),
            available: available(),
        })
    };

    let window = match &config.window {
        None => None,
        Some(w) => {
            let column = find("window", &w.column)?;
            let field = input.field(column);
            if !matches!(
                field.data_type(),
                DataType::Timestamp(TimeUnit::Microsecond, _)
            ) {
                return Err(AggregateError::WindowColumnType {
                    column: field.name().clone(),
                    data_type: field.data_type().clone(),
                });
            }
            let kind = match w.kind {
                spec::WindowKind::Tumbling { size } => WindowKind::Tumbling {
                    size: micros("size", size)?,
                },
                spec::WindowKind::Sliding { size, slide } => {
                    if slide > size {
                        return Err(AggregateError::Window(format!(
                            "slide ({} ms) must not exceed size ({} ms), as in Spark; rows \
                             between windows would be lost",
                            slide.as_millis(),
                            size.as_millis()
                        )));
                    }
                    let size = micros("size", size)?;
                    let slide = micros("slide", slide)?;
                    if slide == size {
                        WindowKind::Tumbling { size }
                    } else {
                        WindowKind::Sliding { size, slide }
                    }
                }
                spec::WindowKind::Session { gap } => WindowKind::Session {
                    gap: micros("gap", gap)?,
                },
            };
            Some(WindowPlan {
                column,
                name: field.name().clone(),
                data_type: field.data_type().clone(),
                kind,
            })
        }
    };
    let session = matches!(
        window,
        Some(WindowPlan {
            kind: WindowKind::Session { .. },
            ..
        })
    );

    let mut keys = Vec::with_capacity(config.group_by.len());
    for (output, column) in config.group_by.iter().enumerate() {
        let index = find("group_by", column)?;
        let field = input.field(index);
        if !key_type_supported(field.data_type()) {
            return Err(AggregateError::UnsupportedKeyType {
                column: field.name().clone(),
                data_type: field.data_type().clone(),
            });
        }
        keys.push(KeyColumn {
            index,
            name: field.name().clone(),
            data_type: field.data_type().clone(),
            output,
        });
    }

    // Which key is event time: the window when it is on the watermark's
    // column, else a group key that is the watermark's column (first in the
    // state key, so that expired groups are one range).
    let watermark = match &config.watermark_column {
        Some(column) => Some(find("watermark", column)?),
        None => None,
    };
    let time_key = match (watermark, &window) {
        (None, _) => TimeKey::None,
        (Some(wm), Some(w)) if w.column == wm => TimeKey::Window,
        (Some(wm), _) => match keys.iter().position(|k| k.index == wm) {
            Some(position) => {
                let key = keys.remove(position);
                if !matches!(key.data_type, DataType::Timestamp(TimeUnit::Microsecond, _)) {
                    return Err(AggregateError::WatermarkColumnType {
                        column: key.name,
                        data_type: key.data_type,
                    });
                }
                keys.insert(0, key);
                TimeKey::Column
            }
            None => TimeKey::None,
        },
    };

    // Spark keys a session window only by its own end; a group key that is
    // the watermark column plays no part in late filtering there.
    let time_key = if session && time_key == TimeKey::Column {
        TimeKey::None
    } else {
        time_key
    };
    if let (TimeKey::Column, Some(w)) = (time_key, &window)
        && config.output_mode != OutputMode::Complete
    {
        // Groups are keyed window first, so the expired groups of another
        // event-time key would not be one key range.
        return Err(AggregateError::WatermarkKeyBesideWindow {
            watermark: keys[0].name.clone(),
            window: w.name.clone(),
        });
    }
    match config.output_mode {
        OutputMode::Append if watermark.is_none() => {
            return Err(AggregateError::AppendWithoutWatermark {
                window_hint: window
                    .as_ref()
                    .map(|w| format!(" ({:?})", w.name))
                    .unwrap_or_default(),
            });
        }
        OutputMode::Append if time_key == TimeKey::None => {
            let column = watermark.map_or_else(String::new, |i| input.field(i).name().clone());
            return Err(AggregateError::AppendWatermarkNotKey { column });
        }
        OutputMode::Update if session => return Err(AggregateError::SessionUpdate),
        _ => {}
    }
    if session && keys.is_empty() {
        return Err(AggregateError::SessionWithoutKeys);
    }

    let mut aggs = Vec::with_capacity(config.aggregates.len());
    for expr in &config.aggregates {
        let column = match &expr.column {
            Some(c) => Some(find("aggregate", c)?),
            None => None,
        };
        let data_type = column.map(|c| input.field(c).data_type());
        let kind = aggregate_kind(expr, column.map(|c| input.field(c).name()), data_type)?;
        if session && kind == AggKind::CountDistinct {
            return Err(AggregateError::DistinctWithSession {
                expr: expr.text.clone(),
            });
        }
        let field = output_field(&expr.name, kind, data_type);
        aggs.push(AggPlan {
            expr: expr.clone(),
            column,
            kind,
            field,
        });
    }

    let mut fields = Vec::new();
    if let Some(w) = &window {
        fields.push(Field::new("window_start", w.data_type.clone(), true));
        fields.push(Field::new("window_end", w.data_type.clone(), true));
    }
    let mut group_fields: Vec<(usize, Field)> = keys
        .iter()
        .map(|k| (k.output, Field::new(&k.name, k.data_type.clone(), true)))
        .collect();
    group_fields.sort_by_key(|(o, _)| *o);
    fields.extend(group_fields.into_iter().map(|(_, f)| f));
    fields.extend(aggs.iter().map(|a| a.field.clone()));

    let complete = config.output_mode == OutputMode::Complete;
    let has_time = time_key != TimeKey::None;
    Ok(Plan {
        name: if session { NAME_SESSION } else { NAME },
        mode: config.output_mode,
        input: input.clone(),
        output: Arc::new(Schema::new(fields)),
        late_filter: has_time && (!complete || session),
        evicts: has_time && !complete,
        has_distinct: aggs.iter().any(|a| a.kind == AggKind::CountDistinct),
        window,
        keys,
        aggs,
        time_key,
    })
}

/// What a group's state holds (see `value` for the byte layout).
pub(super) fn state_schema(plan: &Plan) -> StateSchema {
    let mut key = Vec::new();
    if let Some(w) = &plan.window {
        key.push(Field::new("window_start", w.data_type.clone(), false));
        key.push(Field::new("window_end", w.data_type.clone(), false));
    }
    key.extend(
        plan.keys
            .iter()
            .map(|k| Field::new(&k.name, k.data_type.clone(), true)),
    );
    let mut value = Vec::new();
    for agg in &plan.aggs {
        let name = agg.field.name();
        let input = agg
            .column
            .map_or(DataType::Null, |c| plan.input.field(c).data_type().clone());
        let mut part = |what: &str, data_type: DataType| {
            value.push(Field::new(format!("{name}.{what}"), data_type, true));
        };
        match agg.kind {
            AggKind::CountAll | AggKind::Count => part("count", DataType::Int64),
            AggKind::CountDistinct => {
                part("count", DataType::Int64);
                part("distinct", input);
            }
            AggKind::ApproxCountDistinct => part(
                "registers",
                DataType::FixedSizeBinary(super::hll::REGISTERS as i32),
            ),
            AggKind::SumInt => part("sum", DataType::Int64),
            AggKind::SumFloat => part("sum", DataType::Float64),
            AggKind::SumDecimal { precision, scale } => {
                part("sum", DataType::Decimal128(precision, scale));
            }
            AggKind::AvgFloat => {
                part("sum", DataType::Float64);
                part("count", DataType::Int64);
            }
            AggKind::AvgDecimal {
                sum_precision,
                scale,
                ..
            } => {
                part("sum", DataType::Decimal128(sum_precision, scale));
                part("count", DataType::Int64);
            }
            AggKind::Min(_) => part("min", input),
            AggKind::Max(_) => part("max", input),
        }
    }
    StateSchema {
        operator: plan.name,
        key,
        value,
    }
}

fn is_integer(t: &DataType) -> bool {
    use DataType as D;
    matches!(
        t,
        D::Int8 | D::Int16 | D::Int32 | D::Int64 | D::UInt8 | D::UInt16 | D::UInt32
    )
}

/// The shape `min`/`max` keep for a type, if orderable.
fn shape(t: &DataType) -> Option<Shape> {
    use DataType as D;
    Some(match t {
        D::Boolean
        | D::Int8
        | D::Int16
        | D::Int32
        | D::Int64
        | D::Date32
        | D::Date64
        | D::Timestamp(_, _)
        | D::Time32(_)
        | D::Time64(_)
        | D::Duration(_) => Shape::Int,
        D::UInt8 | D::UInt16 | D::UInt32 | D::UInt64 => Shape::UInt,
        D::Float32 | D::Float64 => Shape::Float,
        D::Decimal128(_, _) => Shape::Decimal,
        D::Utf8 | D::LargeUtf8 | D::Utf8View | D::Binary | D::LargeBinary | D::BinaryView => {
            Shape::Bytes
        }
        _ => return None,
    })
}

/// Types `approx_count_distinct` hashes exactly as Spark does.
fn spark_hashable(t: &DataType) -> bool {
    use DataType as D;
    matches!(
        t,
        D::Boolean
            | D::Int8
            | D::Int16
            | D::Int32
            | D::Int64
            | D::Date32
            | D::Timestamp(TimeUnit::Microsecond, _)
            | D::Float32
            | D::Float64
            | D::Decimal128(_, _)
            | D::Utf8
            | D::LargeUtf8
            | D::Utf8View
            | D::Binary
            | D::LargeBinary
            | D::BinaryView
    )
}

fn aggregate_kind(
    expr: &AggExpr,
    column: Option<&String>,
    data_type: Option<&DataType>,
) -> Result<AggKind, AggregateError> {
    let (Some(column), Some(t)) = (column, data_type) else {
        return Ok(AggKind::CountAll);
    };
    let unsupported = |accepted: &'static str| AggregateError::UnsupportedType {
        expr: expr.text.clone(),
        function: expr.function.to_string(),
        column: column.clone(),
        data_type: t.clone(),
        accepted,
    };
    const NUMERIC: &str = "accepted: integers, DOUBLE, DECIMAL";
    Ok(match expr.function {
        AggFunction::Count => AggKind::Count,
        AggFunction::CountDistinct => {
            if !key_type_supported(t) {
                return Err(unsupported("accepted: any type usable as a group_by key"));
            }
            AggKind::CountDistinct
        }
        AggFunction::ApproxCountDistinct => {
            if !spark_hashable(t) {
                return Err(unsupported(
                    "accepted: BOOLEAN, integers, DOUBLE, DECIMAL, STRING, BINARY, DATE, TIMESTAMP",
                ));
            }
            AggKind::ApproxCountDistinct
        }
        AggFunction::Sum => match t {
            t if is_integer(t) => AggKind::SumInt,
            DataType::Float32 | DataType::Float64 => AggKind::SumFloat,
            DataType::Decimal128(p, s) => {
                let (precision, scale) = decimal::sum_type(*p, *s);
                AggKind::SumDecimal { precision, scale }
            }
            _ => return Err(unsupported(NUMERIC)),
        },
        AggFunction::Avg => match t {
            t if is_integer(t) => AggKind::AvgFloat,
            DataType::Float32 | DataType::Float64 => AggKind::AvgFloat,
            DataType::Decimal128(p, s) => {
                let (sum_precision, scale) = decimal::sum_type(*p, *s);
                AggKind::AvgDecimal {
                    sum_precision,
                    scale,
                    result: decimal::avg_type(*p, *s),
                }
            }
            _ => return Err(unsupported(NUMERIC)),
        },
        AggFunction::Min | AggFunction::Max => {
            let Some(shape) = shape(t) else {
                return Err(unsupported(
                    "accepted: numbers, DECIMAL, STRING, BINARY, BOOLEAN, DATE, TIMESTAMP",
                ));
            };
            if expr.function == AggFunction::Min {
                AggKind::Min(shape)
            } else {
                AggKind::Max(shape)
            }
        }
    })
}

fn output_field(name: &str, kind: AggKind, input: Option<&DataType>) -> Field {
    match kind {
        AggKind::CountAll | AggKind::Count | AggKind::CountDistinct => {
            Field::new(name, DataType::Int64, false)
        }
        AggKind::ApproxCountDistinct => Field::new(name, DataType::Int64, false),
        AggKind::SumInt => Field::new(name, DataType::Int64, true),
        AggKind::SumFloat | AggKind::AvgFloat => Field::new(name, DataType::Float64, true),
        AggKind::SumDecimal { precision, scale } => {
            Field::new(name, DataType::Decimal128(precision, scale), true)
        }
        AggKind::AvgDecimal { result, .. } => {
            Field::new(name, DataType::Decimal128(result.0, result.1), true)
        }
        AggKind::Min(_) | AggKind::Max(_) => {
            Field::new(name, input.cloned().unwrap_or(DataType::Null), true)
        }
    }
}
