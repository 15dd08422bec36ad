//! Unit tests against documents written here as sops writes them (the real `sops`
//! is exercised by `tests/it/sops_files.rs`, which skips without it).

use super::*;

use aes_gcm::aead::generic_array::GenericArray;
use flotilla_core::snapshot::FleetSnapshot;

const IDENTITY: &str = "AGE-SECRET-KEY-1SH36876FLEVRV2C9YN2PNR3JJQV0Z9TLDNL49D4QPZRD22V3EENQ55K5JP";
const OTHER: &str = "AGE-SECRET-KEY-1ET5NLF5AM389DNGX70MFFET2AYPTNMFH6R3SW2N5JDR82MHG853QCGLHTS";
const DATA_KEY: [u8; 32] = [7; 32];

fn keys(identity: &str) -> DecryptionKeys {
    DecryptionKeys::from_identity_file(identity).expect("an identity")
}

fn recipient(identity: &str) -> String {
    keys(identity).recipients().remove(0)
}

/// Writes `document` (JSON text) as sops does for `recipients`, with the rules in
/// `extra` metadata fields, values encrypted at their paths and the MAC over them.
fn write(document: &str, recipients: &[&str], extra: &[(&str, Node)]) -> String {
    let Node::Map(entries) = serde_json::from_str::<Node>(document).expect("JSON") else {
        panic!("a map")
    };
    let mut metadata = vec![("mac".to_string(), Node::Str(String::new()))];
    metadata.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let rules = Rules::of(&Node::Map(metadata.clone())).expect("rules");
    let cipher = SopsCipher::new_from_slice(&DATA_KEY).expect("a key");
    let mut mac = Sha512::new();
    if rules.mac_only_encrypted {
        mac.update(MAC_ONLY_ENCRYPTED_INIT);
    }
    let mut counter = 0u8;
    let tree = seal(
        &Node::Map(entries),
        &mut Vec::new(),
        &rules,
        &cipher,
        &mut mac,
        &mut counter,
    );
    let modified = "2026-01-02T03:04:05Z";
    let mac_value = encrypt(
        &cipher,
        &Node::Str(hex_upper(&mac.finalize())),
        modified,
        &mut counter,
    );
    let age: Vec<Node> = recipients
        .iter()
        .map(|r| {
            let recipient: age::x25519::Recipient = r.parse().expect("a recipient");
            let enc = age::encrypt_and_armor(&recipient, &DATA_KEY).expect("age");
            Node::Map(vec![
                ("recipient".to_string(), Node::Str(r.to_string())),
                ("enc".to_string(), Node::Str(enc)),
            ])
        })
        .collect();
    metadata[0].1 = Node::Str(mac_value);
    metadata.push(("age".to_string(), Node::Seq(age)));
    metadata.push(("lastmodified".to_string(), Node::Str(modified.to_string())));
    let Node::Map(mut out) = tree else {
        unreachable!()
    };
    out.push(("sops".to_string(), Node::Map(metadata)));
    serde_json::to_string_pretty(&Node::Map(out)).expect("JSON")
}

fn seal(
    node: &Node,
    path: &mut Vec<String>,
    rules: &Rules,
    cipher: &SopsCipher,
    mac: &mut Sha512,
    counter: &mut u8,
) -> Node {
    match node {
        Node::Map(entries) => Node::Map(
            entries
                .iter()
                .map(|(k, v)| {
                    path.push(k.clone());
                    let sealed = seal(v, path, rules, cipher, mac, counter);
                    path.pop();
                    (k.clone(), sealed)
                })
                .collect(),
        ),
        Node::Seq(items) => Node::Seq(
            items
                .iter()
                .map(|i| seal(i, path, rules, cipher, mac, counter))
                .collect(),
        ),
        Node::Null => Node::Null,
        scalar => {
            let encrypted = rules.encrypted(path);
            if !rules.mac_only_encrypted || encrypted {
                mac.update(scalar.mac_bytes());
            }
            if !encrypted || *scalar == Node::Str(String::new()) {
                return scalar.clone();
            }
            Node::Str(encrypt(
                cipher,
                scalar,
                &format!("{}:", path.join(":")),
                counter,
            ))
        }
    }
}

