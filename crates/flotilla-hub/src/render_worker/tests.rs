//! The render process's protocol and loop, end to end on buffers and pipes.

use std::collections::HashSet;
use std::io;
use std::sync::Arc;

use flotilla_core::bundle::{Bundle, Resource};
use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::RenderOutput;

use flotilla_render::sops::DecryptionKeys;

use super::codec::{
    Known, RenderSettings, Since, decode_input, decode_output, encode_input, encode_output,
};

/// An age identity (made for this test) the codec carries to the render process.
const IDENTITY: &str = "AGE-SECRET-KEY-1SH36876FLEVRV2C9YN2PNR3JJQV0Z9TLDNL49D4QPZRD22V3EENQ55K5JP";
use super::run_worker;
use super::supervisor::{data_size, drain_output, feed_input, vm_data};

fn example() -> (FleetSnapshot, RenderOutput) {
    let root = flotilla_testkit::workspace_root().join("fleet-example");
    let snapshot = crate::source::from_folder(&root, "").expect("fleet-example reads");
    let rendered = flotilla_render::render(&snapshot);
    assert!(rendered.is_clean(), "{:?}", rendered.diagnostics);
    (snapshot, rendered)
}

fn distinct(output: &RenderOutput) -> usize {
    let pointers: HashSet<*const Resource> = output
        .bundles
        .values()
        .flat_map(|b| b.resources.iter().map(Arc::as_ptr))
        .collect();
    pointers.len()
}

#[test]
fn a_clusters_warnings_and_its_releases_warnings_come_back_as_they_were() {
    let (_, mut rendered) = example();
    let names: Vec<String> = rendered.provenance.clusters.keys().cloned().collect();
    let warning = |text: &str| {
        Diagnostic::warning(text.to_string())
            .in_file("charts/web/templates/cm.yaml")
            .for_workload("web")
    };
    let shared: flotilla_render::ReleaseWarnings =
        Arc::from([(0, warning("helm: one")), (2, warning("lookup: two"))]);
    for (i, name) in names.iter().enumerate() {
        let found = rendered.provenance.clusters.get_mut(name).expect("kept");
        found.release_warnings = if i == 0 {
            Arc::from([(1, warning("its own"))])
        } else {
            Arc::clone(&shared)
        };
        found.warnings = Arc::from([warning("a cluster's")]);
    }
    let mut bytes = Vec::new();
    encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
    let back = decode_output(bytes.as_slice(), None).expect("decodes");
    assert!(names.len() > 1);
    assert_eq!(back.provenance, rendered.provenance);
}

#[test]
fn a_render_comes_back_whole_with_its_resources_still_shared() {
    let (_, rendered) = example();
    let mut bytes = Vec::new();
    encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
    let back = decode_output(bytes.as_slice(), None).expect("decodes");
    assert_eq!(back.revision, rendered.revision);
    assert_eq!(back.diagnostics, rendered.diagnostics);
    assert_eq!(back.memberships, rendered.memberships);
    assert_eq!(back.labels, rendered.labels);
    assert_eq!(back.rollouts, rendered.rollouts);
    assert!(!rendered.provenance.inputs.is_empty());
    assert_eq!(back.provenance, rendered.provenance);
    assert_eq!(
        back.bundles.keys().collect::<Vec<_>>(),
        rendered.bundles.keys().collect::<Vec<_>>()
    );
    for (cluster, bundle) in &rendered.bundles {
        let other = &back.bundles[cluster];
        assert_eq!(other.cluster, bundle.cluster);
        assert_eq!(other.digest, bundle.digest);
        assert_eq!(other.resources, bundle.resources, "{cluster}");
        assert_eq!(other.meta, bundle.meta, "{cluster}");
        // The digest sent is the digest of the resources (and metadata) sent.
        let again = Bundle::from_sorted_with_meta(
            cluster.clone(),
            other.resources.clone(),
            other.meta.as_deref().cloned(),
        );
        assert_eq!(again.digest, bundle.digest, "{cluster}");
    }
    // Resources shared between clusters in the render are shared after it.
    assert!(distinct(&rendered) < rendered.bundles.values().map(|b| b.resources.len()).sum());
    assert_eq!(distinct(&back), distinct(&rendered));
}

