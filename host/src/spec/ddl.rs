//! Spark DDL schema strings ("order_id BIGINT, amount DECIMAL(12,2), ...") to Arrow schemas.
//!
//! Users coming from Spark already write schemas this way (`StructType.fromDDL`), and a one-line
//! string fits a TOML key far better than a table per column. Only the types the decoders support
//! are accepted, so an unsupported type fails at load time, naming the column, not mid-stream.

use arrow_schema::{DataType, Field, Schema, TimeUnit};

/// The types accepted, as listed in error messages.
const KNOWN_TYPES: &str =
    "BIGINT (LONG), INT (INTEGER), DOUBLE, DECIMAL(p,s), STRING, BOOLEAN, TIMESTAMP, DATE";

/// Largest precision of a `Decimal128`.
const MAX_DECIMAL_PRECISION: u8 = 38;

#[derive(Debug, Clone, PartialEq)]
enum TokenKind {
    /// A bare word: letters, digits and `_`.
    Word(String),
    /// A `backquoted` name (with `` `` `` standing for one backquote).
    Quoted(String),
    Punct(char),
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokenKind,
    /// 1-based character position in the DDL string.
    pos: usize,
}

impl Token {
    fn describe(&self) -> String {
        match &self.kind {
            TokenKind::Word(w) => format!("{w:?}"),
            TokenKind::Quoted(q) => format!("`{q}`"),
            TokenKind::Punct(c) => format!("'{c}'"),
        }
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(&self.kind, TokenKind::Word(w) if w.eq_ignore_ascii_case(word))
    }

    fn is_punct(&self, c: char) -> bool {
        self.kind == TokenKind::Punct(c)
    }
}

fn tokenize(ddl: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut chars = ddl.chars().enumerate().peekable();
    while let Some((index, c)) = chars.next() {
        let pos = index + 1;
        if c.is_whitespace() {
            continue;
        }
        if c.is_ascii_alphanumeric() || c == '_' {
            let mut word = String::from(c);
            while let Some(&(_, next)) = chars.peek() {
                if next.is_ascii_alphanumeric() || next == '_' {
                    word.push(next);
                    chars.next();
                } else {
                    break;
                }
            }
            tokens.push(Token {
                kind: TokenKind::Word(word),
                pos,
            });
        } else if c == '`' {
            let mut name = String::new();
            loop {
                match chars.next() {
                    Some((_, '`')) => {
                        if matches!(chars.peek(), Some((_, '`'))) {
                            name.push('`');
                            chars.next();
                        } else {
                            break;
                        }
                    }
                    Some((_, other)) => name.push(other),
                    None => {
                        return Err(format!(
                            "the backquoted name starting at character {pos} is not closed"
                        ));
                    }
                }
            }
            tokens.push(Token {
                kind: TokenKind::Quoted(name),
                pos,
            });
        } else if matches!(c, '(' | ')' | ',' | ':' | '<' | '>') {
            tokens.push(Token {
                kind: TokenKind::Punct(c),
                pos,
            });
        } else {
            return Err(format!("unexpected character '{c}' at character {pos}"));
        }
    }
    Ok(tokens)
}

/// Parses a Spark DDL schema: `name TYPE [NOT NULL], ...`.
///
/// Types (case-insensitive): BIGINT/LONG → Int64, INT/INTEGER → Int32, DOUBLE → Float64,
/// DECIMAL(p,s) → Decimal128 (DECIMAL alone is DECIMAL(10,0), DECIMAL(p) is DECIMAL(p,0)),
/// STRING → Utf8, BOOLEAN → Boolean, TIMESTAMP → Timestamp(µs, UTC), DATE → Date32.
/// Columns are nullable unless `NOT NULL` follows the type. Names may be `backquoted`; a colon
/// between name and type is accepted as in Spark.
///
/// # Errors
/// A message naming the column (number and name) and the character position of the problem:
/// unknown type, bad DECIMAL precision or scale, missing type, stray tokens, duplicate names
/// (compared case-insensitively, as Spark does), empty schema.
pub fn parse_schema(ddl: &str) -> Result<Schema, String> {
    let tokens = tokenize(ddl)?;
    if tokens.is_empty() {
        return Err("the schema is empty: write columns as \"name TYPE, ...\"".to_string());
    }
    let mut fields: Vec<Field> = Vec::new();
    let mut at = 0;
    loop {
        let number = fields.len() + 1;
        let field = parse_column(&tokens, &mut at, number)?;
        if let Some((earlier, other)) = fields
            .iter()
            .enumerate()
            .find(|(_, f)| f.name().eq_ignore_ascii_case(field.name()))
        {
            return Err(format!(
                "column {number} ({:?}): duplicate column name (column {} is {:?}; names are compared case-insensitively)",
                field.name(),
                earlier + 1,
                other.name()
            ));
        }
        fields.push(field);
        match tokens.get(at) {
            None => break,
            Some(t) if t.is_punct(',') => {
                at += 1;
                if at == tokens.len() {
                    return Err(format!(
                        "expected a column after the ',' at character {}",
                        t.pos
                    ));
                }
            }
            Some(t) => {
                let field = &fields[fields.len() - 1];
                return Err(format!(
                    "column {number} ({:?}): unexpected {} at character {}; expected ',' or NOT NULL after the type",
                    field.name(),
                    t.describe(),
                    t.pos
                ));
            }
        }
    }
    Ok(Schema::new(fields))
}

