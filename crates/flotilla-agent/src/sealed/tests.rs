use super::*;

use flotilla_core::bundle::ResourceKey;
use serde_json::json;

fn state() -> (tempfile::TempDir, StateDir) {
    let dir = tempfile::tempdir().expect("a folder");
    let state = StateDir::open(&dir.path().join("state")).expect("a state dir");
    (dir, state)
}

/// A bundle with a ConfigMap and a Secret whose values are sealed to `recipient`
/// (with the age crate's own encryptor, as any age writer would).
fn bundle(recipient: &str, plain: &[u8]) -> Bundle {
    let recipient: age::x25519::Recipient = recipient.parse().expect("a recipient");
    let sealed = age::encrypt(&recipient, plain).expect("encrypts");
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop"},
        "type": "Opaque",
        SEALED_SECRET_FIELD: {"sealed": STANDARD.encode(sealed)}
    });
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "db", "namespace": "shop"}, "data": {"host": "db.local"}});
    let resources = [secret, config]
        .iter()
        .map(|v| Arc::new(Resource::new(ResourceKey::of(v).expect("a key"), v)))
        .collect();
    Bundle::new("shop-1", resources)
}

#[test]
fn the_key_is_made_once_private_and_kept() {
    let (_dir, state) = state();
    let (first, made) = AgentIdentity::load_or_make(&state).expect("made");
    assert!(made);
    assert!(first.recipient().starts_with("age1"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(state.path().join(KEY_FILE))
            .expect("written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    let (again, made) = AgentIdentity::load_or_make(&state).expect("loaded");
    assert!(!made);
    assert_eq!(again.recipient(), first.recipient());
}

#[test]
fn sealed_secrets_open_in_memory_with_the_same_digest() {
    let (_dir, state) = state();
    let (identity, _) = AgentIdentity::load_or_make(&state).expect("made");
    let sealed = bundle(
        &identity.recipient(),
        br#"{"stringData":{"password":"hunter2"},"data":{"user":"YWRtaW4="}}"#,
    );
    let opened = identity.open(&sealed).expect("opens");
    assert_eq!(opened.digest, sealed.digest);
    let secret = opened
        .resources
        .iter()
        .map(|r| r.value())
        .find(|v| v["kind"] == "Secret")
        .expect("the Secret");
    assert_eq!(secret["stringData"]["password"], "hunter2");
    assert_eq!(secret["data"]["user"], "YWRtaW4=");
    assert!(secret.get(SEALED_SECRET_FIELD).is_none());
    assert_eq!(secret["type"], "Opaque");
}

#[test]
fn a_secret_sealed_to_another_key_or_damaged_is_an_error_naming_it() {
    let (_dir, state) = state();
    let (identity, _) = AgentIdentity::load_or_make(&state).expect("made");
    let other = age::x25519::Identity::generate().to_public().to_string();
    let err = identity
        .open(&bundle(&other, b"{}"))
        .expect_err("another agent's");
    assert_eq!(err.failures.len(), 1);
    assert_eq!(err.failures[0].secret, "Secret shop/db");
    let reason = &err.failures[0].reason;
    assert!(reason.contains(&identity.recipient()), "{reason}");
    assert!(
        err.to_string()
            .starts_with("Secret shop/db is sealed and it cannot be opened"),
        "{err}"
    );

    // Two Secrets sealed to another key: both are named, not only the first.
    let mut two = bundle(&other, b"{}");
    let mut second = two.resources[1].value();
    second["metadata"]["name"] = json!("api");
    two.resources.push(Arc::new(Resource::new(
        ResourceKey::of(&second).expect("a key"),
        &second,
    )));
    let err = identity.open(&two).expect_err("another agent's");
    let named: Vec<&str> = err.failures.iter().map(|f| f.secret.as_str()).collect();
    assert_eq!(named, ["Secret shop/db", "Secret shop/api"]);
    assert!(
        err.to_string()
            .starts_with("2 sealed Secrets cannot be opened: Secret shop/db, Secret shop/api"),
        "{err}"
    );

    // Truncated: the last byte of the age file cut off.
    let mut truncated = bundle(&identity.recipient(), br#"{"stringData":{"a":"b"}}"#);
    let secret = truncated.resources[1].value();
    let text = secret[SEALED_SECRET_FIELD]["sealed"]
        .as_str()
        .expect("sealed")
        .to_string();
    let mut bytes = STANDARD.decode(text).expect("base64");
    bytes.pop();
    let mut damaged = secret.clone();
    damaged[SEALED_SECRET_FIELD]["sealed"] = json!(STANDARD.encode(bytes));
    truncated.resources[1] = Arc::new(Resource::new(
        ResourceKey::of(&damaged).expect("a key"),
        &damaged,
    ));
    let err = identity.open(&truncated).expect_err("truncated");
    assert_eq!(err.failures[0].secret, "Secret shop/db");
}
