use std::collections::BTreeMap;
use std::io::Write;

use super::*;

fn files(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

const CHART_YAML: &str = "apiVersion: v2\nname: top\nversion: 1.0.0\ndependencies:\n- name: sub\n  version: 1.x\n  condition: sub.enabled,global.sub\n  tags: [db]\n  alias: other\n  import-values:\n  - data\n  - child: a.b\n    parent: c\n";

#[test]
fn a_folder_is_read_as_helm_reads_it() {
    let chart = Chart::from_files(files(&[
        ("Chart.yaml", CHART_YAML),
        ("values.yaml", "a: 1\nb: {c: 2}\n---\nb: {d: 3}\n"),
        ("templates/x.yaml", "x"),
        ("templates/.hidden", "h"),
        ("crds/crd.yaml", "kind: CustomResourceDefinition"),
        ("README.md", "read me"),
        ("secret.key", "k"),
        ("docs/a.txt", "a"),
        (".helmignore", "# comment\n*.key\ndocs/\n"),
        (
            "charts/sub/Chart.yaml",
            "apiVersion: v2\nname: sub\nversion: 1.2.0\ntype: library\n",
        ),
        ("charts/sub/templates/_h.tpl", ""),
        ("charts/_skipped/Chart.yaml", "not: a chart"),
    ]))
    .expect("loads");
    assert_eq!(chart.name(), "top");
    let dependency = &chart.metadata.dependencies[0];
    assert_eq!(dependency.condition, "sub.enabled,global.sub");
    assert_eq!(dependency.tags, ["db"]);
    assert_eq!(dependency.alias.as_deref(), Some("other"));
    assert_eq!(
        dependency.import_values,
        [
            ImportValue::Exports("data".into()),
            ImportValue::Map {
                child: "a.b".into(),
                parent: "c".into()
            }
        ]
    );
    let names: Vec<&str> = chart.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, [".helmignore", "README.md", "crds/crd.yaml"]);
    assert_eq!(
        chart
            .templates
            .iter()
            .map(|f| f.name.as_str())
            .collect::<Vec<_>>(),
        ["templates/x.yaml"]
    );
    assert_eq!(chart.crds().count(), 1);
    assert_eq!(chart.subcharts.len(), 1);
    assert_eq!(chart.subcharts[0].metadata.chart_type, ChartType::Library);
    let Some(Value::Map(b)) = chart.values.get("b") else {
        panic!("b is a map")
    };
    assert_eq!(b.keys(), ["c", "d"]);
}

#[test]
fn a_missing_dependency_says_what_to_run() {
    let err = Chart::from_files(files(&[("Chart.yaml", CHART_YAML)])).expect_err("sub is missing");
    let message = err.to_string();
    assert!(
        message.starts_with(
            "top/Chart.yaml: found in Chart.yaml, but missing in charts/ directory: sub"
        ),
        "{message}"
    );
    assert!(message.contains("helm dependency build"), "{message}");
    let err = Chart::from_files(files(&[("Chart.yaml", "apiVersion: v2\nversion: 1\n")]))
        .expect_err("no name");
    assert_eq!(
        err.to_string(),
        "Chart.yaml: validation: chart.metadata.name is required"
    );
    let err = Chart::from_files(files(&[("values.yaml", "a: 1")])).expect_err("no Chart.yaml");
    assert_eq!(err.to_string(), "Chart.yaml: Chart.yaml file is missing");
}

fn tgz(entries: &[(&str, &[u8], tar::EntryType)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, data, kind) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(*kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        // Written raw so that hostile names reach the reader as they are.
        let name = header.as_old_mut().name.as_mut();
        name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, *data).expect("appends");
    }
    let mut gz = builder.into_inner().expect("finishes");
    gz.flush().expect("flushes");
    gz.finish().expect("compresses")
}

#[test]
fn archives_are_read_within_budgets() {
    let file = tar::EntryType::Regular;
    let sub = tgz(&[(
        "sub/Chart.yaml",
        b"apiVersion: v2\nname: sub\nversion: 1.0.0\n",
        file,
    )]);
    let top = tgz(&[
        (
            "top/Chart.yaml",
            b"apiVersion: v2\nname: top\nversion: 1.0.0\ndependencies:\n- name: sub\n",
            file,
        ),
        ("top/templates/a.yaml", b"a", file),
        ("top/charts/sub-1.0.0.tgz", &sub, file),
    ]);
    let chart = Chart::from_tgz(&top).expect("loads");
    assert_eq!(chart.subcharts[0].name(), "sub");
    let escape = tgz(&[("top/../../etc/passwd", b"x", file)]);
    assert!(
        Chart::from_tgz(&escape)
            .expect_err("refused")
            .to_string()
            .contains("points outside the chart")
    );
    let link = tgz(&[("top/link", b"", tar::EntryType::Symlink)]);
    assert!(
        Chart::from_tgz(&link)
            .expect_err("refused")
            .to_string()
            .contains("is a link")
    );
    let big = vec![b'a'; (MAX_FILE_BYTES + 1) as usize];
    let bomb = tgz(&[("top/big", &big, file)]);
    assert!(
        Chart::from_tgz(&bomb)
            .expect_err("refused")
            .to_string()
            .contains("unpacks to more than")
    );
    assert!(Chart::from_tgz(b"not gzip").is_err());
}

#[test]
fn helmignore_patterns_match_as_go_matches() {
    assert_eq!(glob_match("*.txt", "a.txt"), Some(true));
    assert_eq!(glob_match("*.txt", "a/b.txt"), Some(false));
    assert_eq!(glob_match("a?c", "abc"), Some(true));
    assert_eq!(glob_match("[a-c]x", "bx"), Some(true));
    assert_eq!(glob_match("[^a-c]x", "bx"), Some(false));
    assert_eq!(glob_match("[", "a"), None);
    let ignore = Ignore::parse("/top.txt\nsub/*.md\n").expect("parses");
    assert!(ignore.ignores("top.txt"));
    assert!(ignore.ignores("sub/x.md"));
    assert!(!ignore.ignores("other/x.md"));
    assert!(ignore.ignores("templates/.git/config"));
}
