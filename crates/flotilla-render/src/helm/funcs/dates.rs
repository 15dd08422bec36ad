//! Sprig's dates. `now` is the render's time ([`Host::now_unix`]), never a clock.
//! Times are Go `time.Time` objects in UTC, which is also what "Local" means here
//! (a render has no local zone); zone names other than `UTC` and `Local` are not
//! known (no time-zone database), and read as UTC, as Go does for a name it cannot
//! load.

use std::sync::Arc;

use super::args::{arity, string_param};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Object, Value};

/// A Go `time.Time` in UTC, to the nanosecond.
#[derive(Debug, Clone, Copy)]
struct Time {
    seconds: i64,
    nanos: u32,
}

impl Time {
    fn from_value(v: &Value) -> Option<Time> {
        match v {
            Value::Object(o) if o.type_name() == "time.Time" => match o.call("UnixNano", &[]) {
                Some(Ok(Value::Int64(n))) => Some(Time {
                    seconds: n.div_euclid(1_000_000_000),
                    nanos: n.rem_euclid(1_000_000_000) as u32,
                }),
                _ => o.field("Unix").and_then(|u| match u {
                    Value::Int64(s) => Some(Time {
                        seconds: s,
                        nanos: 0,
                    }),
                    _ => None,
                }),
            },
            _ => None,
        }
    }

    fn value(self) -> Value {
        Value::Object(Arc::new(TimeObject(self)))
    }
}

#[derive(Debug)]
struct TimeObject(Time);

impl Object for TimeObject {
    fn type_name(&self) -> &str {
        "time.Time"
    }

    fn field(&self, name: &str) -> Option<Value> {
        let t = self.0;
        let civil = Civil::of(t.seconds);
        Some(match name {
            "Unix" => Value::Int64(t.seconds),
            "Year" => Value::Int(civil.year),
            "Month" => Value::Int(civil.month as i64),
            "Day" => Value::Int(civil.day as i64),
            "Hour" => Value::Int(civil.hour as i64),
            "Minute" => Value::Int(civil.minute as i64),
            "Second" => Value::Int(civil.second as i64),
            "Nanosecond" => Value::Int(i64::from(t.nanos)),
            "YearDay" => Value::Int(civil.yday as i64),
            "UTC" | "Local" => t.value(),
            "String" => Value::string(self.display()),
            _ => return None,
        })
    }

    fn call(&self, name: &str, args: &[Value]) -> Option<FuncResult> {
        match (name, args) {
            ("UnixNano", []) => Some(Ok(Value::Int64(
                self.0
                    .seconds
                    .wrapping_mul(1_000_000_000)
                    .wrapping_add(i64::from(self.0.nanos)),
            ))),
            ("Format", [Value::String(layout)]) => {
                Some(Ok(Value::string(format_time(self.0, layout))))
            }
            _ => None,
        }
    }

    /// Go's `Time.String()`.
    fn display(&self) -> String {
        format_time(self.0, "2006-01-02 15:04:05.999999999 -0700 MST")
    }
}

/// A UTC instant broken into the calendar fields Go's layouts print.
struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
    weekday: u32,
    yday: u32,
}

impl Civil {
    fn of(seconds: i64) -> Civil {
        let days = seconds.div_euclid(86_400);
        let secs = seconds.rem_euclid(86_400) as u32;
        // Days to civil date (proleptic Gregorian), after H. Hinnant's algorithm.
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const CUMULATIVE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
        let yday = CUMULATIVE[(month - 1) as usize] + day + u32::from(leap && month > 2);
        Civil {
            year,
            month,
            day,
            hour: secs / 3600,
            minute: secs / 60 % 60,
            second: secs % 60,
            weekday: (days + 4).rem_euclid(7) as u32,
            yday,
        }
    }
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
const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// The layout elements Go recognises, longest first where one is a prefix of another.
const TOKENS: &[&str] = &[
    "January",
    "Jan",
    "Monday",
    "Mon",
    "MST",
    "2006",
    "-07:00:00",
    "-0700",
    "-07:00",
    "-07",
    "Z07:00:00",
    "Z0700",
    "Z07:00",
    "Z07",
    "01",
    "02",
    "__2",
    "_2",
    "002",
    "06",
    "15",
    "1",
    "2",
    "03",
    "3",
    "04",
    "4",
    "05",
    "5",
    "PM",
    "pm",
];

/// The next layout element at the start of `layout`, with Go's special cases: a
/// fractional second (`.000`, `,999`) only before a non-digit.
fn token_at(layout: &str) -> Option<&'static str> {
    for t in TOKENS {
        if layout.starts_with(t) {
            // Go reads "Mon" only when not followed by a lower-case letter ("Month").
            if (*t == "Jan" || *t == "Mon")
                && layout
                    .strip_prefix(t)
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase()))
            {
                continue;
            }
            return Some(t);
        }
    }
    None
}

