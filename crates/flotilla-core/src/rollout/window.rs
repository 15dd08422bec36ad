//! Release windows: `{days: [mon, fri], start: "02:00", end: "05:00", tz: Europe/Berlin}`.
//!
//! A window is read in local wall-clock time of its zone, so "02:00 to 05:00" stays
//! that across daylight-saving changes (on the night the clocks skip 02:00, it opens at
//! 03:00). A window whose end is before its start runs past midnight and belongs to the
//! day it starts on. Zones come from the IANA database compiled into jiff, so a window
//! means the same on every machine.

use std::fmt;

use jiff::civil::{Date, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Millis;
use crate::model::{Weekday, WindowSpec};

/// A checked window. Times are minutes after local midnight.
#[derive(Clone, Debug)]
pub struct Window {
    /// The days it opens on; empty: every day.
    pub days: Vec<Weekday>,
    pub start: u16,
    /// 1..=1440; before `start` when the window runs past midnight.
    pub end: u16,
    /// The IANA zone name, `UTC` by default.
    pub tz: String,
    zone: TimeZone,
}

impl Window {
    /// Checks a window as written; the error says what is wrong with it.
    pub fn from_spec(spec: &WindowSpec) -> Result<Window, String> {
        let start = parse_clock(&spec.start, false)
            .ok_or_else(|| format!("start {:?} is not a time of day (HH:MM)", spec.start))?;
        let end = parse_clock(&spec.end, true)
            .ok_or_else(|| format!("end {:?} is not a time of day (HH:MM, or 24:00)", spec.end))?;
        if start == end {
            return Err(format!(
                "the window opens and closes at {}; give different start and end times",
                spec.start
            ));
        }
        let tz = spec.tz.clone().unwrap_or_else(|| "UTC".to_string());
        let zone = TimeZone::get(&tz).map_err(|_| {
            format!("unknown time zone {tz:?}; give an IANA name such as Europe/Berlin or UTC")
        })?;
        let mut days = spec.days.clone();
        days.sort();
        days.dedup();
        Ok(Window {
            days,
            start,
            end,
            tz,
            zone,
        })
    }

    fn opens_on(&self, date: Date) -> bool {
        self.days.is_empty() || self.days.contains(&weekday(date))
    }

    /// Whether the instant `at` lies inside the window.
    pub fn contains(&self, at: Millis) -> bool {
        let Ok(timestamp) = Timestamp::from_millisecond(at) else {
            return false;
        };
        let local = timestamp.to_zoned_datetime(self.zone.clone());
        let minute = local.hour() as u16 * 60 + local.minute() as u16;
        let date = local.date();
        if self.start < self.end {
            self.opens_on(date) && (self.start..self.end).contains(&minute)
        } else {
            (self.opens_on(date) && minute >= self.start)
                || (minute < self.end
                    && date
                        .checked_sub(1.day())
                        .is_ok_and(|yesterday| self.opens_on(yesterday)))
        }
    }

    /// The first opening at or after `at` (`at` itself when it is inside).
    pub fn next_opening(&self, at: Millis) -> Option<Millis> {
        if self.contains(at) {
            return Some(at);
        }
        let local = Timestamp::from_millisecond(at)
            .ok()?
            .to_zoned_datetime(self.zone.clone());
        let start = Time::new((self.start / 60) as i8, (self.start % 60) as i8, 0, 0).ok()?;
        (0..=7)
            .filter_map(|offset| local.date().checked_add(offset.days()).ok())
            .filter(|date| self.opens_on(*date))
            .filter_map(|date| {
                let opening = date
                    .to_datetime(start)
                    .to_zoned_datetime(self.zone.clone())
                    .ok()?;
                Some(self.first_open_minute(opening.timestamp().as_millisecond(), at))
            })
            .find(|&opening| opening > at)
    }
}

impl PartialEq for Window {
    fn eq(&self, other: &Window) -> bool {
        (&self.days, self.start, self.end, &self.tz)
            == (&other.days, other.start, other.end, &other.tz)
    }
}

impl Eq for Window {}

impl Window {
    /// A start the clocks skip (02:30 on the night they jump from 02:00 to 03:00) is
    /// placed after the gap by the zone (03:30), but the window is open from the first
    /// moment after the gap (03:00): step back to it, a minute at a time.
    fn first_open_minute(&self, mut opening: Millis, after: Millis) -> Millis {
        for _ in 0..180 {
            let earlier = opening - 60_000;
            if earlier <= after || !self.contains(earlier) {
                break;
            }
            opening = earlier;
        }
        opening
    }
}

fn weekday(date: Date) -> Weekday {
    match date.weekday() {
        jiff::civil::Weekday::Monday => Weekday::Mon,
        jiff::civil::Weekday::Tuesday => Weekday::Tue,
        jiff::civil::Weekday::Wednesday => Weekday::Wed,
        jiff::civil::Weekday::Thursday => Weekday::Thu,
        jiff::civil::Weekday::Friday => Weekday::Fri,
        jiff::civil::Weekday::Saturday => Weekday::Sat,
        jiff::civil::Weekday::Sunday => Weekday::Sun,
    }
}

/// `HH:MM` as minutes after midnight; `24:00` only where `end` allows it.
fn parse_clock(text: &str, end: bool) -> Option<u16> {
    let (hours, minutes) = text.trim().split_once(':')?;
    if hours.len() != 2 || minutes.len() != 2 {
        return None;
    }
    let hours: u16 = hours.parse().ok()?;
    let minutes: u16 = minutes.parse().ok()?;
    match (hours, minutes) {
        (24, 0) if end => Some(1440),
        (0..=23, 0..=59) => Some(hours * 60 + minutes),
        _ => None,
    }
}

fn clock(minutes: u16) -> String {
    format!("{:02}:{:02}", minutes / 60, minutes % 60)
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let days = if self.days.is_empty() {
            "every day".to_string()
        } else {
            self.days
                .iter()
                .map(|d| format!("{d:?}").to_lowercase())
                .collect::<Vec<_>>()
                .join(",")
        };
        write!(
            f,
            "{days} {}-{} {}",
            clock(self.start),
            clock(self.end),
            self.tz
        )
    }
}

