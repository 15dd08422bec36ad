//! A rendered fleet in other fleets' formats: the Flux layer unpacked as Flux's
//! source-controller unpacks it (its Secrets opened by flotilla's SOPS reader and by
//! the real `sops`), and OCM `ManifestWork`s read back into typed structs that refuse
//! unknown fields. The `sops` comparisons skip without the tools (and fail in CI).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::str::FromStr as _;

use flotilla_core::bundle::Bundle;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::formats::flux::{self, FluxError};
use flotilla_render::formats::manifestwork::{
    self, ManifestWorkError, ManifestWorkOptions, manifest_works,
};
use flotilla_render::seal::AgentKey;
use flotilla_render::sops::{DecryptionKeys, SopsDocument, SopsWriter};
use flotilla_render::{RenderOutput, render};
use serde::Deserialize;
use serde_json::{Value, json};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
/// An identity made by `age-keygen` for these tests only.
const AGENT: &str = "AGE-SECRET-KEY-1SH36876FLEVRV2C9YN2PNR3JJQV0Z9TLDNL49D4QPZRD22V3EENQ55K5JP";
/// 2024-02-29T12:34:56Z.
const MODIFIED: u64 = 1_709_210_096;

const SECRET: &str = "apiVersion: v1
kind: Secret
metadata:
  name: db
  labels:
    tier: data
    port: \"5432\"
    enabled: \"true\"
    legacy: \"yes\"
    version: \"1.0\"
    hex: \"0x1F\"
    none: \"~\"
  annotations:
    kubectl.kubernetes.io/last-applied-configuration: '{\"data\":{\"password\":\"aHVudGVyMg==\"}}'
type: Opaque
data:
  password: aHVudGVyMg==
stringData:
  user: admin & <root>
  empty: \"\"
";
const CONFIG: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: fast\n  port: \"5432\"\n  on: \"on\"\n  empty: \"\"\n  null: \"null\"\n  date: \"2024-01-01\"\n  multi: \"a\\nb: c\\n\"\n";
const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  template:
    spec:
      containers:
        - name: web
          image: nginx:1.27
          args: [\"--ratio\", \"1.5\"]
";

fn identity() -> age::x25519::Identity {
    age::x25519::Identity::from_str(AGENT).expect("an identity")
}

fn recipient() -> String {
    identity().to_public().to_string()
}

/// A fleet of the clusters `(name, agentKey)`, each with the manifests given.
fn fleet(clusters: &[(&str, Option<&str>)], manifests: &[(&str, &str)]) -> FleetSnapshot {
    let mut files: Vec<(String, String)> = vec![(
        "workloads/shop/workload.yaml".into(),
        format!(
            "{HEADER}kind: Workload\nmetadata:\n  name: shop\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    )];
    for (name, key) in clusters {
        let spec = key.map_or(String::new(), |k| format!("spec:\n  agentKey: {k}\n"));
        files.push((
            format!("clusters/{name}.yaml"),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: {name}\n{spec}"),
        ));
    }
    for (name, text) in manifests {
        files.push((format!("workloads/shop/manifests/{name}"), text.to_string()));
    }
    FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())))
}

fn rendered(snapshot: &FleetSnapshot) -> RenderOutput {
    let output = render(snapshot);
    let errors: Vec<String> = output.errors().map(|d| d.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    output
}

fn values(bundle: &Bundle) -> Vec<Value> {
    bundle.resources.iter().map(|r| r.value()).collect()
}

/// The layer unpacked as source-controller unpacks it: (path, text) of each file,
/// with every entry checked to be a plain, reproducible file.
fn unpack(layer: &[u8]) -> Vec<(String, String)> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer));
    let mut files = Vec::new();
    for entry in archive.entries().expect("a tar stream") {
        let mut entry = entry.expect("an entry");
        let header = entry.header();
        assert_eq!(header.entry_type(), tar::EntryType::Regular);
        assert_eq!(header.mode().expect("a mode"), 0o644);
        assert_eq!(header.mtime().expect("a time"), 0);
        let path = entry.path().expect("a path").to_string_lossy().into_owned();
        assert!(!path.contains('/') && path.ends_with(".yaml"), "{path}");
        let mut text = String::new();
        entry.read_to_string(&mut text).expect("UTF-8");
        files.push((path, text));
    }
    files
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).expect("YAML")
}

