//! Text forms of the types that have no JSON equivalent (timestamps, dates, exact decimals), so
//! that every plugin reads config literals and writes output the same way, without a date or
//! decimal crate in the guest. The formatters are `Display` wrappers: writing one allocates
//! nothing.

use std::fmt;

/// Why a text could not be read as a timestamp, date or decimal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Not `YYYY-MM-DD`, or no such day.
    #[error("`{0}` is not a date (expected YYYY-MM-DD)")]
    Date(String),
    /// Not an RFC 3339 / ISO 8601 timestamp.
    #[error(
        "`{0}` is not a timestamp (expected e.g. 2024-05-01T12:00:00Z or 2024-05-01 12:00:00.5+02:00)"
    )]
    Timestamp(String),
    /// Not a decimal number.
    #[error("`{0}` is not a decimal number")]
    Decimal(String),
    /// A decimal with more decimal places than the scale it must be read at.
    #[error("`{text}` has more decimal places than scale {scale}")]
    DecimalScale {
        /// The text.
        text: String,
        /// The scale it must fit.
        scale: i8,
    },
    /// A decimal outside the range of a 128-bit decimal.
    #[error("`{0}` is out of the decimal128 range")]
    DecimalRange(String),
}

const MICROS_PER_SECOND: i64 = 1_000_000;
const SECONDS_PER_DAY: i64 = 86_400;

// A copy of the host's `calendar`: this crate is compiled to Wasm and cannot depend on the host.

/// The (year, month, day) of `days` since 1970-01-01 (proleptic Gregorian; Howard Hinnant's
/// `civil_from_days`).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    // day is 1..=31 and month 1..=12 by construction.
    (year, day_or_month(month), day_or_month(day))
}

fn day_or_month(v: i64) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// Days since 1970-01-01 of a (year, month, day) (Howard Hinnant's `days_from_civil`).
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        _ => 0,
    }
}

fn write_year(f: &mut fmt::Formatter<'_>, year: i64) -> fmt::Result {
    if (0..=9999).contains(&year) {
        write!(f, "{year:04}")
    } else {
        write!(f, "{year:+05}")
    }
}

/// Formats days since the epoch as `YYYY-MM-DD`.
#[derive(Debug, Clone, Copy)]
pub struct Date32Text(pub i32);

impl fmt::Display for Date32Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d) = civil_from_days(i64::from(self.0));
        write_year(f, y)?;
        write!(f, "-{m:02}-{d:02}")
    }
}

/// Formats UTC microseconds since the epoch as RFC 3339 with `Z`, with 0, 3 or 6 fractional
/// digits as the value needs (`2024-05-01T12:00:00Z`, `…:00.250Z`, `…:00.000001Z`).
#[derive(Debug, Clone, Copy)]
pub struct TimestampMicrosText(pub i64);

impl fmt::Display for TimestampMicrosText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0;
        let secs = micros.div_euclid(MICROS_PER_SECOND);
        let frac = micros.rem_euclid(MICROS_PER_SECOND);
        let days = secs.div_euclid(SECONDS_PER_DAY);
        let sod = secs.rem_euclid(SECONDS_PER_DAY);
        let (y, mo, d) = civil_from_days(days);
        write_year(f, y)?;
        write!(
            f,
            "-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
            sod / 3600,
            sod / 60 % 60,
            sod % 60
        )?;
        if frac == 0 {
            f.write_str("Z")
        } else if frac % 1000 == 0 {
            write!(f, ".{:03}Z", frac / 1000)
        } else {
            write!(f, ".{frac:06}Z")
        }
    }
}

/// Formats an unscaled decimal at `scale` exactly: `DecimalText(2390, 2)` is `23.90`,
/// `DecimalText(-5, 3)` is `-0.005`, `DecimalText(12, -2)` is `1200`.
#[derive(Debug, Clone, Copy)]
pub struct DecimalText(pub i128, pub i8);

impl fmt::Display for DecimalText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let DecimalText(value, scale) = *self;
        // Digits of |value|, most significant first, in a stack buffer (u128 has at most 39).
        let mut buf = [0u8; 40];
        let mut n = 0;
        let mut abs = value.unsigned_abs();
        loop {
            buf[n] = b'0' + (abs % 10) as u8;
            n += 1;
            abs /= 10;
            if abs == 0 {
                break;
            }
        }
        buf[..n].reverse();
        // Only ASCII digits were written.
        let digits = std::str::from_utf8(&buf[..n]).map_err(|_| fmt::Error)?;
        if value < 0 {
            f.write_str("-")?;
        }
        if scale <= 0 {
            f.write_str(digits)?;
            if value != 0 {
                for _ in 0..scale.unsigned_abs() {
                    f.write_str("0")?;
                }
            }
            return Ok(());
        }
        let scale = usize::from(scale.unsigned_abs());
        if n <= scale {
            f.write_str("0.")?;
            for _ in 0..scale - n {
                f.write_str("0")?;
            }
            f.write_str(digits)
        } else {
            f.write_str(&digits[..n - scale])?;
            f.write_str(".")?;
            f.write_str(&digits[n - scale..])
        }
    }
}

