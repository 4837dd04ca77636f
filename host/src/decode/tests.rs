use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Float64Type, Int32Type, Int64Type, TimestampMicrosecondType,
    TimestampMillisecondType,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::*;

const SAMPLE: &str = r#"{"order_id":10000123,"customer_id":4711,"status":"completed","amount":23.90,"occurred_at":"2024-03-01T00:03:07.123Z","session_id":"s-3878e9ee53800058"}"#;
/// 2024-03-01T00:00:00Z in microseconds.
const MAR1: i64 = 19_783 * 86_400_000_000;

fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, false),
        Field::new("customer_id", DataType::Int64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new(
            "occurred_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("session_id", DataType::Utf8, true),
    ]))
}

fn options(format: Format, policy: MalformedPolicy) -> DecoderOptions {
    DecoderOptions {
        format,
        policy,
        ..DecoderOptions::default()
    }
}

fn decode_with(schema: SchemaRef, opts: DecoderOptions, input: &str) -> Decoded {
    let mut d = Decoder::new(schema, opts).unwrap();
    let mut out = Decoded::default();
    d.decode(input.as_bytes(), "in/f.json", &mut out).unwrap();
    out
}

fn one_batch(out: &Decoded) -> &RecordBatch {
    assert_eq!(out.batches.len(), 1, "{:?}", out.batches);
    &out.batches[0]
}

fn col<'a>(b: &'a RecordBatch, name: &str) -> &'a dyn Array {
    b.column_by_name(name).unwrap().as_ref()
}

fn i64s(b: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    col(b, name).as_primitive::<Int64Type>().iter().collect()
}

fn strs(b: &RecordBatch, name: &str) -> Vec<Option<String>> {
    col(b, name)
        .as_string::<i32>()
        .iter()
        .map(|s| s.map(str::to_owned))
        .collect()
}

fn decs(b: &RecordBatch, name: &str) -> Vec<Option<i128>> {
    col(b, name)
        .as_primitive::<Decimal128Type>()
        .iter()
        .collect()
}

fn ts(b: &RecordBatch, name: &str) -> Vec<Option<i64>> {
    col(b, name)
        .as_primitive::<TimestampMicrosecondType>()
        .iter()
        .collect()
}

#[test]
fn decodes_the_sample_order() {
    let out = decode_with(
        orders_schema(),
        DecoderOptions::default(),
        &format!("{SAMPLE}\n"),
    );
    let b = one_batch(&out);
    assert_eq!(
        b.schema(),
        *Decoder::new(orders_schema(), DecoderOptions::default())
            .unwrap()
            .output_schema()
    );
    assert_eq!(b.num_columns(), 7);
    assert!(b.schema().fields().iter().all(|f| f.is_nullable()));
    assert_eq!(
        b.schema().field(4).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
    );
    assert_eq!(
        b.schema().field(3).data_type(),
        &DataType::Decimal128(12, 2)
    );
    assert_eq!(i64s(b, "order_id"), vec![Some(10_000_123)]);
    assert_eq!(i64s(b, "customer_id"), vec![Some(4711)]);
    assert_eq!(strs(b, "status"), vec![Some("completed".into())]);
    assert_eq!(decs(b, "amount"), vec![Some(2390)]);
    assert_eq!(ts(b, "occurred_at"), vec![Some(MAR1 + 187_123_000)]);
    assert_eq!(
        strs(b, "session_id"),
        vec![Some("s-3878e9ee53800058".into())]
    );
    assert_eq!(strs(b, CORRUPT_RECORD_COLUMN), vec![None]);
    assert_eq!((out.num_input_rows, out.num_malformed), (1, 0));
}

fn all_types_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("b", DataType::Boolean, true),
        Field::new("i", DataType::Int32, true),
        Field::new("l", DataType::Int64, true),
        Field::new("f", DataType::Float64, true),
        Field::new("d", DataType::Decimal128(5, 1), true),
        Field::new("s", DataType::Utf8, true),
        Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new(
            "m",
            DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            true,
        ),
        Field::new("dt", DataType::Date32, true),
    ]))
}

#[test]
fn json_every_type() {
    let input = [
        r#"{"b":true,"i":-5,"l":9223372036854775807,"f":1.5e2,"d":12.34,"s":"x","t":"2024-03-01 01:00:00+01:00","m":"2024-03-01T00:00:00.0019Z","dt":"2024-03-01"}"#,
        r#"{"b":false,"i":2147483647,"l":-1,"f":-0.25,"d":"-12.35","s":"caf\u00e9 \"q\" \ud83d\ude00","t":1,"m":"2024-03-01","dt":null}"#,
        r#"{"f":"NaN","d":1e2,"s":true}"#,
        r#"{}"#,
    ]
    .join("\n");
    let out = decode_with(all_types_schema(), DecoderOptions::default(), &input);
    let b = one_batch(&out);
    assert_eq!(out.num_malformed, 0, "{:?}", strs(b, CORRUPT_RECORD_COLUMN));
    let bools: Vec<_> = col(b, "b").as_boolean().iter().collect();
    assert_eq!(bools, vec![Some(true), Some(false), None, None]);
    let ints: Vec<_> = col(b, "i").as_primitive::<Int32Type>().iter().collect();
    assert_eq!(ints, vec![Some(-5), Some(i32::MAX), None, None]);
    assert_eq!(i64s(b, "l"), vec![Some(i64::MAX), Some(-1), None, None]);
    let floats: Vec<_> = col(b, "f").as_primitive::<Float64Type>().iter().collect();
    assert_eq!(floats[..2], [Some(150.0), Some(-0.25)]);
    assert!(floats[2].is_some_and(f64::is_nan));
    assert_eq!(floats[3], None);
    // 12.34 -> 12.3, "-12.35" -> -12.4 (half-up, away from zero), 1e2 -> 100.0
    assert_eq!(decs(b, "d"), vec![Some(123), Some(-124), Some(1000), None]);
    assert_eq!(
        strs(b, "s"),
        vec![
            Some("x".into()),
            Some("café \"q\" 😀".into()),
            Some("true".into()),
            None
        ]
    );
    assert_eq!(ts(b, "t"), vec![Some(MAR1), Some(1_000_000), None, None]);
    let millis: Vec<_> = col(b, "m")
        .as_primitive::<TimestampMillisecondType>()
        .iter()
        .collect();
    assert_eq!(
        millis,
        vec![Some(MAR1 / 1000 + 1), Some(MAR1 / 1000), None, None]
    );
    assert_eq!(
        b.schema().field_with_name("m").unwrap().data_type(),
        &DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()))
    );
    let dates: Vec<_> = col(b, "dt").as_primitive::<Date32Type>().iter().collect();
    assert_eq!(dates, vec![Some(19_783), None, None, None]);
}

