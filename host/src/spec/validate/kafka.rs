//! The keys of Kafka sources and sinks, checked like every other kind: each problem with its
//! key path, all of them in one pass. Spark's option names are kept, snake_cased
//! (`startingOffsets` → `starting_offsets`), and so are its defaults (`latest`,
//! `failOnDataLoss = true`).

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;

use super::super::raw::{RawKafkaSink, RawKafkaSource};
use super::super::{
    KafkaDelivery, KafkaSinkSpec, KafkaSourceSpec, KafkaTopics, KafkaValueFormat, MalformedPolicy,
    SinkSpec, SourceKind, SourceSpec, StartingOffsets,
};
use super::{Collector, malformed_policy};

/// A `kind = "kafka"` source labelled `label` (`source.<name>`).
pub(super) fn source(
    label: &str,
    name: Option<String>,
    s: RawKafkaSource,
    base: &Path,
    c: &mut Collector,
) -> Option<SourceSpec> {
    let key = |k: &str| format!("{label}.{k}");
    let bootstrap_servers = bootstrap_servers(c, &key("bootstrap_servers"), s.bootstrap_servers);
    let topics = match (s.subscribe, s.subscribe_pattern) {
        (Some(_), Some(_)) => {
            c.push(
                &key("subscribe_pattern"),
                "give subscribe (a list of topics) or subscribe_pattern, not both",
            );
            None
        }
        (None, None) => {
            c.push(
                &key("subscribe"),
                "required key is missing: give subscribe = [\"topic\", ...] or subscribe_pattern = \"regex\"",
            );
            None
        }
        (Some(topics), None) => {
            if topics.is_empty() {
                c.push(&key("subscribe"), "must name at least one topic");
                None
            } else if let Some(bad) = topics.iter().find(|t| !is_topic_name(t)) {
                c.push(
                    &key("subscribe"),
                    format!(
                        "{bad:?} is not a Kafka topic name (1 to 249 of letters, digits, '.', '_' and '-')"
                    ),
                );
                None
            } else {
                Some(KafkaTopics::Subscribe(topics))
            }
        }
        (None, Some(pattern)) => match regex::Regex::new(&pattern) {
            Ok(_) => Some(KafkaTopics::Pattern(pattern)),
            Err(e) => {
                c.push(
                    &key("subscribe_pattern"),
                    format!("not a regular expression: {e}"),
                );
                None
            }
        },
    };
    let starting_offsets = match s.starting_offsets.as_deref() {
        None | Some("latest") => Some(StartingOffsets::Latest),
        Some("earliest") => Some(StartingOffsets::Earliest),
        Some(json) => specific_offsets(c, &key("starting_offsets"), json),
    };
    let max_offsets_per_trigger = match s.max_offsets_per_trigger {
        None => Some(None),
        Some(n) => c
            .positive(&key("max_offsets_per_trigger"), n)
            .and_then(NonZeroU64::new)
            .map(Some),
    };
    let value_format = match (s.format.as_deref(), s.schema) {
        (None, None) => Some(KafkaValueFormat::Raw),
        (None, Some(_)) => {
            c.push(
                &key("schema"),
                "a schema decodes the value and needs format = \"json\"",
            );
            None
        }
        (Some("json"), schema) => c
            .required(&key("schema"), schema)
            .and_then(|ddl| {
                super::super::ddl::parse_schema(&ddl)
                    .map_err(|err| c.push(&key("schema"), err))
                    .ok()
            })
            .map(|schema| KafkaValueFormat::Json(Arc::new(schema))),
        (Some(other), _) => {
            c.push(
                &key("format"),
                format!(
                    "{other:?} is not a value format of a kafka source: use \"json\", or no format for raw key and value bytes"
                ),
            );
            None
        }
    };
    let has_policy = s.on_malformed.is_some();
    let (on_malformed, dead_letter_path) =
        malformed_policy(c, label, s.on_malformed, s.dead_letter_path, base);
    if has_policy && value_format == Some(KafkaValueFormat::Raw) {
        c.push(
            &key("on_malformed"),
            "only used with format = \"json\": raw records are never malformed",
        );
    }
    let fail_on_data_loss = s.fail_on_data_loss.unwrap_or(true);
    Some(SourceSpec {
        name: name?,
        watermark: None,
        kind: SourceKind::Kafka(KafkaSourceSpec {
            bootstrap_servers: bootstrap_servers?,
            topics: topics?,
            starting_offsets: starting_offsets?,
            max_offsets_per_trigger: max_offsets_per_trigger?,
            fail_on_data_loss,
            value_format: value_format?,
            on_malformed: on_malformed.unwrap_or(MalformedPolicy::Permissive),
            dead_letter_path: dead_letter_path?,
        }),
    })
}

