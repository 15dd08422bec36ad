//! Credentials for a registry and its authentication challenges.
//!
//! Credentials come from flags or from the Docker configuration file
//! (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`), whose
//! `auths.<registry>.auth` is base64 of `user:password` (or whose `username` and
//! `password` are given apart). They are never printed: `Debug` hides the password.
//!
//! A registry that wants credentials answers 401 with a `WWW-Authenticate` challenge:
//! `Basic` (send them with every request) or `Bearer realm=…,service=…,scope=…` (ask
//! the realm for a token, with the credentials if there are any, and send the token).

use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::OciError;

/// The user name that marks an identity token (Docker's convention).
const IDENTITY_TOKEN_USER: &str = "<token>";

/// A user name and password (or identity token) for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    /// The `Authorization` value of HTTP basic authentication.
    pub(crate) fn basic(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }

    /// The identity token these credentials are, if they are one: Docker's user name
    /// `<token>` with the token as the password.
    pub(crate) fn identity_token(&self) -> Option<&str> {
        (self.username == IDENTITY_TOKEN_USER).then_some(self.password.as_str())
    }

    /// The credentials the Docker configuration file at `path` holds for `registry`
    /// (`host` or `host:port`); `None` when it names none (or does not exist).
    pub fn from_docker_config(
        path: &Path,
        registry: &str,
    ) -> Result<Option<Credentials>, OciError> {
        let shown = path.display().to_string();
        let bad = |reason: String| OciError::DockerConfig {
            path: shown.clone(),
            reason,
        };
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(bad(err.to_string())),
        };
        #[derive(serde::Deserialize)]
        struct Config {
            #[serde(default)]
            auths: std::collections::BTreeMap<String, Entry>,
        }
        #[derive(serde::Deserialize)]
        struct Entry {
            auth: Option<String>,
            username: Option<String>,
            password: Option<String>,
            identitytoken: Option<String>,
        }
        // The file's own error would quote it, and it holds secrets: say where only.
        let config: Config = serde_json::from_slice(&text).map_err(|err| {
            bad(format!(
                "not a Docker configuration (JSON error at line {}, column {})",
                err.line(),
                err.column()
            ))
        })?;
        // Docker keeps Docker Hub's credentials under its old index's name.
        let wanted = if registry == "docker.io" {
            "index.docker.io"
        } else {
            registry
        };
        let Some((key, entry)) = config
            .auths
            .iter()
            .find(|(key, _)| auths_host(key).eq_ignore_ascii_case(wanted))
        else {
            return Ok(None);
        };
        // An identity token comes first: beside it, `auth` holds a placeholder user
        // with an empty password (`az acr login` writes both).
        if let Some(token) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
            return Ok(Some(Credentials {
                username: IDENTITY_TOKEN_USER.into(),
                password: token.to_string(),
            }));
        }
        if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(auth.trim())
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .ok_or_else(|| bad(format!("auths.{key:?}.auth is not base64 of user:password")))?;
            let (username, password) = decoded
                .split_once(':')
                .ok_or_else(|| bad(format!("auths.{key:?}.auth is not base64 of user:password")))?;
            return Ok(Some(Credentials {
                username: username.to_string(),
                password: password.to_string(),
            }));
        }
        if let (Some(username), Some(password)) = (&entry.username, &entry.password) {
            return Ok(Some(Credentials {
                username: username.clone(),
                password: password.clone(),
            }));
        }
        Ok(None)
    }
}

/// The Docker configuration file: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(PathBuf::from(home).join(".docker").join("config.json"))
}

/// The host of a key of `auths`, which may be written `host`, `https://host` or
/// `https://host/v1/`.
fn auths_host(key: &str) -> &str {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key)
}

/// A registry's `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    /// Reads a challenge: a scheme and `key="value"` parameters.
    pub(crate) fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = parameters(params);
        let get = |name: &str| {
            params
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.clone())
        };
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        })
    }
}

/// `key="value", key=value, …`, with commas inside quotes kept (a scope such as
/// `repository:a:pull,push` has one).
fn parameters(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let Some((key, after)) = rest.split_once('=') else {
            break;
        };
        let key = key.trim().trim_start_matches(',').trim().to_string();
        let after = after.trim_start();
        let (value, remaining) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((at, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, escaped)) = chars.next() {
                            value.push(escaped);
                        }
                    }
                    '"' => {
                        end = at + 1;
                        break;
                    }
                    other => value.push(other),
                }
            }
            (value, &quoted[end..])
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        out.push((key, value));
        rest = remaining.trim_start().trim_start_matches(',').trim_start();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_read() {
        assert_eq!(
            Challenge::parse(r#"Basic realm="Registry Realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            Challenge::parse(
                r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:fleet/bundles:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:fleet/bundles:pull,push".into()),
            })
        );
        assert_eq!(Challenge::parse("Bearer service=x"), None);
        assert_eq!(Challenge::parse("Negotiate abc"), None);
    }

    #[test]
    fn docker_config_names_credentials_per_registry_and_never_shows_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.json");
        let auth = base64::engine::general_purpose::STANDARD.encode("robot:s3cret:with:colons");
        std::fs::write(
            &path,
            format!(
                r#"{{"auths":{{"https://registry.example:5000/v1/":{{"auth":"{auth}"}},
                "other.example":{{"username":"u","password":"p"}}}},"credsStore":"desktop"}}"#
            ),
        )
        .expect("writes");
        let found = Credentials::from_docker_config(&path, "registry.example:5000")
            .expect("reads")
            .expect("found");
        assert_eq!(found.username, "robot");
        assert_eq!(found.password, "s3cret:with:colons");
        assert!(!format!("{found:?}").contains("s3cret"));
        assert_eq!(
            Credentials::from_docker_config(&path, "other.example")
                .expect("reads")
                .map(|c| c.username),
            Some("u".into())
        );
        assert_eq!(
            Credentials::from_docker_config(&path, "nowhere.example").expect("reads"),
            None
        );
        std::fs::write(
            &path,
            format!(r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}}}}}}"#),
        )
        .expect("writes");
        assert!(
            Credentials::from_docker_config(&path, "docker.io")
                .expect("reads")
                .is_some()
        );
        assert_eq!(
            Credentials::from_docker_config(&dir.path().join("absent.json"), "x")
                .expect("absent is none"),
            None
        );
        std::fs::write(&path, r#"{"auths":{"r":{"auth":"!!secret!!"}}}"#).expect("writes");
        let err = Credentials::from_docker_config(&path, "r").expect_err("bad");
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
