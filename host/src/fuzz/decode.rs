//! Fuzzing the JSON-lines and CSV decoders ([`crate::decode::Decoder`]).
//!
//! Inputs: arbitrary bytes, JSON token soup, and valid records of a schema with every supported
//! type (every timestamp unit included) rendered as JSON lines or CSV, then mutated byte by byte.
//! Each input is decoded under every malformed-line policy with a small random batch size.
//! Properties: no panic; the accounting contract of `decode/mod.rs` (every non-blank line but a
//! CSV header is an input row; permissive keeps every row and fills `_corrupt_record` for exactly
//! the malformed ones; drop and dead-letter keep `rows + malformed = input rows`, dead-letter
//! returns each malformed line; fail errors exactly when another policy counts a malformed line,
//! at the first one's line number); batches no larger than the batch size, of the output schema,
//! with valid Arrow data and decimals within their precision; and after any input, good or bad,
//! the decoder decodes the next file correctly; and decoding every line by the line path (the
//! newline searched first) gives exactly what the JSON scan to each newline gives, under every
//! policy, and so does decoding the input a few lines at a time, as a file is read. Unmutated
//! records round-trip exactly.
//!
//! Budget: about 3 500 inputs, most decoded thirteen times, a few seconds.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use proptest::prelude::*;

use super::{ByteEdit, Reach, byte_edits, mutate, run};
use crate::decode::{
    CORRUPT_RECORD_COLUMN, CsvOptions, DecodeError, Decoded, Decoder, DecoderOptions, Format,
    MalformedPolicy,
};

const POLICIES: [MalformedPolicy; 4] = [
    MalformedPolicy::Permissive,
    MalformedPolicy::Drop,
    MalformedPolicy::Fail,
    MalformedPolicy::DeadLetter,
];

/// Every type the decoder produces; the columns after `dt` are filled only in mutated inputs
/// (their values are checked for panics and validity, not round-tripped).
fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("b", DataType::Boolean, true),
        Field::new("i", DataType::Int32, true),
        Field::new("l", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("d", DataType::Decimal128(5, 1), true),
        Field::new("big", DataType::Decimal128(38, 0), true),
        Field::new("s", DataType::Utf8, true),
        Field::new(
            "tus",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("dt", DataType::Date32, true),
        Field::new("frac", DataType::Decimal128(38, 38), true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Second, None), true),
        Field::new(
            "tms",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new(
            "tns",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("+05:30".into())),
            true,
        ),
    ]))
}

/// The first columns of [`schema`], as generated.
#[derive(Debug, Clone)]
struct Record {
    b: Option<bool>,
    i: Option<i32>,
    l: Option<i64>,
    f: Option<f64>,
    /// Tenths (DECIMAL(5,1)).
    d: Option<i16>,
    big: Option<i128>,
    s: Option<String>,
    /// Microseconds since the epoch, years 0001 to 9999.
    tus: Option<i64>,
    /// Days since the epoch, years 0001 to 9999.
    dt: Option<i32>,
    /// Render `d` and `big` as JSON strings rather than numbers.
    quoted_numbers: bool,
}

const MIN_MICROS: i64 = -62_135_596_800_000_000;
const MAX_MICROS: i64 = 253_402_300_799_999_999;
const MAX_BIG: i128 = 10i128.pow(38) - 1;

fn record() -> impl Strategy<Value = Record> {
    let f = prop_oneof![
        proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO,
        -1e6..1e6f64,
    ];
    (
        (
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<i32>()),
            proptest::option::of(any::<i64>()),
            proptest::option::of(f),
            proptest::option::of(-9_999..=9_999i16),
        ),
        (
            proptest::option::of(-MAX_BIG..=MAX_BIG),
            proptest::option::of(any::<String>()),
            proptest::option::of(MIN_MICROS..=MAX_MICROS),
            proptest::option::of(-719_162..=2_932_896i32),
            any::<bool>(),
        ),
    )
        .prop_map(
            |((b, i, l, f, d), (big, s, tus, dt, quoted_numbers))| Record {
                b,
                i,
                l,
                f,
                d,
                big,
                s,
                tus,
                dt,
                quoted_numbers,
            },
        )
}

fn date_text(days: i64) -> String {
    let (y, m, d) = crate::calendar::civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}")
}

