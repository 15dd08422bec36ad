//! Secrets sealed to one cluster's agent.
//!
//! In the bundle of a cluster whose file names `spec.agentKey` (an age X25519
//! recipient, `age1…`), each `Secret`'s `data` and `stringData` are replaced by one
//! field, [`SEALED_FIELD`]: `{"sealed": "<base64 of an age v1 file>"}` whose plain
//! text is the JSON object `{"data": …, "stringData": …}`. Only the agent holding the
//! matching identity opens it; the hub's store, its objects, `publish` output and any
//! cache in between hold only the ciphertext. The
//! `kubectl.kubernetes.io/last-applied-configuration` annotation of such a Secret,
//! which would repeat its values, is removed.
//!
//! The age file is written here rather than by the `age` crate, whose encryptor draws
//! its file key, ephemeral key and nonce from the operating system: a render must be
//! a pure function of the commit and the hub's secrets, or every render would roll
//! every cluster. Those three values are derived (HKDF-SHA256) from the sealing key —
//! itself derived from the hub's seed, which only the hub's store holds. The file key
//! and the ephemeral key are derived over the recipient alone, so one agent's Secrets
//! share one age header (the X25519 stanza and its MAC), worked out once per agent and
//! kept for the life of the process ([`Sealer::header`]); the payload nonce is an HMAC
//! (the sealing key) of the recipient, the resource's identity and the plain text, so each Secret's
//! payload has a key of its own (age derives it from the file key and that nonce). The
//! same Secret for the same agent seals to the same bytes on every render and every
//! hub sharing the store; a changed value or another Secret gives an unrelated nonce
//! and payload, another agent or hub unrelated bytes throughout; and nobody without
//! the store can recompute a sealing to test a guessed value against it.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;
use std::collections::HashMap;
use std::sync::Arc;

/// The field of a sealed `Secret` that replaces its `data` and `stringData`.
pub const SEALED_FIELD: &str = flotilla_core::bundle::SEALED_SECRET_FIELD;
/// The annotation `kubectl apply` writes, which would repeat a Secret's values.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// age's plain-text chunk size (STREAM).
const CHUNK: usize = 64 * 1024;
/// The most a render thread's buffer for one sealed Secret keeps between Secrets.
const KEPT_BUFFER_BYTES: usize = 64 * 1024;

/// Seals Secrets with keys derived from the hub's seed.
pub struct Sealer {
    key: [u8; 32],
    /// HMAC-SHA256 keyed with `key`, ready for the payload nonces.
    nonces: Hmac<Sha256>,
}

/// The age header one hub writes for one agent: its file key and the header's bytes
/// (version line, X25519 stanza, MAC), ending in a newline.
struct Header {
    file_key: [u8; 16],
    bytes: Vec<u8>,
    /// The base64 text of the header's first bytes, a multiple of three of them: a
    /// sealed value's text starts with it, and only the last one or two bytes of the
    /// header are encoded again with each Secret's payload.
    encoded: String,
}

impl Header {
    fn new(file_key: [u8; 16], bytes: Vec<u8>) -> Header {
        let whole = bytes.len() / 3 * 3;
        let encoded = STANDARD.encode(&bytes[..whole]);
        Header {
            file_key,
            bytes,
            encoded,
        }
    }

    /// The header's bytes after those [`Header::encoded`] holds.
    fn unencoded(&self) -> &[u8] {
        &self.bytes[self.bytes.len() / 3 * 3..]
    }
}

/// Headers worked out in this process (read far more often than written: an
/// `RwLock`, so the render threads do not wait on each other to read one), by sealing key and recipient: a pure
/// function's results, so a render process kept between commits does each agent's
/// two X25519 operations once. Cleared when it reaches [`HEADERS_KEPT`] entries.
static HEADERS: std::sync::RwLock<Option<Headers>> = std::sync::RwLock::new(None);
/// Headers by (sealing key, recipient).
type Headers = HashMap<([u8; 32], [u8; 32]), Arc<Header>, foldhash::fast::RandomState>;
/// At most this many headers are kept (about 250 bytes each).
const HEADERS_KEPT: usize = 200_000;

/// Sealed Secrets made in this process, by (the Secret's [`Prepared::id`], recipient):
/// the same Secret for the same agent seals to the same bytes, so a render process
/// kept between commits seals anew only the Secrets that changed.
static SEALINGS: std::sync::Mutex<Sealings> = std::sync::Mutex::new(Sealings::new());
/// At most this many sealed Secrets are kept in one generation; past it the
/// generation is cleared.
const SEALINGS_KEPT: usize = 1_000_000;

