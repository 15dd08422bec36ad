//! Signed bundles: who made a bundle, not only that its bytes match its digest.
//!
//! The hub (and `publish`) signs, for each served document, the **statement**
//! `{cluster, digest, revision, sequence}` as RFC 8785 canonical JSON with ed25519; the
//! document carries `"signature": {"keyId", "sequence", "sig"}` beside the digest, which
//! still covers the resources only. The sequence is per cluster and goes up on every
//! change of what the cluster is served, so an agent that remembers the highest
//! sequence it accepted can tell a genuine rollback (an older digest, re-served and
//! signed anew with a higher sequence) from a replay of an older signed document.
//!
//! Key files are one printable line each:
//!
//! ```text
//! KEY      flotilla-ed25519-private <base64 of the 32-byte seed>
//! KEY.pub  flotilla-ed25519-public <base64 of the 32-byte public key> <key id>
//! ```
//!
//! The key id is the first 16 hex digits of the sha256 of the public key, so it names
//! the key without a registry and a document names the key that signed it.

use std::fmt;
use std::io::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::Signer as _;
use sha2::{Digest as _, Sha256};

// The signature is part of the document's format, which the bundle module reads;
// it is defined there and named here too.
pub use crate::bundle::BundleSignature;
use crate::bundle::{Digest, document_bytes, write_canonical_string};

const PRIVATE_TAG: &str = "flotilla-ed25519-private";
const PUBLIC_TAG: &str = "flotilla-ed25519-public";

/// [`document_bytes`] with the document's `signature`, which the digest does not
/// cover. `signature` sorts after every other member of the document, so the
/// signed document is the unsigned one with it added last, and still canonical.
pub fn signed_document_bytes(
    cluster: &str,
    digest: &Digest,
    revision: &str,
    body: &[u8],
    signature: Option<&BundleSignature>,
) -> Vec<u8> {
    let mut out = document_bytes(cluster, digest, revision, body);
    if let Some(signature) = signature {
        out.pop();
        out.extend_from_slice(b",\"signature\":{\"keyId\":");
        write_canonical_string(&mut out, &signature.key_id);
        let _ = write!(out, ",\"sequence\":{},\"sig\":", signature.sequence);
        write_canonical_string(&mut out, &signature.sig);
        out.extend_from_slice(b"}}");
    }
    out
}

/// The canonical JSON bytes of the statement a signature covers:
/// `{"cluster":…,"digest":…,"revision":…,"sequence":N}`.
pub fn statement(cluster: &str, digest: &Digest, revision: &str, sequence: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(cluster.len() + revision.len() + 128);
    out.extend_from_slice(b"{\"cluster\":");
    write_canonical_string(&mut out, cluster);
    out.extend_from_slice(b",\"digest\":");
    write_canonical_string(&mut out, digest.as_str());
    out.extend_from_slice(b",\"revision\":");
    write_canonical_string(&mut out, revision);
    // Sequences stay far below 2^53, where canonical JSON numbers are plain integers.
    out.extend_from_slice(format!(",\"sequence\":{sequence}}}").as_bytes());
    out
}

/// Why a key file or a signature is not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error(
        "not a flotilla signing key: expected one line \"{PRIVATE_TAG} <base64>\" (made by `flotilla key generate`)"
    )]
    NotPrivateKey,
    #[error(
        "not a flotilla public key: expected one line \"{PUBLIC_TAG} <base64> [key id]\" (the KEY.pub that `flotilla key generate` wrote)"
    )]
    NotPublicKey,
    #[error("the key's base64 does not decode to 32 bytes")]
    BadKeyBytes,
    #[error("the public key's bytes are not a valid ed25519 point")]
    BadPublicKey,
    #[error("the public key file says key id {written} but the key's id is {actual}")]
    KeyIdMismatch { written: String, actual: String },
}

/// A private signing key (the hub's and `publish`'s `--signing-key`).
pub struct SigningKey {
    key: ed25519_dalek::SigningKey,
    id: String,
}

impl fmt::Debug for SigningKey {
    // Never prints the key itself.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({})", self.id)
    }
}

impl SigningKey {
    /// The key made from 32 random bytes (the caller draws them from the system's
    /// random source; this crate has none).
    pub fn from_seed(seed: [u8; 32]) -> SigningKey {
        let key = ed25519_dalek::SigningKey::from_bytes(&seed);
        let id = key_id(key.verifying_key().as_bytes());
        SigningKey { key, id }
    }

    /// Reads the private key file's text.
    pub fn parse(text: &str) -> Result<SigningKey, KeyError> {
        let mut words = text.split_whitespace();
        if words.next() != Some(PRIVATE_TAG) {
            return Err(KeyError::NotPrivateKey);
        }
        let seed = decode_32(words.next().ok_or(KeyError::NotPrivateKey)?)?;
        if words.next().is_some() {
            return Err(KeyError::NotPrivateKey);
        }
        Ok(SigningKey::from_seed(seed))
    }

