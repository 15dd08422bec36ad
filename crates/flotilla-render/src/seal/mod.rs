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
//! itself derived from the hub's seed, which only the hub's store holds — over the
//! recipient, the resource's identity and the plain text. The same Secret for the same
//! agent seals to the same bytes on every render and every hub sharing the store; a
//! changed value, another Secret or another agent gives unrelated bytes; and nobody
//! without the store can recompute a sealing to test a guessed value against it.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

/// The field of a sealed `Secret` that replaces its `data` and `stringData`.
pub const SEALED_FIELD: &str = flotilla_core::bundle::SEALED_SECRET_FIELD;
/// The annotation `kubectl apply` writes, which would repeat a Secret's values.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// age's plain-text chunk size (STREAM).
const CHUNK: usize = 64 * 1024;

/// Seals Secrets with keys derived from the hub's seed.
pub struct Sealer {
    key: [u8; 32],
}

impl Sealer {
    /// The sealer of the hub whose seed (the store's, never the public one) is `seed`.
    pub fn from_hub_seed(seed: &[u8; 32]) -> Sealer {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(seed).expect("any key length");
        mac.update(b"flotilla.dev/v1 secret sealing key");
        Sealer {
            key: mac.finalize().into_bytes().into(),
        }
    }

    /// An age v1 file (binary) of `plain` for `recipient`, every random value of
    /// which is derived from the sealing key, the recipient, `identity` and `plain`.
    pub fn seal(&self, recipient: &AgentKey, identity: &str, plain: &[u8]) -> Vec<u8> {
        let mut input = Vec::with_capacity(48 + identity.len() + plain.len());
        for part in [&recipient.0[..], identity.as_bytes(), plain] {
            input.extend_from_slice(&(part.len() as u64).to_be_bytes());
            input.extend_from_slice(part);
        }
        let derived = Hkdf::<Sha256>::new(Some(&self.key), &input);
        let mut file_key = [0u8; 16];
        let mut ephemeral = [0u8; 32];
        let mut nonce = [0u8; 16];
        derived
            .expand(b"file key", &mut file_key)
            .and_then(|()| derived.expand(b"ephemeral", &mut ephemeral))
            .and_then(|()| derived.expand(b"payload nonce", &mut nonce))
            .expect("short outputs");
        age_file(recipient, (&file_key, &ephemeral, &nonce), plain)
    }
}

/// A cluster's agent key: the X25519 public key of an age recipient (`age1…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentKey([u8; 32]);

impl AgentKey {
    /// Reads `age1…` (Bech32, as `age-keygen` and the agent print it).
    pub fn parse(text: &str) -> Result<AgentKey, String> {
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
    let secret = x25519_dalek::StaticSecret::from(*ephemeral);
    let share = x25519_dalek::PublicKey::from(&secret);
    let shared = secret.diffie_hellman(&x25519_dalek::PublicKey::from(recipient.0));
    let mut salt = [0u8; 64];
    salt[..32].copy_from_slice(share.as_bytes());
    salt[32..].copy_from_slice(&recipient.0);
    let wrap_key = hkdf_32(&salt, shared.as_bytes(), b"age-encryption.org/v1/X25519");
    let body = ChaCha20Poly1305::new(&wrap_key.into())
        .encrypt(&Nonce::default(), &file_key[..])
        .expect("sealing a file key");
    let mut header = format!(
        "age-encryption.org/v1\n-> X25519 {}\n{}\n---",
        STANDARD_NO_PAD.encode(share.as_bytes()),
        STANDARD_NO_PAD.encode(&body)
    )
    .into_bytes();
    let mac_key = hkdf_32(&[], file_key, b"header");
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&mac_key).expect("any key length");
    mac.update(&header);
    header.extend_from_slice(b" ");
    header.extend_from_slice(
        STANDARD_NO_PAD
            .encode(mac.finalize().into_bytes())
            .as_bytes(),
    );
    header.push(b'\n');

    let mut out = header;
    out.extend_from_slice(nonce);
    let payload_key = hkdf_32(nonce, file_key, b"payload");
    let cipher = ChaCha20Poly1305::new(&payload_key.into());
    let chunks: Vec<&[u8]> = if plain.is_empty() {
        vec![&[]]
    } else {
        plain.chunks(CHUNK).collect()
    };
    let last = chunks.len() - 1;
    for (counter, chunk) in chunks.into_iter().enumerate() {
        let mut chunk_nonce = [0u8; 12];
        chunk_nonce[3..11].copy_from_slice(&(counter as u64).to_be_bytes());
        chunk_nonce[11] = u8::from(counter == last);
        let sealed = cipher
            .encrypt(&Nonce::from(chunk_nonce), chunk)
            .expect("sealing a chunk");
        out.extend_from_slice(&sealed);
    }
    out
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
    let sealed = sealer.seal(recipient, identity, &text);
    object.insert(
        SEALED_FIELD.to_string(),
        serde_json::json!({ "sealed": STANDARD.encode(sealed) }),
    );
    Some(Value::Object(object))
}

#[cfg(test)]
mod tests;
