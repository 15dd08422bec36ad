//! A small DER writer for the exact bytes Go's `encoding/asn1` and `crypto/x509` write:
//! the certificates and keys Sprig makes are byte-for-byte in Go's layout (minimal
//! integers, Go's choice of string types, UTCTime before 2050), which a general
//! encoder with its own opinions would not guarantee.

pub const TAG_BOOLEAN: u8 = 0x01;
pub const TAG_INTEGER: u8 = 0x02;
pub const TAG_BIT_STRING: u8 = 0x03;
pub const TAG_OCTET_STRING: u8 = 0x04;
pub const TAG_NULL: u8 = 0x05;
pub const TAG_OID: u8 = 0x06;
pub const TAG_UTF8_STRING: u8 = 0x0c;
pub const TAG_PRINTABLE_STRING: u8 = 0x13;
pub const TAG_UTC_TIME: u8 = 0x17;
pub const TAG_GENERALIZED_TIME: u8 = 0x18;
pub const TAG_SEQUENCE: u8 = 0x30;
pub const TAG_SET: u8 = 0x31;

/// One element: tag, definite length, content.
pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// A constructed element (SEQUENCE, SET, explicit tag) of already encoded parts.
pub fn constructed(tag: u8, parts: &[&[u8]]) -> Vec<u8> {
    tlv(tag, &parts.concat())
}

pub fn sequence(parts: &[&[u8]]) -> Vec<u8> {
    constructed(TAG_SEQUENCE, parts)
}

/// A non-negative INTEGER from big-endian magnitude bytes, minimally encoded (a
/// leading zero byte only where the high bit would make it negative).
pub fn unsigned_integer(magnitude: &[u8]) -> Vec<u8> {
    let skip = magnitude.iter().take_while(|b| **b == 0).count();
    let trimmed = &magnitude[skip..];
    let mut content = Vec::with_capacity(trimmed.len() + 1);
    if trimmed.first().is_none_or(|b| b & 0x80 != 0) {
        content.push(0);
    }
    content.extend_from_slice(trimmed);
    tlv(TAG_INTEGER, &content)
}

/// A BIT STRING of whole bytes (no unused bits): keys and signatures.
pub fn bit_string(bytes: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(bytes.len() + 1);
    content.push(0);
    content.extend_from_slice(bytes);
    tlv(TAG_BIT_STRING, &content)
}

pub fn octet_string(bytes: &[u8]) -> Vec<u8> {
    tlv(TAG_OCTET_STRING, bytes)
}

/// A time as Go's `encoding/asn1` writes it: UTCTime for the years 1950 to 2049,
/// GeneralizedTime otherwise, to the second, in UTC. `None` for a year Go cannot
/// write either way (before 0 or after 9999).
pub fn time(unix_seconds: i64) -> Option<Vec<u8>> {
    let days = unix_seconds.div_euclid(86_400);
    let second_of_day = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (
        second_of_day / 3600,
        second_of_day / 60 % 60,
        second_of_day % 60,
    );
    let rest = format!("{month:02}{day:02}{hour:02}{minute:02}{second:02}Z");
    if (1950..2050).contains(&year) {
        Some(tlv(
            TAG_UTC_TIME,
            format!("{:02}{rest}", year % 100).as_bytes(),
        ))
    } else if (0..=9999).contains(&year) {
        Some(tlv(
            TAG_GENERALIZED_TIME,
            format!("{year:04}{rest}").as_bytes(),
        ))
    } else {
        None
    }
}

/// The proleptic Gregorian date of a day counted from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Whether Go's `encoding/asn1` writes this string as a PrintableString (else a
/// UTF8String): letters, digits, space and `'()+,-./:=?`; `*` and `&` are not.
pub fn is_printable(s: &str) -> bool {
    s.bytes().all(|b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b' ' | b'\'' | b'(' | b')' | b'+' | b',' | b'-' | b'.' | b'/' | b':' | b'=' | b'?'
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_over_127_use_the_long_form() {
        assert_eq!(tlv(0x04, &[0; 3]), vec![0x04, 3, 0, 0, 0]);
        assert_eq!(&tlv(0x04, &[0; 200])[..3], &[0x04, 0x81, 200]);
        assert_eq!(&tlv(0x04, &[0; 300])[..4], &[0x04, 0x82, 0x01, 0x2c]);
    }

    #[test]
    fn integers_are_minimal_and_positive() {
        assert_eq!(unsigned_integer(&[0, 0, 0x7f]), vec![0x02, 1, 0x7f]);
        assert_eq!(unsigned_integer(&[0x80]), vec![0x02, 2, 0, 0x80]);
        assert_eq!(unsigned_integer(&[0, 0]), vec![0x02, 1, 0]);
        assert_eq!(unsigned_integer(&[]), vec![0x02, 1, 0]);
    }

    #[test]
    fn times_switch_to_generalized_time_in_2050() {
        // 2026-12-04T18:33:53Z, as Helm wrote it into a genCA certificate.
        assert_eq!(
            time(1_796_409_233).expect("in range"),
            tlv(TAG_UTC_TIME, b"261204183353Z")
        );
        // 2050-01-01T00:00:00Z and 1949-12-31T23:59:59Z.
        assert_eq!(
            time(2_524_608_000).expect("in range"),
            tlv(TAG_GENERALIZED_TIME, b"20500101000000Z")
        );
        assert_eq!(
            time(-631_152_001).expect("in range"),
            tlv(TAG_GENERALIZED_TIME, b"19491231235959Z")
        );
        assert_eq!(time(i64::MAX / 2), None);
    }

    #[test]
    fn printable_strings_exclude_asterisk_ampersand_and_non_ascii() {
        assert!(is_printable("a'b()+,-./:=? Z9"));
        for s in ["*.a.b", "a&b", "a_b", "a@b", "é"] {
            assert!(!is_printable(s), "{s}");
        }
    }
}