    /// The private key file's text (one line).
    pub fn to_file_text(&self) -> String {
        format!("{PRIVATE_TAG} {}\n", BASE64.encode(self.key.to_bytes()))
    }

    pub fn key_id(&self) -> &str {
        &self.id
    }

    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            key: self.key.verifying_key(),
            id: self.id.clone(),
        }
    }

    /// Signs the statement of one served document.
    pub fn sign(
        &self,
        cluster: &str,
        digest: &Digest,
        revision: &str,
        sequence: u64,
    ) -> BundleSignature {
        let signature = self
            .key
            .sign(&statement(cluster, digest, revision, sequence));
        BundleSignature {
            key_id: self.id.clone(),
            sequence,
            sig: BASE64.encode(signature.to_bytes()),
        }
    }
}

/// What a signature of the platform's tenant rules covers: this prefix, then the
/// canonical rules. No bundle statement starts with it, so neither signature can
/// stand for the other.
const TENANT_RULES_DOMAIN: &[u8] = b"flotilla tenant rules v1\n";

impl SigningKey {
    /// Signs the canonical bytes of the platform's tenant rules (`flotilla tenants
    /// sign`); returns the base64 signature.
    pub fn sign_tenant_rules(&self, canonical: &[u8]) -> String {
        let mut message = TENANT_RULES_DOMAIN.to_vec();
        message.extend_from_slice(canonical);
        BASE64.encode(self.key.sign(&message).to_bytes())
    }
}

impl PublicKey {
    /// Whether `sig` (base64) is this key's signature of the tenant rules.
    pub fn verifies_tenant_rules(&self, canonical: &[u8], sig: &str) -> bool {
        let Ok(bytes) = BASE64.decode(sig.as_bytes()) else {
            return false;
        };
        let Ok(bytes) = <[u8; 64]>::try_from(bytes.as_slice()) else {
            return false;
        };
        let mut message = TENANT_RULES_DOMAIN.to_vec();
        message.extend_from_slice(canonical);
        self.key
            .verify_strict(&message, &ed25519_dalek::Signature::from_bytes(&bytes))
            .is_ok()
    }
}

/// A public key an agent trusts (`--trust-key KEY.pub`).
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: ed25519_dalek::VerifyingKey,
    id: String,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.id)
    }
}

impl PublicKey {
    /// Reads the public key file's line; a key id written after the key must be the
    /// key's own (a file edited by hand that names another key is refused).
    pub fn parse(text: &str) -> Result<PublicKey, KeyError> {
        let mut words = text.split_whitespace();
        if words.next() != Some(PUBLIC_TAG) {
            return Err(KeyError::NotPublicKey);
        }
        let bytes = decode_32(words.next().ok_or(KeyError::NotPublicKey)?)?;
        let key =
            ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::BadPublicKey)?;
        let id = key_id(&bytes);
        if let Some(written) = words.next()
            && written != id
        {
            return Err(KeyError::KeyIdMismatch {
                written: written.to_string(),
                actual: id,
            });
        }
        if words.next().is_some() {
            return Err(KeyError::NotPublicKey);
        }
        Ok(PublicKey { key, id })
    }

    /// The public key file's text: one printable line with the key id at its end.
    pub fn to_file_text(&self) -> String {
        format!(
            "{PUBLIC_TAG} {} {}\n",
            BASE64.encode(self.key.as_bytes()),
            self.id
        )
    }

    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// Whether `signature` is this key's signature of the statement. The sequence
    /// signed is the one the signature names.
    pub fn verifies(
        &self,
        cluster: &str,
        digest: &Digest,
        revision: &str,
        signature: &BundleSignature,
    ) -> bool {
        let Ok(bytes) = BASE64.decode(signature.sig.as_bytes()) else {
            return false;
        };
        let Ok(bytes) = <[u8; 64]>::try_from(bytes.as_slice()) else {
            return false;
        };
        let sig = ed25519_dalek::Signature::from_bytes(&bytes);
        self.key
            .verify_strict(
                &statement(cluster, digest, revision, signature.sequence),
                &sig,
            )
            .is_ok()
    }
}

fn key_id(public: &[u8; 32]) -> String {
    hex::encode(&Sha256::digest(public)[..8])
}

fn decode_32(text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = BASE64
        .decode(text.as_bytes())
        .map_err(|_| KeyError::BadKeyBytes)?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| KeyError::BadKeyBytes)
}

/// What an agent holds: the sequence and digest of the last bundle it accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub sequence: u64,
    pub digest: Digest,
}