fn timestamp_text(micros: i64) -> String {
    let secs = micros.div_euclid(1_000_000);
    let frac = micros.rem_euclid(1_000_000);
    let day = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    format!(
        "{}T{:02}:{:02}:{:02}.{frac:06}Z",
        date_text(day),
        tod / 3_600,
        tod / 60 % 60,
        tod % 60
    )
}

fn tenths_text(v: i16) -> String {
    let sign = if v < 0 { "-" } else { "" };
    let a = v.unsigned_abs();
    format!("{sign}{}.{}", a / 10, a % 10)
}

impl Record {
    /// The fields as (key, JSON text), in schema order; `extra` fills the last columns too.
    fn json_fields(&self, extra: bool) -> Vec<(&'static str, String)> {
        let json = |s: &str| serde_json::Value::from(s).to_string();
        let number = |text: String| {
            if self.quoted_numbers {
                json(&text)
            } else {
                text
            }
        };
        let mut out = Vec::new();
        let mut put = |key: &'static str, value: Option<String>| {
            out.push((key, value.unwrap_or_else(|| "null".to_owned())));
        };
        put("b", self.b.map(|v| v.to_string()));
        put("i", self.i.map(|v| v.to_string()));
        put("l", self.l.map(|v| v.to_string()));
        put("f", self.f.map(|v| format!("{v:?}")));
        put("d", self.d.map(|v| number(tenths_text(v))));
        put("big", self.big.map(|v| number(v.to_string())));
        put("s", self.s.as_deref().map(json));
        put("tus", self.tus.map(|v| json(&timestamp_text(v))));
        put("dt", self.dt.map(|v| json(&date_text(i64::from(v)))));
        if extra {
            put("frac", self.d.map(|v| format!("0.{}", v.unsigned_abs())));
            let ts = self.tus.map(|v| json(&timestamp_text(v)));
            put("ts", ts.clone());
            put("tms", self.l.map(|v| v.to_string()).or_else(|| ts.clone()));
            put("tns", ts);
        }
        out
    }

    fn json_line(&self, order: &[usize], extra: bool) -> String {
        let fields = self.json_fields(extra);
        let mut parts: Vec<String> = order
            .iter()
            .filter_map(|&k| fields.get(k))
            .map(|(key, value)| format!("\"{key}\":{value}"))
            .collect();
        if extra {
            parts.push("\"zz\":[1,{\"a\":null},\"x\"]".to_owned());
        }
        format!("{{{}}}", parts.join(","))
    }

    /// The record as one CSV line (strings always quoted, line breaks removed from them).
    fn csv_line(&self, delimiter: u8, extra: bool) -> String {
        let delimiter = char::from(delimiter);
        let mut cells: Vec<String> = self
            .json_fields(extra)
            .into_iter()
            .map(|(key, value)| match (key, value.as_str()) {
                (_, "null") => String::new(),
                ("s", _) => {
                    let s = self
                        .s
                        .as_deref()
                        .unwrap_or_default()
                        .replace(['\n', '\r'], " ");
                    format!("\"{}\"", s.replace('"', "\"\""))
                }
                _ => value.trim_matches('"').to_owned(),
            })
            .collect();
        if !extra {
            cells.extend(std::iter::repeat_n(String::new(), 4));
        }
        cells.join(&delimiter.to_string())
    }
}

/// The input of one case.
#[derive(Debug, Clone)]
enum Input {
    Bytes(Vec<u8>),
    Records {
        records: Vec<Record>,
        order: Vec<usize>,
        crlf: bool,
        edits: Vec<ByteEdit>,
    },
}

fn format() -> impl Strategy<Value = Format> {
    prop_oneof![
        Just(Format::JsonLines),
        (any::<bool>(), proptest::sample::select(&b",;|\t a0\\'"[..])).prop_map(
            |(header, delimiter)| Format::Csv(CsvOptions {
                header,
                delimiter,
                quote: b'"',
            })
        ),
    ]
}

