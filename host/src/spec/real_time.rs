//! What the real-time trigger can run, checked on the pipeline file itself.
//!
//! Why here: `weir validate` must refuse what `weir run` refuses, naming the key to change,
//! before a checkpoint is opened. Real-time mode hands each small part of a batch through
//! the whole pipeline as it arrives, so the only queries it takes are those whose output for
//! a part does not wait for the rest of the batch, and whose input can be read again part by
//! part after a crash (see `query::real_time`).

use super::{OutputMode, Pipeline, Problem, SourceKind, Trigger};

/// The reasons `p` cannot run on its real-time trigger (none for other triggers).
pub fn real_time_problems(p: &Pipeline) -> Vec<Problem> {
    let mut out = Vec::new();
    if !matches!(p.query.trigger, Trigger::RealTime(_)) {
        return out;
    }
    if p.sources.len() != 1 {
        out.push(Problem::new(
            "source",
            format!(
                "real-time mode reads one [[source]], this query has {}: union the inputs \
                 upstream (one Kafka topic pattern, one folder) or use a micro-batch trigger",
                p.sources.len()
            ),
        ));
    }
    for s in &p.sources {
        if let SourceKind::Delta(_) = s.kind {
            out.push(Problem::new(
                format!("source.{}.kind", s.name),
                "real-time mode reads kind = \"kafka\" or \"files\": a Delta table's rows \
                 arrive a commit at a time, so use a micro-batch trigger to read it",
            ));
        }
    }
    if let Some(join) = &p.join
        && p.sources.iter().any(|s| s.name == join.left)
        && p.sources.iter().any(|s| s.name == join.right)
    {
        out.push(Problem::new(
            "join",
            "real-time mode runs stream-static joins only: a stream-stream join emits and \
             evicts by the watermark, which moves once per batch (as in Spark, whose \
             real-time mode refuses it too); use a micro-batch trigger",
        ));
    }
    if p.aggregate.is_some() && p.query.output_mode != OutputMode::Update {
        out.push(Problem::new(
            "query.output_mode",
            "real-time mode emits the groups each part changed as it passes: an aggregation \
             needs output_mode = \"update\" (as in Spark's real-time mode)",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::spec;

    fn problems(extra: &str, sink: &str) -> Vec<(String, String)> {
        let text = format!(
            r#"
[query]
name = "rt"
checkpoint = "cp"
{extra}

[[source]]
name = "orders"
kind = "kafka"
bootstrap_servers = "127.0.0.1:9"
subscribe = ["orders"]
format = "json"
schema = "order_id BIGINT, status STRING, amount DOUBLE"

{sink}
"#
        );
        match spec::parse(&text, Path::new("/tmp"), "rt.toml", &[]) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems
                .into_iter()
                .map(|p| (p.path, p.message))
                .collect(),
        }
    }

    const FILES_SINK: &str = "[sink]\nkind = \"files\"\npath = \"out\"\nformat = \"json\"";

    #[test]
    fn the_trigger_takes_a_word_or_a_table() {
        let parse = |trigger: &str| {
            let text = format!(
                "[query]\nname = \"rt\"\ncheckpoint = \"cp\"\ntrigger = {trigger}\n\n\
                 [[source]]\nname = \"o\"\nkind = \"kafka\"\nbootstrap_servers = \"h:1\"\n\
                 subscribe = [\"o\"]\n\n{FILES_SINK}\n"
            );
            spec::parse(&text, Path::new("/tmp"), "rt.toml", &[]).map(|p| p.query.trigger)
        };
        assert_eq!(
            parse("\"real-time\"").unwrap(),
            spec::Trigger::RealTime(spec::RealTime {
                checkpoint_interval: std::time::Duration::from_secs(300),
                max_latency: std::time::Duration::from_millis(10),
            })
        );
        assert_eq!(
            parse("{ real_time = \"2s\", max_latency = \"3ms\" }").unwrap(),
            spec::Trigger::RealTime(spec::RealTime {
                checkpoint_interval: std::time::Duration::from_secs(2),
                max_latency: std::time::Duration::from_millis(3),
            })
        );
        let e =
            parse("{ real_time = \"1s\", max_latency = \"1s\", linger = \"2ms\" }").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("query.trigger.linger"), "{text}");
        let e = parse("{ max_latency = \"0s\" }").unwrap_err().to_string();
        assert!(e.contains("query.trigger.real_time: required"), "{e}");
        assert!(
            e.contains("query.trigger.max_latency: must be longer than zero"),
            "{e}"
        );
        let e = parse("{ real_time = \"1s\", max_latency = \"2s\" }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not below the checkpoint interval"), "{e}");
        let e = parse("5").unwrap_err().to_string();
        assert!(
            e.contains("query.trigger: expected a string or a table"),
            "{e}"
        );
    }

    #[test]
    fn what_real_time_mode_cannot_run_is_refused_with_the_reason() {
        assert_eq!(problems("trigger = \"real-time\"", FILES_SINK), Vec::new());
        let agg = "trigger = \"real-time\"\n\n[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS n\"]";
        let found = problems(agg, FILES_SINK);
        assert!(
            found
                .iter()
                .any(|(p, m)| p == "query.output_mode"
                    && m.contains("needs output_mode = \"update\"")),
            "{found:?}"
        );
        let update = "trigger = \"real-time\"\noutput_mode = \"update\"\n\n[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS n\"]";
        assert_eq!(problems(update, FILES_SINK), Vec::new());
        // The same aggregation in append mode on a micro-batch trigger is refused for another
        // reason (no watermark), never for this one.
        let micro = problems(
            "\n\n[aggregate]\ngroup_by = [\"status\"]\nselect = [\"count(*) AS n\"]",
            FILES_SINK,
        );
        assert!(
            micro.iter().all(|(_, m)| !m.contains("real-time")),
            "{micro:?}"
        );
    }
}