#[test]
fn each_clusters_warnings_come_back_with_its_provenance() {
    let header = "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name:";
    let mut files: Vec<(String, String)> = ["a", "b", "c"]
        .iter()
        .map(|name| {
            (
                format!("clusters/{name}.yaml"),
                format!(
                    "{header} {name}\n  labels: {{secret: \"{}\"}}\n",
                    *name != "c"
                ),
            )
        })
        .collect();
    files.push((
        "workloads/db/workload.yaml".into(),
        "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: db\nspec:\n  namespace: db\n  targets:\n    - clusterSelector: {matchLabels: {secret: \"true\"}}\n".into(),
    ));
    files.push((
        "workloads/db/manifests/secret.yaml".into(),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2\n"
            .into(),
    ));
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let rendered = flotilla_render::render(&snapshot);
    assert!(rendered.is_clean(), "{:?}", rendered.diagnostics);
    // A warning of a and b (a Secret and no agent key), none of c.
    let warned =
        |output: &RenderOutput, name: &str| output.provenance.clusters[name].warnings.len();
    assert_eq!(
        ["a", "b", "c"].map(|name| warned(&rendered, name)),
        [1, 1, 0]
    );
    let mut bytes = Vec::new();
    encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
    let back = decode_output(bytes.as_slice(), None).expect("decodes");
    assert_eq!(back.provenance, rendered.provenance);
    assert_eq!(back.diagnostics, rendered.diagnostics);
}

#[test]
fn each_clusters_agent_key_comes_back() {
    let recipient = DecryptionKeys::from_identity_file(IDENTITY)
        .expect("an identity")
        .recipients()
        .remove(0);
    let header = "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name:";
    let files = [
        (
            "clusters/keyed.yaml".to_string(),
            format!("{header} keyed\nspec:\n  agentKey: {recipient}\n"),
        ),
        (
            "clusters/plain.yaml".to_string(),
            format!("{header} plain\n"),
        ),
    ];
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let rendered = flotilla_render::render(&snapshot);
    assert!(rendered.is_clean(), "{:?}", rendered.diagnostics);
    assert_eq!(
        rendered
            .agent_keys
            .iter()
            .map(|(c, k)| (c.as_str(), k.to_string()))
            .collect::<Vec<_>>(),
        [("keyed", recipient)]
    );
    let mut bytes = Vec::new();
    encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
    let back = decode_output(bytes.as_slice(), None).expect("decodes");
    assert_eq!(back.agent_keys, rendered.agent_keys);
}

#[test]
fn a_snapshot_goes_over_whole_and_paths_to_one_content_share_it() {
    let (mut snapshot, _) = example();
    let shared: Arc<str> = Arc::from("# the same content at two paths\n");
    snapshot.files.insert("a/one.txt".into(), shared.clone());
    snapshot.files.insert("b/two.txt".into(), shared);
    snapshot
        .problems
        .push(Diagnostic::error("a problem").in_file("x.yaml"));
    snapshot.skipped.insert("bin.dat".into(), "binary".into());
    snapshot.incomplete = true;
    snapshot.binaries.insert(
        "charts/web-1.0.0.tgz".into(),
        Arc::from(&[0x1f, 0x8b, 0, 255][..]),
    );
    let limits = Limits {
        template_fuel: 7,
        ..Limits::default()
    };
    let mut bytes = Vec::new();
    encode_input(
        &snapshot,
        Since::Nothing,
        &RenderSettings {
            limits: limits.clone(),
            helm_seed: Some([9; 32]),
            decryption: Arc::new(
                DecryptionKeys::from_identity_file(IDENTITY).expect("an identity"),
            ),
        },
        &mut bytes,
    )
    .expect("encodes");
    let (back_limits, back, previous) = decode_input(bytes.as_slice()).expect("decodes");
    assert_eq!(back_limits.helm_seed, Some([9; 32]));
    assert_eq!(back_limits.decryption.identity_lines(), [IDENTITY]);
    let back_limits = back_limits.limits;
    assert!(matches!(previous, Since::Nothing));
    assert_eq!(back_limits, limits);
    assert_eq!(back.files, snapshot.files);
    assert_eq!(back.revision, snapshot.revision);
    assert_eq!(back.problems, snapshot.problems);
    assert_eq!(back.skipped, snapshot.skipped);
    assert!(back.incomplete);
    assert_eq!(back.binaries, snapshot.binaries);
    assert!(Arc::ptr_eq(
        &back.files["a/one.txt"],
        &back.files["b/two.txt"]
    ));
    assert!(decode_input(&bytes[..bytes.len() - 1]).is_err());
    // What follows a request is the next one: a worker refuses what is not.
    bytes.push(0);
    let mut out = Vec::new();
    assert!(run_worker(None, None, bytes.as_slice(), &mut out).is_err());
}

