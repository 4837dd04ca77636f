//! The Kafka source against a Kafka-protocol broker (librdkafka's mock cluster, in this
//! process, over TCP): planning under a rate limit, exact ranges, replays, raw rows, JSON
//! values with the files source's malformed-record policies, and data loss.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::*;
use crate::decode::{DecoderOptions, Format, MalformedPolicy};
use crate::spec::{KafkaValueFormat, StartingOffsets};

fn cluster(partitions: i32) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders", partitions, 1).unwrap();
    cluster
}

fn produce(bootstrap: &str, partition: i32, values: &[&str]) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "1")
        .create()
        .unwrap();
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        producer
            .send(
                BaseRecord::to("orders")
                    .partition(partition)
                    .key(key.as_bytes())
                    .payload(v.as_bytes()),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

fn spec(bootstrap: &str, limit: Option<u64>, format: KafkaValueFormat) -> KafkaSourceSpec {
    KafkaSourceSpec {
        bootstrap_servers: bootstrap.to_owned(),
        topics: KafkaTopics::Subscribe(vec!["orders".into()]),
        starting_offsets: StartingOffsets::Earliest,
        max_offsets_per_trigger: limit.and_then(std::num::NonZeroU64::new),
        fail_on_data_loss: true,
        value_format: format,
        on_malformed: MalformedPolicy::Permissive,
        dead_letter_path: None,
    }
}

fn offsets(items: &[(i32, i64)]) -> PartitionOffsets {
    PartitionOffsets(
        items
            .iter()
            .map(|&(p, o)| (TopicPartition::new("orders", p), o))
            .collect(),
    )
}

fn offsets_column(d: &Decoded) -> Vec<i64> {
    d.batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("offset")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[test]
fn batches_read_exactly_their_planned_ranges_under_a_rate_limit() {
    let mock = cluster(2);
    let bootstrap = mock.bootstrap_servers();
    let values: Vec<String> = (0..30).map(|i| format!("v{i}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    produce(&bootstrap, 0, &refs[..20]);
    produce(&bootstrap, 1, &refs[20..]);
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let mut source = KafkaSource::open(
        "orders".into(),
        0,
        spec(&bootstrap, Some(15), KafkaValueFormat::Raw),
        None,
        &checkpoint,
        None,
    )
    .unwrap();
    assert_eq!(source.description(), "KafkaV2[Subscribe[orders]]");

    // 30 waiting (20 + 10), 15 allowed: 10 and 5, in proportion.
    let first = source.plan(&checkpoint, None, false).unwrap().unwrap();
    assert_eq!(first.start, offsets(&[(0, 0), (1, 0)]));
    assert_eq!(first.end, offsets(&[(0, 10), (1, 5)]));
    assert_eq!(first.latest, offsets(&[(0, 20), (1, 10)]));
    // The starting offsets are recorded before the first batch runs.
    assert_eq!(
        checkpoint.source_log(0).get::<PartitionOffsets>(0).unwrap(),
        Some(first.start.clone())
    );
    source.planned(&first);
    let second = source.plan(&checkpoint, None, false).unwrap().unwrap();
    assert_eq!(second.start, first.end);
    assert_eq!(second.end, offsets(&[(0, 20), (1, 10)]));
    source.planned(&second);
    assert_eq!(source.plan(&checkpoint, None, false).unwrap(), None);

    let rows = source.read(0, &first).unwrap();
    assert_eq!(rows.num_input_rows, 15);
    assert_eq!(
        offsets_column(&rows),
        [(0..10).collect::<Vec<i64>>(), (0..5).collect()].concat()
    );
    // A replay reads the same range again, after later batches were read.
    let again = source.read(1, &second).unwrap();
    assert_eq!(again.num_input_rows, 15);
    let replay = source.read(0, &first).unwrap();
    assert_eq!(replay.batches, rows.batches);
    // Raw rows carry Spark's columns.
    let batch = &rows.batches[0];
    let schema = batch.schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(
        names,
        [
            "key",
            "value",
            "topic",
            "partition",
            "offset",
            "timestamp",
            "timestampType"
        ]
    );
    assert_eq!(batch.column(1).as_binary::<i32>().value(0), b"v0");
    assert_eq!(batch.column(0).as_binary::<i32>().value(1), b"k1");
    assert_eq!(batch.column(2).as_string::<i32>().value(0), "orders");
    assert_eq!(
        batch
            .column(6)
            .as_primitive::<arrow_array::types::Int32Type>()
            .value(0),
        0
    );
}

#[test]
fn the_assignment_is_kept_across_batches_and_serves_records_that_arrive_later() {
    let mock = cluster(2);
    let bootstrap = mock.bootstrap_servers();
    let values: Vec<String> = (0..40).map(|i| format!("v{i}")).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    produce(&bootstrap, 0, &refs[..10]);
    produce(&bootstrap, 1, &refs[10..20]);
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let mut source = KafkaSource::open(
        "orders".into(),
        0,
        spec(&bootstrap, Some(8), KafkaValueFormat::Raw),
        None,
        &checkpoint,
        None,
    )
    .unwrap();
    let values_of = |d: &Decoded| -> Vec<Vec<u8>> {
        d.batches
            .iter()
            .flat_map(|b| {
                let v = b.column_by_name("value").unwrap().as_binary::<i32>();
                (0..arrow_array::Array::len(v))
                    .map(|i| v.value(i).to_vec())
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let mut read = Vec::new();
    // Batch 0 reads 4 of each partition; the consumer fetches ahead of that.
    let first = source.plan(&checkpoint, None, false).unwrap().unwrap();
    source.planned(&first);
    read.extend(values_of(&source.read(0, &first).unwrap()));
    assert!(source.held.is_some());
    // Partition 0 gains records; batch 1 reads on from where batch 0 ended, on the held
    // assignment.
    produce(&bootstrap, 0, &refs[20..30]);
    let second = source.plan(&checkpoint, None, false).unwrap().unwrap();
    assert_eq!(second.start, first.end);
    source.planned(&second);
    let before = source.held.as_ref().map(|h| h.parts.len());
    read.extend(values_of(&source.read(1, &second).unwrap()));
    assert_eq!(source.held.as_ref().map(|h| h.parts.len()), before);
    // A batch without partition 1 (all of it read) keeps its queue for later.
    produce(&bootstrap, 1, &refs[30..40]);
    while let Some(next) = source.plan(&checkpoint, None, false).unwrap() {
        source.planned(&next);
        read.extend(values_of(&source.read(2, &next).unwrap()));
    }
    read.sort();
    let mut all: Vec<Vec<u8>> = values.iter().map(|v| v.as_bytes().to_vec()).collect();
    all.sort();
    assert_eq!(read, all, "every record read once, none twice");
    // A replay of batch 1 (behind the held queues) assigns afresh and reads the same rows.
    let replay = source.read(1, &second).unwrap();
    let planned: i64 = second
        .end
        .0
        .iter()
        .map(|(tp, end)| end - second.start.get(tp).unwrap_or(*end))
        .sum();
    assert_eq!(i64::try_from(replay.num_input_rows).unwrap(), planned);
    // Exactly the planned offsets, partition by partition.
    let expected: Vec<i64> = second
        .end
        .0
        .iter()
        .flat_map(|(tp, &end)| second.start.get(tp).unwrap_or(end)..end)
        .collect();
    assert_eq!(offsets_column(&replay), expected);
}

#[test]
fn json_values_decode_with_the_files_policies_naming_partition_and_offset() {
    let mock = cluster(1);
    let bootstrap = mock.bootstrap_servers();
    produce(
        &bootstrap,
        0,
        &[
            r#"{"id":1,"status":"ok"}"#,
            r#"{"id":"x","status":"bad id"}"#,
            "{\n\"id\":3,\n\"status\":\"pretty\"}",
            r#"{"id":4"#,
        ],
    );
    let schema = Arc::new(crate::spec::parse_schema("id BIGINT, status STRING").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    let open = |policy| {
        let decoder = Decoder::new(
            Arc::clone(&schema),
            DecoderOptions {
                format: Format::JsonLines,
                policy,
                batch_size: 1024,
            },
        )
        .unwrap();
        KafkaSource::open(
            "orders".into(),
            0,
            spec(
                &bootstrap,
                None,
                KafkaValueFormat::Json(Arc::clone(&schema)),
            ),
            Some(decoder),
            &checkpoint,
            None,
        )
        .unwrap()
    };
    let mut permissive = open(MalformedPolicy::Permissive);
    let plan = permissive.plan(&checkpoint, None, false).unwrap().unwrap();
    let rows = permissive.read(0, &plan).unwrap();
    assert_eq!((rows.num_input_rows, rows.num_malformed), (4, 2));
    let batch = &rows.batches[0];
    let ids: Vec<Option<i64>> = batch.column(0).as_primitive::<Int64Type>().iter().collect();
    assert_eq!(ids, [Some(1), None, Some(3), None]);
    assert_eq!(batch.column(1).as_string::<i32>().value(2), "pretty");
    assert_eq!(batch.column(2).as_string::<i32>().value(3), r#"{"id":4"#);

    let mut fail = open(MalformedPolicy::Fail);
    let err = fail.read(0, &plan).unwrap_err().to_string();
    assert!(
        err.starts_with(
            "source orders: batch 0: malformed record at orders-0 offset 1: field \"id\""
        ),
        "{err}"
    );
    let mut dead = open(MalformedPolicy::DeadLetter);
    let rows = dead.read(0, &plan).unwrap();
    let origins: Vec<&str> = rows.malformed.iter().map(|m| m.origin.as_str()).collect();
    assert_eq!(origins, ["orders-0@1", "orders-0@3"]);
}

#[test]
fn offsets_gone_fail_the_batch_or_are_skipped() {
    let mock = cluster(2);
    let bootstrap = mock.bootstrap_servers();
    produce(&bootstrap, 0, &["a", "b", "c"]);
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    // The checkpoint says the query stands past the end of partition 0 and in a partition
    // that does not exist: both are data loss.
    let stood = offsets(&[(0, 7), (1, 0), (5, 2)]);
    let mut strict = KafkaSource::open(
        "orders".into(),
        0,
        spec(&bootstrap, None, KafkaValueFormat::Raw),
        None,
        &checkpoint,
        Some(stood.clone()),
    )
    .unwrap();
    let err = strict
        .plan(&checkpoint, None, false)
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "source orders: data loss:\n  \
         - orders-0: the query stands at offset 7 but the partition now ends at 3: the topic was deleted and re-created?\n  \
         - orders-5 no longer exists (the query had read up to offset 2): the topic was deleted or lost partitions\n\
         Set fail_on_data_loss = false to skip lost offsets with a warning."
    );
    let mut lenient_spec = spec(&bootstrap, None, KafkaValueFormat::Raw);
    lenient_spec.fail_on_data_loss = false;
    let mut lenient = KafkaSource::open(
        "orders".into(),
        0,
        lenient_spec,
        None,
        &checkpoint,
        Some(stood),
    )
    .unwrap();
    let plan = lenient.plan(&checkpoint, None, false).unwrap().unwrap();
    assert_eq!(plan.start, offsets(&[(0, 0), (1, 0)]));
    assert_eq!(lenient.read(0, &plan).unwrap().num_input_rows, 3);
}
