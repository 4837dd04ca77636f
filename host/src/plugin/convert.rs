//! Arrow ⇄ WIT columns. Values move as whole buffers (one `memcpy` each way
//! plus the lowering into guest memory), never value by value, and every
//! buffer coming back from a guest is validated before Arrow sees it: a
//! guest may return anything. That includes the types it declares: a
//! decimal's precision and scale are checked wherever a guest gives them
//! (a declared schema, a typed column, an IPC stream's schema, through
//! `ipc_check`), and its values against that precision.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef, TimeUnit};

use super::bindings::wit;
use super::ipc_check::{self, MalformedIpc};

/// The timezone given to timestamp columns a plugin creates (Spark: UTC).
const UTC: &str = "+00:00";

/// Largest decimal128 precision (Spark's and Arrow's).
const MAX_DECIMAL_PRECISION: i32 = 38;

/// A decimal a guest declared, as Arrow's precision and scale, when it is
/// one Spark and Delta can hold: precision 1 to 38, scale 0 to the precision.
///
/// # Errors
/// What is wrong with it, naming the declared decimal.
pub(crate) fn valid_decimal(precision: i32, scale: i32) -> Result<(u8, i8), String> {
    let invalid =
        |why: String| format!("decimal128({precision}, {scale}) is not a valid decimal: {why}");
    if !(1..=MAX_DECIMAL_PRECISION).contains(&precision) {
        return Err(invalid(format!(
            "the precision must be 1 to {MAX_DECIMAL_PRECISION}"
        )));
    }
    if !(0..=precision).contains(&scale) {
        return Err(invalid(format!(
            "the scale must be 0 to the precision ({precision})"
        )));
    }
    match (u8::try_from(precision), i8::try_from(scale)) {
        (Ok(p), Ok(s)) => Ok((p, s)),
        _ => Err(invalid("out of range".into())),
    }
}

/// Checks a declared WIT type: only decimals carry parameters.
fn check_declared(dt: &wit::DataType) -> Result<(), String> {
    match dt {
        wit::DataType::Decimal128(d) => {
            valid_decimal(i32::from(d.precision), i32::from(d.scale)).map(drop)
        }
        _ => Ok(()),
    }
}

/// WIT type of an Arrow type; `None` when plugins cannot receive it.
pub(crate) fn wit_type(dt: &DataType) -> Option<wit::DataType> {
    Some(match dt {
        DataType::Boolean => wit::DataType::Boolean,
        DataType::Int32 => wit::DataType::Int32,
        DataType::Int64 => wit::DataType::Int64,
        DataType::Float64 => wit::DataType::Float64,
        DataType::Decimal128(p, s) => wit::DataType::Decimal128(wit::DecimalType {
            precision: *p,
            scale: *s,
        }),
        DataType::Utf8 => wit::DataType::Utf8,
        DataType::Timestamp(TimeUnit::Microsecond, _) => wit::DataType::TimestampMicros,
        DataType::Date32 => wit::DataType::Date32,
        _ => return None,
    })
}

/// Arrow type of a WIT type, keeping the timezone of `like` for timestamps.
pub(crate) fn arrow_type(dt: &wit::DataType, like: Option<&DataType>) -> DataType {
    match dt {
        wit::DataType::Boolean => DataType::Boolean,
        wit::DataType::Int32 => DataType::Int32,
        wit::DataType::Int64 => DataType::Int64,
        wit::DataType::Float64 => DataType::Float64,
        wit::DataType::Decimal128(d) => DataType::Decimal128(d.precision, d.scale),
        wit::DataType::Utf8 => DataType::Utf8,
        wit::DataType::TimestampMicros => match like {
            Some(t @ DataType::Timestamp(TimeUnit::Microsecond, _)) => t.clone(),
            _ => DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
        },
        wit::DataType::Date32 => DataType::Date32,
    }
}

