//! A scanner for one JSON-lines record: a flat object whose keys are matched to schema fields.
//!
//! A general JSON parser (serde_json, arrow-json) builds values or tapes and cannot tell which
//! field of a line failed to convert, yet Spark's PERMISSIVE semantics need exactly that (only
//! the bad field becomes null). This scanner validates the whole line's grammar (nested values
//! of unknown keys included, so that a broken line is always rejected like Jackson would), and
//! converts each known field's token directly into its column, without allocating.
//!
//! Deliberate differences from Spark/Jackson: non-whitespace after the object makes the line
//! malformed (Jackson ignores it); a top-level array or scalar is malformed (Spark would explode
//! an array of objects); unquoted `NaN`/`Infinity` tokens are refused; a lone UTF-16 surrogate
//! in a `\u` escape becomes U+FFFD; a nested object or array read into a string column keeps its
//! input text verbatim (Spark re-serialises it without whitespace).

use std::fmt;

use super::RowState;
use super::cells::{self, Kind, Slot};
use super::{FieldSpec, load8};

/// Maximum nesting depth of skipped values before the line is called malformed.
const MAX_DEPTH: usize = 128;

/// Bytes that end the fast scan of a string: `"`, `\` and control characters.
static STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// Index of the first `"`, `\\` or control byte at or after `i` (or `s.len()`), eight bytes
/// at a time: strings are most of a line's bytes.
#[inline(always)]
fn string_stop(s: &[u8], mut i: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    const QUOTE: u64 = LO * b'"' as u64;
    const BACKSLASH: u64 = LO * b'\\' as u64;
    while i + 8 <= s.len() {
        let w = load8(s, i);
        let q = w ^ QUOTE;
        let b = w ^ BACKSLASH;
        // Per mask, the lowest flagged byte is a true match (borrows only flag bytes above
        // one), so the lowest flagged byte of the union is the first stop byte.
        let m = ((q.wrapping_sub(LO) & !q)
            | (b.wrapping_sub(LO) & !b)
            | (w.wrapping_sub(LO * 0x20) & !w))
            & HI;
        if m != 0 {
            return i + (m.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < s.len() && !STRING_STOP[s[i] as usize] {
        i += 1;
    }
    i
}

/// The end of the run of ASCII digits at `i`, with `m` extended by them (wrapping: the
/// caller counts the digits and trusts `m` only up to 19 of them). Eight bytes at a time:
/// a digit loop was a tenth of the scanner's time on the orders' ids and amounts.
#[inline(always)]
fn digit_run(s: &[u8], mut i: usize, m: &mut u64) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    while i + 8 <= s.len() {
        // Byte by byte `b - '0'`, a digit when below 10. Borrows and carries only move
        // upwards, from a non-digit byte, so the bytes before the first non-digit are exact.
        let d = load8(s, i).wrapping_sub(LO * u64::from(b'0'));
        let stops = (d.wrapping_add(LO * 0x76) | d) & HI;
        let n = (stops.trailing_zeros() / 8) as usize;
        if n > 0 {
            // The `n` digits in the top bytes, first digit highest, zeros below: an
            // eight-digit number with leading zeros, folded in pairs, quads, then halves.
            let v = d << (8 * (8 - n));
            let v = (v & 0x0f0f_0f0f_0f0f_0f0f).wrapping_mul((10 << 8) + 1) >> 8;
            let v = (v & 0x00ff_00ff_00ff_00ff).wrapping_mul((100 << 16) + 1) >> 16;
            let v = (v & 0x0000_ffff_0000_ffff).wrapping_mul((10_000 << 32) + 1) >> 32;
            *m = m.wrapping_mul(cells::POW10_U64[n]).wrapping_add(v);
            i += n;
        }
        if n < 8 {
            return i;
        }
    }
    while let Some(&b @ b'0'..=b'9') = s.get(i) {
        *m = m.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
        i += 1;
    }
    i
}

/// Byte equality for short keys without a `memcmp` call.
#[inline(always)]
fn key_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n >= 8 {
        let mut i = 0;
        while i + 8 < n {
            if load8(a, i) != load8(b, i) {
                return false;
            }
            i += 8;
        }
        return load8(a, n - 8) == load8(b, n - 8);
    }
    let mut i = 0;
    while i < n {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    /// A string; the range is its contents between the quotes.
    Str {
        escaped: bool,
    },
    Num {
        integer: bool,
    },
    True,
    False,
    Null,
    Nested,
}

#[derive(Debug, Clone, Copy)]
struct Value {
    tok: Tok,
    start: usize,
    end: usize,
    /// A number's digits, read while its grammar is checked.
    digits: Digits,
}

/// The digits of a number without an exponent, as one integer (`Some` when there are at most
/// 19, so that it fits), and how many of them follow the point: the common numbers convert
/// from these without a second pass over their text.
#[derive(Debug, Clone, Copy, Default)]
struct Digits {
    mantissa: Option<u64>,
    frac: usize,
}

/// A syntax error: what was expected and where (`None`: at the end of the line).
#[derive(Debug, Clone, Copy)]
struct Syntax {
    what: &'static str,
    column: Option<usize>,
}

impl fmt::Display for Syntax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.column {
            None => write!(f, "{} at end of line (truncated record?)", self.what),
            Some(c) => write!(f, "{} at column {c}", self.what),
        }
    }
}