#[test]
fn json_field_errors_null_only_that_field() {
    // Each line has exactly one bad field; the others must survive.
    let cases = [
        (
            r#"{"b":"true","i":1}"#,
            "b",
            r#"cannot parse "true" as BOOLEAN"#,
        ),
        (
            r#"{"i":2147483648,"l":1}"#,
            "i",
            "cannot parse 2147483648 as INT",
        ),
        (r#"{"l":1.0,"i":1}"#, "l", "cannot parse 1.0 as BIGINT"),
        (r#"{"l":"7","i":1}"#, "l", r#"cannot parse "7" as BIGINT"#),
        (
            r#"{"f":"1.5","i":1}"#,
            "f",
            r#"cannot parse "1.5" as DOUBLE"#,
        ),
        (
            r#"{"d":10000,"i":1}"#,
            "d",
            "cannot parse 10000 as DECIMAL(5,1)",
        ),
        (
            r#"{"d":[1],"i":1}"#,
            "d",
            "cannot parse [1] as DECIMAL(5,1)",
        ),
        (
            r#"{"t":"yesterday","i":1}"#,
            "t",
            r#"cannot parse "yesterday" as TIMESTAMP"#,
        ),
        (r#"{"t":1.5,"i":1}"#, "t", "cannot parse 1.5 as TIMESTAMP"),
        (
            r#"{"dt":"2024-02-30","i":1}"#,
            "dt",
            r#"cannot parse "2024-02-30" as DATE"#,
        ),
        (r#"{"l":"","i":1}"#, "l", r#"cannot parse "" as BIGINT"#),
    ];
    for (line, field, why) in cases {
        let opts = options(Format::JsonLines, MalformedPolicy::Permissive);
        let out = decode_with(all_types_schema(), opts, line);
        let b = one_batch(&out);
        assert_eq!(out.num_malformed, 1, "{line}");
        assert_eq!(col(b, field).null_count(), 1, "{line}");
        let ints: Vec<_> = col(b, "i").as_primitive::<Int32Type>().iter().collect();
        if field != "i" {
            assert_eq!(ints, vec![Some(1)], "{line}");
        }
        assert_eq!(strs(b, CORRUPT_RECORD_COLUMN), vec![Some(line.to_owned())]);

        let opts = options(Format::JsonLines, MalformedPolicy::Fail);
        let mut d = Decoder::new(all_types_schema(), opts).unwrap();
        let err = d
            .decode(line.as_bytes(), "x.json", &mut Decoded::default())
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("malformed record at x.json:1: field \"{field}\": {why}")
        );
    }
}

/// `a BIGINT, s STRING`.
fn int_and_string_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]))
}

#[test]
fn json_structure_keys_and_whitespace() {
    let schema = int_and_string_schema();
    let input = concat!(
        // unknown keys with nested values, any order, whitespace everywhere
        " { \"x\" : {\"y\":[1,{\"z\":\"}\"}],\"w\":null} , \"s\" : \"a b\" ,\t\"a\" : 7 }  \n",
        // escaped key, duplicate key (last wins), nested value into a string column
        "{\"\\u0061\":1,\"a\":2,\"s\":{\"k\": [1, 2]}}\n",
        // missing keys and explicit null
        "{\"s\":null}\n",
        // number text kept for a string column, exactly as written
        "{\"s\":-1.50e+3}\n",
    );
    let out = decode_with(schema, DecoderOptions::default(), input);
    let b = one_batch(&out);
    assert_eq!(out.num_malformed, 0);
    assert_eq!(i64s(b, "a"), vec![Some(7), Some(2), None, None]);
    assert_eq!(
        strs(b, "s"),
        vec![
            Some("a b".into()),
            Some("{\"k\": [1, 2]}".into()),
            None,
            Some("-1.50e+3".into())
        ]
    );
}

#[test]
fn json_syntax_errors_null_the_whole_row() {
    let schema = int_and_string_schema();
    let bad = [
        r#"{"a":1,"s":"x""#,
        r#"{"a":1,"s":"x"} extra"#,
        r#"{"a":1,"s":"x",}"#,
        r#"{"a":1 "s":"x"}"#,
        r#"{"a":01}"#,
        r#"{"a":1,"n":[1,2}"#,
        r#"{"a":1,"s":"tab	inside"}"#,
        r#"[{"a":1}]"#,
        r#"null"#,
        "#### producer crashed mid-write ####",
    ];
    let out = decode_with(schema, DecoderOptions::default(), &bad.join("\n"));
    let b = one_batch(&out);
    assert_eq!(out.num_malformed, bad.len() as u64);
    assert_eq!(col(b, "a").null_count(), bad.len());
    assert_eq!(col(b, "s").null_count(), bad.len());
    let corrupt: Vec<_> = strs(b, CORRUPT_RECORD_COLUMN)
        .into_iter()
        .flatten()
        .collect();
    assert_eq!(corrupt, bad);
}

