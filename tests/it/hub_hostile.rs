//! A hub following a repository into which hostile commits land one after another
//! (issue: hostile input): each is refused with an error naming its file while the
//! last good bundles stay served, `/healthz` answers within a second throughout, and
//! the commit that fixes the fleet is followed. And SIGTERM ends `flotilla serve`
//! within seconds even in the middle of a render.

use crate::support::hub as hub_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hub_common::*;
use serde_json::{Value, json};

/// The clusters and their served digests, from `/v1/fleet`.
fn digests(fleet: &Value) -> Vec<(String, String)> {
    fleet["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().expect("name").to_string(),
                c["desired"].as_str().expect("digest").to_string(),
            )
        })
        .collect()
}

/// Puts the work tree and index back to `commit`, so the next change starts clean.
fn reset_to(repo: &Repo, commit: &str) {
    repo.git(&["rm", "-r", "-q", "--ignore-unmatch", "."]);
    repo.git(&["checkout", commit, "--", "."]);
}

/// An overlay on every ConfigMap with these RFC 6902 operations.
fn patch_overlay(name: &str, ops: &[Value]) -> String {
    let mut text = format!(
        "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: {name}\nspec:\n  clusterSelector: {{}}\n  patches:\n    - target: {{kind: ConfigMap}}\n      ops:\n"
    );
    for op in ops {
        text.push_str(&format!("        - {op}\n"));
    }
    text
}

/// A workload on every cluster whose manifests are the given files.
fn workload(repo: &Repo, name: &str, manifests: &[(&str, &str)]) {
    repo.write(
        &format!("workloads/{name}/workload.yaml"),
        &format!(
            "apiVersion: flotilla.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: {name}\nspec:\n  namespace: {name}\n  targets:\n    - clusterSelector: {{}}\n"
        ),
    );
    for (file, text) in manifests {
        repo.write(&format!("workloads/{name}/manifests/{file}"), text);
    }
}

/// Commits the tree of `base` with `extra` (path → blob or tree id) added under the
/// root, through git2, on top of HEAD: for trees no work tree could hold.
fn commit_tree(repo: &Repo, base: &str, extra: &[(&str, git2::Oid, i32)], message: &str) -> String {
    let git = git2::Repository::open(repo.path()).expect("open");
    let base_tree = git
        .find_commit(git2::Oid::from_str(base).expect("oid"))
        .expect("base commit")
        .tree()
        .expect("tree");
    let mut root = git.treebuilder(Some(&base_tree)).expect("builder");
    for (name, id, mode) in extra {
        root.insert(name, *id, *mode).expect("insert");
    }
    let root = git
        .find_tree(root.write().expect("root"))
        .expect("root tree");
    let head = git.head().expect("head").peel_to_commit().expect("commit");
    let signature = git2::Signature::now("flotilla tests", "tests@flotilla.invalid").expect("sig");
    let id = git
        .commit(
            Some("HEAD"),
            &signature,
            &signature,
            message,
            &root,
            &[&head],
        )
        .expect("commit");
    id.to_string()
}

/// `overlays/` of `base` with `name → tree` added.
fn overlays_with(repo: &Repo, base: &str, name: &str, tree: git2::Oid) -> git2::Oid {
    let git = git2::Repository::open(repo.path()).expect("open");
    let base_tree = git
        .find_commit(git2::Oid::from_str(base).expect("oid"))
        .expect("commit")
        .tree()
        .expect("tree");
    let overlays = base_tree.get_name("overlays").expect("overlays").id();
    let mut builder = git
        .treebuilder(Some(&git.find_tree(overlays).expect("tree")))
        .expect("builder");
    builder.insert(name, tree, 0o040000).expect("insert");
    builder.write().expect("overlays")
}

