//! SOPS documents in the fleet: YAML or JSON files whose values `sops` encrypted
//! (AES-256-GCM, one data key per file) with the data key sealed to age recipients.
//!
//! Pure: the file's text and the caller's age identities in, the plain document out.
//! The data key is opened with the `age` crate; each value is checked against its
//! path (the additional data sops binds it to) and the whole file against its MAC
//! (SHA-512 over every value in document order, itself encrypted under the data key
//! and bound to `lastmodified`), so a file edited without the key is refused, never
//! read in part. The plain document comes back as JSON text (which every YAML reader
//! of the renderer reads), one document per YAML document, without the `sops` key;
//! nothing of it is kept after the render.
//!
//! What `sops` writes and this reads: age recipients (top-level `age` or one key
//! group), `unencrypted_suffix`, `encrypted_suffix`, `unencrypted_regex`,
//! `encrypted_regex` and `mac_only_encrypted`. Refused with a reason: the comment
//! regexes (they depend on YAML comments), several key groups (Shamir's sharing),
//! and files with no age recipient (PGP and cloud KMS keys cannot be opened here).

use std::fmt;
use std::io::Read;
use std::str::FromStr;
use std::sync::Arc;

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::snapshot::FleetSnapshot;

use crate::load::TenantFiles;

use aes_gcm::aead::consts::U32;
use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::aes::Aes256;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use sha2::{Digest as _, Sha512};

mod encrypt;
pub use encrypt::{
    SECRET_VALUES_REGEX, SOPS_FORMAT_VERSION, SopsWriteError, SopsWriter, rfc3339_utc,
};

/// AES-256-GCM with the 32-byte nonces sops uses.
type SopsCipher = aes_gcm::AesGcm<Aes256, U32>;

/// The bytes sops hashes first when only encrypted values are covered by the MAC, so
/// that such a MAC never equals one over every value.
const MAC_ONLY_ENCRYPTED_INIT: [u8; 32] = [
    0x8a, 0x3f, 0xd2, 0xad, 0x54, 0xce, 0x66, 0x52, 0x7b, 0x10, 0x34, 0xf3, 0xd1, 0x47, 0xbe, 0x0b,
    0x0b, 0x97, 0x5b, 0x3b, 0xf4, 0x4f, 0x72, 0xc6, 0xfd, 0xad, 0xec, 0x81, 0x76, 0xf2, 0x7d, 0x69,
];

/// The age identities a render may open SOPS files with (several during a rotation):
/// the platform's, and each tenant's own (`--decryption-key TENANT=FILE`). When some
/// tenant has identities of its own, each SOPS file is opened only with those of the
/// tenant whose workload folder holds it (the platform's for a tenant without any),
/// and a file of no tenant only with the platform's: one tenant's Secrets cannot be
/// opened, and so sealed to its clusters, by another's workloads.
#[derive(Clone, Default)]
pub struct DecryptionKeys {
    identities: Vec<age::x25519::Identity>,
    tenants: std::collections::BTreeMap<String, Vec<age::x25519::Identity>>,
}

impl fmt::Debug for DecryptionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DecryptionKeys({:?})", self.recipients())
    }
}

impl DecryptionKeys {
    /// Reads an age identity file as `age-keygen` writes it: `#` comments, blank
    /// lines and `AGE-SECRET-KEY-1…` lines. Errors name the line (never its text).
    pub fn from_identity_file(text: &str) -> Result<DecryptionKeys, String> {
        let mut keys = DecryptionKeys::default();
        keys.add_identity_file(text)?;
        Ok(keys)
    }

    /// Adds the identities of one more identity file.
    pub fn add_identity_file(&mut self, text: &str) -> Result<(), String> {
        let found = read_identities(text)?;
        self.identities.extend(found);
        Ok(())
    }

    /// Adds the identities of one more identity file for one tenant's SOPS files.
    pub fn add_tenant_identity_file(&mut self, tenant: &str, text: &str) -> Result<(), String> {
        let found = read_identities(text)?;
        self.tenants
            .entry(tenant.to_string())
            .or_default()
            .extend(found);
        Ok(())
    }

    /// The identities, as they were written (for handing to another process): the
    /// platform's as they are, a tenant's after `@TENANT `. [`DecryptionKeys::from_lines`]
    /// reads them back.
    pub fn identity_lines(&self) -> Vec<String> {
        use age::secrecy::ExposeSecret as _;
        let line = |i: &age::x25519::Identity| i.to_string().expose_secret().to_string();
        let tenants = self
            .tenants
            .iter()
            .flat_map(|(tenant, ids)| ids.iter().map(move |i| format!("@{tenant} {}", line(i))));
        self.identities.iter().map(line).chain(tenants).collect()
    }

