//! What a drift check costs the kube sink against the fake API server
//! (BENCHMARKS.md): a bundle of N ConfigMaps (and their Namespace) is applied once,
//! then checked R times; prints the requests of the apply and of one check, and the
//! median time of a check without drift, and one check with one object in ten edited
//! by another manager (corrected).
//!
//! ```text
//! drift_check [--resources N] [--runs R]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_agent::sink::Sink;
use flotilla_agent::sink::drift::DriftCheck;
use flotilla_agent::sink::kube::{KubeOptions, KubeSink};
use flotilla_core::bundle::{Bundle, BundleMeta, Resource, ResourceKey};
use flotilla_kube_fake::FakeApiServer;
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (count, runs) = (arg("--resources", 1000), arg("--runs", 11));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(measure(count, runs));
}

fn config_map(i: usize) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("settings-{i:04}"), "namespace": "shop",
                     "labels": {"app.kubernetes.io/name": "shop"}},
        "data": {"mode": "edge", "replicas": "2", "region": "eu-west", "index": i.to_string()},
    })
}

fn bundle(count: usize) -> Bundle {
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}});
    let mut resources: Vec<Arc<Resource>> = std::iter::once(namespace)
        .chain((0..count).map(config_map))
        .map(|value| {
            let key = ResourceKey::of(&value).expect("an identity");
            Arc::new(Resource::new(key, &value))
        })
        .collect();
    resources.sort_by(|a, b| a.key.cmp(&b.key));
    let meta = BundleMeta {
        workloads: vec!["shop".to_string(); resources.len()],
        // Drift policies alone make the bundle carry meta; `correct` is the default, so
        // one workload that reports keeps the metadata as a real fleet's would.
        drift: [(
            "elsewhere".to_string(),
            flotilla_core::bundle::DriftPolicy::Report,
        )]
        .into(),
        ..BundleMeta::default()
    };
    Bundle::from_sorted_with_meta("edge-1", resources, Some(meta))
}

async fn check(sink: &mut KubeSink, bundle: &Bundle) -> (Duration, usize) {
    let started = Instant::now();
    let found = match sink.check_drift(bundle).await {
        DriftCheck::Checked { drift, .. } => drift.len(),
        other => panic!("the check did not complete: {other:?}"),
    };
    (started.elapsed(), found)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

async fn measure(count: usize, runs: usize) {
    let fake = FakeApiServer::new();
    let bundle = bundle(count);
    let mut sink = KubeSink::with_client(fake.client(), KubeOptions::default());
    let started = Instant::now();
    let outcome = sink.apply(&bundle, &[]).await;
    assert!(outcome.complete, "{}", outcome.message);
    let apply_time = started.elapsed();
    let apply_requests = fake.exchanges().len();
    fake.clear_exchanges();

    let mut clean = Vec::new();
    for _ in 0..runs {
        let (time, found) = check(&mut sink, &bundle).await;
        assert_eq!(found, 0, "no drift");
        clean.push(time);
    }
    let check_requests = fake.exchanges().len() / runs;
    fake.clear_exchanges();

    // One object in ten edited by another manager, once: found and put back (a
    // second edit of the same fields right after would be fighting, not corrected).
    for i in (0..count).step_by(10) {
        let mut edited = config_map(i);
        edited["data"]["mode"] = json!("by-hand");
        fake.insert(edited, "kubectl-edit");
    }
    fake.clear_exchanges();
    let (drift_time, found) = check(&mut sink, &bundle).await;
    let last = fake.exchanges();
    let drift_requests = last.len();
    let writes = last.iter().filter(|e| e.method != "GET").count();
    println!(
        "{} resources: apply {} requests in {:.1} ms; check without drift {} requests, median {:.1} ms; \
         check with {} drifted (corrected) {} requests of which {} writes, {:.1} ms ({runs} runs)",
        bundle.resources.len(),
        apply_requests,
        apply_time.as_secs_f64() * 1e3,
        check_requests,
        median(clean).as_secs_f64() * 1e3,
        found,
        drift_requests,
        writes,
        drift_time.as_secs_f64() * 1e3,
    );
}
