//! Which sink takes which output mode, checked on the pipeline file itself.
//!
//! Why here and not in the sinks: `weir validate` must refuse what `weir run` refuses, in the
//! same list as every other problem and with the key to change, before a checkpoint or a table
//! is opened. The rules need the settings only (the output mode and the sink's keys), never the
//! data.

use super::validate::Collector;
use super::{CommitEvery, OutputMode, Pipeline, Problem, SinkSpec};

/// Reports each combination of output mode and sink that cannot run.
pub(super) fn check(mode: Option<OutputMode>, sink: Option<&SinkSpec>, c: &mut Collector) {
    if let (Some(mode), Some(sink)) = (mode, sink) {
        for problem in problems(mode, sink) {
            c.push(&problem.path, problem.message);
        }
    }
}

/// The problems [`check`] reports, for a pipeline that is otherwise valid (one built in code
/// has not been through validation).
pub fn sink_problems(p: &Pipeline) -> Vec<Problem> {
    problems(p.query.output_mode, &p.sink)
}

fn problems(mode: OutputMode, sink: &SinkSpec) -> Vec<Problem> {
    let mut out = Vec::new();
    if let SinkSpec::Delta(delta) = sink {
        match mode {
            OutputMode::Update => out.push(Problem::new(
                "query.output_mode",
                "a delta sink takes output_mode \"append\" or \"complete\", not \"update\" (as in \
                 Spark; upserts need MERGE: use kind = \"delta-merge\")",
            )),
            OutputMode::Complete if !every_batch(delta.commit_every) => out.push(Problem::new(
                "sink.commit_every",
                "complete mode rewrites the whole table every batch, so it commits every batch; \
                 remove commit_every",
            )),
            OutputMode::Append | OutputMode::Complete => {}
        }
    }
    out
}

fn every_batch(commit: CommitEvery) -> bool {
    matches!(commit, CommitEvery::Batches(n) if n.get() == 1)
}