fn input() -> impl Strategy<Value = Input> {
    // Schema order, as most producers write, is the order the scanner's compact path takes.
    let order = prop_oneof![
        Just((0..13).collect::<Vec<usize>>()),
        Just((0..13).collect::<Vec<usize>>()).prop_shuffle(),
    ];
    prop_oneof![
        2 => proptest::collection::vec(any::<u8>(), 0..400).prop_map(Input::Bytes),
        2 => "([{}\\[\\]\",:0-9a-z.eE+ \\\\-]{0,40}\r?\n){0,6}"
            .prop_map(|s| Input::Bytes(s.into_bytes())),
        5 => (
            proptest::collection::vec(record(), 1..5),
            order,
            any::<bool>(),
            byte_edits(4),
        )
            .prop_map(|(records, order, crlf, edits)| Input::Records {
                records,
                order,
                crlf,
                edits,
            }),
    ]
}

fn render(input: &Input, format: &Format) -> Vec<u8> {
    match input {
        Input::Bytes(bytes) => bytes.clone(),
        Input::Records {
            records,
            order,
            crlf,
            edits,
        } => {
            let eol = if *crlf { "\r\n" } else { "\n" };
            let mut text = String::new();
            if let Format::Csv(o) = format
                && o.header
            {
                text.push_str("b,i,l,f,d,big,s,tus,dt,frac,ts,tms,tns");
                text.push_str(eol);
            }
            for r in records {
                match format {
                    Format::JsonLines => text.push_str(&r.json_line(order, true)),
                    Format::Csv(o) => text.push_str(&r.csv_line(o.delimiter, true)),
                }
                text.push_str(eol);
            }
            mutate(text.as_bytes(), edits)
        }
    }
}

/// Non-blank lines, less a CSV header: the input rows the decoder must count.
fn expected_input_rows(input: &[u8], format: &Format) -> u64 {
    let non_blank = input
        .split(|&b| b == b'\n')
        .filter(|line| !line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r')))
        .count() as u64;
    match format {
        Format::Csv(o) if o.header => non_blank.saturating_sub(1),
        _ => non_blank,
    }
}

fn options(format: &Format, policy: MalformedPolicy, batch_size: usize) -> DecoderOptions {
    DecoderOptions {
        format: format.clone(),
        policy,
        batch_size,
    }
}

/// Checks the shape of every batch: size, schema, valid data, decimals within precision.
fn check_batches(out: &Decoded, decoder: &Decoder, batch_size: usize) -> Result<(), TestCaseError> {
    for batch in &out.batches {
        prop_assert!(batch.num_rows() >= 1 && batch.num_rows() <= batch_size);
        prop_assert_eq!(batch.schema_ref(), decoder.output_schema());
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            let data = column.to_data();
            if let Err(e) = data.validate_full() {
                return Err(TestCaseError::fail(format!(
                    "column {} is invalid Arrow data: {e}",
                    field.name()
                )));
            }
            if let DataType::Decimal128(p, _) = field.data_type() {
                let decimals = column.as_primitive::<Decimal128Type>();
                if let Err(e) = decimals.validate_decimal_precision(*p) {
                    return Err(TestCaseError::fail(format!(
                        "column {}: a value exceeds DECIMAL precision {p}: {e}",
                        field.name()
                    )));
                }
            }
        }
    }
    Ok(())
}

fn rows(out: &Decoded) -> u64 {
    out.batches.iter().map(|b| b.num_rows() as u64).sum()
}

/// One line that every format decodes to one row with `l = 7`, to check a decoder after an input.
fn probe(format: &Format) -> Vec<u8> {
    let record = Record {
        b: None,
        i: None,
        l: Some(7),
        f: None,
        d: None,
        big: None,
        s: None,
        tus: None,
        dt: None,
        quoted_numbers: false,
    };
    match format {
        Format::JsonLines => b"{\"l\":7}\n".to_vec(),
        Format::Csv(o) => {
            let mut text = if o.header {
                "header\n".to_owned()
            } else {
                String::new()
            };
            text.push_str(&record.csv_line(o.delimiter, false));
            text.push('\n');
            text.into_bytes()
        }
    }
}

fn check_decoder_recovers(decoder: &mut Decoder, format: &Format) -> Result<(), TestCaseError> {
    let mut out = Decoded::default();
    let result = decoder.decode(&probe(format), "probe", &mut out);
    prop_assert!(
        result.is_ok(),
        "the decoder is broken after the input: {result:?}"
    );
    prop_assert_eq!(
        (out.num_input_rows, out.num_malformed, rows(&out)),
        (1, 0, 1)
    );
    let l = out.batches[0].column(2).as_primitive::<Int64Type>();
    prop_assert_eq!(l.iter().collect::<Vec<_>>(), vec![Some(7)]);
    Ok(())
}