/// The six malformed kinds of gen_orders.py, a valid line first, and a blank line.
fn orders_file() -> String {
    [
        SAMPLE,
        r#"{"order_id":10000124,"customer_id":4711,"st"#,
        "#### producer crashed mid-write 3a2b1c ####",
        "",
        &SAMPLE.replace("23.90", r#""N/A""#),
        &SAMPLE.replace("2024-03-01T00:03:07.123Z", "yesterday"),
        &SAMPLE.replace("10000123", r#""ORD-10000123""#),
        &SAMPLE.replace(r#""completed""#, "3"),
    ]
    .join("\r\n")
}

#[test]
fn malformed_kinds_permissive_match_spark() {
    let out = decode_with(orders_schema(), DecoderOptions::default(), &orders_file());
    let b = one_batch(&out);
    assert_eq!(b.num_rows(), 7);
    assert_eq!((out.num_input_rows, out.num_malformed), (7, 5));
    assert!(out.malformed.is_empty());
    let good = Some(10_000_123);
    assert_eq!(
        i64s(b, "order_id"),
        vec![good, None, None, good, good, None, good]
    );
    assert_eq!(
        i64s(b, "customer_id"),
        vec![
            Some(4711),
            None,
            None,
            Some(4711),
            Some(4711),
            Some(4711),
            Some(4711)
        ]
    );
    let amount = Some(2390);
    assert_eq!(
        decs(b, "amount"),
        vec![amount, None, None, None, amount, amount, amount]
    );
    let t = Some(MAR1 + 187_123_000);
    assert_eq!(ts(b, "occurred_at"), vec![t, None, None, t, None, t, t]);
    let status: Vec<_> = strs(b, "status");
    assert_eq!(status[6], Some("3".into()));
    assert_eq!(status[4], Some("completed".into()));
    let corrupt = strs(b, CORRUPT_RECORD_COLUMN);
    let file = orders_file();
    let lines: Vec<&str> = file.split("\r\n").collect();
    let expected: Vec<Option<String>> = vec![
        None,
        Some(lines[1].into()),
        Some(lines[2].into()),
        Some(lines[4].into()),
        Some(lines[5].into()),
        Some(lines[6].into()),
        None, // status_num is not malformed for Spark
    ];
    assert_eq!(corrupt, expected);
}

#[test]
fn malformed_kinds_drop_fail_deadletter() {
    let input = orders_file();

    let out = decode_with(
        orders_schema(),
        options(Format::JsonLines, MalformedPolicy::Drop),
        &input,
    );
    let b = one_batch(&out);
    assert_eq!(b.num_columns(), 6, "no _corrupt_record outside Permissive");
    assert_eq!(b.num_rows(), 2);
    assert_eq!(
        strs(b, "status"),
        vec![Some("completed".into()), Some("3".into())]
    );
    assert_eq!((out.num_input_rows, out.num_malformed), (7, 5));
    assert!(out.malformed.is_empty());

    let mut d = Decoder::new(
        orders_schema(),
        options(Format::JsonLines, MalformedPolicy::Fail),
    )
    .unwrap();
    let mut out = Decoded::default();
    let err = d
        .decode(input.as_bytes(), "in/orders-00003.json", &mut out)
        .unwrap_err();
    assert!(matches!(err, DecodeError::Malformed { line: 2, .. }));
    assert!(
        err.to_string()
            .starts_with("malformed record at in/orders-00003.json:2: "),
        "{err}"
    );
    assert!(
        out.batches.is_empty() && out.num_input_rows == 0,
        "out unchanged on error"
    );
    // The decoder is usable again after an error.
    d.decode(SAMPLE.as_bytes(), "next.json", &mut out).unwrap();
    assert_eq!(one_batch(&out).num_rows(), 1);
    let amount_line = SAMPLE.replace("23.90", r#""N/A""#);
    let err = d
        .decode(amount_line.as_bytes(), "a.json", &mut out)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"malformed record at a.json:1: field "amount": cannot parse "N/A" as DECIMAL(12,2)"#
    );

    let out = decode_with(
        orders_schema(),
        options(Format::JsonLines, MalformedPolicy::DeadLetter),
        &input,
    );
    assert_eq!(one_batch(&out).num_rows(), 2);
    assert_eq!((out.num_input_rows, out.num_malformed), (7, 5));
    let got: Vec<(u64, &str)> = out
        .malformed
        .iter()
        .map(|m| (m.line, m.error.as_str()))
        .collect();
    assert_eq!(got.len(), 5);
    assert_eq!(got[0].0, 2);
    assert!(got[0].1.contains("end of line"), "{}", got[0].1);
    assert_eq!(got[1], (3, "not a JSON object: expected '{' at column 1"));
    assert_eq!(
        got[2],
        (5, r#"field "amount": cannot parse "N/A" as DECIMAL(12,2)"#)
    );
    assert_eq!(
        got[3],
        (
            6,
            r#"field "occurred_at": cannot parse "yesterday" as TIMESTAMP"#
        )
    );
    assert_eq!(
        got[4],
        (
            7,
            r#"field "order_id": cannot parse "ORD-10000123" as BIGINT"#
        )
    );
    assert_eq!(
        out.malformed[1].raw,
        "#### producer crashed mid-write 3a2b1c ####"
    );
    assert!(out.malformed.iter().all(|m| m.origin == "in/f.json"));
}

#[test]
fn invalid_utf8_is_a_field_error() {
    let schema = int_and_string_schema();
    let mut input = b"{\"a\":1,\"s\":\"ok\"}\n{\"a\":2,\"s\":\"bad\xff\"}\n".to_vec();
    input.extend_from_slice(b"{\"a\":3,\"s\":\"ok\",\"x\":\"\xfe\"}\n");
    // A structure read into a string column keeps its text, which must be UTF-8 too.
    input.extend_from_slice(b"{\"a\":4,\"s\":{\"k\":[\"\xfd\"]}}\n");
    let mut d = Decoder::new(schema.clone(), DecoderOptions::default()).unwrap();
    let mut out = Decoded::default();
    d.decode(&input, "u.json", &mut out).unwrap();
    let b = one_batch(&out);
    assert_eq!(out.num_malformed, 3);
    assert_eq!(i64s(b, "a"), vec![Some(1), Some(2), Some(3), Some(4)]);
    assert_eq!(
        strs(b, "s"),
        vec![Some("ok".into()), None, Some("ok".into()), None]
    );
    let corrupt = strs(b, CORRUPT_RECORD_COLUMN);
    assert_eq!(
        corrupt[1].as_deref(),
        Some("{\"a\":2,\"s\":\"bad\u{FFFD}\"}")
    );
    assert!(corrupt[2].is_some());
    assert_eq!(
        corrupt[3].as_deref(),
        Some("{\"a\":4,\"s\":{\"k\":[\"\u{FFFD}\"]}}")
    );

    let mut d = Decoder::new(schema, options(Format::JsonLines, MalformedPolicy::Fail)).unwrap();
    let err = d
        .decode(&input, "u.json", &mut Decoded::default())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed record at u.json:2: field \"s\": invalid UTF-8"
    );
}

fn csv(header: bool) -> Format {
    Format::Csv(CsvOptions {
        header,
        ..CsvOptions::default()
    })
}

#[test]
fn csv_quoting_header_nulls_and_types() {
    let input = concat!(
        "b,i,l,f,d,s,t,m,dt\r\n",
        "TRUE,1,2,2.5,1.25,\"a, \"\"b\"\"\",2024-03-01T00:00:00Z,2024-03-01,2024-03-01\n",
        "\n",
        ",,,,,,,,\n",
        "false,-1,3,Inf,\"1,234.5\",\"\",2024-03-01 00:00:01,\"\",2024-03-02\n",
    );
    let out = decode_with(
        all_types_schema(),
        options(csv(true), MalformedPolicy::Permissive),
        input,
    );
    let b = one_batch(&out);
    assert_eq!((out.num_input_rows, out.num_malformed), (3, 0));
    let bools: Vec<_> = col(b, "b").as_boolean().iter().collect();
    assert_eq!(bools, vec![Some(true), None, Some(false)]);
    assert_eq!(i64s(b, "l"), vec![Some(2), None, Some(3)]);
    let floats: Vec<_> = col(b, "f").as_primitive::<Float64Type>().iter().collect();
    assert_eq!(floats, vec![Some(2.5), None, Some(f64::INFINITY)]);
    assert_eq!(decs(b, "d"), vec![Some(13), None, Some(12_345)]);
    // Quoted empty is an empty string for Utf8 and null for other types.
    assert_eq!(
        strs(b, "s"),
        vec![Some("a, \"b\"".into()), None, Some(String::new())]
    );
    assert_eq!(ts(b, "t"), vec![Some(MAR1), None, Some(MAR1 + 1_000_000)]);
    assert_eq!(col(b, "m").null_count(), 2);
    let dates: Vec<_> = col(b, "dt").as_primitive::<Date32Type>().iter().collect();
    assert_eq!(dates, vec![Some(19_783), None, Some(19_784)]);
}

#[test]
fn csv_malformed_lines_and_line_numbers() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new("name", DataType::Utf8, true),
    ]));
    let input = "id,amount,name\n1,2.50,x\n\n2,N/A,y\n3,1.00\n4,1.00,\"open\n5,1,\"a\"b\n";
    let out = decode_with(
        schema.clone(),
        options(csv(true), MalformedPolicy::Permissive),
        input,
    );
    let b = one_batch(&out);
    assert_eq!((out.num_input_rows, out.num_malformed), (5, 4));
    assert_eq!(i64s(b, "id"), vec![Some(1), Some(2), None, None, None]);
    assert_eq!(decs(b, "amount"), vec![Some(250), None, None, None, None]);
    assert_eq!(strs(b, "name")[1], Some("y".into()));
    assert_eq!(strs(b, CORRUPT_RECORD_COLUMN)[2], Some("3,1.00".into()));

    let out = decode_with(
        schema.clone(),
        options(csv(true), MalformedPolicy::DeadLetter),
        input,
    );
    let got: Vec<(u64, &str)> = out
        .malformed
        .iter()
        .map(|m| (m.line, m.error.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (4, r#"field "amount": cannot parse "N/A" as DECIMAL(12,2)"#),
            (5, "expected 3 fields, found 2"),
            (
                6,
                "unterminated quoted field starting at column 8 (quoted line breaks are not supported)"
            ),
            (
                7,
                "unexpected character after the closing quote at column 8"
            ),
        ]
    );

    // No header: the first line is data, and line numbers count it.
    let mut d = Decoder::new(schema, options(csv(false), MalformedPolicy::Fail)).unwrap();
    let err = d
        .decode(b"1,2,a\n2,x,b\n", "data.csv", &mut Decoded::default())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"malformed record at data.csv:2: field "amount": cannot parse "x" as DECIMAL(12,2)"#
    );
}

