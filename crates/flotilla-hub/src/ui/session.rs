//! Logging in to the web page: an admin token, typed once into a form, opens a
//! server-side session. The browser holds only a random session id in a cookie
//! (HttpOnly, SameSite=Strict, Secure under TLS, with an expiry); the store holds its
//! SHA-256. Each session has a form token that every state-changing form sends back,
//! and such a POST must come from the hub's own origin.

use http::HeaderMap;
use http::header::{COOKIE, HOST, ORIGIN, REFERER};
use rand::RngCore as _;

use crate::auth::hash_token;
use crate::store::StoredSession;

/// The cookie that carries the session id.
pub const COOKIE_NAME: &str = "flotilla_session";
/// How long a session lasts after logging in.
pub const SESSION_LIFETIME_MS: i64 = 12 * 3600 * 1000;

/// A new session: the id for the cookie (shown once) and what the store keeps.
pub struct NewSession {
    pub id: String,
    pub stored: StoredSession,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// The store's key for a session id.
pub fn id_hash(id: &str) -> String {
    hex::encode(hash_token(id.as_bytes()))
}

pub fn new_session(token_id: &str, now_ms: i64) -> NewSession {
    let id = random_hex();
    NewSession {
        stored: StoredSession {
            id_hash: id_hash(&id),
            token_id: token_id.to_string(),
            csrf: random_hex(),
            created_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(SESSION_LIFETIME_MS),
        },
        id,
    }
}

/// The `Set-Cookie` value that opens a session.
pub fn set_cookie(id: &str, secure: bool) -> String {
    format!(
        "{COOKIE_NAME}={id}; Path=/ui; Max-Age={}; HttpOnly; SameSite=Strict{}",
        SESSION_LIFETIME_MS / 1000,
        if secure { "; Secure" } else { "" }
    )
}

/// The `Set-Cookie` value that makes the browser forget the session.
pub fn clear_cookie(secure: bool) -> String {
    format!(
        "{COOKIE_NAME}=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The session id the request's cookies carry, if any.
pub fn cookie_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE_NAME)
        .map(|(_, value)| value.trim().to_string())
        .filter(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether a state-changing request comes from the hub's own pages: its `Origin`
/// (or, without one, its `Referer`) names the host the request was sent to. A
/// request that names neither is refused: every browser in use sends `Origin` with
/// a POST. The host is the `Host` header, or over HTTP/2 (which has none; browsers
/// speak it to an HTTPS hub) the request's `:authority`, given as `authority`.
pub fn same_origin(headers: &HeaderMap, authority: Option<&str>) -> bool {
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .or(authority);
    let Some(host) = host else {
        return false;
    };
    let source = headers
        .get(ORIGIN)
        .or_else(|| headers.get(REFERER))
        .and_then(|v| v.to_str().ok());
    let Some(source) = source else {
        return false;
    };
    let Some((_, rest)) = source.split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or_default();
    authority.eq_ignore_ascii_case(host)
}

/// Compares two form tokens in constant time.
pub fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        map
    }

    #[test]
    fn only_the_hubs_own_origin_may_post() {
        let check = |pairs: &[(&'static str, &str)], expect: bool| {
            assert_eq!(same_origin(&headers(pairs), None), expect, "{pairs:?}");
        };
        // HTTP/2: no Host header, the authority of the request instead.
        let origin = headers(&[("origin", "https://hub:8443")]);
        assert!(same_origin(&origin, Some("hub:8443")));
        assert!(!same_origin(&origin, Some("evil.example")));
        assert!(!same_origin(&origin, None));
        check(&[("host", "hub:8080"), ("origin", "http://hub:8080")], true);
        check(
            &[("host", "hub:8080"), ("origin", "https://hub:8080")],
            true,
        );
        check(
            &[("host", "hub:8080"), ("origin", "https://evil.example")],
            false,
        );
        check(&[("host", "hub:8080"), ("origin", "null")], false);
        check(
            &[
                ("host", "hub:8080"),
                ("referer", "http://hub:8080/ui/rollouts/1"),
            ],
            true,
        );
        check(
            &[("host", "hub:8080"), ("referer", "http://hub:8080.evil/x")],
            false,
        );
        check(&[("host", "hub:8080")], false);
    }

    #[test]
    fn the_cookie_is_found_among_others_and_must_look_like_an_id() {
        let id = "a".repeat(64);
        let found = cookie_id(&headers(&[(
            "cookie",
            &format!("x=1; {COOKIE_NAME}={id}; y=2"),
        )]));
        assert_eq!(found.as_deref(), Some(id.as_str()));
        assert_eq!(
            cookie_id(&headers(&[("cookie", &format!("{COOKIE_NAME}=short"))])),
            None
        );
        let cookie = set_cookie(&id, true);
        for part in [
            "HttpOnly",
            "SameSite=Strict",
            "Secure",
            "Max-Age=43200",
            "Path=/ui",
        ] {
            assert!(cookie.contains(part), "{cookie}");
        }
        assert!(!set_cookie(&id, false).contains("Secure"));
        assert!(same_token("abc", "abc") && !same_token("abc", "abd") && !same_token("abc", "ab"));
    }
}