fn fraction_len(layout: &str) -> Option<(char, usize)> {
    let mut chars = layout.chars();
    let sep = chars.next()?;
    if sep != '.' && sep != ',' {
        return None;
    }
    let digit = chars.next()?;
    if digit != '0' && digit != '9' {
        return None;
    }
    let n = 1 + layout[2..].chars().take_while(|c| *c == digit).count();
    if layout[1 + n..].starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    Some((digit, n))
}

fn format_time(t: Time, layout: &str) -> String {
    let c = Civil::of(t.seconds);
    let mut out = String::new();
    let mut rest = layout;
    while !rest.is_empty() {
        if let Some((digit, n)) = fraction_len(rest) {
            let digits = format!("{:09}", t.nanos);
            let mut frac = digits[..n.min(9)].to_string();
            if digit == '9' {
                frac = frac.trim_end_matches('0').to_string();
                if !frac.is_empty() {
                    out.push(rest.chars().next().unwrap_or('.'));
                    out.push_str(&frac);
                }
            } else {
                out.push(rest.chars().next().unwrap_or('.'));
                out.push_str(&frac);
            }
            rest = &rest[1 + n..];
            continue;
        }
        let Some(token) = token_at(rest) else {
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
            continue;
        };
        let hour12 = if c.hour.is_multiple_of(12) {
            12
        } else {
            c.hour % 12
        };
        match token {
            "January" => out.push_str(MONTHS[(c.month - 1) as usize]),
            "Jan" => out.push_str(&MONTHS[(c.month - 1) as usize][..3]),
            "Monday" => out.push_str(DAYS[c.weekday as usize]),
            "Mon" => out.push_str(&DAYS[c.weekday as usize][..3]),
            "MST" => out.push_str("UTC"),
            "2006" => out.push_str(&format!("{:04}", c.year)),
            "06" => out.push_str(&format!("{:02}", c.year.rem_euclid(100))),
            "01" => out.push_str(&format!("{:02}", c.month)),
            "1" => out.push_str(&c.month.to_string()),
            "02" => out.push_str(&format!("{:02}", c.day)),
            "2" => out.push_str(&c.day.to_string()),
            "_2" => out.push_str(&format!("{:>2}", c.day)),
            "__2" => out.push_str(&format!("{:>3}", c.yday)),
            "002" => out.push_str(&format!("{:03}", c.yday)),
            "15" => out.push_str(&format!("{:02}", c.hour)),
            "03" => out.push_str(&format!("{hour12:02}")),
            "3" => out.push_str(&hour12.to_string()),
            "04" => out.push_str(&format!("{:02}", c.minute)),
            "4" => out.push_str(&c.minute.to_string()),
            "05" => out.push_str(&format!("{:02}", c.second)),
            "5" => out.push_str(&c.second.to_string()),
            "PM" => out.push_str(if c.hour >= 12 { "PM" } else { "AM" }),
            "pm" => out.push_str(if c.hour >= 12 { "pm" } else { "am" }),
            "-0700" => out.push_str("+0000"),
            "-07:00" => out.push_str("+00:00"),
            "-07" => out.push_str("+00"),
            "-07:00:00" => out.push_str("+00:00:00"),
            z if z.starts_with('Z') => out.push('Z'),
            _ => out.push_str(token),
        }
        rest = &rest[token.len()..];
    }
    out
}

/// Sprig's rule for the time argument of `date` and friends: a time, or Unix
/// seconds as a Go int or int64; anything else means now.
fn time_arg(host: &dyn Host, v: &Value) -> Time {
    match v {
        Value::Int(s) | Value::Int64(s) => Time {
            seconds: *s,
            nanos: 0,
        },
        other => Time::from_value(other).unwrap_or(Time {
            seconds: host.now_unix(),
            nanos: 0,
        }),
    }
}

