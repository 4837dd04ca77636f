//! Fuzzing the readers of a guest's output (`convert.rs`): the Arrow IPC stream a transform may
//! return ([`from_ipc`]) and the typed columns and edits ([`arrow_column`], [`apply_edit`]).
//!
//! A guest may return anything, so these are the host's most exposed parsers. Inputs: arbitrary
//! bytes; the IPC stream of a valid batch with bytes flipped, cut or inserted, and with its
//! 8-byte length and offset fields (message body lengths, buffer offsets and lengths, node
//! lengths and null counts, the batch length) overwritten with huge, negative or slightly wrong
//! values; arbitrary columns of every type with wrong lengths, bitmaps, offsets, precisions;
//! arbitrary edits (set, drop, keep). Properties: no panic; no allocation far beyond the input's
//! size (measured by a counting allocator on the fuzzing thread); a batch that is returned holds
//! valid Arrow data; valid batches and columns round-trip exactly.
//!
//! Shared with the other targets: `crate::fuzz` (configuration, byte mutations). Budget: about
//! 7 000 cases, a few seconds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array,
    Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use proptest::prelude::*;

use super::bindings::wit;
use super::convert::{apply_edit, arrow_column, from_ipc, to_ipc, wit_column};
use crate::fuzz::{ByteEdit, Reach, byte_edits, huge_or_negative, mutate, overwrite_u64, run};

// ---------------------------------------------------------------- allocation accounting

/// The system allocator, noting the largest single request made while a thread tracks.
struct CountingAllocator;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // `try_with`: the allocator also runs while thread-locals are torn down.
    let tracking = TRACKING.try_with(Cell::get).unwrap_or(false);
    if tracking {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// thread-locals touched before are const-initialised `Cell`s, which never allocate.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is `System::alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` and `layout` come from this allocator, i.e. from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `realloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `f` and returns its result with the largest single allocation it made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    TRACKING.with(|t| t.set(true));
    let out = f();
    TRACKING.with(|t| t.set(false));
    (out, LARGEST.with(Cell::get))
}

/// The most a reader may allocate at once for `input_len` bytes of input: generous (Arrow
/// rounds buffers up and decodes into new arrays), but far below what a forged length asks for.
fn allocation_bound(input_len: usize) -> usize {
    (16 << 20) + 64 * input_len
}

// ---------------------------------------------------------------- arrays and batches

/// Arrays of every type plugins see, from optional values.
#[derive(Debug, Clone)]
enum Values {
    Boolean(Vec<Option<bool>>),
    Int32(Vec<Option<i32>>),
    Int64(Vec<Option<i64>>),
    Float64(Vec<Option<f64>>),
    Decimal(Vec<Option<i128>>, u8, i8),
    Utf8(Vec<Option<String>>),
    Timestamp(Vec<Option<i64>>),
    Date32(Vec<Option<i32>>),
}

impl Values {
    fn array(&self) -> ArrayRef {
        match self {
            Self::Boolean(v) => Arc::new(BooleanArray::from(v.clone())),
            Self::Int32(v) => Arc::new(Int32Array::from(v.clone())),
            Self::Int64(v) => Arc::new(Int64Array::from(v.clone())),
            Self::Float64(v) => Arc::new(Float64Array::from(v.clone())),
            Self::Decimal(v, p, s) => Arc::new(
                Decimal128Array::from(v.clone())
                    .with_precision_and_scale(*p, *s)
                    .expect("generated within range"),
            ),
            Self::Utf8(v) => Arc::new(StringArray::from(v.clone())),
            Self::Timestamp(v) => {
                Arc::new(TimestampMicrosecondArray::from(v.clone()).with_timezone("+00:00"))
            }
            Self::Date32(v) => Arc::new(Date32Array::from(v.clone())),
        }
    }
}