fn encrypt(cipher: &SopsCipher, value: &Node, aad: &str, counter: &mut u8) -> String {
    *counter += 1;
    let iv = [*counter; 32];
    let kind = match value {
        Node::Bool(_) => "bool",
        Node::Int(_) => "int",
        Node::Float(_) => "float",
        _ => "str",
    };
    let sealed = cipher
        .encrypt(
            GenericArray::from_slice(&iv),
            Payload {
                msg: &value.mac_bytes(),
                aad: aad.as_bytes(),
            },
        )
        .expect("encrypts");
    let (data, tag) = sealed.split_at(sealed.len() - 16);
    format!(
        "ENC[AES256_GCM,data:{},iv:{},tag:{},type:{kind}]",
        STANDARD.encode(data),
        STANDARD.encode(iv),
        STANDARD.encode(tag)
    )
}

const SECRET: &str = r#"{"apiVersion": "v1", "kind": "Secret",
  "metadata": {"name": "db", "namespace": "shop"},
  "stringData": {"password": "hunter2", "port": 5432, "ratio": 1.5, "on": true,
                 "list": ["a", 2], "empty": "", "none": null}}"#;

fn open(text: &str, identity: &str) -> Result<String, SopsError> {
    SopsDocument::parse(text, true)
        .expect("parses")
        .expect("a sops document")
        .open(&keys(identity))
}

fn plain(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("JSON")
}

#[test]
fn a_document_opens_with_its_values_typed_and_its_order_kept() {
    let file = write(SECRET, &[&recipient(IDENTITY)], &[]);
    assert!(
        !file.contains("hunter2"),
        "the value is encrypted in the file"
    );
    assert!(looks_like_sops(&file));
    let opened = open(&file, IDENTITY).expect("opens");
    assert_eq!(plain(&opened), plain(SECRET));
    assert!(!opened.contains("sops"), "the metadata is gone: {opened}");
    let order: Vec<usize> = ["apiVersion", "kind", "metadata", "stringData"]
        .iter()
        .map(|k| opened.find(k).expect("a key"))
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{opened}");
}

#[test]
fn a_document_for_other_recipients_names_them() {
    let file = write(SECRET, &[&recipient(OTHER)], &[]);
    match open(&file, IDENTITY) {
        Err(SopsError::NoKey { recipients }) => assert_eq!(recipients, [recipient(OTHER)]),
        other => panic!("expected NoKey, got {other:?}"),
    }
}

#[test]
fn any_of_several_recipients_opens_it_and_any_of_several_keys() {
    let file = write(SECRET, &[&recipient(OTHER), &recipient(IDENTITY)], &[]);
    assert!(open(&file, IDENTITY).is_ok());
    assert!(open(&file, OTHER).is_ok());
    let mut both = keys(OTHER);
    both.add_identity_file(IDENTITY).expect("adds");
    let single = write(SECRET, &[&recipient(IDENTITY)], &[]);
    let document = SopsDocument::parse(&single, true)
        .expect("as written")
        .expect("as written");
    assert!(document.open(&both).is_ok());
}

#[test]
fn a_value_moved_to_another_key_is_refused() {
    let file = write(SECRET, &[&recipient(IDENTITY)], &[]);
    let mut tree: serde_json::Value = plain(&file);
    let password = tree["stringData"]["password"].clone();
    tree["metadata"]["name"] = password;
    let moved = serde_json::to_string(&tree).expect("as written");
    match open(&moved, IDENTITY) {
        Err(SopsError::Value { path }) => assert_eq!(path, "metadata.name"),
        other => panic!("expected a value error, got {other:?}"),
    }
}

#[test]
fn a_value_changed_in_the_clear_fails_the_mac() {
    let rule = [("unencrypted_suffix", Node::Str("_unencrypted".into()))];
    let file = write(
        r#"{"user_unencrypted": "admin", "password": "hunter2"}"#,
        &[&recipient(IDENTITY)],
        &rule,
    );
    assert!(file.contains("admin"), "left in the clear");
    assert!(open(&file, IDENTITY).is_ok());
    let edited = file.replace("\"admin\"", "\"root\"");
    assert_eq!(open(&edited, IDENTITY), Err(SopsError::Mac));
    // A value the rules say is encrypted may not be replaced by a plain one.
    let mut tree = plain(&file);
    tree["password"] = "guess".into();
    let replaced = serde_json::to_string(&tree).expect("as written");
    assert!(matches!(
        open(&replaced, IDENTITY),
        Err(SopsError::Value { .. })
    ));
}

#[test]
fn a_mac_that_was_edited_is_refused() {
    let file = write(SECRET, &[&recipient(IDENTITY)], &[]);
    let mut tree = plain(&file);
    tree["sops"]["lastmodified"] = "2026-01-02T03:04:06Z".into();
    assert_eq!(
        open(&serde_json::to_string(&tree).expect("as written"), IDENTITY),
        Err(SopsError::Mac)
    );
}

