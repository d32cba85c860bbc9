//! `strftime_now(format)` for chat templates (Llama-style templates print today's date): a small C
//! `strftime` over the current UTC time. Formatting only; registering it with minijinja is chat_template.rs.

use std::time::{SystemTime, UNIX_EPOCH};

/// A broken-down UTC time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CivilTime {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
    /// 1..=366
    pub day_of_year: u32,
}

impl CivilTime {
    /// UTC time of `seconds` since the Unix epoch.
    pub fn from_unix(seconds: i64) -> Self {
        let days = seconds.div_euclid(86_400);
        let secs_of_day = seconds.rem_euclid(86_400) as u32;
        let (year, month, day) = civil_from_days(days);
        // 1970-01-01 was a Thursday (weekday 3 counting from Monday = 0).
        let weekday = (days + 3).rem_euclid(7) as u32;
        let day_of_year = (days - days_from_civil(year, 1, 1) + 1) as u32;
        Self {
            year,
            month,
            day,
            hour: secs_of_day / 3600,
            minute: secs_of_day / 60 % 60,
            second: secs_of_day % 60,
            weekday,
            day_of_year,
        }
    }

    pub fn now_utc() -> Self {
        let seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Self::from_unix(seconds)
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// C `strftime` for the directives templates use (`%Y %m %d %H %M %S %y %B %b %A %a %j %p %I %e %%`,
/// and glibc's `%-d` style unpadded forms). Unknown directives are copied through, as glibc does.
/// `%Z`/`%z` print nothing, like Python's for the naive `datetime.now()`.
pub(crate) fn strftime(format: &str, t: &CivilTime) -> String {
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.peek() == Some(&'-');
        if unpadded {
            chars.next();
        }
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        let number = |n: u32, width: usize| {
            if unpadded {
                n.to_string()
            } else {
                format!("{n:0width$}")
            }
        };
        let hour12 = match t.hour % 12 {
            0 => 12,
            h => h,
        };
        let text = match directive {
            'Y' => t.year.to_string(),
            'y' => number(t.year.rem_euclid(100) as u32, 2),
            'm' => number(t.month, 2),
            'd' => number(t.day, 2),
            'e' => format!("{:>2}", t.day),
            'H' => number(t.hour, 2),
            'I' => number(hour12, 2),
            'M' => number(t.minute, 2),
            'S' => number(t.second, 2),
            'j' => number(t.day_of_year, 3),
            'p' => if t.hour < 12 { "AM" } else { "PM" }.to_string(),
            'B' => MONTHS[(t.month - 1) as usize % 12].to_string(),
            'b' | 'h' => MONTHS[(t.month - 1) as usize % 12][..3].to_string(),
            'A' => WEEKDAYS[t.weekday as usize % 7].to_string(),
            'a' => WEEKDAYS[t.weekday as usize % 7][..3].to_string(),
            'F' => format!("{}-{:02}-{:02}", t.year, t.month, t.day),
            'T' => format!("{:02}:{:02}:{:02}", t.hour, t.minute, t.second),
            'Z' | 'z' => String::new(),
            '%' => "%".to_string(),
            other => {
                let mut raw = String::from(if unpadded { "%-" } else { "%" });
                raw.push(other);
                raw
            }
        };
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_time_of_known_instants() {
        // 2024-02-29T13:05:09Z, a Thursday, day 60 of a leap year.
        let t = CivilTime::from_unix(1_709_211_909);
        assert_eq!((t.year, t.month, t.day), (2024, 2, 29));
        assert_eq!((t.hour, t.minute, t.second), (13, 5, 9));
        assert_eq!((t.weekday, t.day_of_year), (3, 60));
        let epoch = CivilTime::from_unix(0);
        assert_eq!(
            (epoch.year, epoch.month, epoch.day, epoch.weekday),
            (1970, 1, 1, 3)
        );
        let before = CivilTime::from_unix(-1);
        assert_eq!(
            (before.year, before.month, before.day, before.hour),
            (1969, 12, 31, 23)
        );
        let y2k_end = CivilTime::from_unix(978_307_199); // 2000-12-31T23:59:59Z, day 366, Sunday
        assert_eq!((y2k_end.day_of_year, y2k_end.weekday), (366, 6));
    }

    #[test]
    fn formats_like_python() {
        let t = CivilTime::from_unix(1_709_211_909);
        // Python: datetime(2024, 2, 29, 13, 5, 9).strftime(...)
        assert_eq!(strftime("%d %b %Y", &t), "29 Feb 2024");
        assert_eq!(
            strftime("%A, %B %-d, %Y %I:%M %p", &t),
            "Thursday, February 29, 2024 01:05 PM"
        );
        assert_eq!(
            strftime("%Y-%m-%dT%H:%M:%S %j %y %% %q", &t),
            "2024-02-29T13:05:09 060 24 % %q"
        );
    }
}