fn values(rows: usize) -> impl Strategy<Value = Values> {
    use proptest::collection::vec;
    use proptest::option::of;
    prop_oneof![
        vec(of(any::<bool>()), rows).prop_map(Values::Boolean),
        vec(of(any::<i32>()), rows).prop_map(Values::Int32),
        vec(of(any::<i64>()), rows).prop_map(Values::Int64),
        vec(of(any::<f64>()), rows).prop_map(Values::Float64),
        (1..=38u8, any::<u8>()).prop_flat_map(move |(p, s)| {
            let scale = i8::try_from(u32::from(s) % (u32::from(p) + 1)).unwrap_or(0);
            let bound = 10i128.pow(u32::from(p)) - 1;
            vec(of(-bound..=bound), rows).prop_map(move |v| Values::Decimal(v, p, scale))
        }),
        vec(of(any::<String>()), rows).prop_map(Values::Utf8),
        vec(of(any::<i64>()), rows).prop_map(Values::Timestamp),
        vec(of(any::<i32>()), rows).prop_map(Values::Date32),
    ]
}

/// A batch of up to four columns and up to `max_rows` rows.
fn batch(max_rows: usize) -> impl Strategy<Value = RecordBatch> {
    (0..=max_rows)
        .prop_flat_map(|rows| proptest::collection::vec(values(rows), 1..4))
        .prop_map(|columns| {
            let fields: Vec<Field> = columns
                .iter()
                .enumerate()
                .map(|(i, c)| Field::new(format!("c{i}"), c.array().data_type().clone(), true))
                .collect();
            RecordBatch::try_new(
                Arc::new(Schema::new(fields)),
                columns.iter().map(Values::array).collect(),
            )
            .expect("columns of one length")
        })
}

fn check_valid(batch: &RecordBatch) -> Result<(), TestCaseError> {
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if let Err(e) = column.to_data().validate_full() {
            return Err(TestCaseError::fail(format!(
                "column {} is invalid Arrow data: {e}",
                field.name()
            )));
        }
        prop_assert_eq!(column.len(), batch.num_rows());
    }
    Ok(())
}

// ---------------------------------------------------------------- Arrow IPC

/// Positions of the 8-byte length and offset fields in an IPC stream: each message's body
/// length, and in record batch messages the batch length, the nodes and the buffers.
fn length_fields(stream: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = 0;
    let read_u32 = |at: usize| -> Option<u32> {
        let bytes: [u8; 4] = stream.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(bytes))
    };
    while let Some(word) = read_u32(pos) {
        let (meta_len, meta_at) = if word == u32::MAX {
            let Some(len) = read_u32(pos + 4) else { break };
            (len as usize, pos + 8)
        } else {
            (word as usize, pos + 4)
        };
        if meta_len == 0 {
            break;
        }
        let Some(meta) = stream.get(meta_at..meta_at + meta_len) else {
            break;
        };
        let Ok(message) = arrow_ipc::root_as_message(meta) else {
            break;
        };
        let offset_of = |slice: &[u8]| meta_at + (slice.as_ptr() as usize - meta.as_ptr() as usize);
        let mut find = |value: i64| {
            let needle = value.to_le_bytes();
            for (i, window) in meta.windows(8).enumerate() {
                if window == needle {
                    out.push(meta_at + i);
                }
            }
        };
        let body_len = message.bodyLength();
        if body_len != 0 {
            find(body_len);
        }
        if let Some(batch) = message.header_as_record_batch() {
            if batch.length() != 0 {
                find(batch.length());
            }
            if let Some(nodes) = batch.nodes() {
                let start = offset_of(nodes.bytes());
                out.extend((0..nodes.len() * 2).map(|i| start + 8 * i));
            }
            if let Some(buffers) = batch.buffers() {
                let start = offset_of(buffers.bytes());
                out.extend((0..buffers.len() * 2).map(|i| start + 8 * i));
            }
        }
        let Ok(body_len) = usize::try_from(body_len) else {
            break;
        };
        pos = meta_at + meta_len + body_len;
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `from_ipc` on `bytes` returns a valid batch or an error, without an absurd allocation; true
/// when it returned a batch.
fn check_from_ipc(bytes: &[u8]) -> Result<bool, TestCaseError> {
    let (result, largest) = largest_allocation(|| from_ipc(bytes));
    prop_assert!(
        largest <= allocation_bound(bytes.len()),
        "from_ipc allocated {largest} bytes at once for {} bytes of input",
        bytes.len()
    );
    match result {
        Ok(batch) => check_valid(&batch).map(|()| true),
        Err(e) => {
            prop_assert!(!e.to_string().is_empty());
            Ok(false)
        }
    }
}

#[test]
fn fuzz_ipc_arbitrary_bytes() {
    run(
        1_000,
        proptest::collection::vec(any::<u8>(), 0..600),
        |bytes| check_from_ipc(&bytes).map(drop),
    );
    // A stream start followed by garbage: the continuation marker and a metadata length.
    let prefix = (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..300));
    run(600, prefix, |(meta_len, rest)| {
        let mut bytes = vec![0xff; 4];
        bytes.extend_from_slice(&meta_len.to_le_bytes());
        bytes.extend_from_slice(&rest);
        check_from_ipc(&bytes).map(drop)
    });
}

