//! ISO-8601 date and timestamp parsing by hand.
//!
//! Every valid input line carries a timestamp, so this sits on the decoder's hot path; a
//! general-purpose date library (format strings, time-zone databases) costs several times more
//! than the fixed-position parse below. The accepted forms are the ones Spark's lenient JSON/CSV
//! timestamp parsing accepts in practice for UTC-or-offset data:
//!
//! * `YYYY-MM-DD` (midnight UTC),
//! * `YYYY-MM-DD[T| ]HH:MM[:SS[.f{1,9}]][zone]` where zone is `Z`, `±HH`, `±HHMM` or `±HH:MM`;
//!   no zone means UTC.
//!
//! Digits beyond the target unit's precision are truncated (as Spark does beyond microseconds).

use arrow_schema::TimeUnit;

pub(super) use crate::calendar::days_from_civil;

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[inline]
fn digit(b: u8) -> Option<u32> {
    let d = b.wrapping_sub(b'0');
    (d < 10).then_some(u32::from(d))
}

#[inline]
fn two_digits(s: &[u8], at: usize) -> Option<u32> {
    Some(digit(*s.get(at)?)? * 10 + digit(*s.get(at + 1)?)?)
}

/// Parses `YYYY-MM-DD` at the start of `s`; returns days since the epoch.
#[inline]
fn parse_date_prefix(s: &[u8]) -> Option<i64> {
    if s.len() < 10 || s[4] != b'-' || s[7] != b'-' {
        return None;
    }
    let year = two_digits(s, 0)? * 100 + two_digits(s, 2)?;
    let month = two_digits(s, 5)?;
    let day = two_digits(s, 8)?;
    let year = i64::from(year);
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) {
        return None;
    }
    Some(days_from_civil(year, month, day))
}

/// The last date parsed: consecutive rows nearly always share it.
#[derive(Debug, Default)]
pub(super) struct DateCache {
    /// The ten bytes of `YYYY-MM-DD` as two words (compared without a `memcmp` call).
    key: Option<(u64, u16)>,
    days: i64,
}

impl DateCache {
    /// Days since the epoch of the `YYYY-MM-DD` at the start of `s`.
    #[inline]
    fn days(&mut self, s: &[u8]) -> Option<i64> {
        let key = s.get(..10)?;
        let key = (super::load8(key, 0), u16::from_le_bytes([key[8], key[9]]));
        if self.key == Some(key) {
            return Some(self.days);
        }
        let days = parse_date_prefix(s)?;
        self.key = Some(key);
        self.days = days;
        Some(days)
    }
}

/// Parses a `YYYY-MM-DD` date into days since 1970-01-01.
pub(super) fn parse_date(s: &[u8], cache: &mut DateCache) -> Option<i32> {
    if s.len() != 10 {
        return None;
    }
    i32::try_from(cache.days(s)?).ok()
}

/// `HH:MM:SS` at `s[at..at + 8]` as seconds of the day, the six digits read as one word;
/// `None` unless it is exactly that shape with hours, minutes and seconds in range.
#[inline(always)]
fn clock(s: &[u8], at: usize) -> Option<u32> {
    const LO: u64 = 0x0101_0101_0101_0101;
    // Byte by byte minus '0': digits become 0..=9, each ':' becomes 10.
    let d = super::load8(s, at).wrapping_sub(LO * u64::from(b'0'));
    // Digits are below 10 (adding 0x76 leaves their top bit clear), the colons exactly 10.
    const DIGITS: u64 = 0xffff_00ff_ff00_ffff;
    const COLONS: u64 = 0x0000_0a00_000a_0000;
    if (d.wrapping_add(LO * 0x76) | d) & 0x8080_8080_8080_8080 & DIGITS != 0
        || d & !DIGITS != COLONS
    {
        return None;
    }
    let b = d.to_le_bytes();
    let (hour, minute, second) = (
        u32::from(b[0]) * 10 + u32::from(b[1]),
        u32::from(b[3]) * 10 + u32::from(b[4]),
        u32::from(b[6]) * 10 + u32::from(b[7]),
    );
    (hour <= 23 && minute <= 59 && second <= 59).then_some(hour * 3600 + minute * 60 + second)
}

/// Parses an ISO-8601 timestamp into whole seconds since the epoch (UTC) and nanoseconds.
#[inline]
pub(super) fn parse_timestamp(s: &[u8], cache: &mut DateCache) -> Option<(i64, u32)> {
    // The usual shape, `YYYY-MM-DDTHH:MM:SS.fffZ`, in one step; anything else below.
    if let [
        ..,
        b'T',
        _,
        _,
        b':',
        _,
        _,
        b':',
        _,
        _,
        b'.',
        f0,
        f1,
        f2,
        b'Z',
    ] = *s
        && s.len() == 24
        && let Some(day_secs) = clock(s, 11)
        && let (Some(a), Some(b), Some(c)) = (digit(f0), digit(f1), digit(f2))
    {
        let days = cache.days(s)?;
        return Some((
            days * 86_400 + i64::from(day_secs),
            (a * 100 + b * 10 + c) * 1_000_000,
        ));
    }
    parse_any_timestamp(s, cache)
}

