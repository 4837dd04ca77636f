use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use super::*;
use crate::spec::{InputFormat, JoinSpec, JoinType, RowCondition, TableKind, TableSpec};

fn info() -> BatchInfo {
    BatchInfo {
        query_id: "q".into(),
        batch_id: 3,
        attempt: 0,
        timestamp_micros: 0,
        partition: 0,
    }
}

fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, true),
        Field::new("customer_id", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
    ]))
}

/// Orders 1..=5: customers 1, 2, 9 (not in the table), null, 3 (twice in the table).
fn orders() -> RecordBatch {
    RecordBatch::try_new(
        orders_schema(),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])),
            Arc::new(Int64Array::from(vec![
                Some(1),
                Some(2),
                Some(9),
                None,
                Some(3),
            ])),
            Arc::new(Int64Array::from(vec![10, 200, 30, 40, 50])),
        ],
    )
    .unwrap()
}

const CUSTOMERS: &str = r#"{"customer_id": 1, "name": "ada", "tier": "gold"}
{"customer_id": 2, "name": "bob", "tier": "basic"}
{"customer_id": 3, "name": "cy", "tier": "gold"}
{"customer_id": 3, "name": "cy2", "tier": "basic"}
{"customer_id": null, "name": "nobody", "tier": "basic"}
not json
"#;

fn table(dir: &Path, max_bytes: u64) -> StaticTable {
    std::fs::write(dir.join("customers.json"), CUSTOMERS).unwrap();
    StaticTable::open(TableSpec {
        name: "customers".into(),
        kind: TableKind::Files {
            path: dir.to_path_buf(),
            format: InputFormat::Json,
            schema: Some(Arc::new(Schema::new(vec![
                Field::new("customer_id", DataType::Int64, true),
                Field::new("name", DataType::Utf8, true),
                Field::new("tier", DataType::Utf8, true),
            ]))),
        },
        max_bytes,
    })
    .unwrap()
}

fn spec(kind: JoinType, stream_left: bool, condition: Option<&str>) -> JoinSpec {
    let (left, right) = if stream_left {
        ("orders", "customers")
    } else {
        ("customers", "orders")
    };
    JoinSpec {
        left: left.into(),
        right: right.into(),
        kind,
        on: vec!["customer_id".into()],
        condition: condition.map(|c| RowCondition::parse_join(c, left, right).unwrap()),
    }
}

fn join(
    kind: JoinType,
    stream_left: bool,
    condition: Option<&str>,
) -> (tempfile::TempDir, RecordBatch) {
    let dir = tempfile::tempdir().unwrap();
    let mut j = StaticJoin::new(
        spec(kind, stream_left, condition),
        table(dir.path(), 1 << 20),
        orders_schema(),
    )
    .unwrap();
    let out = j.process(&orders(), &info()).unwrap();
    (dir, out)
}