    /// The hub's own secret for sealing Secrets to agents: derived (HKDF-SHA256, with
    /// a label of its own) from the platform's first identity, the key the operator
    /// already holds to open the fleet's SOPS files; without a platform identity,
    /// from every tenant's identities together (so that no one tenant's key derives
    /// it); `None` without any. It is never stored: every hub of a store, and
    /// `publish`, given the same keys, seal alike. Replacing the platform's first
    /// identity (a rotation) seals every Secret anew once.
    pub fn sealing_secret(&self) -> Option<[u8; 32]> {
        use age::secrecy::ExposeSecret as _;
        let identity = match self.identities.first() {
            Some(first) => first.to_string().expose_secret().to_string(),
            None if self.tenants.is_empty() => return None,
            None => self.identity_lines().join("\n"),
        };
        let hkdf = hkdf::Hkdf::<sha2::Sha256>::new(None, identity.as_bytes());
        let mut secret = [0u8; 32];
        hkdf.expand(b"flotilla.dev/v1 hub sealing secret", &mut secret)
            .ok()?;
        Some(secret)
    }

    /// Reads what [`DecryptionKeys::identity_lines`] wrote.
    pub fn from_lines(lines: &[String]) -> Result<DecryptionKeys, String> {
        let mut keys = DecryptionKeys::default();
        for line in lines {
            match line.strip_prefix('@').and_then(|rest| rest.split_once(' ')) {
                Some((tenant, identity)) => keys.add_tenant_identity_file(tenant, identity)?,
                None => keys.add_identity_file(line)?,
            }
        }
        Ok(keys)
    }

    /// Whether some tenant has identities of its own.
    pub fn has_tenant_keys(&self) -> bool {
        !self.tenants.is_empty()
    }

    /// The keys that open the SOPS files of `tenant` (`None`: the platform's).
    fn for_owner(&self, tenant: Option<&str>) -> DecryptionKeys {
        let identities = tenant
            .and_then(|t| self.tenants.get(t))
            .unwrap_or(&self.identities)
            .clone();
        DecryptionKeys {
            identities,
            tenants: Default::default(),
        }
    }

    /// The public keys (`age1…`) of the identities.
    pub fn recipients(&self) -> Vec<String> {
        self.identities
            .iter()
            .map(|i| i.to_public().to_string())
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.identities.is_empty() && self.tenants.is_empty()
    }

    /// Opens an age file (armoured or binary) with any of the identities.
    fn open(&self, file: &[u8]) -> Option<Vec<u8>> {
        let reader = age::armor::ArmoredReader::new(file);
        let decryptor = age::Decryptor::new_buffered(reader).ok()?;
        let mut stream = decryptor
            .decrypt(self.identities.iter().map(|i| i as &dyn age::Identity))
            .ok()?;
        let mut plain = Vec::new();
        stream.read_to_end(&mut plain).ok()?;
        Some(plain)
    }
}

/// The identities of an identity file as `age-keygen` writes it.
fn read_identities(text: &str) -> Result<Vec<age::x25519::Identity>, String> {
    let mut found = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let identity = age::x25519::Identity::from_str(line).map_err(|reason| {
            format!(
                "line {}: not an age identity (AGE-SECRET-KEY-1…): {reason}",
                number + 1
            )
        })?;
        found.push(identity);
    }
    if found.is_empty() {
        return Err("no age identity (AGE-SECRET-KEY-1…) in the file".to_string());
    }
    Ok(found)
}

/// Which tenant's workload folder holds each path, as the fleet's Tenant files
/// claim workloads (read once per render, ahead of the load, which reports any
/// problem with them).
struct Owners<'t> {
    tenants: Vec<(&'t str, &'t [String])>,
}