fn parse_column(tokens: &[Token], at: &mut usize, number: usize) -> Result<Field, String> {
    let name_token = &tokens[*at];
    let name = match &name_token.kind {
        TokenKind::Word(w) => w.clone(),
        TokenKind::Quoted(q) if !q.is_empty() => q.clone(),
        TokenKind::Quoted(_) => {
            return Err(format!(
                "column {number}: the name at character {} is empty",
                name_token.pos
            ));
        }
        TokenKind::Punct(_) => {
            return Err(format!(
                "column {number}: expected a column name at character {}, found {}",
                name_token.pos,
                name_token.describe()
            ));
        }
    };
    *at += 1;
    let here = |message: String| format!("column {number} ({name:?}): {message}");
    if tokens.get(*at).is_some_and(|t| t.is_punct(':')) {
        *at += 1;
    }
    let type_token = match tokens.get(*at) {
        Some(t) => t,
        None => return Err(here("missing type after the name".to_string())),
    };
    let TokenKind::Word(type_name) = &type_token.kind else {
        return Err(here(format!(
            "expected a type at character {}, found {}; known types: {KNOWN_TYPES}",
            type_token.pos,
            type_token.describe()
        )));
    };
    *at += 1;
    let upper = type_name.to_ascii_uppercase();
    let params = parse_params(tokens, at).map_err(&here)?;
    let data_type = match upper.as_str() {
        "BIGINT" | "LONG" => DataType::Int64,
        "INT" | "INTEGER" => DataType::Int32,
        "DOUBLE" => DataType::Float64,
        "STRING" => DataType::Utf8,
        "BOOLEAN" => DataType::Boolean,
        "TIMESTAMP" => DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
        "DATE" => DataType::Date32,
        "DECIMAL" => decimal_type(&params, type_token.pos).map_err(&here)?,
        _ => {
            return Err(here(format!(
                "unknown type {type_name} at character {}; known types: {KNOWN_TYPES}",
                type_token.pos
            )));
        }
    };
    if upper != "DECIMAL" && params.is_some() {
        return Err(here(format!(
            "type {type_name} at character {} takes no parameters",
            type_token.pos
        )));
    }
    let mut nullable = true;
    if let Some(t) = tokens.get(*at).filter(|t| t.is_word("NOT")) {
        match tokens.get(*at + 1) {
            Some(n) if n.is_word("NULL") => {
                nullable = false;
                *at += 2;
            }
            _ => {
                return Err(here(format!(
                    "NOT at character {} must be followed by NULL",
                    t.pos
                )));
            }
        }
    }
    Ok(Field::new(name, data_type, nullable))
}

/// Reads `(n)` or `(n, m)` after a type, if present: the numbers and their positions.
fn parse_params(tokens: &[Token], at: &mut usize) -> Result<Option<Vec<(u64, usize)>>, String> {
    let Some(open) = tokens.get(*at).filter(|t| t.is_punct('(')) else {
        return Ok(None);
    };
    *at += 1;
    let mut numbers = Vec::new();
    loop {
        let Some(t) = tokens.get(*at) else {
            return Err(format!("the '(' at character {} is not closed", open.pos));
        };
        let TokenKind::Word(w) = &t.kind else {
            return Err(format!(
                "expected a number at character {}, found {}",
                t.pos,
                t.describe()
            ));
        };
        let n: u64 = w
            .parse()
            .map_err(|_| format!("expected a number at character {}, found {w:?}", t.pos))?;
        numbers.push((n, t.pos));
        *at += 1;
        match tokens.get(*at) {
            Some(t) if t.is_punct(',') => *at += 1,
            Some(t) if t.is_punct(')') => {
                *at += 1;
                return Ok(Some(numbers));
            }
            Some(t) => {
                return Err(format!(
                    "expected ',' or ')' at character {}, found {}",
                    t.pos,
                    t.describe()
                ));
            }
            None => {
                return Err(format!("the '(' at character {} is not closed", open.pos));
            }
        }
    }
}