/// The rows as text, sorted: `column=value` joined by spaces, null as `-`.
fn rows(batch: &RecordBatch) -> Vec<String> {
    let mut out: Vec<String> = (0..batch.num_rows())
        .map(|r| {
            batch
                .schema()
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let c = batch.column(i);
                    let v = if c.is_null(r) {
                        "-".to_owned()
                    } else if let Some(s) = c.as_string_opt::<i32>() {
                        s.value(r).to_owned()
                    } else {
                        c.as_primitive::<Int64Type>().value(r).to_string()
                    };
                    format!("{}={v}", f.name())
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    out.sort();
    out
}

fn columns(batch: &RecordBatch) -> Vec<String> {
    batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect()
}

#[test]
fn a_left_join_keeps_every_order_and_repeats_it_for_each_matching_customer() {
    let (_dir, out) = join(JoinType::Left, true, None);
    assert_eq!(
        columns(&out),
        ["customer_id", "order_id", "amount", "name", "tier"]
    );
    assert_eq!(
        rows(&out),
        [
            "customer_id=- order_id=4 amount=40 name=- tier=-",
            "customer_id=1 order_id=1 amount=10 name=ada tier=gold",
            "customer_id=2 order_id=2 amount=200 name=bob tier=basic",
            "customer_id=3 order_id=5 amount=50 name=cy tier=gold",
            "customer_id=3 order_id=5 amount=50 name=cy2 tier=basic",
            "customer_id=9 order_id=3 amount=30 name=- tier=-",
        ]
    );
}

#[test]
fn inner_semi_and_anti_joins_never_match_a_null_key() {
    let (_dir, inner) = join(JoinType::Inner, true, None);
    assert_eq!(inner.num_rows(), 4);
    let (_dir, semi) = join(JoinType::LeftSemi, true, None);
    assert_eq!(columns(&semi), ["customer_id", "order_id", "amount"]);
    assert_eq!(
        rows(&semi),
        [
            "customer_id=1 order_id=1 amount=10",
            "customer_id=2 order_id=2 amount=200",
            "customer_id=3 order_id=5 amount=50",
        ]
    );
    let (_dir, anti) = join(JoinType::LeftAnti, true, None);
    assert_eq!(
        rows(&anti),
        [
            "customer_id=- order_id=4 amount=40",
            "customer_id=9 order_id=3 amount=30",
        ]
    );
}

#[test]
fn with_the_stream_on_the_right_the_table_s_columns_come_first() {
    let (_dir, out) = join(JoinType::Right, false, None);
    assert_eq!(
        columns(&out),
        ["customer_id", "name", "tier", "order_id", "amount"]
    );
    assert_eq!(out.num_rows(), 6);
    let dir = tempfile::tempdir().unwrap();
    let refused = StaticJoin::new(
        spec(JoinType::Left, false, None),
        table(dir.path(), 1 << 20),
        orders_schema(),
    )
    .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("a left join with the stream on the right is not supported"),
        "{refused}"
    );
}

#[test]
fn the_condition_filters_pairs_and_an_outer_join_keeps_the_rows_left_without_one() {
    let (_dir, out) = join(
        JoinType::Left,
        true,
        Some("customers.tier = 'gold' AND orders.amount < 100"),
    );
    assert_eq!(
        rows(&out),
        [
            "customer_id=- order_id=4 amount=40 name=- tier=-",
            "customer_id=1 order_id=1 amount=10 name=ada tier=gold",
            "customer_id=2 order_id=2 amount=200 name=- tier=-",
            "customer_id=3 order_id=5 amount=50 name=cy tier=gold",
            "customer_id=9 order_id=3 amount=30 name=- tier=-",
        ]
    );
}

#[test]
fn the_table_is_read_again_only_when_its_files_change_and_a_large_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut j = StaticJoin::new(
        spec(JoinType::Inner, true, None),
        table(dir.path(), 1 << 20),
        orders_schema(),
    )
    .unwrap();
    let first = j.current_snapshot().unwrap();
    assert_eq!(first.files, 1);
    assert!(first.listing.is_some());
    j.prepare(Some(&first)).unwrap();
    let name_of = |j: &mut StaticJoin| {
        let out = j.process(&orders(), &info()).unwrap();
        let ids = out.column(0).as_primitive::<Int64Type>();
        let names = out.column_by_name("name").unwrap().as_string::<i32>();
        (0..out.num_rows())
            .find(|r| ids.value(*r) == 1)
            .map(|r| names.value(r).to_owned())
    };
    assert_eq!(name_of(&mut j).as_deref(), Some("ada"));

    // The same bytes' length and modification time: the listing is unchanged, nothing is read.
    let file = dir.path().join("customers.json");
    let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
    std::fs::write(&file, CUSTOMERS.replace("ada", "eve")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(modified)
        .unwrap();
    assert_eq!(j.current_snapshot().unwrap(), first);
    j.prepare(Some(&first)).unwrap();
    assert_eq!(name_of(&mut j).as_deref(), Some("ada"));
    assert_eq!(j.reads(), 1, "the same listing is not read again");

    // A new file: another snapshot, read again.
    std::fs::write(
        dir.path().join("more.json"),
        "{\"customer_id\": 9, \"name\": \"zed\", \"tier\": \"basic\"}\n",
    )
    .unwrap();
    let second = j.current_snapshot().unwrap();
    assert_ne!(second, first);
    assert_eq!(second.files, 2);
    j.prepare(Some(&second)).unwrap();
    assert_eq!(j.reads(), 2);
    assert_eq!(name_of(&mut j).as_deref(), Some("eve"));
    assert_eq!(j.process(&orders(), &info()).unwrap().num_rows(), 5);

    let small = tempfile::tempdir().unwrap();
    let mut j = StaticJoin::new(
        spec(JoinType::Inner, true, None),
        table(small.path(), 64),
        orders_schema(),
    )
    .unwrap();
    let e = j.prepare(None).unwrap_err().to_string();
    assert!(
        e.starts_with("table customers is ") && e.contains("over its max_size of 64 bytes"),
        "{e}"
    );
}

#[test]
fn the_output_schema_names_what_does_not_fit() {
    let left = orders_schema();
    let right: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("customer_id", DataType::Utf8, true),
        Field::new("amount", DataType::Int64, true),
    ]));
    let e = output_schema(&spec(JoinType::Left, true, None), &left, &right).unwrap_err();
    assert!(
        e.contains("is Int64 in orders and Utf8 in customers"),
        "{e}"
    );
    let right: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("customer_id", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
    ]));
    let e = output_schema(&spec(JoinType::Left, true, None), &left, &right).unwrap_err();
    assert!(
        e.starts_with("the column \"amount\" is in both orders and customers"),
        "{e}"
    );
}