/// A `kind = "kafka"` sink.
pub(super) fn sink(s: RawKafkaSink, c: &mut Collector) -> Option<SinkSpec> {
    let bootstrap_servers = bootstrap_servers(c, "sink.bootstrap_servers", s.bootstrap_servers);
    let topic = c.required("sink.topic", s.topic).and_then(|t| {
        if is_topic_name(&t) {
            Some(t)
        } else {
            c.push(
                "sink.topic",
                format!(
                    "{t:?} is not a Kafka topic name (1 to 249 of letters, digits, '.', '_' and '-')"
                ),
            );
            None
        }
    });
    let column = |c: &mut Collector, k: &str, v: Option<String>| match v {
        Some(v) if v.trim().is_empty() => {
            c.push(&format!("sink.{k}"), "must name a column");
            None
        }
        v => Some(v),
    };
    let key = column(c, "key", s.key);
    let value = column(c, "value", s.value);
    let delivery = match s.delivery.as_deref() {
        None => Some(KafkaDelivery::ExactlyOnce),
        Some(d) => c.choice(
            "sink.delivery",
            d,
            "a delivery guarantee",
            &[
                ("exactly-once", KafkaDelivery::ExactlyOnce),
                ("at-least-once", KafkaDelivery::AtLeastOnce),
            ],
        ),
    };
    Some(SinkSpec::Kafka(KafkaSinkSpec {
        bootstrap_servers: bootstrap_servers?,
        topic: topic?,
        key: key?,
        value: value?,
        delivery: delivery?,
    }))
}

fn bootstrap_servers(c: &mut Collector, path: &str, value: Option<String>) -> Option<String> {
    let value = c.required(path, value)?;
    let bad = value.split(',').map(str::trim).find(|hp| {
        hp.rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    });
    match bad {
        Some(hp) => {
            c.push(
                path,
                format!("{hp:?} is not host:port; use e.g. \"127.0.0.1:9092,broker2:9092\""),
            );
            None
        }
        None => Some(value),
    }
}

/// Kafka's rule for topic names.
fn is_topic_name(t: &str) -> bool {
    !t.is_empty()
        && t.len() <= 249
        && t != "."
        && t != ".."
        && t.chars()
            .all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'))
}