/// Each file's resource, its Secrets opened with the agent's identity by flotilla's
/// own SOPS reader.
fn opened(files: &[(String, String)]) -> Vec<Value> {
    let keys = DecryptionKeys::from_identity_file(AGENT).expect("a key");
    files
        .iter()
        .map(
            |(_, text)| match SopsDocument::parse(text, false).expect("parses") {
                Some(document) => {
                    serde_json::from_str(&document.open(&keys).expect("opens")).expect("JSON")
                }
                None => yaml(text),
            },
        )
        .collect()
}

#[test]
fn the_flux_layer_holds_the_bundle_as_yaml_files_with_secrets_as_sops_for_the_agent() {
    let key = recipient();
    let output = rendered(&fleet(
        &[("edge", Some(&key))],
        &[
            ("secret.yaml", SECRET),
            ("config.yaml", CONFIG),
            ("web.yaml", DEPLOYMENT),
        ],
    ));
    let bundle = &output.bundles["edge"];
    let agent_key = output.agent_keys.get("edge");
    assert_eq!(agent_key, Some(&AgentKey::parse(&key).expect("a key")));
    let layer =
        flux::flux_layer(bundle, agent_key, &SopsWriter::new([7; 32], MODIFIED)).expect("a layer");
    let files = unpack(&layer);

    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        names,
        [
            "0001-configmap-shop-settings.yaml",
            "0002-secret-shop-db.yaml",
            "0003-deployment-shop-web.yaml"
        ]
    );
    let (_, secret) = &files[1];
    assert!(
        !secret.contains("aHVudGVyMg==") && !secret.contains("admin &"),
        "{secret}"
    );
    assert!(
        secret.contains("ENC[AES256_GCM,") && secret.contains(&key),
        "{secret}"
    );
    assert!(secret.contains("2024-02-29T12:34:56Z"), "{secret}");
    // What is not a value stays readable: Flux and a reviewer see what it is.
    assert_eq!(yaml(secret)["metadata"]["labels"]["tier"], "data");
    assert_eq!(
        yaml(secret)["sops"]["encrypted_regex"],
        "^(data|stringData|kubectl\\.kubernetes\\.io/last\\-applied\\-configuration)$"
    );

    assert_eq!(opened(&files), values(bundle));
}

