//! Tokens: made here, stored hashed (SHA-256) in the store, checked in memory.
//!
//! A request's bearer token is hashed and looked up in a table held in memory, so no
//! database is touched on the request path. The lookup is by hash, so its timing can
//! reveal nothing about a token; the final comparison is constant-time all the same.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderValue;
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

use crate::store::StoredToken;

pub use flotilla_core::access::Role;
pub use flotilla_core::api::TOKEN_PREFIX;

/// What a token allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// An agent: reads this cluster's bundles and posts its status. Never a person.
    Cluster(Arc<str>),
    /// A person, with a role and perhaps a tenant.
    Person(Person),
}

/// A person's token: its role, and the tenant it is limited to, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    pub role: Role,
    /// Sees only this tenant's workloads and the clusters they target; never an admin.
    pub tenant: Option<Arc<str>>,
}

impl Person {
    pub const ADMIN: Person = Person {
        role: Role::Admin,
        tenant: None,
    };

    /// How events and logs name the role: `operator`, or `operator@shop` for a
    /// tenant's token.
    pub fn label(&self) -> String {
        match &self.tenant {
            Some(tenant) => format!("{}@{tenant}", self.role),
            None => self.role.to_string(),
        }
    }
}

impl Grant {
    pub const ADMIN: Grant = Grant::Person(Person::ADMIN);

    /// The person behind the token; `None` for a cluster's token.
    pub fn person(&self) -> Option<&Person> {
        match self {
            Grant::Person(person) => Some(person),
            Grant::Cluster(_) => None,
        }
    }

    /// A stored token's grant; `None` for one that grants nothing this hub knows (a
    /// cluster token with a role, a tenant's admin, a role this hub cannot read).
    fn of_stored(token: &StoredToken) -> Option<Grant> {
        match (&token.cluster, token.admin, token.role, &token.tenant) {
            (Some(cluster), false, None, None) => Some(Grant::Cluster(Arc::from(cluster.as_str()))),
            // The roles' migration gives every admin row the role admin; a row without
            // a role is read as the admin it was made as.
            (None, true, Some(Role::Admin) | None, None) => Some(Grant::ADMIN),
            (None, false, Some(role @ (Role::Viewer | Role::Operator)), tenant) => {
                Some(Grant::Person(Person {
                    role,
                    tenant: tenant.as_deref().map(Arc::from),
                }))
            }
            _ => None,
        }
    }
}

/// A newly made token: the secret (shown once) and what is stored.
pub struct NewToken {
    pub secret: String,
    pub stored: StoredToken,
}

pub fn hash_token(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// A token's public id: the first 12 hex digits of its hash (safe to print and log).
pub fn token_id(secret: &str) -> String {
    id_of_hash(&hex::encode(hash_token(secret.as_bytes())))
}

fn id_of_hash(hash_hex: &str) -> String {
    hash_hex[..12].to_string()
}

/// Makes a random 256-bit token for a cluster, or an admin token when `cluster` is `None`.
pub fn new_token(cluster: Option<&str>, now_ms: i64) -> NewToken {
    match cluster {
        Some(cluster) => made(Some(cluster), None, None, now_ms),
        None => made(None, Some(Role::Admin), None, now_ms),
    }
}

/// Why a person's token cannot be made as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PersonTokenError {
    #[error(
        "an admin token sees the whole fleet and reads every bundle, so it has no tenant; give a tenant's token --role viewer or --role operator"
    )]
    TenantAdmin,
    #[error("{0:?} is not a tenant name (lowercase letters, digits and '-')")]
    TenantName(String),
}

/// Makes a random 256-bit token for a person with `role`, limited to `tenant` if given
/// (viewers and operators only).
pub fn new_person_token(
    role: Role,
    tenant: Option<&str>,
    now_ms: i64,
) -> Result<NewToken, PersonTokenError> {
    if let Some(tenant) = tenant {
        if role == Role::Admin {
            return Err(PersonTokenError::TenantAdmin);
        }
        let valid = !tenant.is_empty()
            && tenant.len() <= 63
            && tenant
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid {
            return Err(PersonTokenError::TenantName(tenant.to_string()));
        }
    }
    Ok(made(None, Some(role), tenant, now_ms))
}

fn made(cluster: Option<&str>, role: Option<Role>, tenant: Option<&str>, now_ms: i64) -> NewToken {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret = format!("{TOKEN_PREFIX}{}", hex::encode(bytes));
    let hash = hex::encode(hash_token(secret.as_bytes()));
    NewToken {
        stored: StoredToken {
            id: id_of_hash(&hash),
            hash,
            cluster: cluster.map(str::to_string),
            admin: role == Some(Role::Admin),
            role,
            tenant: tenant.map(str::to_string),
            created_at_ms: now_ms,
            revoked_at_ms: None,
        },
        secret,
    }
}

/// Why a request is not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    Missing,
    Malformed,
    Unknown,
}

impl AuthError {
    pub fn message(self) -> &'static str {
        match self {
            AuthError::Missing => {
                "no token: send `Authorization: Bearer <token>` (make one with `flotilla token create`)"
            }
            AuthError::Malformed => "the Authorization header must be `Bearer <token>`",
            AuthError::Unknown => "the token is unknown or revoked",
        }
    }
}

