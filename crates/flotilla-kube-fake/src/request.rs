//! What a request asks for, read from its method and path as
//! `staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go` reads it:
//! `/api/v1/...` is the core group, `/apis/GROUP/VERSION/...` the others;
//! `namespaces/NS/RESOURCE/NAME/SUBRESOURCE` is namespaced; the verb follows from the
//! method and whether a name is given (GET of a name is `get`, of a collection `list`,
//! or `watch` with `?watch=true`).

/// A request for a resource, or for one of the discovery documents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/api`, `/apis`, `/apis/GROUP`, `/api/v1` or `/apis/GROUP/VERSION`.
    Discovery {
        group: Option<String>,
        version: Option<String>,
        core: bool,
    },
    Resource(ResourceRequest),
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRequest {
    pub verb: String,
    pub group: String,
    pub version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

/// Parses a request the way the API server's RequestInfoFactory does.
pub fn parse(method: &str, path: &str, query: &str) -> Target {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, mut current) = match parts.as_slice() {
        ["api"] => {
            return Target::Discovery {
                group: None,
                version: None,
                core: true,
            };
        }
        ["apis"] => {
            return Target::Discovery {
                group: None,
                version: None,
                core: false,
            };
        }
        ["api", version] => {
            return Target::Discovery {
                group: Some(String::new()),
                version: Some(version.to_string()),
                core: true,
            };
        }
        ["apis", group] => {
            return Target::Discovery {
                group: Some(group.to_string()),
                version: None,
                core: false,
            };
        }
        ["apis", group, version] => {
            return Target::Discovery {
                group: Some(group.to_string()),
                version: Some(version.to_string()),
                core: false,
            };
        }
        ["api", version, rest @ ..] => (String::new(), version.to_string(), rest),
        ["apis", group, version, rest @ ..] => (group.to_string(), version.to_string(), rest),
        _ => return Target::Other,
    };
    let mut namespace = String::new();
    // `namespaces/NS/...` is namespaced unless what follows is a subresource of the
    // namespace itself (`status`, `finalize`).
    if current.first() == Some(&"namespaces") && current.len() > 1 {
        namespace = current[1].to_string();
        if current.len() > 2 && !matches!(current[2], "status" | "finalize") {
            current = &current[2..];
        }
    }
    let resource = current.first().map(|s| s.to_string()).unwrap_or_default();
    let name = current.get(1).map(|s| s.to_string()).unwrap_or_default();
    let subresource = current.get(2).map(|s| s.to_string()).unwrap_or_default();
    let watch = query
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1");
    let verb = match (method, name.is_empty()) {
        ("GET", false) => "get",
        ("GET", true) if watch => "watch",
        ("GET", true) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", false) => "delete",
        ("DELETE", true) => "deletecollection",
        _ => "",
    };
    Target::Resource(ResourceRequest {
        verb: verb.to_string(),
        group,
        version,
        namespace,
        resource,
        subresource,
        name,
    })
}

/// The value of `key` in a query string, percent-decoded.
pub fn query_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(byte) => {
                        out.push(byte);
                        i += 3;
                    }
                    Err(_) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(method: &str, path: &str) -> ResourceRequest {
        match parse(method, path, "") {
            Target::Resource(request) => request,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn reads_paths_as_the_api_server_does() {
        let r = resource("PATCH", "/apis/apps/v1/namespaces/demo/deployments/web");
        assert_eq!(
            (
                r.verb.as_str(),
                r.group.as_str(),
                r.namespace.as_str(),
                r.resource.as_str(),
                r.name.as_str()
            ),
            ("patch", "apps", "demo", "deployments", "web")
        );
        let r = resource("GET", "/api/v1/namespaces/demo");
        assert_eq!(
            (
                r.verb.as_str(),
                r.resource.as_str(),
                r.name.as_str(),
                r.namespace.as_str()
            ),
            ("get", "namespaces", "demo", "demo")
        );
        let r = resource("GET", "/api/v1/namespaces/demo/status");
        assert_eq!(
            (r.resource.as_str(), r.subresource.as_str()),
            ("namespaces", "status")
        );
        let r = resource("GET", "/api/v1/namespaces/demo/configmaps");
        assert_eq!(
            (r.verb.as_str(), r.resource.as_str()),
            ("list", "configmaps")
        );
        let r = resource(
            "DELETE",
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/w.example.com",
        );
        assert_eq!((r.verb.as_str(), r.namespace.as_str()), ("delete", ""));
        assert_eq!(
            parse("GET", "/apis/apps", ""),
            Target::Discovery {
                group: Some("apps".into()),
                version: None,
                core: false
            }
        );
        assert_eq!(
            query_value("a=1&fieldManager=flo%20tilla", "fieldManager").as_deref(),
            Some("flo tilla")
        );
    }
}
