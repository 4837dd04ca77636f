//! Spark's decimal arithmetic for `sum` and `avg` of `DECIMAL(p,s)`.
//!
//! Why it exists: revenue is money, and users compare our totals with
//! Spark's to the cent. Sums are exact 128-bit integers checked against the
//! result precision (Spark 4 runs with ANSI mode on: an overflow is an
//! error, not a null). An average is Spark's
//! `(sum / CAST(count AS DECIMAL(20,0))) CAST AS DECIMAL(p+4, s+4)`, which
//! rounds three times, each HALF_UP: the division to 38 significant digits
//! (`MathContext(38, HALF_UP)`), that quotient to the scale of the division's
//! result type (Spark's precision-loss rule), then to the average's scale.
//! The rounding is reproduced step by step on exact integers.

/// Spark's `DecimalType.MAX_PRECISION`.
pub(super) const MAX_PRECISION: u8 = 38;
/// Spark's `DecimalType.MINIMUM_ADJUSTED_SCALE`.
const MINIMUM_ADJUSTED_SCALE: i32 = 6;

/// `10^n` for `n <= 38`.
pub(super) fn pow10(n: u32) -> u128 {
    10u128.pow(n)
}

/// Whether `v` has at most `precision` digits.
pub(super) fn fits(v: i128, precision: u8) -> bool {
    v.unsigned_abs() < pow10(u32::from(precision.min(MAX_PRECISION)))
}

/// Spark's result type of `sum(DECIMAL(p,s))`: `DECIMAL(min(38, p+10), s)`.
pub(super) fn sum_type(precision: u8, scale: i8) -> (u8, i8) {
    (precision.saturating_add(10).min(MAX_PRECISION), scale)
}

/// Spark's result type of `avg(DECIMAL(p,s))`:
/// `DECIMAL(min(38, p+4), min(38, s+4))`.
pub(super) fn avg_type(precision: u8, scale: i8) -> (u8, i8) {
    (
        precision.saturating_add(4).min(MAX_PRECISION),
        scale.saturating_add(4).min(MAX_PRECISION as i8),
    )
}

/// The scale of Spark's `DECIMAL(p1,s1) / DECIMAL(20,0)` with precision
/// loss allowed (`spark.sql.decimalOperations.allowPrecisionLoss`, default).
fn division_scale(p1: u8, s1: i8) -> i32 {
    let (p1, s1, p2, s2) = (i32::from(p1), i32::from(s1), 20, 0);
    let int_digits = p1 - s1 + s2;
    let scale = MINIMUM_ADJUSTED_SCALE.max(s1 + p2 + 1);
    let precision = int_digits + scale;
    if precision <= i32::from(MAX_PRECISION) {
        scale
    } else {
        let int_digits = precision - scale;
        let min_scale = scale.min(MINIMUM_ADJUSTED_SCALE);
        (i32::from(MAX_PRECISION) - int_digits).max(min_scale)
    }
}

/// `round_half_up(v / 10^d)` for a magnitude `v`.
fn shift_down(v: u128, d: u32) -> u128 {
    if d == 0 {
        return v;
    }
    if d > 38 {
        // v < 2^128 < 10^39 / 2: the quotient rounds to 0.
        return 0;
    }
    let p = pow10(d);
    let (q, r) = (v / p, v % p);
    // r < p <= 10^38, so 2r fits in u128.
    if r * 2 >= p { q + 1 } else { q }
}

/// Rescales a magnitude from scale `from` to scale `to` (HALF_UP when
/// dropping digits); `None` when it would not fit 38 digits.
fn rescale(v: u128, from: i32, to: i32) -> Option<u128> {
    let out = if from > to {
        shift_down(v, (from - to) as u32)
    } else {
        let d = (to - from) as u32;
        if d > 38 {
            if v == 0 {
                return Some(0);
            }
            return None;
        }
        v.checked_mul(pow10(d))?
    };
    (out < pow10(38)).then_some(out)
}

