//! SOPS files in a fleet, end to end with the real `sops` and `age-keygen`: the
//! hub's age identity from `flotilla key generate --age`, a Secret encrypted to it,
//! `render`/`validate` with and without `--decryption-key`, and a hub that opens it
//! (or, without the key, reports the file as a render error). Without the tools
//! these tests print that they skip and why; in CI they fail instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use flotilla_core::bundle::verify_document;
use flotilla_testkit::SopsTools;

use crate::support::hub::*;

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata:
  name: pos-database
  namespace: kuard
type: Opaque
stringData:
  password: correct-horse-battery-staple
  port: 5432
";
const PLAIN: &str = "correct-horse-battery-staple";
const FILE: &str = "workloads/kuard/manifests/pos-database.yaml";

fn flotilla(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_DECRYPTION_KEY")
        .output()
        .expect("flotilla runs")
}

/// `flotilla key generate --age --out DIR/NAME`: the file and the recipient printed.
fn age_key(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = flotilla(&[
        "key",
        "generate",
        "--age",
        "--out",
        path.to_str().expect("a path"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recipient = String::from_utf8(out.stdout)
        .expect("UTF-8")
        .trim()
        .to_string();
    assert!(recipient.starts_with("age1"), "{recipient}");
    (path, recipient)
}

/// fleet-example with the Secret above, encrypted with sops to `recipient`.
fn repo_with_secret(tools: &SopsTools, recipient: &str) -> Repo {
    let repo = Repo::new();
    repo.write(FILE, SECRET);
    tools.encrypt(&repo.path().join(FILE), &[recipient], &[]);
    assert!(!repo.read(FILE).contains(PLAIN));
    repo.commit("a database password, encrypted with sops");
    repo
}

#[test]
fn render_and_validate_open_a_sops_secret_with_the_key_and_say_when_they_cannot() {
    let Some(tools) = SopsTools::find(
        "sops_secrets::render_and_validate_open_a_sops_secret_with_the_key_and_say_when_they_cannot",
    ) else {
        return;
    };
    let keys = tempfile::tempdir().expect("a folder");
    let (hub_key, recipient) = age_key(keys.path(), "hub.agekey");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&hub_key)
            .expect("written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the identity is private");
    }
    let again = flotilla(&[
        "key",
        "generate",
        "--age",
        "--out",
        hub_key.to_str().expect("a path"),
    ]);
    assert!(!again.status.success(), "an identity is never overwritten");

    let repo = repo_with_secret(&tools, &recipient);
    let fleet = repo.path().to_str().expect("a path");
    let key = hub_key.to_str().expect("a path");

    let rendered = flotilla(&[
        "render",
        "--repo",
        fleet,
        "--cluster",
        "red",
        "--decryption-key",
        key,
    ]);
    let stdout = String::from_utf8_lossy(&rendered.stdout);
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    assert!(
        stdout.contains(PLAIN) && stdout.contains("pos-database"),
        "{stdout}"
    );

    let valid = flotilla(&["validate", "--repo", fleet, "--decryption-key", key]);
    let stderr = String::from_utf8_lossy(&valid.stderr);
    assert_eq!(valid.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("without decrypting"), "{stderr}");
    // Its clusters name no agent key: the Secret would travel as plain text.
    assert!(stderr.contains("no spec.agentKey"), "{stderr}");
    // It says that hashes over the file's values are keyed, unlike kustomize's and Helm's.
    let stdout = String::from_utf8_lossy(&valid.stdout);
    assert!(
        stdout.contains("SOPS file ") && stdout.contains("HMAC keyed by the file's data key"),
        "{stdout}"
    );

    // Without the key, a file whose kind and name are encrypted too is left out, with
    // a warning naming it and saying how to encrypt only the values.
    let unopened = flotilla(&["validate", "--repo", fleet]);
    let stderr = String::from_utf8_lossy(&unopened.stderr);
    assert_eq!(unopened.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(FILE) && stderr.contains("encrypted_regex"),
        "{stderr}"
    );
    // One with only its values encrypted is read as ciphertext, with a warning.
    repo.write(FILE, SECRET);
    tools.encrypt(
        &repo.path().join(FILE),
        &[&recipient],
        &["--encrypted-regex", "^(data|stringData)$"],
    );
    repo.commit("only the values encrypted");
    let unopened = flotilla(&["validate", "--repo", fleet]);
    let stderr = String::from_utf8_lossy(&unopened.stderr);
    assert_eq!(unopened.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(FILE) && stderr.contains("without decrypting"),
        "{stderr}"
    );
    let ciphertext = flotilla(&["render", "--repo", fleet, "--cluster", "red"]);
    let stdout = String::from_utf8_lossy(&ciphertext.stdout);
    assert!(
        stdout.contains("pos-database") && !stdout.contains(PLAIN),
        "{stdout}"
    );

    // Another key: an error naming the file and the recipient it was encrypted to.
    let (other, _) = age_key(keys.path(), "other.agekey");
    let wrong = flotilla(&[
        "validate",
        "--repo",
        fleet,
        "--decryption-key",
        other.to_str().expect("a path"),
    ]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert_eq!(wrong.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(FILE) && stderr.contains(&recipient),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_opens_a_sops_secret_with_its_key_and_without_one_names_the_file() {
    let Some(tools) = SopsTools::find(
        "sops_secrets::the_hub_opens_a_sops_secret_with_its_key_and_without_one_names_the_file",
    ) else {
        return;
    };
    let key = tools.age_key();
    let repo = repo_with_secret(&tools, &key.recipient);
    let client = client();

    // Without a key the commit is not served; the error names the file.
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let fleet = get_json(&client, &hub.url("/v1/fleet"), &admin).await;
    let errors = fleet["renderErrors"].as_array().expect("errors");
    assert!(
        errors.iter().any(|e| e["file"] == FILE
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains(&key.recipient) && t.contains("--decryption-key"))),
        "{errors:#?}"
    );
    hub.stop().await;

    // With it, the cluster is served the Secret's value.
    let state = tempfile::tempdir().expect("state dir");
    let token = make_token(state.path(), Some("red")).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.decryption = std::sync::Arc::new(
        flotilla_render::sops::DecryptionKeys::from_identity_file(&key.identity_file)
            .expect("an identity"),
    );
    let hub = Running::start_ready(config).await;
    let body = eventually("red's bundle", Duration::from_secs(10), || {
        let (client, url, token) = (&client, hub.url("/v1/clusters/red/bundle"), &token);
        async move {
            let (status, _, body) = get_bundle(client, &url, token, None).await;
            (status == 200).then_some(body)
        }
    })
    .await;
    let document = verify_document(&body, Some("red")).expect("a verified bundle");
    let secret = document
        .resources
        .iter()
        .map(|r| r.value())
        .find(|r| r["kind"] == "Secret" && r["metadata"]["name"] == "pos-database")
        .expect("the Secret");
    assert_eq!(secret["stringData"]["password"], PLAIN);
    assert_eq!(secret["stringData"]["port"], 5432);
    hub.stop().await;
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if file_contains(&path, needle) {
                found.push(path);
            }
        }
    }
    found
}

fn file_contains(path: &Path, needle: &[u8]) -> bool {
    std::fs::read(path).is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
}

#[test]
fn a_sops_secret_reaches_its_agent_sealed_and_nothing_between_holds_its_value() {
    use crate::support::process::{free_port, http_status, start_flotilla, wait_for};
    let Some(tools) = SopsTools::find(
        "sops_secrets::a_sops_secret_reaches_its_agent_sealed_and_nothing_between_holds_its_value",
    ) else {
        return;
    };
    let repo = Repo::new();
    let work = tempfile::tempdir().expect("a folder");
    let work = work.path();
    let start = |args: &[&str], log: &str| start_flotilla(work, args, log);
    let port = free_port();
    let server = format!("http://127.0.0.1:{port}");
    let agent_args = [
        "agent",
        "--server",
        &server,
        "--cluster",
        "red",
        "--token-file",
        "red.token",
        "--state-dir",
        "agent-state",
        "--sink",
        "dir:./out",
    ];

    // The agent makes its key at its first start, before it reaches any hub, and
    // prints the line to add to its Cluster file.
    std::fs::write(work.join("red.token"), format!("flt_{}\n", "0".repeat(64))).expect("write");
    let mut first = vec![start(&agent_args, "agent-first.log")];
    let first_log = work.join("agent-first.log");
    wait_for("the agent to make its key", &mut first, || {
        std::fs::read_to_string(&first_log).is_ok_and(|log| log.contains("agentKey: age1"))
    });
    drop(first);
    let printed = std::fs::read_to_string(&first_log).expect("a log");
    let agent_key = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("agentKey: "))
        .expect("the line to add")
        .to_string();

    // The hub's identity, and the fleet: red names its agent's key, and a workload
    // for red alone carries a SOPS Secret.
    let hub_key = tools.age_key();
    std::fs::write(work.join("hub.agekey"), &hub_key.identity_file).expect("write");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            work.join("hub.agekey"),
            std::fs::Permissions::from_mode(0o600),
        )
        .expect("chmod");
    }
    let red = repo
        .read("clusters/red.yaml")
        .replace("spec:\n", &format!("spec:\n  agentKey: {agent_key}\n"));
    repo.write("clusters/red.yaml", &red);
    repo.write(
        "workloads/vault/workload.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: vault\nspec:\n  namespace: kuard\n  targets:\n    - cluster: red\n",
    );
    let file = "workloads/vault/manifests/pos-database.yaml";
    repo.write(file, SECRET);
    tools.encrypt(
        &repo.path().join(file),
        &[&hub_key.recipient],
        &["--encrypted-regex", "^(data|stringData)$"],
    );
    repo.commit("red's agent key and a SOPS Secret for red");

    let fleet = repo.path().to_str().expect("a path").to_string();
    let listen = format!("127.0.0.1:{port}");
    let mut running = vec![start(
        &[
            "serve",
            "--repo",
            &fleet,
            "--state-dir",
            "state",
            "--listen",
            &listen,
            "--decryption-key",
            "hub.agekey",
        ],
        "hub.log",
    )];
    wait_for("the hub to serve bundles", &mut running, || {
        http_status(port, "/readyz") == Some(200)
    });
    let token = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["token", "create", "red", "--state-dir", "state"])
        .current_dir(work)
        .output()
        .expect("token create runs");
    assert!(
        token.status.success(),
        "{}",
        String::from_utf8_lossy(&token.stderr)
    );
    std::fs::write(work.join("red.token"), &token.stdout).expect("write");
    running.push(start(&agent_args, "agent.log"));
    let out = work.join("out");
    wait_for("the agent to write the opened Secret", &mut running, || {
        !files_containing(&out, PLAIN.as_bytes()).is_empty()
    });

    // What the agent applied holds the value, in a private file.
    let applied = files_containing(&out, PLAIN.as_bytes());
    assert_eq!(applied.len(), 1, "{applied:?}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&applied[0])
            .expect("written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }

    // publish, from the same store, writes the bundle the hub serves: the Secret in
    // it is sealed.
    let published = work.join("published");
    let publish = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "publish",
            "--repo",
            &fleet,
            "--state-dir",
            "state",
            "--decryption-key",
            "hub.agekey",
            "--out",
        ])
        .arg(&published)
        .current_dir(work)
        .output()
        .expect("publish runs");
    assert!(
        publish.status.success(),
        "{}",
        String::from_utf8_lossy(&publish.stderr)
    );
    let document = std::fs::read(published.join("v1/clusters/red/bundle")).expect("red's bundle");
    let document = verify_document(&document, Some("red")).expect("a verified bundle");
    let sealed = document
        .resources
        .iter()
        .map(|r| r.value())
        .find(|r| r["kind"] == "Secret" && r["metadata"]["name"] == "pos-database")
        .expect("the Secret");
    assert!(sealed.get("stringData").is_none(), "{sealed}");
    assert!(sealed[flotilla_core::bundle::SEALED_SECRET_FIELD]["sealed"].is_string());

    // Nowhere between Git and the agent's sink is the value kept: not the hub's state
    // (its database and objects), its log, publish output, nor the agent's own state.
    drop(running);
    for place in ["state", "published", "agent-state"] {
        let found = files_containing(&work.join(place), PLAIN.as_bytes());
        assert!(found.is_empty(), "the plain value is in {found:?}");
    }
    for log in ["hub.log", "agent.log"] {
        assert!(
            !file_contains(&work.join(log), PLAIN.as_bytes()),
            "the plain value is in {log}"
        );
    }
}

#[test]
fn publish_without_the_hubs_seed_refuses_a_fleet_whose_clusters_name_agent_keys() {
    let repo = Repo::new();
    let keys = tempfile::tempdir().expect("a folder");
    let (_, agent_key) = age_key(keys.path(), "agent.agekey");
    let red = repo
        .read("clusters/red.yaml")
        .replace("spec:\n", &format!("spec:\n  agentKey: {agent_key}\n"));
    repo.write("clusters/red.yaml", &red);
    repo.write(FILE, SECRET);
    repo.commit("red names its agent's key; a plain Secret");
    let out = keys.path().join("published");
    let published = flotilla(&[
        "publish",
        "--repo",
        repo.path().to_str().expect("a path"),
        "--out",
        out.to_str().expect("a path"),
    ]);
    let stderr = String::from_utf8_lossy(&published.stderr);
    assert_eq!(published.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("spec.agentKey") && stderr.contains("--state-dir"),
        "{stderr}"
    );
    assert!(files_containing(&out, PLAIN.as_bytes()).is_empty());
}