/// Sealed Secrets kept for the next render. Each render that seals starts a
/// generation ([`next_render`]); an entry used by neither the last such render nor
/// this one is dropped, so what is kept is about what the hub's kept render holds anyway (the
/// resources are shared with its bundles).
pub(crate) struct Sealings {
    current: Option<SealingMap>,
    previous: Option<SealingMap>,
    /// What the render before the last kept, no longer used: taken out and freed by
    /// the thread that retired it once it let go of the lock.
    retired: Option<SealingMap>,
    /// A render has started and not sealed yet: its generation starts at its first
    /// sealing, so a render that seals nothing (of a fleet without agent keys, or
    /// whose sealed clusters are all unchanged) drops nothing.
    starting: bool,
}

/// Sealed Secrets by (the Secret's id under the sealing key, recipient), hashed with
/// foldhash (seeded at random): a fleet-wide rotation looks up and keeps one entry
/// per Secret and cluster.
type SealingMap = HashMap<
    ([u8; 32], [u8; 32]),
    Arc<flotilla_core::bundle::Resource>,
    foldhash::fast::RandomState,
>;

impl Sealings {
    pub(crate) const fn new() -> Sealings {
        Sealings {
            current: None,
            previous: None,
            retired: None,
            starting: false,
        }
    }

    /// A render starts: at its first sealing, what the render before the last that
    /// sealed used is dropped.
    pub(crate) fn next_render(&mut self) {
        self.starting = true;
    }

    /// Starts the generation of a render that seals.
    fn turn(&mut self) {
        if std::mem::take(&mut self.starting) {
            self.retired = std::mem::replace(&mut self.previous, self.current.take());
            // Room for what the last render kept, which this one mostly takes again.
            let room = self.previous.as_ref().map_or(0, HashMap::len);
            self.current = Some(HashMap::with_capacity_and_hasher(room, Default::default()));
        }
    }

    /// The kept sealing, moved into this generation when the last render used it.
    fn get(&mut self, key: &([u8; 32], [u8; 32])) -> Option<Arc<flotilla_core::bundle::Resource>> {
        self.turn();
        if let Some(found) = self.current.as_ref().and_then(|m| m.get(key)) {
            return Some(found.clone());
        }
        let found = self.previous.as_mut()?.remove(key)?;
        self.keep(*key, found.clone());
        Some(found)
    }

    /// Keeps `sealed` in this generation (the one kept first when two threads race).
    fn keep(
        &mut self,
        key: ([u8; 32], [u8; 32]),
        sealed: Arc<flotilla_core::bundle::Resource>,
    ) -> Arc<flotilla_core::bundle::Resource> {
        self.turn();
        let current = self.current.get_or_insert_with(HashMap::default);
        if current.len() >= SEALINGS_KEPT {
            current.clear();
        }
        current.entry(key).or_insert(sealed).clone()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.current.as_ref().map_or(0, HashMap::len)
            + self.previous.as_ref().map_or(0, HashMap::len)
    }
}

/// Starts a render's generation of the sealed Secrets this process keeps
/// ([`Sealings::next_render`]).
pub fn next_render() {
    SEALINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .next_render();
}

impl Sealer {
    /// The sealer of the hub whose seed (the store's, never the public one) is `seed`,
    /// without a secret of the hub's own: what a fleet without SOPS files seals with
    /// (its Secrets are in Git in plain text). Whoever reads the seed can work out
    /// its file keys; see [`Sealer::new`].
    pub fn from_hub_seed(seed: &[u8; 32]) -> Sealer {
        Sealer::new(seed, None)
    }

    /// The sealer of the hub whose seed is `seed` and whose own secret (derived from
    /// its decryption identity, `DecryptionKeys::sealing_secret`) is `hub_secret`. The sealing key is an
    /// HMAC under the seed of both: the seed is in the store, shared by its hubs and
    /// in its backups, and with the seed alone anyone could work out every agent's
    /// file key and open every sealed value; with the hub's secret mixed in, that
    /// takes the hub's identity too, which opens the fleet's SOPS files anyway.
    pub fn new(seed: &[u8; 32], hub_secret: Option<&[u8; 32]>) -> Sealer {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(seed).expect("any key length");
        mac.update(b"flotilla.dev/v1 secret sealing key");
        if let Some(secret) = hub_secret {
            mac.update(b" with the hub's secret");
            mac.update(secret);
        }
        let key: [u8; 32] = mac.finalize().into_bytes().into();
        let mut nonces = <Hmac<Sha256> as Mac>::new_from_slice(&key).expect("any key length");
        nonces.update(b"flotilla.dev/v1 payload nonce");
        Sealer { key, nonces }
    }

