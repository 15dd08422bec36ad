//! `flotilla render --format flux` and `--format manifestwork` run as a user runs
//! them: the Flux layers unpacked as Flux's source-controller unpacks them and
//! compared with `render --out`'s bundles (Secrets opened with the agent's identity,
//! by flotilla and, when installed, by the real `sops`), and the ManifestWorks read
//! back and compared, split, refused.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use flotilla_render::sops::{DecryptionKeys, SopsDocument};
use serde_json::Value;

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
const SECRET: &str = "apiVersion: v1
kind: Secret
metadata:
  name: db
stringData:
  password: correct-horse-battery-staple
";
const CONFIG: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n";

fn flotilla(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_DECRYPTION_KEY")
        .output()
        .expect("flotilla runs")
}

fn succeeds(args: &[&str]) -> String {
    let out = flotilla(args);
    assert!(
        out.status.success(),
        "flotilla {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// An age identity from `flotilla key generate --age`: (file, recipient).
fn agent_identity(dir: &Path) -> (PathBuf, String) {
    let file = dir.join("agent.agekey");
    let recipient = succeeds(&["key", "generate", "--age", "--out", path(&file)])
        .trim()
        .to_string();
    (file, recipient)
}

/// A fleet in `dir`: `vault` (with `agent_key`, if any) gets the Secret and the
/// ConfigMap, `plain` the ConfigMap only.
fn write_fleet(dir: &Path, agent_key: Option<&str>) {
    let spec = agent_key.map_or(String::new(), |k| format!("spec:\n  agentKey: {k}\n"));
    let files = [
        (
            "clusters/vault.yaml".to_string(),
            format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: vault\n  labels:\n    secrets: \"yes\"\n{spec}"
            ),
        ),
        (
            "clusters/plain.yaml".to_string(),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: plain\n"),
        ),
        (
            "workloads/shop/workload.yaml".to_string(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        ),
        (
            "workloads/shop/manifests/config.yaml".to_string(),
            CONFIG.to_string(),
        ),
        (
            "workloads/db/workload.yaml".to_string(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: db\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector:\n        matchLabels:\n          secrets: \"yes\"\n"
            ),
        ),
        (
            "workloads/db/manifests/secret.yaml".to_string(),
            SECRET.to_string(),
        ),
    ];
    for (name, text) in files {
        let file = dir.join(name);
        std::fs::create_dir_all(file.parent().expect("a folder")).expect("creates");
        std::fs::write(file, text).expect("writes");
    }
}

/// The resources of each cluster's bundle, from `render --out`.
fn bundle_resources(fleet: &Path, out: &Path, cluster: &str) -> Vec<Value> {
    succeeds(&["render", "--repo", path(fleet), "--out", path(out)]);
    let text = std::fs::read_to_string(out.join(format!("{cluster}.json"))).expect("a bundle");
    let document: Value = serde_json::from_str(&text).expect("JSON");
    document["resources"].as_array().expect("resources").clone()
}

/// The files of a layer, as source-controller unpacks it.
fn unpack(layer: &Path) -> Vec<(String, String)> {
    let bytes = std::fs::read(layer).expect("the layer");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
    archive
        .entries()
        .expect("a tar.gz")
        .map(|entry| {
            let mut entry = entry.expect("an entry");
            let name = entry.path().expect("a path").to_string_lossy().into_owned();
            let mut text = String::new();
            entry.read_to_string(&mut text).expect("UTF-8");
            (name, text)
        })
        .collect()
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("YAML")
}

#[test]
fn render_format_flux_writes_each_clusters_layer_with_its_secrets_for_its_agent() {
    let dir = tempfile::tempdir().expect("a folder");
    let (identity, recipient) = agent_identity(dir.path());
    let fleet = dir.path().join("fleet");
    write_fleet(&fleet, Some(&recipient));
    let layers = dir.path().join("layers");
    let summary = succeeds(&[
        "render",
        "--repo",
        path(&fleet),
        "--format",
        "flux",
        "--out",
        path(&layers),
    ]);
    assert!(
        summary.contains("vault")
            && summary.contains("application/vnd.cncf.flux.content.v1.tar+gzip"),
        "{summary}"
    );

    let keys =
        DecryptionKeys::from_identity_file(&std::fs::read_to_string(&identity).expect("the key"))
            .expect("an identity");
    let sops = flotilla_testkit::SopsTools::find(
        "formats_cli::render_format_flux_writes_each_clusters_layer_with_its_secrets_for_its_agent",
    );
    for cluster in ["vault", "plain"] {
        let expected = bundle_resources(&fleet, &dir.path().join("bundles"), cluster);
        let files = unpack(&layers.join(format!("{cluster}.tar.gz")));
        let mut resources = Vec::new();
        for (name, text) in &files {
            assert!(
                !text.contains("correct-horse"),
                "{name} holds the plain value"
            );
            let resource = match SopsDocument::parse(text, false).expect("parses") {
                Some(document) => {
                    let opened: Value = serde_json::from_str(
                        &document.open(&keys).expect("the agent's key opens it"),
                    )
                    .expect("JSON");
                    if let Some(tools) = &sops {
                        let file = dir.path().join(name);
                        std::fs::write(&file, text).expect("writes");
                        let reference: Value =
                            serde_json::from_str(&tools.decrypt(&file, &identity, "json"))
                                .expect("JSON");
                        assert_eq!(reference, opened, "sops decrypts {name} as flotilla does");
                    }
                    opened
                }
                None => yaml(text),
            };
            resources.push(resource);
        }
        assert_eq!(resources, expected, "{cluster}");
    }
}

#[test]
fn render_format_flux_refuses_a_cluster_with_secrets_and_no_agent_key() {
    let dir = tempfile::tempdir().expect("a folder");
    let fleet = dir.path().join("fleet");
    write_fleet(&fleet, None);
    let layers = dir.path().join("layers");
    let out = flotilla(&[
        "render",
        "--repo",
        path(&fleet),
        "--format",
        "flux",
        "--out",
        path(&layers),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cluster vault")
            && stderr.contains("Secret shop/db")
            && stderr.contains("agentKey"),
        "{stderr}"
    );
    assert!(!layers.exists(), "nothing is written");

    let out = flotilla(&["render", "--repo", path(&fleet), "--format", "flux"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--out DIR"));
}

/// Each cluster's ManifestWorks from `render --format manifestwork --out`, as JSON.
fn manifest_works(
    fleet: &Path,
    out: &Path,
    extra: &[&str],
) -> Result<Vec<(String, Vec<Value>)>, String> {
    let mut args = vec![
        "render",
        "--repo",
        path(fleet),
        "--format",
        "manifestwork",
        "--out",
        path(out),
    ];
    args.extend_from_slice(extra);
    let result = flotilla(&args);
    if !result.status.success() {
        return Err(String::from_utf8_lossy(&result.stderr).into_owned());
    }
    let mut clusters = Vec::new();
    for entry in std::fs::read_dir(out).expect("the folder") {
        let file = entry.expect("an entry").path();
        let cluster = file
            .file_stem()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&file).expect("reads");
        let works: Vec<Value> = serde_saphyr::from_multiple(&text).expect("a YAML stream");
        clusters.push((cluster, works));
    }
    clusters.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(clusters)
}

#[test]
fn render_format_manifestwork_writes_the_example_fleet_split_to_the_limit() {
    let example = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example"));
    let dir = tempfile::tempdir().expect("a folder");
    let whole = manifest_works(example, &dir.path().join("whole"), &[]).expect("works");
    let split = manifest_works(
        example,
        &dir.path().join("split"),
        &["--manifestwork-max-bytes", "2KiB"],
    )
    .expect("works");
    assert_eq!(whole.len(), 14, "one file per cluster of the example");
    for ((cluster, whole), (_, split)) in whole.iter().zip(&split) {
        let expected = bundle_resources(example, &dir.path().join("bundles"), cluster);
        assert_eq!(whole.len(), 1, "{cluster} fits one work");
        let total: usize = expected
            .iter()
            .map(|m| serde_json::to_vec(m).expect("JSON").len())
            .sum();
        assert_eq!(
            split.len() > 1,
            total > 2048,
            "{cluster}: {total} bytes, {} works",
            split.len()
        );
        for (works, limit) in [(whole, None), (split, Some(2048))] {
            let mut resources = Vec::new();
            for (index, work) in works.iter().enumerate() {
                assert_eq!(work["apiVersion"], "work.open-cluster-management.io/v1");
                assert_eq!(work["kind"], "ManifestWork");
                assert_eq!(work["metadata"]["namespace"], cluster.as_str());
                assert_eq!(
                    work["metadata"]["name"],
                    format!("flotilla-{cluster}-{}", index + 1)
                );
                let manifests = work["spec"]["workload"]["manifests"]
                    .as_array()
                    .expect("manifests");
                if let Some(limit) = limit {
                    let bytes: usize = manifests
                        .iter()
                        .map(|m| serde_json::to_vec(m).expect("JSON").len())
                        .sum();
                    assert!(bytes <= limit, "{cluster}: {bytes} bytes in one work");
                }
                resources.extend(manifests.iter().cloned());
            }
            assert_eq!(resources, expected, "{cluster}");
        }
    }

    let err = manifest_works(
        example,
        &dir.path().join("tiny"),
        &["--manifestwork-max-bytes", "100"],
    )
    .expect_err("refused");
    assert!(
        err.contains("is") && err.contains("more than one ManifestWork may hold (100 bytes"),
        "{err}"
    );
    assert!(!dir.path().join("tiny").exists(), "nothing is written");
}

#[test]
fn render_format_manifestwork_writes_secrets_only_when_allowed() {
    let dir = tempfile::tempdir().expect("a folder");
    let fleet = dir.path().join("fleet");
    write_fleet(&fleet, None);
    let err = manifest_works(&fleet, &dir.path().join("refused"), &[]).expect_err("refused");
    assert!(
        err.contains("cluster vault")
            && err.contains("Secret shop/db")
            && err.contains("--allow-plain-secrets"),
        "{err}"
    );
    let works = manifest_works(
        &fleet,
        &dir.path().join("allowed"),
        &["--allow-plain-secrets"],
    )
    .expect("works");
    let vault = &works.iter().find(|(c, _)| c == "vault").expect("vault").1;
    assert_eq!(
        vault[0]["spec"]["workload"]["manifests"]
            .as_array()
            .expect("manifests"),
        &bundle_resources(&fleet, &dir.path().join("bundles"), "vault")
    );
}

/// `render` on standard output prints each bundle document as `--out` writes it and
/// the hub serves it, `meta` included: the digest it prints covers `meta`, and the
/// resources alone do not hash to it.
#[test]
fn render_prints_the_documents_that_out_writes_meta_included() {
    let fleet = concat!(env!("CARGO_MANIFEST_DIR"), "/fleet-example");
    let out = tempfile::tempdir().expect("temp dir");
    let printed: Vec<Value> = serde_json::from_str(&succeeds(&[
        "render",
        "--worktree",
        "--repo",
        fleet,
        "-o",
        "json",
    ]))
    .expect("JSON");
    succeeds(&[
        "render",
        "--worktree",
        "--repo",
        fleet,
        "--out",
        path(out.path()),
    ]);
    assert!(!printed.is_empty());
    let mut with_meta = 0;
    for document in &printed {
        let cluster = document["cluster"].as_str().expect("a cluster");
        let text =
            std::fs::read_to_string(out.path().join(format!("{cluster}.json"))).expect("a bundle");
        let written: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(document, &written, "{cluster}");
        with_meta += usize::from(document.get("meta").is_some());
    }
    assert!(with_meta > 0, "the example's bundles have metadata");
}