#[test]
fn batches_are_cut_at_batch_size_and_per_file() {
    let opts = DecoderOptions {
        batch_size: 3,
        ..DecoderOptions::default()
    };
    let mut d = Decoder::new(orders_schema(), opts).unwrap();
    let mut out = Decoded::default();
    let file: String = (0..7).map(|_| format!("{SAMPLE}\n")).collect();
    d.decode(file.as_bytes(), "a", &mut out).unwrap();
    d.decode(file.as_bytes(), "b", &mut out).unwrap();
    d.decode(b"", "empty", &mut out).unwrap();
    d.decode(b"\n\n", "blank", &mut out).unwrap();
    let sizes: Vec<usize> = out.batches.iter().map(RecordBatch::num_rows).collect();
    assert_eq!(sizes, vec![3, 3, 1, 3, 3, 1]);
    assert_eq!(out.num_input_rows, 14);
}

#[test]
fn rejects_unsupported_schemas() {
    let bad = |fields: Vec<Field>, opts: DecoderOptions| {
        Decoder::new(Arc::new(Schema::new(fields)), opts)
            .unwrap_err()
            .to_string()
    };
    let list = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
    let msg = bad(
        vec![
            Field::new("ok", DataType::Int64, true),
            Field::new("tags", list, true),
        ],
        DecoderOptions::default(),
    );
    assert!(
        msg.starts_with("field \"tags\": unsupported data type List"),
        "{msg}"
    );
    let msg = bad(
        vec![Field::new("d", DataType::Decimal128(5, -1), true)],
        DecoderOptions::default(),
    );
    assert!(msg.starts_with("field \"d\": unsupported"), "{msg}");
    let msg = bad(
        vec![Field::new(CORRUPT_RECORD_COLUMN, DataType::Utf8, true)],
        DecoderOptions::default(),
    );
    assert!(msg.contains("reserved"), "{msg}");
    let msg = bad(
        vec![
            Field::new("a", DataType::Int64, true),
            Field::new("a", DataType::Utf8, true),
        ],
        DecoderOptions::default(),
    );
    assert!(msg.contains("twice"), "{msg}");
    let msg = bad(
        vec![],
        DecoderOptions {
            batch_size: 0,
            ..DecoderOptions::default()
        },
    );
    assert!(msg.contains("batch_size"), "{msg}");
}

