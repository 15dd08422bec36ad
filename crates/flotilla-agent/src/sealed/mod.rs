//! The agent's own age key, and the Secrets its hub sealed to it.
//!
//! At its first start, before it reaches any hub, the agent makes an X25519 key pair
//! in its state dir ([`KEY_FILE`], mode 0600) and prints the line to add to its
//! Cluster file, `spec.agentKey: age1…`. The hub then seals each of the cluster's
//! Secrets to that key (see docs/secrets.md): the bundle the agent receives, verifies
//! and keeps holds only ciphertext. Just before applying, the agent opens the sealed
//! values in memory; they are never written to its state dir (the dir sink writes the
//! applied Secret itself, mode 0600, as it writes every file).

use std::str::FromStr as _;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use flotilla_core::bundle::{Bundle, Resource, SEALED_SECRET_FIELD};
use flotilla_fs::Mode;
use serde_json::Value;

use crate::cache::{StateDir, StateError};

/// The agent's age identity in its state dir.
pub const KEY_FILE: &str = "agent.agekey";

/// The agent's key pair.
pub struct AgentIdentity {
    identity: age::x25519::Identity,
}

impl AgentIdentity {
    /// The key in `state`, made (and written, 0600) if there is none; true when made.
    pub fn load_or_make(state: &StateDir) -> Result<(AgentIdentity, bool), StateError> {
        let path = state.path().join(KEY_FILE);
        let io = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let line = text
                    .lines()
                    .map(str::trim)
                    .find(|l| l.starts_with("AGE-SECRET-KEY-"))
                    .unwrap_or_default();
                let identity = age::x25519::Identity::from_str(line).map_err(|reason| {
                    io(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("not an age identity ({reason}); move it away to make a new key, then put the new agentKey in the cluster's file"),
                    ))
                })?;
                Ok((AgentIdentity { identity }, false))
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                use age::secrecy::ExposeSecret as _;
                let identity = age::x25519::Identity::generate();
                let text = format!(
                    "# flotilla agent key: Secrets sealed to it can be opened with it\n# public key: {}\n{}\n",
                    identity.to_public(),
                    identity.to_string().expose_secret()
                );
                flotilla_fs::write_atomically(&path, text.as_bytes(), Mode::Private).map_err(io)?;
                Ok((AgentIdentity { identity }, true))
            }
            Err(err) => Err(io(err)),
        }
    }

    /// A key for `purpose` that only the holder of this identity can work out (a
    /// hash of the identity's secret and the purpose).
    pub fn private_key(&self, purpose: &str) -> [u8; 32] {
        use age::secrecy::ExposeSecret as _;
        let secret = self.identity.to_string();
        let mut input = format!("flotilla.dev/v1 {purpose}\n").into_bytes();
        input.extend_from_slice(secret.expose_secret().as_bytes());
        let digest = flotilla_core::bundle::Digest::of(&input);
        let hex = digest.hex().as_bytes();
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            let nibble = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            *byte = nibble(hex[2 * i]) << 4 | nibble(hex[2 * i + 1]);
        }
        key
    }

    /// The public key, `age1…`, for the cluster's `spec.agentKey`.
    pub fn recipient(&self) -> String {
        self.identity.to_public().to_string()
    }

    /// `bundle` with every sealed Secret opened (same digest: it is what was
    /// verified); the other resources are shared, not copied. An error names every
    /// Secret that cannot be opened.
    pub fn open(&self, bundle: &Bundle) -> Result<Bundle, SealError> {
        let mut resources = Vec::with_capacity(bundle.resources.len());
        let mut failures = Vec::new();
        for resource in &bundle.resources {
            if resource.key.kind() != "Secret" || !contains_sealed(&resource.canonical) {
                resources.push(resource.clone());
                continue;
            }
            let mut value = resource.value();
            if let Err(reason) = self.open_secret(&mut value) {
                failures.push(SealFailure {
                    secret: resource.key.to_string(),
                    reason,
                });
                continue;
            }
            resources.push(Arc::new(Resource {
                key: Arc::clone(&resource.key),
                canonical: flotilla_core::bundle::to_canonical_vec(&value).into(),
            }));
        }
        if !failures.is_empty() {
            return Err(SealError { failures });
        }
        Ok(Bundle {
            cluster: bundle.cluster.clone(),
            digest: bundle.digest.clone(),
            resources,
            meta: bundle.meta.clone(),
        })
    }

    fn open_secret(&self, value: &mut Value) -> Result<(), String> {
        let Some(object) = value.as_object_mut() else {
            return Err("not an object".to_string());
        };
        let Some(sealed) = object.remove(SEALED_SECRET_FIELD) else {
            return Ok(());
        };
        let text = sealed
            .get("sealed")
            .and_then(Value::as_str)
            .ok_or("its sealed value is not a string")?;
        let bytes = STANDARD
            .decode(text)
            .map_err(|_| "its sealed value is not base64".to_string())?;
        let plain = age::decrypt(&self.identity, &bytes).map_err(|err| {
            format!(
                "it cannot be opened with this agent's key ({}): {err}; if the agent's state dir was made anew, put its new key in the cluster's spec.agentKey",
                self.recipient()
            )
        })?;
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(&plain) else {
            return Err("its opened value is not a JSON object".to_string());
        };
        for (field, content) in fields {
            if field == "data" || field == "stringData" {
                object.insert(field, content);
            }
        }
        Ok(())
    }
}

/// The sealed Secrets of a bundle the agent cannot open (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealError {
    pub failures: Vec<SealFailure>,
}

/// One sealed Secret the agent cannot open, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealFailure {
    /// The Secret's identity, `Secret namespace/name`.
    pub secret: String,
    pub reason: String,
}

impl std::fmt::Display for SealError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.failures[..] {
            [] => write!(f, "no sealed Secret failed"),
            [one] => write!(f, "{} is sealed and {}", one.secret, one.reason),
            [first, rest @ ..] => {
                write!(
                    f,
                    "{} sealed Secrets cannot be opened: {}",
                    rest.len() + 1,
                    first.secret
                )?;
                for failure in rest {
                    write!(f, ", {}", failure.secret)?;
                }
                write!(f, " ({} is sealed and {})", first.secret, first.reason)
            }
        }
    }
}

impl std::error::Error for SealError {}

fn contains_sealed(canonical: &[u8]) -> bool {
    let needle = SEALED_SECRET_FIELD.as_bytes();
    canonical.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests;