#[test]
fn a_cluster_with_secrets_and_no_agent_key_is_refused_by_name() {
    let output = rendered(&fleet(&[("edge-7", None)], &[("secret.yaml", SECRET)]));
    let err = flux::flux_layer(
        &output.bundles["edge-7"],
        None,
        &SopsWriter::new([7; 32], MODIFIED),
    )
    .expect_err("refused");
    assert!(matches!(err, FluxError::NoAgentKey { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("cluster edge-7")
            && message.contains("Secret shop/db")
            && message.contains("agentKey"),
        "{message}"
    );
}

#[test]
fn every_cluster_that_cannot_have_a_layer_is_named_and_odd_names_make_plain_file_names() {
    const ROLE: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: system:Reader\nrules: []\n";
    const EMPTY_SECRET: &str =
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pull\ntype: Opaque\n";
    let output = rendered(&fleet(
        &[("a", None), ("b", None)],
        &[("secret.yaml", SECRET), ("role.yaml", ROLE)],
    ));
    let errors =
        flux::flux_layers(&output, &SopsWriter::new([7; 32], MODIFIED)).expect_err("refused");
    let clusters: Vec<String> = errors
        .iter()
        .map(|e| match e {
            FluxError::NoAgentKey { cluster, .. } => cluster.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(clusters, ["a", "b"]);

    // A Secret without values needs no key.
    let long = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n",
        "n".repeat(253)
    );
    let output = rendered(&fleet(
        &[("a", None)],
        &[
            ("secret.yaml", EMPTY_SECRET),
            ("role.yaml", ROLE),
            ("long.yaml", &long),
        ],
    ));
    let layers = flux::flux_layers(&output, &SopsWriter::new([7; 32], MODIFIED)).expect("layers");
    let files = unpack(&layers[0].1);
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("0001-configmap-shop-{}.yaml", "n".repeat(100 - 25)).as_str(),
            "0002-secret-shop-pull.yaml",
            "0003-clusterrole-_-system_reader.yaml"
        ]
    );
    assert_eq!(
        files.iter().map(|(_, t)| yaml(t)).collect::<Vec<_>>(),
        values(&output.bundles["a"])
    );
}

#[test]
fn a_layer_without_secrets_needs_no_key_and_is_the_same_bytes_every_time() {
    let output = rendered(&fleet(
        &[("edge", None)],
        &[("config.yaml", CONFIG), ("web.yaml", DEPLOYMENT)],
    ));
    let bundle = &output.bundles["edge"];
    let once = flux::flux_layer(bundle, None, &SopsWriter::new([1; 32], 1)).expect("a layer");
    let again = flux::flux_layer(bundle, None, &SopsWriter::new([2; 32], 2)).expect("a layer");
    assert_eq!(once, again);
    let files = unpack(&once);
    assert_eq!(
        files.iter().map(|(_, t)| yaml(t)).collect::<Vec<_>>(),
        values(bundle)
    );
}

#[test]
fn a_seed_derived_from_the_operators_identity_gives_the_same_secret_layer_each_time() {
    // Another identity made by `age-keygen` for these tests only, as the operator's.
    let operator = age::x25519::Identity::generate();
    let keys = || {
        use age::secrecy::ExposeSecret as _;
        DecryptionKeys::from_identity_file(operator.to_string().expose_secret()).expect("a key")
    };
    let seed = flux::sops_seed(&keys()).expect("a seed");
    assert_eq!(flux::sops_seed(&keys()), Some(seed));
    assert_ne!(
        flux::sops_seed(&DecryptionKeys::from_identity_file(AGENT).expect("a key")),
        Some(seed)
    );
    assert_eq!(flux::sops_seed(&DecryptionKeys::default()), None);

    let key = recipient();
    let output = rendered(&fleet(&[("edge", Some(&key))], &[("db.yaml", SECRET)]));
    let bundle = &output.bundles["edge"];
    let layer = |seed: [u8; 32]| {
        flux::flux_layer(
            bundle,
            output.agent_keys.get("edge"),
            &SopsWriter::new(seed, flux::STABLE_TIME),
        )
        .expect("a layer")
    };
    assert_eq!(layer(seed), layer(seed));
    assert_ne!(layer(seed), layer([7; 32]));
    assert!(flotilla_render::formats::holds_plain_secrets(bundle));
    assert_eq!(opened(&unpack(&layer(seed))), values(bundle));
}

#[test]
fn a_sealed_secret_is_refused_for_flux() {
    let key = recipient();
    let snapshot = fleet(&[("edge", Some(&key))], &[("secret.yaml", SECRET)]);
    let output = flotilla_render::render_with(
        &snapshot,
        &flotilla_render::RenderOptions {
            helm_seed: Some([9; 32]),
            ..Default::default()
        },
    );
    let err = flux::flux_layer(
        &output.bundles["edge"],
        output.agent_keys.get("edge"),
        &SopsWriter::new([7; 32], MODIFIED),
    )
    .expect_err("refused");
    assert!(matches!(err, FluxError::Sealed { .. }), "{err:?}");
}

/// A Secret with every kind of value sops encrypts (and a null, which it leaves).
fn every_kind_of_value() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop", "creationTimestamp": null},
        "stringData": {"password": "hunter2", "port": 5432, "ratio": 1.5, "enabled": true,
                       "list": ["a", 2], "empty": "", "nothing": null, "unicode": "päss\u{2028}"},
    })
}

#[test]
fn sops_writes_every_kind_of_value_and_flotilla_opens_it() {
    let document = every_kind_of_value();
    let agent = AgentKey::parse(&recipient()).expect("a key");
    let writer = SopsWriter::new([3; 32], MODIFIED);
    let text = writer
        .encrypt(&document, &agent, "v1/Secret/shop/db")
        .expect("written");
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(
        text,
        writer
            .encrypt(&document, &agent, "v1/Secret/shop/db")
            .expect("written")
    );
    let keys = DecryptionKeys::from_identity_file(AGENT).expect("a key");
    let opened = SopsDocument::parse(&text, false)
        .expect("parses")
        .expect("a sops document")
        .open(&keys)
        .expect("opens");
    assert_eq!(
        serde_json::from_str::<Value>(&opened).expect("JSON"),
        document
    );
    // Another seed, another data key: nothing repeats.
    let other = SopsWriter::new([4; 32], MODIFIED)
        .encrypt(&document, &agent, "v1/Secret/shop/db")
        .expect("written");
    let enc = |t: &str| yaml(t)["stringData"]["password"].clone();
    assert!(
        enc(&text)
            .as_str()
            .is_some_and(|e| e.starts_with("ENC[AES256_GCM,"))
    );
    assert_ne!(enc(&text), enc(&other));
}