    /// An age v1 file (binary) of `plain` for `recipient`: the recipient's header,
    /// then a payload whose nonce is HMAC-SHA256 (the sealing key) of the recipient,
    /// `identity` and `plain`, each with its length, cut to 16 bytes.
    pub fn seal(&self, recipient: &AgentKey, identity: &str, plain: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        self.seal_into(recipient, identity, plain, &mut out);
        out
    }

    /// [`Sealer::seal`], written over `out`.
    fn seal_into(&self, recipient: &AgentKey, identity: &str, plain: &[u8], out: &mut Vec<u8>) {
        let header = self.header(recipient);
        out.clear();
        out.reserve(header.bytes.len() + 16 + plain.len() + 16);
        out.extend_from_slice(&header.bytes);
        self.payload_of(recipient, &header, (identity, plain), out);
    }

    /// Appends the payload of `plain` sealed to `recipient` under `header`'s file key,
    /// its nonce an HMAC (the sealing key) of the recipient, `identity` and `plain`.
    fn payload_of(
        &self,
        recipient: &AgentKey,
        header: &Header,
        (identity, plain): (&str, &[u8]),
        out: &mut Vec<u8>,
    ) {
        let mut mac = self.nonces.clone();
        for part in [&recipient.0[..], identity.as_bytes(), plain] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&mac.finalize().into_bytes()[..16]);
        payload(out, &header.file_key, &nonce, plain);
    }

    /// The header of every file sealed to `recipient`, from this process's memo or
    /// worked out (file key and ephemeral secret derived from the sealing key and the
    /// recipient; or taken from the headers an earlier process kept, see [`kept`]).
    fn header(&self, recipient: &AgentKey) -> Arc<Header> {
        let memo_key = (self.key, recipient.0);
        let memoized =
            |memo: &Option<Headers>| memo.as_ref().and_then(|m| m.get(&memo_key).cloned());
        if let Some(found) = memoized(&HEADERS.read().unwrap_or_else(|e| e.into_inner())) {
            return found;
        }
        let (file_key, ephemeral) = self.header_keys(recipient);
        // A header kept from an earlier process, when it verifies; else worked out.
        let bytes = self
            .take_offered(&recipient.0, &file_key)
            .unwrap_or_else(|| {
                kept::count_made();
                age_header(recipient, &file_key, &ephemeral)
            });
        let header = Arc::new(Header::new(file_key, bytes));
        let mut memo = HEADERS.write().unwrap_or_else(|e| e.into_inner());
        let map = memo.get_or_insert_with(HashMap::default);
        if map.len() >= HEADERS_KEPT {
            map.clear();
        }
        map.entry(memo_key).or_insert(header).clone()
    }

    /// The file key and the ephemeral secret of `recipient`'s header.
    fn header_keys(&self, recipient: &AgentKey) -> ([u8; 16], [u8; 32]) {
        let derived = Hkdf::<Sha256>::new(Some(&self.key), &length_prefixed(&[&recipient.0[..]]));
        let mut file_key = [0u8; 16];
        let mut ephemeral = [0u8; 32];
        derived
            .expand(b"file key", &mut file_key)
            .and_then(|()| derived.expand(b"ephemeral", &mut ephemeral))
            .expect("short outputs");
        (file_key, ephemeral)
    }
}

/// Each part preceded by its length (eight bytes, big-endian).
fn length_prefixed(parts: &[&[u8]]) -> Vec<u8> {
    let mut input = Vec::with_capacity(parts.iter().map(|p| 8 + p.len()).sum());
    for part in parts {
        input.extend_from_slice(&(part.len() as u64).to_be_bytes());
        input.extend_from_slice(part);
    }
    input
}

/// Hash keys of SOPS files as [`combined_hash_key`] takes them: sorted, no repeats.
pub fn key_set(keys: impl IntoIterator<Item = [u8; 32]>) -> Vec<[u8; 32]> {
    let mut keys: Vec<[u8; 32]> = keys.into_iter().collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// One key for hashing over the values of several SOPS files (`keys` sorted, each a
/// file's hash key): the first key itself, or an HMAC under it of the others;
/// `None` for none.
pub fn combined_hash_key(keys: &[[u8; 32]]) -> Option<[u8; 32]> {
    use hmac::Mac as _;
    let (first, rest) = keys.split_first()?;
    if rest.is_empty() {
        return Some(*first);
    }
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(first).expect("any key length");
    for key in rest {
        mac.update(key);
    }
    Some(mac.finalize().into_bytes().into())
}

/// HMAC-SHA256 of `text` under `key`, in lower-case hexadecimal (where a plain
/// SHA-256 would be written).
pub fn keyed_hex(key: &[u8; 32], text: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(key).expect("any key length");
    mac.update(text);
    hex_lower(&mac.finalize().into_bytes())
}

/// SHA-256 of `bytes` in lower-case hexadecimal (Sprig's `sha256sum`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex_lower(&Sha256::digest(bytes))
}

