//! Offset planning of the Kafka source, kept free of any client so that every rule is tested
//! without a broker: where a new query starts, what happens when offsets vanished under the
//! query (retention, a deleted or re-created topic), and how `max_offsets_per_trigger` is split
//! across partitions. The rules are Spark's (`KafkaMicroBatchStream`, `KafkaSource.rateLimit`).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::spec::StartingOffsets;

/// One partition of one topic, written `topic-partition` as Kafka tools do.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// An offset per partition, serialised as Spark writes Kafka offsets in its offset log:
/// `{"orders":{"0":23,"1":45}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionOffsets(pub BTreeMap<TopicPartition, i64>);

impl PartitionOffsets {
    pub fn get(&self, tp: &TopicPartition) -> Option<i64> {
        self.0.get(tp).copied()
    }

    /// Spark's JSON form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

impl Serialize for PartitionOffsets {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut nested: BTreeMap<&str, BTreeMap<String, i64>> = BTreeMap::new();
        for (tp, offset) in &self.0 {
            nested
                .entry(tp.topic.as_str())
                .or_default()
                .insert(tp.partition.to_string(), *offset);
        }
        nested.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for PartitionOffsets {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let nested = BTreeMap::<String, BTreeMap<String, i64>>::deserialize(deserializer)?;
        let mut out = BTreeMap::new();
        for (topic, partitions) in nested {
            for (p, offset) in partitions {
                let partition = p.parse::<i32>().map_err(|_| {
                    serde::de::Error::custom(format!("topic {topic:?}: {p:?} is not a partition"))
                })?;
                out.insert(TopicPartition::new(topic.clone(), partition), offset);
            }
        }
        Ok(Self(out))
    }
}

/// What the broker holds: per partition the earliest offset still there (low watermark) and
/// the offset the next record will get (high watermark).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Available {
    pub earliest: PartitionOffsets,
    pub latest: PartitionOffsets,
}

/// Offsets a query was going to read that are not there any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataLoss {
    /// `[from, earliest)` was removed (retention, or a starting offset before the log start).
    Truncated {
        tp: TopicPartition,
        from: i64,
        earliest: i64,
    },
    /// The partition is gone (its topic was deleted); the query had reached `at`.
    Gone { tp: TopicPartition, at: i64 },
    /// The partition ends before where the query stands: the topic was re-created.
    Reset {
        tp: TopicPartition,
        from: i64,
        latest: i64,
    },
}

impl fmt::Display for DataLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { tp, from, earliest } => write!(
                f,
                "{tp}: offsets {from} to {} are gone (the earliest offset is now {earliest}; removed by retention?)",
                earliest - 1
            ),
            Self::Gone { tp, at } => write!(
                f,
                "{tp} no longer exists (the query had read up to offset {at}): the topic was deleted or lost partitions"
            ),
            Self::Reset { tp, from, latest } => write!(
                f,
                "{tp}: the query stands at offset {from} but the partition now ends at {latest}: the topic was deleted and re-created?"
            ),
        }
    }
}

/// A starting offset named a partition wrongly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error(
        "starting_offsets must give an offset for every partition of the topics it names (as in Spark); missing: {}",
        list(.0)
    )]
    Missing(Vec<TopicPartition>),
}