/// Why a signed document is refused (the agent reports it and keeps its bundle).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrustError {
    #[error("the bundle is not signed, and this agent trusts only signed bundles (--trust-key)")]
    Unsigned,
    #[error("the bundle is signed by key {0}, which this agent does not trust (--trust-key)")]
    UnknownKey(String),
    #[error(
        "the bundle's signature by key {0} does not verify: its cluster, digest, revision or sequence was changed after signing, or it was not signed by that key"
    )]
    BadSignature(String),
    #[error(
        "the bundle's sequence {offered} is older than the {held} this agent holds: an older signed bundle replayed (a rollback is re-served with a higher sequence)"
    )]
    OlderSequence { offered: u64, held: u64 },
    #[error(
        "the bundle's sequence {sequence} is the one this agent holds, but for {offered} instead of {held}: two bundles signed with one sequence"
    )]
    SequenceReused {
        sequence: u64,
        offered: Digest,
        held: Digest,
    },
}

/// The keys an agent trusts (one, or several while keys are rotated).
#[derive(Clone, Debug, Default)]
pub struct TrustedKeys {
    keys: Vec<PublicKey>,
}

impl TrustedKeys {
    pub fn new(keys: Vec<PublicKey>) -> TrustedKeys {
        TrustedKeys { keys }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(PublicKey::key_id).collect()
    }