#[test]
fn a_damaged_answer_is_an_error_not_a_panic() {
    let (_, rendered) = example();
    let mut bytes = Vec::new();
    encode_output(&rendered, Known::Nothing, &mut bytes).expect("encodes");
    for cut in [0, 7, 8, 100, bytes.len() / 2, bytes.len() - 1] {
        assert!(decode_output(&bytes[..cut], None).is_err(), "cut at {cut}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    let err = decode_output(longer.as_slice(), None).expect_err("trailing");
    assert_eq!(err.to_string(), "trailing bytes");
    let mut huge = bytes;
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(decode_output(huge.as_slice(), None).is_err());
}

#[test]
fn the_worker_renders_what_the_hub_would() {
    let (snapshot, rendered) = example();
    let mut input = Vec::new();
    encode_input(
        &snapshot,
        Since::Nothing,
        &RenderSettings::plain(Limits::default()),
        &mut input,
    )
    .expect("encodes");
    let mut out = Vec::new();
    // No memory limit here: this is the test process itself.
    run_worker(None, None, input.as_slice(), &mut out).expect("renders");
    // First the (empty) request for previous bundles, then the render.
    let (ask, asked) = std::sync::mpsc::channel();
    let back = drain_output(out.as_slice(), None, &ask).expect("decodes");
    assert_eq!(asked.recv().ok(), Some(Vec::new()));
    assert_eq!(digests(&back), digests(&rendered));
    assert_eq!(back.diagnostics, rendered.diagnostics);
    assert_eq!(back.provenance, rendered.provenance);
}

fn digests(output: &RenderOutput) -> Vec<(String, String)> {
    output
        .bundles
        .iter()
        .map(|(c, b)| (c.clone(), b.digest.to_string()))
        .collect()
}

/// An answer that says "the same" is read only against the render it was written
/// for: without it, or against one that lacks the bundle, it is an error.
#[test]
fn the_same_is_read_only_against_what_the_hub_has() {
    let (_, rendered) = example();
    let mut bytes = Vec::new();
    encode_output(&rendered, Known::Render(&rendered), &mut bytes).expect("encodes");
    let back = decode_output(bytes.as_slice(), Some(&rendered)).expect("decodes");
    assert_eq!(digests(&back), digests(&rendered));
    assert!(decode_output(bytes.as_slice(), None).is_err());
    let mut lacking = RenderOutput {
        bundles: rendered.bundles.clone(),
        provenance: rendered.provenance.clone(),
        ..RenderOutput::default()
    };
    lacking.bundles.remove("blue");
    assert!(decode_output(bytes.as_slice(), Some(&lacking)).is_err());
    let mut other = RenderOutput {
        bundles: lacking.bundles.clone(),
        provenance: rendered.provenance.clone(),
        ..RenderOutput::default()
    };
    let mut blue = rendered.bundles["blue"].clone();
    blue.resources.pop();
    blue = Bundle::from_sorted("blue", blue.resources);
    other.bundles.insert("blue".into(), blue);
    assert!(decode_output(bytes.as_slice(), Some(&other)).is_err());
}

/// The worker and the hub's side of the protocol on two pipes, as `render` runs
/// them: the render, and the clusters the worker asked the previous bundles of.
fn render_through_pipes(
    snapshot: &FleetSnapshot,
    before: &RenderOutput,
) -> (RenderOutput, Vec<String>) {
    let (child_in, hub_out) = io::pipe().expect("pipe");
    let (hub_in, child_out) = io::pipe().expect("pipe");
    let (ask, forward) = std::sync::mpsc::channel::<Vec<String>>();
    let (pass, asked) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        scope.spawn(move || run_worker(None, None, child_in, child_out).expect("renders"));
        let feed = scope.spawn(move || {
            let _ = feed_input(
                snapshot,
                Some(before),
                false,
                &RenderSettings::plain(Limits::default()),
                hub_out,
                &asked,
            );
        });
        let seen = scope.spawn(move || {
            let names = forward.recv().expect("a request");
            pass.send(names.clone()).expect("passed on");
            names
        });
        let back = drain_output(hub_in, Some(before), &ask).expect("decodes");
        feed.join().expect("fed");
        (back, seen.join().expect("seen"))
    })
}