/// The WIT fields of a schema, or the first column plugins cannot receive.
pub(crate) fn wit_fields(schema: &Schema) -> Result<Vec<wit::Field>, (String, String)> {
    schema
        .fields()
        .iter()
        .map(|f| {
            wit_type(f.data_type())
                .map(|data_type| wit::Field {
                    name: f.name().clone(),
                    data_type,
                    nullable: f.is_nullable(),
                })
                .ok_or_else(|| (f.name().clone(), f.data_type().to_string()))
        })
        .collect()
}

/// The Arrow schema described by WIT fields (the schema a plugin declares).
///
/// # Errors
/// A message naming the first column whose declared type is invalid (a
/// decimal outside precision 1 to 38 or scale 0 to its precision).
pub(crate) fn arrow_schema(fields: &[wit::Field], input: &Schema) -> Result<SchemaRef, String> {
    let fields = fields
        .iter()
        .map(|f| -> Result<Field, String> {
            check_declared(&f.data_type).map_err(|e| format!("column {:?}: {e}", f.name))?;
            let like = input.field_with_name(&f.name).ok().map(|x| x.data_type());
            Ok(Field::new(
                &f.name,
                arrow_type(&f.data_type, like),
                f.nullable,
            ))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

fn validity(array: &dyn Array) -> Option<Vec<u8>> {
    array
        .nulls()
        .filter(|n| n.null_count() > 0)
        .map(|n| n.inner().sliced().as_slice().to_vec())
}

/// One column of a batch as the guest receives it.
pub(crate) fn wit_column(field: &Field, array: &ArrayRef) -> Result<wit::Column, (String, String)> {
    let unsupported = || (field.name().clone(), field.data_type().to_string());
    let data_type = wit_type(field.data_type()).ok_or_else(unsupported)?;
    let values = match field.data_type() {
        DataType::Boolean => {
            wit::ColumnValues::Boolean(array.as_boolean().values().sliced().as_slice().to_vec())
        }
        DataType::Int32 => {
            wit::ColumnValues::Int32(array.as_primitive::<Int32Type>().values().to_vec())
        }
        DataType::Int64 => {
            wit::ColumnValues::Int64(array.as_primitive::<Int64Type>().values().to_vec())
        }
        DataType::Float64 => {
            wit::ColumnValues::Float64(array.as_primitive::<Float64Type>().values().to_vec())
        }
        DataType::Decimal128(..) => {
            let values = array.as_primitive::<Decimal128Type>().values();
            let mut bytes = Vec::with_capacity(values.len() * 16);
            for v in values.iter() {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            wit::ColumnValues::Decimal128(bytes)
        }
        DataType::Utf8 => {
            let strings = array.as_string::<i32>();
            let offsets = strings.value_offsets();
            let (first, last) = (offsets[0], offsets[offsets.len() - 1]);
            let data = strings.value_data()[first as usize..last as usize].to_vec();
            let offsets = if first == 0 {
                offsets.to_vec()
            } else {
                offsets.iter().map(|o| o - first).collect()
            };
            wit::ColumnValues::Utf8(wit::Utf8Values { offsets, data })
        }
        DataType::Timestamp(TimeUnit::Microsecond, _) => wit::ColumnValues::TimestampMicros(
            array
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .to_vec(),
        ),
        DataType::Date32 => {
            wit::ColumnValues::Date32(array.as_primitive::<Date32Type>().values().to_vec())
        }
        _ => return Err(unsupported()),
    };
    Ok(wit::Column {
        name: field.name().clone(),
        data_type,
        validity: validity(array.as_ref()),
        values,
    })
}

/// Builds an Arrow array from a guest's column, checking every buffer.
///
/// # Errors
/// A message saying what is wrong with the column, naming it.
pub(crate) fn arrow_column(
    column: wit::Column,
    rows: usize,
    like: Option<&DataType>,
) -> Result<(Field, ArrayRef), String> {
    let name = column.name;
    let bad = |what: String| format!("column {name:?}: {what}");
    let nulls = match column.validity {
        None => None,
        Some(bits) => {
            if bits.len() * 8 < rows {
                return Err(bad(format!(
                    "validity bitmap has {} bytes, {rows} rows need {}",
                    bits.len(),
                    rows.div_ceil(8)
                )));
            }
            Some(NullBuffer::new(BooleanBuffer::new(
                Buffer::from_vec(bits),
                0,
                rows,
            )))
        }
    };
    let check_len = |len: usize| {
        if len == rows {
            Ok(())
        } else {
            Err(bad(format!("has {len} values, the batch has {rows} rows")))
        }
    };
    check_declared(&column.data_type).map_err(bad)?;
    let data_type = arrow_type(&column.data_type, like);
    let array: ArrayRef = match (column.values, &data_type) {
        (wit::ColumnValues::Boolean(bits), DataType::Boolean) => {
            if bits.len() * 8 < rows {
                return Err(bad(format!("boolean bitmap too short for {rows} rows")));
            }
            Arc::new(BooleanArray::new(
                BooleanBuffer::new(Buffer::from_vec(bits), 0, rows),
                nulls,
            ))
        }
        (wit::ColumnValues::Int32(v), DataType::Int32) => {
            check_len(v.len())?;
            Arc::new(Int32Array::new(ScalarBuffer::from(v), nulls))
        }
        (wit::ColumnValues::Int64(v), DataType::Int64) => {
            check_len(v.len())?;
            Arc::new(Int64Array::new(ScalarBuffer::from(v), nulls))
        }
        (wit::ColumnValues::Float64(v), DataType::Float64) => {
            check_len(v.len())?;
            Arc::new(Float64Array::new(ScalarBuffer::from(v), nulls))
        }
        (wit::ColumnValues::Decimal128(bytes), DataType::Decimal128(p, s)) => {
            if bytes.len() != rows * 16 {
                return Err(bad(format!(
                    "decimal buffer has {} bytes, {rows} rows need {}",
                    bytes.len(),
                    rows * 16
                )));
            }
            let values: Vec<i128> = bytes
                .chunks_exact(16)
                .map(|c| {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(c);
                    i128::from_le_bytes(b)
                })
                .collect();
            let array = Decimal128Array::new(ScalarBuffer::from(values), nulls)
                .with_precision_and_scale(*p, *s)
                .map_err(|e| bad(e.to_string()))?;
            array
                .validate_decimal_precision(*p)
                .map_err(|e| bad(e.to_string()))?;
            Arc::new(array)
        }
        (wit::ColumnValues::Utf8(u), DataType::Utf8) => {
            check_len(u.offsets.len().saturating_sub(1))?;
            if u.offsets.first() != Some(&0) || u.offsets.windows(2).any(|w| w[0] > w[1]) {
                return Err(bad(
                    "string offsets must start at 0 and never decrease".into()
                ));
            }
            let offsets = OffsetBuffer::new(ScalarBuffer::from(u.offsets));
            let array = StringArray::try_new(offsets, Buffer::from_vec(u.data), nulls)
                .map_err(|e| bad(e.to_string()))?;
            Arc::new(array)
        }
        (wit::ColumnValues::TimestampMicros(v), DataType::Timestamp(_, tz)) => {
            check_len(v.len())?;
            Arc::new(
                TimestampMicrosecondArray::new(ScalarBuffer::from(v), nulls)
                    .with_timezone_opt(tz.clone()),
            )
        }
        (wit::ColumnValues::Date32(v), DataType::Date32) => {
            check_len(v.len())?;
            Arc::new(Date32Array::new(ScalarBuffer::from(v), nulls))
        }
        (values, dt) => {
            return Err(bad(format!(
                "declared type {dt} but values of another type ({})",
                values_kind(&values)
            )));
        }
    };
    Ok((Field::new(name, data_type, true), array))
}

fn values_kind(v: &wit::ColumnValues) -> &'static str {
    match v {
        wit::ColumnValues::Boolean(_) => "boolean",
        wit::ColumnValues::Int32(_) => "int32",
        wit::ColumnValues::Int64(_) => "int64",
        wit::ColumnValues::Float64(_) => "float64",
        wit::ColumnValues::Decimal128(_) => "decimal128",
        wit::ColumnValues::Utf8(_) => "utf8",
        wit::ColumnValues::TimestampMicros(_) => "timestamp-micros",
        wit::ColumnValues::Date32(_) => "date32",
    }
}

/// The batch as an Arrow IPC stream.
pub(crate) fn to_ipc(batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
    let mut out = Vec::new();
    {
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut out, batch.schema_ref())?;
        writer.write(batch)?;
        writer.finish()?;
    }
    Ok(out)
}

/// Why a guest's Arrow IPC stream was not turned into a batch.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FromIpcError {
    /// Refused before arrow-ipc read it.
    #[error(transparent)]
    Malformed(#[from] MalformedIpc),
    /// Refused by arrow-ipc's own validation.
    #[error("Arrow IPC stream: {0}")]
    Arrow(#[from] ArrowError),
    /// A decimal value beyond its column's declared precision.
    #[error("Arrow IPC stream: column {column:?}: {reason}")]
    Decimal { column: String, reason: String },
}

/// Reads an Arrow IPC stream from a guest into one batch, after
/// [`ipc_check::check`] has vetted its framing, metadata and types.
pub(crate) fn from_ipc(bytes: &[u8]) -> Result<RecordBatch, FromIpcError> {
    ipc_check::check(bytes)?;
    let reader = arrow_ipc::reader::StreamReader::try_new(bytes, None)?;
    let schema = reader.schema();
    let batches = reader.collect::<Result<Vec<_>, _>>()?;
    let batch = arrow_select::concat::concat_batches(&schema, &batches)?;
    for (field, column) in schema.fields().iter().zip(batch.columns()) {
        if let (DataType::Decimal128(precision, _), Some(values)) = (
            field.data_type(),
            column.as_primitive_opt::<Decimal128Type>(),
        ) {
            values
                .validate_decimal_precision(*precision)
                .map_err(|e| FromIpcError::Decimal {
                    column: field.name().clone(),
                    reason: e.to_string(),
                })?;
        }
    }
    Ok(batch)
}

/// Applies a transform's edit to its input: set columns, drop columns, then
/// keep rows (the order the SDK's `testing::MemoryBatch::apply` follows).
pub(crate) fn apply_edit(input: &RecordBatch, edit: wit::Edit) -> Result<RecordBatch, String> {
    let rows = input.num_rows();
    let schema = input.schema();
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns: Vec<ArrayRef> = input.columns().to_vec();
    for column in edit.set_columns {
        let existing = fields.iter().position(|f| *f.name() == column.name);
        let like = existing.map(|i| fields[i].data_type().clone());
        let (field, array) = arrow_column(column, rows, like.as_ref())?;
        match existing {
            Some(i) => {
                fields[i] = field;
                columns[i] = array;
            }
            None => {
                fields.push(field);
                columns.push(array);
            }
        }
    }
    for name in &edit.drop_columns {
        let Some(i) = fields.iter().position(|f| f.name() == name) else {
            return Err(format!(
                "asked to drop column {name:?}, which the batch does not have"
            ));
        };
        fields.remove(i);
        columns.remove(i);
    }
    let edited =
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())?;
    match edit.keep {
        None => Ok(edited),
        Some(wit::Selection::Mask(bits)) => {
            if bits.len() * 8 < rows {
                return Err(format!(
                    "selection mask has {} bytes, {rows} rows need {}",
                    bits.len(),
                    rows.div_ceil(8)
                ));
            }
            let mask = BooleanArray::new(BooleanBuffer::new(Buffer::from_vec(bits), 0, rows), None);
            arrow_select::filter::filter_record_batch(&edited, &mask).map_err(|e| e.to_string())
        }
        Some(wit::Selection::Indices(indices)) => {
            if let Some(bad) = indices.iter().find(|&&i| i as usize >= rows) {
                return Err(format!("selected row {bad}, the batch has {rows} rows"));
            }
            if indices.windows(2).any(|w| w[0] >= w[1]) {
                return Err("selected row indices must be strictly ascending".into());
            }
            let indices = arrow_array::UInt32Array::from(indices);
            arrow_select::take::take_record_batch(&edited, &indices).map_err(|e| e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("status", DataType::Utf8, true),
            Field::new("amount", DataType::Decimal128(12, 2), true),
            Field::new(
                "at",
                DataType::Timestamp(TimeUnit::Microsecond, Some(UTC.into())),
                true,
            ),
        ]));
        let amount = Decimal128Array::from(vec![Some(2390), None, Some(-5), Some(100)])
            .with_precision_and_scale(12, 2)
            .expect("valid precision");
        let at = TimestampMicrosecondArray::from(vec![Some(1), Some(2), None, Some(4)])
            .with_timezone(UTC);
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![
                    Some("a"),
                    None,
                    Some("ccc"),
                    Some(""),
                ])),
                Arc::new(amount),
                Arc::new(at),
            ],
        )
        .expect("valid batch")
    }

    #[test]
    fn columns_round_trip_through_wit_including_slices() {
        let b = batch().slice(1, 3);
        for (i, field) in b.schema().fields().iter().enumerate() {
            let wit = wit_column(field, b.column(i)).expect("supported");
            let (f, array) = arrow_column(wit, 3, Some(field.data_type())).expect("valid");
            assert_eq!(f.data_type(), field.data_type());
            assert_eq!(
                array.as_ref(),
                b.column(i).as_ref(),
                "column {}",
                field.name()
            );
        }
    }

    #[test]
    fn ipc_round_trips() {
        let b = batch();
        let bytes = to_ipc(&b).expect("encodes");
        assert_eq!(from_ipc(&bytes).expect("decodes"), b);
    }

    fn utf8(name: &str, offsets: Vec<i32>, data: &[u8]) -> wit::Column {
        wit::Column {
            name: name.into(),
            data_type: wit::DataType::Utf8,
            validity: None,
            values: wit::ColumnValues::Utf8(wit::Utf8Values {
                offsets,
                data: data.to_vec(),
            }),
        }
    }

    #[test]
    fn edits_set_drop_and_keep() {
        let b = batch();
        let edit = wit::Edit {
            set_columns: vec![utf8("status", vec![0, 1, 2, 3, 4], b"wxyz")],
            drop_columns: vec!["amount".into()],
            keep: Some(wit::Selection::Mask(vec![0b0000_1010])),
        };
        let out = apply_edit(&b, edit).expect("valid edit");
        assert_eq!(out.num_rows(), 2);
        let names: Vec<_> = out
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        assert_eq!(names, ["id", "status", "at"]);
        assert_eq!(out.column(1).as_string::<i32>().value(0), "x");
        assert_eq!(out.column(0).as_primitive::<Int64Type>().values(), &[2, 4]);

        let keep = wit::Edit {
            set_columns: vec![],
            drop_columns: vec![],
            keep: Some(wit::Selection::Indices(vec![0, 3])),
        };
        let out = apply_edit(&b, keep).expect("valid edit");
        assert_eq!(out.column(0).as_primitive::<Int64Type>().values(), &[1, 4]);
    }

    fn decimal(precision: u8, scale: i8, values: &[i128]) -> wit::Column {
        wit::Column {
            name: "amount".into(),
            data_type: wit::DataType::Decimal128(wit::DecimalType { precision, scale }),
            validity: None,
            values: wit::ColumnValues::Decimal128(
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
        }
    }

    #[test]
    fn declared_decimals_are_checked_on_every_path() {
        let b = batch();
        for (precision, scale, why) in [
            (38, 90, "the scale must be 0 to the precision (38)"),
            (12, -2, "the scale must be 0 to the precision (12)"),
            (0, 0, "the precision must be 1 to 38"),
            (39, 2, "the precision must be 1 to 38"),
        ] {
            let expected = format!(
                "column \"amount\": decimal128({precision}, {scale}) is not a valid decimal: {why}"
            );
            // A typed column.
            let edit = wit::Edit {
                set_columns: vec![decimal(precision, scale, &[0; 4])],
                drop_columns: vec![],
                keep: None,
            };
            assert_eq!(apply_edit(&b, edit).expect_err("refused"), expected);
            // A declared output schema.
            let fields = [wit::Field {
                name: "amount".into(),
                data_type: wit::DataType::Decimal128(wit::DecimalType { precision, scale }),
                nullable: true,
            }];
            assert_eq!(
                arrow_schema(&fields, &b.schema()).expect_err("refused"),
                expected
            );
        }
        let fields = [wit::Field {
            name: "amount".into(),
            data_type: wit::DataType::Decimal128(wit::DecimalType {
                precision: 38,
                scale: 38,
            }),
            nullable: true,
        }];
        let schema = arrow_schema(&fields, &b.schema()).expect("valid");
        assert_eq!(schema.field(0).data_type(), &DataType::Decimal128(38, 38));
    }

    #[test]
    fn decimal_values_beyond_their_precision_are_refused() {
        let b = batch();
        let edit = wit::Edit {
            set_columns: vec![decimal(3, 0, &[1, 999, -999, 1000])],
            drop_columns: vec![],
            keep: None,
        };
        let err = apply_edit(&b, edit).expect_err("1000 needs 4 digits");
        assert!(
            err.contains("1000 is too large to store in a Decimal128 of precision 3"),
            "{err}"
        );
        // The same through IPC (Arrow does not check values when it writes).
        let values = Decimal128Array::from(vec![Some(1), None, Some(-1000)])
            .with_precision_and_scale(3, 0)
            .expect("valid type");
        let wide =
            RecordBatch::try_from_iter([("d", Arc::new(values) as ArrayRef)]).expect("valid batch");
        let err = from_ipc(&to_ipc(&wide).expect("encodes")).expect_err("too wide");
        assert!(
            err.to_string().contains(
                "column \"d\": Invalid argument error: -1000 is too small to store in a Decimal128 of precision 3"
            ),
            "{err}"
        );
    }

    #[test]
    fn malformed_edits_are_refused_with_the_reason() {
        let b = batch();
        let cases = [
            (
                wit::Edit {
                    set_columns: vec![utf8("s", vec![0, 1], b"x")],
                    drop_columns: vec![],
                    keep: None,
                },
                "has 1 values, the batch has 4 rows",
            ),
            (
                wit::Edit {
                    set_columns: vec![utf8("s", vec![0, 2, 1, 1, 1], b"xy")],
                    drop_columns: vec![],
                    keep: None,
                },
                "never decrease",
            ),
            (
                wit::Edit {
                    set_columns: vec![utf8("s", vec![0, 1, 1, 1, 9], b"xy")],
                    drop_columns: vec![],
                    keep: None,
                },
                "column \"s\"",
            ),
            (
                wit::Edit {
                    set_columns: vec![utf8("s", vec![0, 1, 2, 3, 4], &[b'a', 0xff, b'b', b'c'])],
                    drop_columns: vec![],
                    keep: None,
                },
                "column \"s\"",
            ),
            (
                wit::Edit {
                    set_columns: vec![],
                    drop_columns: vec!["nope".into()],
                    keep: None,
                },
                "drop column \"nope\"",
            ),
            (
                wit::Edit {
                    set_columns: vec![],
                    drop_columns: vec![],
                    keep: Some(wit::Selection::Indices(vec![2, 1])),
                },
                "strictly ascending",
            ),
            (
                wit::Edit {
                    set_columns: vec![],
                    drop_columns: vec![],
                    keep: Some(wit::Selection::Indices(vec![7])),
                },
                "selected row 7",
            ),
            (
                wit::Edit {
                    set_columns: vec![wit::Column {
                        name: "n".into(),
                        data_type: wit::DataType::Int64,
                        validity: None,
                        values: wit::ColumnValues::Float64(vec![1.0; 4]),
                    }],
                    drop_columns: vec![],
                    keep: None,
                },
                "declared type Int64",
            ),
        ];
        for (edit, expected) in cases {
            let err = apply_edit(&b, edit).expect_err(expected);
            assert!(err.contains(expected), "{err} should mention {expected}");
        }
    }
}
