//! SOPS documents written: the mirror of opening them, for handing a cluster's
//! Secrets to a tool that decrypts SOPS itself (Flux's kustomize-controller).
//!
//! A Secret becomes the YAML document `sops` would write for it with
//! `--encrypted-regex '^(data|stringData)$'` and one age recipient: every value under
//! `data` and `stringData` is `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`, encrypted
//! with a 32-byte data key and a 32-byte nonce and bound to its path (`data:password:`);
//! the data key is an armoured age file for the recipient; the MAC is SHA-512 over
//! every value in document order, encrypted under the data key and bound to
//! `lastmodified`. Maps are written with their keys sorted, as the bundle's canonical
//! JSON holds them, so the MAC is the same whether a reader walks the YAML or the JSON
//! form of the document: Flux's kustomize-controller decrypts a built resource as
//! JSON made through a Go map, whose keys come out sorted.
//!
//! Pure, like the rest of the renderer: no clock and no operating-system randomness.
//! The caller gives the time (`lastmodified`) and a 32-byte seed; the data key, the
//! nonces and the age file's randomness are derived (HKDF-SHA256) from the seed, the
//! recipient, the resource's identity and its plain text. A fresh random seed makes
//! each document as a random data key would; a seed kept secret and reused makes the
//! same Secret encrypt to the same bytes, and nobody without the seed can recompute an
//! encryption to test a guessed value against it. A nonce never repeats under one data
//! key with different plain text, because the data key depends on all of it.

use std::io::Write as _;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hkdf::Hkdf;
use serde_json::Value;
use sha2::{Digest as _, Sha256, Sha512};

use super::{Node, SopsCipher, hex_upper};
use crate::seal::AgentKey;

/// The `encrypted_regex` of the documents written here: Secrets' values only (and
/// the keys named to [`SopsWriter::encrypt_also`]), so a reader without the key still
/// sees what each document is.
pub const SECRET_VALUES_REGEX: &str = "^(data|stringData)$";
/// The `sops.version` written: the document format of sops 3.9 and later (no
/// `mac_only_encrypted`, empty key lists left out).
pub const SOPS_FORMAT_VERSION: &str = "3.9.0";

/// Writes SOPS documents from a seed and a time the caller gives.
pub struct SopsWriter {
    seed: [u8; 32],
    lastmodified: String,
}

/// Why a document could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SopsWriteError {
    #[error("not a JSON object")]
    NotAnObject,
    #[error("{0} is nested more deeply than a bundle's resources may be")]
    TooDeep(String),
    #[error("a key cannot be named in `encrypted_regex`: {0}")]
    Regex(String),
    #[error("cannot write the data key's age file: {0}")]
    Armor(String),
    #[error("cannot write the document as YAML: {0}")]
    Yaml(String),
}

impl SopsWriter {
    /// A writer whose documents say they were last modified `unix_seconds` after
    /// 1970-01-01T00:00:00Z, with randomness derived from `seed`.
    pub fn new(seed: [u8; 32], unix_seconds: u64) -> SopsWriter {
        SopsWriter {
            seed,
            lastmodified: rfc3339_utc(unix_seconds),
        }
    }

    /// `lastmodified` as written (RFC 3339, whole seconds, UTC).
    pub fn lastmodified(&self) -> &str {
        &self.lastmodified
    }

    /// `document` (a JSON object, such as a `Secret`) as a SOPS YAML document whose
    /// values under a top-level `data` or `stringData` are encrypted for `recipient`.
    /// `identity` names the document (a resource's identity) and goes into the
    /// derivation of its randomness only.
    pub fn encrypt(
        &self,
        document: &Value,
        recipient: &AgentKey,
        identity: &str,
    ) -> Result<String, SopsWriteError> {
        self.encrypt_also(document, recipient, identity, &[])
    }