/// Given the previous render, the worker renders what changed since and answers
/// what a full render gives; it asks for the previous bundles only of the
/// clusters it renders in part, and leaves out of its answer what the hub has.
#[test]
fn the_worker_renders_since_the_previous_render() {
    let (base, before) = example();
    let edits = [
        (
            "clusters/store-us-001.yaml",
            "siteId: ",
            "siteId: x",
            vec![],
        ),
        (
            "workloads/kuard/manifests/deployment.yaml",
            "replicas: 1",
            "replicas: 3",
            vec!["blue", "red"],
        ),
        // Its groups, labels and rollout wave change.
        (
            "clusters/store-us-001.yaml",
            "tier: canary",
            "tier: stable",
            vec![],
        ),
        // Removed (nothing to replace).
        ("clusters/store-eu-002.yaml", "", "", vec![]),
    ];
    for (path, from, to, expect_asked) in edits {
        let mut snapshot = base.clone();
        if from.is_empty() {
            snapshot.files.remove(path).expect("a file of the fleet");
        } else {
            let text = snapshot.files[path].replacen(from, to, 1);
            assert_ne!(&*snapshot.files[path], text.as_str());
            snapshot.files.insert(path.into(), Arc::from(text));
        }
        let full = flotilla_render::render(&snapshot);
        assert!(full.is_clean(), "{:?}", full.diagnostics);
        assert_ne!(digests(&full), digests(&before));

        // What goes in: the previous render's digests and provenance only.
        let mut input = Vec::new();
        encode_input(
            &snapshot,
            Since::Given(&before),
            &RenderSettings::plain(Limits::default()),
            &mut input,
        )
        .expect("encodes");
        let (_, _, previous) = decode_input(input.as_slice()).expect("decodes");
        let Since::Given(previous) = previous else {
            panic!("sent");
        };
        assert_eq!(previous.provenance, before.provenance);
        assert!(previous.bundles.values().all(|b| b.resources.is_empty()));
        assert!(previous.memberships.is_empty() && previous.labels.is_empty());

        let (back, asked) = render_through_pipes(&snapshot, &before);
        assert_eq!(asked, expect_asked, "{path}");
        assert_eq!(digests(&back), digests(&full), "{path}");
        assert_eq!(back.diagnostics, full.diagnostics);
        assert_eq!(back.provenance, full.provenance);
        // Written as changes against what the hub has, read back whole.
        assert_eq!(back.memberships, full.memberships, "{path}");
        assert_eq!(back.labels, full.labels, "{path}");
        assert_eq!(back.rollouts, full.rollouts, "{path}");
        for (cluster, bundle) in &back.bundles {
            assert_eq!(
                bundle.resources, full.bundles[cluster].resources,
                "{cluster}"
            );
        }
        // The bundles that did not change are the hub's own, not copies.
        assert!(Arc::ptr_eq(
            &back.bundles["plant-eu-01"].resources[0],
            &before.bundles["plant-eu-01"].resources[0]
        ));
    }
}