#[test]
fn fuzz_ipc_round_trip() {
    run(500, batch(20), |batch| {
        let bytes = to_ipc(&batch).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let back = from_ipc(&bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(back, batch);
        Ok(())
    });
}

/// How a valid stream is damaged.
#[derive(Debug, Clone)]
struct IpcDamage {
    /// (which length field, its new value).
    fields: Vec<(usize, u64)>,
    bytes: Vec<ByteEdit>,
    /// Apply the byte edits too.
    with_bytes: bool,
}

fn ipc_damage() -> impl Strategy<Value = IpcDamage> {
    (
        proptest::collection::vec((any::<usize>(), huge_or_negative()), 0..3),
        byte_edits(4),
        any::<bool>(),
    )
        .prop_map(|(fields, bytes, with_bytes)| IpcDamage {
            with_bytes: with_bytes || fields.is_empty(),
            fields,
            bytes,
        })
}

#[test]
fn fuzz_ipc_mutated_streams() {
    let (read, refused) = (Reach::default(), Reach::default());
    run(2_500, (batch(6), ipc_damage()), |(batch, damage)| {
        let valid = to_ipc(&batch).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let positions = length_fields(&valid);
        prop_assert!(!positions.is_empty(), "no length field found");
        let mut bytes = valid;
        for (which, value) in &damage.fields {
            overwrite_u64(&mut bytes, positions[which % positions.len()], *value);
        }
        if damage.with_bytes {
            bytes = mutate(&bytes, &damage.bytes);
        }
        if check_from_ipc(&bytes)? {
            read.hit();
        } else {
            refused.hit();
        }
        Ok(())
    });
    read.check("a damaged stream read as a batch", 2_500);
    refused.check("a damaged stream refused", 2_500);
}

#[test]
fn fuzz_ipc_length_fields_are_found() {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)])),
        vec![Arc::new(Int64Array::from(vec![Some(1), None, Some(3)]))],
    )
    .expect("batch");
    let bytes = to_ipc(&batch).expect("encodes");
    let positions = length_fields(&bytes);
    // Body length, batch length, one node (length, null count), two buffers (offset, length).
    assert!(positions.len() >= 7, "{positions:?}");
    for &at in &positions {
        let mut damaged = bytes.clone();
        overwrite_u64(&mut damaged, at, u64::MAX);
        assert_ne!(damaged, bytes, "field at {at}");
    }
}

/// Regressions: what this target found in arrow-ipc before `ipc_check` (a panic slicing a
/// buffer at offset 2^32 or of length -8, a body length of 2^40 aborting on allocation). Every
/// length field of a small stream, set to each forged value, is refused or read safely.
#[test]
fn fuzz_ipc_regression_forged_lengths() {
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ])),
        vec![
            Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])),
            Arc::new(StringArray::from(vec![Some("x"), Some("yz"), None])),
        ],
    )
    .expect("batch");
    let valid = to_ipc(&batch).expect("encodes");
    let positions = length_fields(&valid);
    assert!(positions.len() >= 10, "{positions:?}");
    for &at in &positions {
        for value in [
            1 << 32,
            (-8i64) as u64,
            1 << 40,
            u64::MAX,
            i64::MIN as u64,
            7,
        ] {
            let mut bytes = valid.clone();
            overwrite_u64(&mut bytes, at, value);
            if let Err(e) = check_from_ipc(&bytes) {
                panic!("field at byte {at} set to {value}: {e}");
            }
        }
    }
}

// ---------------------------------------------------------------- typed columns and edits

