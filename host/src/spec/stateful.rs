//! Spark's rules for which stateful query fits which output mode, checked on
//! the pipeline file itself.
//!
//! Why here and not only in the operators: `weir validate` must refuse what
//! `weir run` refuses, in the same list as every other problem and with the
//! key to change, without opening a checkpoint or a state store. The rules
//! need names only (the output mode, the window kind, the keys, the
//! aggregate functions and the watermark column); what needs the input schema — a column that does not
//! exist, an aggregate over the wrong type — is left to the operators, which
//! check it again at start. The same reading of a pipeline gives the
//! warnings about state that can only grow, as data, so that callers can
//! show and test them.

use super::validate::Collector;
use super::{AggregateSpec, DeduplicateSpec, OutputMode, Pipeline, Problem, WatermarkSpec};
use super::{WindowKind, WindowSpec};
use crate::operator::aggregate::{AggFunction, AggregateError, parse_agg_expr};

/// A table of the file as far as validation got: absent, present but with
/// problems already reported, or valid.
pub(super) type Table<'a, T> = Option<Option<&'a T>>;

/// Reports each combination Spark refuses (or that could never emit).
pub(super) fn check(
    mode: Option<OutputMode>,
    watermark: Table<'_, WatermarkSpec>,
    aggregate: Table<'_, AggregateSpec>,
    deduplicate: Table<'_, DeduplicateSpec>,
    c: &mut Collector,
) {
    for problem in problems(mode, watermark, aggregate, deduplicate) {
        c.push(&problem.path, problem.message);
    }
}

/// The problems [`check`] reports, for a pipeline that is otherwise valid.
pub fn stateful_problems(p: &Pipeline) -> Vec<Problem> {
    problems(
        Some(p.query.output_mode),
        p.watermark.as_ref().map(Some),
        p.aggregate.as_ref().map(Some),
        p.deduplicate.as_ref().map(Some),
    )
}

fn problems(
    mode: Option<OutputMode>,
    watermark: Table<'_, WatermarkSpec>,
    aggregate: Table<'_, AggregateSpec>,
    deduplicate: Table<'_, DeduplicateSpec>,
) -> Vec<Problem> {
    let mut out = Vec::new();
    let Some(mode) = mode else {
        return out;
    };
    let no_watermark = watermark.is_none();
    let watermark = watermark.flatten();
    match (aggregate, deduplicate) {
        (Some(Some(a)), _) => {
            let session = matches!(
                a.window,
                Some(WindowSpec {
                    kind: WindowKind::Session { .. },
                    ..
                })
            );
            if mode == OutputMode::Append && no_watermark {
                let hint = a
                    .window
                    .as_ref()
                    .map(|w| format!(" ({:?})", w.column))
                    .unwrap_or_default();
                out.push(Problem::new(
                    "query.output_mode",
                    format!(
                        "\"append\" needs a [watermark]: an aggregate is emitted once, when the \
                         watermark passes its window's end, and without a watermark that never \
                         happens. Add a [watermark] on the event-time column{hint}, or use \
                         output_mode = \"update\" or \"complete\""
                    ),
                ));
            }
            if let (OutputMode::Append, Some(w), None) = (mode, watermark, &a.window)
                && !a.group_by.iter().any(|k| k.eq_ignore_ascii_case(&w.column))
            {
                out.push(Problem::new(
                    "query.output_mode",
                    format!(
                        "\"append\" needs the watermark column {:?} to be the window column or a \
                         group_by key: otherwise no group is ever complete and nothing would be \
                         emitted. Window on {:?}, add it to group_by, or use output_mode = \
                         \"update\" or \"complete\"",
                        w.column, w.column
                    ),
                ));
            }
            if session && mode == OutputMode::Update {
                out.push(Problem::new(
                    "aggregate.window.gap",
                    "session windows do not support output_mode = \"update\" (as in Spark: a \
                     session's bounds change as it merges, so there is no stable row to update); \
                     use \"append\" or \"complete\"",
                ));
            }
            if session {
                for (i, text) in a.select.iter().enumerate() {
                    let distinct = parse_agg_expr(text)
                        .is_ok_and(|expr| expr.function == AggFunction::CountDistinct);
                    if distinct {
                        let refused = AggregateError::DistinctWithSession { expr: text.clone() };
                        out.push(Problem::new(
                            format!("aggregate.select[{i}]"),
                            refused.to_string(),
                        ));
                    }
                }
            }
            if session && a.group_by.is_empty() {
                out.push(Problem::new(
                    "aggregate.group_by",
                    "session windows need at least one group_by key (Spark refuses a global \
                     aggregation over session windows); add the column that identifies a \
                     session's owner, e.g. a user id",
                ));
            }
        }
        (_, Some(Some(d))) => {
            if mode == OutputMode::Complete {
                out.push(Problem::new(
                    "query.output_mode",
                    "\"complete\" needs an [aggregate]: deduplication emits each row once and \
                     keeps no result to repeat; use \"append\" or \"update\"",
                ));
            }
            if d.within_watermark && no_watermark {
                out.push(Problem::new(
                    "deduplicate.within_watermark",
                    "dropDuplicatesWithinWatermark needs a [watermark]: a key expires at its \
                     event time + the watermark delay; add a [watermark] or set \
                     within_watermark = false",
                ));
            }
        }
        (None, None) if mode == OutputMode::Complete => out.push(Problem::new(
            "query.output_mode",
            "\"complete\" is only for queries with an [aggregate]: use \"append\"",
        )),
        _ => {}
    }
    out
}

/// Warnings about a valid pipeline whose state can only grow (DESIGN.md
/// §3.2, RESULTS.md §5.8): each sentence says why and what to do.
pub fn stateful_warnings(p: &Pipeline) -> Vec<String> {
    let mut out = Vec::new();
    if p.aggregate.is_some() {
        if p.query.output_mode == OutputMode::Complete {
            out.push(
                "output_mode = \"complete\" keeps every group of the aggregation for ever, \
                 watermark or not: its state grows without bound; use \"append\" or \"update\" \
                 with a [watermark] so that old windows can be evicted"
                    .to_owned(),
            );
        } else if p.watermark.is_none() {
            out.push(
                "the aggregation has no [watermark]: its state grows without bound; declare one \
                 so that old windows can be evicted"
                    .to_owned(),
            );
        }
    }
    if let Some(d) = &p.deduplicate {
        let event_time_is_key = p
            .watermark
            .as_ref()
            .is_some_and(|w| d.keys.iter().any(|k| k.eq_ignore_ascii_case(&w.column)));
        if !event_time_is_key && !d.within_watermark {
            out.push(
                "the deduplication keys do not include the watermarked event-time column: its \
                 state grows without bound; add the event-time column to the keys (with a \
                 [watermark]) or set within_watermark = true"
                    .to_owned(),
            );
        }
    }
    out
}
