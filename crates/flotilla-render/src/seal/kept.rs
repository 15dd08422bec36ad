//! Age headers kept on disk between render processes.
//!
//! An agent's header costs two X25519 operations, worked out once per process
//! ([`super::Sealer::header`]); a render process that starts anew (the hub restarted,
//! or its render process was replaced) would otherwise work them all out again on
//! its first render, for every agent of the fleet. The headers are public (every
//! bundle of the agent carries its header), so the hub keeps them in a file of its
//! state folder: [`Sealer::kept_headers`] writes what this process knows, and
//! [`offer_headers`] gives a new process the file's headers.
//!
//! Each entry carries a tag, HMAC-SHA256 under the sealing key of the recipient and
//! the header, and an offered header is used only when its tag verifies (and, as a
//! check of its shape, its age MAC under the file key the sealing key gives that
//! recipient). The age MAC alone would not do: the agent can open its file key, so
//! it could make a header of its own that passes it. Only a holder of the sealing
//! key makes a tag, so a file written under another sealing key, damaged, or written
//! by anyone without the hub's store is never used, and the headers are worked out
//! again.
//!
//! The file: [`MAGIC`], then for each header its recipient (32 bytes), its tag (32
//! bytes), the header's length (four bytes, big-endian) and the header; a truncated
//! last entry is ignored, and at most [`LONGEST_FILE`] bytes of it are read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{HEADERS, HEADERS_KEPT, Sealer, hkdf_32};

/// The first line of a file of kept headers.
pub const MAGIC: &[u8] = b"flotilla sealing headers v2\n";

/// A header is about 170 bytes; anything longer in a file is not one of ours.
const LONGEST_HEADER: usize = 512;

/// The most of a file that is read: as many entries as a process keeps headers.
pub const LONGEST_FILE: u64 = (MAGIC.len() + HEADERS_KEPT * (68 + LONGEST_HEADER)) as u64;

/// An offered header: its tag, then the header.
type Offered = ([u8; 32], Vec<u8>);

/// Headers offered from a file, by recipient, not yet verified (see the module).
static OFFERED: std::sync::Mutex<Option<HashMap<[u8; 32], Offered>>> = std::sync::Mutex::new(None);

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

/// The entries of a file of kept headers (at most [`HEADERS_KEPT`]).
pub(super) fn parse(file: &[u8]) -> HashMap<[u8; 32], Offered> {
    let mut entries = HashMap::new();
    let Some(mut rest) = file.strip_prefix(MAGIC) else {
        return entries;
    };
    while rest.len() >= 68 && entries.len() < HEADERS_KEPT {
        let (recipient, tail) = rest.split_at(32);
        let (tag, tail) = tail.split_at(32);
        let (len, tail) = tail.split_at(4);
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > LONGEST_HEADER || tail.len() < len {
            break;
        }
        let (mut key, mut mac) = ([0u8; 32], [0u8; 32]);
        key.copy_from_slice(recipient);
        mac.copy_from_slice(tag);
        entries.insert(key, (mac, tail[..len].to_vec()));
        rest = &tail[len..];
    }
    entries
}

impl Sealer {
    /// The HMAC under the sealing key that tags `recipient`'s `header` in a file of
    /// kept headers.
    fn tag(&self, recipient: &[u8; 32], header: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("any key length");
        mac.update(b"flotilla.dev/v1 kept sealing header");
        mac.update(recipient);
        mac.update(header);
        mac
    }

    /// Whether an offered entry's tag is this sealer's.
    fn tagged_by_me(&self, recipient: &[u8; 32], (tag, header): &Offered) -> bool {
        self.tag(recipient, header).verify_slice(tag).is_ok()
    }

    /// Whether an offered header is this sealer's for `recipient`: its tag, and its
    /// age MAC under `file_key`.
    pub(super) fn verifies_offered(
        &self,
        recipient: &[u8; 32],
        entry: &Offered,
        file_key: &[u8; 16],
    ) -> bool {
        self.tagged_by_me(recipient, entry) && verifies(&entry.1, file_key)
    }

    /// The offered header of `recipient`, taken out of the offer, when it is this
    /// sealer's (an offer another sealer's key made stays).
    pub(super) fn take_offered(
        &self,
        recipient: &[u8; 32],
        file_key: &[u8; 16],
    ) -> Option<Vec<u8>> {
        let mut offered = OFFERED.lock().unwrap_or_else(|e| e.into_inner());
        let offered = offered.as_mut()?;
        let entry = offered.get(recipient)?;
        if !self.verifies_offered(recipient, entry, file_key) {
            return None;
        }
        offered.remove(recipient).map(|(_, header)| header)
    }

    /// A file of the headers this process holds for this sealer's key (by
    /// recipient, in order), for [`offer_headers`] in a later process: those it
    /// used, and those offered to it, not used yet and tagged by this sealer (the
    /// clusters it did not render this time; their age MAC is checked when used).
    pub fn kept_headers(&self) -> Vec<u8> {
        // Copied out, so that no render waits while they are checked and written.
        let mut mine: Vec<([u8; 32], Vec<u8>)> = {
            let memo = HEADERS.read().unwrap_or_else(|e| e.into_inner());
            memo.iter()
                .flat_map(|m| m.iter())
                .filter(|((key, _), _)| *key == self.key)
                .map(|((_, recipient), header)| (*recipient, header.bytes.clone()))
                .collect()
        };
        let unused: Vec<([u8; 32], Offered)> = {
            let offered = OFFERED.lock().unwrap_or_else(|e| e.into_inner());
            offered
                .iter()
                .flat_map(|o| o.iter())
                .map(|(recipient, entry)| (*recipient, entry.clone()))
                .collect()
        };
        mine.extend(unused.into_iter().filter_map(|(recipient, entry)| {
            self.tagged_by_me(&recipient, &entry)
                .then_some((recipient, entry.1))
        }));
        mine.sort_unstable_by_key(|(recipient, _)| *recipient);
        mine.dedup_by_key(|(recipient, _)| *recipient);
        mine.truncate(HEADERS_KEPT);
        self.file_of(
            mine.iter()
                .map(|(recipient, header)| (recipient, &header[..])),
        )
    }

    /// A file of kept headers with `entries`, each tagged by this sealer.
    pub(super) fn file_of<'a>(
        &self,
        entries: impl IntoIterator<Item = (&'a [u8; 32], &'a [u8])>,
    ) -> Vec<u8> {
        let mut file = MAGIC.to_vec();
        for (recipient, header) in entries {
            file.extend_from_slice(recipient);
            file.extend_from_slice(&self.tag(recipient, header).finalize().into_bytes());
            file.extend_from_slice(&(header.len() as u32).to_be_bytes());
            file.extend_from_slice(header);
        }
        file
    }
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

/// `covered` (an age header up to its `---`) with its MAC under `file_key`: for tests
/// that make headers of their own.
#[cfg(test)]
pub(super) fn with_mac(covered: &[u8], file_key: &[u8; 16]) -> Vec<u8> {
    super::with_header_mac(covered.to_vec(), file_key)
}