/// `bytes` in lower-case hexadecimal.
pub fn hex_lower(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        out.push(DIGITS[(byte >> 4) as usize] as char);
        out.push(DIGITS[(byte & 15) as usize] as char);
    }
    out
}

/// The decrypted values a chart's `sha256sum` may cover, each with its file's hash
/// key: a digest of a text that holds one (as written, or in base64 as `b64enc`
/// writes it) is an HMAC keyed with the keys of the files found, not Helm's plain
/// SHA-256, which would let anyone who reads a `checksum/secret` annotation test a
/// guess of the values. A template can change a value before it hashes it (quote
/// it, join it to a user name and encode the pair, encode it twice) in ways no
/// search of the text follows, so a release whose values hold a decrypted value
/// keys every digest it writes ([`SecretHashing::release_keys`]).
#[derive(Debug, Default)]
pub struct SecretHashing {
    needles: Vec<(String, [u8; 32])>,
    /// Every SOPS file's hash key, by path: a chart's own SOPS files (read with
    /// `.Files.Get`) key its release's digests ([`SecretHashing::release_keys`]).
    files: std::collections::BTreeMap<String, [u8; 32]>,
}

/// The text a JSON string's inside stands for: a decrypted value as the renderer
/// tracks it (`SopsSecret::escaped`), unescaped; `None` if it is not such a text.
pub(crate) fn unescaped(escaped: &str) -> Option<String> {
    serde_json::from_str::<String>(&format!("\"{escaped}\"")).ok()
}

impl SecretHashing {
    /// The decrypted values (each as it appears inside a JSON string, with its
    /// file: the renderer's `SopsSecret`s), with the hash keys of their files.
    pub fn new<'a>(
        secrets: impl IntoIterator<Item = (&'a str, &'a str)>,
        hash_keys: &std::collections::BTreeMap<String, [u8; 32]>,
    ) -> SecretHashing {
        let mut needles = Vec::new();
        for (escaped, file) in secrets {
            let (Some(key), Some(plain)) = (hash_keys.get(file), unescaped(escaped)) else {
                continue;
            };
            let encoded = STANDARD.encode(plain.as_bytes());
            needles.push((plain, *key));
            needles.push((encoded, *key));
        }
        SecretHashing {
            needles,
            files: hash_keys.clone(),
        }
    }

    /// Sprig's `sha256sum` of `text`, keyed when it holds a decrypted value.
    pub fn sha256_hex(&self, text: &str) -> String {
        self.sha256_hex_in(text, &[])
    }

    /// Sprig's `sha256sum` of `text` in a release whose values hold the decrypted
    /// values of the files with hash keys `release` ([`SecretHashing::release_keys`]):
    /// keyed when `release` is not empty or the text holds a decrypted value.
    pub fn sha256_hex_in(&self, text: &str, release: &[[u8; 32]]) -> String {
        match self.key_for_in(text, release) {
            None => sha256_hex(text.as_bytes()),
            Some(key) => keyed_hex(&key, text.as_bytes()),
        }
    }

    /// The key to hash `text` with when it holds a decrypted value (those of the
    /// files it holds values of, combined); `None` when it holds none.
    pub fn key_for(&self, text: &str) -> Option<[u8; 32]> {
        self.key_for_in(text, &[])
    }

    /// [`SecretHashing::key_for`] in a release whose values hold the decrypted
    /// values of the files with hash keys `release`: those files' keys and the keys
    /// of the files whose values `text` holds, combined.
    pub fn key_for_in(&self, text: &str, release: &[[u8; 32]]) -> Option<[u8; 32]> {
        if self.needles.is_empty() && release.is_empty() {
            return None;
        }
        let keys = key_set(
            self.needles
                .iter()
                .filter(|(needle, _)| text.contains(needle.as_str()))
                .map(|(_, key)| *key)
                .chain(release.iter().copied()),
        );
        combined_hash_key(&keys)
    }

    /// The hash keys (sorted, no repeats) that every digest of a Helm release is
    /// keyed with: those of the files whose decrypted values its `values` hold, in
    /// any string or key, and those of the SOPS files inside its chart folder
    /// `chart` (read with `.Files.Get`, decrypted). Empty when there are none: the
    /// release hashes as Helm does.
    pub fn release_keys(&self, values: &Map<String, Value>, chart: &str) -> Vec<[u8; 32]> {
        fn walk(value: &Value, found: &mut dyn FnMut(&str)) {
            match value {
                Value::String(s) => found(s),
                Value::Array(items) => items.iter().for_each(|item| walk(item, found)),
                Value::Object(map) => map.iter().for_each(|(key, item)| {
                    found(key);
                    walk(item, found);
                }),
                _ => {}
            }
        }
        let mut keys = Vec::new();
        if !self.needles.is_empty() {
            let mut found = |text: &str| {
                keys.extend(
                    self.needles
                        .iter()
                        .filter(|(needle, _)| text.contains(needle.as_str()))
                        .map(|(_, key)| *key),
                );
            };
            for (key, value) in values {
                found(key);
                walk(value, &mut found);
            }
        }
        let folder = format!("{}/", chart.trim_end_matches('/'));
        keys.extend(
            self.files
                .range(folder.clone()..)
                .take_while(|(path, _)| path.starts_with(&folder))
                .map(|(_, key)| *key),
        );
        key_set(keys)
    }
}

