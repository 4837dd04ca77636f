//! `count_char(s STRING, c STRING) -> INT`: how many times the character `c` occurs in `s`, the
//! user-defined function of Nexmark q14 (`SELECT count_char(url, '/') ...`), as a scalar function
//! for a pipeline's SQL. The host calls it once per batch with both arguments as columns (the
//! constant `'/'` as a column of one repeated value), never once per row.
//!
//! Declared in the pipeline file as
//!
//! ```toml
//! [[function]]
//! name = "count_char"
//! plugin = "plugins/count_char.wasm"
//! arguments = ["STRING", "STRING"]
//! returns = "INT"
//! ```
//!
//! Semantics: characters are Unicode scalar values, and only the first character of `c` counts
//! (`count_char('a/b', '/x')` is 1); an empty `c` occurs nowhere (0). A NULL in either argument
//! gives NULL. The plugin takes no `config`, and refuses at `open` any declared function other
//! than `count_char(STRING, STRING) -> INT`, naming it.

use serde::Deserialize;
use weir_plugin_sdk::{
    Batch, BatchInfo, Column, DataType, PluginError, ScalarFunctions, Signature,
};

/// The function's name in SQL.
pub const NAME: &str = "count_char";

/// The plugin's `config`: it takes none (an empty table, or no `config` at all).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {}

/// The plugin: `count_char`, and nothing else.
#[derive(Debug)]
pub struct CountChar;

impl ScalarFunctions for CountChar {
    type Config = Config;

    fn new(_config: Config, functions: &[Signature]) -> Result<Self, PluginError> {
        for f in functions {
            f.expect(NAME, &[DataType::Utf8, DataType::Utf8], DataType::Int32)?;
        }
        Ok(Self)
    }

    fn call(
        &mut self,
        name: &str,
        args: &Batch<'_>,
        _info: &BatchInfo,
    ) -> Result<Column, PluginError> {
        if name != NAME {
            return Err(PluginError::fatal(format!(
                "count_char: called as `{name}`, a function this plugin does not implement"
            )));
        }
        let width = args.schema().len();
        if width != 2 {
            return Err(PluginError::invalid_input(format!(
                "count_char takes 2 arguments, the call has {width}"
            )));
        }
        let s = args.column_at(0)?;
        let c = args.column_at(1)?;
        for (i, column) in [&s, &c].into_iter().enumerate() {
            if column.data_type != DataType::Utf8 {
                return Err(PluginError::invalid_input(format!(
                    "count_char: argument {} is {}, not utf8",
                    i + 1,
                    column.data_type
                )));
            }
        }
        Ok(count_char(&s, &c, args.num_rows()))
    }
}

/// `count_char` on `rows` rows of two utf8 columns: an int32 column, null where either argument
/// is null.
pub fn count_char(s: &Column, c: &Column, rows: usize) -> Column {
    let mut counts = Vec::with_capacity(rows);
    for i in 0..rows {
        let n = match (s.bytes(i), c.str(i)) {
            (Some(haystack), Some(needle)) => needle
                .chars()
                .next()
                .map_or(0, |ch| occurrences(haystack, ch)),
            // A null row: its slot holds 0, the validity says null.
            _ => 0,
        };
        // A string of a batch is shorter than 2 GiB (Arrow's i32 offsets).
        counts.push(i32::try_from(n).unwrap_or(i32::MAX));
    }
    let validity = match (&s.validity, &c.validity) {
        (None, None) => None,
        (Some(v), None) | (None, Some(v)) => Some(v.clone()),
        (Some(a), Some(b)) => Some(a.and(b)),
    };
    Column::int32(NAME, counts, validity)
}

