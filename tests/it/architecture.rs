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
fn the_oci_client_links_nothing_of_the_hub_the_renderer_git_or_kubernetes() {
    check(
        "flotilla-oci",
        &[
            "git2",
            "sqlx",
            "minijinja",
            "axum",
            "rayon",
            "kube",
            "k8s-openapi",
            "object_store",
            "flotilla-render",
            "flotilla-hub",
            "flotilla-agent",
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

// The module rules below read the sources: each is a rule the compiler does not keep
// by itself, stated in ARCHITECTURE.md as an "Architecture Invariant".

/// Every Rust file under `dir` (relative to the workspace root), with its text.
fn sources(dir: &str) -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut pending = vec![root.join(dir)];
    while let Some(folder) = pending.pop() {
        let entries = std::fs::read_dir(&folder).expect("a source folder");
        for entry in entries {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                let relative = path
                    .strip_prefix(root)
                    .expect("under the root")
                    .to_string_lossy()
                    .replace('\\', "/");
                found.push((relative, text));
            }
        }
    }
    found.sort();
    found
}

/// The files among `dirs` whose code names `needle`, except those `allowed` (a path
/// prefix) — comments are not code.
fn files_naming(dirs: &[&str], needle: &regex::Regex, allowed: &[&str]) -> Vec<String> {
    dirs.iter()
        .flat_map(|dir| sources(dir))
        .filter(|(path, _)| !allowed.iter().any(|a| path.starts_with(a)))
        .filter(|(_, text)| {
            text.lines()
                .map(str::trim_start)
                .filter(|line| !line.starts_with("//"))
                .any(|line| needle.is_match(line))
        })
        .map(|(path, _)| path)
        .collect()
}

const EVERY_CRATE: [&str; 7] = [
    "src",
    "crates/flotilla-core/src",
    "crates/flotilla-render/src",
    "crates/flotilla-hub/src",
    "crates/flotilla-agent/src",
    "crates/flotilla-fs/src",
    "crates/flotilla-oci/src",
];

#[test]
fn git2_is_named_only_under_the_hubs_source_module() {
    let git2 = regex::Regex::new(r"\bgit2::").expect("a pattern");
    let found = files_naming(&EVERY_CRATE, &git2, &["crates/flotilla-hub/src/source/"]);
    assert!(found.is_empty(), "git2 named outside source/: {found:?}");
}

#[test]
fn only_the_recorder_writes_the_hubs_store() {
    // The recorder owns the store; everyone else reads through the view's
    // `StoreReads`, which has no writing method. The crate root opens the store and
    // hands it to the recorder (and writes the first heartbeat, before the recorder
    // exists).
    let store = regex::Regex::new(r"(^|[^:\w])Store\b|store::Store\b|store::\{[^}]*\bStore\b")
        .expect("a pattern");
    let found = files_naming(
        &["crates/flotilla-hub/src"],
        &store,
        &[
            "crates/flotilla-hub/src/recorder/",
            "crates/flotilla-hub/src/store/",
            "crates/flotilla-hub/src/lib.rs",
        ],
    );
    assert!(
        found.is_empty(),
        "the hub's store named outside the recorder: {found:?}"
    );
}

#[test]
fn the_renderer_reads_no_wall_clock_and_no_operating_system_randomness() {
    // `Instant` (deadlines) does not reach any output; these would.
    let clock_or_chance = regex::Regex::new(
        r"\bSystemTime\b|\brand::|\bOsRng\b|\bgetrandom\b|\bthread_rng\b|\brandom\(\)|\bchrono::(Utc|Local)::now|\bUNIX_EPOCH\b",
    )
    .expect("a pattern");
    let found = files_naming(
        &["crates/flotilla-render/src", "crates/flotilla-core/src"],
        &clock_or_chance,
        &[],
    );
    assert!(
        found.is_empty(),
        "a clock or randomness in the renderer or the core: {found:?}"
    );
}

#[test]
fn kube_rs_is_named_only_in_the_agents_kube_sink() {
    // `crate::sink::kube` is the sink's own module, not the kube crate.
    let kube = regex::Regex::new(r"(^|[^:\w])kube::").expect("a pattern");
    let found = files_naming(
        &EVERY_CRATE,
        &kube,
        &[
            "crates/flotilla-agent/src/sink/kube/",
            // Declares the module `kube` and refers to it.
            "crates/flotilla-agent/src/sink/mod.rs",
        ],
    );
    assert!(
        found.is_empty(),
        "kube-rs named outside the kube sink: {found:?}"
    );
}

#[test]
fn anyhow_is_used_only_at_the_binaries_edges() {
    let anyhow = regex::Regex::new(r"\banyhow\b").expect("a pattern");
    let found = files_naming(
        &EVERY_CRATE,
        &anyhow,
        &[
            "src/",
            // The agent binary's command line and logging set-up.
            "crates/flotilla-agent/src/cli.rs",
            "crates/flotilla-agent/src/logging.rs",
            "crates/flotilla-agent/src/main.rs",
        ],
    );
    assert!(found.is_empty(), "anyhow in a library module: {found:?}");
}

#[test]
fn axums_server_side_is_named_only_by_the_hubs_http_modules() {
    let axum = regex::Regex::new(r"\baxum(_server)?::").expect("a pattern");
    let hub_http = [
        "crates/flotilla-hub/src/api.rs",
        "crates/flotilla-hub/src/ui/",
        "crates/flotilla-hub/src/listen.rs",
        "crates/flotilla-hub/src/lib.rs",
        "crates/flotilla-hub/src/tls.rs",
    ];
    let found: Vec<String> = files_naming(&EVERY_CRATE, &axum, &hub_http)
        .into_iter()
        // The agent's client tests run a small axum server as the hub's stand-in.
        .filter(|path| !is_test_only_use(path, "axum"))
        .collect();
    assert!(
        found.is_empty(),
        "axum named outside the hub's HTTP modules: {found:?}"
    );
}

/// Whether every use of `name` in a file is inside its `#[cfg(test)]` module (the
/// module starts at the file's first `#[cfg(test)]` line, by this project's layout).
fn is_test_only_use(path: &str, name: &str) -> bool {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join(path)).expect("a source file");
    let tests_start = text.find("#[cfg(test)]").unwrap_or(text.len());
    !text[..tests_start].contains(name)
}