    /// [`SopsWriter::encrypt`], with the values under the keys `also` (wherever they
    /// are, as sops reads `encrypted_regex`) encrypted too: a Secret's annotations or
    /// labels that copy its values.
    pub fn encrypt_also(
        &self,
        document: &Value,
        recipient: &AgentKey,
        identity: &str,
        also: &[String],
    ) -> Result<String, SopsWriteError> {
        if !document.is_object() {
            return Err(SopsWriteError::NotAnObject);
        }
        if flotilla_core::bundle::nests_deeper_than(
            document,
            flotilla_core::bundle::MAX_NESTING_DEPTH,
        ) {
            return Err(SopsWriteError::TooDeep(identity.to_string()));
        }
        // serde_json's maps iterate in key order: the tree below is sorted.
        let plain: Node =
            serde_json::from_value(document.clone()).map_err(|_| SopsWriteError::NotAnObject)?;
        let plain_bytes = serde_json::to_vec(document).map_err(|_| SopsWriteError::NotAnObject)?;
        let recipient_text = recipient.to_string();
        let derived = derivation(
            &self.seed,
            &[recipient_text.as_bytes(), identity.as_bytes(), &plain_bytes],
        );
        let data_key: [u8; 32] = expand(&derived, b"sops data key");
        let cipher = SopsCipher::new_from_slice(&data_key).expect("a 32-byte key");
        let values = Hkdf::<Sha256>::new(Some(&data_key), b"flotilla.dev/v1 sops nonces");
        let pattern = if also.is_empty() {
            SECRET_VALUES_REGEX.to_string()
        } else {
            let extra: Vec<String> = also.iter().map(|k| regex::escape(k)).collect();
            format!("^(data|stringData|{})$", extra.join("|"))
        };
        let regex =
            regex::Regex::new(&pattern).map_err(|e| SopsWriteError::Regex(e.to_string()))?;

        let mut mac = Sha512::new();
        let mut path = Vec::new();
        let Node::Map(entries) =
            encrypt_node(&plain, &mut path, &regex, (&cipher, &values), &mut mac)
        else {
            return Err(SopsWriteError::NotAnObject);
        };

        let mac_nonce: [u8; 32] = expand(&values, format!("mac\0{}", self.lastmodified).as_bytes());
        let mac_value = encrypt_value(
            &cipher,
            &mac_nonce,
            &Node::Str(hex_upper(&mac.finalize())),
            &self.lastmodified,
        );
        let file_key: [u8; 16] = expand(&derived, b"age file key");
        let ephemeral: [u8; 32] = expand(&derived, b"age ephemeral");
        let payload_nonce: [u8; 16] = expand(&derived, b"age payload nonce");
        let age_file = crate::seal::age_file(
            recipient,
            (&file_key, &ephemeral, &payload_nonce),
            &data_key,
        );
        let enc = armored(&age_file)?;

        let metadata = Node::Map(vec![
            (
                "age".to_string(),
                Node::Seq(vec![Node::Map(vec![
                    ("recipient".to_string(), Node::Str(recipient_text)),
                    ("enc".to_string(), Node::Str(enc)),
                ])]),
            ),
            (
                "lastmodified".to_string(),
                Node::Str(self.lastmodified.clone()),
            ),
            ("mac".to_string(), Node::Str(mac_value)),
            ("encrypted_regex".to_string(), Node::Str(pattern)),
            (
                "version".to_string(),
                Node::Str(SOPS_FORMAT_VERSION.to_string()),
            ),
        ]);
        let mut entries = entries;
        entries.push(("sops".to_string(), metadata));
        serde_saphyr::to_string(&Node::Map(entries))
            .map_err(|e| SopsWriteError::Yaml(e.to_string()))
    }
}