pub fn now(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("now", args, 0)?;
    Ok(Time {
        seconds: host.now_unix(),
        nanos: 0,
    }
    .value())
}

fn format_in_zone(name: &str, host: &dyn Host, args: &[Value], with_zone: bool) -> FuncResult {
    arity(name, args, if with_zone { 3 } else { 2 })?;
    let layout = string_param(&args[0])?;
    if with_zone {
        string_param(&args[2])?;
    }
    Ok(Value::string(format_time(
        time_arg(host, &args[1]),
        &layout,
    )))
}

pub fn date(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    format_in_zone("date", host, args, false)
}
pub fn date_in_zone(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    format_in_zone("dateInZone", host, args, true)
}
pub fn date_in_zone_snake(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    format_in_zone("date_in_zone", host, args, true)
}

pub fn html_date(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("htmlDate", args, 1)?;
    Ok(Value::string(format_time(
        time_arg(host, &args[0]),
        "2006-01-02",
    )))
}

pub fn html_date_in_zone(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("htmlDateInZone", args, 2)?;
    string_param(&args[1])?;
    Ok(Value::string(format_time(
        time_arg(host, &args[0]),
        "2006-01-02",
    )))
}

pub fn unix_epoch(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("unixEpoch", args, 1)?;
    let t =
        Time::from_value(&args[0]).ok_or_else(|| super::args::wrong_type("time.Time", &args[0]))?;
    Ok(Value::string(t.seconds.to_string()))
}

/// Go's `time.Duration.String()` of a count of nanoseconds.
fn format_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".to_string();
    }
    let negative = nanos < 0;
    let u = nanos.unsigned_abs();
    let mut out = String::new();
    if u < 1_000_000_000 {
        let (unit, scale) = if u < 1_000 {
            ("ns", 1)
        } else if u < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        out.push_str(&fraction(u, scale));
        out.push_str(unit);
    } else {
        let hours = u / 3_600_000_000_000;
        let minutes = u / 60_000_000_000 % 60;
        let secs = u % 60_000_000_000;
        if hours > 0 {
            out.push_str(&format!("{hours}h"));
        }
        if hours > 0 || minutes > 0 {
            out.push_str(&format!("{minutes}m"));
        }
        out.push_str(&fraction(secs, 1_000_000_000));
        out.push('s');
    }
    if negative { format!("-{out}") } else { out }
}