/// Decodes `input` under every policy and checks the accounting contract between them; returns
/// the rows kept and the malformed lines counted under the drop policy.
fn check_policies(
    input: &[u8],
    format: &Format,
    batch_size: usize,
) -> Result<(u64, u64), TestCaseError> {
    let expected_rows = expected_input_rows(input, format);
    let mut malformed_counts = Vec::new();
    let mut first_malformed_line = None;
    let mut fail_result = None;
    let mut dropped = (0, 0);
    for policy in POLICIES {
        let mut decoder = Decoder::new(schema(), options(format, policy, batch_size))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut out = Decoded::default();
        let result = decoder.decode(input, "fuzz.in", &mut out);
        check_other_paths(input, format, policy, batch_size, &out, &result)?;
        match (policy, result) {
            (MalformedPolicy::Fail, Err(e)) => {
                prop_assert!(out.batches.is_empty() && out.num_input_rows == 0);
                fail_result = Some(Err(e));
            }
            (MalformedPolicy::Fail, Ok(())) => {
                prop_assert_eq!(out.num_malformed, 0);
                prop_assert_eq!(rows(&out), out.num_input_rows);
                fail_result = Some(Ok(()));
            }
            (_, Err(e)) => return Err(TestCaseError::fail(format!("{policy:?} failed: {e}"))),
            (_, Ok(())) => {}
        }
        if policy != MalformedPolicy::Fail {
            prop_assert_eq!(out.num_input_rows, expected_rows, "{:?}", policy);
            malformed_counts.push(out.num_malformed);
        }
        match policy {
            MalformedPolicy::Permissive => {
                prop_assert_eq!(rows(&out), out.num_input_rows);
                let corrupt: u64 = out
                    .batches
                    .iter()
                    .map(|b| {
                        let c = b
                            .column_by_name(CORRUPT_RECORD_COLUMN)
                            .expect("permissive output has _corrupt_record");
                        (c.len() - c.null_count()) as u64
                    })
                    .sum();
                prop_assert_eq!(corrupt, out.num_malformed);
            }
            MalformedPolicy::Drop => {
                dropped = (rows(&out), out.num_malformed);
                prop_assert_eq!(rows(&out) + out.num_malformed, out.num_input_rows);
                prop_assert!(out.malformed.is_empty());
            }
            MalformedPolicy::DeadLetter => {
                prop_assert_eq!(rows(&out) + out.num_malformed, out.num_input_rows);
                prop_assert_eq!(out.malformed.len() as u64, out.num_malformed);
                first_malformed_line = out.malformed.first().map(|m| m.line);
                for m in &out.malformed {
                    prop_assert_eq!(m.origin.as_str(), "fuzz.in");
                    prop_assert!(!m.error.is_empty());
                }
            }
            MalformedPolicy::Fail => {}
        }
        check_batches(&out, &decoder, batch_size)?;
        check_decoder_recovers(&mut decoder, format)?;
    }
    prop_assert!(
        malformed_counts.windows(2).all(|w| w[0] == w[1]),
        "policies disagree on malformed lines: {malformed_counts:?}"
    );
    match fail_result {
        Some(Err(DecodeError::Malformed { line, origin, .. })) => {
            prop_assert_eq!(origin.as_str(), "fuzz.in");
            prop_assert_eq!(Some(line), first_malformed_line);
        }
        Some(Ok(())) => prop_assert_eq!(first_malformed_line, None),
        other => return Err(TestCaseError::fail(format!("fail policy: {other:?}"))),
    }
    Ok(dropped)
}

