//! Sorting a failure into an [`Outcome`]: HTTP statuses, `std::io` errors, and the
//! delay a Retry-After header asks for (delay-seconds or an HTTP-date).

use super::Outcome;
use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Sorts an HTTP response status: 408 (request timeout), 429 (too many requests) and
/// every 5xx are retryable, carrying `retry_after` (the parsed Retry-After header, if
/// any); 400, 403, 422 and every other 4xx are permanent.
///
/// Statuses that are not failures (1xx, 2xx, 3xx) and numbers that are not statuses give
/// [`Outcome::Permanent`] too, so a success passed here by mistake is never retried: check
/// for success before classifying.
///
/// ```
/// use std::time::Duration;
/// use weir_core::retry::{Outcome, classify_http};
/// let wait = Some(Duration::from_secs(2));
/// assert_eq!(classify_http(429, wait), Outcome::Retryable { retry_after: wait });
/// assert_eq!(classify_http(422, wait), Outcome::Permanent);
/// ```
pub fn classify_http(status: u16, retry_after: Option<Duration>) -> Outcome {
    match status {
        408 | 429 | 500..=599 => Outcome::Retryable { retry_after },
        _ => Outcome::Permanent,
    }
}

/// Sorts an I/O error: timeouts, refused, reset, aborted or missing connections, broken
/// pipes, interruptions, would-block and unexpected end of file are retryable (without a
/// Retry-After); every other kind is permanent.
///
/// ```
/// use std::io::{Error, ErrorKind};
/// use weir_core::retry::{Outcome, classify_io};
/// let reset = Error::from(ErrorKind::ConnectionReset);
/// assert_eq!(classify_io(&reset), Outcome::Retryable { retry_after: None });
/// assert_eq!(classify_io(&Error::from(ErrorKind::PermissionDenied)), Outcome::Permanent);
/// ```
pub fn classify_io(e: &io::Error) -> Outcome {
    use io::ErrorKind::*;
    match e.kind() {
        TimedOut | ConnectionReset | ConnectionAborted | ConnectionRefused | BrokenPipe
        | Interrupted | WouldBlock | UnexpectedEof | NotConnected => {
            Outcome::Retryable { retry_after: None }
        }
        _ => Outcome::Permanent,
    }
}