/// A file that lost its MAC or its time (edited without sops) is still a SOPS
/// document, refused as one: never read as a plain file whose values are ciphertext.
#[test]
fn a_file_without_its_mac_or_its_time_is_refused_not_read_as_plain() {
    let file = write(SECRET, &[&recipient(IDENTITY)], &[]);
    for (field, reason) in [
        (
            "mac",
            "`sops.mac` is missing (the file was edited without sops?)",
        ),
        ("lastmodified", "`sops.lastmodified` is missing"),
    ] {
        let mut tree = plain(&file);
        tree["sops"]
            .as_object_mut()
            .expect("metadata")
            .remove(field);
        let text = serde_json::to_string(&tree).expect("as written");
        assert!(looks_like_sops(&text), "{field}");
        let err = open(&text, IDENTITY).expect_err("refused");
        assert!(err.to_string().contains(reason), "{field}: {err}");
    }
    // A chart's own `sops` setting in a values file is not SOPS metadata.
    assert!(
        SopsDocument::parse("sops:\n  enabled: true\n  version: 3\n", false)
            .expect("as written")
            .is_none()
    );
}

/// A manifest encrypted whole (sops's default): its values are secret, not what
/// names it, which every bundle carries in plain text anyway.
#[test]
fn a_manifest_encrypted_whole_keeps_its_names_out_of_the_secret_values() {
    let document = r#"{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
      "metadata": {"name": "credentials", "namespace": "payments",
                   "annotations": {"note": "annotated-secret"}},
      "stringData": {"password": "hunter2-long"}}"#;
    let file = write(document, &[&recipient(IDENTITY)], &[]);
    let (_, mut found, _) = SopsDocument::parse(&file, true)
        .expect("parses")
        .expect("a sops document")
        .open_with_secrets(&keys(IDENTITY))
        .expect("opens");
    found.sort();
    assert_eq!(found, ["annotated-secret", "hunter2-long"]);
    // Any other file (Helm values, vars) keeps every decrypted value.
    let values = write(
        r#"{"kind": {"a": "Deployment-x"}, "token": "t0ken-value"}"#,
        &[&recipient(IDENTITY)],
        &[],
    );
    let (_, mut found, _) = SopsDocument::parse(&values, true)
        .expect("parses")
        .expect("a sops document")
        .open_with_secrets(&keys(IDENTITY))
        .expect("opens");
    found.sort();
    assert_eq!(found, ["Deployment-x", "t0ken-value"]);
}

#[test]
fn only_what_the_regex_names_is_encrypted_and_mac_only_encrypted_is_read() {
    for mac_only in [false, true] {
        let rules = [
            ("encrypted_regex", Node::Str("^(data|stringData)$".into())),
            ("mac_only_encrypted", Node::Bool(mac_only)),
        ];
        let file = write(SECRET, &[&recipient(IDENTITY)], &rules);
        assert!(file.contains("\"shop\""), "metadata stays readable");
        assert!(!file.contains("hunter2"));
        assert_eq!(plain(&open(&file, IDENTITY).expect("opens")), plain(SECRET));
        let renamed = file.replace("\"shop\"", "\"store\"");
        let result = open(&renamed, IDENTITY);
        if mac_only {
            assert!(result.is_ok(), "values in the clear are not in this MAC");
        } else {
            assert_eq!(result, Err(SopsError::Mac));
        }
    }
}

#[test]
fn documents_that_are_not_sops_are_left_alone() {
    assert!(
        SopsDocument::parse("a: 1\nsops: 2\n", false)
            .expect("as written")
            .is_none()
    );
    assert!(
        SopsDocument::parse("kind: ConfigMap\n", false)
            .expect("as written")
            .is_none()
    );
    assert!(!looks_like_sops("kind: ConfigMap\n"));
}