#[test]
fn find_newline_matches_naive() {
    let mut s = vec![b'x'; 40];
    for at in 0..40 {
        s.fill(b'x');
        s[at] = b'\n';
        s[(at + 5).min(39)] = b'\n';
        assert_eq!(find_newline(&s), Some(at), "{at}");
        assert_eq!(find_newline(&s[..at]), None);
    }
    s.fill(0x8a); // high bytes must not produce false positives
    assert_eq!(find_newline(&s), None);
}

/// Generates `n` order lines like gen_orders.py, with every 200th line malformed.
fn generate(n: usize) -> (String, i128, usize) {
    let statuses = ["completed", "pending", "returned", "cancelled"];
    let mut s = String::with_capacity(n * 160);
    let (mut cents_sum, mut bad) = (0i128, 0);
    for k in 0..n {
        let cents = (k * 7919 % 99_901 + 99) as i128;
        let line = format!(
            r#"{{"order_id":{},"customer_id":{},"status":"{}","amount":{}.{:02},"occurred_at":"2024-03-01T{:02}:{:02}:{:02}.{:03}Z","session_id":"s-{:016x}"}}"#,
            10_000_000 + k,
            k % 50_000 + 1,
            statuses[k % 4],
            cents / 100,
            cents % 100,
            k / 3600 % 24,
            k / 60 % 60,
            k % 60,
            k % 1000,
            (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        if k % 200 == 199 {
            s.push_str(&line[..line.len() / 2]);
            bad += 1;
        } else {
            s.push_str(&line);
            cents_sum += cents;
        }
        s.push('\n');
    }
    (s, cents_sum, bad)
}

#[test]
fn throughput_check_is_correct_on_100k_lines() {
    let n = 100_000;
    let (input, cents_sum, bad) = generate(n);
    let mut d = Decoder::new(orders_schema(), DecoderOptions::default()).unwrap();
    let mut out = Decoded::default();
    let start = std::time::Instant::now();
    d.decode(input.as_bytes(), "gen.json", &mut out).unwrap();
    let elapsed = start.elapsed();
    // Reported with `cargo test --release -- --nocapture`; never asserted.
    #[expect(
        clippy::print_stderr,
        reason = "a measurement for the developer, not a log line"
    )]
    {
        eprintln!(
            "decode: {n} lines, {:.1} MB in {elapsed:?} = {:.2} M rows/s",
            input.len() as f64 / 1e6,
            n as f64 / elapsed.as_secs_f64() / 1e6
        );
    }
    assert_eq!(out.num_input_rows, n as u64);
    assert_eq!(out.num_malformed, bad as u64);
    // One batch per megabyte of the file (below the 65,536 rows of a batch).
    let sizes: Vec<usize> = out.batches.iter().map(RecordBatch::num_rows).collect();
    assert_eq!(sizes.len(), input.len().div_ceil(PART_BYTES));
    assert_eq!(sizes.iter().sum::<usize>(), n);
    assert!(sizes.iter().all(|&s| s < 65_536));
    let mut sum = 0i128;
    let mut last_id = None;
    for b in &out.batches {
        let amounts = b.column(3).as_primitive::<Decimal128Type>();
        sum += amounts.iter().flatten().sum::<i128>();
        let ids = b.column(0).as_primitive::<Int64Type>();
        if let Some(id) = ids.iter().flatten().last() {
            last_id = Some(id);
        }
        assert_eq!(
            b.column(6).null_count() + amounts.null_count(),
            b.num_rows()
        );
    }
    assert_eq!(sum, cents_sum);
    assert_eq!(last_id, Some(10_000_000 + n as i64 - 2));
    let first = &out.batches[0];
    assert_eq!(
        strs(first, "status")[..2],
        [Some("completed".into()), Some("pending".into())]
    );
    assert_eq!(ts(first, "occurred_at")[61], Some(MAR1 + 61_061_000));
}

/// The schema of [`mixed_file`]'s records.
fn mixed_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, true),
    ]))
}

/// A file of `lines` lines with blank lines, a CSV header when `csv`, and every 97th line
/// malformed.
fn mixed_file(lines: usize, csv: bool) -> String {
    let mut text = String::new();
    if csv {
        text.push_str("\n  \nid,name\n");
    }
    for i in 0..lines {
        if i % 53 == 7 {
            text.push_str(" \r\n");
        }
        let line = match (csv, i % 97 == 5) {
            (false, false) => format!("{{\"id\":{i},\"name\":\"n-{i:08}\"}}\n"),
            (false, true) => format!("{{\"id\":\"x{i}\",\"name\":\"n-{i:08}\"}}\n"),
            (true, false) => format!("{i},n-{i:08}\n"),
            (true, true) => format!("{i},n-{i:08},extra\n"),
        };
        text.push_str(&line);
    }
    text
}

/// Every malformed-line policy.
const ALL_POLICIES: [MalformedPolicy; 4] = [
    MalformedPolicy::Permissive,
    MalformedPolicy::Drop,
    MalformedPolicy::DeadLetter,
    MalformedPolicy::Fail,
];

