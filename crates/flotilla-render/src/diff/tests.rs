//! The pure diff over small in-memory fleets. The end-to-end cases over
//! `fleet-example/` and Git are in `tests/diff_cli.rs`.

use std::collections::BTreeMap;

use serde_json::Value;

use super::markdown::MarkdownOptions;
use super::text::TextOptions;
use super::*;
use crate::render;
use flotilla_core::snapshot::FleetSnapshot;

/// A fleet of named clusters with `region` and `tier` labels, groups by region and
/// tier, and one workload `web` on every cluster: a Deployment (the same on every
/// cluster) and a templated ConfigMap (naming the cluster).
struct Fleet {
    files: BTreeMap<String, String>,
}

impl Fleet {
    fn new(clusters: &[(&str, &str, &str)]) -> Fleet {
        let mut fleet = Fleet {
            files: BTreeMap::new(),
        };
        for (name, region, tier) in clusters {
            fleet.cluster(name, region, tier);
        }
        for (group, label, value) in [
            ("eu", "region", "eu"),
            ("us", "region", "us"),
            ("stable", "tier", "stable"),
            ("canary", "tier", "canary"),
        ] {
            fleet.set(
                &format!("groups/{group}.yaml"),
                &format!(
                    "apiVersion: flotilla.dev/v1alpha1\nkind: Group\nmetadata:\n  name: {group}\n\
                     spec:\n  selector:\n    matchLabels:\n      {label}: {value}\n"
                ),
            );
        }
        fleet.set(
            "workloads/web/workload.yaml",
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: web\n\
             spec:\n  namespace: web\n  targets:\n    - clusterSelector: {}\n",
        );
        fleet.set(
            "workloads/web/manifests/deployment.yaml",
            &deployment("web:1.0"),
        );
        fleet.set(
            "workloads/web/manifests/config.yaml.j2",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n\
             \x20 cluster: \"{{ cluster.name }}\"\n  level: info\n",
        );
        fleet
    }

    fn cluster(&mut self, name: &str, region: &str, tier: &str) {
        self.set(
            &format!("clusters/{name}.yaml"),
            &format!(
                "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\n\
                 \x20 labels:\n    region: {region}\n    tier: {tier}\n"
            ),
        );
    }

    fn set(&mut self, path: &str, text: &str) {
        self.files.insert(path.to_string(), text.to_string());
    }

    fn remove(&mut self, path: &str) {
        self.files.remove(path);
    }

    fn render(&self) -> RenderOutput {
        let mut snapshot =
            FleetSnapshot::from_files(self.files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
        snapshot.revision = "test".to_string();
        render(&snapshot)
    }
}

fn deployment(image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 2\n\
         \x20 template:\n    spec:\n      containers:\n        - name: web\n          image: {image}\n"
    )
}

const THREE: [(&str, &str, &str); 3] = [
    ("a", "eu", "stable"),
    ("b", "eu", "stable"),
    ("c", "us", "canary"),
];

fn compare(base: &Fleet, head: &Fleet) -> FleetDiff {
    diff(&base.render(), &head.render(), &DiffOptions::default())
}

fn names(diff: &FleetDiff, status: ClusterStatus) -> Vec<&str> {
    diff.with_status(status).map(|c| c.name.as_str()).collect()
}

fn all_formats(diff: &FleetDiff) -> Vec<String> {
    vec![
        text::report(diff, &TextOptions { colour: false }),
        text::report(diff, &TextOptions { colour: true }),
        markdown::report(diff, &MarkdownOptions::default()),
        json::report(diff).expect("json"),
    ]
}

#[test]
fn the_same_fleet_has_no_changes() {
    let fleet = Fleet::new(&THREE);
    let diff = compare(&fleet, &fleet);
    assert!(!diff.has_changes());
    assert!(!diff.head_is_broken());
    assert_eq!(diff.totals.unchanged, 3);
    assert!(diff.groups.is_empty());
}