/// The values of `node` under a key the regex matches encrypted, and every value added
/// to the MAC, in document order (as sops walks a tree it encrypts).
fn encrypt_node(
    node: &Node,
    path: &mut Vec<String>,
    regex: &regex::Regex,
    (cipher, nonces): (&SopsCipher, &Hkdf<Sha256>),
    mac: &mut Sha512,
) -> Node {
    match node {
        Node::Map(entries) => Node::Map(
            entries
                .iter()
                .map(|(key, value)| {
                    path.push(key.clone());
                    let out = encrypt_node(value, path, regex, (cipher, nonces), mac);
                    path.pop();
                    (key.clone(), out)
                })
                .collect(),
        ),
        Node::Seq(items) => Node::Seq(
            items
                .iter()
                .map(|item| encrypt_node(item, path, regex, (cipher, nonces), mac))
                .collect(),
        ),
        // sops leaves nulls as they are and adds nothing for them to the MAC.
        Node::Null => Node::Null,
        scalar => {
            mac.update(scalar.mac_bytes());
            let encrypted = path.iter().any(|k| regex.is_match(k));
            match scalar {
                _ if !encrypted => scalar.clone(),
                // sops writes an empty string as it is.
                Node::Str(text) if text.is_empty() => scalar.clone(),
                _ => {
                    let aad = format!("{}:", path.join(":"));
                    let nonce: [u8; 32] = expand(nonces, format!("value\0{aad}").as_bytes());
                    Node::Str(encrypt_value(cipher, &nonce, scalar, &aad))
                }
            }
        }
    }
}

/// One scalar as sops writes it encrypted: `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]`.
fn encrypt_value(cipher: &SopsCipher, nonce: &[u8; 32], value: &Node, aad: &str) -> String {
    let (plain, kind) = match value {
        Node::Str(s) => (s.clone().into_bytes(), "str"),
        Node::Int(i) => (i.to_string().into_bytes(), "int"),
        Node::Uint(u) => (u.to_string().into_bytes(), "int"),
        Node::Float(f) => (f.to_string().into_bytes(), "float"),
        // Go's strconv.FormatBool.
        Node::Bool(b) => (b.to_string().into_bytes(), "bool"),
        Node::Null | Node::Seq(_) | Node::Map(_) => (Vec::new(), "str"),
    };
    let nonce = aes_gcm::aead::generic_array::GenericArray::from_slice(nonce);
    let sealed = cipher
        .encrypt(
            nonce,
            Payload {
                msg: &plain,
                aad: aad.as_bytes(),
            },
        )
        .expect("AES-GCM encrypts any short message");
    let (data, tag) = sealed.split_at(sealed.len() - 16);
    format!(
        "ENC[AES256_GCM,data:{},iv:{},tag:{},type:{kind}]",
        STANDARD.encode(data),
        STANDARD.encode(nonce),
        STANDARD.encode(tag)
    )
}

/// An age file in age's ASCII armour, as sops stores a data key.
fn armored(file: &[u8]) -> Result<String, SopsWriteError> {
    let to_error = |e: std::io::Error| SopsWriteError::Armor(e.to_string());
    let mut writer =
        age::armor::ArmoredWriter::wrap_output(Vec::new(), age::armor::Format::AsciiArmor)
            .map_err(to_error)?;
    writer.write_all(file).map_err(to_error)?;
    let bytes = writer.finish().map_err(to_error)?;
    String::from_utf8(bytes).map_err(|e| SopsWriteError::Armor(e.to_string()))
}

/// HKDF over the seed and the length-prefixed parts.
fn derivation(seed: &[u8; 32], parts: &[&[u8]]) -> Hkdf<Sha256> {
    let mut input = Vec::new();
    for part in parts {
        input.extend_from_slice(&(part.len() as u64).to_be_bytes());
        input.extend_from_slice(part);
    }
    Hkdf::<Sha256>::new(Some(seed), &input)
}

fn expand<const N: usize>(hkdf: &Hkdf<Sha256>, info: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    hkdf.expand(info, &mut out).expect("a short output");
    out
}

/// `unix_seconds` as RFC 3339 in UTC with whole seconds, as sops writes
/// `lastmodified` (and as Go's `time.RFC3339` formats it for the MAC).
pub fn rfc3339_utc(unix_seconds: u64) -> String {
    let days = unix_seconds / 86_400;
    let seconds = unix_seconds % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (days counted in 400-year
/// eras of 146,097 days, with years starting in March so leap days come last).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z % 146_097;
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
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month, day)
}