    /// Accepts a document (already checked against its digest) only when a trusted
    /// key signed its statement and its sequence is higher than the one held, or the
    /// sequence and the digest are both the ones held.
    pub fn check(
        &self,
        cluster: &str,
        digest: &Digest,
        revision: &str,
        signature: Option<&BundleSignature>,
        held: Option<&Held>,
    ) -> Result<(), TrustError> {
        let signature = signature.ok_or(TrustError::Unsigned)?;
        let key = self
            .keys
            .iter()
            .find(|k| k.key_id() == signature.key_id)
            .ok_or_else(|| TrustError::UnknownKey(signature.key_id.clone()))?;
        if !key.verifies(cluster, digest, revision, signature) {
            return Err(TrustError::BadSignature(signature.key_id.clone()));
        }
        match held {
            Some(held) if signature.sequence < held.sequence => Err(TrustError::OlderSequence {
                offered: signature.sequence,
                held: held.sequence,
            }),
            Some(held) if signature.sequence == held.sequence && *digest != held.digest => {
                Err(TrustError::SequenceReused {
                    sequence: signature.sequence,
                    offered: digest.clone(),
                    held: held.digest.clone(),
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::from_seed([n; 32])
    }

    fn digest(text: &str) -> Digest {
        Digest::of(text.as_bytes())
    }

    #[test]
    fn the_statement_is_canonical_json() {
        let statement = statement("edge-1", &digest("a"), "main@sha1:c0ffee", 7);
        let parsed: serde_json::Value = serde_json::from_slice(&statement).expect("JSON");
        assert_eq!(crate::bundle::to_canonical_vec(&parsed), statement);
        assert!(
            String::from_utf8(statement)
                .expect("utf-8")
                .starts_with("{\"cluster\":\"edge-1\",\"digest\":\"sha256:")
        );
    }

    #[test]
    fn key_files_round_trip_and_name_their_key() {
        let private = key(1);
        let again = SigningKey::parse(&private.to_file_text()).expect("parses");
        assert_eq!(again.key_id(), private.key_id());
        let public_text = private.public_key().to_file_text();
        assert_eq!(public_text.lines().count(), 1);
        assert!(public_text.trim_end().ends_with(private.key_id()));
        let public = PublicKey::parse(&public_text).expect("parses");
        assert_eq!(public, private.public_key());
        assert_eq!(private.key_id().len(), 16);
        assert!(!format!("{private:?}").contains(&BASE64.encode([1u8; 32])));
    }

    #[test]
    fn malformed_key_files_are_refused_with_what_to_do() {
        let public_text = key(1).public_key().to_file_text();
        let other_id = key(2).key_id().to_string();
        let cases: Vec<(String, KeyError)> = vec![
            (public_text.clone(), KeyError::NotPrivateKey),
            (
                "flotilla-ed25519-private AAAA\n".into(),
                KeyError::BadKeyBytes,
            ),
            ("flotilla-ed25519-private".into(), KeyError::NotPrivateKey),
        ];
        for (text, expected) in cases {
            assert_eq!(SigningKey::parse(&text).expect_err("refused"), expected);
        }
        assert_eq!(
            PublicKey::parse(&key(1).to_file_text()).expect_err("refused"),
            KeyError::NotPublicKey
        );
        let edited = public_text.replace(key(1).key_id(), &other_id);
        assert!(matches!(
            PublicKey::parse(&edited).expect_err("refused"),
            KeyError::KeyIdMismatch { .. }
        ));
        // Without the key id the line is still a key.
        let bare: String = public_text
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(PublicKey::parse(&bare).is_ok());
    }

    /// One case of the agent's decision: what it holds, what is offered (signed by
    /// `signer` over the offered statement, then perhaps altered), and the verdict.
    struct Case {
        name: &'static str,
        trusted: Vec<u8>,
        signer: u8,
        signed: (&'static str, u64),
        offered: &'static str,
        held: Option<(&'static str, u64)>,
        expect: Result<(), &'static str>,
    }

    fn check(case: Case) {
        let trusted = TrustedKeys::new(case.trusted.iter().map(|&n| key(n).public_key()).collect());
        let signature = key(case.signer).sign(
            "edge-1",
            &digest(case.signed.0),
            "main@sha1:1",
            case.signed.1,
        );
        let held = case.held.map(|(d, sequence)| Held {
            sequence,
            digest: digest(d),
        });
        let got = trusted
            .check(
                "edge-1",
                &digest(case.offered),
                "main@sha1:1",
                Some(&signature),
                held.as_ref(),
            )
            .map_err(|e| e.to_string());
        match (got, case.expect) {
            (Ok(()), Ok(())) => {}
            (Err(message), Err(needle)) if message.contains(needle) => {}
            (got, expect) => panic!("{}: got {got:?}, expected {expect:?}", case.name),
        }
    }

    #[test]
    fn the_agent_accepts_only_trusted_newer_signatures() {
        let cases = [
            Case {
                name: "valid, nothing held",
                trusted: vec![1],
                signer: 1,
                signed: ("a", 1),
                offered: "a",
                held: None,
                expect: Ok(()),
            },
            Case {
                name: "higher sequence",
                trusted: vec![1],
                signer: 1,
                signed: ("b", 5),
                offered: "b",
                held: Some(("a", 4)),
                expect: Ok(()),
            },
            Case {
                name: "a rollback re-served with a higher sequence",
                trusted: vec![1],
                signer: 1,
                signed: ("a", 6),
                offered: "a",
                held: Some(("b", 5)),
                expect: Ok(()),
            },
            Case {
                name: "the same bundle again",
                trusted: vec![1],
                signer: 1,
                signed: ("a", 4),
                offered: "a",
                held: Some(("a", 4)),
                expect: Ok(()),
            },
            Case {
                name: "forged content with a recomputed digest",
                trusted: vec![1],
                signer: 1,
                signed: ("a", 5),
                offered: "forged",
                held: Some(("a", 4)),
                expect: Err("does not verify"),
            },
            Case {
                name: "wrong key",
                trusted: vec![1],
                signer: 2,
                signed: ("b", 5),
                offered: "b",
                held: None,
                expect: Err("does not trust"),
            },
            Case {
                name: "older sequence: a rollback attack",
                trusted: vec![1],
                signer: 1,
                signed: ("a", 3),
                offered: "a",
                held: Some(("b", 4)),
                expect: Err("older than the 4"),
            },
            Case {
                name: "equal sequence, other digest",
                trusted: vec![1],
                signer: 1,
                signed: ("c", 4),
                offered: "c",
                held: Some(("b", 4)),
                expect: Err("two bundles signed with one sequence"),
            },
            Case {
                name: "rotated key: the new one of two trusted",
                trusted: vec![1, 2],
                signer: 2,
                signed: ("b", 5),
                offered: "b",
                held: Some(("a", 4)),
                expect: Ok(()),
            },
            Case {
                name: "rotated key: the old one of two trusted",
                trusted: vec![1, 2],
                signer: 1,
                signed: ("b", 5),
                offered: "b",
                held: Some(("a", 4)),
                expect: Ok(()),
            },
        ];
        for case in cases {
            check(case);
        }
    }

    #[test]
    fn a_signature_covers_cluster_revision_and_sequence() {
        let signer = key(1);
        let public = signer.public_key();
        let d = digest("a");
        let mut signature = signer.sign("edge-1", &d, "main@sha1:1", 3);
        assert!(public.verifies("edge-1", &d, "main@sha1:1", &signature));
        assert!(!public.verifies("edge-2", &d, "main@sha1:1", &signature));
        assert!(!public.verifies("edge-1", &d, "main@sha1:2", &signature));
        signature.sequence = 4;
        assert!(!public.verifies("edge-1", &d, "main@sha1:1", &signature));
        signature.sequence = 3;
        signature.sig = "not base64!".into();
        assert!(!public.verifies("edge-1", &d, "main@sha1:1", &signature));
    }

    #[test]
    fn an_unsigned_document_is_refused_when_a_key_is_required() {
        let trusted = TrustedKeys::new(vec![key(1).public_key()]);
        assert_eq!(
            trusted.check("edge-1", &digest("a"), "r", None, None),
            Err(TrustError::Unsigned)
        );
    }
}