#[test]
fn identical_changes_are_grouped_once() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    head.set(
        "workloads/web/manifests/deployment.yaml",
        &deployment("web:2.0"),
    );
    let diff = compare(&base, &head);
    assert_eq!(names(&diff, ClusterStatus::Changed), ["a", "b", "c"]);
    assert_eq!(diff.groups.len(), 1);
    let group = &diff.groups[0];
    assert_eq!(group.clusters, ["a", "b", "c"]);
    assert_eq!(group.title(), "the same change on 3 clusters");
    assert_eq!(group.resources.len(), 1);
    let change = &group.resources[0];
    assert_eq!(change.kind, ResourceChangeKind::Changed);
    let text = change.diff.as_deref().expect("a diff");
    assert!(text.contains("-      - image: web:1.0\n"), "{text}");
    assert!(text.contains("+      - image: web:2.0\n"), "{text}");
    // Each cluster keeps its own digests.
    let a = &diff.clusters[0];
    assert_ne!(a.before, a.after);
    assert!(a.before.is_some() && a.after.is_some());
}

#[test]
fn changes_that_read_differently_are_separate_groups() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    // The changed line sits next to the cluster's name, so each diff differs.
    head.set(
        "workloads/web/manifests/config.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n\
         \x20 cluster: \"{{ cluster.name }}\"\n  level: debug\n",
    );
    let diff = compare(&base, &head);
    assert_eq!(diff.groups.len(), 3);
    assert!(diff.groups.iter().all(|g| g.clusters.len() == 1));
    assert_eq!(diff.groups[0].title(), "a (eu, stable)");
}

#[test]
fn groups_are_labelled_by_the_fleet_groups_their_clusters_share() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    head.set(
        "overlays/eu.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: eu-replicas\n\
         spec:\n  groups: [eu]\n  patches:\n    - target: {kind: Deployment}\n\
         \x20     merge: {spec: {replicas: 3}}\n",
    );
    let diff = compare(&base, &head);
    assert_eq!(diff.groups.len(), 1);
    let group = &diff.groups[0];
    assert_eq!(group.shared_groups, ["eu", "stable"]);
    assert_eq!(group.whole_groups, ["eu", "stable"]);
    assert_eq!(
        group.title(),
        "the same change on 2 clusters (eu, stable; every cluster of eu, stable)"
    );
    let eu = diff.fleet_groups.get("eu").copied().unwrap_or_default();
    assert_eq!((eu.clusters, eu.changed, eu.unchanged), (2, 2, 0));
    let us = diff.fleet_groups.get("us").copied().unwrap_or_default();
    assert_eq!((us.clusters, us.changed, us.unchanged), (1, 0, 1));
}

#[test]
fn added_and_removed_clusters() {
    let base = Fleet::new(&THREE);
    let head = Fleet::new(&[
        ("a", "eu", "stable"),
        ("b", "eu", "stable"),
        ("d", "us", "canary"),
    ]);
    let diff = compare(&base, &head);
    assert_eq!(names(&diff, ClusterStatus::Added), ["d"]);
    assert_eq!(names(&diff, ClusterStatus::Removed), ["c"]);
    assert_eq!(names(&diff, ClusterStatus::Unchanged), ["a", "b"]);
    let added = &diff.groups[diff.clusters[3].group.expect("d has a group")];
    assert_eq!(added.title(), "new cluster d (canary, us)");
    assert!(
        added
            .resources
            .iter()
            .all(|r| r.kind == ResourceChangeKind::Added)
    );
    assert!(added.resources.iter().all(|r| r.diff.is_some()));
    let removed = &diff.groups[diff.clusters[2].group.expect("c has a group")];
    assert_eq!(removed.title(), "removed cluster c (canary, us)");
    assert!(removed.resources.iter().all(|r| r.diff.is_none()));
    assert_eq!(diff.clusters[2].after, None);
    assert!(diff.has_changes());
}