fn decimal_type(params: &Option<Vec<(u64, usize)>>, pos: usize) -> Result<DataType, String> {
    let (precision, scale) = match params.as_deref() {
        None => (10, 0),
        Some([(p, _)]) => (*p, 0),
        Some([(p, _), (s, _)]) => (*p, *s),
        Some(_) => {
            return Err(format!(
                "DECIMAL at character {pos} takes (precision) or (precision, scale)"
            ));
        }
    };
    let precision = u8::try_from(precision)
        .ok()
        .filter(|p| (1..=MAX_DECIMAL_PRECISION).contains(p))
        .ok_or_else(|| {
            format!(
                "DECIMAL precision {precision} at character {pos} is out of range: use 1 to {MAX_DECIMAL_PRECISION}"
            )
        })?;
    let scale = i8::try_from(scale)
        .ok()
        .filter(|s| u8::try_from(*s).is_ok_and(|s| s <= precision))
        .ok_or_else(|| {
            format!(
                "DECIMAL scale {scale} at character {pos} is out of range: use 0 to the precision ({precision})"
            )
        })?;
    Ok(DataType::Decimal128(precision, scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(schema: &Schema, i: usize) -> (&str, &DataType, bool) {
        let f = schema.field(i);
        (f.name().as_str(), f.data_type(), f.is_nullable())
    }

    #[test]
    fn parses_the_example_schema() {
        let schema = parse_schema(
            "order_id BIGINT, customer_id BIGINT, status STRING, amount DECIMAL(12,2), occurred_at TIMESTAMP, session_id STRING",
        )
        .unwrap();
        assert_eq!(schema.fields().len(), 6);
        assert_eq!(field(&schema, 0), ("order_id", &DataType::Int64, true));
        assert_eq!(field(&schema, 2), ("status", &DataType::Utf8, true));
        assert_eq!(
            field(&schema, 3),
            ("amount", &DataType::Decimal128(12, 2), true)
        );
        assert_eq!(
            field(&schema, 4),
            (
                "occurred_at",
                &DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                true
            )
        );
    }

    #[test]
    fn maps_every_type_case_insensitively() {
        let schema = parse_schema(
            "a bigint, b Long, c INT, d integer, e DOUBLE, f decimal, g DECIMAL(5), h Decimal( 38 , 38 ), \
             i string, j BOOLEAN, k timestamp, l DATE",
        )
        .unwrap();
        let types: Vec<DataType> = schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(
            types,
            vec![
                DataType::Int64,
                DataType::Int64,
                DataType::Int32,
                DataType::Int32,
                DataType::Float64,
                DataType::Decimal128(10, 0),
                DataType::Decimal128(5, 0),
                DataType::Decimal128(38, 38),
                DataType::Utf8,
                DataType::Boolean,
                DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
                DataType::Date32,
            ]
        );
    }

    #[test]
    fn not_null_backquotes_and_colons() {
        let schema =
            parse_schema("id BIGINT NOT NULL, `odd name` string not null, `a``b`: INT, x DATE")
                .unwrap();
        assert_eq!(field(&schema, 0), ("id", &DataType::Int64, false));
        assert_eq!(field(&schema, 1), ("odd name", &DataType::Utf8, false));
        assert_eq!(field(&schema, 2), ("a`b", &DataType::Int32, true));
        assert_eq!(field(&schema, 3), ("x", &DataType::Date32, true));
    }

    #[test]
    fn errors_name_the_column_and_position() {
        let cases = [
            (
                "a BIGINT, b FLOAT8",
                "column 2 (\"b\"): unknown type FLOAT8 at character 13; known types: BIGINT (LONG), INT (INTEGER), DOUBLE, DECIMAL(p,s), STRING, BOOLEAN, TIMESTAMP, DATE",
            ),
            (
                "a DECIMAL(40,2)",
                "column 1 (\"a\"): DECIMAL precision 40 at character 3 is out of range: use 1 to 38",
            ),
            (
                "a DECIMAL(0)",
                "column 1 (\"a\"): DECIMAL precision 0 at character 3 is out of range: use 1 to 38",
            ),
            (
                "a DECIMAL(5,6)",
                "column 1 (\"a\"): DECIMAL scale 6 at character 3 is out of range: use 0 to the precision (5)",
            ),
            (
                "a INT, A STRING",
                "column 2 (\"A\"): duplicate column name (column 1 is \"a\"; names are compared case-insensitively)",
            ),
            ("a INT, b", "column 2 (\"b\"): missing type after the name"),
            ("a INT,", "expected a column after the ',' at character 6"),
            (
                "a INT b STRING",
                "column 1 (\"a\"): unexpected \"b\" at character 7; expected ',' or NOT NULL after the type",
            ),
            (
                "a INT NOT",
                "column 1 (\"a\"): NOT at character 7 must be followed by NULL",
            ),
            (
                "a INT(3)",
                "column 1 (\"a\"): type INT at character 3 takes no parameters",
            ),
            (
                "a DECIMAL(12,2",
                "column 1 (\"a\"): the '(' at character 10 is not closed",
            ),
            (
                ", a INT",
                "column 1: expected a column name at character 1, found ','",
            ),
            ("a INT; b INT", "unexpected character ';' at character 6"),
            (
                "`a INT",
                "the backquoted name starting at character 1 is not closed",
            ),
            (
                "   ",
                "the schema is empty: write columns as \"name TYPE, ...\"",
            ),
        ];
        for (ddl, expected) in cases {
            assert_eq!(parse_schema(ddl).unwrap_err(), expected, "for {ddl:?}");
        }
        let err = parse_schema("tags ARRAY<STRING>").unwrap_err();
        assert!(
            err.starts_with("column 1 (\"tags\"): unknown type ARRAY"),
            "{err}"
        );
    }
}