/// How many times `ch` occurs in the UTF-8 bytes `haystack`. UTF-8 is self-synchronising: the
/// encoding of a character never starts inside another character's, so counting its byte
/// pattern counts the character (and an ASCII character is one byte, counted directly).
fn occurrences(haystack: &[u8], ch: char) -> usize {
    if ch.is_ascii() {
        let byte = ch as u8;
        return haystack.iter().filter(|&&b| b == byte).count();
    }
    let mut buf = [0u8; 4];
    let needle = ch.encode_utf8(&mut buf).as_bytes();
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

weir_plugin_sdk::export_scalar_function!(CountChar);

#[cfg(test)]
mod tests {
    use super::*;
    use weir_plugin_sdk::ErrorKind;
    use weir_plugin_sdk::testing::{MemoryBatch, call_function};

    fn declared() -> Vec<Signature> {
        vec![Signature::new(
            NAME,
            vec![DataType::Utf8, DataType::Utf8],
            DataType::Int32,
        )]
    }

    fn run(s: &[Option<&str>], c: &[Option<&str>]) -> Vec<Option<i32>> {
        let args = MemoryBatch::new(vec![
            Column::utf8_from_iter("url", s.iter().copied()),
            Column::utf8_from_iter("c", c.iter().copied()),
        ]);
        let out = call_function::<CountChar>("{}", &declared(), NAME, &args).unwrap();
        (0..out.len()).map(|i| out.i32(i)).collect()
    }

    #[test]
    fn counts_slashes_of_nexmark_urls() {
        let urls = [
            Some("https://www.nexmark.com/bbb/item.htm?query=1"),
            Some("https://www.nexmark.com/a/b/c/d/item.htm?query=1&channel_id=2"),
            Some(""),
            Some("no slash"),
        ];
        assert_eq!(
            run(&urls, &[Some("/"); 4]),
            [Some(4), Some(7), Some(0), Some(0)]
        );
    }

    #[test]
    fn a_null_in_either_argument_is_null() {
        assert_eq!(
            run(
                &[Some("a/b"), None, Some("a/b"), None],
                &[Some("/"), Some("/"), None, None]
            ),
            [Some(1), None, None, None]
        );
    }

    #[test]
    fn counts_characters_not_bytes_and_only_the_first_one() {
        assert_eq!(
            run(
                &[Some("é/é/e"), Some("日本日本"), Some("aaa"), Some("a/b/c")],
                &[Some("é"), Some("日x"), Some(""), Some("/b")]
            ),
            [Some(2), Some(2), Some(0), Some(2)]
        );
        // The continuation bytes of `é` (0xC3 0xA9) never match inside other characters.
        assert_eq!(run(&[Some("éÃ©")], &[Some("é")]), [Some(1)]);
    }

    #[test]
    fn an_empty_batch_gives_an_empty_column() {
        let args = MemoryBatch::new(vec![
            Column::utf8_from_iter("url", [None::<&str>; 0]),
            Column::utf8_from_iter("c", [None::<&str>; 0]),
        ]);
        let out = call_function::<CountChar>("", &declared(), NAME, &args).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn open_refuses_other_functions_naming_them() {
        let args = MemoryBatch::new(vec![
            Column::utf8_from_iter("url", [Some("/")]),
            Column::utf8_from_iter("c", [Some("/")]),
        ]);
        let other = Signature::new(
            "count_chars",
            vec![DataType::Utf8, DataType::Utf8],
            DataType::Int32,
        );
        let mut functions = declared();
        functions.push(other);
        let e = call_function::<CountChar>("{}", &functions, NAME, &args).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(e.message.contains("function `count_chars`"), "{e}");

        let bigint = Signature::new(NAME, vec![DataType::Utf8, DataType::Utf8], DataType::Int64);
        let e = call_function::<CountChar>("{}", &[bigint], NAME, &args).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert_eq!(
            e.message,
            "function `count_char` is declared as count_char(utf8, utf8) -> int64, the plugin \
             implements count_char(utf8, utf8) -> int32"
        );

        let one_argument = Signature::new(NAME, vec![DataType::Utf8], DataType::Int32);
        assert!(CountChar::new(Config {}, &[one_argument]).is_err());
        assert!(CountChar::new(Config {}, &[]).is_ok());

        let e = call_function::<CountChar>(r#"{"x": 1}"#, &declared(), NAME, &args).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidConfig);
        assert!(e.message.contains("unknown field `x`"), "{e}");
    }

    #[test]
    fn a_call_of_another_name_or_shape_fails() {
        let mut plugin = CountChar::new(Config {}, &declared()).unwrap();
        let args = MemoryBatch::new(vec![Column::utf8_from_iter("url", [Some("/")])]);
        let e = plugin
            .call(NAME, &Batch::from_memory(&args), &BatchInfo::new(1))
            .unwrap_err();
        assert_eq!(e.message, "count_char takes 2 arguments, the call has 1");
        let e = plugin
            .call("other", &Batch::from_memory(&args), &BatchInfo::new(1))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Fatal);
    }
}