/// A commit whose overlay file sits 4,000 folders deep (its name is not valid, so
/// the commit is refused, naming that file).
fn deep_tree_commit(repo: &Repo, base: &str) -> String {
    let git = git2::Repository::open(repo.path()).expect("open");
    let overlay = "apiVersion: flotilla.dev/v1alpha1\nkind: Overlay\nmetadata:\n  name: Deep Overlay\nspec:\n  clusterSelector: {}\n  labels: {a: b}\n";
    let blob = git.blob(overlay.as_bytes()).expect("blob");
    let mut builder = git.treebuilder(None).expect("builder");
    builder.insert("deep.yaml", blob, 0o100644).expect("insert");
    let mut tree = builder.write().expect("tree");
    for _ in 0..3999 {
        let mut builder = git.treebuilder(None).expect("builder");
        builder.insert("d", tree, 0o040000).expect("insert");
        tree = builder.write().expect("tree");
    }
    let overlays = overlays_with(repo, base, "d", tree);
    commit_tree(
        repo,
        base,
        &[("overlays", overlays, 0o040000)],
        "4,000 folders deep",
    )
}

/// A commit with 400 paths to one 4 MB blob under `overlays/shared/`.
fn shared_blob_commit(repo: &Repo, base: &str) -> String {
    let git = git2::Repository::open(repo.path()).expect("open");
    let mut content = String::from("# one of 400 paths to the same blob\n");
    content.push_str(&"#".repeat(4_000_000 - content.len() - 1));
    content.push('\n');
    let blob = git.blob(content.as_bytes()).expect("blob");
    let mut builder = git.treebuilder(None).expect("builder");
    for index in 0..400 {
        builder
            .insert(format!("f{index:03}.yaml"), blob, 0o100644)
            .expect("insert");
    }
    let shared = builder.write().expect("tree");
    let overlays = overlays_with(repo, base, "shared", shared);
    commit_tree(
        repo,
        base,
        &[("overlays", overlays, 0o040000)],
        "400 paths, one blob",
    )
}

