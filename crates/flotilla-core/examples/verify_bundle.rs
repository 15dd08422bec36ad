//! What an agent's check of a received document costs: a bundle of many small
//! ConfigMaps made into a document and verified as the agent verifies it.
//!
//!   cargo run --release -p flotilla-core --example verify_bundle -- [RESOURCES] [RUNS]
//!
//! Prints the document's size and the median and range of the verification's time.

use std::sync::Arc;
use std::time::Instant;

use flotilla_core::bundle::{Bundle, Resource, ResourceKey, verify_shared_document};
use serde_json::json;

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args
        .next()
        .map_or(100_000, |a| a.parse().expect("a number"));
    let runs: usize = args.next().map_or(9, |a| a.parse().expect("a number"));
    let resources = (0..count)
        .map(|i| {
            let value = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("cm-big-{i:07}"), "namespace": "big"},
                "data": {"level": "info", "index": i.to_string()}});
            Arc::new(Resource::new(
                ResourceKey::of(&value).expect("identity"),
                &value,
            ))
        })
        .collect();
    let bundle = Bundle::new("edge-1", resources);
    let document = Arc::new(bundle.document("main@sha1:0"));
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            let verified = verify_shared_document(&document, Some("edge-1")).expect("verifies");
            let took = started.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(verified.bundle.digest, bundle.digest);
            took
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "{count} resources, a document of {} bytes: verified in {:.1} ms (median of {runs}; {:.1}–{:.1})",
        document.len(),
        times[runs / 2],
        times[0],
        times[runs - 1]
    );
}