#[test]
fn comment_rules_and_several_key_groups_are_refused_with_a_reason() {
    let file = write(r#"{"a": "b"}"#, &[&recipient(IDENTITY)], &[]);
    let mut tree = plain(&file);
    tree["sops"]["encrypted_comment_regex"] = "sops:enc".into();
    let err =
        open(&serde_json::to_string(&tree).expect("as written"), IDENTITY).expect_err("refused");
    assert!(err.to_string().contains("encrypted_comment_regex"), "{err}");
    let mut tree = plain(&file);
    tree["sops"]["key_groups"] = serde_json::json!([{"age": []}, {"age": []}]);
    let err =
        open(&serde_json::to_string(&tree).expect("as written"), IDENTITY).expect_err("refused");
    assert!(matches!(err, SopsError::Unsupported(_)), "{err}");
}

#[test]
fn lastmodified_is_bound_as_go_formats_it() {
    assert_eq!(
        rfc3339_as_go_writes_it("2026-01-02T03:04:05Z"),
        "2026-01-02T03:04:05Z"
    );
    assert_eq!(
        rfc3339_as_go_writes_it("2026-01-02T03:04:05.123Z"),
        "2026-01-02T03:04:05Z"
    );
    assert_eq!(
        rfc3339_as_go_writes_it("2026-01-02T03:04:05+00:00"),
        "2026-01-02T03:04:05Z"
    );
    assert_eq!(
        rfc3339_as_go_writes_it("2026-01-02T03:04:05-07:00"),
        "2026-01-02T03:04:05-07:00"
    );
}

#[test]
fn an_identity_file_is_read_as_age_keygen_writes_it() {
    let file = format!(
        "# created: 2026-01-01T00:00:00Z\n# public key: {}\n{IDENTITY}\n",
        recipient(IDENTITY)
    );
    let keys = DecryptionKeys::from_identity_file(&file).expect("reads");
    assert_eq!(keys.identity_lines(), [IDENTITY]);
    let err = DecryptionKeys::from_identity_file("# nothing\nnot-a-key\n").expect_err("refused");
    assert!(
        err.starts_with("line 2:") && !err.contains("not-a-key"),
        "{err}"
    );
    assert!(DecryptionKeys::from_identity_file("# only comments\n").is_err());
}

/// A fleet of one cluster whose workload's manifests include `secret` (a file's text).
fn fleet(secret: &str) -> FleetSnapshot {
    const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
    FleetSnapshot::from_files([
        (
            "clusters/shop-1.yaml",
            &*format!("{HEADER}kind: Cluster\nmetadata:\n  name: shop-1\nspec: {{}}\n"),
        ),
        (
            "workloads/db/workload.yaml",
            &*format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: db\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        ),
        ("workloads/db/manifests/secret.yaml", secret),
    ])
}

fn render(snapshot: &FleetSnapshot, sops: SopsKeys) -> crate::RenderOutput {
    crate::render_with(
        snapshot,
        &crate::RenderOptions {
            sops,
            ..crate::RenderOptions::default()
        },
    )
}

fn bundle_text(output: &crate::RenderOutput) -> String {
    let bundle = output.bundles.get("shop-1").expect("a bundle");
    String::from_utf8(bundle.canonical_body()).expect("UTF-8")
}

#[test]
fn a_render_opens_sops_manifests_with_the_keys_it_is_given() {
    let snapshot = fleet(&write(SECRET, &[&recipient(IDENTITY)], &[]));
    let opened = render(&snapshot, SopsKeys::Open(Arc::new(keys(IDENTITY))));
    assert!(opened.is_clean(), "{:?}", opened.diagnostics);
    let text = bundle_text(&opened);
    assert!(text.contains("hunter2") && !text.contains("ENC["), "{text}");
    // The same commit renders the same digest.
    let again = render(&snapshot, SopsKeys::Open(Arc::new(keys(IDENTITY))));
    assert_eq!(
        opened.bundles["shop-1"].digest,
        again.bundles["shop-1"].digest
    );
}

#[test]
fn a_render_without_the_key_names_the_file_and_its_recipients() {
    let snapshot = fleet(&write(SECRET, &[&recipient(OTHER)], &[]));
    let output = render(&snapshot, SopsKeys::Open(Arc::new(keys(IDENTITY))));
    let error = output.errors().next().expect("an error");
    assert_eq!(
        error.file.as_deref(),
        Some("workloads/db/manifests/secret.yaml")
    );
    assert!(
        error.message.contains(&recipient(OTHER)),
        "{}",
        error.message
    );
    let none = render(
        &snapshot,
        SopsKeys::Open(Arc::new(DecryptionKeys::default())),
    );
    let error = none.errors().next().expect("an error");
    assert!(
        error.message.contains("--decryption-key"),
        "{}",
        error.message
    );
}

#[test]
fn a_review_without_keys_compares_ciphertext_with_a_warning() {
    let rule = [("encrypted_regex", Node::Str("^stringData$".into()))];
    let snapshot = fleet(&write(SECRET, &[&recipient(IDENTITY)], &rule));
    let output = render(&snapshot, SopsKeys::Unopened);
    assert!(output.is_clean(), "{:?}", output.diagnostics);
    let warning = output.warnings().next().expect("a warning");
    assert_eq!(
        warning.file.as_deref(),
        Some("workloads/db/manifests/secret.yaml")
    );
    let text = bundle_text(&output);
    assert!(
        text.contains("ENC[AES256_GCM") && !text.contains("hunter2"),
        "{text}"
    );
    assert!(
        !text.contains("lastmodified"),
        "the sops metadata is not a field: {text}"
    );
}

#[test]
fn a_decrypted_value_outside_a_secret_is_a_warning_naming_the_file_resource_and_field() {
    let config = r#"{"apiVersion": "v1", "kind": "ConfigMap",
      "metadata": {"name": "db"},
      "data": {"host": "primary.db.internal", "dsn": "postgres://pos:hunter2-long@db/pos"}}"#;
    let rule = [("encrypted_regex", Node::Str("^data$".into()))];
    let snapshot = fleet(&write(config, &[&recipient(IDENTITY)], &rule));
    let output = render(&snapshot, SopsKeys::Open(Arc::new(keys(IDENTITY))));
    let warnings: Vec<_> = output
        .warnings()
        .filter(|d| d.message.contains("not a Secret"))
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let dsn = warnings
        .iter()
        .find(|d| d.message.contains("data.dsn"))
        .expect("the dsn field");
    assert!(
        dsn.message.contains("workloads/db/manifests/secret.yaml"),
        "{}",
        dsn.message
    );
    assert!(dsn.message.contains("ConfigMap shop/db"), "{}", dsn.message);
    assert!(
        !dsn.message.contains("hunter2"),
        "never the value: {}",
        dsn.message
    );
    // The same values in a Secret raise nothing.
    let secret = fleet(&write(SECRET, &[&recipient(IDENTITY)], &[]));
    let output = render(&secret, SopsKeys::Open(Arc::new(keys(IDENTITY))));
    assert!(
        !output
            .warnings()
            .any(|d| d.message.contains("not a Secret")),
        "{:?}",
        output.diagnostics
    );
}