/// `value / scale` with the fraction's trailing zeros dropped, as Go prints them.
fn fraction(value: u64, scale: u64) -> String {
    let whole = value / scale;
    let rest = value % scale;
    if rest == 0 {
        return whole.to_string();
    }
    let width = scale.to_string().len() - 1;
    let digits = format!("{rest:0width$}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Sprig's `duration`: seconds given as a string of digits or a Go `int64`; any
/// other type (a Go `int` literal included) counts as 0, as in Sprig.
pub fn duration(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("duration", args, 1)?;
    let seconds = match &args[0] {
        Value::String(s) => s.parse::<i64>().unwrap_or(0),
        Value::Int64(n) => *n,
        _ => 0,
    };
    Ok(Value::string(format_duration(
        seconds.wrapping_mul(1_000_000_000),
    )))
}

/// Go's `time.ParseDuration`, in nanoseconds.
fn parse_duration(s: &str) -> Result<i64, FuncError> {
    let invalid = || {
        FuncError::new(format!(
            "time: invalid duration {}",
            super::args::go_quote(s)
        ))
    };
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if number_len == 0 {
            return Err(invalid());
        }
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => {
                return Err(FuncError::new(format!(
                    "time: missing unit in duration {}",
                    super::args::go_quote(s)
                )));
            }
            unit => {
                return Err(FuncError::new(format!(
                    "time: unknown unit {} in duration {}",
                    super::args::go_quote(unit),
                    super::args::go_quote(s)
                )));
            }
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    if total > 9.223_372_036_854_775e18 {
        return Err(invalid());
    }
    Ok(if negative {
        -(total as i64)
    } else {
        total as i64
    })
}

fn date_modify_named(name: &str, args: &[Value], must: bool) -> FuncResult {
    arity(name, args, 2)?;
    let spec = string_param(&args[0])?;
    let Some(t) = Time::from_value(&args[1]) else {
        return Err(super::args::wrong_type("time.Time", &args[1]));
    };
    match parse_duration(&spec) {
        Ok(nanos) => {
            let total =
                i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos) + i128::from(nanos);
            Ok(Time {
                seconds: total.div_euclid(1_000_000_000) as i64,
                nanos: total.rem_euclid(1_000_000_000) as u32,
            }
            .value())
        }
        Err(e) if must => Err(e),
        Err(_) => Ok(t.value()),
    }
}

pub fn date_modify(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    date_modify_named("dateModify", args, false)
}
pub fn date_modify_snake(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    date_modify_named("date_modify", args, false)
}
pub fn must_date_modify(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    date_modify_named("mustDateModify", args, true)
}
pub fn must_date_modify_snake(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    date_modify_named("must_date_modify", args, true)
}

/// Sprig's `ago`: the time since the given time (now being the render's time),
/// rounded to the second.
pub fn ago(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("ago", args, 1)?;
    let t = time_arg(host, &args[0]);
    let seconds = host.now_unix().saturating_sub(t.seconds);
    Ok(Value::string(format_duration(
        seconds.saturating_mul(1_000_000_000),
    )))
}

/// Sprig's `durationRound`: a duration (a Go duration string, or seconds as an
/// `int64`, or the time since a time) printed coarsely: `2h`, `3d`, `1mo`, `2y`.
pub fn duration_round(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("durationRound", args, 1)?;
    let nanos: i64 = match &args[0] {
        Value::String(s) => parse_duration(s).unwrap_or(0),
        Value::Int64(n) => n.saturating_mul(1_000_000_000),
        other => match Time::from_value(other) {
            Some(t) => host
                .now_unix()
                .saturating_sub(t.seconds)
                .saturating_mul(1_000_000_000),
            None => 0,
        },
    };
    let u = nanos.unsigned_abs();
    const SECOND: u64 = 1_000_000_000;
    const MINUTE: u64 = 60 * SECOND;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    const MONTH: u64 = 30 * DAY;
    const YEAR: u64 = 365 * DAY;
    let text = if u >= YEAR {
        format!("{}y", u / YEAR)
    } else if u >= MONTH {
        format!("{}mo", u / MONTH)
    } else if u >= DAY {
        format!("{}d", u / DAY)
    } else if u >= HOUR {
        format!("{}h", u / HOUR)
    } else if u >= MINUTE {
        format!("{}m", u / MINUTE)
    } else if u >= SECOND {
        format!("{}s", u / SECOND)
    } else {
        "0s".to_string()
    };
    // Sprig rounds the magnitude: a negative duration prints as a positive one.
    Ok(Value::string(text))
}

/// Go's `time.Parse` for the numeric layout elements and month and day names, in
/// UTC; the error names what could not be read, as Go's does.
fn parse_time(layout: &str, value: &str) -> Result<Time, FuncError> {
    let fail = |rest: &str, element: &str| {
        FuncError::new(format!(
            "parsing time {} as {}: cannot parse {} as {}",
            super::args::go_quote(value),
            super::args::go_quote(layout),
            super::args::go_quote(rest),
            super::args::go_quote(element)
        ))
    };
    let (mut year, mut month, mut day, mut hour, mut minute, mut second) =
        (1i64, 1u32, 1u32, 0u32, 0u32, 0u32);
    let mut nanos = 0u32;
    let mut pm: Option<bool> = None;
    let mut l = layout;
    let mut v = value;
    let number = |v: &str, min: usize, max: usize| -> Option<(u32, usize)> {
        let n = v.bytes().take(max).take_while(u8::is_ascii_digit).count();
        if n < min {
            return None;
        }
        v[..n].parse().ok().map(|x| (x, n))
    };
    while !l.is_empty() {
        if let Some((_, n)) = fraction_len(l) {
            let digits = v
                .get(1..)
                .unwrap_or("")
                .bytes()
                .take_while(u8::is_ascii_digit)
                .count();
            if !v.starts_with(['.', ',']) || digits == 0 {
                return Err(fail(v, &l[..1 + n]));
            }
            let frac = format!("{:0<9}", &v[1..1 + digits.min(9)]);
            nanos = frac.parse().unwrap_or(0);
            v = &v[1 + digits..];
            l = &l[1 + n..];
            continue;
        }
        let Some(token) = token_at(l) else {
            let ch = l.chars().next().unwrap_or(' ');
            if !v.starts_with(ch) {
                return Err(fail(v, &l[..ch.len_utf8()]));
            }
            l = &l[ch.len_utf8()..];
            v = &v[ch.len_utf8()..];
            continue;
        };
        let (width_min, width_max) = match token {
            "2006" => (4, 4),
            "01" | "02" | "15" | "03" | "04" | "05" | "06" => (2, 2),
            "1" | "2" | "3" | "4" | "5" => (1, 2),
            "002" => (3, 3),
            _ => (0, 0),
        };
        if width_max > 0 {
            let Some((n, used)) = number(v, width_min, width_max) else {
                return Err(fail(v, token));
            };
            match token {
                "2006" => year = i64::from(n),
                "06" => year = i64::from(n) + if n >= 69 { 1900 } else { 2000 },
                "01" | "1" => month = n,
                "02" | "2" => day = n,
                "15" => hour = n,
                "03" | "3" => hour = n,
                "04" | "4" => minute = n,
                "05" | "5" => second = n,
                _ => {}
            }
            v = &v[used..];
        } else {
            match token {
                "January" | "Jan" | "Monday" | "Mon" => {
                    let names: Vec<String> = if token.starts_with('J') {
                        MONTHS
                            .iter()
                            .map(|m| {
                                if token == "Jan" {
                                    m[..3].to_string()
                                } else {
                                    m.to_string()
                                }
                            })
                            .collect()
                    } else {
                        DAYS.iter()
                            .map(|d| {
                                if token == "Mon" {
                                    d[..3].to_string()
                                } else {
                                    d.to_string()
                                }
                            })
                            .collect()
                    };
                    let Some(i) = names
                        .iter()
                        .position(|n| v.len() >= n.len() && v[..n.len()].eq_ignore_ascii_case(n))
                    else {
                        return Err(fail(v, token));
                    };
                    if token.starts_with('J') {
                        month = i as u32 + 1;
                    }
                    v = &v[names[i].len()..];
                }
                "PM" | "pm" => {
                    let upper = v.get(..2).map(str::to_ascii_uppercase);
                    match upper.as_deref() {
                        Some("PM") => pm = Some(true),
                        Some("AM") => pm = Some(false),
                        _ => return Err(fail(v, token)),
                    }
                    v = &v[2..];
                }
                "MST" => {
                    let n = v.bytes().take_while(u8::is_ascii_uppercase).count();
                    if n < 3 {
                        return Err(fail(v, token));
                    }
                    v = &v[n..];
                }
                z => {
                    if z.starts_with('Z') && v.starts_with('Z') {
                        v = &v[1..];
                    } else {
                        let shape = z.trim_start_matches(['Z', '-']);
                        let len = shape.len() + 1;
                        if v.len() < len || !v.starts_with(['+', '-']) {
                            return Err(fail(v, token));
                        }
                        v = &v[len..];
                    }
                }
            }
        }
        l = &l[token.len()..];
    }
    if !v.is_empty() {
        return Err(FuncError::new(format!(
            "parsing time {}: extra text: {}",
            super::args::go_quote(value),
            super::args::go_quote(v)
        )));
    }
    if let Some(pm) = pm {
        if hour == 12 {
            hour = 0;
        }
        if pm {
            hour += 12;
        }
    }
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return Err(FuncError::new(format!(
            "parsing time {}: day out of range",
            super::args::go_quote(value)
        )));
    }
    let days = days_from_civil(year, month, day);
    Ok(Time {
        seconds: days * 86_400 + i64::from(hour * 3600 + minute * 60 + second),
        nanos,
    })
}

/// Go's zero `time.Time` (January 1, year 1, UTC), what `toDate` gives on failure.
const ZERO_TIME: Time = Time {
    seconds: -62_135_596_800,
    nanos: 0,
};

pub fn to_date(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("toDate", args, 2)?;
    let layout = string_param(&args[0])?;
    let value = string_param(&args[1])?;
    Ok(parse_time(&layout, &value).unwrap_or(ZERO_TIME).value())
}

pub fn must_to_date(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("mustToDate", args, 2)?;
    let layout = string_param(&args[0])?;
    let value = string_param(&args[1])?;
    Ok(parse_time(&layout, &value)?.value())
}
