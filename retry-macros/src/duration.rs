//! Duration literals of the attribute: one or more `<number><unit>` pieces,
//! such as `"250ms"`, `"2s"`, `"1.5s"`, `"1m"` or `"1m30s"`.
//!
//! Units: `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`. Numbers may have a decimal
//! part; the result is exact to the nanosecond (extra digits are an error, not
//! silently rounded).

const UNITS: &[(&str, u64)] = &[
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// The literal in nanoseconds, or why it is malformed.
pub(crate) fn parse(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("expected a number and a unit, such as \"250ms\" or \"2s\"".into());
    }
    let mut rest = s;
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() {
            return Err(format!(
                "expected a number before {after:?}; a duration looks like \"250ms\" or \"1.5s\""
            ));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit = unit.trim();
        if unit.is_empty() {
            return Err(format!(
                "{num} has no unit: add one of ns, us, ms, s, m, h (e.g. \"{num}ms\")"
            ));
        }
        let Some((_, scale)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(format!("unknown unit {unit:?}: use ns, us, ms, s, m or h"));
        };
        total = total
            .checked_add(scaled(num, *scale)?)
            .ok_or_else(too_long)?;
        rest = next.trim_start();
    }
    Ok(total)
}

fn too_long() -> String {
    "the duration does not fit in 2^64 nanoseconds (about 584 years)".into()
}

/// `num` (decimal, possibly with a fraction) times `scale` nanoseconds, exactly.
fn scaled(num: &str, scale: u64) -> Result<u64, String> {
    let num = num.replace('_', "");
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num.as_str(), ""),
    };
    if frac.contains('.') || (int.is_empty() && frac.is_empty()) {
        return Err(format!("{num:?} is not a number"));
    }
    let int: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| too_long())?
    };
    let mut nanos = int.checked_mul(scale).ok_or_else(too_long)?;
    if !frac.is_empty() {
        let digits = u32::try_from(frac.len()).map_err(|_| too_long())?;
        let denom = 10u64
            .checked_pow(digits)
            .ok_or_else(|| format!("{num} has more decimals than a nanosecond can express"))?;
        let f: u64 = frac
            .parse()
            .map_err(|_| format!("{num:?} is not a number"))?;
        let part = u128::from(f) * u128::from(scale);
        if part % u128::from(denom) != 0 {
            return Err(format!(
                "{num} has more decimals than a nanosecond can express"
            ));
        }
        let part = u64::try_from(part / u128::from(denom)).map_err(|_| too_long())?;
        nanos = nanos.checked_add(part).ok_or_else(too_long)?;
    }
    Ok(nanos)
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn accepted() {
        assert_eq!(parse("250ms"), Ok(250_000_000));
        assert_eq!(parse("2s"), Ok(2_000_000_000));
        assert_eq!(parse("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse("1m"), Ok(60_000_000_000));
        assert_eq!(parse("1m30s"), Ok(90_000_000_000));
        assert_eq!(parse("1h 2m"), Ok(3_720_000_000_000));
        assert_eq!(parse("100us"), Ok(100_000));
        assert_eq!(parse("7µs"), Ok(7_000));
        assert_eq!(parse("10ns"), Ok(10));
        assert_eq!(parse("0s"), Ok(0));
        assert_eq!(parse("1_000ms"), Ok(1_000_000_000));
        assert_eq!(parse(".5s"), Ok(500_000_000));
    }

    #[test]
    fn rejected() {
        for bad in [
            "",
            "2x",
            "2",
            "s",
            "1.5.5s",
            "ms5",
            "1.0000000001s",
            "99999999999h",
            "1 sec",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
