//! Splitting one CSV line into fields (RFC 4180 quoting) and writing them into the columns by
//! position.
//!
//! Hand-rolled rather than arrow-csv for the same reason as the JSON scanner: Spark's
//! malformed-record semantics need to know which line and which field failed, and every field
//! goes through the same text conversions as a JSON string.
//!
//! Limits of this version: a quoted field may not contain a line break (the input is split into
//! lines first), and a whitespace-only line is skipped like a blank one.

use super::cells::{self, Kind, Slot};
use super::{CsvOptions, FieldSpec, RowState};

/// The position of one field in the line.
#[derive(Debug, Clone, Copy)]
pub(super) struct CsvCell {
    /// Contents, without the surrounding quotes of a quoted field.
    start: usize,
    end: usize,
    quoted: bool,
    /// A quoted field containing `""` (needs unescaping).
    doubled: bool,
}

/// Splits `line` into `cells`. `Err` describes a quoting error.
fn split(line: &[u8], opts: &CsvOptions, cells: &mut Vec<CsvCell>) -> Result<(), String> {
    cells.clear();
    let (delim, quote) = (opts.delimiter, opts.quote);
    let mut i = 0;
    loop {
        if line.get(i) == Some(&quote) {
            let start = i + 1;
            let mut j = start;
            let mut doubled = false;
            let end = loop {
                match line[j..].iter().position(|&b| b == quote) {
                    None => {
                        return Err(format!(
                            "unterminated quoted field starting at column {} \
                             (quoted line breaks are not supported)",
                            i + 1
                        ));
                    }
                    Some(k) => {
                        j += k;
                        if line.get(j + 1) == Some(&quote) {
                            doubled = true;
                            j += 2;
                        } else {
                            break j;
                        }
                    }
                }
            };
            cells.push(CsvCell {
                start,
                end,
                quoted: true,
                doubled,
            });
            i = end + 1;
            match line.get(i) {
                None => return Ok(()),
                Some(&b) if b == delim => i += 1,
                Some(_) => {
                    return Err(format!(
                        "unexpected character after the closing quote at column {}",
                        i + 1
                    ));
                }
            }
        } else {
            let end = line[i..]
                .iter()
                .position(|&b| b == delim)
                .map_or(line.len(), |k| i + k);
            cells.push(CsvCell {
                start: i,
                end,
                quoted: false,
                doubled: false,
            });
            if end == line.len() {
                return Ok(());
            }
            i = end + 1;
        }
    }
}

/// Parses one line into the current row of `row.out`. `Err` is a line-level error (quoting,
/// field count); conversion failures of single fields are recorded in `row`.
pub(super) fn parse_line(
    fields: &[FieldSpec],
    row: &mut RowState,
    line: &[u8],
    utf8_ok: bool,
    opts: &CsvOptions,
) -> Result<(), String> {
    let mut cells = std::mem::take(&mut row.cells);
    let result = split(line, opts, &mut cells).and_then(|()| {
        if cells.len() != fields.len() {
            return Err(format!(
                "expected {} fields, found {}",
                fields.len(),
                cells.len()
            ));
        }
        for (f, (spec, cell)) in fields.iter().zip(&cells).enumerate() {
            stage(spec, f, *cell, line, row, utf8_ok, opts.quote);
        }
        Ok(())
    });
    row.cells = cells;
    result
}

fn stage(
    spec: &FieldSpec,
    f: usize,
    cell: CsvCell,
    line: &[u8],
    row: &mut RowState,
    utf8_ok: bool,
    quote: u8,
) {
    let empty = cell.start == cell.end;
    if empty && (!cell.quoted || spec.kind != Kind::Utf8) {
        row.out.put(f, Slot::Null);
        return;
    }
    let text = if cell.doubled {
        let start = row.scratch.len();
        let raw = &line[cell.start..cell.end];
        let mut k = 0;
        while k < raw.len() {
            row.scratch.push(raw[k]);
            k += if raw[k] == quote { 2 } else { 1 };
        }
        &row.scratch[start..]
    } else {
        &line[cell.start..cell.end]
    };
    if spec.kind == Kind::Utf8 {
        if utf8_ok || std::str::from_utf8(text).is_ok() {
            row.out.put_str(f, text);
        } else {
            row.out.put(f, Slot::Null);
            row.field_error(spec, format_args!("invalid UTF-8"));
        }
        return;
    }
    match cells::convert_text(&spec.kind, text, false, &mut row.dates) {
        Some(slot) => row.out.put(f, slot),
        None => {
            row.out.put(f, Slot::Null);
            let shown = &line[cell.start..cell.end];
            row.cannot_parse(spec, shown, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(line: &str, opts: &CsvOptions) -> Result<Vec<(String, bool)>, String> {
        let mut cells = Vec::new();
        split(line.as_bytes(), opts, &mut cells)?;
        Ok(cells
            .iter()
            .map(|c| (line[c.start..c.end].to_string(), c.quoted))
            .collect())
    }

    #[test]
    fn splits_rfc4180() {
        let o = CsvOptions::default();
        let f = |s: &str| fields_of(s, &o);
        assert_eq!(
            f(r#"a,"b,c","d""e",,"""#).unwrap(),
            vec![
                ("a".into(), false),
                ("b,c".into(), true),
                (r#"d""e"#.into(), true),
                (String::new(), false),
                (String::new(), true),
            ]
        );
        assert_eq!(f("a,").unwrap().len(), 2);
        assert_eq!(f("x\"y").unwrap(), vec![("x\"y".into(), false)]);
        assert!(f(r#""abc"#).unwrap_err().contains("unterminated"));
        assert!(
            f(r#""a"b,c"#)
                .unwrap_err()
                .contains("after the closing quote")
        );
        let semi = CsvOptions {
            header: false,
            delimiter: b';',
            quote: b'\'',
        };
        assert_eq!(
            fields_of("'a;b';c", &semi).unwrap(),
            vec![("a;b".into(), true), ("c".into(), false)]
        );
    }
}