fn list(tps: &[TopicPartition]) -> String {
    tps.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a new query starts in the partitions that exist now.
///
/// # Errors
/// [`StartError::Missing`] when per-partition offsets leave out a partition of a topic they
/// name, or a subscribed topic altogether.
pub fn starting(
    spec: &StartingOffsets,
    available: &Available,
) -> Result<PartitionOffsets, StartError> {
    match spec {
        StartingOffsets::Earliest => Ok(available.earliest.clone()),
        StartingOffsets::Latest => Ok(available.latest.clone()),
        StartingOffsets::Specific(map) => {
            let mut out = BTreeMap::new();
            let mut missing = Vec::new();
            for (tp, &latest) in &available.latest.0 {
                let given = map.get(&tp.topic).and_then(|p| p.get(&tp.partition));
                let offset = match given {
                    Some(-2) => available.earliest.get(tp).unwrap_or(0),
                    Some(-1) => latest,
                    Some(&o) => o,
                    None => {
                        missing.push(tp.clone());
                        continue;
                    }
                };
                out.insert(tp.clone(), offset);
            }
            if missing.is_empty() {
                Ok(PartitionOffsets(out))
            } else {
                Err(StartError::Missing(missing))
            }
        }
    }
}

/// Where the next batch starts in every partition that exists now: where the last one ended,
/// or the earliest offset for a partition that is new (as in Spark). Offsets that vanished
/// are skipped and reported: the caller fails on them unless `fail_on_data_loss = false`.
pub fn reconcile(
    previous: &PartitionOffsets,
    available: &Available,
) -> (PartitionOffsets, Vec<DataLoss>) {
    let mut start = BTreeMap::new();
    let mut losses = Vec::new();
    for (tp, &latest) in &available.latest.0 {
        let earliest = available.earliest.get(tp).unwrap_or(0);
        let from = match previous.get(tp) {
            None => earliest,
            Some(from) if from > latest => {
                losses.push(DataLoss::Reset {
                    tp: tp.clone(),
                    from,
                    latest,
                });
                earliest
            }
            Some(from) if from < earliest => {
                losses.push(DataLoss::Truncated {
                    tp: tp.clone(),
                    from,
                    earliest,
                });
                earliest
            }
            Some(from) => from,
        };
        start.insert(tp.clone(), from);
    }
    for (tp, &at) in &previous.0 {
        if !available.latest.0.contains_key(tp) {
            losses.push(DataLoss::Gone { tp: tp.clone(), at });
        }
    }
    (PartitionOffsets(start), losses)
}

/// The end of the next batch: up to `until` (the latest offsets, or an available-now target)
/// in every partition of `start`, at most `limit` records in all, split across partitions in
/// proportion to their backlog. Spark's rounding: a share below one record is rounded up so
/// that no partition starves, others down.
pub fn end_offsets(
    start: &PartitionOffsets,
    until: &PartitionOffsets,
    limit: Option<u64>,
) -> PartitionOffsets {
    let target = |tp: &TopicPartition, from: i64| until.get(tp).map_or(from, |u| u.max(from));
    let total: i64 = start
        .0
        .iter()
        .map(|(tp, &from)| target(tp, from) - from)
        .sum();
    let mut end = BTreeMap::new();
    for (tp, &from) in &start.0 {
        let to = target(tp, from);
        let capped = match limit {
            Some(limit) if total > 0 && u64::try_from(total).is_ok_and(|t| t > limit) => {
                let size = (to - from) as f64;
                let prorate = limit as f64 * (size / total as f64);
                let share = (if prorate < 1.0 {
                    prorate.ceil()
                } else {
                    prorate.floor()
                }) as i64;
                from.saturating_add(share).min(to)
            }
            _ => to,
        };
        end.insert(tp.clone(), capped);
    }
    PartitionOffsets(end)
}

/// Records between `start` and `end`, over all partitions. The offsets may come from a damaged
/// checkpoint, so nothing overflows: the count saturates.
pub fn count(start: &PartitionOffsets, end: &PartitionOffsets) -> u64 {
    end.0
        .iter()
        .map(|(tp, &to)| {
            let from = start.get(tp).unwrap_or(to);
            u64::try_from(to.saturating_sub(from)).unwrap_or(0)
        })
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(items: &[(&str, i32, i64)]) -> PartitionOffsets {
        PartitionOffsets(
            items
                .iter()
                .map(|&(t, p, o)| (TopicPartition::new(t, p), o))
                .collect(),
        )
    }

    #[test]
    fn offsets_serialise_as_spark_writes_them() {
        let o = offsets(&[("orders", 0, 23), ("orders", 1, 45), ("audit", 0, 7)]);
        let json = serde_json::to_string(&o).unwrap();
        assert_eq!(json, r#"{"audit":{"0":7},"orders":{"0":23,"1":45}}"#);
        let back: PartitionOffsets = serde_json::from_str(&json).unwrap();
        assert_eq!(back, o);
        let bad = serde_json::from_str::<PartitionOffsets>(r#"{"orders":{"x":1}}"#).unwrap_err();
        assert!(
            bad.to_string().contains("\"x\" is not a partition"),
            "{bad}"
        );
    }

    fn available() -> Available {
        Available {
            earliest: offsets(&[("orders", 0, 0), ("orders", 1, 10)]),
            latest: offsets(&[("orders", 0, 100), ("orders", 1, 50)]),
        }
    }

    #[test]
    fn earliest_latest_and_per_partition_starting_offsets() {
        let a = available();
        assert_eq!(
            starting(&StartingOffsets::Earliest, &a).unwrap(),
            a.earliest
        );
        assert_eq!(starting(&StartingOffsets::Latest, &a).unwrap(), a.latest);
        let spec: BTreeMap<String, BTreeMap<i32, i64>> = [(
            "orders".to_owned(),
            [(0, 23), (1, -2)].into_iter().collect(),
        )]
        .into();
        assert_eq!(
            starting(&StartingOffsets::Specific(spec), &a).unwrap(),
            offsets(&[("orders", 0, 23), ("orders", 1, 10)])
        );
        let latest: BTreeMap<String, BTreeMap<i32, i64>> =
            [("orders".to_owned(), [(0, -1)].into_iter().collect())].into();
        let err = starting(&StartingOffsets::Specific(latest), &a).unwrap_err();
        assert_eq!(
            err.to_string(),
            "starting_offsets must give an offset for every partition of the topics it names (as in Spark); missing: orders-1"
        );
    }

    #[test]
    fn the_rate_limit_is_split_in_proportion_to_the_backlog() {
        let start = offsets(&[("orders", 0, 0), ("orders", 1, 0), ("orders", 2, 0)]);
        let until = offsets(&[("orders", 0, 600), ("orders", 1, 300), ("orders", 2, 100)]);
        // 1000 waiting, 100 allowed: 60 / 30 / 10.
        let end = end_offsets(&start, &until, Some(100));
        assert_eq!(
            end,
            offsets(&[("orders", 0, 60), ("orders", 1, 30), ("orders", 2, 10)])
        );
        assert_eq!(count(&start, &end), 100);
        // A share under one record is rounded up: a small partition is not starved.
        let until = offsets(&[("orders", 0, 10_000), ("orders", 1, 1), ("orders", 2, 0)]);
        let end = end_offsets(&start, &until, Some(10));
        assert_eq!(
            end,
            offsets(&[("orders", 0, 9), ("orders", 1, 1), ("orders", 2, 0)])
        );
        // Under the limit: everything.
        let end = end_offsets(&start, &until, Some(1_000_000));
        assert_eq!(end, until);
        assert_eq!(end_offsets(&start, &until, None), until);
        // Successive batches drain the backlog exactly.
        let until = offsets(&[("orders", 0, 7), ("orders", 1, 3), ("orders", 2, 0)]);
        let mut at = start.clone();
        let mut batches = 0;
        while count(&at, &until) > 0 {
            let end = end_offsets(&at, &until, Some(4));
            assert!(count(&at, &end) <= 5, "{at:?} → {end:?}");
            at = end;
            batches += 1;
        }
        assert_eq!(at, until);
        assert!(batches >= 3);
    }

    #[test]
    fn extreme_recorded_offsets_do_not_overflow_the_count() {
        let start = offsets(&[("t", 0, i64::MIN), ("t", 1, -5), ("t", 2, i64::MIN)]);
        let end = offsets(&[("t", 0, i64::MAX), ("t", 1, i64::MAX), ("t", 2, i64::MAX)]);
        assert_eq!(count(&start, &end), u64::MAX);
        assert_eq!(count(&end, &start), 0);
    }

    #[test]
    fn new_partitions_start_at_their_earliest_offset() {
        let previous = offsets(&[("orders", 0, 40)]);
        let (start, losses) = reconcile(&previous, &available());
        assert!(losses.is_empty());
        assert_eq!(start, offsets(&[("orders", 0, 40), ("orders", 1, 10)]));
    }

    #[test]
    fn vanished_offsets_are_reported_and_skipped() {
        let previous = offsets(&[("orders", 0, 120), ("orders", 1, 4), ("gone", 0, 9)]);
        let (start, losses) = reconcile(&previous, &available());
        assert_eq!(start, offsets(&[("orders", 0, 0), ("orders", 1, 10)]));
        let text: Vec<String> = losses.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "orders-0: the query stands at offset 120 but the partition now ends at 100: the topic was deleted and re-created?",
                "orders-1: offsets 4 to 9 are gone (the earliest offset is now 10; removed by retention?)",
                "gone-0 no longer exists (the query had read up to offset 9): the topic was deleted or lost partitions",
            ]
        );
    }
}