/// Bech32's 32 characters, in the order of the 5-bit values they stand for.
const BECH32_CHARSET: &[u8; 32] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";

/// Each ASCII byte's value in [`BECH32_CHARSET`] (lower case), or `0xff`.
const BECH32_VALUES: [u8; 128] = {
    let mut values = [0xff; 128];
    let mut i = 0;
    while i < 32 {
        values[BECH32_CHARSET[i] as usize] = i as u8;
        i += 1;
    }
    values
};

/// A cluster's agent key: the X25519 public key of an age recipient (`age1…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentKey([u8; 32]);

impl AgentKey {
    /// Reads `age1…` (Bech32, as `age-keygen` and the agent print it).
    pub fn parse(text: &str) -> Result<AgentKey, String> {
        if let Some(key) = AgentKey::parse_printed(text.trim().as_bytes()) {
            return Ok(AgentKey(key));
        }
        AgentKey::parse_any(text)
    }

    /// The key of a recipient written as age prints one (lower case, `age1` and 58
    /// characters) with a valid checksum; `None` for anything else, which
    /// [`AgentKey::parse_any`] reads or explains. The same result as the `bech32`
    /// crate's, without its allocations: every cluster file of a fleet is read with
    /// one (BIP 173: the checksum is a BCH code over the expanded `age` prefix and the
    /// data; 52 groups of 5 bits hold the 32 bytes and 4 zero bits).
    fn parse_printed(text: &[u8]) -> Option<[u8; 32]> {
        const GENERATOR: [u32; 5] = [
            0x3b6a_57b2,
            0x2650_8e6d,
            0x1ea1_19fa,
            0x3d42_33dd,
            0x2a14_62b3,
        ];
        let data = text.strip_prefix(b"age1").filter(|data| data.len() == 58)?;
        let mut checksum: u32 = 1;
        let mut step = |value: u8| {
            let top = checksum >> 25;
            checksum = ((checksum & 0x01ff_ffff) << 5) ^ u32::from(value);
            for (bit, generator) in GENERATOR.iter().enumerate() {
                // The generator where the bit is set, without a branch.
                checksum ^= generator & ((top >> bit) & 1).wrapping_neg();
            }
        };
        // The prefix expanded: the high bits of each character, a zero, the low bits.
        for value in [3, 3, 3, 0, 1, 7, 5] {
            step(value);
        }
        let mut key = [0u8; 32];
        let (mut bits, mut held, mut at) = (0u32, 0u32, 0usize);
        for (index, &c) in data.iter().enumerate() {
            let value = *BECH32_VALUES.get(usize::from(c)).filter(|&&v| v != 0xff)?;
            step(value);
            if index < 52 {
                bits = (bits << 5) | u32::from(value);
                held += 5;
                if held >= 8 {
                    held -= 8;
                    key[at] = (bits >> held) as u8;
                    at += 1;
                    bits &= (1 << held) - 1;
                }
            }
        }
        (checksum == 1 && at == 32 && bits == 0).then_some(key)
    }

    /// [`AgentKey::parse`] by the `bech32` crate: any case, and its reasons.
    fn parse_any(text: &str) -> Result<AgentKey, String> {
        use bech32::FromBase32 as _;
        let (hrp, data, variant) = bech32::decode(text.trim())
            .map_err(|e| format!("not an age public key (age1…): {e}"))?;
        if hrp != "age" || variant != bech32::Variant::Bech32 {
            return Err("not an age public key: it must start with age1".to_string());
        }
        let bytes = Vec::<u8>::from_base32(&data)
            .map_err(|e| format!("not an age public key (age1…): {e}"))?;
        <[u8; 32]>::try_from(bytes.as_slice())
            .map(AgentKey)
            .map_err(|_| "not an age public key: it is not 32 bytes".to_string())
    }
}

impl std::fmt::Display for AgentKey {
    /// `age1…`, as `age-keygen` prints a recipient.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use bech32::ToBase32 as _;
        let text = bech32::encode("age", self.0.to_base32(), bech32::Variant::Bech32)
            .map_err(|_| std::fmt::Error)?;
        f.write_str(&text)
    }
}