#[test]
fn a_data_segment_is_read_from_proc() {
    let status = "Name:\tflotilla\nVmPeak:\t  900 kB\nVmData:\t  123456 kB\nVmStk:\t 132 kB\n";
    assert_eq!(vm_data(status), Some(123_456 * 1024));
    assert_eq!(vm_data("Name:\tx\n"), None);
    // This process's own, as the hub reads its render process's.
    assert!(data_size(std::process::id()).is_some_and(|size| size > 0));
}

/// One worker renders request after request on the same pipes: since nothing,
/// since the render it keeps (not sent again), since one the hub sends; each
/// answer what a full render gives.
#[test]
fn a_worker_renders_request_after_request_since_what_it_keeps() {
    let (base, _) = example();
    let edit = |path: &str, from: &str, to: &str| {
        let mut snapshot = base.clone();
        let text = snapshot.files[path].replacen(from, to, 1);
        assert_ne!(&*snapshot.files[path], text.as_str());
        snapshot.files.insert(path.into(), Arc::from(text));
        snapshot
    };
    let commits = [
        base.clone(),
        edit("clusters/store-us-001.yaml", "siteId: ", "siteId: x"),
        edit(
            "workloads/kuard/manifests/deployment.yaml",
            "replicas: 1",
            "replicas: 3",
        ),
        edit("clusters/store-us-001.yaml", "tier: canary", "tier: stable"),
    ];
    let (child_in, mut hub_out) = io::pipe().expect("pipe");
    let (hub_in, child_out) = io::pipe().expect("pipe");
    let worker = std::thread::spawn(move || run_worker(None, None, child_in, child_out));
    let mut hub_in = io::BufReader::new(hub_in);
    let mut previous: Option<RenderOutput> = None;
    // Nothing, then the kept render twice, then one sent (as after a render the
    // process answered but the hub did not keep).
    for (step, (snapshot, since_kept)) in commits.iter().zip([false, true, true, false]).enumerate()
    {
        let (ask, asked) = std::sync::mpsc::channel();
        let back = std::thread::scope(|scope| {
            let (hub_out, previous) = (&mut hub_out, &previous);
            let feed = scope.spawn(move || {
                let previous = previous.as_ref();
                feed_input(
                    snapshot,
                    previous,
                    since_kept,
                    &RenderSettings::plain(Limits::default()),
                    hub_out,
                    &asked,
                )
            });
            let back = drain_output(&mut hub_in, previous.as_ref(), &ask).expect("decodes");
            drop(ask);
            feed.join().expect("fed").expect("written");
            back
        });
        let full = flotilla_render::render(snapshot);
        assert!(full.is_clean(), "{:?}", full.diagnostics);
        assert_eq!(digests(&back), digests(&full), "step {step}");
        assert_eq!(back.diagnostics, full.diagnostics);
        assert_eq!(back.provenance, full.provenance);
        assert_eq!(back.memberships, full.memberships);
        assert_eq!(back.labels, full.labels);
        for (cluster, bundle) in &back.bundles {
            assert_eq!(bundle.resources, full.bundles[cluster].resources);
        }
        previous = Some(back);
    }
    drop(hub_out);
    worker
        .join()
        .expect("the worker")
        .expect("ends at the end of its input");
}