fn wit_data_type() -> impl Strategy<Value = wit::DataType> {
    prop_oneof![
        Just(wit::DataType::Boolean),
        Just(wit::DataType::Int32),
        Just(wit::DataType::Int64),
        Just(wit::DataType::Float64),
        (any::<u8>(), any::<i8>()).prop_map(|(precision, scale)| {
            wit::DataType::Decimal128(wit::DecimalType { precision, scale })
        }),
        (1..=38u8, 0..=38i8).prop_map(|(precision, scale)| {
            wit::DataType::Decimal128(wit::DecimalType { precision, scale })
        }),
        Just(wit::DataType::Utf8),
        Just(wit::DataType::TimestampMicros),
        Just(wit::DataType::Date32),
    ]
}

/// A length near `rows` (most often exactly it) or anything small.
fn len_near(rows: usize) -> impl Strategy<Value = usize> {
    prop_oneof![
        4 => Just(rows),
        1 => Just(rows.saturating_sub(1)),
        1 => Just(rows + 1),
        1 => 0..40usize,
    ]
}

fn utf8_values(rows: usize) -> impl Strategy<Value = wit::Utf8Values> {
    let valid = proptest::collection::vec(any::<String>(), rows).prop_map(|strings| {
        let mut offsets = vec![0i32];
        let mut data = Vec::new();
        for s in &strings {
            data.extend_from_slice(s.as_bytes());
            offsets.push(i32::try_from(data.len()).unwrap_or(i32::MAX));
        }
        wit::Utf8Values { offsets, data }
    });
    let arbitrary = (
        len_near(rows + 1).prop_flat_map(|n| proptest::collection::vec(any::<i32>(), n)),
        proptest::collection::vec(any::<u8>(), 0..40),
    )
        .prop_map(|(offsets, data)| wit::Utf8Values { offsets, data });
    let damaged = (valid.clone(), any::<usize>(), any::<i32>()).prop_map(|(mut v, at, value)| {
        if !v.offsets.is_empty() {
            let n = v.offsets.len();
            v.offsets[at % n] = value;
        }
        v
    });
    let bad_utf8 = (valid.clone(), any::<usize>()).prop_map(|(mut v, at)| {
        if !v.data.is_empty() {
            let n = v.data.len();
            v.data[at % n] = 0xff;
        }
        v
    });
    prop_oneof![3 => valid, 1 => arbitrary, 1 => damaged, 1 => bad_utf8]
}

fn column_values(rows: usize) -> impl Strategy<Value = wit::ColumnValues> {
    use proptest::collection::vec;
    let n = || len_near(rows);
    prop_oneof![
        len_near(rows.div_ceil(8))
            .prop_flat_map(|n| vec(any::<u8>(), n))
            .prop_map(wit::ColumnValues::Boolean),
        n().prop_flat_map(|n| vec(any::<i32>(), n))
            .prop_map(wit::ColumnValues::Int32),
        n().prop_flat_map(|n| vec(any::<i64>(), n))
            .prop_map(wit::ColumnValues::Int64),
        n().prop_flat_map(|n| vec(any::<f64>(), n))
            .prop_map(wit::ColumnValues::Float64),
        n().prop_flat_map(|n| vec(any::<u8>(), n * 16))
            .prop_map(wit::ColumnValues::Decimal128),
        utf8_values(rows).prop_map(wit::ColumnValues::Utf8),
        n().prop_flat_map(|n| vec(any::<i64>(), n))
            .prop_map(wit::ColumnValues::TimestampMicros),
        n().prop_flat_map(|n| vec(any::<i32>(), n))
            .prop_map(wit::ColumnValues::Date32),
    ]
}

fn column(rows: usize) -> impl Strategy<Value = wit::Column> {
    let validity = proptest::option::of(
        len_near(rows.div_ceil(8)).prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n)),
    );
    (
        prop_oneof![
            Just("c0".to_owned()),
            Just("new".to_owned()),
            any::<String>()
        ],
        wit_data_type(),
        validity,
        column_values(rows),
    )
        .prop_map(|(name, data_type, validity, values)| wit::Column {
            name,
            data_type,
            validity,
            values,
        })
}