/// The age v1 format (c2sp.org/age) with one X25519 recipient stanza, from the given
/// file key, ephemeral secret and payload nonce.
pub(crate) fn age_file(
    recipient: &AgentKey,
    (file_key, ephemeral, nonce): (&[u8; 16], &[u8; 32], &[u8; 16]),
    plain: &[u8],
) -> Vec<u8> {
    let mut out = age_header(recipient, file_key, ephemeral);
    payload(&mut out, file_key, nonce, plain);
    out
}

/// An age v1 header (c2sp.org/age) with one X25519 recipient stanza wrapping
/// `file_key`, from the given ephemeral secret, with its MAC and final newline.
fn age_header(recipient: &AgentKey, file_key: &[u8; 16], ephemeral: &[u8; 32]) -> Vec<u8> {
    let secret = x25519_dalek::StaticSecret::from(*ephemeral);
    let share = x25519_dalek::PublicKey::from(&secret);
    let shared = secret.diffie_hellman(&x25519_dalek::PublicKey::from(recipient.0));
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(share.as_bytes());
    salt[32..].copy_from_slice(&recipient.0);
    let wrap_key = hkdf_32(&salt, shared.as_bytes(), b"age-encryption.org/v1/X25519");
    let mut body = Vec::with_capacity(file_key.len() + 16);
    chacha20_poly1305(
        &chacha20_poly1305_key(&wrap_key),
        [0; 12],
        file_key,
        &mut body,
    );
    let header = format!(
        "age-encryption.org/v1\n-> X25519 {}\n{}\n---",
        STANDARD_NO_PAD.encode(share.as_bytes()),
        STANDARD_NO_PAD.encode(&body)
    )
    .into_bytes();
    with_header_mac(header, file_key)
}

/// `covered`, an age header up to its `---`, with its MAC under `file_key` and the
/// final newline.
fn with_header_mac(mut covered: Vec<u8>, file_key: &[u8; 16]) -> Vec<u8> {
    let mac_key = hkdf_32(&[], file_key, b"header");
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&mac_key).expect("any key length");
    mac.update(&covered);
    covered.extend_from_slice(b" ");
    covered.extend_from_slice(
        STANDARD_NO_PAD
            .encode(mac.finalize().into_bytes())
            .as_bytes(),
    );
    covered.push(b'\n');
    covered
}

/// Appends age's payload of `plain` (the nonce, then the STREAM of 64 KiB chunks)
/// under the payload key age derives from `file_key` and `nonce`.
fn payload(out: &mut Vec<u8>, file_key: &[u8; 16], nonce: &[u8; 16], plain: &[u8]) {
    out.extend_from_slice(nonce);
    let key = chacha20_poly1305_key(&hkdf_32(nonce, file_key, b"payload"));
    // At least one chunk: an empty plain text is one empty, final chunk.
    let chunks = plain.len().div_ceil(CHUNK).max(1);
    out.reserve(plain.len() + chunks * 16);
    for counter in 0..chunks {
        let chunk =
            &plain[(counter * CHUNK).min(plain.len())..((counter + 1) * CHUNK).min(plain.len())];
        let mut chunk_nonce = [0u8; 12];
        chunk_nonce[3..11].copy_from_slice(&(counter as u64).to_be_bytes());
        chunk_nonce[11] = u8::from(counter + 1 == chunks);
        chacha20_poly1305(&key, chunk_nonce, chunk, out);
    }
}

/// A ChaCha20-Poly1305 key (RFC 8439) for [`chacha20_poly1305`]: ring's, whose setup
/// for one short message costs a seventh of RustCrypto's (a sealed Secret is an age
/// file of about a hundred bytes, one such message, and a fleet-wide rotation seals
/// one per Secret and cluster).
fn chacha20_poly1305_key(key: &[u8; 32]) -> ring::aead::LessSafeKey {
    use ring::aead::{CHACHA20_POLY1305, LessSafeKey, UnboundKey};
    LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).expect("a 32-byte key"))
}

/// Appends `plain` encrypted under `key` and `nonce` (no associated data), then its
/// tag.
fn chacha20_poly1305(
    key: &ring::aead::LessSafeKey,
    nonce: [u8; 12],
    plain: &[u8],
    out: &mut Vec<u8>,
) {
    use ring::aead::{Aad, Nonce};
    let start = out.len();
    out.extend_from_slice(plain);
    let tag = key
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::empty(),
            &mut out[start..],
        )
        .expect("a message shorter than ChaCha20's limit");
    out.extend_from_slice(tag.as_ref());
}