fn number(text: &str, bytes: &[u8], at: usize, width: usize) -> Result<u32, ()> {
    let part = bytes.get(at..at + width).ok_or(())?;
    if !part.iter().all(u8::is_ascii_digit) {
        return Err(());
    }
    text.get(at..at + width).ok_or(())?.parse().map_err(|_| ())
}

fn parse_ymd(text: &str) -> Result<(i64, u32, u32), ()> {
    let b = text.as_bytes();
    if b.get(4) != Some(&b'-') || b.get(7) != Some(&b'-') {
        return Err(());
    }
    let y = i64::from(number(text, b, 0, 4)?);
    let m = number(text, b, 5, 2)?;
    let d = number(text, b, 8, 2)?;
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return Err(());
    }
    Ok((y, m, d))
}

/// Reads `YYYY-MM-DD` (years 0000–9999) as days since the epoch.
///
/// # Errors
/// [`TextError::Date`] for any other text or a day that does not exist.
pub fn parse_date32(text: &str) -> Result<i32, TextError> {
    let err = || TextError::Date(text.to_owned());
    if text.len() != 10 {
        return Err(err());
    }
    let (y, m, d) = parse_ymd(text).map_err(|()| err())?;
    i32::try_from(days_from_civil(y, m, d)).map_err(|_| err())
}

/// Reads an ISO 8601 / RFC 3339 timestamp as UTC microseconds since the epoch.
///
/// Accepts `YYYY-MM-DD`, then optionally `T` or a space and `HH:MM[:SS[.fraction]]`, then
/// optionally `Z` or an offset `±HH:MM` / `±HHMM` / `±HH`; no offset means UTC. Fraction digits
/// past microseconds are truncated.
///
/// # Errors
/// [`TextError::Timestamp`] for anything else.
pub fn parse_timestamp_micros(text: &str) -> Result<i64, TextError> {
    parse_timestamp_inner(text).map_err(|()| TextError::Timestamp(text.to_owned()))
}

fn parse_timestamp_inner(text: &str) -> Result<i64, ()> {
    let b = text.as_bytes();
    let (y, mo, d) = parse_ymd(text.get(..10).ok_or(())?)?;
    let mut micros = days_from_civil(y, mo, d) * SECONDS_PER_DAY * MICROS_PER_SECOND;
    let mut at = 10;
    if at == b.len() {
        return Ok(micros);
    }
    if !matches!(b[at], b'T' | b't' | b' ') {
        return Err(());
    }
    at += 1;
    let h = number(text, b, at, 2)?;
    if b.get(at + 2) != Some(&b':') {
        return Err(());
    }
    let mi = number(text, b, at + 3, 2)?;
    at += 5;
    let mut s = 0;
    if b.get(at) == Some(&b':') {
        s = number(text, b, at + 1, 2)?;
        at += 3;
        if b.get(at) == Some(&b'.') {
            at += 1;
            let start = at;
            let mut frac: i64 = 0;
            while let Some(c) = b.get(at).filter(|c| c.is_ascii_digit()) {
                if at - start < 6 {
                    frac = frac * 10 + i64::from(c - b'0');
                }
                at += 1;
            }
            if at == start {
                return Err(());
            }
            for _ in (at - start)..6 {
                frac *= 10;
            }
            micros += frac;
        }
    }
    if h > 23 || mi > 59 || s > 60 {
        return Err(());
    }
    micros += (i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s)) * MICROS_PER_SECOND;
    let offset_secs = match b.get(at) {
        None => 0,
        Some(b'Z' | b'z') if at + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let oh = number(text, b, at + 1, 2)?;
            let rest = &b[at + 3..];
            let om = match rest {
                [] => 0,
                [b':', ..] if rest.len() == 3 => number(text, b, at + 4, 2)?,
                _ if rest.len() == 2 => number(text, b, at + 3, 2)?,
                _ => return Err(()),
            };
            if oh > 23 || om > 59 {
                return Err(());
            }
            let secs = i64::from(oh) * 3600 + i64::from(om) * 60;
            if sign == b'+' { secs } else { -secs }
        }
        Some(_) => return Err(()),
    };
    Ok(micros - offset_secs * MICROS_PER_SECOND)
}

