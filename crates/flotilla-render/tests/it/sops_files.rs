//! SOPS files written by the real `sops` (with keys from the real `age-keygen`),
//! opened by flotilla and compared with what `sops decrypt` gives. Without the tools
//! these tests print that they skip and why; in CI (`FLOTILLA_CI=1`) they fail instead.

use std::path::Path;

use flotilla_render::sops::{DecryptionKeys, SopsDocument, SopsError};
use flotilla_testkit::SopsTools;

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata:
  name: db
  namespace: shop
type: Opaque
stringData:
  password: hunter2
  port: 5432
  ratio: 1.5
  enabled: true
  list:
    - a
    - 2
  empty: \"\"
  nothing: null
";

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writes");
    path
}

fn open(path: &Path, keys: &DecryptionKeys) -> Result<String, SopsError> {
    let text = std::fs::read_to_string(path).expect("reads");
    let json = path.extension().is_some_and(|e| e == "json");
    SopsDocument::parse(&text, json)
        .expect("parses")
        .expect("a sops document")
        .open(keys)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("JSON")
}

/// Opens `path` with flotilla and with `sops decrypt`, and compares them.
fn same_as_sops(tools: &SopsTools, path: &Path, key_file: &Path, keys: &DecryptionKeys) {
    let ours = open(path, keys).expect("flotilla opens it");
    let reference = tools.decrypt(path, key_file, "json");
    assert_eq!(json(&ours), json(&reference), "{}", path.display());
}

#[test]
fn files_sops_encrypted_open_as_sops_decrypts_them() {
    let Some(tools) =
        SopsTools::find("sops_files::files_sops_encrypted_open_as_sops_decrypts_them")
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("a folder");
    let key = tools.age_key();
    let key_file = write(dir.path(), "key.txt", &key.identity_file);
    let keys = DecryptionKeys::from_identity_file(&key.identity_file).expect("a key");

    let yaml = write(dir.path(), "secret.yaml", SECRET);
    tools.encrypt(&yaml, &[&key.recipient], &[]);
    let encrypted = std::fs::read_to_string(&yaml).expect("as written");
    assert!(!encrypted.contains("hunter2") && encrypted.contains("ENC[AES256_GCM"));
    same_as_sops(&tools, &yaml, &key_file, &keys);

    let partial = write(dir.path(), "partial.yaml", SECRET);
    tools.encrypt(
        &partial,
        &[&key.recipient],
        &["--encrypted-regex", "^(data|stringData)$"],
    );
    assert!(
        std::fs::read_to_string(&partial)
            .expect("as written")
            .contains("name: db")
    );
    same_as_sops(&tools, &partial, &key_file, &keys);

    let suffix = write(
        dir.path(),
        "suffix.yaml",
        "user_unencrypted: admin\npassword: hunter2\nnested:\n  host_unencrypted: db.local\n  token: abc\n",
    );
    tools.encrypt(&suffix, &[&key.recipient], &[]);
    same_as_sops(&tools, &suffix, &key_file, &keys);

    let regex = write(dir.path(), "regex.yaml", SECRET);
    tools.encrypt(
        &regex,
        &[&key.recipient],
        &[
            "--unencrypted-regex",
            "^(apiVersion|kind|metadata|type)$",
            "--mac-only-encrypted",
        ],
    );
    same_as_sops(&tools, &regex, &key_file, &keys);

    let json_file = write(
        dir.path(),
        "values.json",
        r#"{"image": {"tag": "1.2"}, "replicas": 3, "debug": false, "password": "hunter2", "ratio": 0.25}"#,
    );
    tools.encrypt(&json_file, &[&key.recipient], &[]);
    same_as_sops(&tools, &json_file, &key_file, &keys);
}

#[test]
fn several_recipients_and_a_file_for_another_recipient() {
    let Some(tools) =
        SopsTools::find("sops_files::several_recipients_and_a_file_for_another_recipient")
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("a folder");
    let (hub, old, stranger) = (tools.age_key(), tools.age_key(), tools.age_key());
    let file = write(dir.path(), "secret.yaml", SECRET);
    tools.encrypt(&file, &[&old.recipient, &hub.recipient], &[]);
    for key in [&hub, &old] {
        let keys = DecryptionKeys::from_identity_file(&key.identity_file).expect("as written");
        let key_file = write(dir.path(), "key.txt", &key.identity_file);
        same_as_sops(&tools, &file, &key_file, &keys);
    }
    let keys = DecryptionKeys::from_identity_file(&stranger.identity_file).expect("as written");
    match open(&file, &keys) {
        Err(err @ SopsError::NoKey { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains(&hub.recipient) && message.contains(&old.recipient),
                "names the recipients: {message}"
            );
        }
        other => panic!("expected no key, got {other:?}"),
    }
}

#[test]
fn a_file_changed_after_sops_encrypted_it_is_refused_whole() {
    let Some(tools) =
        SopsTools::find("sops_files::a_file_changed_after_sops_encrypted_it_is_refused_whole")
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("a folder");
    let key = tools.age_key();
    let keys = DecryptionKeys::from_identity_file(&key.identity_file).expect("as written");
    let file = write(dir.path(), "partial.yaml", SECRET);
    tools.encrypt(
        &file,
        &[&key.recipient],
        &["--encrypted-regex", "^stringData$"],
    );
    let text = std::fs::read_to_string(&file).expect("as written");
    assert!(open(&file, &keys).is_ok());

    // A value in the clear edited by hand.
    let edited = write(
        dir.path(),
        "edited.yaml",
        &text.replace("namespace: shop", "namespace: kube-system"),
    );
    assert_eq!(open(&edited, &keys), Err(SopsError::Mac));

    // The MAC itself edited: one character of its ciphertext.
    let mac_at = text.find("mac: ENC[AES256_GCM,data:").expect("a mac") + 25;
    let mut bytes = text.into_bytes();
    bytes[mac_at] = if bytes[mac_at] == b'A' { b'B' } else { b'A' };
    let tampered = write(
        dir.path(),
        "tampered.yaml",
        &String::from_utf8(bytes).expect("as written"),
    );
    assert_eq!(open(&tampered, &keys), Err(SopsError::Mac));
}

#[test]
fn the_real_age_opens_a_secret_sealed_for_its_key() {
    let Some(tools) = SopsTools::find("sops_files::the_real_age_opens_a_secret_sealed_for_its_key")
    else {
        return;
    };
    use flotilla_render::seal::{AgentKey, Sealer};
    let dir = tempfile::tempdir().expect("a folder");
    let key = tools.age_key();
    let key_file = write(dir.path(), "agent.key", &key.identity_file);
    let sealer = Sealer::from_hub_seed(&[1; 32]);
    let agent = AgentKey::parse(&key.recipient).expect("a recipient");
    for plain in [
        &b""[..],
        b"{\"stringData\":{\"password\":\"hunter2\"}}",
        &[7u8; 200_000][..],
    ] {
        let sealed = sealer.seal(&agent, "v1/Secret/shop/db", plain);
        let file = dir.path().join("sealed.age");
        std::fs::write(&file, &sealed).expect("writes");
        let out = std::process::Command::new("age")
            .arg("--decrypt")
            .arg("-i")
            .arg(&key_file)
            .arg(&file)
            .output()
            .expect("age runs");
        assert!(
            out.status.success(),
            "age -d: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, plain, "{} bytes", plain.len());
    }
}