/// Decoding `input` by the other paths gives what `out` and `result` hold: line by line (a
/// search for each newline, then the line parsed) rather than each JSON line scanned in one
/// pass to its newline; every key by the scanner's general steps, none with its comma in one
/// comparison; and a piece at a time, as a file is read (pieces of one to three
/// lines, each ending at a newline).
fn check_other_paths(
    input: &[u8],
    format: &Format,
    policy: MalformedPolicy,
    batch_size: usize,
    out: &Decoded,
    result: &Result<(), DecodeError>,
) -> Result<(), TestCaseError> {
    let decoder = || {
        Decoder::new(schema(), options(format, policy, batch_size))
            .map_err(|e| TestCaseError::fail(e.to_string()))
    };
    let mut by_line_decoder = decoder()?;
    by_line_decoder.line_by_line = true;
    let mut by_line = Decoded::default();
    let by_line_result = by_line_decoder.decode(input, "fuzz.in", &mut by_line);
    same_decoding((&by_line, &by_line_result), (out, result), policy)?;

    let mut general_decoder = decoder()?;
    general_decoder.without_leads();
    let mut general = Decoded::default();
    let general_result = general_decoder.decode(input, "fuzz.in", &mut general);
    same_decoding((&general, &general_result), (out, result), policy)?;

    let mut decoder = decoder()?;
    let lines_a_piece = 1 + input.len() % 3;
    let ends = memchr::memchr_iter(b'\n', input)
        .skip(lines_a_piece - 1)
        .step_by(lines_a_piece)
        .map(|k| k + 1)
        .chain([input.len()]);
    let mut by_piece = Decoded::default();
    let in_pieces = || {
        let mut pieces = decoder.start_pieces();
        let mut from = 0;
        for end in ends {
            pieces = decoder.decode_piece(pieces, &input[from..end], "fuzz.in")?;
            from = end;
        }
        decoder.finish_pieces(pieces, "fuzz.in", &mut by_piece)
    };
    let piece_result = in_pieces();
    same_decoding((&by_piece, &piece_result), (out, result), policy)?;
    check_decoder_recovers(&mut decoder, format)
}

/// Two decodings of one input gave the same error, batches, counts and malformed records.
fn same_decoding(
    (got, got_result): (&Decoded, &Result<(), DecodeError>),
    (out, result): (&Decoded, &Result<(), DecodeError>),
    policy: MalformedPolicy,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(format!("{got_result:?}"), format!("{result:?}"));
    prop_assert_eq!(&got.batches, &out.batches, "{:?}", policy);
    prop_assert_eq!(got.num_input_rows, out.num_input_rows);
    prop_assert_eq!(got.num_malformed, out.num_malformed);
    prop_assert_eq!(&got.malformed, &out.malformed);
    Ok(())
}

#[test]
fn fuzz_decode_every_policy() {
    let strategy = (input(), format(), 1..=4usize);
    let mixed = Reach::default();
    run(2_500, strategy, |(input, format, batch_size)| {
        let (kept, malformed) = check_policies(&render(&input, &format), &format, batch_size)?;
        if kept > 0 && malformed > 0 {
            mixed.hit();
        }
        Ok(())
    });
    mixed.check("an input with good and malformed lines", 2_500);
}

/// The decoded rows of valid records equal the records.
fn check_round_trip(records: &[Record], batches: &[RecordBatch]) -> Result<(), TestCaseError> {
    let batch = arrow_select::concat::concat_batches(&batches[0].schema(), batches)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(batch.num_rows(), records.len());
    let col = |name: &str| batch.column_by_name(name).expect("schema column");
    let bools: Vec<_> = col("b").as_boolean().iter().collect();
    prop_assert_eq!(bools, records.iter().map(|r| r.b).collect::<Vec<_>>());
    let ints: Vec<_> = col("i").as_primitive::<Int32Type>().iter().collect();
    prop_assert_eq!(ints, records.iter().map(|r| r.i).collect::<Vec<_>>());
    let longs: Vec<_> = col("l").as_primitive::<Int64Type>().iter().collect();
    prop_assert_eq!(longs, records.iter().map(|r| r.l).collect::<Vec<_>>());
    let floats: Vec<_> = col("f")
        .as_primitive::<Float64Type>()
        .iter()
        .map(|v| v.map(f64::to_bits))
        .collect();
    let want: Vec<_> = records.iter().map(|r| r.f.map(f64::to_bits)).collect();
    prop_assert_eq!(floats, want);
    let tenths: Vec<_> = col("d").as_primitive::<Decimal128Type>().iter().collect();
    let want: Vec<_> = records.iter().map(|r| r.d.map(i128::from)).collect();
    prop_assert_eq!(tenths, want);
    let big: Vec<_> = col("big").as_primitive::<Decimal128Type>().iter().collect();
    prop_assert_eq!(big, records.iter().map(|r| r.big).collect::<Vec<_>>());
    let strings: Vec<_> = col("s").as_string::<i32>().iter().collect();
    let want: Vec<_> = records.iter().map(|r| r.s.as_deref()).collect();
    prop_assert_eq!(strings, want);
    let micros: Vec<_> = col("tus")
        .as_primitive::<TimestampMicrosecondType>()
        .iter()
        .collect();
    prop_assert_eq!(micros, records.iter().map(|r| r.tus).collect::<Vec<_>>());
    let days: Vec<_> = col("dt").as_primitive::<Date32Type>().iter().collect();
    prop_assert_eq!(days, records.iter().map(|r| r.dt).collect::<Vec<_>>());
    Ok(())
}