#[test]
fn a_cluster_whose_file_breaks_on_head_is_not_rendered_rather_than_removed() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    head.set(
        "clusters/c.yaml",
        "apiVersion: flotilla.dev/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\n  lables: {}\n",
    );
    let diff = compare(&base, &head);
    assert!(diff.head_is_broken());
    // A broken cluster file is an error of no single cluster: the renderer then
    // trusts no bundle, so no cluster is rendered, and none counts as removed.
    assert_eq!(names(&diff, ClusterStatus::Failed), ["a", "b", "c"]);
    assert!(names(&diff, ClusterStatus::Removed).is_empty());
    // Its fleet groups come from BASE, where it still loaded.
    assert_eq!(diff.clusters[2].fleet_groups, ["canary", "us"]);
    let text = text::report(&diff, &TextOptions::default());
    assert!(text.contains("HEAD does not render"), "{text}");
    assert!(text.contains("clusters/c.yaml:5:"), "{text}");
}

#[test]
fn a_fleet_read_in_part_removes_and_adds_no_cluster() {
    let fleet = Fleet::new(&THREE);
    // What a byte budget that stopped the read makes: its one error, nothing rendered.
    let mut snapshot =
        FleetSnapshot::from_files(fleet.files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    snapshot.incomplete = true;
    snapshot.problems.push(
        flotilla_core::diagnostic::Diagnostic::error("the fleet's files come to more bytes")
            .in_file("clusters/b.yaml"),
    );
    let partial = render(&snapshot);
    assert!(partial.incomplete && partial.bundles.is_empty());

    let diff = super::diff(&fleet.render(), &partial, &DiffOptions::default());
    assert!(diff.head_is_broken());
    assert_eq!(names(&diff, ClusterStatus::Failed), ["a", "b", "c"]);
    assert!(names(&diff, ClusterStatus::Removed).is_empty());

    let diff = super::diff(&partial, &fleet.render(), &DiffOptions::default());
    assert!(names(&diff, ClusterStatus::Added).is_empty());
    assert_eq!(names(&diff, ClusterStatus::Changed), ["a", "b", "c"]);
    assert!(diff.clusters.iter().all(|c| c.before.is_none()));
}

#[test]
fn a_cluster_base_did_not_render_is_changed_with_no_before() {
    let mut base = Fleet::new(&THREE);
    base.set(
        "workloads/web/manifests/config.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  x: \"{{ vars.missing }}\"\n",
    );
    let head = Fleet::new(&THREE);
    let diff = compare(&base, &head);
    assert!(!diff.base.is_clean());
    assert!(!diff.head_is_broken());
    assert_eq!(names(&diff, ClusterStatus::Changed), ["a", "b", "c"]);
    assert!(diff.clusters.iter().all(|c| c.before.is_none()));
    assert!(diff.groups.iter().all(|g| g.before_unknown));
    assert!(
        diff.groups
            .iter()
            .flat_map(|g| &g.resources)
            .all(|r| r.diff.is_none()),
        "no whole bundles printed for clusters without a before"
    );
}

#[test]
fn a_removed_resource_in_a_changed_cluster_shows_its_content() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    head.remove("workloads/web/manifests/deployment.yaml");
    let diff = compare(&base, &head);
    let change = &diff.groups[0].resources[0];
    assert_eq!(change.kind, ResourceChangeKind::Removed);
    assert!(
        change
            .diff
            .as_deref()
            .is_some_and(|d| d.contains("-kind: Deployment"))
    );
}

fn secret(pairs: &[(&str, &str)]) -> String {
    let mut text = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n".to_string();
    for (key, value) in pairs {
        text.push_str(&format!("  {key}: {value}\n"));
    }
    text
}

