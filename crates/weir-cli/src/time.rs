//! Formatting Unix timestamps (milliseconds) as UTC RFC 3339 text.
//!
//! Owns only the calendar arithmetic (Howard Hinnant's `civil_from_days`), so that the CLI
//! needs no date-time crate for two timestamps. Never reads the clock.

/// `2024-05-01T12:00:00Z` for a time in milliseconds since the Unix epoch (UTC).
pub fn format_unix_ms(ms: u64) -> String {
    let (date, secs_of_day) = split(ms);
    format!("{date}T{}Z", clock(secs_of_day))
}

/// `2024-05-01T12:00:00.123Z`: like [`format_unix_ms`] with milliseconds.
pub fn format_unix_ms_precise(ms: u64) -> String {
    let (date, secs_of_day) = split(ms);
    format!("{date}T{}.{:03}Z", clock(secs_of_day), ms % 1000)
}

/// The date (`YYYY-MM-DD`) and the seconds since midnight.
fn split(ms: u64) -> (String, u64) {
    let secs = ms / 1000;
    let days = secs / 86_400;
    let (y, m, d) = civil_from_days(days);
    (format!("{y:04}-{m:02}-{d:02}"), secs % 86_400)
}

fn clock(secs_of_day: u64) -> String {
    let (h, min, s) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    format!("{h:02}:{min:02}:{s:02}")
}

/// Year, month (1–12) and day (1–31) of the day `days` after 1970-01-01 (proleptic
/// Gregorian calendar).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(format_unix_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_unix_ms_precise(1_714_564_800_123),
            "2024-05-01T12:00:00.123Z"
        );
        // leap day, end of a day
        assert_eq!(format_unix_ms(1_709_251_199_999), "2024-02-29T23:59:59Z");
        assert_eq!(format_unix_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(format_unix_ms(4_102_444_800_000), "2100-01-01T00:00:00Z");
    }

    #[test]
    fn every_day_follows_the_previous_one() {
        let mut prev = civil_from_days(0);
        for day in 1..200_000 {
            let next = civil_from_days(day);
            let (y, m, d) = prev;
            let ok = next == (y, m, d + 1) || next == (y, m + 1, 1) || next == (y + 1, 1, 1);
            assert!(ok, "day {day}: {prev:?} -> {next:?}");
            prev = next;
        }
    }
}