struct Scanner<'a> {
    s: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    /// Skips whitespace within a line: a newline ends the record (see [`scan_record`]), and
    /// a line never holds one.
    #[inline(always)]
    fn ws(&mut self) {
        // Compact JSON has none: one comparison says so.
        if self.s.get(self.i).is_none_or(|&b| b > b' ') {
            return;
        }
        while let Some(b' ' | b'\t' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    #[cold]
    fn err(&self, what: &'static str) -> Syntax {
        Syntax {
            what,
            column: (self.i < self.s.len()).then_some(self.i + 1),
        }
    }

    /// Scans a string starting at the opening quote; returns its content range.
    #[inline(always)]
    fn string(&mut self) -> Result<(usize, usize, bool), Syntax> {
        let s = self.s;
        let start = self.i + 1;
        let mut i = start;
        let mut escaped = false;
        loop {
            i = string_stop(s, i);
            match s.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Ok((start, i, escaped));
                }
                Some(b'\\') => {
                    escaped = true;
                    match s.get(i + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                        Some(b'u')
                            if s.len() >= i + 6
                                && s[i + 2..i + 6].iter().all(u8::is_ascii_hexdigit) =>
                        {
                            i += 6
                        }
                        _ => {
                            self.i = i;
                            return Err(self.err("invalid escape in string"));
                        }
                    }
                }
                Some(_) => {
                    self.i = i;
                    return Err(self.err("control character in string"));
                }
                None => {
                    self.i = i;
                    return Err(self.err("unterminated string"));
                }
            }
        }
    }

    /// Scans a number per the JSON grammar; returns whether it is an integer, and its digits.
    #[inline(always)]
    fn number(&mut self) -> Result<(bool, Digits), Syntax> {
        let s = self.s;
        let mut i = self.i;
        if s.get(i) == Some(&b'-') {
            i += 1;
        }
        let first = i;
        // Wraps past 19 digits; `count` tells.
        let mut m: u64 = 0;
        match s.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => i = digit_run(s, i, &mut m),
            _ => {
                self.i = i;
                return Err(self.err("invalid number"));
            }
        }
        let mut integer = true;
        let mut count = i - first;
        let mut frac = 0;
        if s.get(i) == Some(&b'.') {
            integer = false;
            i += 1;
            let from = i;
            i = digit_run(s, i, &mut m);
            if i == from {
                self.i = i;
                return Err(self.err("invalid number"));
            }
            frac = i - from;
            count += frac;
        }
        let mut exact = count <= 19;
        if let Some(b'e' | b'E') = s.get(i) {
            integer = false;
            exact = false;
            i += 1;
            if let Some(b'+' | b'-') = s.get(i) {
                i += 1;
            }
            let from = i;
            while let Some(b'0'..=b'9') = s.get(i) {
                i += 1;
            }
            if i == from {
                self.i = i;
                return Err(self.err("invalid number"));
            }
        }
        self.i = i;
        Ok((
            integer,
            Digits {
                mantissa: exact.then_some(m),
                frac,
            },
        ))
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Syntax> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.err("invalid literal"))
        }
    }

    /// Scans any value.
    #[inline(always)]
    fn value(&mut self, depth: usize) -> Result<Value, Syntax> {
        let start = self.i;
        let tok = match self.peek() {
            Some(b'"') => {
                let (start, end, escaped) = self.string()?;
                return Ok(Value {
                    tok: Tok::Str { escaped },
                    start,
                    end,
                    digits: Digits::default(),
                });
            }
            Some(b'-' | b'0'..=b'9') => {
                let (integer, digits) = self.number()?;
                return Ok(Value {
                    tok: Tok::Num { integer },
                    start,
                    end: self.i,
                    digits,
                });
            }
            Some(b't') => {
                self.literal(b"true")?;
                Tok::True
            }
            Some(b'f') => {
                self.literal(b"false")?;
                Tok::False
            }
            Some(b'n') => {
                self.literal(b"null")?;
                Tok::Null
            }
            Some(b'{' | b'[') => {
                self.nested(depth + 1)?;
                Tok::Nested
            }
            _ => return Err(self.err("expected a value")),
        };
        Ok(Value {
            tok,
            start,
            end: self.i,
            digits: Digits::default(),
        })
    }

    /// Validates and skips a nested object or array starting at its opening bracket.
    #[inline(never)]
    fn nested(&mut self, depth: usize) -> Result<(), Syntax> {
        if depth > MAX_DEPTH {
            return Err(self.err("nesting too deep"));
        }
        let object = self.peek() == Some(b'{');
        let close = if object { b'}' } else { b']' };
        self.i += 1;
        self.ws();
        if self.peek() == Some(close) {
            self.i += 1;
            return Ok(());
        }
        loop {
            if object {
                if self.peek() != Some(b'"') {
                    return Err(self.err("expected a key"));
                }
                self.string()?;
                self.ws();
                if self.peek() != Some(b':') {
                    return Err(self.err("expected ':'"));
                }
                self.i += 1;
                self.ws();
            }
            self.value(depth)?;
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    self.ws();
                }
                Some(c) if c == close => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(self.err("expected ',' or a closing bracket")),
            }
        }
    }
}

