//! Properties of digests and canonical JSON (docs/api.md): a bundle's digest
//! depends on its content only, not on how the files are named, split or ordered,
//! not on the order of keys in the YAML, and not on the revision or commit; clusters
//! with the same content share a digest, and clusters with different content do not.
//! Canonical JSON parses back to the same value and re-canonicalises to the same
//! bytes, which is what lets an agent recompute a digest it was sent.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::process::Command;

use flotilla_core::bundle::to_canonical_vec;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::render;
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};

// ---------------------------------------------------------------------------
// A random fleet, and many ways of writing the same fleet down.

#[derive(Clone, Debug)]
struct Model {
    /// Cluster name → labels (region, tier).
    clusters: Vec<(String, BTreeMap<String, String>)>,
    /// Plain manifests of the one workload, each with a unique name.
    manifests: Vec<Value>,
    /// Workload variables read by the template.
    vars: Value,
}

/// How the same model is written as files.
#[derive(Clone, Debug)]
struct Layout {
    /// For each manifest: which file it goes into.
    file_of: Vec<usize>,
    /// The order manifests are written in (a permutation of their indices).
    order: Vec<usize>,
    /// File names (unique), with extension and perhaps a subfolder.
    names: Vec<String>,
    /// Seeds the order in which every mapping's keys are written.
    key_seed: u64,
    revision: String,
}

fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![Just("eu".to_string()), Just("us".to_string())]
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 ._:/é日-]{0,12}"
}

fn manifest(index: usize) -> impl Strategy<Value = Value> {
    let data = prop::collection::btree_map("[a-z][a-z0-9_]{0,6}", text(), 0..5);
    let number = prop_oneof![
        (0i64..10_000).prop_map(Value::from),
        (-1e6f64..1e6).prop_map(|f| Value::from((f * 1000.0).round() / 1000.0)),
    ];
    (data, number, any::<bool>(), 0..3u8).prop_map(move |(data, number, flag, kind)| {
        let name = format!("item-{index}");
        match kind {
            0 => json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "labels": {"app": "demo"}},
                "data": data,
            }),
            1 => json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": 1,
                    "paused": flag,
                    "template": {"spec": {"containers": [
                        {"name": "main", "image": "nginx:1.27", "args": data.keys().collect::<Vec<_>>()},
                    ]}},
                },
            }),
            _ => json!({
                "apiVersion": "example.com/v1",
                "kind": "Widget",
                "metadata": {"name": name, "annotations": data},
                "spec": {"weight": number, "enabled": flag, "nothing": null},
            }),
        }
    })
}

fn model() -> impl Strategy<Value = Model> {
    let clusters = prop::collection::vec((label_value(), any::<bool>()), 1..6).prop_map(|c| {
        c.into_iter()
            .enumerate()
            .map(|(i, (region, canary))| {
                let tier = if canary { "canary" } else { "stable" };
                (
                    format!("edge-{i}"),
                    BTreeMap::from([
                        ("region".to_string(), region),
                        ("tier".to_string(), tier.to_string()),
                    ]),
                )
            })
            .collect()
    });
    let manifests = (1..7usize).prop_flat_map(|n| (0..n).map(manifest).collect::<Vec<_>>());
    let vars = (0u32..100, text()).prop_map(|(n, s)| json!({"count": n, "motto": s}));
    (clusters, manifests, vars).prop_map(|(clusters, manifests, vars)| Model {
        clusters,
        manifests,
        vars,
    })
}

fn layout(manifests: usize) -> impl Strategy<Value = Layout> {
    let files = 1..=manifests.min(4);
    files
        .prop_flat_map(move |files| {
            (
                prop::collection::vec(0..files, manifests),
                Just((0..manifests).collect::<Vec<_>>()).prop_shuffle(),
                prop::collection::btree_set("[a-z]{1,6}", files),
                prop::collection::vec(prop_oneof![Just(""), Just("sub/"), Just("a/b/")], files),
                prop::collection::vec(prop_oneof![Just(".yaml"), Just(".yml")], files),
                any::<u64>(),
                "[a-z]{1,8}@sha1:[0-9a-f]{40}",
            )
        })
        .prop_map(
            |(file_of, order, stems, folders, extensions, key_seed, revision)| Layout {
                file_of,
                order,
                names: stems
                    .into_iter()
                    .zip(folders)
                    .zip(extensions)
                    .map(|((stem, folder), ext)| format!("{folder}{stem}{ext}"))
                    .collect(),
                key_seed,
                revision,
            },
        )
}

fn model_and_two_layouts() -> impl Strategy<Value = (Model, Layout, Layout)> {
    model().prop_flat_map(|model| {
        let n = model.manifests.len();
        (Just(model), layout(n), layout(n))
    })
}