/// Reads a decimal number (`23.9`, `-0.005`, `1e3`, `+7`) as an unscaled value at `scale`,
/// exactly: `parse_decimal("23.9", 2)` is `2390`.
///
/// # Errors
/// [`TextError::Decimal`] for text that is not a number, [`TextError::DecimalScale`] when it has
/// more (non-zero) decimal places than `scale`, [`TextError::DecimalRange`] when it overflows.
pub fn parse_decimal(text: &str, scale: i8) -> Result<i128, TextError> {
    let bad = || TextError::Decimal(text.to_owned());
    let range = || TextError::DecimalRange(text.to_owned());
    let t = text.trim();
    let (negative, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exponent) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().map_err(|_| bad())?),
        None => (t, 0),
    };
    let (int_part, frac_part) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mantissa, ""),
    };
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|c| c.is_ascii_digit())
    {
        return Err(bad());
    }
    let mut unscaled: i128 = 0;
    for c in int_part.bytes().chain(frac_part.bytes()) {
        unscaled = unscaled
            .checked_mul(10)
            .and_then(|v| v.checked_add(i128::from(c - b'0')))
            .ok_or_else(range)?;
    }
    // The text's value is unscaled * 10^(exponent - frac digits); we need it * 10^scale.
    let frac_digits = i32::try_from(frac_part.len()).map_err(|_| range())?;
    let shift = i32::from(scale) + exponent - frac_digits;
    if shift >= 0 {
        for _ in 0..shift {
            if unscaled == 0 {
                break;
            }
            unscaled = unscaled.checked_mul(10).ok_or_else(range)?;
        }
    } else {
        for _ in 0..shift.unsigned_abs() {
            if unscaled % 10 != 0 {
                return Err(TextError::DecimalScale {
                    text: text.to_owned(),
                    scale,
                });
            }
            unscaled /= 10;
            if unscaled == 0 {
                break;
            }
        }
    }
    Ok(if negative { -unscaled } else { unscaled })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        assert_eq!(Date32Text(0).to_string(), "1970-01-01");
        assert_eq!(Date32Text(19_844).to_string(), "2024-05-01");
        assert_eq!(Date32Text(-1).to_string(), "1969-12-31");
        assert_eq!(parse_date32("2024-02-29"), Ok(19_782));
        assert_eq!(Date32Text(19_782).to_string(), "2024-02-29");
        assert!(matches!(
            parse_date32("2023-02-29"),
            Err(TextError::Date(_))
        ));
        assert!(parse_date32("2024-5-01").is_err());
        for d in [-719_162, -1, 0, 1, 59, 60, 11_016, 2_932_896] {
            assert_eq!(parse_date32(&Date32Text(d).to_string()), Ok(d), "day {d}");
        }
    }

    #[test]
    fn timestamps_format_with_the_digits_they_need() {
        let t = parse_timestamp_micros("2024-05-01T12:34:56Z").unwrap();
        assert_eq!(t, 1_714_566_896_000_000);
        assert_eq!(TimestampMicrosText(t).to_string(), "2024-05-01T12:34:56Z");
        assert_eq!(
            TimestampMicrosText(t + 250_000).to_string(),
            "2024-05-01T12:34:56.250Z"
        );
        assert_eq!(
            TimestampMicrosText(t + 1).to_string(),
            "2024-05-01T12:34:56.000001Z"
        );
        assert_eq!(
            TimestampMicrosText(-1).to_string(),
            "1969-12-31T23:59:59.999999Z"
        );
    }

    #[test]
    fn timestamps_parse_offsets_fractions_and_dates() {
        let base = 1_714_566_896_000_000;
        assert_eq!(
            parse_timestamp_micros("2024-05-01 14:34:56+02:00"),
            Ok(base)
        );
        assert_eq!(parse_timestamp_micros("2024-05-01T10:34:56-0200"), Ok(base));
        assert_eq!(
            parse_timestamp_micros("2024-05-01T12:34:56.5"),
            Ok(base + 500_000)
        );
        assert_eq!(
            parse_timestamp_micros("2024-05-01T12:34:56.1234567Z"),
            Ok(base + 123_456)
        );
        assert_eq!(
            parse_timestamp_micros("2024-05-01T12:34Z"),
            Ok(base - 56_000_000)
        );
        assert_eq!(
            parse_timestamp_micros("2024-05-01"),
            Ok(base - 45_296_000_000)
        );
        for bad in [
            "2024-05-01T",
            "2024-05-01T25:00:00",
            "2024-05-01T12:00:00Q",
            "yesterday",
        ] {
            assert!(
                matches!(parse_timestamp_micros(bad), Err(TextError::Timestamp(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn decimals_are_exact_at_their_scale() {
        assert_eq!(DecimalText(2390, 2).to_string(), "23.90");
        assert_eq!(DecimalText(-5, 3).to_string(), "-0.005");
        assert_eq!(DecimalText(0, 2).to_string(), "0.00");
        assert_eq!(DecimalText(12, -2).to_string(), "1200");
        assert_eq!(DecimalText(i128::MIN, 0).to_string(), i128::MIN.to_string());
        assert_eq!(parse_decimal("23.9", 2), Ok(2390));
        assert_eq!(parse_decimal("23.900", 2), Ok(2390));
        assert_eq!(parse_decimal("-0.005", 3), Ok(-5));
        assert_eq!(parse_decimal("1e3", 2), Ok(100_000));
        assert_eq!(parse_decimal("1200", -2), Ok(12));
        assert_eq!(parse_decimal(".5", 1), Ok(5));
        assert_eq!(
            parse_decimal("23.999", 2),
            Err(TextError::DecimalScale {
                text: "23.999".into(),
                scale: 2
            })
        );
        assert!(matches!(
            parse_decimal("abc", 2),
            Err(TextError::Decimal(_))
        ));
        assert!(matches!(parse_decimal(".", 2), Err(TextError::Decimal(_))));
        assert!(matches!(
            parse_decimal("1e40", 2),
            Err(TextError::DecimalRange(_))
        ));
    }
}
