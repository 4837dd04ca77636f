//! The SQL transform on real batches: refusals, names, types, the clock.

use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, Decimal128Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use super::{PlanError, SqlTransform, check_sql, plan_sql};
use crate::plugin::BatchInfo;

fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("amount", DataType::Decimal128(12, 2), true),
        Field::new(
            "occurred_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
        Field::new("payload", DataType::Utf8, true),
    ]))
}

fn orders() -> RecordBatch {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
        Arc::new(StringArray::from(vec![
            Some("paid"),
            Some("returned"),
            None,
            Some("paid"),
        ])),
        Arc::new(
            Decimal128Array::from(vec![Some(1010), Some(5001), Some(9999), None])
                .with_precision_and_scale(12, 2)
                .unwrap(),
        ),
        Arc::new(
            TimestampMicrosecondArray::from(vec![0, 1_000_000, 2_000_000, 3_000_000])
                .with_timezone("+00:00"),
        ),
        Arc::new(StringArray::from(vec![
            Some(r#"{"device":{"os":"ios"}}"#),
            Some(r#"{"device":{"os":"android"}}"#),
            Some("not json"),
            None,
        ])),
    ];
    RecordBatch::try_new(orders_schema(), columns).unwrap()
}

fn info(batch_id: u64, timestamp_micros: i64) -> BatchInfo {
    BatchInfo {
        query_id: "q".into(),
        batch_id,
        attempt: 0,
        timestamp_micros,
        partition: 0,
    }
}

fn run(sql: &str) -> RecordBatch {
    let mut t = SqlTransform::new("t", sql, &orders_schema(), &[]).unwrap();
    t.process(&orders(), &info(0, 1_700_000_000_000_000))
        .unwrap()
}

fn refusal(sql: &str) -> String {
    match check_sql(sql, &[]).and_then(|()| plan_sql(sql, &orders_schema(), &[]).map(drop)) {
        Ok(()) => panic!("{sql} was accepted"),
        Err(e) => e.to_string(),
    }
}

fn strings(batch: &RecordBatch, column: &str) -> Vec<Option<String>> {
    let a = batch.column_by_name(column).unwrap();
    let a = arrow_cast::cast(a, &DataType::Utf8).unwrap();
    let a = a.as_any().downcast_ref::<StringArray>().unwrap();
    (0..a.len())
        .map(|i| a.is_valid(i).then(|| a.value(i).to_owned()))
        .collect()
}

#[test]
fn filters_projects_and_names_columns_as_spark_does() {
    let out = run("SELECT order_id, upper(status) AS status, amount * 2, \
         CASE WHEN amount > 60 THEN 'big' ELSE 'small' END AS size \
         FROM input WHERE amount > 20 OR status IS NULL");
    let schema = out.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["order_id", "status", "(amount * 2)", "size"]);
    assert_eq!(
        strings(&out, "order_id"),
        [Some("2".into()), Some("3".into())]
    );
    assert_eq!(strings(&out, "status"), [Some("RETURNED".into()), None]);
    assert_eq!(
        strings(&out, "(amount * 2)"),
        [Some("100.02".into()), Some("199.98".into())]
    );
    assert_eq!(
        strings(&out, "size"),
        [Some("small".into()), Some("big".into())]
    );
}

#[test]
fn decimal_arithmetic_stays_exact() {
    // 0.1 + 0.2 is 0.30000000000000004 in a double; DECIMAL keeps 0.30.
    let out = run(
        "SELECT amount + 0.1 + 0.2 AS exact, CAST(amount AS DOUBLE) * 3 AS float \
         FROM input WHERE order_id = 1",
    );
    assert!(matches!(
        out.schema().field(0).data_type(),
        DataType::Decimal128(_, _)
    ));
    assert_eq!(strings(&out, "exact"), [Some("10.40".into())]);
    assert_eq!(strings(&out, "float"), [Some("30.299999999999997".into())]);
}

#[test]
fn the_clock_is_the_batch_timestamp() {
    let sql = "SELECT current_timestamp() AS a, now() AS b, current_date() AS d FROM input";
    let mut t = SqlTransform::new("t", sql, &orders_schema(), &[]).unwrap();
    let first = t
        .process(&orders(), &info(3, 1_700_000_000_123_456))
        .unwrap();
    assert_eq!(
        first.schema().field(0).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into()))
    );
    assert_eq!(
        strings(&first, "a"),
        vec![Some("2023-11-14T22:13:20.123456Z".to_owned()); 4]
    );
    assert_eq!(strings(&first, "a"), strings(&first, "b"));
    assert_eq!(strings(&first, "d"), vec![Some("2023-11-14".to_owned()); 4]);
    // Another batch in between, then the same batch again: the same values.
    t.process(&orders(), &info(4, 1_800_000_000_000_000))
        .unwrap();
    let again = t
        .process(&orders(), &info(3, 1_700_000_000_123_456))
        .unwrap();
    assert_eq!(first, again);
}