#[test]
fn lastmodified_is_written_as_sops_writes_it() {
    for (seconds, text) in [
        (0, "1970-01-01T00:00:00Z"),
        (951_782_400, "2000-02-29T00:00:00Z"),
        (MODIFIED, "2024-02-29T12:34:56Z"),
        (4_102_444_799, "2099-12-31T23:59:59Z"),
    ] {
        assert_eq!(flotilla_render::sops::rfc3339_utc(seconds), text);
    }
}

/// Writes `text` to `dir/name` and decrypts it with the real `sops`, given its input
/// type, with the agent's identity.
fn sops_decrypt(
    tools: &flotilla_testkit::SopsTools,
    dir: &std::path::Path,
    name: &str,
    text: &str,
) -> Value {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writes");
    let keys = dir.join("agent.agekey");
    std::fs::write(&keys, format!("{AGENT}\n")).expect("writes");
    serde_json::from_str(&tools.decrypt(&path, &keys, "json")).expect("JSON")
}

#[test]
fn the_real_sops_decrypts_the_layers_secrets_as_yaml_and_as_json() {
    let Some(tools) = flotilla_testkit::SopsTools::find(
        "formats::the_real_sops_decrypts_the_layers_secrets_as_yaml_and_as_json",
    ) else {
        return;
    };
    let key = recipient();
    let output = rendered(&fleet(
        &[("edge", Some(&key))],
        &[("secret.yaml", SECRET), ("config.yaml", CONFIG)],
    ));
    let bundle = &output.bundles["edge"];
    let layer = flux::flux_layer(
        bundle,
        output.agent_keys.get("edge"),
        &SopsWriter::new([5; 32], MODIFIED),
    )
    .expect("a layer");
    let files = unpack(&layer);
    let (_, secret) = files
        .iter()
        .find(|(p, _)| p.contains("secret"))
        .expect("the Secret");
    let expected = bundle
        .resources
        .iter()
        .find(|r| r.key.kind() == "Secret")
        .expect("one")
        .value();
    let dir = tempfile::tempdir().expect("a folder");
    assert_eq!(
        sops_decrypt(&tools, dir.path(), "secret.yaml", secret),
        expected
    );
    // Flux's kustomize-controller decrypts a resource in its JSON form, keys sorted.
    let as_json = serde_json::to_string(&yaml(secret)).expect("JSON");
    assert_eq!(
        sops_decrypt(&tools, dir.path(), "secret.json", &as_json),
        expected
    );

    let document = every_kind_of_value();
    let agent = AgentKey::parse(&key).expect("a key");
    let text = SopsWriter::new([6; 32], MODIFIED)
        .encrypt(&document, &agent, "v1/Secret/shop/db")
        .expect("written");
    assert_eq!(
        sops_decrypt(&tools, dir.path(), "every.yaml", &text),
        document
    );
    let as_json = serde_json::to_string(&yaml(&text)).expect("JSON");
    assert_eq!(
        sops_decrypt(&tools, dir.path(), "every.json", &as_json),
        document
    );
}

/// The ManifestWork fields written, mirrored with unknown fields refused.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ManifestWork {
    api_version: String,
    kind: String,
    metadata: WorkMetadata,
    spec: WorkSpec,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct WorkMetadata {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct WorkSpec {
    workload: Workload,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Workload {
    manifests: Vec<Value>,
}

fn typed(works: &[Value]) -> Vec<ManifestWork> {
    works
        .iter()
        .map(|w| serde_json::from_value(w.clone()).expect("a ManifestWork as OCM defines it"))
        .collect()
}

/// Many ConfigMaps of about 1 KiB each, and the bundle of a cluster `edge`.
fn many_config_maps(count: usize) -> (RenderOutput, Vec<(String, String)>) {
    let manifests: Vec<(String, String)> = (0..count)
        .map(|i| {
            (
                format!("cm-{i:03}.yaml"),
                format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i:03}\ndata:\n  blob: {}\n",
                    "x".repeat(1000)
                ),
            )
        })
        .collect();
    let refs: Vec<(&str, &str)> = manifests
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    (rendered(&fleet(&[("edge", None)], &refs)), manifests)
}