/// The options of the tests of pieces and parts: JSON lines or CSV with a header, batches of
/// 700 rows.
fn lines_options(csv: bool, policy: MalformedPolicy) -> DecoderOptions {
    let format = if csv {
        Format::Csv(CsvOptions::default())
    } else {
        Format::JsonLines
    };
    DecoderOptions {
        format,
        policy,
        batch_size: 700,
    }
}

/// The same batches, cut at the same rows, and the same counts and dead letters.
fn assert_same_decoding(got: &Decoded, expected: &Decoded, what: &str) {
    let sizes = |d: &Decoded| d.batches.iter().map(|b| b.num_rows()).collect::<Vec<_>>();
    assert_eq!(sizes(got), sizes(expected), "{what}");
    assert_eq!(got.batches, expected.batches, "{what}");
    assert_eq!(got.num_input_rows, expected.num_input_rows, "{what}");
    assert_eq!(got.num_malformed, expected.num_malformed, "{what}");
    assert_eq!(got.malformed, expected.malformed, "{what}");
}

/// Decodes `input` in the pieces that `cuts` (line starts, ascending) make of it.
fn decode_in_pieces(
    decoder: &mut Decoder,
    input: &[u8],
    cuts: &[usize],
) -> (Decoded, Option<String>) {
    let mut out = Decoded::default();
    let mut pieces = decoder.start_pieces();
    let mut from = 0;
    for &cut in cuts.iter().chain([&input.len()]) {
        pieces = match decoder.decode_piece(pieces, &input[from..cut], "f") {
            Ok(pieces) => pieces,
            Err(e) => return (out, Some(e.to_string())),
        };
        from = cut;
    }
    let err = decoder.finish_pieces(pieces, "f", &mut out).err();
    (out, err.map(|e| e.to_string()))
}

/// However a file is cut into pieces of whole lines as it is read, its batches, counts, line
/// numbers and errors are those of the whole file: across a piece's end go the rows not yet
/// cut into a batch, the line count, the next cut by position (a piece may start with the
/// line at a megabyte, where the whole file cuts a batch) and a CSV header still to skip.
#[test]
fn a_file_decoded_in_pieces_gives_the_batches_of_the_whole_file() {
    let schema = mixed_schema();
    for csv in [false, true] {
        let text = mixed_file(160_000, csv);
        let input = text.as_bytes();
        let starts: Vec<usize> = std::iter::once(0)
            .chain(memchr::memchr_iter(b'\n', input).map(|k| k + 1))
            .filter(|&k| k < input.len())
            .collect();
        // The first line at or after each megabyte, and the one before it.
        let at_cuts: Vec<usize> = (1..=input.len() / PART_BYTES)
            .flat_map(|m| {
                let i = starts.partition_point(|&k| k < m * PART_BYTES);
                [starts[i - 1], starts[i]]
            })
            .collect();
        let cut_sets: Vec<Vec<usize>> = vec![
            // One line a piece at the start (the CSV header after two blank lines), then
            // pieces of 1 to 997 lines.
            {
                let mut cuts = vec![starts[1], starts[2], starts[3]];
                let mut i = 3;
                for n in [1, 2, 3, 50, 997].into_iter().cycle() {
                    i += n;
                    let Some(&k) = starts.get(i) else { break };
                    cuts.push(k);
                }
                cuts
            },
            // A piece starts at each megabyte's first line.
            at_cuts.iter().copied().skip(1).step_by(2).collect(),
            // And at the line before it.
            at_cuts.iter().copied().step_by(2).collect(),
        ];
        for policy in ALL_POLICIES {
            let opts = lines_options(csv, policy);
            let mut decoder = Decoder::new(Arc::clone(&schema), opts).unwrap();
            let mut whole = Decoded::default();
            let whole_err = decoder
                .decode(input, "f", &mut whole)
                .err()
                .map(|e| e.to_string());
            for (set, cuts) in cut_sets.iter().enumerate() {
                let what = format!("csv {csv}, {policy:?}, cuts {set}");
                let (got, err) = decode_in_pieces(&mut decoder, input, cuts);
                assert_eq!(err, whole_err, "{what}");
                assert_same_decoding(&got, &whole, &what);
            }
            if policy == MalformedPolicy::DeadLetter {
                // Line numbers of the file, whatever the pieces: the last of the 1,650
                // malformed records is record 159,958 (every 97th from the 5th, counted from
                // 0), after 3,018 blank lines (and two blank lines and a header in CSV).
                assert_eq!(whole.malformed.len(), 1_650);
                let line = whole.malformed.last().unwrap().line;
                assert_eq!(line, if csv { 162_980 } else { 162_977 });
            }
        }
    }
}

#[test]
fn a_file_decoded_in_parts_gives_the_batches_of_the_whole_file() {
    let schema = mixed_schema();
    for csv in [false, true] {
        let n = 160_000;
        let text = mixed_file(n, csv);
        let input = text.as_bytes();
        assert!(input.len() > 2 * PART_BYTES);
        for policy in ALL_POLICIES {
            let opts = lines_options(csv, policy);
            let mut whole = Decoder::new(Arc::clone(&schema), opts).unwrap();
            let mut expected = Decoded::default();
            let expected_err = whole.decode(input, "f", &mut expected).err();
            {
                let parts = whole.parts(input);
                assert_eq!(parts.len(), input.len().div_ceil(PART_BYTES), "csv {csv}");
                assert_eq!(parts[0].range.start, 0);
                assert_eq!(parts.last().unwrap().range.end, input.len());
                assert!(parts.windows(2).all(|w| w[0].range.end == w[1].range.start));
                assert_eq!(parts[0].header, csv);
                assert!(parts[1..].iter().all(|p| !p.header));
                let mut got = Decoded::default();
                let mut got_err = None;
                for part in &parts {
                    let mut d = whole.fork();
                    if let Err(e) = d.decode_part(input, part, "f", &mut got) {
                        got_err = Some(e);
                        break;
                    }
                }
                let what = format!("csv {csv}, {policy:?}");
                assert_eq!(
                    got_err.map(|e| e.to_string()),
                    expected_err.as_ref().map(ToString::to_string),
                    "{what}"
                );
                if expected_err.is_some() {
                    continue;
                }
                assert_same_decoding(&got, &expected, &what);
            }
            match policy {
                MalformedPolicy::Fail => {
                    let err = expected_err.unwrap().to_string();
                    let line = if csv { 4 + 5 } else { 5 + 1 };
                    assert!(err.contains(&format!("f:{line}:")), "{err}");
                }
                _ => {
                    assert_eq!(expected.num_input_rows, n as u64);
                    let malformed = (0..n).filter(|i| i % 97 == 5).count();
                    assert_eq!(expected.num_malformed, malformed as u64);
                    // Cut every 700 rows and at each megabyte: the batches before a megabyte
                    // boundary are shorter.
                    let short = expected.batches[..expected.batches.len() - 1]
                        .iter()
                        .filter(|b| b.num_rows() < 700)
                        .count();
                    assert_eq!(short, input.len() / PART_BYTES, "csv {csv}, {policy:?}");
                }
            }
        }
    }
}