fn edit(rows: usize, names: Vec<String>) -> impl Strategy<Value = wit::Edit> {
    let drop_name = prop_oneof![
        3 => proptest::sample::select(names),
        1 => any::<String>(),
    ];
    let keep = proptest::option::of(prop_oneof![
        len_near(rows.div_ceil(8))
            .prop_flat_map(|n| proptest::collection::vec(any::<u8>(), n))
            .prop_map(wit::Selection::Mask),
        proptest::collection::vec(0..(rows as u32 + 2), 0..(rows + 2))
            .prop_map(wit::Selection::Indices),
        proptest::collection::btree_set(0..(rows as u32).max(1), 0..(rows + 1))
            .prop_map(|s| wit::Selection::Indices(s.into_iter().collect())),
    ]);
    (
        proptest::collection::vec(column(rows), 0..3),
        proptest::collection::vec(drop_name, 0..2),
        keep,
    )
        .prop_map(|(set_columns, drop_columns, keep)| wit::Edit {
            set_columns,
            drop_columns,
            keep,
        })
}

#[test]
fn fuzz_columns_and_edits() {
    let strategy = batch(12).prop_flat_map(|input| {
        let rows = input.num_rows();
        let names: Vec<String> = input
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        (Just(input), column(rows), edit(rows, names))
    });
    run(1_500, strategy, |(input, column, edit)| {
        let rows = input.num_rows();
        match arrow_column(column, rows, None) {
            Ok((field, array)) => {
                prop_assert_eq!(array.len(), rows);
                prop_assert_eq!(field.data_type(), array.data_type());
                if let Err(e) = array.to_data().validate_full() {
                    return Err(TestCaseError::fail(format!("invalid column accepted: {e}")));
                }
            }
            Err(message) => prop_assert!(message.starts_with("column "), "{message}"),
        }
        match apply_edit(&input, edit) {
            Ok(out) => {
                check_valid(&out)?;
                prop_assert!(out.num_rows() <= rows);
            }
            Err(message) => prop_assert!(!message.is_empty()),
        }
        Ok(())
    });
}

#[test]
fn fuzz_columns_round_trip_through_wit() {
    let strategy = batch(20).prop_flat_map(|b| {
        let rows = b.num_rows();
        (Just(b), 0..=rows)
            .prop_flat_map(move |(b, start)| (Just(b), Just(start), 0..=rows - start))
    });
    run(800, strategy, |(batch, start, len)| {
        let sliced = batch.slice(start, len);
        for (field, array) in sliced.schema().fields().iter().zip(sliced.columns()) {
            let column = wit_column(field, array)
                .map_err(|(name, ty)| TestCaseError::fail(format!("{name}: {ty}")))?;
            let (back_field, back) =
                arrow_column(column, len, Some(field.data_type())).map_err(TestCaseError::fail)?;
            prop_assert_eq!(back_field.data_type(), field.data_type());
            prop_assert_eq!(back.as_ref(), array.as_ref());
        }
        Ok(())
    });
}

#[test]
fn fuzz_ipc_allocation_accounting_sees_allocations() {
    let ((), largest) = largest_allocation(|| {
        let v: Vec<u8> = Vec::with_capacity(1 << 20);
        drop(std::hint::black_box(v));
    });
    assert!(largest >= 1 << 20, "{largest}");
    let ((), none) = largest_allocation(|| {});
    assert_eq!(none, 0);
    assert_eq!(
        DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        Values::Timestamp(vec![]).array().data_type().clone()
    );
}

/// Regression: a one-row batch of a long string and a null int whose length fields are set,
/// one at a time, to every small value (the fuzzer found a buffer of 249 bytes that passed
/// `ipc_check` and made arrow panic on alignment). Each is refused or read safely.
#[test]
fn fuzz_ipc_regression_small_lengths() {
    let text = "\u{a4b} Ꟑ  ఒᠠA🟠0 ￼0\u{1cf00}®\u{10a3f}®¡𝕆𖩀®Aꬨ ®𑘀 ףּ";
    let batch = RecordBatch::try_new(
        Arc::new(Schema::new(vec![
            Field::new("s", DataType::Utf8, true),
            Field::new("i", DataType::Int32, true),
        ])),
        vec![
            Arc::new(StringArray::from(vec![Some(text)])),
            Arc::new(Int32Array::from(vec![None::<i32>])),
        ],
    )
    .expect("batch");
    let valid = to_ipc(&batch).expect("encodes");
    for &at in &length_fields(&valid) {
        for value in 0..=300u64 {
            let mut bytes = valid.clone();
            overwrite_u64(&mut bytes, at, value);
            if let Err(e) = check_from_ipc(&bytes) {
                panic!("field at byte {at} set to {value}: {e}");
            }
        }
    }
}