#[test]
fn manifest_works_hold_the_bundle_in_order_in_the_clusters_namespace() {
    let output = rendered(&fleet(
        &[("edge", None)],
        &[("config.yaml", CONFIG), ("web.yaml", DEPLOYMENT)],
    ));
    let bundle = &output.bundles["edge"];
    let works = typed(
        &manifest_works(bundle, "main@sha1:abc", &ManifestWorkOptions::default()).expect("works"),
    );
    assert_eq!(works.len(), 1);
    let work = &works[0];
    assert_eq!(work.api_version, "work.open-cluster-management.io/v1");
    assert_eq!(work.kind, "ManifestWork");
    assert_eq!(work.metadata.name, "flotilla-edge-1");
    assert_eq!(work.metadata.namespace, "edge");
    assert_eq!(
        work.metadata.labels["app.kubernetes.io/managed-by"],
        "flotilla"
    );
    assert_eq!(
        work.metadata.annotations["flotilla.dev/digest"],
        bundle.digest.as_str()
    );
    assert_eq!(
        work.metadata.annotations["flotilla.dev/revision"],
        "main@sha1:abc"
    );
    assert_eq!(work.spec.workload.manifests, values(bundle));
}

#[test]
fn a_bundle_over_the_limit_is_split_in_order_and_each_work_keeps_to_it() {
    let (output, _) = many_config_maps(40);
    let bundle = &output.bundles["edge"];
    let options = ManifestWorkOptions {
        max_bytes: manifestwork::LEGACY_MAX_BYTES / 4,
        allow_plain_secrets: false,
    };
    let works = typed(&manifest_works(bundle, "r", &options).expect("works"));
    assert!(works.len() > 1, "{}", works.len());
    let names: Vec<String> = works.iter().map(|w| w.metadata.name.clone()).collect();
    let expected: Vec<String> = (1..=works.len())
        .map(|n| format!("flotilla-edge-{n}"))
        .collect();
    assert_eq!(names, expected);
    let sizes: BTreeMap<String, usize> = bundle
        .resources
        .iter()
        .map(|r| (r.key.name().to_string(), manifestwork::manifest_size(r)))
        .collect();
    for work in &works {
        let total: usize = work
            .spec
            .workload
            .manifests
            .iter()
            .map(|m| sizes[m["metadata"]["name"].as_str().expect("a name")])
            .sum();
        assert!(
            total <= options.max_bytes,
            "{} holds {total} bytes",
            work.metadata.name
        );
    }
    let all: Vec<Value> = works
        .into_iter()
        .flat_map(|w| w.spec.workload.manifests)
        .collect();
    assert_eq!(all, values(bundle));
    // The same bundle, the same works.
    assert_eq!(
        manifest_works(bundle, "r", &options),
        manifest_works(bundle, "r", &options)
    );
}