/// A tenant's workload holding a symlink to the platform's SOPS file (the reader
/// gives the link's path the target's text, and records the link): the file is not
/// opened there, so the platform's value is never sealed to the tenant's clusters.
#[test]
fn a_sops_file_reached_through_a_symlink_from_another_owner_is_not_opened() {
    const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
    let secret = write(SECRET, &[&recipient(IDENTITY)], &[]);
    let mut snapshot = fleet(&secret);
    snapshot.files.insert(
        "tenants/team-a.yaml".into(),
        format!("{HEADER}kind: Tenant\nmetadata:\n  name: team-a\nspec:\n  workloads: [shop]\n  namespaces: [shop-a]\n").into(),
    );
    snapshot.files.insert(
        "workloads/shop/workload.yaml".into(),
        format!("{HEADER}kind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: shop-a\n  targets:\n    - cluster: shop-1\n").into(),
    );
    // A cluster the tenant's workload does not go to.
    snapshot.files.insert(
        "clusters/hq-1.yaml".into(),
        format!("{HEADER}kind: Cluster\nmetadata:\n  name: hq-1\nspec: {{}}\n").into(),
    );
    snapshot.files.insert(
        "workloads/shop/manifests/stolen.yaml".into(),
        secret.clone().into(),
    );
    snapshot.links.insert(
        "workloads/shop/manifests/stolen.yaml".into(),
        "workloads/db/manifests/secret.yaml".into(),
    );
    let output = render(&snapshot, SopsKeys::Open(Arc::new(keys(IDENTITY))));
    let errors: Vec<String> = output.errors().map(ToString::to_string).collect();
    assert!(
        errors.iter().any(|e| e.starts_with(
            "workloads/shop/manifests/stolen.yaml: this SOPS file is a symlink to \
             workloads/db/manifests/secret.yaml, which is the platform's and not tenant \"team-a\"'s"
        )),
        "{errors:#?}"
    );
    // Whatever was rendered, the tenant's namespace holds no decrypted value.
    for bundle in output.bundles.values() {
        for resource in &bundle.resources {
            let text = String::from_utf8_lossy(&resource.canonical);
            if resource.key.namespace() == "shop-a" {
                assert!(!text.contains("hunter2"), "{text}");
            }
        }
    }
    // The error fails the tenant's cluster only: the platform's file opens where it
    // lies, for the cluster the tenant's workload does not go to.
    assert!(!output.bundles.contains_key("shop-1"));
    let hq = output.bundles.get("hq-1").expect("hq-1 keeps its bundle");
    let text = String::from_utf8(hq.canonical_body()).expect("UTF-8");
    assert!(text.contains("hunter2"), "{text}");
    // The platform's own file still opens where it lies.
    let own = render(&fleet(&secret), SopsKeys::Open(Arc::new(keys(IDENTITY))));
    assert!(own.is_clean(), "{:?}", own.diagnostics);
}