/// [`parse_timestamp`] for every accepted form, field by field.
#[inline(never)]
fn parse_any_timestamp(s: &[u8], cache: &mut DateCache) -> Option<(i64, u32)> {
    let days = cache.days(s)?;
    let mut secs = days * 86_400;
    if s.len() == 10 {
        return Some((secs, 0));
    }
    if s[10] != b'T' && s[10] != b' ' {
        return None;
    }
    let hour = two_digits(s, 11)?;
    if s.get(13) != Some(&b':') {
        return None;
    }
    let minute = two_digits(s, 14)?;
    let mut i = 16;
    let mut second = 0;
    let mut nanos = 0u32;
    if s.get(i) == Some(&b':') {
        second = two_digits(s, i + 1)?;
        i += 3;
        if s.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            let mut scale = 100_000_000u32;
            while let Some(d) = s.get(i).and_then(|&b| digit(b)) {
                if i - start >= 9 {
                    return None;
                }
                nanos += d * scale;
                scale /= 10;
                i += 1;
            }
            if i == start {
                return None;
            }
        }
    }
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    secs += i64::from(hour * 3600 + minute * 60 + second);
    let offset = match s.get(i) {
        None => 0,
        Some(b'Z') if i + 1 == s.len() => 0,
        Some(&sign @ (b'+' | b'-')) => {
            let oh = two_digits(s, i + 1)?;
            let om = match s.len() - (i + 3) {
                0 => 0,
                2 => two_digits(s, i + 3)?,
                3 if s[i + 3] == b':' => two_digits(s, i + 4)?,
                _ => return None,
            };
            if oh > 18 || om > 59 {
                return None;
            }
            let off = i64::from(oh * 3600 + om * 60);
            if sign == b'-' { -off } else { off }
        }
        Some(_) => return None,
    };
    Some((secs - offset, nanos))
}