/// A Delta table is read once per version joined: the version planned is the version read, a
/// new commit is read at the next batch, and a replay of an older batch reads its own version.
#[test]
fn a_delta_table_is_read_once_per_version_and_a_replay_joins_its_own() {
    use crate::sink::delta::WriteMode;
    use crate::source::delta::tests::write;
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "dim", WriteMode::Append, 0, &[1, 2]);
    let table = StaticTable::open(TableSpec {
        name: "ids".into(),
        kind: TableKind::Delta {
            path: dir.path().join("table"),
        },
        max_bytes: 1 << 20,
    })
    .unwrap();
    let stream: SchemaRef = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("amount", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&stream),
        vec![
            Arc::new(Int64Array::from(vec![1, 2, 3])),
            Arc::new(Int64Array::from(vec![10, 20, 30])),
        ],
    )
    .unwrap();
    let mut j = StaticJoin::new(
        JoinSpec {
            left: "orders".into(),
            right: "ids".into(),
            kind: JoinType::LeftSemi,
            on: vec!["id".into()],
            condition: None,
        },
        table,
        stream,
    )
    .unwrap();
    let ids = |j: &mut StaticJoin| -> Vec<i64> {
        let out = j.process(&batch, &info()).unwrap();
        out.column(0).as_primitive::<Int64Type>().values().to_vec()
    };
    // Version 0 creates the table, version 1 holds batch 0's rows.
    let v0 = j.current_snapshot().unwrap();
    assert_eq!(v0.version, Some(1));
    for _ in 0..3 {
        j.prepare(Some(&v0)).unwrap();
        assert_eq!(ids(&mut j), [1, 2]);
    }
    assert_eq!(j.reads(), 1, "one version, one read");

    write(dir.path(), "dim", WriteMode::Append, 1, &[3]);
    let v1 = j.current_snapshot().unwrap();
    assert_eq!(v1.version, Some(2));
    j.prepare(Some(&v1)).unwrap();
    assert_eq!(ids(&mut j), [1, 2, 3]);
    assert_eq!(j.reads(), 2);

    // Batch 0 replayed: version 0 again, whatever the table holds now.
    j.prepare(Some(&v0)).unwrap();
    assert_eq!(ids(&mut j), [1, 2]);
    assert_eq!(j.reads(), 3);
}
