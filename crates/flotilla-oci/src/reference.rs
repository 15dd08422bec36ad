//! `REGISTRY/REPOSITORY`: where artifacts go, checked as the distribution
//! specification names repositories and tags.

use crate::OciError;

/// A repository in a registry: `registry.example:5000/fleet/bundles`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    /// `host` or `host:port`.
    pub registry: String,
    /// The repository's name in it (`fleet/bundles`).
    pub name: String,
}

impl Repository {
    /// Parses `REGISTRY/REPOSITORY` (an `oci://` prefix is allowed).
    pub fn parse(text: &str) -> Result<Repository, OciError> {
        let bad = |reason: &str| OciError::BadReference {
            text: text.to_string(),
            reason: reason.to_string(),
        };
        let rest = text.strip_prefix("oci://").unwrap_or(text);
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let Some((registry, name)) = rest.split_once('/') else {
            return Err(bad(
                "write it as REGISTRY/REPOSITORY, like registry.example:5000/fleet/bundles",
            ));
        };
        if registry.is_empty()
            || !registry
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        {
            return Err(bad(
                "the registry must be a host name or address, with an optional :port",
            ));
        }
        if !name.split('/').all(valid_component) {
            return Err(bad(
                "a repository is lowercase path components of letters and digits, separated by \
                 '.', '_', '__' or '-' (like fleet/bundles)",
            ));
        }
        if name.len() > 255 {
            return Err(bad("the repository name is longer than 255 characters"));
        }
        Ok(Repository {
            registry: registry.to_ascii_lowercase(),
            name: name.to_string(),
        })
    }

    /// Where the registry's API answers: Docker Hub's (`docker.io`) is at
    /// `registry-1.docker.io`; any other registry's at its own name.
    pub fn api_host(&self) -> &str {
        if self.registry == "docker.io" {
            "registry-1.docker.io"
        } else {
            &self.registry
        }
    }

    /// The host without its port, for the loopback check.
    pub fn host(&self) -> &str {
        let registry = self.registry.as_str();
        if let Some(bracketed) = registry.strip_prefix('[') {
            return bracketed.split(']').next().unwrap_or(bracketed);
        }
        registry.split(':').next().unwrap_or(registry)
    }

    /// Whether the registry is on this machine (the only place plain HTTP is allowed).
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|address| address.is_loopback())
    }
}

impl std::fmt::Display for Repository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.name)
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, the distribution specification's path component.
fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let separator = &component[start..i];
        let allowed = separator == "."
            || separator == "_"
            || separator == "__"
            || separator.bytes().all(|b| b == b'-');
        if !allowed {
            return false;
        }
    }
    true
}

/// Whether `tag` is a valid tag: `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
pub fn valid_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 128
        && (bytes[0].is_ascii_alphanumeric() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_parsed_and_checked() {
        let repository =
            Repository::parse("oci://Registry.example:5000/fleet/bundles").expect("parses");
        assert_eq!(repository.registry, "registry.example:5000");
        assert_eq!(repository.name, "fleet/bundles");
        assert_eq!(repository.host(), "registry.example");
        assert_eq!(repository.api_host(), "registry.example:5000");
        let hub = Repository::parse("docker.io/fleet/bundles").expect("parses");
        assert_eq!(hub.api_host(), "registry-1.docker.io");
        assert!(!repository.is_loopback());
        assert!(
            Repository::parse("127.0.0.1:5000/a")
                .expect("parses")
                .is_loopback()
        );
        assert!(
            Repository::parse("localhost/a")
                .expect("parses")
                .is_loopback()
        );
        assert!(
            Repository::parse("[::1]:5000/a")
                .expect("parses")
                .is_loopback()
        );
        for bad in [
            "registry.example",
            "r/Upper",
            "r/a//b",
            "r/-a",
            "r/a..b",
            "/a",
            "r/a b",
        ] {
            assert!(Repository::parse(bad).is_err(), "{bad}");
        }
        assert!(Repository::parse("r/a__b/c-d.e--f").is_ok());
        assert!(
            valid_tag("edge-1") && valid_tag("edge-1.flux") && !valid_tag("-x") && !valid_tag("")
        );
    }
}