#[test]
fn small_files_stay_whole() {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
    let d = Decoder::new(schema, DecoderOptions::default()).unwrap();
    let input = b"{\"id\":1}\n{\"id\":2}\n";
    assert_eq!(
        d.parts(input),
        [Part {
            range: 0..input.len(),
            header: false
        }]
    );
}

/// Fields are written into the columns as they are parsed; a row left out or nulled whole
/// must take back every value it wrote (strings included), a repeated key its first value.
#[test]
fn rows_taken_back_leave_no_trace_of_their_fields() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("d", DataType::Decimal128(12, 2), true),
    ]));
    let input = concat!(
        "{\"a\":1,\"s\":\"one\",\"d\":1.5}\n",
        // syntax error after two fields and a repeated string key
        "{\"s\":\"gone\",\"a\":2,\"s\":\"gone again\",\"d\":2\n",
        // a field error after a string
        "{\"s\":\"bad\",\"a\":3,\"d\":\"N/A\"}\n",
        // a repeated key replaces its first value, in a kept row
        "{\"s\":\"first\",\"a\":4,\"s\":\"last\",\"a\":5}\n",
        "{\"d\":6.25,\"s\":\"six\"}\n",
    );
    let drop = decode_with(
        Arc::clone(&schema),
        options(Format::JsonLines, MalformedPolicy::Drop),
        input,
    );
    let dead = decode_with(
        Arc::clone(&schema),
        options(Format::JsonLines, MalformedPolicy::DeadLetter),
        input,
    );
    for out in [&drop, &dead] {
        let b = one_batch(out);
        assert_eq!(out.num_malformed, 2);
        assert_eq!(i64s(b, "a"), vec![Some(1), Some(5), None]);
        assert_eq!(
            strs(b, "s"),
            vec![Some("one".into()), Some("last".into()), Some("six".into())]
        );
        assert_eq!(decs(b, "d"), vec![Some(150), None, Some(625)]);
    }
    let out = decode_with(schema, DecoderOptions::default(), input);
    let b = one_batch(&out);
    assert_eq!(i64s(b, "a"), vec![Some(1), None, Some(3), Some(5), None]);
    assert_eq!(
        strs(b, "s"),
        vec![
            Some("one".into()),
            None,
            Some("bad".into()),
            Some("last".into()),
            Some("six".into())
        ]
    );
    assert_eq!(decs(b, "d"), vec![Some(150), None, None, None, Some(625)]);
    let corrupt = strs(b, CORRUPT_RECORD_COLUMN);
    assert_eq!(corrupt.iter().flatten().count(), 2);
    assert_eq!(corrupt[1].as_deref(), input.lines().nth(1));
}