/// Appends the unescaped contents of a JSON string (grammar already validated) to `out`.
pub(super) fn unescape(raw: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' {
            let run = raw[i..]
                .iter()
                .position(|&c| c == b'\\')
                .unwrap_or(raw.len() - i);
            out.extend_from_slice(&raw[i..i + run]);
            i += run;
            continue;
        }
        let c = raw.get(i + 1).copied().unwrap_or(b'\\');
        i += 2;
        let simple = match c {
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => 0,
            other => other, // '"', '\\', '/'
        };
        if c != b'u' {
            out.push(simple);
            continue;
        }
        let hi = hex4(raw, i);
        i += 4;
        let code = if (0xD800..0xDC00).contains(&hi)
            && raw.get(i) == Some(&b'\\')
            && raw.get(i + 1) == Some(&b'u')
            && (0xDC00..0xE000).contains(&hex4(raw, i + 2))
        {
            let lo = hex4(raw, i + 2);
            i += 6;
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else {
            hi
        };
        let ch = char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER);
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    }
}

/// Four hex digits at `at` (validated by the scanner; anything else reads as 0).
fn hex4(raw: &[u8], at: usize) -> u32 {
    raw.get(at..at + 4).map_or(0, |h| {
        h.iter().fold(0, |acc, &b| {
            acc * 16 + char::from(b).to_digit(16).unwrap_or(0)
        })
    })
}