/// The files of small fleets, each path with the texts it may have (`None`:
/// absent): clusters and groups in two spellings (so duplicates happen),
/// broken files, group selectors on either label, a workload on every cluster
/// or on one group, an overlay by group or by cluster names.
fn small_fleets() -> Vec<(String, Vec<Option<String>>)> {
    const HEAD: &str = "apiVersion: flotilla.dev/v1alpha1\n";
    let mut paths = Vec::new();
    for i in 0..4 {
        for ext in ["yaml", "yml"] {
            let mut texts = vec![None, Some("not: [valid\n".to_string())];
            for region in 0..3 {
                for tier in ["canary", "stable"] {
                    texts.push(Some(format!(
                        "{HEAD}kind: Cluster\nmetadata:\n  name: c{i}\n  labels:\n    \
                         region: r{region}\n    tier: {tier}\nspec: {{}}\n"
                    )));
                }
            }
            paths.push((format!("clusters/c{i}.{ext}"), texts));
        }
    }
    for name in ["ga", "gb", "gc"] {
        for ext in ["yaml", "yml"] {
            let mut texts = vec![None, Some("broken: [\n".to_string())];
            for (key, value) in [("region", "r0"), ("region", "r1"), ("tier", "canary")] {
                texts.push(Some(format!(
                    "{HEAD}kind: Group\nmetadata:\n  name: {name}\nspec:\n  selector:\n    \
                     matchLabels:\n      {key}: {value}\n"
                )));
            }
            paths.push((format!("groups/{name}.{ext}"), texts));
        }
    }
    let workload = |target: &str| {
        format!(
            "{HEAD}kind: Workload\nmetadata:\n  name: w\nspec:\n  namespace: w\n  \
             targets:\n    - {target}\n"
        )
    };
    paths.push((
        "workloads/w/workload.yaml".into(),
        vec![
            None,
            Some(workload("clusterSelector: {}")),
            Some(workload("group: ga")),
        ],
    ));
    paths.push((
        "workloads/w/manifests/cm.yaml".into(),
        vec![Some(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  a: b\n".into(),
        )],
    ));
    let overlay = |selects: &str| {
        format!(
            "{HEAD}kind: Overlay\nmetadata:\n  name: o\nspec:\n  {selects}\n  patches:\n    \
             - target: {{kind: ConfigMap}}\n      merge: {{metadata: {{labels: {{x: y}}}}}}\n"
        )
    };
    paths.push((
        "overlays/o.yaml".into(),
        vec![
            None,
            Some(overlay("groups: [gb]")),
            Some(overlay("clusters: [c1, c2]")),
        ],
    ));
    paths
}

/// The clusters whose memberships changed from `before` to `after` while no
/// cluster file did: changed by the groups alone.
fn changed_by_groups_alone(
    (first, before): (&FleetSnapshot, &RenderOutput),
    (second, after): (&FleetSnapshot, &RenderOutput),
) -> usize {
    let clusters = |snapshot: &FleetSnapshot| {
        snapshot
            .files
            .iter()
            .filter(|(p, _)| p.starts_with("clusters/"))
            .map(|(p, t)| (p.clone(), t.clone()))
            .collect::<Vec<_>>()
    };
    let same_cluster_files = clusters(first) == clusters(second);
    after
        .memberships
        .iter()
        .filter(|(name, groups)| {
            before.memberships.get(*name).is_some_and(|g| g != *groups) && same_cluster_files
        })
        .count()
}

/// For random pairs of small fleets (one or two files changed from the first),
/// the second's render written against the first and read back against it
/// gives the second's memberships, labels, provenance and diagnostics; every
/// tenth clean pair also goes through a worker on real pipes.
#[test]
fn memberships_and_labels_written_as_changes_read_back_whole() {
    let fleets = small_fleets();
    let snapshot = |choice: &[usize], revision: &str| {
        let mut snapshot = FleetSnapshot::from_files(
            fleets
                .iter()
                .zip(choice)
                .filter_map(|((path, texts), &i)| Some((path.as_str(), texts[i].as_deref()?))),
        );
        snapshot.revision = revision.to_string();
        snapshot
    };
    // A xorshift generator: the same pairs on every run.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut below = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (mut through_groups, mut clean) = (0, 0);
    for round in 0..300 {
        let mut choice: Vec<usize> = fleets
            .iter()
            .map(|(path, texts)| {
                let broken = path.starts_with("clusters/") || path.starts_with("groups/");
                // The second spelling of a file is mostly absent, and a file
                // mostly not broken (its second text).
                match below(texts.len()) {
                    _ if path.ends_with(".yml") && below(4) != 0 => 0,
                    1 if broken && below(4) != 0 => 2 + below(texts.len() - 2),
                    i => i,
                }
            })
            .collect();
        let first = snapshot(&choice, "first");
        for _ in 0..1 + below(2) {
            let at = below(fleets.len());
            choice[at] = below(fleets[at].1.len());
        }
        let second = snapshot(&choice, "second");
        let before = flotilla_render::render(&first);
        let after = flotilla_render::render(&second);
        through_groups += changed_by_groups_alone((&first, &before), (&second, &after));
        let mut bytes = Vec::new();
        encode_output(&after, Known::Render(&before), &mut bytes).expect("encodes");
        let back = decode_output(bytes.as_slice(), Some(&before)).expect("decodes");
        assert_eq!(back.memberships, after.memberships, "round {round}");
        assert_eq!(back.labels, after.labels, "round {round}");
        assert_eq!(back.provenance, after.provenance, "round {round}");
        assert_eq!(back.diagnostics, after.diagnostics, "round {round}");
        if before.is_clean() {
            clean += 1;
            if clean % 10 == 0 {
                let (back, _) = render_through_pipes(&second, &before);
                assert_eq!(back.memberships, after.memberships, "round {round}");
                assert_eq!(back.labels, after.labels, "round {round}");
                assert_eq!(back.provenance, after.provenance, "round {round}");
                assert_eq!(digests(&back), digests(&after), "round {round}");
            }
        }
    }
    // The pairs reach what matters: memberships changed by groups alone (the
    // cluster files the same), and clean previous renders for the pipes.
    assert!(through_groups > 10, "{through_groups}");
    assert!(clean > 20, "{clean}");
}