impl<'t> Owners<'t> {
    fn of(tenants: &'t TenantFiles) -> Owners<'t> {
        Owners {
            tenants: tenants.claims().collect(),
        }
    }

    fn owner(&self, path: &str) -> Option<&str> {
        let workload = path.strip_prefix("workloads/")?.split('/').next()?;
        self.tenants
            .iter()
            .find(|(_, patterns)| {
                patterns
                    .iter()
                    .any(|p| flotilla_core::names::glob_matches(p, workload))
            })
            .map(|(name, _)| *name)
    }
}

/// How a render reads the fleet's SOPS documents.
#[derive(Clone, Debug, Default)]
pub enum SopsKeys {
    /// Not opened: each is read with its `sops` metadata removed and its values as
    /// their `ENC[…]` text, with a warning. What `validate` and `diff` do without the
    /// hub's keys: a changed value still shows as changed.
    #[default]
    Unopened,
    /// Opened with these identities (the hub's); a document none of them opens is an
    /// error naming its recipients.
    Open(std::sync::Arc<DecryptionKeys>),
}

/// The fleet's files with every SOPS document (a `.yaml`, `.yml` or `.json` file
/// with `sops` metadata) replaced by its plain text, as `keys` say; errors and
/// warnings name the file. The snapshot is copied only when it holds one.
pub fn open_snapshot<'a>(
    snapshot: &'a FleetSnapshot,
    keys: &SopsKeys,
    tenants: &TenantFiles,
    (diagnostics, secrets): (&mut Vec<Diagnostic>, &mut Vec<SopsSecret>),
) -> std::borrow::Cow<'a, FleetSnapshot> {
    let mut opened: Vec<(String, Arc<str>)> = Vec::new();
    let mut hash_keys: Vec<(String, [u8; 32])> = Vec::new();
    let owners = match keys {
        SopsKeys::Open(keys) if keys.has_tenant_keys() => Some(Owners::of(tenants)),
        _ => None,
    };
    let tenant_of = Owners::of(tenants);
    for (path, text) in &snapshot.files {
        let json = path.ends_with(".json");
        if !(json || path.ends_with(".yaml") || path.ends_with(".yml")) || !looks_like_sops(text) {
            continue;
        }
        let document = match SopsDocument::parse(text, json) {
            Ok(Some(document)) => document,
            // Not a SOPS document, or not one that parses: the file's own reader
            // says what is wrong with it.
            Ok(None) | Err(_) => continue,
        };
        // A SOPS file reached through a symlink is opened only where it lies: a link
        // in one tenant's workload to another's (or the platform's) file would have
        // it opened with the link's keys and sealed to the link's clusters.
        if let Some(target) = snapshot.links.get(path)
            && tenant_of.owner(path) != tenant_of.owner(target)
        {
            let whose = |owner: Option<&str>| match owner {
                Some(tenant) => format!("tenant {tenant:?}'s"),
                None => "the platform's".to_string(),
            };
            let mut error = Diagnostic::error(format!(
                "this SOPS file is a symlink to {target}, which is {} and not {}: it is not opened here",
                whose(tenant_of.owner(target)),
                whose(tenant_of.owner(path)),
            ))
            .in_file(path.clone());
            // A tenant's link fails only the clusters its workload targets.
            if tenant_of.owner(path).is_some()
                && let Some(workload) = path
                    .strip_prefix("workloads/")
                    .and_then(|rest| rest.split('/').next())
            {
                error = error.for_workload(workload);
            }
            diagnostics.push(error);
            opened.push((path.clone(), Arc::from(document.without_metadata())));
            continue;
        }
        let owner = owners.as_ref().and_then(|o| o.owner(path));
        let owned_keys = owners.as_ref().and(match keys {
            SopsKeys::Open(keys) => Some(keys.for_owner(owner)),
            SopsKeys::Unopened => None,
        });
        let plain = match keys {
            SopsKeys::Open(all) => {
                match document.open_with_secrets(owned_keys.as_ref().unwrap_or(all)) {
                    Ok((plain, found, hash_key)) => {
                        hash_keys.push((path.clone(), hash_key));
                        secrets.extend(
                            found
                                .into_iter()
                                .filter(|v| v.chars().count() >= MIN_TRACKED_SECRET)
                                .map(|v| SopsSecret {
                                    escaped: escaped(&v),
                                    file: path.clone(),
                                    tenant: tenant_of.owner(path).map(str::to_string),
                                }),
                        );
                        plain
                    }
                    Err(err) => {
                        let hint = match (&err, all.is_empty(), owned_keys.is_some()) {
                        (SopsError::NoKey { .. }, true, _) => {
                            " (no decryption key was given: `--decryption-key FILE`, an age identity file)".to_string()
                        }
                        (SopsError::NoKey { .. }, _, true) => match owner {
                            Some(tenant) => format!(
                                " (a file of tenant {tenant:?} opens only with its identities: `--decryption-key {tenant}=FILE`, or the platform's when the tenant has none)"
                            ),
                            None => " (a file of no tenant opens only with the platform's identities, not a tenant's)".to_string(),
                        },
                        _ => String::new(),
                    };
                        let mut error =
                            Diagnostic::error(format!("cannot open this SOPS file: {err}{hint}"))
                                .in_file(path.clone());
                        // A tenant's file fails only the clusters its workload targets.
                        if owner.is_some()
                            && let Some(workload) = path
                                .strip_prefix("workloads/")
                                .and_then(|rest| rest.split('/').next())
                        {
                            error = error.for_workload(workload);
                        }
                        diagnostics.push(error);
                        // Read as ciphertext, so the rest of the fleet still renders and
                        // reports; the render is not clean.
                        document.without_metadata()
                    }
                }
            }
            SopsKeys::Unopened if document.names_encrypted() => {
                diagnostics.push(
                    Diagnostic::warning(
                        "a SOPS file left out (no decryption key given): its kinds and names are encrypted too, so nothing of it can be compared without the key; encrypt only the values (for Secrets: `encrypted_regex: ^(data|stringData)$` in .sops.yaml)",
                    )
                    .in_file(path.clone()),
                );
                String::new()
            }
            SopsKeys::Unopened => {
                diagnostics.push(
                    Diagnostic::warning(
                        "a SOPS file read without decrypting it (no decryption key given): its encrypted values are compared as their ciphertext",
                    )
                    .in_file(path.clone()),
                );
                document.without_metadata()
            }
        };
        opened.push((path.clone(), Arc::from(plain)));
    }
    if opened.is_empty() {
        return std::borrow::Cow::Borrowed(snapshot);
    }
    let mut copy = snapshot.clone();
    copy.files.extend(opened);
    copy.hash_keys.extend(hash_keys);
    std::borrow::Cow::Owned(copy)
}

