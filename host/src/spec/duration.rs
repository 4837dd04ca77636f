//! Human-readable durations ("30s", "10 minutes", "1h 30m") for the pipeline file.
//!
//! Users write intervals the way they speak them; a bare number of seconds or milliseconds is a
//! classic source of off-by-1000 mistakes, so a unit is always required and the error lists the
//! units that exist.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The accepted units, with their length in milliseconds. Matched case-insensitively.
const UNITS: &[(&str, u64)] = &[
    ("ms", 1),
    ("msec", 1),
    ("msecs", 1),
    ("millisecond", 1),
    ("milliseconds", 1),
    ("s", 1_000),
    ("sec", 1_000),
    ("secs", 1_000),
    ("second", 1_000),
    ("seconds", 1_000),
    ("m", 60_000),
    ("min", 60_000),
    ("mins", 60_000),
    ("minute", 60_000),
    ("minutes", 60_000),
    ("h", 3_600_000),
    ("hr", 3_600_000),
    ("hrs", 3_600_000),
    ("hour", 3_600_000),
    ("hours", 3_600_000),
    ("d", 86_400_000),
    ("day", 86_400_000),
    ("days", 86_400_000),
];

const UNIT_HINT: &str = "use ms, s, m, h or d (or sec, min, hour, day and their plurals)";

/// Parses a duration such as "30s", "10 minutes", "1 hour", "1h 30m", "500ms" or "2 days".
///
/// Each component is an integer, an optional space and a unit; several components add up.
///
/// # Errors
/// A message that quotes the input and says what is wrong (missing number, missing or unknown
/// unit, overflow).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let fail = |why: String| format!("{text:?} is not a duration: {why}");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(fail(format!("it is empty; {UNIT_HINT}, e.g. \"30s\"")));
    }
    let mut total_ms: u64 = 0;
    while !rest.is_empty() {
        let digits_end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits_end == 0 {
            return Err(fail(format!(
                "expected a number at {rest:?}; write e.g. \"30s\" or \"1h 30m\""
            )));
        }
        let number: u64 = rest[..digits_end]
            .parse()
            .map_err(|_| fail(format!("{} is too large", &rest[..digits_end])))?;
        rest = rest[digits_end..].trim_start();
        let unit_end = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        if unit.is_empty() {
            return Err(if rest.starts_with('.') {
                fail(format!(
                    "only whole numbers are allowed; use a smaller unit (e.g. \"1500ms\"); {UNIT_HINT}"
                ))
            } else {
                fail(format!("{number} has no unit; {UNIT_HINT}"))
            });
        }
        let lower = unit.to_ascii_lowercase();
        let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == lower) else {
            return Err(fail(format!("unknown unit {unit:?}; {UNIT_HINT}")));
        };
        total_ms = number
            .checked_mul(unit_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(|| fail("it is too large".to_string()))?;
        rest = rest[unit_end..].trim_start();
        // Allow "1h, 30m" as well as "1h 30m".
        if let Some(after) = rest.strip_prefix(',') {
            rest = after.trim_start();
        }
    }
    Ok(Duration::from_millis(total_ms))
}

/// Formats a duration the way [`parse_duration`] reads it, e.g. "1h 30m" or "500ms".
#[must_use]
pub fn format_duration(duration: Duration) -> String {
    let mut ms = duration.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    let mut parts = Vec::new();
    for (unit, len) in [
        ("d", 86_400_000u128),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= len {
            parts.push(format!("{}{unit}", ms / len));
            ms %= len;
        }
    }
    if ms > 0 {
        parts.push(format!("{ms}ms"));
    }
    parts.join(" ")
}

/// A duration written for humans: reads "30s", "10 minutes", "1h 30m" (see [`parse_duration`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_duration(text).map(HumanDuration)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

impl From<HumanDuration> for Duration {
    fn from(value: HumanDuration) -> Self {
        value.0
    }
}

impl<'de> serde::Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> u128 {
        parse_duration(text).unwrap().as_millis()
    }

    #[test]
    fn reads_every_unit_form() {
        assert_eq!(ms("30s"), 30_000);
        assert_eq!(ms("30 s"), 30_000);
        assert_eq!(ms("1 sec"), 1_000);
        assert_eq!(ms("2 secs"), 2_000);
        assert_eq!(ms("1 second"), 1_000);
        assert_eq!(ms("45 seconds"), 45_000);
        assert_eq!(ms("500ms"), 500);
        assert_eq!(ms("10m"), 600_000);
        assert_eq!(ms("1 min"), 60_000);
        assert_eq!(ms("5 mins"), 300_000);
        assert_eq!(ms("1 minute"), 60_000);
        assert_eq!(ms("10 minutes"), 600_000);
        assert_eq!(ms("1h"), 3_600_000);
        assert_eq!(ms("1 hour"), 3_600_000);
        assert_eq!(ms("3 hours"), 10_800_000);
        assert_eq!(ms("1d"), 86_400_000);
        assert_eq!(ms("1 day"), 86_400_000);
        assert_eq!(ms("2 days"), 172_800_000);
        assert_eq!(ms("10 Minutes"), 600_000);
        assert_eq!(ms("0s"), 0);
    }

    #[test]
    fn adds_up_components() {
        assert_eq!(ms("1h 30m"), 5_400_000);
        assert_eq!(ms("1h30m"), 5_400_000);
        assert_eq!(ms("1 hour, 30 minutes"), 5_400_000);
        assert_eq!(ms("1m 1s 1ms"), 61_001);
        assert_eq!(ms("  2 days  "), 172_800_000);
    }

    #[test]
    fn refuses_bad_forms_with_reasons() {
        let err = parse_duration("30").unwrap_err();
        assert_eq!(
            err,
            "\"30\" is not a duration: 30 has no unit; use ms, s, m, h or d (or sec, min, hour, day and their plurals)"
        );
        let err = parse_duration("10 minuts").unwrap_err();
        assert!(err.contains("unknown unit \"minuts\""), "{err}");
        let err = parse_duration("soon").unwrap_err();
        assert!(
            err.starts_with("\"soon\" is not a duration: expected a number"),
            "{err}"
        );
        let err = parse_duration("").unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let err = parse_duration("1.5s").unwrap_err();
        assert!(err.contains("whole numbers"), "{err}");
        let err = parse_duration("-5s").unwrap_err();
        assert!(err.contains("expected a number"), "{err}");
        let err = parse_duration("99999999999999999999 days").unwrap_err();
        assert!(err.contains("too large"), "{err}");
        let err = parse_duration("999999999999999 days").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn formats_and_round_trips() {
        for text in ["1h 30m", "500ms", "2d", "10m", "1d 1h 1m 1s 1ms", "0s"] {
            let parsed: HumanDuration = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn deserializes_from_toml() {
        #[derive(serde::Deserialize)]
        struct Holder {
            delay: HumanDuration,
        }
        let holder: Holder = toml::from_str("delay = \"10 minutes\"").unwrap();
        assert_eq!(holder.delay.0, Duration::from_secs(600));
        let err = toml::from_str::<Holder>("delay = \"10\"")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("has no unit"), "{err}");
    }
}
