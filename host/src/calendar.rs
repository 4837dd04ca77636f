//! Proleptic Gregorian calendar arithmetic on days since 1970-01-01, the one
//! copy the decoders, sinks, progress records and checkpoint stamps share.
//!
//! Why not chrono: Weir needs two conversions (H. Hinnant's `days_from_civil`
//! and `civil_from_days`), exact for every `i64`-sized date Arrow can hold, and
//! nothing else of a date-time library.

/// Days since 1970-01-01 of a proleptic Gregorian date.
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let m = i64::from(month);
    let mp = if m > 2 { m - 3 } else { m + 9 }; // March = 0
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146_097 + doe - 719_468
}

/// (year, month, day) of `days` since 1970-01-01.
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    // In range by construction: day 1..=31, month 1..=12.
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DDTHH:MM:SS` (UTC, no suffix) of `secs` since the epoch.
pub(crate) fn format_seconds(secs: i64) -> String {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        for (days, ymd) in [
            (0, (1970, 1, 1)),
            (19_783, (2024, 3, 1)),
            (19_782, (2024, 2, 29)),
            (11_016, (2000, 2, 29)),
            (-1, (1969, 12, 31)),
            (-135_140, (1600, 1, 1)),
        ] {
            assert_eq!(civil_from_days(days), ymd, "{days}");
            assert_eq!(days_from_civil(ymd.0, ymd.1, ymd.2), days, "{ymd:?}");
        }
    }

    #[test]
    fn round_trips_over_a_wide_range() {
        for days in (-1_000_000..1_000_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn formats_seconds() {
        assert_eq!(format_seconds(0), "1970-01-01T00:00:00");
        assert_eq!(format_seconds(1_709_251_387), "2024-03-01T00:03:07");
        assert_eq!(format_seconds(-1), "1969-12-31T23:59:59");
    }
}