#[test]
fn secret_values_appear_in_no_format() {
    let empty = Fleet::new(&THREE);
    let mut before = Fleet::new(&THREE);
    before.set(
        "workloads/web/manifests/secret.yaml",
        &secret(&[("user", "alice-the-admin"), ("pin", "4711")]),
    );
    let mut after = Fleet::new(&THREE);
    after.set(
        "workloads/web/manifests/secret.yaml",
        &secret(&[
            ("user", "alice-the-admin"),
            ("pin", "9046"),
            ("otp", "swordfish"),
        ]),
    );
    for (base, head) in [(&empty, &before), (&before, &after), (&after, &empty)] {
        let diff = compare(base, head);
        assert!(diff.has_changes());
        for report in all_formats(&diff) {
            for value in ["alice-the-admin", "4711", "9046", "swordfish"] {
                assert!(!report.contains(value), "{value} leaked:\n{report}");
            }
        }
    }
}

#[test]
fn colour_is_only_added_when_asked() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    head.set(
        "workloads/web/manifests/deployment.yaml",
        &deployment("web:2.0"),
    );
    let diff = compare(&base, &head);
    let plain = text::report(&diff, &TextOptions { colour: false });
    let coloured = text::report(&diff, &TextOptions { colour: true });
    assert!(!plain.contains('\u{1b}'));
    assert!(
        coloured.contains("\u{1b}[31m-      - image: web:1.0\u{1b}[0m"),
        "{coloured}"
    );
    assert!(
        coloured.contains("\u{1b}[32m+      - image: web:2.0\u{1b}[0m"),
        "{coloured}"
    );
}

#[test]
fn json_has_the_documented_top_level() {
    let base = Fleet::new(&THREE);
    let head = Fleet::new(&[
        ("a", "eu", "stable"),
        ("b", "eu", "stable"),
        ("d", "us", "canary"),
    ]);
    let diff = compare(&base, &head);
    let report: Value = serde_json::from_str(&json::report(&diff).expect("json")).expect("parses");
    assert_eq!(report["format"], "flotilla.dev/diff/v1");
    assert_eq!(report["changed"], serde_json::json!([]));
    assert_eq!(report["added"], serde_json::json!(["d"]));
    assert_eq!(report["removed"], serde_json::json!(["c"]));
    assert_eq!(report["unchanged"], 2);
    assert_eq!(report["failed"], serde_json::json!([]));
    assert_eq!(report["errors"], serde_json::json!([]));
    assert_eq!(report["clusters"]["d"]["status"], "added");
    assert_eq!(report["clusters"]["d"]["before"], Value::Null);
    assert!(
        report["clusters"].get("a").is_none(),
        "unchanged clusters are counted only"
    );
    let group = report["clusters"]["c"]["group"]
        .as_u64()
        .expect("group index");
    assert_eq!(report["groups"][group as usize]["status"], "removed");
    assert_eq!(report["fleetGroups"]["us"]["added"], 1);
    assert_eq!(report["totals"]["clusters"], 4);
}

/// A fleet of `count` clusters in which every cluster's change reads differently,
/// plus one change shared by all: a report far over any size limit.
fn big_diff(count: usize) -> FleetDiff {
    let clusters: Vec<(String, &str, &str)> = (0..count)
        .map(|i| {
            (
                format!("site-{i:04}"),
                if i % 2 == 0 { "eu" } else { "us" },
                "stable",
            )
        })
        .collect();
    let refs: Vec<(&str, &str, &str)> = clusters
        .iter()
        .map(|(n, r, t)| (n.as_str(), *r, *t))
        .collect();
    let base = Fleet::new(&refs);
    let mut head = Fleet::new(&refs);
    head.set(
        "workloads/web/manifests/deployment.yaml",
        &deployment("web:2.0"),
    );
    head.set(
        "workloads/web/manifests/config.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n\
         \x20 cluster: \"{{ cluster.name }}\"\n  level: debug\n",
    );
    compare(&base, &head)
}