/// Parses one line into the current row of `row.out`. `Err` is a syntax error (the whole line
/// is malformed; the row's partial writes are the caller's to discard); conversion failures of
/// single fields are recorded in `row` and parsing goes on.
#[inline(never)]
pub(super) fn parse_line(
    fields: &[FieldSpec],
    row: &mut RowState,
    line: &[u8],
    utf8_ok: bool,
) -> Result<(), String> {
    scan_line(fields, row, line, utf8_ok)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Parses the record at the start of `rest` (the rest of a part, not yet cut into lines) into
/// the current row, as [`parse_line`] would parse its line, and returns where the scan ended:
/// at a newline, or at `rest.len()`. Whitespace never crosses a newline and strings refuse
/// one, so the scan never passes the line's end, and the line's own pass to find its newline
/// is saved. The caller may have cut `rest` short, so only a newline or the end of the whole
/// input at that index ends the line. `rest` is valid UTF-8 (the caller checked its part).
/// `None` on a syntax error: the caller takes the row back and parses the line with
/// [`parse_line`], which reports it.
#[inline]
pub(super) fn scan_record(fields: &[FieldSpec], row: &mut RowState, rest: &[u8]) -> Option<usize> {
    scan_line(fields, row, rest, true).ok()
}

/// Scans one record from the start of `line` up to the end of `line` or its first newline,
/// whichever comes first, and returns that end.
#[inline(always)]
fn scan_line(
    fields: &[FieldSpec],
    row: &mut RowState,
    line: &[u8],
    utf8_ok: bool,
) -> Result<usize, Syntax> {
    let mut p = Scanner { s: line, i: 0 };
    p.ws();
    if p.peek() != Some(b'{') {
        return Err(p.err("not a JSON object: expected '{'"));
    }
    p.i += 1;
    p.ws();
    let mut hint = 0;
    if p.peek() == Some(b'}') {
        p.i += 1;
    } else {
        'fields: loop {
            if p.peek() != Some(b'"') {
                return Err(p.err("expected a key"));
            }
            // Fast path: the key is the expected next field, spelled without escapes.
            let field = match fields.get(hint) {
                Some(next) if next.plain_name && expect_key(line, p.i, next.name.as_bytes()) => {
                    p.i += next.name.len() + 2;
                    Some(hint)
                }
                _ => {
                    let (ks, ke, kesc) = p.string()?;
                    lookup(fields, &line[ks..ke], kesc, hint, &mut row.scratch)
                }
            };
            p.ws();
            if p.peek() != Some(b':') {
                return Err(p.err("expected ':'"));
            }
            p.i += 1;
            p.ws();
            let value = p.value(0)?;
            if let Some(f) = field {
                hint = f + 1;
                stage(&fields[f], f, value, line, row, utf8_ok);
            }
            p.ws();
            // Fields that follow in schema order, written compactly, are taken here: the comma,
            // the key and the colon in one comparison (`lead`), then the value. Anything else
            // after a comma is a key for the general steps above.
            loop {
                match p.peek() {
                    Some(b',') => {
                        if let Some(next) = fields.get(hint)
                            && next.lead.at(line, p.i)
                        {
                            p.i += next.lead.len();
                            p.ws();
                            let value = p.value(0)?;
                            stage(next, hint, value, line, row, utf8_ok);
                            hint += 1;
                            p.ws();
                            continue;
                        }
                        p.i += 1;
                        p.ws();
                        break;
                    }
                    Some(b'}') => {
                        p.i += 1;
                        break 'fields;
                    }
                    _ => return Err(p.err("expected ',' or '}'")),
                }
            }
        }
    }
    p.ws();
    match p.peek() {
        None | Some(b'\n') => Ok(p.i),
        Some(_) => Err(p.err("unexpected characters after the object")),
    }
}

/// Whether `line[at..]` is `"name"` (a quote at `at`, checked by the caller).
#[inline(always)]
fn expect_key(line: &[u8], at: usize, name: &[u8]) -> bool {
    let from = at + 1;
    let to = from + name.len();
    to < line.len() && line[to] == b'"' && key_eq(&line[from..to], name)
}

/// The bytes a field's value follows in compact JSON when the field comes right after the one
/// before it in the schema (`,"name":`), held so that they are matched in one step. Those of
/// 8 to 16 bytes (names of 4 to 12 characters) are also held as the two words that cover them,
/// so the match is two loads and two comparisons, without a loop or a pointer to follow.
#[derive(Debug, Clone, Default)]
pub(super) struct Lead {
    bytes: Box<[u8]>,
    /// The first and the last eight bytes, for a lead of 8 to 16 bytes.
    words: Option<(u64, u64)>,
}