/// Writes a value as block YAML, with every mapping's keys in an order chosen by
/// `seed` (strings and keys are written as JSON strings, which YAML reads alike).
fn yaml(value: &Value, seed: u64) -> String {
    let mut out = String::new();
    write_yaml(&mut out, value, seed, 0, "");
    out
}

fn key_rank(seed: u64, path: &str, key: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (seed, path, key).hash(&mut hasher);
    hasher.finish()
}

fn write_yaml(out: &mut String, value: &Value, seed: u64, indent: usize, path: &str) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by_key(|k| key_rank(seed, path, k));
            for key in keys {
                let child = &map[key];
                out.push_str(&format!("{pad}{}:", Value::from(key.as_str())));
                let child_path = format!("{path}/{key}");
                if is_block(child) {
                    out.push('\n');
                    write_yaml(out, child, seed, indent + 2, &child_path);
                } else {
                    out.push_str(&format!(" {}\n", scalar(child)));
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (index, item) in items.iter().enumerate() {
                out.push_str(&format!("{pad}-"));
                if is_block(item) {
                    out.push('\n');
                    write_yaml(out, item, seed, indent + 2, &format!("{path}/{index}"));
                } else {
                    out.push_str(&format!(" {}\n", scalar(item)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

fn is_block(value: &Value) -> bool {
    match value {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Object(_) => "{}".into(),
        Value::Array(_) => "[]".into(),
        other => other.to_string(),
    }
}

const TEMPLATE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-template\ndata:\n  region: \"{{ cluster.labels.region }}\"\n  count: \"{{ vars.count }}\"\n  motto: \"{{ vars.motto }}\"\n";

/// The files of the model in the given layout.
fn snapshot(model: &Model, layout: &Layout) -> FleetSnapshot {
    let seed = layout.key_seed;
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for (name, labels) in &model.clusters {
        let doc = json!({
            "apiVersion": "flotilla.dev/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name, "labels": labels},
            "spec": {"vars": {"unused": name}},
        });
        files.insert(format!("clusters/{name}.yaml"), yaml(&doc, seed));
    }
    // The canary group sets a count no workload default has (those are below 100),
    // so the tier always shows in the rendered ConfigMap.
    let group = json!({
        "apiVersion": "flotilla.dev/v1alpha1",
        "kind": "Group",
        "metadata": {"name": "canary"},
        "spec": {"selector": {"matchLabels": {"tier": "canary"}}, "vars": {"count": 1000}},
    });
    files.insert("groups/canary.yaml".into(), yaml(&group, seed));
    let workload = json!({
        "apiVersion": "flotilla.dev/v1alpha1",
        "kind": "Workload",
        "metadata": {"name": "demo"},
        "spec": {
            "namespace": "demo",
            "targets": [{"clusterSelector": {}}],
            "vars": model.vars,
        },
    });
    files.insert("workloads/demo/workload.yaml".into(), yaml(&workload, seed));
    let overlay = json!({
        "apiVersion": "flotilla.dev/v1alpha1",
        "kind": "Overlay",
        "metadata": {"name": "eu"},
        "spec": {
            "clusterSelector": {"matchExpressions": [{"key": "region", "operator": "In", "values": ["eu"]}]},
            "labels": {"region": "eu"},
            "images": [{"name": "nginx", "newName": "mirror.eu/nginx"}],
        },
    });
    files.insert("overlays/eu.yaml".into(), yaml(&overlay, seed));
    files.insert(
        "workloads/demo/manifests/config.yaml.j2".into(),
        TEMPLATE.into(),
    );
    let mut manifest_files: Vec<String> = vec![String::new(); layout.names.len()];
    for &index in &layout.order {
        let file = &mut manifest_files[layout.file_of[index]];
        file.push_str("---\n");
        file.push_str(&yaml(&model.manifests[index], seed));
    }
    for (name, text) in layout.names.iter().zip(manifest_files) {
        files.insert(format!("workloads/demo/manifests/{name}"), text);
    }
    let mut snapshot =
        FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    snapshot.revision = layout.revision.clone();
    snapshot
}

fn digests(snapshot: &FleetSnapshot) -> BTreeMap<String, String> {
    let output = render(snapshot);
    assert!(
        output.is_clean(),
        "the generated fleet renders: {:#?}",
        output.diagnostics
    );
    output
        .bundles
        .iter()
        .map(|(cluster, bundle)| (cluster.clone(), bundle.digest.to_string()))
        .collect()
}

/// 64 cases by default to keep the suite fast; `PROPTEST_CASES=5000` searches harder.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 64;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    /// File names, how manifests are split into files, their order, the order of
    /// keys in every mapping and the revision change nothing.
    #[test]
    fn digest_ignores_layout_key_order_and_revision(
        (model, first, second) in model_and_two_layouts()
    ) {
        let a = digests(&snapshot(&model, &first));
        let b = digests(&snapshot(&model, &second));
        prop_assert_eq!(a.len(), model.clusters.len());
        prop_assert_eq!(a, b);
    }

    /// Clusters with the same labels receive the same content (nothing in the fleet
    /// reads the cluster's name), so they share a digest; clusters whose region
    /// differs receive a different ConfigMap, so their digests differ.
    #[test]
    fn same_content_same_digest_different_content_different_digest(
        (model, layout) in model().prop_flat_map(|m| {
            let n = m.manifests.len();
            (Just(m), layout(n))
        })
    ) {
        let digests = digests(&snapshot(&model, &layout));
        for (name_a, labels_a) in &model.clusters {
            for (name_b, labels_b) in &model.clusters {
                let same = digests[name_a] == digests[name_b];
                prop_assert_eq!(
                    same,
                    labels_a == labels_b,
                    "{} {:?} and {} {:?}",
                    name_a, labels_a, name_b, labels_b
                );
            }
        }
    }
}

/// The same fleet on two commits (different messages, authors, times, and a change
/// outside the fleet root) renders the same digests under different revisions; a
/// change to one cluster changes that cluster's digest only.
#[test]
fn digest_ignores_the_commit() {
    let repo = tempfile::tempdir().expect("temp dir");
    let model = Model {
        clusters: vec![
            (
                "edge-0".into(),
                BTreeMap::from([
                    ("region".into(), "eu".into()),
                    ("tier".into(), "stable".into()),
                ]),
            ),
            (
                "edge-1".into(),
                BTreeMap::from([
                    ("region".into(), "us".into()),
                    ("tier".into(), "canary".into()),
                ]),
            ),
        ],
        manifests: vec![json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a"}, "data": {"k": "v"}
        })],
        vars: json!({"count": 3, "motto": "hello"}),
    };
    let layout = Layout {
        file_of: vec![0],
        order: vec![0],
        names: vec!["all.yaml".into()],
        key_seed: 7,
        revision: String::new(),
    };
    let write = |snapshot: &FleetSnapshot| {
        for (path, text) in &snapshot.files {
            let full = repo.path().join("fleet").join(path);
            std::fs::create_dir_all(full.parent().expect("has a folder")).expect("mkdir");
            std::fs::write(full, &**text).expect("write");
        }
    };
    write(&snapshot(&model, &layout));
    if !git(repo.path(), &["init", "-q", "-b", "main"]) {
        eprintln!("skipping: the git command is not available");
        return;
    }
    assert!(commit(repo.path(), "first", "2020-01-01T00:00:00Z"));
    let first = read_head(repo.path());

    std::fs::write(repo.path().join("README.md"), "notes\n").expect("write");
    assert!(commit(repo.path(), "second", "2024-06-01T12:00:00Z"));
    let second = read_head(repo.path());
    assert_ne!(first.revision, second.revision);
    assert_eq!(digests(&first), digests(&second));

    let mut changed = model.clone();
    changed.clusters[1].1.insert("region".into(), "eu".into());
    write(&snapshot(&changed, &layout));
    assert!(commit(repo.path(), "third", "2024-06-02T12:00:00Z"));
    let third = read_head(repo.path());
    let (before, after) = (digests(&second), digests(&third));
    assert_eq!(before["edge-0"], after["edge-0"]);
    assert_ne!(before["edge-1"], after["edge-1"]);
}

fn read_head(repo: &Path) -> FleetSnapshot {
    flotilla_hub::source::read(&flotilla_hub::source::Location {
        repo: repo.to_path_buf(),
        rev: None,
        path: "fleet".into(),
        worktree: false,
    })
    .expect("the commit is readable")
}

fn git(dir: &Path, args: &[&str]) -> bool {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_SYSTEM", "/dev/null")
        .status()
        .is_ok_and(|s| s.success())
}

fn commit(dir: &Path, message: &str, date: &str) -> bool {
    let status = Command::new("git")
        .args(["add", "-A"])
        .current_dir(dir)
        .status()
        .is_ok_and(|s| s.success());
    status
        && Command::new("git")
            .args(["commit", "-q", "-m", message])
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_SYSTEM", "/dev/null")
            .env("GIT_AUTHOR_NAME", message)
            .env("GIT_AUTHOR_EMAIL", "a@flotilla.invalid")
            .env("GIT_COMMITTER_NAME", message)
            .env("GIT_COMMITTER_EMAIL", "c@flotilla.invalid")
            .env("GIT_AUTHOR_DATE", date)
            .env("GIT_COMMITTER_DATE", date)
            .status()
            .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------------------
// Canonical JSON.

/// Any JSON value: integers in and beyond the exactly representable range, finite
/// floats of every magnitude, strings with control characters, quotes, backslashes
/// and characters outside the Basic Multilingual Plane, and nested containers.
fn any_json(float: BoxedStrategy<f64>, big_integers: bool) -> impl Strategy<Value = Value> {
    let limit = 1i64 << 53;
    let integer = if big_integers {
        prop_oneof![
            (-limit..=limit).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from)
        ]
        .boxed()
    } else {
        (-limit..=limit).prop_map(Value::from).boxed()
    };
    let string = prop_oneof![
        any::<String>(),
        "[\\x00-\\x1f\"\\\\/a\u{7f}\u{2028}\u{e000}\u{1f600}]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        integer,
        float.prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        string.prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop_oneof![any::<String>(), "[a-z\u{e000}\u{1f600}\u{ff61}]{0,3}"],
                    inner
                ),
                0..6
            )
            .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Finite floats that canonical JSON writes with a fraction or an exponent, so they
/// read back as floats (an integral float such as 2.0 is written `2` and reads back
/// as the integer 2, which is the same JSON number but a different serde value).
fn fractional_float() -> BoxedStrategy<f64> {
    any::<f64>()
        .prop_filter("finite, not written as an integer", |f| {
            f.is_finite() && !(f.fract() == 0.0 && f.abs() < 1e21)
        })
        .boxed()
}

fn finite_float() -> BoxedStrategy<f64> {
    any::<f64>()
        .prop_filter("finite", |f| f.is_finite())
        .boxed()
}

proptest! {
    #![proptest_config(config())]

    /// Canonical bytes parse back to the value they came from.
    #[test]
    fn canonical_json_parses_back_to_the_same_value(value in any_json(fractional_float(), false)) {
        let bytes = to_canonical_vec(&value);
        let parsed: Value = serde_json::from_slice(&bytes).expect("canonical JSON is JSON");
        prop_assert_eq!(parsed, value, "{}", String::from_utf8_lossy(&bytes));
    }

    /// Canonicalising what was parsed from canonical bytes gives the same bytes, for
    /// every value: this is what an agent does to check a digest.
    #[test]
    fn canonical_json_is_a_fixed_point(value in any_json(finite_float(), true)) {
        let bytes = to_canonical_vec(&value);
        let parsed: Value = serde_json::from_slice(&bytes).expect("canonical JSON is JSON");
        let again = to_canonical_vec(&parsed);
        prop_assert_eq!(
            String::from_utf8_lossy(&again),
            String::from_utf8_lossy(&bytes)
        );
    }

    /// Canonical JSON has sorted keys and no insignificant whitespace, whatever order
    /// the keys were inserted in.
    #[test]
    fn canonical_json_does_not_depend_on_insertion_order(
        entries in prop::collection::vec(("[a-z]{0,4}", any::<i32>()), 0..10)
    ) {
        let forward: Map<String, Value> =
            entries.iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect();
        let backward: Map<String, Value> =
            entries.iter().rev().map(|(k, v)| (k.clone(), Value::from(*v))).collect();
        // Later duplicates win in `forward`, earlier ones in `backward`.
        let unique: BTreeSet<&String> = entries.iter().map(|(k, _)| k).collect();
        prop_assume!(unique.len() == entries.len());
        let bytes = to_canonical_vec(&Value::Object(forward));
        prop_assert_eq!(&bytes, &to_canonical_vec(&Value::Object(backward)));
        let text = String::from_utf8(bytes).expect("UTF-8");
        prop_assert!(!text.contains(' ') && !text.contains('\n'));
    }
}

/// What the round trip means for an agent: a bundle whose manifests hold floats that
/// need all 17 significant digits still verifies after it is parsed back.
#[test]
fn a_bundle_with_awkward_floats_verifies() {
    let manifest = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  weights: [2.090563054808148e-168, -1.0549331774987735e-33, -2.6522472590810258e+278, 0.1, 1e21]\n";
    let snapshot = FleetSnapshot::from_files([
        (
            "clusters/edge-1.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: edge-1\n",
        ),
        (
            "workloads/w/workload.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: w\n  targets:\n    - cluster: edge-1\n",
        ),
        ("workloads/w/manifests/widget.yaml", manifest),
    ]);
    let output = render(&snapshot);
    assert!(output.is_clean(), "{:?}", output.diagnostics);
    let bundle = &output.bundles["edge-1"];
    let document = bundle.document("main@sha1:0");
    let verified = flotilla_core::bundle::verify_document(&document, Some("edge-1"))
        .unwrap_or_else(|err| panic!("the agent would refuse this bundle: {err}"));
    assert_eq!(verified.digest, bundle.digest);
}