/// Converts seconds + nanoseconds into a count of `unit`s, `None` on overflow.
///
/// Each unit divides by its own constant (a multiply), not by a divisor chosen at run time:
/// a hardware division per timestamp was 1.5 % of a JSON → Parquet query's CPU.
#[inline]
pub(super) fn to_unit(secs: i64, nanos: u32, unit: TimeUnit) -> Option<i64> {
    let (scaled, part) = match unit {
        TimeUnit::Second => (Some(secs), nanos / 1_000_000_000),
        TimeUnit::Millisecond => (secs.checked_mul(1_000), nanos / 1_000_000),
        TimeUnit::Microsecond => (secs.checked_mul(1_000_000), nanos / 1_000),
        TimeUnit::Nanosecond => (secs.checked_mul(1_000_000_000), nanos),
    };
    scaled?.checked_add(i64::from(part))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(s: &str) -> Option<i64> {
        let (secs, nanos) = parse_timestamp(s.as_bytes(), &mut DateCache::default())?;
        to_unit(secs, nanos, TimeUnit::Microsecond)
    }

    #[test]
    fn civil_days() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2024, 3, 1), 19_783);
        assert_eq!(days_from_civil(2000, 2, 29), 11_016);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
        assert_eq!(days_from_civil(1600, 1, 1), -135_140);
    }

    #[test]
    fn timestamps() {
        let base = 19_783 * 86_400_000_000i64;
        assert_eq!(micros("2024-03-01T00:03:07.123Z"), Some(base + 187_123_000));
        assert_eq!(
            micros("2024-03-01 00:03:07.123456"),
            Some(base + 187_123_456)
        );
        assert_eq!(
            micros("2024-03-01T00:03:07.1234567Z"),
            Some(base + 187_123_456)
        );
        assert_eq!(micros("2024-03-01T00:03:07Z"), Some(base + 187_000_000));
        assert_eq!(micros("2024-03-01T00:03"), Some(base + 180_000_000));
        assert_eq!(micros("2024-03-01"), Some(base));
        assert_eq!(micros("2024-03-01T02:00:00+02:00"), Some(base));
        assert_eq!(micros("2024-03-01T02:00:00+02"), Some(base));
        assert_eq!(micros("2024-02-29T18:30:00-0530"), Some(base));
        assert_eq!(micros("1969-12-31T23:59:59.5Z"), Some(-500_000));
        for bad in [
            "yesterday",
            "",
            "2024-13-01",
            "2023-02-29",
            "2024-03-01T24:00:00",
            "2024-03-01T00:00:00.Z",
            "2024-03-01T00:00:00ZZ",
            "2024-03-01T00:00:00+2",
            "2024-03-01x",
            "2024-03-01T00:00:00.1234567890",
            "2024/03/01",
        ] {
            assert_eq!(micros(bad), None, "{bad}");
        }
    }

    /// Every byte of every position of a clock changed to every value: `clock` accepts exactly
    /// the digits and colons of `HH:MM:SS` in range, with their value.
    #[test]
    fn a_clock_is_read_as_one_word_exactly() {
        assert_eq!(clock(b"23:59:59", 0), Some(86_399));
        assert_eq!(clock(b"x00:00:00", 1), Some(0));
        for base in [*b"23:59:59", *b"00:00:00", *b"19:09:10"] {
            for at in 0..8 {
                for byte in 0..=255u8 {
                    let mut s = base;
                    s[at] = byte;
                    let field = |i: usize| {
                        let (a, b) = (s[i].wrapping_sub(b'0'), s[i + 1].wrapping_sub(b'0'));
                        (a < 10 && b < 10).then(|| u32::from(a) * 10 + u32::from(b))
                    };
                    let want = match (field(0), field(3), field(6)) {
                        (Some(h), Some(m), Some(sec))
                            if s[2] == b':' && s[5] == b':' && h <= 23 && m <= 59 && sec <= 59 =>
                        {
                            Some(h * 3600 + m * 60 + sec)
                        }
                        _ => None,
                    };
                    assert_eq!(clock(&s, 0), want, "{}", String::from_utf8_lossy(&s));
                }
            }
        }
    }

    /// The one-step path for `YYYY-MM-DDTHH:MM:SS.fffZ` answers as the field-by-field one on
    /// that shape with any byte changed: every digit, separator and range check holds.
    #[test]
    fn the_usual_shape_parses_as_every_other_form_does() {
        let mut state = 0x7157_a3b1_0c4e_9d21u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let bytes = b"0123456789:.-+TZ /\x00\xff9";
        let (mut cache, mut other) = (DateCache::default(), DateCache::default());
        let mut parsed = 0;
        for _ in 0..200_000 {
            let mut s = *b"2024-02-29T23:59:59.999Z";
            // Two bytes changed, or a valid time of any value.
            if next() % 4 == 0 {
                let t = next() % 86_400;
                let text = format!("{:02}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
                s[11..19].copy_from_slice(text.as_bytes());
            } else {
                for _ in 0..2 {
                    let at = (next() % 24) as usize;
                    s[at] = bytes[(next() % bytes.len() as u64) as usize];
                }
            }
            let want = parse_any_timestamp(&s, &mut other);
            assert_eq!(
                parse_timestamp(&s, &mut cache),
                want,
                "{}",
                String::from_utf8_lossy(&s)
            );
            parsed += usize::from(want.is_some());
        }
        assert!(parsed > 50_000, "{parsed}");
    }

    #[test]
    fn dates_and_units() {
        let mut cache = DateCache::default();
        assert_eq!(parse_date(b"2024-03-01", &mut cache), Some(19_783));
        assert_eq!(parse_date(b"2024-03-01", &mut cache), Some(19_783));
        assert_eq!(parse_date(b"2024-03-02", &mut cache), Some(19_784));
        assert_eq!(parse_date(b"2024-02-30", &mut cache), None);
        assert_eq!(parse_date(b"2024-03-01T00:00", &mut cache), None);
        assert_eq!(parse_timestamp(b"2024-03-02x", &mut cache), None);
        assert_eq!(to_unit(1, 123_456_789, TimeUnit::Second), Some(1));
        assert_eq!(to_unit(1, 123_456_789, TimeUnit::Millisecond), Some(1_123));
        assert_eq!(to_unit(-1, 999_999, TimeUnit::Microsecond), Some(-999_001));
        assert_eq!(
            to_unit(i64::MIN / 1_000 - 1, 0, TimeUnit::Millisecond),
            None
        );
        assert_eq!(
            to_unit(i64::MAX / 1_000_000, 775_807_999, TimeUnit::Microsecond),
            Some(i64::MAX)
        );
        assert_eq!(
            to_unit(i64::MAX / 1_000_000, 775_808_000, TimeUnit::Microsecond),
            None
        );
        assert_eq!(
            to_unit(1, 123_456_789, TimeUnit::Nanosecond),
            Some(1_123_456_789)
        );
        assert_eq!(to_unit(i64::MAX / 10, 0, TimeUnit::Nanosecond), None);
    }
}