fn hkdf_32(salt: &[u8], ikm: &[u8], info: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    Hkdf::<Sha256>::new(Some(salt), ikm)
        .expand(info, &mut out)
        .expect("32 bytes");
    out
}

/// Whether `value` is a core `Secret`.
pub fn is_secret(value: &Value) -> bool {
    value.get("apiVersion").and_then(Value::as_str) == Some("v1")
        && value.get("kind").and_then(Value::as_str) == Some("Secret")
}

/// `secret` with its `data` and `stringData` sealed to `recipient` (and the
/// last-applied annotation removed); `None` when it has neither.
pub fn seal_secret(
    secret: &Value,
    (sealer, recipient): (&Sealer, &AgentKey),
    identity: &str,
) -> Option<Value> {
    let (mut object, text) = split_secret(secret)?;
    let sealed = sealer.seal(recipient, identity, &text);
    object.insert(
        SEALED_FIELD.to_string(),
        serde_json::json!({ "sealed": STANDARD.encode(sealed) }),
    );
    Some(Value::Object(object))
}

/// `secret` without its `data`, `stringData` and last-applied annotation, and the
/// JSON text of `{"data": …, "stringData": …}`; `None` when it has neither field.
fn split_secret(secret: &Value) -> Option<(Map<String, Value>, Vec<u8>)> {
    let mut object = secret.as_object()?.clone();
    let mut plain = Map::new();
    for field in ["data", "stringData"] {
        if let Some(value) = object.remove(field) {
            plain.insert(field.to_string(), value);
        }
    }
    if plain.is_empty() {
        return None;
    }
    if let Some(Value::Object(annotations)) = object
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
    {
        annotations.remove(LAST_APPLIED);
    }
    let text = serde_json::to_vec(&Value::Object(plain)).expect("JSON");
    Some((object, text))
}

/// What sealing one Secret takes that is the same for every cluster, worked out
/// once per render: its plain text, and the canonical bytes of the sealed Secret on
/// either side of the sealed value, so that each cluster's sealing only encrypts and
/// writes base64 between them.
pub struct Prepared {
    identity: String,
    plain: Vec<u8>,
    /// The canonical bytes before and after the base64 text; `None` when the marker
    /// they are found by is not met exactly once (a Secret that contains it), and
    /// then `object`, the Secret without its values, is sealed the long way.
    around: Option<(Vec<u8>, Vec<u8>)>,
    object: Option<Map<String, Value>>,
    /// HMAC (the sealing key) of the identity, the plain text and the Secret's
    /// canonical text without them: what [`SEALINGS`] knows it by.
    id: [u8; 32],
}

/// Stands for the sealed value while the canonical bytes around it are found.
const MARKER: &str = "flotilla.dev/sealed-value-stands-here";

impl Prepared {
    /// `secret`'s preparation under `identity` (its resource key) for the sealing
    /// key `key`; `None` when it has no `data` or `stringData`.
    fn new(secret: &Value, identity: &str, key: &[u8; 32]) -> Option<Prepared> {
        let (object, plain) = split_secret(secret)?;
        let mut marked = object.clone();
        marked.insert(
            SEALED_FIELD.to_string(),
            serde_json::json!({ "sealed": MARKER }),
        );
        let canonical = flotilla_core::bundle::to_canonical_vec(&Value::Object(marked));
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
        mac.update(b"flotilla.dev/v1 sealed secret");
        for part in [identity.as_bytes(), &plain, &canonical] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        let quoted = format!("\"{MARKER}\"");
        let found: Vec<usize> = canonical
            .windows(quoted.len())
            .enumerate()
            .filter(|(_, w)| *w == quoted.as_bytes())
            .map(|(i, _)| i)
            .collect();
        let (around, object) = match found[..] {
            [at] => (
                Some((
                    canonical[..=at].to_vec(),
                    canonical[at + quoted.len() - 1..].to_vec(),
                )),
                None,
            ),
            _ => (None, Some(object)),
        };
        Some(Prepared {
            identity: identity.to_string(),
            plain,
            around,
            object,
            id: mac.finalize().into_bytes().into(),
        })
    }
}

impl Sealer {
    /// `secret`'s preparation under `identity` (its resource key), known by an id
    /// under this sealer's key; `None` when it has no `data` or `stringData`.
    pub fn prepare(&self, secret: &Value, identity: &str) -> Option<Prepared> {
        Prepared::new(secret, identity, &self.key)
    }

