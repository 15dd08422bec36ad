//! Age headers kept on disk between render processes.
//!
//! An agent's header costs two X25519 operations, worked out once per process
//! ([`super::Sealer::header`]); a render process that starts anew (the hub restarted,
//! or its render process was replaced) would otherwise work them all out again on
//! its first render, for every agent of the fleet. The headers are public (every
//! bundle of the agent carries its header), so the hub keeps them in a file of its
//! state folder: [`Sealer::kept_headers`] writes what this process knows, and
//! [`offer_headers`] gives a new process the file's headers. An offered header is
//! used only when its MAC verifies under the file key the sealing key gives that
//! recipient, which nobody without the sealing key can make: a file written under
//! another sealing key, damaged, or planted by someone without the hub's store is
//! never used, and the header is worked out again.
//!
//! The file: [`MAGIC`], then for each header its recipient (32 bytes), the header's
//! length (four bytes, big-endian) and the header; a truncated last entry is ignored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{HEADERS, HEADERS_KEPT, Sealer, hkdf_32};

/// The first line of a file of kept headers.
pub const MAGIC: &[u8] = b"flotilla sealing headers v1\n";

/// A header is a few hundred bytes; anything longer in a file is not one of ours.
const LONGEST_HEADER: usize = 1024;

/// Headers offered from a file, by recipient, not yet verified (see the module).
static OFFERED: std::sync::Mutex<Option<HashMap<[u8; 32], Vec<u8>>>> = std::sync::Mutex::new(None);

/// Headers this process has worked out with X25519 (not taken from a file).
static MADE: AtomicU64 = AtomicU64::new(0);

/// How many headers this process has worked out itself: when it has not changed
/// since the file was last written, the file is up to date.
pub fn headers_made() -> u64 {
    MADE.load(Ordering::Relaxed)
}

pub(super) fn count_made() {
    MADE.fetch_add(1, Ordering::Relaxed);
}

/// Offers the headers of `file` (as [`Sealer::kept_headers`] wrote it) to this
/// process's sealers; returns how many entries it held. A file that does not start
/// with [`MAGIC`] offers nothing.
pub fn offer_headers(file: &[u8]) -> usize {
    let entries = parse(file);
    let count = entries.len();
    let mut offered = OFFERED.lock().unwrap_or_else(|e| e.into_inner());
    offered.get_or_insert_with(HashMap::new).extend(entries);
    count
}

/// The entries of a file of kept headers.
pub(super) fn parse(file: &[u8]) -> HashMap<[u8; 32], Vec<u8>> {
    let mut entries = HashMap::new();
    let Some(mut rest) = file.strip_prefix(MAGIC) else {
        return entries;
    };
    while rest.len() >= 36 {
        let (recipient, tail) = rest.split_at(32);
        let (len, tail) = tail.split_at(4);
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > LONGEST_HEADER || tail.len() < len {
            break;
        }
        let mut key = [0u8; 32];
        key.copy_from_slice(recipient);
        entries.insert(key, tail[..len].to_vec());
        rest = &tail[len..];
    }
    entries
}

/// The offered header of `recipient`, taken out of the offer, when its MAC verifies
/// under `file_key`.
pub(super) fn take_offered(recipient: &[u8; 32], file_key: &[u8; 16]) -> Option<Vec<u8>> {
    let header = OFFERED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_mut()?
        .remove(recipient)?;
    verifies(&header, file_key).then_some(header)
}

/// Whether `header` is an age header for one X25519 stanza whose MAC verifies under
/// `file_key`.
pub(super) fn verifies(header: &[u8], file_key: &[u8; 16]) -> bool {
    let Some(text) = header.strip_suffix(b"\n") else {
        return false;
    };
    let Some(at) = text.windows(4).rposition(|w| w == b"\n---") else {
        return false;
    };
    let (covered, mac) = text.split_at(at + 4);
    let lines: Vec<&[u8]> = covered.split(|&b| b == b'\n').collect();
    let shaped = matches!(
        lines.as_slice(),
        [version, stanza, _body, b"---"]
            if *version == b"age-encryption.org/v1" && stanza.starts_with(b"-> X25519 ")
    );
    let Some(mac) = mac.strip_prefix(b" ") else {
        return false;
    };
    let Ok(mac) = STANDARD_NO_PAD.decode(mac) else {
        return false;
    };
    let mac_key = hkdf_32(&[], file_key, b"header");
    let mut check = <Hmac<Sha256> as Mac>::new_from_slice(&mac_key).expect("any key length");
    check.update(covered);
    shaped && check.verify_slice(&mac).is_ok()
}

impl Sealer {
    /// A file of the headers this process holds for this sealer's key (by
    /// recipient, in order), for [`offer_headers`] in a later process: those it
    /// used, and those offered to it and not used yet that verify under this key
    /// (the clusters it did not render this time).
    pub fn kept_headers(&self) -> Vec<u8> {
        let memo = HEADERS.lock().unwrap_or_else(|e| e.into_inner());
        let offered = OFFERED.lock().unwrap_or_else(|e| e.into_inner());
        let used = memo
            .iter()
            .flat_map(|m| m.iter())
            .filter(|((key, _), _)| *key == self.key)
            .map(|((_, recipient), header)| (recipient, header.bytes.as_slice()));
        let unused = offered
            .iter()
            .flat_map(|o| o.iter())
            .filter(|(recipient, header)| {
                let key = super::AgentKey(**recipient);
                verifies(header, &self.header_keys(&key).0)
            });
        let mut mine: Vec<(&[u8; 32], &[u8])> = used
            .chain(unused.map(|(recipient, header)| (recipient, header.as_slice())))
            .take(HEADERS_KEPT)
            .collect();
        mine.sort_unstable();
        mine.dedup_by_key(|(recipient, _)| **recipient);
        let mut file = MAGIC.to_vec();
        for (recipient, header) in mine {
            file.extend_from_slice(recipient);
            file.extend_from_slice(&(header.len() as u32).to_be_bytes());
            file.extend_from_slice(header);
        }
        file
    }
}