/// JSON numbers convert from the digits the scanner reads; at the edges (19 and 20 digits,
/// the ends of i64, fractions to round, exponents) they agree with the text conversions.
#[test]
fn json_numbers_at_the_edges_of_their_types() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("l", DataType::Int64, true),
        Field::new("i", DataType::Int32, true),
        Field::new("d", DataType::Decimal128(20, 2), true),
        Field::new("p", DataType::Decimal128(3, 1), true),
    ]));
    let rows = [
        (
            r#"-9223372036854775808"#,
            r#"-2147483648"#,
            r#"12345678901234567.89"#,
            "99.9",
        ),
        (
            r#"9223372036854775808"#,
            r#"2147483648"#,
            r#"123456789012345678.91"#,
            "99.95",
        ),
        (r#"-0"#, r#"0"#, r#"-0.005"#, "-9.94"),
        (
            r#"10000000000000000000"#,
            r#"-2147483649"#,
            r#"1.5e3"#,
            "100",
        ),
        (r#"1234567890123456789"#, r#"7"#, r#"0.1234"#, "-0.05"),
    ];
    let input: Vec<String> = rows
        .iter()
        .map(|(l, i, d, p)| format!(r#"{{"l":{l},"i":{i},"d":{d},"p":{p}}}"#))
        .collect();
    let out = decode_with(schema, DecoderOptions::default(), &input.join("\n"));
    let b = one_batch(&out);
    assert_eq!(
        i64s(b, "l"),
        vec![
            Some(i64::MIN),
            None,
            Some(0),
            None,
            Some(1_234_567_890_123_456_789)
        ]
    );
    let ints: Vec<_> = col(b, "i").as_primitive::<Int32Type>().iter().collect();
    assert_eq!(ints, vec![Some(i32::MIN), None, Some(0), None, Some(7)]);
    assert_eq!(
        decs(b, "d"),
        vec![
            Some(1_234_567_890_123_456_789),
            Some(12_345_678_901_234_567_891),
            Some(-1),
            Some(150_000),
            Some(12)
        ]
    );
    // 99.95 rounds up past DECIMAL(3,1); -0.05 rounds away from zero.
    assert_eq!(
        decs(b, "p"),
        vec![Some(999), None, Some(-99), None, Some(-1)]
    );
    assert_eq!(out.num_malformed, 2, "the second and fourth lines");
}

/// Where lines end: CRLF, trailing whitespace, blank lines, a record over two lines, text after
/// the object, and a last line without a line break, with their line numbers and raw text.
#[test]
fn lines_end_at_line_breaks_with_their_numbers_and_text() {
    let schema = int_and_string_schema();
    let input = concat!(
        "{\"a\":1,\"s\":\"x\"}\r\n",
        "{\"a\":2} \t\r\n",
        "\n",
        "  {\"a\":3}\n",
        "{\"a\":4,\n",
        "\"s\":\"y\"}\n",
        "{\"a\":5} {\"a\":6}\n",
        "{\"a\":\"bad\",\"s\":\"z\"}\r\n",
        "{\"a\":7,\"s\":\"w\"}",
    );
    let out = decode_with(
        Arc::clone(&schema),
        options(Format::JsonLines, MalformedPolicy::DeadLetter),
        input,
    );
    let b = one_batch(&out);
    assert_eq!(i64s(b, "a"), vec![Some(1), Some(2), Some(3), Some(7)]);
    assert_eq!(
        strs(b, "s"),
        vec![Some("x".into()), None, None, Some("w".into())]
    );
    assert_eq!(out.num_input_rows, 8);
    let dead: Vec<(u64, &str)> = out
        .malformed
        .iter()
        .map(|m| (m.line, m.raw.as_str()))
        .collect();
    assert_eq!(
        dead,
        [
            (5, "{\"a\":4,"),
            (6, "\"s\":\"y\"}"),
            (7, "{\"a\":5} {\"a\":6}"),
            (8, "{\"a\":\"bad\",\"s\":\"z\"}"),
        ]
    );
    assert!(
        out.malformed[0].error.contains("end of line"),
        "{}",
        out.malformed[0].error
    );
    let permissive = decode_with(schema, DecoderOptions::default(), input);
    let b = one_batch(&permissive);
    let corrupt = strs(b, CORRUPT_RECORD_COLUMN);
    assert_eq!(corrupt.len(), 8);
    assert_eq!(corrupt[6].as_deref(), Some("{\"a\":\"bad\",\"s\":\"z\"}"));
    assert_eq!(corrupt[7], None);
    assert_eq!(strs(b, "s")[6].as_deref(), Some("z"));
}

/// A JSON line is parsed to its newline in one pass; whatever that pass cannot settle (a line
/// that is malformed, split by a raw line break, or ends in stray bytes) is decoded line by
/// line. Both give what decoding every line by the line path gives, under every policy that
/// keeps going (the fuzz test compares `Fail` too), and the lines end where expected.
#[test]
fn json_lines_parsed_in_one_pass_end_where_the_line_path_ends_them() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
    ]));
    // A line longer than the one-pass scan takes, cut into lines first.
    let long = format!("{{\"a\":10,\"s\":\"{}\"}}\n", "x".repeat(ONE_PASS_BYTES));
    let input = [
        "{\"a\":1,\"s\":\"x\"}\r\r\n",
        "{\"a\":2} \t\r\n",
        "{\"a\":3}x\n",
        "{\"a\":4,\"s\":\"x\ny\"}\n",
        "{\"a\":5,\n\"s\":\"z\"}\n",
        "{\"a\":{\"b\":[1,\n2]}}\n",
        "{}\n",
        "  {\"a\":6}\n",
        "{\"a\":\"seven\"}\n",
        "{\"a\":8}\n\n",
        &long,
        "{\"a\":9}\r",
    ]
    .concat();
    for policy in [
        MalformedPolicy::Permissive,
        MalformedPolicy::Drop,
        MalformedPolicy::DeadLetter,
    ] {
        let mut decoded = Vec::new();
        for line_by_line in [false, true] {
            let mut d =
                Decoder::new(Arc::clone(&schema), options(Format::JsonLines, policy)).unwrap();
            d.line_by_line = line_by_line;
            let mut out = Decoded::default();
            d.decode(input.as_bytes(), "in/f.json", &mut out).unwrap();
            decoded.push(out);
        }
        let (one_pass, by_line) = (&decoded[0], &decoded[1]);
        assert_eq!(one_pass.batches, by_line.batches, "{policy:?}");
        assert_eq!(one_pass.malformed, by_line.malformed, "{policy:?}");
        assert_eq!(
            (one_pass.num_input_rows, one_pass.num_malformed),
            (by_line.num_input_rows, by_line.num_malformed)
        );
        // 15 non-blank lines: `{"a":4,"s":"x` / `y"}`, `{"a":5,` / `"s":"z"}` and
        // `{"a":{"b":[1,` / `2]}}` are two malformed lines each, `{"a":3}x` and
        // `{"a":"seven"}` one each.
        assert_eq!((one_pass.num_input_rows, one_pass.num_malformed), (15, 8));
        let kept: Vec<_> = one_pass.batches.iter().flat_map(|b| i64s(b, "a")).collect();
        match policy {
            MalformedPolicy::Permissive => assert_eq!(kept.len(), 15),
            _ => assert_eq!(
                kept,
                [Some(1), Some(2), None, Some(6), Some(8), Some(10), Some(9)],
                "{policy:?}"
            ),
        }
        let longest = one_pass
            .batches
            .iter()
            .flat_map(|b| strs(b, "s"))
            .flatten()
            .map(|s| s.len())
            .max();
        assert_eq!(longest, Some(ONE_PASS_BYTES));
        if policy == MalformedPolicy::DeadLetter {
            let lines: Vec<_> = one_pass.malformed.iter().map(|m| m.line).collect();
            assert_eq!(lines, [3, 4, 5, 6, 7, 8, 9, 12]);
            assert!(
                one_pass.malformed[0].error.contains("column 8"),
                "{:?}",
                one_pass.malformed[0]
            );
            assert_eq!(one_pass.malformed[0].raw, "{\"a\":3}x");
        }
    }
}