    /// Each of a cluster's Secrets (prepared by this sealer, with its resource key)
    /// sealed to the cluster's `recipient`: from this process's [`SEALINGS`] when an
    /// earlier render, or another cluster of this one, sealed the same Secret for the
    /// same agent, else sealed now. The kept sealings are looked up and added to once
    /// per cluster, and the agent's header found once.
    pub fn sealed_resources(
        &self,
        secrets: &[(&Prepared, &Arc<flotilla_core::bundle::ResourceKey>)],
        recipient: &AgentKey,
    ) -> Vec<Arc<flotilla_core::bundle::Resource>> {
        self.sealed_resources_in(&SEALINGS, secrets, recipient)
    }

    /// [`Sealer::sealed_resources`] with the given [`Sealings`].
    pub(crate) fn sealed_resources_in(
        &self,
        sealings: &std::sync::Mutex<Sealings>,
        secrets: &[(&Prepared, &Arc<flotilla_core::bundle::ResourceKey>)],
        recipient: &AgentKey,
    ) -> Vec<Arc<flotilla_core::bundle::Resource>> {
        let lock = || sealings.lock().unwrap_or_else(|e| e.into_inner());
        let (mut found, retired) = {
            let mut kept = lock();
            let found: Vec<_> = secrets
                .iter()
                .map(|(prepared, _)| kept.get(&(prepared.id, recipient.0)))
                .collect();
            (found, kept.retired.take())
        };
        // What the render before last kept is freed without holding the lock.
        drop(retired);
        if found.iter().any(Option::is_none) {
            let header = self.header(recipient);
            let made: Vec<(usize, Arc<flotilla_core::bundle::Resource>)> = found
                .iter()
                .zip(secrets)
                .enumerate()
                .filter(|(_, (kept, _))| kept.is_none())
                .map(|(i, (_, (prepared, key)))| {
                    let canonical = self.seal_under(prepared, recipient, &header);
                    let sealed = flotilla_core::bundle::Resource {
                        key: Arc::clone(key),
                        canonical: canonical.into(),
                    };
                    (i, Arc::new(sealed))
                })
                .collect();
            let mut kept = lock();
            for (i, sealed) in made {
                found[i] = Some(kept.keep((secrets[i].0.id, recipient.0), sealed));
            }
        }
        found
            .into_iter()
            .map(|sealed| sealed.expect("each Secret kept or sealed"))
            .collect()
    }

    /// The canonical bytes of a prepared Secret sealed to `recipient`: the same as
    /// those of [`seal_secret`]'s value.
    pub fn seal_prepared(&self, prepared: &Prepared, recipient: &AgentKey) -> Vec<u8> {
        self.seal_under(prepared, recipient, &self.header(recipient))
    }

    /// [`Sealer::seal_prepared`] with `recipient`'s header.
    fn seal_under(&self, prepared: &Prepared, recipient: &AgentKey, header: &Header) -> Vec<u8> {
        thread_local! {
            /// The part of the Secret's age file being encoded, before its base64
            /// text is written into the resource: one buffer per thread, not one per
            /// Secret.
            static SEALED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SEALED.with_borrow_mut(|sealed| {
            sealed.clear();
            let parts = (prepared.identity.as_str(), &prepared.plain[..]);
            let canonical = match (&prepared.around, &prepared.object) {
                // The header's text as it was encoded once, then the rest of the file.
                (Some((before, after)), _) => {
                    sealed.extend_from_slice(header.unencoded());
                    self.payload_of(recipient, header, parts, sealed);
                    let encoded = sealed.len().div_ceil(3) * 4;
                    let mut out = Vec::with_capacity(
                        before.len() + header.encoded.len() + encoded + after.len(),
                    );
                    out.extend_from_slice(before);
                    out.extend_from_slice(header.encoded.as_bytes());
                    let at = out.len();
                    out.resize(at + encoded, 0);
                    let written = STANDARD
                        .encode_slice(&sealed[..], &mut out[at..])
                        .expect("room for the base64 text");
                    debug_assert_eq!(written, encoded);
                    out.extend_from_slice(after);
                    out
                }
                (None, object) => {
                    sealed.extend_from_slice(&header.bytes);
                    self.payload_of(recipient, header, parts, sealed);
                    let mut object = object.clone().unwrap_or_default();
                    object.insert(
                        SEALED_FIELD.to_string(),
                        serde_json::json!({ "sealed": STANDARD.encode(&sealed[..]) }),
                    );
                    flotilla_core::bundle::to_canonical_vec(&Value::Object(object))
                }
            };
            // A rare large Secret's room is not held for the life of the thread.
            if sealed.capacity() > KEPT_BUFFER_BYTES {
                *sealed = Vec::new();
            }
            canonical
        })
    }
}

mod kept;
#[cfg(test)]
mod tests;

pub use kept::{
    LONGEST_FILE as KEPT_HEADERS_LONGEST_FILE, MAGIC as KEPT_HEADERS_MAGIC, headers_made,
    offer_headers,
};
