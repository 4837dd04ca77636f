//! The console sink's writer: each micro-batch as a table, the way Spark's console sink prints it.
//!
//! Why it exists: the console sink is how people first try a pipeline and debug one, so its output
//! should look like what they know from Spark (a `Batch: N` banner, a table, `only showing top N
//! rows`). It writes to any `Write` so that tests and the CLI choose where it goes; library code
//! never prints on its own.

use std::fmt;
use std::io::Write;

use arrow_array::RecordBatch;

use super::files::SinkFileError;

const RULE: &str = "-------------------------------------------";

/// Prints micro-batches as tables to `out`.
pub struct ConsoleWriter<W: Write> {
    out: W,
    max_rows: usize,
}

impl<W: Write> fmt::Debug for ConsoleWriter<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConsoleWriter")
            .field("max_rows", &self.max_rows)
            .finish_non_exhaustive()
    }
}

impl<W: Write> ConsoleWriter<W> {
    /// A writer that shows at most `max_rows` rows of each batch (Spark's `numRows`, default 20).
    pub fn new(out: W, max_rows: usize) -> Self {
        Self { out, max_rows }
    }

    /// The output, e.g. to inspect what a test printed.
    pub fn get_ref(&self) -> &W {
        &self.out
    }

    /// Gives back the output.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Prints micro-batch `batch_id`: the banner, a table of its first `max_rows` rows, a
    /// truncation note when it has more, and a blank line. Returns the number of rows in the batch
    /// (all of them, not only those shown). The output is flushed.
    ///
    /// # Errors
    ///
    /// [`SinkFileError::ConsoleFormat`] when a value cannot be rendered, [`SinkFileError::Console`]
    /// when the output cannot be written.
    pub fn write_batch(
        &mut self,
        batch_id: u64,
        batches: &[RecordBatch],
    ) -> Result<usize, SinkFileError> {
        let total: usize = batches.iter().map(RecordBatch::num_rows).sum();
        let mut shown = Vec::with_capacity(batches.len());
        let mut remaining = self.max_rows;
        for batch in batches {
            let take = remaining.min(batch.num_rows());
            // Keep one (possibly empty) batch so the table still shows the column names.
            if take > 0 || shown.is_empty() {
                shown.push(batch.slice(0, take));
            }
            remaining -= take;
        }
        let table = arrow_cast::pretty::pretty_format_batches(&shown)
            .map_err(|source| SinkFileError::ConsoleFormat { batch_id, source })?;
        let mut text = format!("{RULE}\nBatch: {batch_id}\n{RULE}\n{table}\n");
        if total > self.max_rows {
            let noun = if self.max_rows == 1 { "row" } else { "rows" };
            text.push_str(&format!("only showing top {} {noun}\n", self.max_rows));
        }
        text.push('\n');
        self.out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
            .map_err(|source| SinkFileError::Console { batch_id, source })?;
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use std::sync::Arc;

    fn batch(ids: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("word", DataType::Utf8, true),
        ]));
        let words: Vec<Option<String>> = ids
            .iter()
            .map(|i| {
                if i % 2 == 0 {
                    Some(format!("w{i}"))
                } else {
                    None
                }
            })
            .collect();
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(ids.to_vec())),
                Arc::new(StringArray::from(words)),
            ],
        )
        .unwrap()
    }

    fn printed(max_rows: usize, batch_id: u64, batches: &[RecordBatch]) -> (usize, String) {
        let mut writer = ConsoleWriter::new(Vec::new(), max_rows);
        let rows = writer.write_batch(batch_id, batches).unwrap();
        (rows, String::from_utf8(writer.into_inner()).unwrap())
    }

    #[test]
    fn prints_banner_and_table() {
        let (rows, text) = printed(20, 0, &[batch(&[1, 2]), batch(&[10])]);
        assert_eq!(rows, 3);
        let expected = "\
-------------------------------------------
Batch: 0
-------------------------------------------
+----+------+
| id | word |
+----+------+
| 1  |      |
| 2  | w2   |
| 10 | w10  |
+----+------+

";
        assert_eq!(text, expected);
    }

    #[test]
    fn truncates_to_max_rows() {
        let (rows, text) = printed(2, 5, &[batch(&[1]), batch(&[2, 3, 4])]);
        assert_eq!(rows, 4);
        let expected = "\
-------------------------------------------
Batch: 5
-------------------------------------------
+----+------+
| id | word |
+----+------+
| 1  |      |
| 2  | w2   |
+----+------+
only showing top 2 rows

";
        assert_eq!(text, expected);
        let (_, text) = printed(1, 6, &[batch(&[1, 2])]);
        assert!(
            text.ends_with("+----+------+\nonly showing top 1 row\n\n"),
            "{text}"
        );
    }

    #[test]
    fn empty_batch_shows_the_columns() {
        let (rows, text) = printed(20, 3, &[batch(&[])]);
        assert_eq!(rows, 0);
        assert_eq!(
            text,
            format!(
                "{RULE}\nBatch: 3\n{RULE}\n+----+------+\n| id | word |\n+----+------+\n+----+------+\n\n"
            )
        );
    }

    #[test]
    fn write_errors_name_the_batch() {
        struct Broken;
        impl Write for Broken {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::Error::new(
                    std::io::ErrorKind::BrokenPipe,
                    "pipe closed",
                ))
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let err = ConsoleWriter::new(Broken, 20)
            .write_batch(4, &[batch(&[1])])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "console sink, batch 4: cannot write the output: pipe closed"
        );
    }
}
