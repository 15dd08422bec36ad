//! The bytes of a bundle body for one changed field in a bundle of about 2 MB: 200
//! ConfigMaps of hexadecimal text (which compresses about twofold, as the issue's
//! measurement had it), sent in full (as the hub caches it: gzip level 6, zstd level
//! 3) and as a delta (RFC 9842 `dcz`, the hub's encoder) against the bundle before the
//! change; and how long the hub takes to make the delta and the agent to rebuild it.
//! Then how long the encoding of a delta takes for a small bundle (four resources,
//! about 2 KB, as in the 10,000 cluster long-poll benchmark), where it costs per delta
//! rather than per byte: a commit that changes every cluster makes one for each. (The
//! hub also reads the base and builds the document for each; not timed here.)
//!
//! ```text
//! cargo run --release --example delta_wire
//! ```
//!
//! Bodies only: the response's headers come on top of each (about 300 bytes on
//! HTTP/1.1, fewer on a kept HTTP/2 connection).

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::bundle::{Bundle, Resource, ResourceKey};
use serde_json::json;

const REVISION: &str = "main@sha1:0123456789abcdef0123456789abcdef01234567";

/// 200 ConfigMaps of 10,000 hexadecimal characters each; `changed` edits one value.
fn bundle(changed: bool) -> Bundle {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let resources = (0..200)
        .map(|i| {
            let mut text = String::with_capacity(10_000);
            while text.len() < 10_000 {
                // xorshift64: the same text on every run.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push_str(&format!("{state:016x}"));
            }
            let value = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": format!("config-{i:03}"), "namespace": "demo"},
                "data": {
                    "text": text,
                    "level": if changed && i == 100 { "debug" } else { "info" },
                },
            });
            let key = ResourceKey::of(&value).expect("a ConfigMap has an identity");
            Arc::new(Resource::new(key, &value))
        })
        .collect();
    Bundle::new("edge", resources)
}

/// Four small resources, one of them with a new image tag when `changed`: about 2 KB.
fn small_bundle(changed: bool) -> Bundle {
    let resources = (0..4)
        .map(|i| {
            let tag = if changed && i == 0 { "1.1" } else { "1.0" };
            let value = json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": format!("app-{i}"), "namespace": "demo",
                             "labels": {"app.kubernetes.io/name": format!("app-{i}")}},
                "spec": {"replicas": 1,
                         "selector": {"matchLabels": {"app.kubernetes.io/name": format!("app-{i}")}},
                         "template": {"metadata": {"labels": {"app.kubernetes.io/name": format!("app-{i}")}},
                                      "spec": {"containers": [{"name": "app",
                                          "image": format!("registry.example/app-{i}:{tag}"),
                                          "ports": [{"containerPort": 8080}]}]}}},
            });
            let key = ResourceKey::of(&value).expect("a Deployment has an identity");
            Arc::new(Resource::new(key, &value))
        })
        .collect();
    Bundle::new("edge", resources)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let base = bundle(false);
    let target = bundle(true);
    let dictionary = base.canonical_body();
    let document = target.document(REVISION);
    let zstd_full = zstd::bulk::compress(&document, 3).expect("compresses");
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(6));
    gzip.write_all(&document).expect("compresses");
    let gzip_full = gzip.finish().expect("compresses");

    let mut encode_times = Vec::new();
    let mut delta = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        delta = flotilla_hub::delta::encode(&dictionary, &document).expect("encodes");
        encode_times.push(started.elapsed());
    }
    let mut decode_times = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        let rebuilt = flotilla_agent::delta::decode(&delta, Some(&base.digest), &dictionary)
            .expect("decodes");
        decode_times.push(started.elapsed());
        assert!(rebuilt == document, "the delta rebuilds the document");
    }
    println!("document (identity): {:>9} bytes", document.len());
    println!("full, gzip -6:       {:>9} bytes", gzip_full.len());
    println!("full, zstd -3:       {:>9} bytes", zstd_full.len());
    println!("delta, dcz:          {:>9} bytes", delta.len());
    println!(
        "delta made in {:.1} ms, rebuilt in {:.1} ms (median of 9, one core)",
        median(encode_times).as_secs_f64() * 1e3,
        median(decode_times).as_secs_f64() * 1e3
    );

    let (base, target) = (small_bundle(false), small_bundle(true));
    let dictionary = base.canonical_body();
    let document = target.document(REVISION);
    let mut rounds = Vec::new();
    let mut delta = Vec::new();
    for _ in 0..9 {
        let started = Instant::now();
        for _ in 0..1_000 {
            delta = flotilla_hub::delta::encode(&dictionary, &document).expect("encodes");
        }
        rounds.push(started.elapsed() / 1_000);
    }
    let rebuilt =
        flotilla_agent::delta::decode(&delta, Some(&base.digest), &dictionary).expect("decodes");
    assert!(rebuilt == document, "the delta rebuilds the document");
    println!(
        "small bundle: document {} bytes, delta {} bytes, made in {:.0} µs (median of 9 rounds of 1,000, one core)",
        document.len(),
        delta.len(),
        median(rounds).as_secs_f64() * 1e6
    );
}