#[test]
fn fuzz_decode_valid_records_round_trip() {
    let format = prop_oneof![
        Just(Format::JsonLines),
        (any::<bool>(), proptest::sample::select(&b",;|"[..])).prop_map(|(header, delimiter)| {
            Format::Csv(CsvOptions {
                header,
                delimiter,
                quote: b'"',
            })
        }),
    ];
    let order = prop_oneof![
        Just((0..9).collect::<Vec<usize>>()),
        Just((0..9).collect::<Vec<usize>>()).prop_shuffle(),
    ];
    let strategy = (
        proptest::collection::vec(record(), 1..6),
        order,
        format,
        1..=3usize,
    );
    run(
        1_000,
        strategy,
        |(mut records, order, format, batch_size)| {
            let mut text = String::new();
            if let Format::Csv(o) = &format {
                if o.header {
                    text.push_str("a header line\n");
                }
                // CSV strings cannot hold line breaks in this version.
                for r in &mut records {
                    r.s = r.s.as_deref().map(|s| s.replace(['\n', '\r'], " "));
                }
            }
            for r in &records {
                match &format {
                    Format::JsonLines => text.push_str(&r.json_line(&order, false)),
                    Format::Csv(o) => text.push_str(&r.csv_line(o.delimiter, false)),
                }
                text.push('\n');
            }
            let mut decoder = Decoder::new(
                schema(),
                options(&format, MalformedPolicy::Fail, batch_size),
            )
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let mut out = Decoded::default();
            if let Err(e) = decoder.decode(text.as_bytes(), "valid", &mut out) {
                return Err(TestCaseError::fail(format!("{e}\ninput:\n{text}")));
            }
            prop_assert_eq!(
                (out.num_input_rows, out.num_malformed),
                (records.len() as u64, 0)
            );
            check_round_trip(&records, &out.batches)
        },
    );
}

#[test]
fn fuzz_decode_helpers_render_known_values() {
    assert_eq!(date_text(0), "1970-01-01");
    assert_eq!(date_text(19_783), "2024-03-01");
    assert_eq!(date_text(-719_162), "0001-01-01");
    assert_eq!(date_text(2_932_896), "9999-12-31");
    assert_eq!(timestamp_text(-1), "1969-12-31T23:59:59.999999Z");
    assert_eq!(timestamp_text(MAX_MICROS), "9999-12-31T23:59:59.999999Z");
    assert_eq!(tenths_text(-5), "-0.5");
    let text = String::from_utf8(render(
        &Input::Records {
            records: vec![Record {
                b: Some(true),
                i: None,
                l: Some(-3),
                f: Some(0.5),
                d: Some(12),
                big: None,
                s: Some("a\"b".into()),
                tus: Some(0),
                dt: Some(1),
                quoted_numbers: true,
            }],
            order: (0..13).collect(),
            crlf: false,
            edits: Vec::new(),
        },
        &Format::JsonLines,
    ))
    .expect("UTF-8");
    assert_eq!(
        text,
        "{\"b\":true,\"i\":null,\"l\":-3,\"f\":0.5,\"d\":\"1.2\",\"big\":null,\"s\":\"a\\\"b\",\
         \"tus\":\"1970-01-01T00:00:00.000000Z\",\"dt\":\"1970-01-02\",\"frac\":0.12,\
         \"ts\":\"1970-01-01T00:00:00.000000Z\",\"tms\":-3,\"tns\":\"1970-01-01T00:00:00.000000Z\",\
         \"zz\":[1,{\"a\":null},\"x\"]}\n"
    );
}
