//! The architecture's rules, as the dependency graph keeps them (ARCHITECTURE.md):
//! the core is pure and small, the renderer pure, and the edge agent links nothing of
//! the hub, the renderer or Git. `cargo tree` tells what each crate really links.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates `package` links (normal dependencies only, as it is built alone).
fn linked(package: &str) -> BTreeSet<String> {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}",
        ])
        .args(["-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn check(package: &str, forbidden: &[&str]) {
    let crates = linked(package);
    assert!(
        crates.contains(package),
        "cargo tree lists {package} itself: {crates:?}"
    );
    let found: Vec<&&str> = forbidden.iter().filter(|c| crates.contains(**c)).collect();
    assert!(found.is_empty(), "{package} must not link {found:?}");
}

#[test]
fn the_core_links_no_runtime_git_database_http_kubernetes_template_engine_or_thread_pool() {
    check(
        "flotilla-core",
        &[
            "tokio",
            "axum",
            "hyper",
            "git2",
            "sqlx",
            "kube",
            "reqwest",
            "notify",
            "minijinja",
            "rayon",
            "object_store",
            // Signatures in the core are pure Rust (ed25519-dalek): no C or assembly
            // crypto in the crate every other one links.
            "ring",
            "aws-lc-rs",
            "openssl",
        ],
    );
}

#[test]
fn the_renderer_links_no_runtime_git_database_http_or_kubernetes() {
    check(
        "flotilla-render",
        &[
            "tokio",
            "axum",
            "hyper",
            "git2",
            "sqlx",
            "kube",
            "reqwest",
            "notify",
            "object_store",
        ],
    );
}

#[test]
fn the_agent_links_nothing_of_the_hub_the_renderer_or_git() {
    check(
        "flotilla-agent",
        &[
            "git2",
            "sqlx",
            "minijinja",
            "axum",
            "axum-server",
            "rayon",
            "notify",
            "similar",
            "indicatif",
            "flotilla-render",
            "flotilla-hub",
            "object_store",
        ],
    );
}

#[test]
fn one_rustls_crypto_provider_in_the_whole_graph() {
    // With two providers compiled in, rustls cannot pick one by itself and a client
    // that does not install one panics at its first TLS connection.
    let crates = linked("flotilla");
    assert!(crates.contains("ring"), "{crates:?}");
    assert!(
        !crates.contains("aws-lc-rs"),
        "aws-lc-rs is back in the graph"
    );
}
