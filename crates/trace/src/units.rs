//! Human sizes and durations in configs and on the command line (`4KiB`, `512b`, `10GiB`,
//! `1.5s`, `370min`), parsed strictly with messages that say what was expected.

/// Parses a block size (a trace's object size, a cache block): [`parse_size`], from 1 byte
/// to 1 GiB (a division by it, or a u32 of it, is never 0).
pub fn parse_block_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if !(1..=1 << 30).contains(&v) {
        return Err(format!("`{s}`: a block size is 1 byte to 1GiB"));
    }
    Ok(v)
}

/// Parses a byte size: a number with an optional unit `b`, `B`, `K`/`KB`/`KiB`, `M`, `G`,
/// `T` (all binary multiples; `kB`-style decimal units are not accepted to avoid ambiguity).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("`{s}`: a size cannot be negative"));
    }
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mul: u64 = match unit.trim() {
        "" | "b" | "B" => 1,
        "K" | "KB" | "KiB" | "k" => 1 << 10,
        "M" | "MB" | "MiB" => 1 << 20,
        "G" | "GB" | "GiB" => 1 << 30,
        "T" | "TB" | "TiB" => 1 << 40,
        u => return Err(format!("`{s}`: unknown size unit `{u}` (use b, KiB, MiB, GiB or TiB)")),
    };
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a size like 4KiB or 10GiB"))?;
    let bytes = v * mul as f64;
    if !(bytes.is_finite() && (0.0..1.8e19).contains(&bytes)) || bytes.fract() != 0.0 {
        return Err(format!("`{s}` is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// Parses a duration into nanoseconds: a number with unit `ns`, `us`, `ms`, `s`, `min`, `h`.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mul: f64 = match unit.trim() {
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "" => 1e9,
        "min" | "m" => 60e9,
        "h" => 3600e9,
        u => return Err(format!("`{s}`: unknown time unit `{u}` (use ns, us, ms, s, min or h)")),
    };
    let v: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration like 10s or 370min"))?;
    Ok((v * mul).round() as u64)
}

/// Formats bytes with the largest binary unit that keeps the number ≥ 1 (`4.00 GiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// Parses a percentage (`10%`, `10`, `0.5%`) into a fraction.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim().trim_end_matches('%');
    let v: f64 = t.parse().map_err(|_| format!("`{s}` is not a percentage like 10%"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("`{s}` is outside 0%..100%"));
    }
    Ok(v / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("512b"), Ok(512));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("7"), Ok(7));
        assert!(parse_size("4 parsecs").unwrap_err().contains("unit"));
        assert!(parse_size("0.3b").is_err());
        // a negative size is named as one, not as an unknown unit.
        assert!(parse_size("-1MiB").unwrap_err().contains("negative"));
        assert_eq!(parse_block_size("4KiB"), Ok(4096));
        assert_eq!(parse_block_size("1"), Ok(1));
        assert_eq!(parse_block_size("1GiB"), Ok(1 << 30), "the largest");
        assert!(parse_block_size("99999999999999999999").is_err(), "past u64");
        for bad in ["0", "1073741825", "2GiB"] {
            assert!(parse_block_size(bad).unwrap_err().contains("block size"), "{bad}");
        }
        assert_eq!(format_size(4 << 30), "4.00 GiB");
    }

    #[test]
    fn durations_and_percent() {
        assert_eq!(parse_duration_ns("370min"), Ok(370 * 60 * 1_000_000_000));
        assert_eq!(parse_duration_ns("1.5s"), Ok(1_500_000_000));
        assert!(parse_duration_ns("3 fortnights").is_err());
        assert_eq!(parse_percent("10%"), Ok(0.1));
        assert!(parse_percent("120%").is_err());
    }
}