/// Parses a Retry-After header value: delay-seconds (`"120"`: only ASCII digits, with
/// optional surrounding spaces or tabs) or an IMF-fixdate HTTP-date
/// (`"Wed, 21 Oct 2015 07:28:00 GMT"`), which is read relative to `now`. A date at or
/// before `now` gives [`Duration::ZERO`]. Anything else gives `None` — signs, fractions,
/// numbers beyond `u64`, impossible dates and the obsolete RFC 850 and asctime date
/// formats — and the caller falls back to its backoff.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use weir_core::retry::parse_retry_after;
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_450); // 07:27:30 GMT that day
/// assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
/// assert_eq!(
///     parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
///     Some(Duration::from_secs(30))
/// );
/// assert_eq!(parse_retry_after("soon", now), None);
/// ```
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim_matches([' ', '\t']);
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok().map(Duration::from_secs);
    }
    let secs = parse_imf_fixdate(value)?;
    let at = if secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
    }?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Seconds since the Unix epoch of an IMF-fixdate (`"Sun, 06 Nov 1994 08:49:37 GMT"`,
/// exactly 29 characters, case-sensitive). The day name must be a day name but need not
/// match the date; second 60 (a leap second) is accepted.
fn parse_imf_fixdate(s: &str) -> Option<i64> {
    const DAYS: [&[u8]; 7] = [b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun"];
    const MONTHS: [&[u8]; 12] = [
        b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
        b"Dec",
    ];
    let b = s.as_bytes();
    if b.len() != 29
        || !DAYS.contains(&&b[0..3])
        || &b[3..5] != b", "
        || b[7] != b' '
        || b[11] != b' '
        || b[16] != b' '
        || b[19] != b':'
        || b[22] != b':'
        || &b[25..] != b" GMT"
    {
        return None;
    }
    let day = digits(&b[5..7])?;
    let month = MONTHS.iter().position(|m| *m == &b[8..11])? as i64 + 1;
    let year = digits(&b[12..16])?;
    let (hour, minute, second) = (
        digits(&b[17..19])?,
        digits(&b[20..22])?,
        digits(&b[23..25])?,
    );
    if day == 0 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// The value of a run of ASCII digits.
fn digits(b: &[u8]) -> Option<i64> {
    b.iter().try_fold(0i64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + i64::from(c - b'0'))
    })
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the proleptic Gregorian date `year-month-day` (Howard
/// Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn retryable() -> Outcome {
        Outcome::Retryable { retry_after: None }
    }

    #[test]
    fn http_statuses_sort_into_retryable_and_permanent() {
        let wait = Some(Duration::from_secs(3));
        let retry = Outcome::Retryable { retry_after: wait };
        for status in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify_http(status, wait), retry, "{status}");
        }
        assert_eq!(classify_http(503, None), retryable());
        for status in [400, 401, 403, 404, 409, 410, 422, 499] {
            assert_eq!(classify_http(status, wait), Outcome::Permanent, "{status}");
        }
        // Not failures (documented): permanent, so never retried by mistake.
        for status in [0, 100, 200, 204, 301, 304, 600, u16::MAX] {
            assert_eq!(classify_http(status, wait), Outcome::Permanent, "{status}");
        }
    }

    #[test]
    fn retry_after_parses_seconds_and_http_dates() {
        // Wed, 21 Oct 2015 07:27:30 GMT.
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_450);
        let secs = Duration::from_secs;
        assert_eq!(parse_retry_after("120", now), Some(secs(120)));
        assert_eq!(parse_retry_after(" 5 ", now), Some(secs(5)));
        assert_eq!(parse_retry_after("\t0", now), Some(Duration::ZERO));
        for garbage in [
            "-1",
            "+5",
            "1.5",
            "abc",
            "",
            "  ",
            "5s",
            "99999999999999999999",
        ] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(secs(30))
        );
        // Relative to `now` to the nanosecond.
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now + MS(250)),
            Some(MS(29_750))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:27:30 GMT", now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
            Some(Duration::ZERO)
        );
        // Dates across months, leap years and centuries.
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:01 GMT", UNIX_EPOCH),
            Some(secs(1))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", UNIX_EPOCH),
            Some(secs(784_111_777))
        );
        assert_eq!(
            parse_retry_after("Fri, 01 Jan 2100 00:00:00 GMT", UNIX_EPOCH),
            Some(secs(4_102_444_800))
        );
        assert_eq!(
            parse_retry_after("Mon, 29 Feb 2016 00:00:00 GMT", UNIX_EPOCH),
            Some(secs(1_456_704_000))
        );
        for bad in [
            "Wed, 32 Oct 2015 07:28:00 GMT",
            "Wed, 00 Oct 2015 07:28:00 GMT",
            "Wed, 21 Foo 2015 07:28:00 GMT",
            "Sun, 29 Feb 2015 07:28:00 GMT",
            "Sat, 31 Apr 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 24:00:00 GMT",
            "Wed, 21 Oct 2015 07:60:00 GMT",
            "Wed, 21 Oct 2015 07:28:00 UTC",
            "wed, 21 Oct 2015 07:28:00 GMT",
            "Wed, 21 oct 2015 07:28:00 GMT",
            "Wed, 21 Oct 15 07:28:00 GMT",
            "Wed 21 Oct 2015 07:28:00 GMT",
            "Wed, 21 Oct 2015 07:28 GMT",
            "Wed, 2a Oct 2015 07:28:00 GMT",
            "Wednesday, 21-Oct-15 07:28:00 GMT",
            "Wed Oct 21 07:28:00 2015",
            "Wed, 21 Oct 2015 07:28:00 GMT junk",
        ] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }

    #[test]
    fn io_errors_sort_into_retryable_and_permanent() {
        use io::ErrorKind::*;
        for kind in [
            TimedOut,
            ConnectionReset,
            ConnectionAborted,
            ConnectionRefused,
            BrokenPipe,
            Interrupted,
            WouldBlock,
            UnexpectedEof,
            NotConnected,
        ] {
            assert_eq!(classify_io(&io::Error::from(kind)), retryable(), "{kind:?}");
        }
        for kind in [
            NotFound,
            PermissionDenied,
            InvalidInput,
            InvalidData,
            AlreadyExists,
            Unsupported,
            Other,
        ] {
            assert_eq!(
                classify_io(&io::Error::from(kind)),
                Outcome::Permanent,
                "{kind:?}"
            );
        }
    }
}