/// Spark's `avg` of a decimal column from its buffer: `sum` at scale
/// `scale` (type `DECIMAL(sum_precision, scale)`) over `count` non-null
/// values, as `DECIMAL(result_precision, result_scale)`. `Ok(None)` when
/// `count` is 0; `Err(())` when the result overflows its type.
pub(super) fn avg(
    sum: i128,
    count: i64,
    sum_precision: u8,
    scale: i8,
    result: (u8, i8),
) -> Result<Option<i128>, ()> {
    let Ok(count) = u128::try_from(count) else {
        return Err(());
    };
    if count == 0 {
        return Ok(None);
    }
    let negative = sum < 0;
    let magnitude = sum.unsigned_abs();

    // Step 1: |sum| / count rounded to 38 significant digits. Long division
    // produces digits until the quotient has 38 of them; `shift` counts the
    // fractional digits generated beyond `scale`.
    let mut q = magnitude / count;
    let mut r = magnitude % count;
    let mut shift: i32 = 0;
    let limit = pow10(37);
    if magnitude != 0 {
        while q < limit {
            // r < count < 2^63, so r * 10 fits; q < 10^37, so q * 10 fits.
            let t = r * 10;
            q = q * 10 + t / count;
            r = t % count;
            shift += 1;
        }
    }
    if r * 2 >= count && magnitude != 0 {
        q += 1;
    }
    let q_scale = i32::from(scale) + shift;

    // Step 2: to the scale of the division's result type (precision 38).
    let t = division_scale(sum_precision, scale);
    let q = rescale(q, q_scale, t).ok_or(())?;

    // Step 3: the cast to the average's type.
    let (result_precision, result_scale) = result;
    let q = rescale(q, t, i32::from(result_scale)).ok_or(())?;
    if q >= pow10(u32::from(result_precision.min(MAX_PRECISION))) {
        return Err(());
    }
    let q = q as i128;
    Ok(Some(if negative { -q } else { q }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spark_types() {
        assert_eq!(sum_type(12, 2), (22, 2));
        assert_eq!(sum_type(30, 5), (38, 5));
        assert_eq!(avg_type(12, 2), (16, 6));
        assert_eq!(avg_type(36, 36), (38, 38));
        // DECIMAL(22,2) / DECIMAL(20,0): precision 43 > 38, scale cut to 18.
        assert_eq!(division_scale(22, 2), 18);
        assert_eq!(division_scale(12, 2), 23);
    }

    #[test]
    fn avg_rounds_half_up() {
        let avg12 = |sum, count| avg(sum, count, 22, 2, (16, 6));
        // 10.00 / 3 = 3.333333…
        assert_eq!(avg12(1000, 3), Ok(Some(3_333_333)));
        // 20.00 / 3 = 6.666666666… → 6.666667
        assert_eq!(avg12(2000, 3), Ok(Some(6_666_667)));
        assert_eq!(avg12(-2000, 3), Ok(Some(-6_666_667)));
        // 0.01 / 8 = 0.00125 exactly.
        assert_eq!(avg12(1, 8), Ok(Some(1_250)));
        // 0.01 / 16 = 0.000625 exactly.
        assert_eq!(avg12(1, 16), Ok(Some(625)));
        // 0.01 / 32 = 0.0003125 → HALF_UP → 0.000313
        assert_eq!(avg12(1, 32), Ok(Some(313)));
        assert_eq!(avg12(-1, 32), Ok(Some(-313)));
        // Spark 4.0.5's answers for these groups of DECIMAL(12,2) values.
        assert_eq!(avg12(1_999_999_999_999, 3), Ok(Some(6_666_666_666_663_333)));
        assert_eq!(avg12(191_368, 7), Ok(Some(273_382_857)));
        assert_eq!(avg12(701, 7), Ok(Some(1_001_429)));
        assert_eq!(avg12(0, 5), Ok(Some(0)));
        assert_eq!(avg12(5, 0), Ok(None));
        // The largest DECIMAL(12,2) over one row.
        let max = (pow10(12) - 1) as i128;
        assert_eq!(avg12(max, 1), Ok(Some(max * 10_000)));
    }

    #[test]
    fn fits_precision() {
        assert!(fits(99, 2));
        assert!(!fits(100, 2));
        assert!(fits(-99, 2));
        assert!(fits((pow10(38) - 1) as i128, 38));
        assert!(!fits(pow10(38) as i128, 38));
    }
}