impl Lead {
    /// The lead of a field named `name`, which needs no escaping (`FieldSpec::plain_name`).
    pub(super) fn new(name: &str) -> Self {
        let bytes = format!(",\"{name}\":").into_bytes();
        let words = (8..=16)
            .contains(&bytes.len())
            .then(|| (load8(&bytes, 0), load8(&bytes, bytes.len() - 8)));
        Self {
            bytes: bytes.into(),
            words,
        }
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether `line[at..]` starts with the lead (never for an empty one).
    #[inline(always)]
    fn at(&self, line: &[u8], at: usize) -> bool {
        let n = self.bytes.len();
        if n == 0 || line.len() < at + n {
            return false;
        }
        match self.words {
            Some((first, last)) => load8(line, at) == first && load8(line, at + n - 8) == last,
            None => key_eq(&line[at..at + n], &self.bytes),
        }
    }
}

/// Finds the schema field of a key: the expected next one first, then a linear scan.
#[inline]
fn lookup(
    fields: &[FieldSpec],
    key: &[u8],
    escaped: bool,
    hint: usize,
    scratch: &mut Vec<u8>,
) -> Option<usize> {
    if escaped {
        let mark = scratch.len();
        unescape(key, scratch);
        let found = fields
            .iter()
            .position(|f| f.name.as_bytes() == &scratch[mark..]);
        scratch.truncate(mark);
        return found;
    }
    if fields
        .get(hint)
        .is_some_and(|f| key_eq(f.name.as_bytes(), key))
    {
        return Some(hint);
    }
    fields.iter().position(|f| key_eq(f.name.as_bytes(), key))
}

/// Converts one token for field `f` into its column, recording a field error (and writing a
/// null) on failure.
#[inline(always)]
fn stage(spec: &FieldSpec, f: usize, v: Value, line: &[u8], row: &mut RowState, utf8_ok: bool) {
    let raw = &line[v.start..v.end];
    let slot = match (&spec.kind, v.tok) {
        (_, Tok::Null) => Some(Slot::Null),
        // A string's contents, unescaped; Spark keeps the literal text of a number, boolean or
        // structure for a string column (a structure's strings may hold bytes that are not
        // UTF-8, so every text is checked unless the whole file was).
        (Kind::Utf8, tok) => {
            let text = if tok == (Tok::Str { escaped: true }) {
                let start = row.scratch.len();
                unescape(raw, &mut row.scratch);
                &row.scratch[start..]
            } else {
                raw
            };
            if utf8_ok || std::str::from_utf8(text).is_ok() {
                return row.out.put_str(f, text);
            }
            row.out.put(f, Slot::Null);
            return row.field_error(spec, format_args!("invalid UTF-8"));
        }
        // What `convert_text` does for a timestamp, without its dispatch: event times are in
        // most records. Spelled out here: the same two calls behind one shared helper measured
        // 1-2 % more CPU on files -> JSON -> Parquet (15 interleaved pairs).
        (Kind::Timestamp { unit, .. }, Tok::Str { escaped: false }) => {
            super::timestamp::parse_timestamp(raw, &mut row.dates)
                .and_then(|(secs, nanos)| super::timestamp::to_unit(secs, nanos, *unit))
                .map(Slot::I64)
        }
        (kind, Tok::Str { escaped: false }) => cells::convert_text(kind, raw, true, &mut row.dates),
        (kind, Tok::Str { escaped: true }) => {
            let start = row.scratch.len();
            unescape(raw, &mut row.scratch);
            let slot = cells::convert_text(kind, &row.scratch[start..], true, &mut row.dates);
            row.scratch.truncate(start);
            slot
        }
        (Kind::I64, Tok::Num { integer: true }) => integer(raw, v.digits).map(Slot::I64),
        (Kind::I32, Tok::Num { integer: true }) => integer(raw, v.digits)
            .and_then(|x| i32::try_from(x).ok())
            .map(Slot::I32),
        (Kind::F64, Tok::Num { .. }) => cells::parse_f64(raw).map(Slot::F64),
        (Kind::Decimal { precision, scale }, Tok::Num { .. }) => {
            let neg = raw.first() == Some(&b'-');
            v.digits
                .mantissa
                .and_then(|m| cells::decimal_from_digits(m, v.digits.frac, neg, *precision, *scale))
                .or_else(|| cells::parse_decimal(raw, *precision, *scale))
                .map(Slot::I128)
        }
        // Spark reads an integer for a timestamp column as seconds since the epoch.
        (Kind::Timestamp { unit, .. }, Tok::Num { integer: true }) => integer(raw, v.digits)
            .and_then(|secs| super::timestamp::to_unit(secs, 0, *unit))
            .map(Slot::I64),
        (Kind::Bool, Tok::True) => Some(Slot::Bool(true)),
        (Kind::Bool, Tok::False) => Some(Slot::Bool(false)),
        _ => None,
    };
    match slot {
        Some(slot) => row.out.put(f, slot),
        None => {
            row.out.put(f, Slot::Null);
            let quoted = matches!(v.tok, Tok::Str { .. });
            row.cannot_parse(spec, raw, quoted);
        }
    }
}

/// A JSON integer's value from the digits the scanner read, `None` when it is outside `i64`.
#[inline(always)]
fn integer(raw: &[u8], digits: Digits) -> Option<i64> {
    // More than 19 digits (JSON has no leading zeros) is past i64 either way.
    let m = digits.mantissa?;
    if raw.first() == Some(&b'-') {
        0i64.checked_sub_unsigned(m)
    } else {
        i64::try_from(m).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unesc(s: &str) -> String {
        let mut out = Vec::new();
        unescape(s.as_bytes(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_lead_matches_exactly_its_bytes_at_every_length() {
        for name_len in 1..=20 {
            let name: String = (0..name_len).map(|i| char::from(b'a' + i as u8)).collect();
            let bytes = format!(",\"{name}\":").into_bytes();
            let lead = Lead::new(&name);
            assert_eq!(lead.words.is_some(), (8..=16).contains(&bytes.len()));
            let line = [b"{\"x\":1".as_slice(), &bytes, b"2}"].concat();
            assert!(lead.at(&line, 6), "{name}");
            assert!(
                lead.at(&line[..6 + bytes.len()], 6),
                "{name}: the line ends with it"
            );
            assert!(!lead.at(&line, 5), "{name}");
            // Cut short, or any one byte changed: no match.
            assert!(!lead.at(&line[..6 + bytes.len() - 1], 6), "{name}");
            for k in 0..bytes.len() {
                let mut other = line.clone();
                other[6 + k] ^= 0x20;
                assert!(!lead.at(&other, 6), "{name}: byte {k}");
            }
        }
        assert!(!Lead::default().at(b",", 0));
    }

    /// The eight-byte digit runs agree with a byte loop on every length and position.
    #[test]
    fn digit_runs_read_every_digit() {
        let digits = b"98765432109876543210123";
        for start in 0..digits.len() {
            for len in 0..=digits.len() - start {
                for tail in [&b""[..], b"x", b".5", b"},\"a\":1}"] {
                    let mut s = b"-".to_vec();
                    s.extend_from_slice(&digits[start..start + len]);
                    s.extend_from_slice(tail);
                    let mut m = 7;
                    let end = digit_run(&s, 1, &mut m);
                    let mut want = 7u64;
                    for &b in &digits[start..start + len] {
                        want = want.wrapping_mul(10).wrapping_add(u64::from(b - b'0'));
                    }
                    assert_eq!((end, m), (1 + len, want), "{}", String::from_utf8_lossy(&s));
                }
            }
        }
        // Every byte that is not a digit stops a run, at every position of a word; runs of
        // nines fold without spilling between digits.
        for stop in (0..=255u8).filter(|b| !b.is_ascii_digit()) {
            for at in 0..8 {
                let mut s = b"99999999".to_vec();
                s[at] = stop;
                s.extend_from_slice(b"99999999");
                let mut m = 0;
                assert_eq!(digit_run(&s, 0, &mut m), at, "byte {stop:#x} at {at}");
                assert_eq!(m, if at == 0 { 0 } else { 10u64.pow(at as u32) - 1 });
            }
        }
        let nines = b"9999999999999999";
        let mut m = 0;
        assert_eq!(digit_run(nines, 0, &mut m), 16);
        assert_eq!(m, 9_999_999_999_999_999);
    }

    #[test]
    fn unescapes_all_forms() {
        assert_eq!(
            unesc(r#"a\"b\\c\/d\b\f\n\r\t"#),
            "a\"b\\c/d\u{8}\u{c}\n\r\t"
        );
        assert_eq!(unesc(r"caf\u00e9 \u20AC"), "café €");
        assert_eq!(unesc(r"\ud83d\ude00!"), "😀!");
        assert_eq!(unesc(r"\ud83dx"), "\u{FFFD}x");
        assert_eq!(unesc(r"\ude00"), "\u{FFFD}");
        assert_eq!(unesc("plain"), "plain");
    }

    #[test]
    fn scanner_rejects_bad_grammar() {
        for bad in [
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":-}"#,
            r#"{"a":1e}"#,
            r#"{"a":tru}"#,
            r#"{"a":"x\q"}"#,
            r#"{"a":[1,2}"#,
            r#"{"a":{"b" 1}}"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{a:1}"#,
        ] {
            let mut p = Scanner {
                s: bad.as_bytes(),
                i: 0,
            };
            assert!(p.value(0).is_err(), "{bad}");
        }
        let mut p = Scanner {
            s: br#"{"a":[1,{"b":[true,false,null,"x\u0041"]},-2.5e-3],"c":{}}"#,
            i: 0,
        };
        assert!(p.value(0).is_ok());
        assert_eq!(p.i, p.s.len());
    }
}