/// Every code fence and `<details>` that opens also closes, in order.
fn assert_well_formed(text: &str) {
    let mut fence: Option<String> = None;
    let mut depth = 0i64;
    for line in text.lines() {
        let ticks: String = line.chars().take_while(|&c| c == '`').collect();
        match &fence {
            Some(open) if line == open => fence = None,
            Some(_) => {}
            None if ticks.len() >= 3 => fence = Some(ticks),
            None => {
                depth += line.matches("<details>").count() as i64;
                depth -= line.matches("</details>").count() as i64;
                assert!(depth >= 0);
            }
        }
    }
    assert_eq!(fence, None, "open fence in:\n{text}");
    assert_eq!(depth, 0, "open <details> in:\n{text}");
}

#[test]
fn markdown_stays_under_every_limit_and_says_what_was_cut() {
    let diff = big_diff(60);
    assert_eq!(diff.groups.len(), 60);
    let full = markdown::report(
        &diff,
        &MarkdownOptions {
            max_bytes: usize::MAX,
        },
    );
    assert_well_formed(&full);
    assert!(!full.contains("was cut"));
    for max_bytes in (markdown::MIN_MAX_BYTES..full.len()).step_by(997) {
        let report = markdown::report(&diff, &MarkdownOptions { max_bytes });
        assert!(report.len() <= max_bytes, "{} > {max_bytes}", report.len());
        assert_well_formed(&report);
        assert!(report.contains("This comment was cut"), "{report}");
        assert!(report.starts_with("### flotilla diff: 60 clusters changed"));
    }
    // Below the minimum, the minimum holds.
    let tiny = markdown::report(&diff, &MarkdownOptions { max_bytes: 10 });
    assert!(tiny.len() <= markdown::MIN_MAX_BYTES);
    assert_well_formed(&tiny);
}

#[test]
fn long_cluster_lists_are_folded() {
    let clusters: Vec<(String, &str, &str)> = (0..50)
        .map(|i| (format!("n-{i:02}"), "eu", "stable"))
        .collect();
    let refs: Vec<(&str, &str, &str)> = clusters
        .iter()
        .map(|(n, r, t)| (n.as_str(), *r, *t))
        .collect();
    let mut head_base = Fleet::new(&refs);
    head_base.remove("workloads/web/manifests/config.yaml.j2");
    let mut head = Fleet::new(&refs);
    head.remove("workloads/web/manifests/config.yaml.j2");
    head.set(
        "workloads/web/manifests/deployment.yaml",
        &deployment("web:2.0"),
    );
    let diff = compare(&head_base, &head);
    assert_eq!(diff.groups.len(), 1, "one change on 50 clusters");
    let text = text::report(&diff, &TextOptions::default());
    assert!(
        text.contains("the same change on 50 clusters (eu, stable; every cluster of eu, stable)")
    );
    assert!(
        text.contains("  ... and 30 more (--format json lists every cluster)"),
        "{text}"
    );
    let markdown = markdown::report(&diff, &MarkdownOptions::default());
    assert!(
        markdown.contains("<summary>50 clusters</summary>"),
        "{markdown}"
    );
    assert!(
        markdown.contains("`n-49`"),
        "the full list fits in the default limit"
    );
}

#[test]
fn a_table_of_many_fleet_groups_keeps_the_ones_with_changes() {
    let base = Fleet::new(&THREE);
    let mut head = Fleet::new(&THREE);
    head.set(
        "workloads/web/manifests/deployment.yaml",
        &deployment("web:2.0"),
    );
    let mut diff = compare(&base, &head);
    for i in 0..2_000 {
        let quiet = Counts {
            clusters: 1,
            unchanged: 1,
            ..Counts::default()
        };
        diff.fleet_groups.insert(format!("quiet-{i:04}"), quiet);
    }
    let report = markdown::report(&diff, &MarkdownOptions { max_bytes: 4_000 });
    assert!(report.len() <= 4_000, "{}", report.len());
    assert!(report.contains("| eu | 2 | 2 | 0 | 0 | 0 |"), "{report}");
    assert!(!report.contains("quiet-0000"), "{report}");
    assert!(report.contains("2000 fleet groups not listed"), "{report}");
    assert!(
        report.contains("2000 fleet groups left out of the table"),
        "{report}"
    );
    assert_well_formed(&report);
}