/// Spark's per-partition JSON: `{"topic":{"0":23,"1":-2}}` (-2 earliest, -1 latest).
fn specific_offsets(c: &mut Collector, path: &str, json: &str) -> Option<StartingOffsets> {
    const HINT: &str = "use \"earliest\", \"latest\" or JSON such as {\"orders\":{\"0\":23,\"1\":-2}} (-2 = earliest, -1 = latest)";
    let parsed: BTreeMap<String, BTreeMap<String, i64>> = match serde_json::from_str(json) {
        Ok(p) => p,
        Err(e) => {
            c.push(
                path,
                format!("{json:?} is not a starting offset ({e}): {HINT}"),
            );
            return None;
        }
    };
    let mut out = BTreeMap::new();
    let mut ok = true;
    for (topic, partitions) in parsed {
        let mut per = BTreeMap::new();
        for (p, offset) in partitions {
            match p.parse::<i32>() {
                Ok(p) if p >= 0 && offset >= -2 => {
                    per.insert(p, offset);
                }
                _ => {
                    ok = false;
                    c.push(
                        path,
                        format!(
                            "topic {topic:?}: partition {p:?} at {offset} is not valid (a partition is a number >= 0, an offset >= 0, or -2 / -1)"
                        ),
                    );
                }
            }
        }
        out.insert(topic, per);
    }
    ok.then_some(StartingOffsets::Specific(out))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::spec::{
        KafkaDelivery, KafkaSinkSpec, KafkaTopics, KafkaValueFormat, SinkSpec, SourceKind,
        StartingOffsets, parse,
    };

    const KAFKA: &str = r#"
[query]
name = "q"
checkpoint = "cp"

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092,broker2:9093"
subscribe = ["orders", "returns"]
starting_offsets = '{"orders":{"0":23,"1":-2},"returns":{"0":-1}}'
max_offsets_per_trigger = 10000
fail_on_data_loss = false
format = "json"
schema = "id BIGINT, status STRING"
on_malformed = "drop"

[sink]
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topic = "out"
key = "status"
delivery = "at-least-once"
"#;

    fn problems(text: &str) -> Vec<String> {
        match parse(text, Path::new("/base"), "p.toml", &[]) {
            Ok(p) => panic!("expected problems, got {p:#?}"),
            Err(e) => e.problems.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_kafka_source_and_sink_read_into_typed_specs() {
        let p = parse(KAFKA, Path::new("/base"), "p.toml", &[]).unwrap();
        let SourceKind::Kafka(k) = &p.sources[0].kind else {
            panic!("{:?}", p.sources[0].kind)
        };
        assert_eq!(k.bootstrap_servers, "127.0.0.1:9092,broker2:9093");
        assert_eq!(
            k.topics,
            KafkaTopics::Subscribe(vec!["orders".into(), "returns".into()])
        );
        let StartingOffsets::Specific(offsets) = &k.starting_offsets else {
            panic!("{:?}", k.starting_offsets)
        };
        assert_eq!(offsets["orders"][&0], 23);
        assert_eq!(offsets["orders"][&1], -2);
        assert_eq!(offsets["returns"][&0], -1);
        assert_eq!(k.max_offsets_per_trigger.map(|n| n.get()), Some(10_000));
        assert!(!k.fail_on_data_loss);
        assert!(matches!(&k.value_format, KafkaValueFormat::Json(s) if s.fields().len() == 2));
        assert_eq!(
            p.sink,
            SinkSpec::Kafka(KafkaSinkSpec {
                bootstrap_servers: "127.0.0.1:9092".into(),
                topic: "out".into(),
                key: Some("status".into()),
                value: None,
                delivery: KafkaDelivery::AtLeastOnce,
            })
        );
        // Spark's defaults: latest, fail on data loss, raw records, exactly-once sink.
        let minimal = "[query]\nname = \"q\"\ncheckpoint = \"cp\"\n[[source]]\nname = \"o\"\nkind = \"kafka\"\n\
                       bootstrap_servers = \"b:1\"\nsubscribe_pattern = \"orders-.*\"\n\
                       [sink]\nkind = \"kafka\"\nbootstrap_servers = \"b:1\"\ntopic = \"t\"\nvalue = \"v\"\n";
        let p = parse(minimal, Path::new("/base"), "p.toml", &[]).unwrap();
        let SourceKind::Kafka(k) = &p.sources[0].kind else {
            panic!()
        };
        assert_eq!(k.starting_offsets, StartingOffsets::Latest);
        assert!(k.fail_on_data_loss);
        assert_eq!(k.value_format, KafkaValueFormat::Raw);
        assert_eq!(k.topics, KafkaTopics::Pattern("orders-.*".into()));
        assert!(matches!(&p.sink, SinkSpec::Kafka(s) if s.delivery == KafkaDelivery::ExactlyOnce));
    }

    #[test]
    fn every_kafka_problem_is_reported_with_its_key() {
        let text = KAFKA
            .replace("127.0.0.1:9092,broker2:9093", "nowhere")
            .replace(
                "subscribe = [\"orders\", \"returns\"]",
                "subscribe = [\"orders\"]\nsubscribe_pattern = \"(\"\npath = \"in\"",
            )
            .replace(
                r#"'{"orders":{"0":23,"1":-2},"returns":{"0":-1}}'"#,
                r#"'{"orders":{"x":1}}'"#,
            )
            .replace(
                "max_offsets_per_trigger = 10000",
                "max_offsets_per_trigger = 0",
            )
            .replace("format = \"json\"", "format = \"avro\"")
            .replace("topic = \"out\"", "topic = \"bad topic\"")
            .replace("at-least-once", "maybe");
        let got = problems(&text);
        let expected = [
            "source.orders.path: unknown key of a kafka source",
            "source.orders.bootstrap_servers: \"nowhere\" is not host:port",
            "source.orders.subscribe_pattern: give subscribe (a list of topics) or subscribe_pattern, not both",
            "source.orders.starting_offsets: topic \"orders\": partition \"x\" at 1 is not valid",
            "source.orders.max_offsets_per_trigger: must be a positive integer, not 0",
            "source.orders.format: \"avro\" is not a value format of a kafka source",
            "sink.topic: \"bad topic\" is not a Kafka topic name",
            "sink.delivery: \"maybe\" is not a delivery guarantee: use \"exactly-once\" or \"at-least-once\"",
        ];
        for e in expected {
            assert!(
                got.iter().any(|g| g.starts_with(e)),
                "{e:?} not in {got:#?}"
            );
        }
        assert_eq!(got.len(), expected.len(), "{got:#?}");
        // Kafka keys on a files source are refused too.
        let files = "[query]\nname = \"q\"\ncheckpoint = \"cp\"\n[[source]]\nname = \"o\"\nkind = \"files\"\npath = \"in\"\n\
                     format = \"json\"\nschema = \"id BIGINT\"\nsubscribe = [\"x\"]\n[sink]\nkind = \"memory\"\n";
        assert_eq!(
            problems(files),
            [
                "source.o.subscribe: unknown key of a files source (known keys: kind, name, path, format, schema, max_files_per_trigger, on_malformed, dead_letter_path, csv, watermark); it is a key of kafka sources"
            ]
        );
    }
}