#[test]
fn json_regex_and_null_functions() {
    let out = run("SELECT get_json_object(payload, '$.device.os') AS os, \
         regexp_replace(status, 'e', 'E') AS re, coalesce(status, 'none') AS c, \
         regexp_extract(status, '(r)(e)', 2) AS x, \
         nullif(status, 'paid') AS n FROM input");
    assert_eq!(
        strings(&out, "os"),
        [Some("ios".into()), Some("android".into()), None, None]
    );
    assert_eq!(strings(&out, "re")[1], Some("rEturnEd".into()));
    assert_eq!(strings(&out, "c")[2], Some("none".into()));
    assert_eq!(
        strings(&out, "x"),
        [
            Some(String::new()),
            Some("e".into()),
            None,
            Some(String::new())
        ]
    );
    assert_eq!(
        strings(&out, "n"),
        [None, Some("returned".into()), None, None]
    );
}

#[test]
fn columns_resolve_without_regard_to_case() {
    let out = run("SELECT ORDER_ID, Status AS S FROM input WHERE Amount > 90");
    assert_eq!(out.schema().field(0).name(), "order_id");
    assert_eq!(out.schema().field(1).name(), "S");
    assert_eq!(strings(&out, "order_id"), [Some("3".into())]);
}

#[test]
fn star_keeps_every_column_and_adds() {
    let out = run("SELECT *, order_id + 1 AS next FROM input");
    assert_eq!(out.num_columns(), 6);
    assert_eq!(out.num_rows(), 4);
    assert!(Arc::ptr_eq(out.column(0), orders().column(0)) || out.column(0) == orders().column(0));
}

#[test]
fn refusals_say_why_and_where_to_go() {
    let cases = [
        (
            "SELECT status, count(*) FROM input GROUP BY status",
            "[aggregate]",
        ),
        ("SELECT sum(amount) FROM input", "[aggregate]"),
        ("SELECT count_if(amount > 1) FROM input", "[aggregate]"),
        (
            "SELECT row_number() OVER (ORDER BY order_id) FROM input",
            "window functions",
        ),
        ("SELECT * FROM input ORDER BY order_id", "ORDER BY"),
        ("SELECT * FROM input LIMIT 10", "LIMIT"),
        ("SELECT * FROM input JOIN customers ON true", "[join]"),
        (
            "SELECT * FROM input WHERE order_id IN (SELECT 1)",
            "sub-queries",
        ),
        ("SELECT * FROM (SELECT * FROM input)", "sub-quer"),
        ("SELECT DISTINCT status FROM input", "[deduplicate]"),
        ("SELECT * FROM orders", "FROM input"),
        ("SELECT 1", "FROM"),
        ("WITH x AS (SELECT 1) SELECT * FROM input", "WITH"),
        ("SELECT * FROM input UNION SELECT * FROM input", "UNION"),
        ("DELETE FROM input", "SELECT"),
    ];
    for (sql, expected) in cases {
        let text = refusal(sql);
        assert!(text.contains(expected), "{sql}: {text}");
    }
}

#[test]
fn unknown_names_get_the_nearest_one() {
    let text = refusal("SELECT statuss FROM input");
    assert_eq!(
        text,
        "no column \"statuss\" in the transform's input (did you mean status?); its columns are \
         order_id, status, amount, occurred_at, payload"
    );
    let text = refusal("SELECT uper(status) FROM input");
    assert!(
        text.starts_with("unknown function uper() (did you mean upper?)"),
        "{text}"
    );
    let text = refusal("SELECT * FROM input WHERE amunt > 1");
    assert!(text.contains("did you mean amount?"), "{text}");
}

#[test]
fn types_weir_does_not_carry_are_refused_or_widened() {
    let text = refusal("SELECT named_struct('a', order_id) AS xs FROM input");
    assert!(text.contains("column \"xs\""), "{text}");
    let out = run("SELECT CAST(order_id AS SMALLINT) AS s, CAST(1.5 AS FLOAT) AS f FROM input");
    assert_eq!(out.schema().field(0).data_type(), &DataType::Int32);
    assert_eq!(out.schema().field(1).data_type(), &DataType::Float64);
    let text = refusal("SELECT * FROM input WHERE amount");
    assert!(text.contains("WHERE"), "{text}");
    let text = refusal("SELECT order_id, status AS order_id FROM input");
    assert!(
        text.contains("two output columns are named \"order_id\""),
        "{text}"
    );
}

#[test]
fn a_failing_expression_fails_the_batch_with_its_name() {
    let mut t = SqlTransform::new(
        "casts",
        "SELECT CAST(status AS BIGINT) AS n FROM input",
        &orders_schema(),
        &[],
    )
    .unwrap();
    let e = t.process(&orders(), &info(7, 0)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("transform casts failed batch 7: "),
        "{text}"
    );
    assert!(!e.is_retryable());
}

#[test]
fn syntax_errors_are_reported() {
    assert!(matches!(
        check_sql("SELEC * FROM input", &[]),
        Err(PlanError::Syntax(_))
    ));
}