/// A render process with a file of sealing headers writes there, privately, the age
/// header of each agent it sealed to: the one every sealed Secret of that agent starts
/// with. (That a new process uses what it reads there is the seal module's test: the
/// worker here runs in the test's own process.)
#[test]
fn the_worker_keeps_the_sealing_headers_it_worked_out_for_the_next_process() {
    use base64::Engine as _;
    use std::os::unix::fs::PermissionsExt as _;
    // IDENTITY's recipient, as `age-keygen -y` prints it.
    let recipient = "age14sv6psrvmr5860w9dfs8cc6000te95rxts9cp0ku4ae0qkz6va5q8vn9yl";
    const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
    let snapshot = FleetSnapshot::from_files([
        (
            "clusters/keyed.yaml",
            &*format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: keyed\nspec:\n  agentKey: {recipient}\n"
            ),
        ),
        (
            "workloads/db/workload.yaml",
            &*format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: db\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        ),
        (
            "workloads/db/manifests/secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2\n",
        ),
    ]);
    let settings = RenderSettings {
        helm_seed: Some([9; 32]),
        ..RenderSettings::plain(Limits::default())
    };
    let dir = tempfile::tempdir().expect("a folder");
    let path = dir.path().join(super::SEALING_HEADERS_FILE);
    let render = || {
        let mut input = Vec::new();
        encode_input(&snapshot, Since::Nothing, &settings, &mut input).expect("encodes");
        let mut out = Vec::new();
        run_worker(None, Some(&path), input.as_slice(), &mut out).expect("renders");
        let (ask, _asked) = std::sync::mpsc::channel();
        drain_output(out.as_slice(), None, &ask).expect("decodes")
    };
    let first = render();
    assert!(first.is_clean(), "{:?}", first.diagnostics);
    let secret = first.bundles["keyed"]
        .resources
        .iter()
        .find(|r| r.key.kind() == "Secret")
        .expect("the Secret");
    let secret: serde_json::Value =
        serde_json::from_slice(secret.canonical.as_ref()).expect("JSON");
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(
            secret[flotilla_core::bundle::SEALED_SECRET_FIELD]["sealed"]
                .as_str()
                .expect("sealed"),
        )
        .expect("base64");
    let header_end = sealed
        .windows(4)
        .position(|w| w == b"\n---")
        .and_then(|at| {
            sealed[at + 1..]
                .iter()
                .position(|&b| b == b'\n')
                .map(|n| at + 2 + n)
        })
        .expect("an age header");
    let file = std::fs::read(&path).expect("the file is written");
    assert!(file.starts_with(flotilla_render::seal::KEPT_HEADERS_MAGIC));
    assert!(
        file.windows(header_end).any(|w| w == &sealed[..header_end]),
        "the file holds the agent's header"
    );
    let mode = std::fs::metadata(&path)
        .expect("metadata")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // Another render with the file there: the same bundle, the file unchanged.
    let second = render();
    assert_eq!(digests(&second), digests(&first));
    assert_eq!(std::fs::read(&path).expect("still there"), file);
}