/// The live tokens, by hash, with their public ids.
#[derive(Debug, Default)]
pub struct TokenTable {
    by_hash: HashMap<[u8; 32], (Grant, String)>,
}

impl TokenTable {
    pub fn from_stored(tokens: &[StoredToken]) -> TokenTable {
        let by_hash = tokens
            .iter()
            .filter(|t| t.revoked_at_ms.is_none())
            .filter_map(|t| {
                let mut hash = [0u8; 32];
                hex::decode_to_slice(&t.hash, &mut hash).ok()?;
                Some((hash, (Grant::of_stored(t)?, t.id.clone())))
            })
            .collect();
        TokenTable { by_hash }
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// What the live token with this id grants (`None`: unknown or revoked).
    pub fn grant_of_id(&self, id: &str) -> Option<&Grant> {
        self.by_hash
            .values()
            .find(|(_, token_id)| token_id == id)
            .map(|(grant, _)| grant)
    }

    /// Checks an `Authorization` header value.
    pub fn check(&self, header: Option<&HeaderValue>) -> Result<&Grant, AuthError> {
        self.check_with_id(header).map(|(grant, _)| grant)
    }

    /// Checks an `Authorization` header value; returns the grant and the token's id
    /// (for recording who did what).
    pub fn check_with_id(&self, header: Option<&HeaderValue>) -> Result<(&Grant, &str), AuthError> {
        let header = header.ok_or(AuthError::Missing)?.as_bytes();
        let token = header
            .strip_prefix(b"Bearer ")
            .or_else(|| header.strip_prefix(b"bearer "))
            .ok_or(AuthError::Malformed)?;
        let token = token.trim_ascii();
        if token.is_empty() {
            return Err(AuthError::Malformed);
        }
        // Tokens are looked up by their SHA-256: how long a lookup takes can tell an
        // attacker something about a hash, never about a token, so no comparison of
        // secret bytes happens here and none needs to be constant-time.
        self.by_hash
            .get(&hash_token(token))
            .map(|(grant, id)| (grant, id.as_str()))
            .ok_or(AuthError::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_tokens_by_hash_and_ignores_revoked_ones() {
        let a = new_token(Some("edge-1"), 0);
        let admin = new_token(None, 0);
        let mut revoked = new_token(Some("edge-2"), 0);
        revoked.stored.revoked_at_ms = Some(1);
        let viewer = new_person_token(Role::Viewer, None, 0).expect("viewer");
        let shop = new_person_token(Role::Operator, Some("shop"), 0).expect("operator");
        let table = TokenTable::from_stored(&[
            a.stored.clone(),
            admin.stored.clone(),
            revoked.stored,
            viewer.stored.clone(),
            shop.stored.clone(),
        ]);
        let header = |t: &str| HeaderValue::from_str(&format!("Bearer {t}")).expect("header");
        assert_eq!(
            table.check(Some(&header(&a.secret))),
            Ok(&Grant::Cluster(Arc::from("edge-1")))
        );
        assert_eq!(table.check(Some(&header(&admin.secret))), Ok(&Grant::ADMIN));
        assert_eq!(
            table.check_with_id(Some(&header(&admin.secret))),
            Ok((&Grant::ADMIN, admin.stored.id.as_str()))
        );
        assert_eq!(
            table.check(Some(&header(&viewer.secret))),
            Ok(&Grant::Person(Person {
                role: Role::Viewer,
                tenant: None
            }))
        );
        let operator = table
            .check(Some(&header(&shop.secret)))
            .expect("known")
            .person()
            .expect("a person");
        assert_eq!(operator.label(), "operator@shop");
        assert_eq!(
            table.check(Some(&header(&revoked.secret))),
            Err(AuthError::Unknown)
        );
        assert_eq!(table.check(None), Err(AuthError::Missing));
        assert_eq!(
            table.check(Some(&HeaderValue::from_static("Basic x"))),
            Err(AuthError::Malformed)
        );
        assert!(a.secret.starts_with(TOKEN_PREFIX) && a.secret.len() == 68);
        assert_eq!(a.stored.hash, hex::encode(hash_token(a.secret.as_bytes())));
    }

    #[test]
    fn a_cluster_token_is_never_a_person_and_a_tenant_has_no_admin() {
        assert_eq!(
            new_person_token(Role::Admin, Some("shop"), 0).err(),
            Some(PersonTokenError::TenantAdmin)
        );
        assert_eq!(
            new_person_token(Role::Viewer, Some("Shop/1"), 0).err(),
            Some(PersonTokenError::TenantName("Shop/1".into()))
        );
        // Rows no flotilla command writes grant nothing.
        let mut cluster_with_role = new_token(Some("edge-1"), 0);
        cluster_with_role.stored.role = Some(Role::Operator);
        let mut tenant_admin = new_token(None, 0);
        tenant_admin.stored.tenant = Some("shop".into());
        let mut admin_without_flag = new_person_token(Role::Viewer, None, 0).expect("viewer");
        admin_without_flag.stored.role = Some(Role::Admin);
        let rows = [cluster_with_role, tenant_admin, admin_without_flag];
        let table =
            TokenTable::from_stored(&rows.iter().map(|t| t.stored.clone()).collect::<Vec<_>>());
        assert!(table.is_empty());
    }
}