/// Asks for `/healthz` every 20 ms until stopped; returns the slowest answer and
/// how many were asked, failing on any answer that is not 200.
fn probe_health(base: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<(Duration, usize)> {
    tokio::spawn(async move {
        let client = client();
        let mut slowest = Duration::ZERO;
        let mut count = 0;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let response = client
                .get(format!("{base}/healthz"))
                .send()
                .await
                .expect("the hub answers /healthz");
            assert_eq!(response.status(), 200);
            slowest = slowest.max(started.elapsed());
            count += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (slowest, count)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_commits_are_refused_one_by_one_and_the_fix_is_followed() {
    let repo = Repo::new();
    let good = repo.git(&["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    // Short enough that the slow commit below passes it by far in a debug build, and
    // resources small enough that a debug build checks the growing patch below well
    // within that.
    config.limits.render_timeout = Duration::from_secs(3);
    config.limits.max_resource_bytes = 256 * 1024;
    // Rendered as `flotilla serve` renders: in a child process with a memory limit.
    config.render_worker = Some(flotilla_hub::render_worker::RenderWorker {
        program: env!("CARGO_BIN_EXE_flotilla").into(),
        memory_limit: Some(512 * 1024 * 1024),
    });
    let hub = Running::start_ready(config).await;
    let client = client();
    let fleet_url = hub.url("/v1/fleet");
    let before = get_json(&client, &fleet_url, &admin).await;
    assert_eq!(before["revision"], format!("main@sha1:{good}"));
    let stop_probe = Arc::new(AtomicBool::new(false));
    let probe = probe_health(hub.base.clone(), stop_probe.clone());

    let doubling: Vec<Value> = std::iter::once(json!({"op": "add", "path": "/n", "value": {}}))
        .chain((0..12).map(
            |round| json!({"op": "copy", "from": "/n", "path": "/n".repeat(2usize.pow(round) + 1)}),
        ))
        .collect();
    let copies: Vec<Value> = (0..40)
        .map(|i| json!({"op": "copy", "from": "", "path": format!("/c{i}")}))
        .collect();
    let slow_template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slow-{{ n }}\ndata:\n  n: \"{% for i in range(100000) %}{% if i < 0 %}{{ i }}{% endif %}{% endfor %}{{ cluster.name }}\"\n";
    // (what the commit is, the file the error names, what the error says)
    type Change = Box<dyn Fn(&Repo) -> String>;
    let cases: Vec<(&str, Change, &str, &str)> = vec![
        (
            "a patch that doubles the nesting twelve times",
            Box::new(move |repo| {
                repo.write("overlays/deep.yaml", &patch_overlay("deep", &doubling));
                repo.commit("deep")
            }),
            "overlays/deep.yaml",
            "the result would nest arrays and objects deeper than 100 levels",
        ),
        (
            "forty copies of a resource into itself",
            Box::new(move |repo| {
                repo.write("overlays/grow.yaml", &patch_overlay("grow", &copies));
                repo.commit("grow")
            }),
            "overlays/grow.yaml",
            "the result would be larger than 262144 bytes as JSON",
        ),
        (
            "a template that never ends",
            Box::new(|repo| {
                workload(
                    repo,
                    "spin",
                    &[(
                        "spin.yaml.j2",
                        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                    )],
                );
                repo.commit("spin")
            }),
            "workloads/spin/manifests/spin.yaml.j2",
            "fuel for this cluster (one for each instruction and each 64 bytes it builds or writes), the limit for one template (--template-fuel)",
        ),
        (
            "a template that writes gigabytes",
            Box::new(|repo| {
                workload(
                    repo,
                    "bomb",
                    &[(
                        "bomb.yaml.j2",
                        "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
                    )],
                );
                repo.commit("bomb")
            }),
            "workloads/bomb/manifests/bomb.yaml.j2",
            "the template writes more than 4194304 bytes for this cluster",
        ),
        (
            "a template that doubles a string until memory runs out",
            Box::new(|repo| {
                workload(
                    repo,
                    "double",
                    &[(
                        "double.yaml.j2",
                        "{% set a = 'x' * 100000000 %}{% for i in range(40) %}{% set a = a ~ a %}{% endfor %}{{ a | length }}",
                    )],
                );
                repo.commit("double")
            }),
            // Refused before the string is built: fuel pays for data too.
            "workloads/double/manifests/double.yaml.j2",
            "the template needs more than 1000000 fuel for this cluster",
        ),
        (
            "templates that together write more than the render's memory",
            Box::new(|repo| {
                // 200 templates of 4 MB each: every one within its fuel and output
                // cap, 800 MB for one cluster's texts together.
                let files: Vec<(String, &str)> = (0..200)
                    .map(|n| (format!("big-{n}.yaml.j2"), "{{ 'x' * 4000000 }}"))
                    .collect();
                let files: Vec<(&str, &str)> =
                    files.iter().map(|(f, t)| (f.as_str(), *t)).collect();
                workload(repo, "big", &files);
                repo.commit("big")
            }),
            // Only the process knows where it was; the error names no file.
            "",
            "the render of this commit needed more than 512 MiB of memory (--render-memory) and was stopped",
        ),
        (
            "a template that doubles a list 30 times",
            Box::new(|repo| {
                // minijinja alone keeps `l + l` lazy and free, and indexing from the
                // end walked 17 billion items until the deadline: flotilla's `+`
                // charges fuel for every item it joins, and refuses the 15th doubling.
                workload(
                    repo,
                    "lists",
                    &[(
                        "lists.yaml.j2",
                        &format!(
                            "{{% set l = ['aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'] * 16 %}}\n{}{{{{ l[-1] }}}}",
                            "{% set l = l + l %}\n".repeat(30)
                        ),
                    )],
                );
                repo.commit("lists")
            }),
            "workloads/lists/manifests/lists.yaml.j2",
            "the template needs more than 1000000 fuel for this cluster",
        ),
        (
            "a tree 4,000 folders deep",
            Box::new({
                // On the good commit's tree, not HEAD's (the previous hostile commit,
                // which would fail the render before this one's error is reached).
                let good = good.clone();
                move |repo| deep_tree_commit(repo, &good)
            }),
            "overlays/d/d/d/",
            "metadata.name \"Deep Overlay\" is not a valid overlay name",
        ),
        (
            "400 paths to one 4 MB blob",
            Box::new({
                let good = good.clone();
                move |repo| shared_blob_commit(repo, &good)
            }),
            "overlays/shared/f067.yaml",
            "the fleet's files come to more than 268435456 bytes (--max-fleet-bytes",
        ),
        (
            "a cluster defined twice",
            Box::new(|repo| {
                repo.write("clusters/red.yml", &repo.read("clusters/red.yaml"));
                repo.commit("red twice")
            }),
            "clusters/red.yml",
            "cluster \"red\" is defined twice: here and in clusters/red.yaml",
        ),
        (
            "a name that would break out of the dir sink's comment",
            Box::new(|repo| {
                workload(
                    repo,
                    "planted",
                    &[(
                        "cm.yaml",
                        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: \"innocent\\n---\\napiVersion: v1\\nkind: Secret\\nmetadata:\\n  name: planted\\n  namespace: kube-system\\n\"\n",
                    )],
                );
                repo.commit("planted")
            }),
            "workloads/planted/manifests/cm.yaml",
            "is not a valid name for a ConfigMap",
        ),
        (
            "a render slower than the deadline",
            Box::new(move |repo| {
                let files: Vec<(String, String)> = (0..40)
                    .map(|n| {
                        (
                            format!("slow-{n}.yaml.j2"),
                            slow_template.replace("{{ n }}", &n.to_string()),
                        )
                    })
                    .collect();
                let files: Vec<(&str, &str)> = files
                    .iter()
                    .map(|(f, t)| (f.as_str(), t.as_str()))
                    .collect();
                workload(repo, "slow", &files);
                repo.commit("slow")
            }),
            "workloads/slow/manifests/slow-",
            "the render took longer than 3s (--render-timeout) and was abandoned",
        ),
    ];

    for (what, change, file, says) in &cases {
        reset_to(&repo, &good);
        let commit = change(&repo);
        let fleet = eventually(what, Duration::from_secs(60), || {
            let (client, url, admin, commit) = (&client, &fleet_url, &admin, &commit);
            async move {
                let fleet = get_json(client, url, admin).await;
                (fleet["attemptedRevision"] == format!("main@sha1:{commit}")).then_some(fleet)
            }
        })
        .await;
        assert_eq!(fleet["revision"], format!("main@sha1:{good}"), "{what}");
        assert_eq!(
            digests(&fleet),
            digests(&before),
            "{what}: every cluster keeps its bundle"
        );
        let errors = fleet["renderErrors"].as_array().expect("errors");
        assert!(
            errors
                .iter()
                .any(|e| e["file"].as_str().unwrap_or("").starts_with(file)
                    && e["text"].as_str().is_some_and(|t| t.contains(says))),
            "{what}: an error in {file} saying {says:?}: {errors:#?}"
        );
    }

    // The fix: the fleet as it was, with one real change, is followed at once.
    reset_to(&repo, &good);
    let text = repo
        .read("overlays/sites/store-us-002-big-cache.yaml")
        .replace("value: 200Gi", "value: 300Gi");
    repo.write("overlays/sites/store-us-002-big-cache.yaml", &text);
    let fixed = repo.commit("the fix");
    let fleet = eventually("the fix to be served", Duration::from_secs(30), || {
        let (client, url, admin, fixed) = (&client, &fleet_url, &admin, &fixed);
        async move {
            let fleet = get_json(client, url, admin).await;
            (fleet["revision"] == format!("main@sha1:{fixed}")).then_some(fleet)
        }
    })
    .await;
    assert_eq!(fleet["renderErrors"].as_array().map(Vec::len), Some(0));
    let changed: Vec<String> = digests(&fleet)
        .into_iter()
        .zip(digests(&before))
        .filter(|(after, before)| after != before)
        .map(|(after, _)| after.0)
        .collect();
    assert_eq!(changed, ["store-us-002"]);

    stop_probe.store(true, Ordering::Relaxed);
    let (slowest, count) = probe.await.expect("the probe ran");
    eprintln!("/healthz: slowest answer {slowest:?} of {count}");
    assert!(count > 20, "the probe asked {count} times");
    // A render blocking the threads that answer would hold /healthz for as long as a
    // render runs (up to the 3 s --render-timeout here); a second tells that apart
    // from a busy machine's scheduling (101 ms was seen on a loaded CI run).
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz took {slowest:?} at its slowest while hostile commits rendered"
    );
    hub.stop().await;
}

/// SIGTERM in the middle of a long render ends `flotilla serve` within seconds: the
/// render runs off the async runtime and the hub does not wait for it.
#[test]
fn sigterm_ends_the_hub_within_seconds_even_mid_render() {
    let repo = Repo::new();
    let slow = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: slow-{{ n }}\ndata:\n  n: \"{% for i in range(100000) %}{% if i < 0 %}{{ i }}{% endif %}{% endfor %}{{ cluster.name }}\"\n";
    let files: Vec<(String, String)> = (0..100)
        .map(|n| {
            (
                format!("slow-{n}.yaml.j2"),
                slow.replace("{{ n }}", &n.to_string()),
            )
        })
        .collect();
    let files: Vec<(&str, &str)> = files
        .iter()
        .map(|(f, t)| (f.as_str(), t.as_str()))
        .collect();
    workload(&repo, "slow", &files);
    repo.commit("a render that takes minutes");
    let state = tempfile::tempdir().expect("state dir");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--render-timeout",
            "10m",
            "--repo",
        ])
        .arg(repo.path())
        .arg("--state-dir")
        .arg(state.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("flotilla serve starts");
    // Wait until the render has started: the marker file says so.
    let marker = state.path().join("render-in-progress.json");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the render never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().expect("wait").is_none(), "the hub runs");
    assert!(marker.exists(), "the render is still in progress");
    // The render runs in a child process of the hub's.
    let workers = children_of(child.id());
    assert_eq!(workers.len(), 1, "one render process: {workers:?}");
    let signalled = Instant::now();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(5),
            "the hub did not stop within 5 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the hub stops cleanly: {status}");
    // And it does not outlive the hub.
    let worker = std::path::PathBuf::from(format!("/proc/{}", workers[0]));
    while worker.exists() {
        assert!(
            signalled.elapsed() < Duration::from_secs(5),
            "the render process outlived the hub"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !marker.exists(),
        "a deliberate stop is no crash: the next start renders the commit again"
    );
}

/// The processes whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc") {
        let entry = entry.expect("entry");
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …: comm may hold spaces, so read after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest.split_whitespace().nth(1);
        if ppid == Some(pid.to_string().as_str())
            && let Ok(child) = entry.file_name().to_string_lossy().parse()
        {
            children.push(child);
        }
    }
    children
}

/// A commit the hub died on twice (a marker left behind by two starts that never
/// finished rendering it) is not rendered a third time: a commit that kills the hub
/// cannot hold it in a crash loop. Once is forgiven: a hub killed by an operator
/// renders the commit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_the_hub_died_on_twice_is_not_rendered_again() {
    let repo = Repo::new();
    let head = repo.git(&["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let marker = state.path().join("render-in-progress.json");
    let revision = format!("main@sha1:{head}");
    std::fs::write(
        &marker,
        json!({"source": revision, "attempts": 2}).to_string(),
    )
    .expect("write the marker");
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    let client = client();
    let fleet = eventually("the commit to be refused", Duration::from_secs(30), || {
        let (client, url, admin, revision) = (&client, hub.url("/v1/fleet"), &admin, &revision);
        async move {
            let fleet = get_json(client, &url, admin).await;
            (fleet["attemptedRevision"] == revision.as_str()).then_some(fleet)
        }
    })
    .await;
    assert_eq!(fleet["revision"], Value::Null, "nothing is served");
    assert_eq!(
        fleet["renderErrors"][0]["text"],
        "the hub stopped 2 times while rendering this commit (killed, out of memory or a crash), \
         so it is not rendered again; the last good bundles stay served: push a commit that \
         changes the fleet"
    );
    hub.stop().await;

    std::fs::write(
        &marker,
        json!({"source": revision, "attempts": 1}).to_string(),
    )
    .expect("write the marker");
    let hub = Running::start_ready(config(state.path(), &repo.path().display().to_string())).await;
    eventually("the commit to be served", Duration::from_secs(30), || {
        let (client, url, admin, revision) = (&client, hub.url("/v1/fleet"), &admin, &revision);
        async move {
            let fleet = get_json(client, &url, admin).await;
            (fleet["revision"] == revision.as_str()).then_some(())
        }
    })
    .await;
    assert!(!marker.exists(), "a finished render leaves no marker");
    hub.stop().await;
}

/// A hub killed while its render process renders a commit did not die of that
/// render (a render process cannot take the hub down: its memory is capped and its
/// crashes are reported as render errors), so however often that happens, the next
/// start renders the commit: an operator's or a reboot's kill -9 never strands a good
/// commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_killed_twice_while_its_render_process_renders_renders_the_commit_again() {
    let repo = Repo::new();
    let head = repo.git(&["rev-parse", "HEAD"]);
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let marker = state.path().join("render-in-progress.json");
    let revision = format!("main@sha1:{head}");
    // The marker of a commit rendered in a render process when the hub was killed, as
    // an earlier hub counted it after two kills.
    std::fs::write(
        &marker,
        json!({"source": revision, "attempts": 2, "in_child": true}).to_string(),
    )
    .expect("write the marker");
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.render_worker = Some(flotilla_hub::render_worker::RenderWorker {
        program: env!("CARGO_BIN_EXE_flotilla").into(),
        memory_limit: None,
    });
    let hub = Running::start_ready(config).await;
    let client = client();
    eventually("the commit to be served", Duration::from_secs(60), || {
        let (client, url, admin, revision) = (&client, hub.url("/v1/fleet"), &admin, &revision);
        async move {
            let fleet = get_json(client, &url, admin).await;
            (fleet["revision"] == revision.as_str()).then_some(())
        }
    })
    .await;
    assert!(!marker.exists(), "a finished render leaves no marker");
    hub.stop().await;
}

/// A render process that cannot be started (the binary replaced or removed under a
/// running hub) is a render error saying what to do, not a crash or "a flotilla bug".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_render_process_that_cannot_start_is_reported_with_what_to_do() {
    let repo = Repo::new();
    let state = tempfile::tempdir().expect("state dir");
    let admin = make_token(state.path(), None).await;
    let mut config = config(state.path(), &repo.path().display().to_string());
    config.render_worker = Some(flotilla_hub::render_worker::RenderWorker {
        program: state.path().join("no-such-flotilla"),
        memory_limit: None,
    });
    let hub = Running::start(config).await;
    let client = client();
    let url = hub.url("/v1/fleet");
    let text = eventually("the render error", Duration::from_secs(30), || {
        let (client, url, admin) = (&client, &url, &admin);
        async move {
            // 503 until the hub has loaded its (empty) store.
            let response = client
                .get(url.as_str())
                .bearer_auth(admin)
                .send()
                .await
                .ok()?;
            let fleet: serde_json::Value = response.json().await.ok()?;
            fleet["renderErrors"][0]["text"]
                .as_str()
                .map(str::to_string)
        }
    })
    .await;
    assert!(
        text.contains("cannot start the render process (")
            && text.contains("no-such-flotilla render-worker")
            && text.contains("restart the hub (was its binary replaced or removed?), or give it --render-in-process"),
        "{text}"
    );
    hub.stop().await;
}
