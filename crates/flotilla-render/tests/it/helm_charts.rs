//! The chart model against Helm v4's renders in ../shared/testdata/helm-charts: for
//! every chart and both values files, the templates Helm wrote are exactly those the
//! plan renders. Skips (and says so) when the corpus is absent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use flotilla_render::helm::chart::Chart;
use flotilla_render::helm::values::plan;
use flotilla_render::helm::yaml::from_yaml_map;

const CORPUS: &str = "../../../shared/testdata/helm-charts";

#[test]
fn template_names_match_helm_for_every_corpus_chart() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(CORPUS);
    let Ok(manifest) = std::fs::read(root.join("manifest.json")) else {
        eprintln!("skipped: no Helm chart corpus at {}", root.display());
        return;
    };
    let manifest: serde_json::Value =
        serde_json::from_slice(&manifest).expect("manifest.json is JSON");
    let charts = manifest["charts"].as_array().expect("charts is a list");
    let mut checked = 0;
    for entry in charts {
        let id = entry["id"].as_str().expect("id");
        let source = std::fs::read(root.join(entry["source"].as_str().expect("source")))
            .expect("source.tar.gz");
        let chart = Chart::from_tgz(&source).unwrap_or_else(|err| panic!("{id}: {err}"));
        let renders = entry["renders"].as_object().expect("renders");
        for (render, details) in renders {
            let values_text =
                std::fs::read_to_string(root.join(details["values"].as_str().expect("values")))
                    .expect("values.yaml");
            let values: BTreeMap<_, _> =
                from_yaml_map(&values_text).unwrap_or_else(|err| panic!("{id}/{render}: {err}"));
            let planned = plan(&chart, values).unwrap_or_else(|err| panic!("{id}/{render}: {err}"));
            let ours: BTreeSet<&str> = planned
                .templates
                .iter()
                .filter(|t| t.rendered)
                .map(|t| t.name.as_str())
                .collect();
            let helms: BTreeSet<&str> = details["files"]
                .as_array()
                .expect("files")
                .iter()
                .map(|f| f["template"].as_str().expect("template"))
                .collect();
            assert_eq!(
                ours, helms,
                "{id}/{render}: the templates rendered differ from Helm's"
            );
            // The manifest lists the crds/ files of every chart by their name in the chart.
            let crds: BTreeSet<String> = planned
                .crds
                .iter()
                .map(|(_, file)| file.name.clone())
                .collect();
            let helm_crds: BTreeSet<String> = entry["crds"]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter_map(|c| c["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            assert_eq!(
                crds, helm_crds,
                "{id}/{render}: the CRD files differ from Helm's"
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "the corpus has renders");
    eprintln!("checked {checked} renders");
}