impl Serialize for Window {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        WindowSpec {
            days: self.days.clone(),
            start: clock(self.start),
            end: clock(self.end),
            tz: Some(self.tz.clone()),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Window {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spec = WindowSpec::deserialize(deserializer)?;
        Window::from_spec(&spec).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(days: &[Weekday], start: &str, end: &str, tz: &str) -> Window {
        Window::from_spec(&WindowSpec {
            days: days.to_vec(),
            start: start.into(),
            end: end.into(),
            tz: Some(tz.into()),
        })
        .expect("valid window")
    }

    fn at(text: &str) -> Millis {
        text.parse::<Timestamp>()
            .expect("timestamp")
            .as_millisecond()
    }

    #[test]
    fn a_berlin_night_window_on_weekdays() {
        let w = window(
            &[
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri,
            ],
            "02:00",
            "05:00",
            "Europe/Berlin",
        );
        // Wednesday 2025-01-15: 02:00 in Berlin is 01:00 UTC (CET, +1).
        assert!(!w.contains(at("2025-01-15T00:59:59Z")));
        assert!(w.contains(at("2025-01-15T01:00:00Z")));
        assert!(w.contains(at("2025-01-15T03:59:59Z")));
        assert!(!w.contains(at("2025-01-15T04:00:00Z")));
        // In summer (CEST, +2) the same window is an hour earlier in UTC.
        assert!(w.contains(at("2025-07-16T00:00:00Z")));
        // Saturday: closed.
        assert!(!w.contains(at("2025-01-18T02:00:00Z")));
        // From Friday after the window, the next opening is Monday 02:00 Berlin.
        assert_eq!(
            w.next_opening(at("2025-01-17T12:00:00Z")),
            Some(at("2025-01-20T01:00:00Z"))
        );
        assert_eq!(
            w.next_opening(at("2025-01-15T02:00:00Z")),
            Some(at("2025-01-15T02:00:00Z"))
        );
    }

    #[test]
    fn windows_across_midnight_belong_to_their_first_day() {
        let w = window(&[Weekday::Fri], "22:00", "02:00", "UTC");
        assert!(w.contains(at("2025-01-17T23:00:00Z"))); // Friday night
        assert!(w.contains(at("2025-01-18T01:30:00Z"))); // early Saturday
        assert!(!w.contains(at("2025-01-18T23:00:00Z"))); // Saturday night
        assert!(!w.contains(at("2025-01-17T01:00:00Z"))); // early Friday: Thursday's
    }

    #[test]
    fn the_night_the_clocks_skip_the_start_opens_after_the_gap() {
        let w = window(&[], "02:30", "04:00", "Europe/Berlin");
        // 2025-03-30: 02:00 CET becomes 03:00 CEST. 03:00 CEST is 01:00 UTC.
        assert_eq!(
            w.next_opening(at("2025-03-29T12:00:00Z")),
            Some(at("2025-03-30T01:00:00Z"))
        );
        assert!(w.contains(at("2025-03-30T01:30:00Z")));
    }

    #[test]
    fn bad_windows_say_what_is_wrong() {
        let check = |start: &str, end: &str, tz: &str, expect: &str| {
            let err = Window::from_spec(&WindowSpec {
                days: vec![],
                start: start.into(),
                end: end.into(),
                tz: Some(tz.into()),
            })
            .expect_err("refused");
            assert!(err.contains(expect), "{err}");
        };
        check("2:00", "05:00", "UTC", "start \"2:00\"");
        check("02:00", "25:00", "UTC", "end \"25:00\"");
        check("02:00", "02:00", "UTC", "opens and closes");
        check("02:00", "05:00", "Europe/Berlinn", "unknown time zone");
        assert_eq!(
            window(&[], "00:00", "24:00", "UTC").to_string(),
            "every day 00:00-24:00 UTC"
        );
    }
}