#[test]
fn a_resource_larger_than_the_limit_alone_is_an_error_naming_it() {
    let (output, _) = many_config_maps(3);
    let err = manifest_works(
        &output.bundles["edge"],
        "r",
        &ManifestWorkOptions {
            max_bytes: 500,
            allow_plain_secrets: false,
        },
    )
    .expect_err("refused");
    let ManifestWorkError::TooLarge { resource, max, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!((resource.as_str(), *max), ("ConfigMap shop/cm-000", 500));
    assert!(
        err.to_string()
            .contains("cluster edge: the resource ConfigMap shop/cm-000"),
        "{err}"
    );
}

#[test]
fn manifest_sizes_count_what_gos_encoder_escapes() {
    let output = rendered(&fleet(&[("edge", None)], &[("secret.yaml", SECRET)]));
    let secret = &output.bundles["edge"].resources[0];
    // `&`, `<` and `>` of "admin & <root>" are six bytes each in Go's JSON.
    assert_eq!(
        manifestwork::manifest_size(secret),
        secret.canonical.len() + 3 * 5 + manifestwork::FRAMING_BYTES
    );
}

#[test]
fn secrets_go_into_manifest_works_only_when_plain_secrets_are_allowed() {
    let output = rendered(&fleet(
        &[("edge", None)],
        &[("secret.yaml", SECRET), ("config.yaml", CONFIG)],
    ));
    let bundle = &output.bundles["edge"];
    let err = manifest_works(bundle, "r", &ManifestWorkOptions::default()).expect_err("refused");
    assert_eq!(
        err,
        ManifestWorkError::PlainSecrets {
            cluster: "edge".into(),
            secrets: vec!["Secret shop/db".into()]
        }
    );
    assert!(err.to_string().contains("--allow-plain-secrets"), "{err}");
    let allowed = ManifestWorkOptions {
        allow_plain_secrets: true,
        ..ManifestWorkOptions::default()
    };
    let works = typed(&manifest_works(bundle, "r", &allowed).expect("works"));
    assert_eq!(works[0].spec.workload.manifests, values(bundle));
}

#[test]
fn manifest_works_as_yaml_for_review() {
    let output = rendered(&fleet(
        &[("edge", None)],
        &[("config.yaml", CONFIG), ("web.yaml", DEPLOYMENT)],
    ));
    let options = ManifestWorkOptions {
        max_bytes: 400,
        allow_plain_secrets: false,
    };
    let works =
        manifest_works(&output.bundles["edge"], "main@sha1:0123abc", &options).expect("works");
    let text: String = works
        .iter()
        .map(|w| format!("---\n{}", serde_saphyr::to_string(w).expect("YAML")))
        .collect();
    insta::assert_snapshot!("manifestworks", text);
}

/// The layer built as Flux's kustomize-controller builds it: unpacked, a
/// `kustomization.yaml` naming every file (the one the controller generates), `kubectl
/// kustomize`, then each resource that has `sops` metadata turned into JSON through a
/// map, keys sorted (kustomize's `MarshalJSON`), and decrypted by the real `sops`.
#[test]
fn the_layer_builds_and_decrypts_as_fluxs_kustomize_controller_does() {
    let test = "formats::the_layer_builds_and_decrypts_as_fluxs_kustomize_controller_does";
    let Some(tools) = flotilla_testkit::SopsTools::find(test) else {
        return;
    };
    if !flotilla_testkit::can_run(
        test,
        flotilla_testkit::command_works("kubectl", &["version", "--client"]).err(),
    ) {
        return;
    }
    let key = recipient();
    let output = rendered(&fleet(
        &[("edge", Some(&key))],
        &[
            ("secret.yaml", SECRET),
            ("config.yaml", CONFIG),
            ("web.yaml", DEPLOYMENT),
        ],
    ));
    let bundle = &output.bundles["edge"];
    let layer = flux::flux_layer(
        bundle,
        output.agent_keys.get("edge"),
        &SopsWriter::new([8; 32], MODIFIED),
    )
    .expect("a layer");
    let dir = tempfile::tempdir().expect("a folder");
    let root = dir.path().join("artifact");
    std::fs::create_dir(&root).expect("a folder");
    let files = unpack(&layer);
    let mut kustomization = String::from(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
    );
    for (name, text) in &files {
        std::fs::write(root.join(name), text).expect("writes");
        kustomization.push_str(&format!("  - {name}\n"));
    }
    std::fs::write(root.join("kustomization.yaml"), kustomization).expect("writes");
    let built = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&root)
        .output()
        .expect("kubectl runs");
    assert!(
        built.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let text = String::from_utf8(built.stdout).expect("UTF-8");
    let mut resources: Vec<Value> = flotilla_render::yaml::parse_documents(&text)
        .unwrap_or_else(|err| panic!("kustomize's output is not YAML: {}\n{text}", err.message))
        .into_iter()
        .map(|d| d.value)
        .enumerate()
        .map(|(index, value)| {
            if value.get("sops").is_none() {
                return value;
            }
            let as_json = serde_json::to_string(&value).expect("JSON");
            sops_decrypt(&tools, dir.path(), &format!("{index}.json"), &as_json)
        })
        .collect();
    // kustomize orders resources its own way; compare as sets.
    let key_of = |v: &Value| serde_json::to_string(v).expect("JSON");
    let mut expected = values(bundle);
    resources.sort_by_key(key_of);
    expected.sort_by_key(key_of);
    assert_eq!(resources, expected);
}