/// Why a SOPS document could not be opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SopsError {
    /// No identity given opens the data key.
    NoKey { recipients: Vec<String> },
    /// The values do not match the MAC: the file was edited without the key, or is
    /// damaged.
    Mac,
    /// A value could not be decrypted at its path (tampered, moved or damaged).
    Value { path: String },
    /// Metadata or values not as sops writes them.
    Malformed(String),
    /// A form of sops document this reader does not open.
    Unsupported(String),
}

impl fmt::Display for SopsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SopsError::NoKey { recipients } if recipients.is_empty() => f.write_str(
                "encrypted with sops to no age recipient: only age keys can be opened here",
            ),
            SopsError::NoKey { recipients } => write!(
                f,
                "encrypted with sops to {}; none of the decryption keys given is one of them",
                recipients.join(", ")
            ),
            SopsError::Mac => f.write_str(
                "its values do not match its sops MAC: the file was changed without sops (or is damaged); nothing of it is used",
            ),
            SopsError::Value { path } => write!(
                f,
                "the sops value at `{path}` cannot be decrypted at that place (changed, moved or damaged)"
            ),
            SopsError::Malformed(reason) => write!(f, "not a sops document as sops writes it: {reason}"),
            SopsError::Unsupported(what) => write!(f, "a sops document flotilla cannot open: {what}"),
        }
    }
}

impl std::error::Error for SopsError {}

