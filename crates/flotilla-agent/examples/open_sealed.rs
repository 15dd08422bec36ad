//! How long the agent takes to open a bundle of N Secrets sealed to its key
//! (BENCHMARKS.md): prints the median of R openings.
//!
//! ```text
//! open_sealed [--secrets N] [--runs R]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use flotilla_agent::cache::StateDir;
use flotilla_agent::sealed::AgentIdentity;
use flotilla_core::bundle::{Bundle, Resource, ResourceKey, SEALED_SECRET_FIELD};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (secrets, runs) = (arg("--secrets", 100), arg("--runs", 21));
    let dir = tempfile::tempdir().expect("a folder");
    let state = StateDir::open(&dir.path().join("state")).expect("a state folder");
    let (identity, _) = AgentIdentity::load_or_make(&state).expect("a key");
    let recipient: age::x25519::Recipient = identity.recipient().parse().expect("a recipient");
    let resources = (0..secrets)
        .map(|i| {
            let plain = format!(
                r#"{{"stringData":{{"username":"pos-{i}","password":"a-long-enough-password-{i}-0123456789"}}}}"#
            );
            let sealed = age::encrypt(&recipient, plain.as_bytes()).expect("seals");
            let value = serde_json::json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("credentials-{i}"), "namespace": "pos"},
                "type": "Opaque",
                SEALED_SECRET_FIELD: {"sealed": base64::engine::general_purpose::STANDARD.encode(sealed)}
            });
            Arc::new(Resource::new(ResourceKey::of(&value).expect("a key"), &value))
        })
        .collect();
    let bundle = Bundle::new("site-1", resources);
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            let opened = identity.open(&bundle).expect("opens");
            let took = started.elapsed();
            assert_eq!(opened.resources.len(), secrets);
            took
        })
        .collect();
    times.sort();
    println!(
        "opened {secrets} sealed Secrets: median {:?} of {runs} (min {:?}, max {:?})",
        times[runs / 2],
        times[0],
        times[runs - 1]
    );
}