/// What request handlers may ask of the view: every one of these reads.
const VIEW_READS: [&str; 19] = [
    "served",
    "served_to",
    "generations",
    "tokens",
    "is_ready",
    "render_status",
    "install_failing",
    "latest",
    "statuses",
    "active_rollouts",
    "rendered_workloads",
    "rollouts_superseded",
    "rollout_decisions",
    "reads",
    "with_fleet",
    "fleet_summary",
    "fleet_counts",
    "fleet_summary_of",
    "new",
];

#[test]
fn handlers_never_write_the_view() {
    // The view's methods other than its reads are visible to the recorder alone, so
    // a handler (api, ui, metrics, fleet) that tried to write would not compile.
    let (_, view) = sources("crates/flotilla-hub/src/recorder")
        .into_iter()
        .find(|(path, _)| path.ends_with("recorder/view.rs"))
        .expect("recorder/view.rs");
    let impl_start = view.find("\nimpl View {").expect("impl View");
    let body = &view[impl_start..];
    let body = &body[..body.find("\n}\n").expect("the end of impl View")];
    let method = regex::Regex::new(r"(?m)^    (pub(\([^)]*\))? )?fn (\w+)").expect("a pattern");
    let mut methods = 0;
    for captures in method.captures_iter(body) {
        methods += 1;
        let name = &captures[3];
        let visibility = captures.get(1).map_or("", |m| m.as_str().trim());
        if VIEW_READS.contains(&name) {
            continue;
        }
        assert_eq!(
            visibility, "pub(in crate::recorder)",
            "View::{name} changes the view and must be visible to the recorder alone"
        );
    }
    assert!(
        methods > VIEW_READS.len(),
        "found only {methods} methods of View"
    );
    // And handlers call the view's reads only.
    let call = regex::Regex::new(r"\.view\s*\.(\w+)\(").expect("a pattern");
    for dir in ["crates/flotilla-hub/src/ui"] {
        for (path, text) in sources(dir) {
            check_view_calls(&path, &text, &call);
        }
    }
    for (path, text) in sources("crates/flotilla-hub/src") {
        if path.ends_with("/api.rs") || path.ends_with("/metrics.rs") || path.ends_with("/fleet.rs")
        {
            check_view_calls(&path, &text, &call);
        }
    }
}

fn check_view_calls(path: &str, text: &str, call: &regex::Regex) {
    for captures in call.captures_iter(text) {
        assert!(
            VIEW_READS.contains(&&captures[1]),
            "{path} calls View::{} (handlers only read the view)",
            &captures[1]
        );
    }
}

/// Every "Architecture Invariant" line of ARCHITECTURE.md names the test that checks
/// it, and that test exists.
#[test]
fn every_architecture_invariant_names_a_test_that_exists() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let document = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let reference = regex::Regex::new(r"\(checked by `([^`:]+)::(\w+)`\)").expect("a pattern");
    let mut invariants = 0;
    for line in document
        .lines()
        .filter(|l| l.contains("**Architecture Invariant:**"))
    {
        invariants += 1;
        let captures = reference
            .captures(line)
            .unwrap_or_else(|| panic!("an invariant names no test: {line}"));
        let file = root.join(&captures[1]);
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e} (named by ARCHITECTURE.md)", &captures[1]));
        assert!(
            text.contains(&format!("fn {}(", &captures[2])),
            "{} has no test {} (named by ARCHITECTURE.md)",
            &captures[1],
            &captures[2]
        );
    }
    assert!(
        invariants >= 5,
        "ARCHITECTURE.md states {invariants} invariants"
    );
}