/// A document's tree as sops walks it: maps keep their order (the MAC depends on it).
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The bytes sops adds to the MAC for a scalar (Go's formatting of each type).
    fn mac_bytes(&self) -> Vec<u8> {
        match self {
            Node::Bool(true) => b"True".to_vec(),
            Node::Bool(false) => b"False".to_vec(),
            Node::Int(i) => i.to_string().into_bytes(),
            Node::Uint(u) => u.to_string().into_bytes(),
            // Go's FormatFloat(f, 'f', -1, 64): the shortest digits, never an exponent,
            // which is what Rust's Display writes.
            Node::Float(f) => f.to_string().into_bytes(),
            Node::Str(s) => s.as_bytes().to_vec(),
            Node::Null | Node::Seq(_) | Node::Map(_) => Vec::new(),
        }
    }

    fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn str_field(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(Node::Str(s)) => Some(s),
            _ => None,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML or JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(i64::try_from(v).map_or(Node::Uint(v), Node::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Node>()? {
            let Node::Str(key) = key else {
                return Err(de::Error::custom(
                    "a key that is not a string (sops supports string keys only)",
                ));
            };
            entries.push((key, map.next_value()?));
        }
        Ok(Node::Map(entries))
    }
}

impl serde::Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::Uint(u) => s.serialize_u64(*u),
            // As Go writes a float64 (and sops before 3.12 read every JSON number
            // as one): a whole number has no fraction.
            Node::Float(f) if f.fract() == 0.0 && f.abs() < 1e15 => s.serialize_i64(*f as i64),
            Node::Float(f) => s.serialize_f64(*f),
            Node::Str(v) => s.serialize_str(v),
            Node::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// Whether `text` (a `.yaml`, `.yml` or `.json` file) may be a SOPS document: a
/// cheap look for its metadata before anything is parsed. Any one of its fields, or
/// an encrypted value, is enough: a file that lost its `mac` or `lastmodified` (edited
/// without sops) must still be read as one, and refused, not served as a manifest.
pub fn looks_like_sops(text: &str) -> bool {
    text.contains("sops")
        && [
            "lastmodified",
            "mac",
            "ENC[",
            "encrypted_",
            "unencrypted_",
            "recipient",
        ]
        .iter()
        .any(|field| text.contains(field))
}

/// The fields of a `sops` mapping that sops writes and a chart's or a manifest's own
/// `sops` setting would not hold: with one of them, the mapping is SOPS metadata.
const METADATA_FIELDS: &[&str] = &[
    "mac",
    "lastmodified",
    "age",
    "pgp",
    "kms",
    "gcp_kms",
    "azure_kv",
    "hc_vault",
    "key_groups",
    "encrypted_regex",
    "encrypted_suffix",
    "unencrypted_regex",
    "unencrypted_suffix",
];

/// A SOPS document read but not yet opened.
pub struct SopsDocument {
    documents: Vec<Node>,
    metadata: Node,
}

impl SopsDocument {
    /// Parses `text` (YAML, or JSON when `json`); `Ok(None)` when it is not a SOPS
    /// document (no `sops` mapping with sops's metadata at the top of its first
    /// document). A document whose metadata lacks its MAC is one, and opening it fails.
    pub fn parse(text: &str, json: bool) -> Result<Option<SopsDocument>, SopsError> {
        let mut documents: Vec<Node> = if json {
            vec![serde_json::from_str(text).map_err(|e| SopsError::Malformed(e.to_string()))?]
        } else {
            serde_saphyr::from_multiple_with_options(text, crate::yaml::options())
                .map_err(|e| SopsError::Malformed(e.to_string()))?
        };
        let Some(metadata) = documents.first().and_then(|d| d.get("sops")).cloned() else {
            return Ok(None);
        };
        if !METADATA_FIELDS
            .iter()
            .any(|field| metadata.get(field).is_some())
        {
            return Ok(None);
        }
        for document in &mut documents {
            if let Node::Map(entries) = document {
                entries.retain(|(k, _)| k != "sops");
            }
        }
        Ok(Some(SopsDocument {
            documents,
            metadata,
        }))
    }

    /// The age recipients the data key was sealed to.
    pub fn recipients(&self) -> Vec<String> {
        self.age_entries()
            .iter()
            .filter_map(|e| e.str_field("recipient").map(str::to_string))
            .collect()
    }

    fn age_entries(&self) -> Vec<&Node> {
        let mut entries = Vec::new();
        if let Some(Node::Seq(list)) = self.metadata.get("age") {
            entries.extend(list.iter());
        }
        if let Some(Node::Seq(groups)) = self.metadata.get("key_groups") {
            for group in groups {
                if let Some(Node::Seq(list)) = group.get("age") {
                    entries.extend(list.iter());
                }
            }
        }
        entries
    }

    /// Opens the document: the plain documents as JSON text, one per line-separated
    /// YAML document (`---`).
    pub fn open(&self, keys: &DecryptionKeys) -> Result<String, SopsError> {
        self.open_nodes(keys).map(|(plain, _)| emit(&plain))
    }

    /// [`SopsDocument::open`], the text of every value that was encrypted (the
    /// secrets the file holds), for finding where they end up, and the file's hash
    /// key (see [`FleetSnapshot::hash_keys`]).
    pub fn open_with_secrets(
        &self,
        keys: &DecryptionKeys,
    ) -> Result<(String, Vec<String>, [u8; 32]), SopsError> {
        let (plain, data_key) = self.open_nodes(keys)?;
        let mut secrets = Vec::new();
        for (sealed, opened) in self.documents.iter().zip(&plain) {
            document_texts(sealed, opened, &mut secrets);
        }
        Ok((emit(&plain), secrets, hash_key(&data_key)))
    }

    /// The documents opened, and the file's data key.
    fn open_nodes(&self, keys: &DecryptionKeys) -> Result<(Vec<Node>, Vec<u8>), SopsError> {
        let rules = Rules::of(&self.metadata)?;
        let key = self.data_key(keys)?;
        let cipher = SopsCipher::new_from_slice(&key)
            .map_err(|_| SopsError::Malformed("the data key is not 32 bytes".to_string()))?;
        let mut mac = Sha512::new();
        if rules.mac_only_encrypted {
            mac.update(MAC_ONLY_ENCRYPTED_INIT);
        }
        let mut plain = Vec::with_capacity(self.documents.len());
        for document in &self.documents {
            let mut path = Vec::new();
            plain.push(open_node(document, &mut path, &rules, &cipher, &mut mac)?);
        }
        self.check_mac(&cipher, &mac.finalize())?;
        Ok((plain, key))
    }

    /// The document with its `sops` metadata removed and every value as it is in the
    /// file (encrypted ones as their `ENC[…]` text): what a reader without the key
    /// can compare.
    pub fn without_metadata(&self) -> String {
        emit(&self.documents)
    }

    /// Whether a document's `apiVersion`, `kind` or `metadata.name`/`namespace` is
    /// encrypted: a manifest that cannot even be named without the key.
    pub fn names_encrypted(&self) -> bool {
        let encrypted =
            |node: Option<&Node>| matches!(node, Some(Node::Str(s)) if s.starts_with("ENC["));
        self.documents.iter().any(|d| {
            let metadata = d.get("metadata");
            encrypted(d.get("apiVersion"))
                || encrypted(d.get("kind"))
                || encrypted(metadata.and_then(|m| m.get("name")))
                || encrypted(metadata.and_then(|m| m.get("namespace")))
        })
    }

    fn data_key(&self, keys: &DecryptionKeys) -> Result<Vec<u8>, SopsError> {
        if let Some(Node::Seq(groups)) = self.metadata.get("key_groups")
            && groups.len() > 1
        {
            return Err(SopsError::Unsupported(
                "several key groups (the data key is split with Shamir's scheme)".to_string(),
            ));
        }
        for entry in self.age_entries() {
            let Some(enc) = entry.str_field("enc") else {
                continue;
            };
            if let Some(key) = keys.open(enc.as_bytes()) {
                return Ok(key);
            }
        }
        Err(SopsError::NoKey {
            recipients: self.recipients(),
        })
    }

    fn check_mac(&self, cipher: &SopsCipher, computed: &[u8]) -> Result<(), SopsError> {
        let Some(stored) = self.metadata.str_field("mac") else {
            return Err(SopsError::Malformed(
                if self.metadata.get("mac").is_none() {
                    "`sops.mac` is missing (the file was edited without sops?): nothing of it is used"
                } else {
                    "`sops.mac` is not a string"
                }
                .to_string(),
            ));
        };
        let Some(modified) = self.metadata.str_field("lastmodified") else {
            return Err(SopsError::Malformed(
                "`sops.lastmodified` is missing".to_string(),
            ));
        };
        let aad = rfc3339_as_go_writes_it(modified);
        let stored = decrypt_value(cipher, stored, &aad).map_err(|_| SopsError::Mac)?;
        let computed = hex_upper(computed);
        match stored {
            Node::Str(s) if s == computed => Ok(()),
            _ => Err(SopsError::Mac),
        }
    }
}

/// Which values sops encrypted, from the metadata's rules.
struct Rules {
    unencrypted_suffix: Option<String>,
    encrypted_suffix: Option<String>,
    unencrypted_regex: Option<regex::Regex>,
    encrypted_regex: Option<regex::Regex>,
    mac_only_encrypted: bool,
}

impl Rules {
    fn of(metadata: &Node) -> Result<Rules, SopsError> {
        for refused in ["unencrypted_comment_regex", "encrypted_comment_regex"] {
            if metadata.str_field(refused).is_some_and(|r| !r.is_empty()) {
                return Err(SopsError::Unsupported(format!(
                    "`{refused}` (which values are encrypted depends on YAML comments)"
                )));
            }
        }
        let regex = |field: &str| -> Result<Option<regex::Regex>, SopsError> {
            match metadata.str_field(field).filter(|r| !r.is_empty()) {
                None => Ok(None),
                Some(pattern) => regex::Regex::new(pattern).map(Some).map_err(|e| {
                    SopsError::Malformed(format!("`{field}` is not a regular expression: {e}"))
                }),
            }
        };
        let suffix = |field: &str| {
            metadata
                .str_field(field)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        Ok(Rules {
            unencrypted_suffix: suffix("unencrypted_suffix"),
            encrypted_suffix: suffix("encrypted_suffix"),
            unencrypted_regex: regex("unencrypted_regex")?,
            encrypted_regex: regex("encrypted_regex")?,
            mac_only_encrypted: matches!(
                metadata.get("mac_only_encrypted"),
                Some(Node::Bool(true))
            ),
        })
    }

    /// Whether sops encrypts the value at `path` (the keys down to it; a list adds
    /// nothing), in sops' order of precedence.
    fn encrypted(&self, path: &[String]) -> bool {
        let mut encrypted = true;
        if let Some(suffix) = &self.unencrypted_suffix
            && path.iter().any(|k| k.ends_with(suffix.as_str()))
        {
            encrypted = false;
        }
        if let Some(suffix) = &self.encrypted_suffix {
            encrypted = path.iter().any(|k| k.ends_with(suffix.as_str()));
        }
        if let Some(regex) = &self.unencrypted_regex
            && path.iter().any(|k| regex.is_match(k))
        {
            encrypted = false;
        }
        if let Some(regex) = &self.encrypted_regex {
            encrypted = path.iter().any(|k| regex.is_match(k));
        }
        encrypted
    }
}

fn open_node(
    node: &Node,
    path: &mut Vec<String>,
    rules: &Rules,
    cipher: &SopsCipher,
    mac: &mut Sha512,
) -> Result<Node, SopsError> {
    match node {
        Node::Map(entries) => {
            let mut out = Vec::with_capacity(entries.len());
            for (key, value) in entries {
                path.push(key.clone());
                let opened = open_node(value, path, rules, cipher, mac);
                path.pop();
                out.push((key.clone(), opened?));
            }
            Ok(Node::Map(out))
        }
        Node::Seq(items) => items
            .iter()
            .map(|item| open_node(item, path, rules, cipher, mac))
            .collect::<Result<_, _>>()
            .map(Node::Seq),
        Node::Null => Ok(Node::Null),
        scalar => {
            let encrypted = rules.encrypted(path);
            let value = if !encrypted {
                scalar.clone()
            } else {
                match scalar {
                    Node::Str(text) if text.is_empty() => Node::Str(String::new()),
                    Node::Str(text) => {
                        let aad = format!("{}:", path.join(":"));
                        decrypt_value(cipher, text, &aad).map_err(|_| SopsError::Value {
                            path: path.join("."),
                        })?
                    }
                    // A value sops should have encrypted is in the clear: added by
                    // hand, or the file was tampered with.
                    _ => {
                        return Err(SopsError::Value {
                            path: path.join("."),
                        });
                    }
                }
            };
            if !rules.mac_only_encrypted || encrypted {
                mac.update(value.mac_bytes());
            }
            Ok(value)
        }
    }
}

/// [`decrypted_texts`] of one document, leaving out what names a Kubernetes object:
/// its `apiVersion`, `kind`, `metadata.name` and `metadata.namespace` (and a Secret's
/// `type`) travel in plain text in every bundle whatever the file encrypted, so a
/// file encrypted whole (sops's default) does not make `Secret` or `v1` a secret
/// value, looked for, warned about and redacted wherever it appears.
fn document_texts(sealed: &Node, opened: &Node, out: &mut Vec<String>) {
    let (Node::Map(sealed_entries), Node::Map(opened_entries)) = (sealed, opened) else {
        return decrypted_texts(sealed, opened, out);
    };
    let Some(kind) = opened.str_field("kind") else {
        return decrypted_texts(sealed, opened, out);
    };
    for ((key, x), (_, y)) in sealed_entries.iter().zip(opened_entries) {
        match key.as_str() {
            "apiVersion" | "kind" => {}
            "type" if kind == "Secret" => {}
            "metadata" => match (x, y) {
                (Node::Map(a), Node::Map(b)) => {
                    for ((field, x), (_, y)) in a.iter().zip(b) {
                        if field != "name" && field != "namespace" {
                            decrypted_texts(x, y, out);
                        }
                    }
                }
                _ => decrypted_texts(x, y, out),
            },
            _ => decrypted_texts(x, y, out),
        }
    }
}

/// The texts of the values of `opened` that were `ENC[…]` in `sealed` (the same tree).
fn decrypted_texts(sealed: &Node, opened: &Node, out: &mut Vec<String>) {
    match (sealed, opened) {
        (Node::Map(a), Node::Map(b)) => {
            for ((_, x), (_, y)) in a.iter().zip(b) {
                decrypted_texts(x, y, out);
            }
        }
        (Node::Seq(a), Node::Seq(b)) => {
            for (x, y) in a.iter().zip(b) {
                decrypted_texts(x, y, out);
            }
        }
        (Node::Str(text), value) if text.starts_with("ENC[") => {
            out.push(String::from_utf8_lossy(&value.mac_bytes()).into_owned());
        }
        _ => {}
    }
}

/// The key a SOPS file's published hashes are keyed with: HMAC-SHA256 of a fixed
/// label under the file's data key, which only holders of one of its recipients'
/// identities can learn (see [`FleetSnapshot::hash_keys`]).
fn hash_key(data_key: &[u8]) -> [u8; 32] {
    use hmac::Mac as _;
    let mut mac =
        <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(data_key).expect("any key length");
    mac.update(b"flotilla.dev/v1 hash key of decrypted values");
    mac.finalize().into_bytes().into()
}

/// A value decrypted from a SOPS file, and the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SopsSecret {
    /// As it appears inside a JSON string (escaped), for searching canonical JSON.
    pub escaped: String,
    pub file: String,
    /// The tenant whose workload folder holds the file (`None`: the platform's).
    /// Only that tenant's workloads (and the platform's) may read it, so only
    /// their resources and hashes are looked at for its values: what is found
    /// there must not tell another tenant whether its own text holds one.
    pub tenant: Option<String>,
}

/// The shortest decrypted value looked for outside Secrets: shorter ones (`true`,
/// a port) would match by chance.
pub const MIN_TRACKED_SECRET: usize = 6;

/// Decrypts one `ENC[AES256_GCM,data:…,iv:…,tag:…,type:…]` value bound to `aad`.
fn decrypt_value(cipher: &SopsCipher, text: &str, aad: &str) -> Result<Node, SopsError> {
    let malformed = || SopsError::Malformed("a value is not `ENC[AES256_GCM,…]`".to_string());
    let inner = text
        .strip_prefix("ENC[AES256_GCM,")
        .and_then(|t| t.strip_suffix(']'))
        .ok_or_else(malformed)?;
    let mut fields = inner.splitn(4, ',');
    let mut field = |name: &str| {
        fields
            .next()
            .and_then(|f| f.strip_prefix(name))
            .ok_or_else(malformed)
    };
    let data = STANDARD.decode(field("data:")?).map_err(|_| malformed())?;
    let iv = STANDARD.decode(field("iv:")?).map_err(|_| malformed())?;
    let tag = STANDARD.decode(field("tag:")?).map_err(|_| malformed())?;
    let kind = field("type:")?;
    if iv.len() != 32 || tag.len() != 16 {
        return Err(malformed());
    }
    let mut sealed = data;
    sealed.extend_from_slice(&tag);
    let nonce = aes_gcm::aead::generic_array::GenericArray::from_slice(&iv);
    let plain = cipher
        .decrypt(
            nonce,
            Payload {
                msg: &sealed,
                aad: aad.as_bytes(),
            },
        )
        .map_err(|_| SopsError::Value {
            path: aad.trim_end_matches(':').replace(':', "."),
        })?;
    let text = String::from_utf8(plain)
        .map_err(|_| SopsError::Malformed("a decrypted value is not UTF-8".to_string()))?;
    let bad = |what: &str| SopsError::Malformed(format!("a decrypted value is not {what}"));
    Ok(match kind {
        "str" | "bytes" | "time" => Node::Str(text),
        "int" => Node::Int(text.parse().map_err(|_| bad("an integer"))?),
        "float" => Node::Float(text.parse().map_err(|_| bad("a number"))?),
        // Go's strconv.ParseBool.
        "bool" => Node::Bool(match text.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
            "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
            _ => return Err(bad("a boolean")),
        }),
        other => {
            return Err(SopsError::Malformed(format!(
                "a value of unknown type `{other}`"
            )));
        }
    })
}

/// `lastmodified` as Go's `time.RFC3339` layout writes it (the MAC's additional
/// data): no fraction of a second, `Z` for UTC.
fn rfc3339_as_go_writes_it(text: &str) -> String {
    let (main, zone) = match text
        .find(['Z', 'z', '+'])
        .or_else(|| text.rfind('-').filter(|&i| i > 10))
    {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let main = main.split('.').next().unwrap_or(main);
    let zone = match zone {
        "z" | "+00:00" | "-00:00" => "Z",
        other => other,
    };
    format!("{main}{zone}")
}

fn hex_upper(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

/// `text` as it is written inside a JSON string.
fn escaped(text: &str) -> String {
    let quoted = serde_json::to_string(text).unwrap_or_default();
    quoted[1..quoted.len().saturating_sub(1).max(1)].to_string()
}

/// The documents as JSON text, separated as a YAML stream.
fn emit(documents: &[Node]) -> String {
    documents
        .iter()
        .map(|d| serde_json::to_string_pretty(d).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[cfg(test)]
mod tests;
