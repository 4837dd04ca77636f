//! Human-readable byte sizes ("64 MiB", "256MB", "1048576") for the pipeline file.
//!
//! Memory limits are easy to get wrong by a factor of 1000 or 1024; the units say which one is
//! meant (KB/MB/GB are decimal, KiB/MiB/GiB binary) and a bare integer is plain bytes.

use std::fmt;
use std::str::FromStr;

/// The accepted units, with their size in bytes. Matched case-insensitively.
const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
    ("tib", 1 << 40),
];

const UNIT_HINT: &str = "use an integer with an optional unit B, KB, MB, GB (1000-based) or KiB, MiB, GiB (1024-based), e.g. \"64 MiB\"";

/// Parses a byte size such as "64 MiB", "256MB", "1 GiB" or "1048576" (bytes).
///
/// # Errors
/// A message that quotes the input and lists the accepted units.
pub fn parse_byte_size(text: &str) -> Result<u64, String> {
    let fail = |why: String| format!("{text:?} is not a size: {why}");
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    if digits_end == 0 {
        return Err(fail(UNIT_HINT.to_string()));
    }
    let number: u64 = trimmed[..digits_end]
        .parse()
        .map_err(|_| fail("the number is too large".to_string()))?;
    let unit = trimmed[digits_end..].trim_start();
    if unit.is_empty() {
        return Ok(number);
    }
    if unit.starts_with('.') {
        return Err(fail(format!(
            "only whole numbers are allowed (write \"1536 MiB\", not \"1.5 GiB\"); {UNIT_HINT}"
        )));
    }
    let lower = unit.to_ascii_lowercase();
    let Some(&(_, factor)) = UNITS.iter().find(|(name, _)| *name == lower) else {
        return Err(fail(format!("unknown unit {unit:?}; {UNIT_HINT}")));
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| fail("it is too large".to_string()))
}

/// Formats a byte count with the largest binary unit that divides it, e.g. "64 MiB", "1000 B".
#[must_use]
pub fn format_byte_size(bytes: u64) -> String {
    for (unit, factor) in [
        ("TiB", 1u64 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ] {
        if bytes >= factor && bytes.is_multiple_of(factor) {
            return format!("{} {unit}", bytes / factor);
        }
    }
    format!("{bytes} B")
}

/// A byte size written for humans (see [`parse_byte_size`]); in TOML either a string or an
/// integer number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse_byte_size(text).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_byte_size(self.0))
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl serde::de::Visitor<'_> for SizeVisitor {
            type Value = ByteSize;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"64 MiB\" or a number of bytes")
            }

            fn visit_u64<E: serde::de::Error>(self, bytes: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(bytes))
            }

            fn visit_i64<E: serde::de::Error>(self, bytes: i64) -> Result<ByteSize, E> {
                u64::try_from(bytes)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("{bytes} is not a size: it is negative")))
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ByteSize, E> {
                text.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_form() {
        assert_eq!(parse_byte_size("1048576"), Ok(1_048_576));
        assert_eq!(parse_byte_size("64 MiB"), Ok(64 << 20));
        assert_eq!(parse_byte_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_byte_size("256MB"), Ok(256_000_000));
        assert_eq!(parse_byte_size("256 mb"), Ok(256_000_000));
        assert_eq!(parse_byte_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_byte_size("2 GB"), Ok(2_000_000_000));
        assert_eq!(parse_byte_size("10 KB"), Ok(10_000));
        assert_eq!(parse_byte_size("10 KiB"), Ok(10_240));
        assert_eq!(parse_byte_size("7 B"), Ok(7));
        assert_eq!(parse_byte_size("1 TiB"), Ok(1 << 40));
    }

    #[test]
    fn refuses_bad_forms_with_reasons() {
        let err = parse_byte_size("lots").unwrap_err();
        assert!(
            err.starts_with("\"lots\" is not a size: use an integer"),
            "{err}"
        );
        let err = parse_byte_size("64 MiBs").unwrap_err();
        assert!(err.contains("unknown unit \"MiBs\""), "{err}");
        let err = parse_byte_size("1.5 GiB").unwrap_err();
        assert!(err.contains("whole numbers"), "{err}");
        let err = parse_byte_size("").unwrap_err();
        assert!(err.contains("use an integer"), "{err}");
        let err = parse_byte_size("99999999 TiB").unwrap_err();
        assert!(err.contains("too large"), "{err}");
    }

    #[test]
    fn formats_and_deserializes() {
        assert_eq!(format_byte_size(64 << 20), "64 MiB");
        assert_eq!(format_byte_size(1000), "1000 B");
        assert_eq!(ByteSize(1 << 30).to_string(), "1 GiB");

        #[derive(serde::Deserialize)]
        struct Holder {
            a: ByteSize,
            b: ByteSize,
        }
        let holder: Holder = toml::from_str("a = \"64 MiB\"\nb = 4096").unwrap();
        assert_eq!((holder.a.0, holder.b.0), (64 << 20, 4096));
        assert!(toml::from_str::<Holder>("a = -1\nb = 1").is_err());
    }
}
