//! Delta bundles as RFC 9842 (Compression Dictionary Transport) frames them: the
//! `Available-Dictionary` request header and the `dcz` content encoding's header.
//!
//! The dictionary of a delta is the canonical body of a digest the agent runs, so the
//! dictionary's sha256 is that digest. A `dcz` body is an 8-byte zstd skippable-frame
//! header, the 32-byte sha256 of the dictionary, then one zstd frame compressed with
//! the dictionary as a raw-content prefix. Only the framing lives here (the core links
//! no compressor): the hub compresses, the agent decompresses.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::bundle::Digest;

/// The content encoding's name.
pub const ENCODING: &str = "dcz";
/// The request header that names the dictionary the client holds.
pub const AVAILABLE_DICTIONARY: &str = "available-dictionary";
/// The fixed start of a `dcz` body: a zstd skippable frame (magic `0x184D2A5E`) of 32 bytes.
pub const MAGIC: [u8; 8] = [0x5e, 0x2a, 0x4d, 0x18, 0x20, 0x00, 0x00, 0x00];
/// The magic and the dictionary's sha256.
pub const HEADER_LEN: usize = MAGIC.len() + 32;

/// The raw sha256 a digest names.
fn raw(digest: &Digest) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(digest.hex(), &mut out).ok()?;
    Some(out)
}

/// The `Available-Dictionary` value naming `digest`: a structured-field byte sequence,
/// `:<base64 of the sha256>:`.
pub fn available_dictionary(digest: &Digest) -> Option<String> {
    raw(digest).map(|bytes| format!(":{}:", STANDARD.encode(bytes)))
}

/// The digest an `Available-Dictionary` value names; `None` for anything that is not
/// a byte sequence of 32 bytes.
pub fn parse_available_dictionary(value: &str) -> Option<Digest> {
    let inner = value.trim().strip_prefix(':')?.strip_suffix(':')?;
    let bytes = STANDARD.decode(inner).ok()?;
    digest_of_raw(&bytes)
}

fn digest_of_raw(bytes: &[u8]) -> Option<Digest> {
    if bytes.len() != 32 {
        return None;
    }
    Digest::parse(&format!("sha256:{}", hex::encode(bytes))).ok()
}

/// The header of a `dcz` body whose dictionary is the body of `dictionary`.
pub fn header(dictionary: &Digest) -> Option<[u8; HEADER_LEN]> {
    let hash = raw(dictionary)?;
    let mut out = [0u8; HEADER_LEN];
    out[..MAGIC.len()].copy_from_slice(&MAGIC);
    out[MAGIC.len()..].copy_from_slice(&hash);
    Some(out)
}

/// Splits a `dcz` body into the digest of its dictionary and its zstd frame; `None`
/// when it does not start with the header.
pub fn split(body: &[u8]) -> Option<(Digest, &[u8])> {
    if body.len() < HEADER_LEN || body[..MAGIC.len()] != MAGIC {
        return None;
    }
    let digest = digest_of_raw(&body[MAGIC.len()..HEADER_LEN])?;
    Some((digest, &body[HEADER_LEN..]))
}

/// Whether an `Accept-Encoding` value accepts `dcz` (not with `q=0`).
pub fn accepts(accept_encoding: &str) -> bool {
    crate::api::accepted_encodings(accept_encoding).any(|name| name.eq_ignore_ascii_case(ENCODING))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dictionary_is_named_and_read_back() {
        let digest = Digest::of(b"[]");
        let value = available_dictionary(&digest).expect("names it");
        assert!(value.starts_with(':') && value.ends_with(':'), "{value}");
        assert_eq!(value.len(), 46, "{value}");
        assert_eq!(parse_available_dictionary(&value), Some(digest.clone()));
        assert_eq!(parse_available_dictionary(" :AAAA: "), None);
        assert_eq!(parse_available_dictionary(&value[1..]), None);
        assert_eq!(parse_available_dictionary(":not base64!:"), None);
    }

    #[test]
    fn the_header_carries_the_dictionary_digest() {
        let digest = Digest::of(b"base");
        let mut body = header(&digest).expect("header").to_vec();
        body.extend_from_slice(b"frame");
        let (named, frame) = split(&body).expect("splits");
        assert_eq!(named, digest);
        assert_eq!(frame, b"frame");
        body[0] ^= 1;
        assert_eq!(split(&body), None);
        assert_eq!(split(&MAGIC), None);
    }

    #[test]
    fn accept_encoding_is_read_with_qualities() {
        assert!(accepts("gzip, dcz"));
        assert!(accepts("zstd;q=0.5, DCZ;q=0.9"));
        assert!(!accepts("gzip, zstd"));
        assert!(!accepts("dcz;q=0"));
        assert!(!accepts("dczz"));
    }
}
