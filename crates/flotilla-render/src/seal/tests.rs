use super::*;

use std::str::FromStr as _;

const AGENT: &str = "AGE-SECRET-KEY-1SH36876FLEVRV2C9YN2PNR3JJQV0Z9TLDNL49D4QPZRD22V3EENQ55K5JP";
const OTHER: &str = "AGE-SECRET-KEY-1ET5NLF5AM389DNGX70MFFET2AYPTNMFH6R3SW2N5JDR82MHG853QCGLHTS";

fn identity(text: &str) -> age::x25519::Identity {
    age::x25519::Identity::from_str(text).expect("an identity")
}

fn key_of(text: &str) -> AgentKey {
    AgentKey::parse(&identity(text).to_public().to_string()).expect("a recipient")
}

/// Held by the tests that clear this process's headers or read them back, which
/// would otherwise race (the tests of one binary run on threads of one process).
static HEADER_MEMO: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn memo_held() -> std::sync::MutexGuard<'static, ()> {
    HEADER_MEMO.lock().unwrap_or_else(|e| e.into_inner())
}

fn open(identity_text: &str, sealed: &[u8]) -> Option<Vec<u8>> {
    age::decrypt(&identity(identity_text), sealed).ok()
}

#[test]
fn the_age_crate_opens_what_is_sealed_for_its_identity_only() {
    let sealer = Sealer::from_hub_seed(&[3; 32]);
    for size in [0, 1, 100, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK] {
        let plain: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let sealed = sealer.seal(&key_of(AGENT), "v1/Secret/shop/db", &plain);
        assert_eq!(
            open(AGENT, &sealed).as_deref(),
            Some(&plain[..]),
            "{size} bytes"
        );
        assert_eq!(open(OTHER, &sealed), None);
    }
}

#[test]
fn sealing_is_the_same_for_the_same_input_and_unrelated_otherwise() {
    let sealer = Sealer::from_hub_seed(&[3; 32]);
    let agent = key_of(AGENT);
    let once = sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2");
    assert_eq!(once, sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2"));
    let others = [
        sealer.seal(&agent, "v1/Secret/shop/db", b"hunter3"),
        sealer.seal(&agent, "v1/Secret/shop/cache", b"hunter2"),
        sealer.seal(&key_of(OTHER), "v1/Secret/shop/db", b"hunter2"),
        Sealer::from_hub_seed(&[4; 32]).seal(&agent, "v1/Secret/shop/db", b"hunter2"),
    ];
    let share = |f: &[u8]| f.split(|&b| b == b'\n').nth(1).map(<[u8]>::to_vec);
    let nonce = |f: &[u8]| {
        let end = f.windows(4).position(|w| w == b"\n---").expect("a header");
        let start = end
            + f[end + 1..]
                .iter()
                .position(|&b| b == b'\n')
                .expect("a MAC")
            + 2;
        f[start..start + 16].to_vec()
    };
    for (i, other) in others.iter().enumerate() {
        assert_ne!(&once, other);
        // The nonce never repeats, so neither does the payload's key.
        assert_ne!(nonce(&once), nonce(other), "{i}");
        // One agent's files share one header (one ephemeral share); another agent's
        // or another hub's do not.
        assert_eq!(share(&once) == share(other), i < 2, "{i}");
    }
}

#[test]
fn one_agents_secrets_share_its_header_and_each_opens_alone() {
    let sealer = Sealer::from_hub_seed(&[5; 32]);
    let agent = key_of(AGENT);
    let files: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            sealer.seal(
                &agent,
                &format!("v1/Secret/shop/s{i}"),
                format!("value {i}").as_bytes(),
            )
        })
        .collect();
    let header = |f: &[u8]| {
        let end = f.windows(4).position(|w| w == b"\n---").expect("a header");
        f[..end
            + 1
            + f[end + 1..]
                .iter()
                .position(|&b| b == b'\n')
                .expect("a MAC")]
            .to_vec()
    };
    for (i, file) in files.iter().enumerate() {
        assert_eq!(header(file), header(&files[0]));
        assert_eq!(open(AGENT, file), Some(format!("value {i}").into_bytes()));
        assert_eq!(open(OTHER, file), None);
    }
    // A header worked out afresh (the memo cleared) is the same bytes.
    let _held = memo_held();
    *HEADERS.write().unwrap_or_else(|e| e.into_inner()) = None;
    assert_eq!(
        sealer.seal(&agent, "v1/Secret/shop/s0", b"value 0"),
        files[0]
    );
}

#[test]
fn a_secret_is_sealed_whole_and_its_last_applied_annotation_removed() {
    let sealer = Sealer::from_hub_seed(&[3; 32]);
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "db", "namespace": "shop", "annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{\"stringData\":{\"password\":\"hunter2\"}}",
            "team": "pos"}},
        "type": "Opaque",
        "data": {"user": "YWRtaW4="},
        "stringData": {"password": "hunter2"}
    });
    let sealed =
        seal_secret(&secret, (&sealer, &key_of(AGENT)), "v1/Secret/shop/db").expect("sealed");
    let text = sealed.to_string();
    assert!(
        !text.contains("hunter2") && !text.contains("YWRtaW4="),
        "{text}"
    );
    assert!(sealed.get("data").is_none() && sealed.get("stringData").is_none());
    assert_eq!(
        sealed["metadata"]["annotations"],
        serde_json::json!({"team": "pos"})
    );
    assert_eq!(sealed["type"], "Opaque");
    let blob = STANDARD
        .decode(sealed[SEALED_FIELD]["sealed"].as_str().expect("a string"))
        .expect("base64");
    let plain: Value = serde_json::from_slice(&open(AGENT, &blob).expect("opens")).expect("JSON");
    assert_eq!(
        plain,
        serde_json::json!({"data": {"user": "YWRtaW4="}, "stringData": {"password": "hunter2"}})
    );
    let empty =
        serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "e"}});
    assert!(seal_secret(&empty, (&sealer, &key_of(AGENT)), "v1/Secret//e").is_none());
}

#[test]
fn agent_keys_are_read_as_age_prints_them() {
    let recipient = identity(AGENT).to_public().to_string();
    assert!(AgentKey::parse(&recipient).is_ok());
    assert!(AgentKey::parse(&recipient.replace("age1", "agx1")).is_err());
    assert!(AgentKey::parse("age1notakey").is_err());
    assert!(
        AgentKey::parse(AGENT).is_err(),
        "a secret key is not a public key"
    );
}

/// Two clusters, one with `spec.agentKey`, and a workload with a Secret for both.
fn fleet(agent_key: &str) -> flotilla_core::snapshot::FleetSnapshot {
    const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
    flotilla_core::snapshot::FleetSnapshot::from_files([
        (
            "clusters/keyed.yaml",
            &*format!(
                "{HEADER}kind: Cluster\nmetadata:\n  name: keyed\nspec:\n  agentKey: {agent_key}\n"
            ),
        ),
        (
            "clusters/plain.yaml",
            &*format!("{HEADER}kind: Cluster\nmetadata:\n  name: plain\nspec: {{}}\n"),
        ),
        (
            "workloads/db/workload.yaml",
            &*format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: db\nspec:\n  namespace: shop\n  targets:\n    - clusterSelector: {{}}\n"
            ),
        ),
        (
            "workloads/db/manifests/secret.yaml",
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: db\ndata:\n  host: db.local\n",
        ),
    ])
}

fn render(
    snapshot: &flotilla_core::snapshot::FleetSnapshot,
    seed: Option<[u8; 32]>,
) -> crate::RenderOutput {
    crate::render_with(
        snapshot,
        &crate::RenderOptions {
            helm_seed: seed,
            ..crate::RenderOptions::default()
        },
    )
}

fn secret_of(output: &crate::RenderOutput, cluster: &str) -> Value {
    output.bundles[cluster]
        .resources
        .iter()
        .map(|r| r.value())
        .find(|v| v["kind"] == "Secret")
        .expect("the Secret")
}

#[test]
fn the_hubs_render_seals_the_secrets_of_clusters_with_an_agent_key() {
    let recipient = identity(AGENT).to_public().to_string();
    let snapshot = fleet(&recipient);
    let output = render(&snapshot, Some([5; 32]));
    assert!(output.is_clean(), "{:?}", output.diagnostics);
    let keyed = secret_of(&output, "keyed");
    assert!(keyed.get("stringData").is_none(), "{keyed}");
    let blob = STANDARD
        .decode(keyed[SEALED_FIELD]["sealed"].as_str().expect("sealed"))
        .expect("base64");
    let plain: Value = serde_json::from_slice(&open(AGENT, &blob).expect("opens")).expect("JSON");
    assert_eq!(plain["stringData"]["password"], "hunter2");
    assert_eq!(
        secret_of(&output, "plain")["stringData"]["password"],
        "hunter2"
    );
    // The same commit renders the same digests; a changed value gives a new one.
    let again = render(&snapshot, Some([5; 32]));
    assert_eq!(
        output.bundles["keyed"].digest,
        again.bundles["keyed"].digest
    );
    let mut changed = snapshot.clone();
    changed.files.insert(
        "workloads/db/manifests/secret.yaml".into(),
        std::sync::Arc::from(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter3\n",
        ),
    );
    let after = render(&changed, Some([5; 32]));
    assert_ne!(
        output.bundles["keyed"].digest,
        after.bundles["keyed"].digest
    );
    // Without the hub's seed (a review), nothing is sealed.
    let review = render(&snapshot, None);
    assert_eq!(
        secret_of(&review, "keyed")["stringData"]["password"],
        "hunter2"
    );
}

#[test]
fn a_cluster_with_secrets_and_no_agent_key_is_warned_about_once() {
    let recipient = identity(AGENT).to_public().to_string();
    let output = render(&fleet(&recipient), Some([5; 32]));
    let warnings: Vec<_> = output
        .warnings()
        .filter(|d| d.message.contains("no spec.agentKey"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(
        warnings[0].file.as_deref(),
        Some("workloads/db/manifests/secret.yaml")
    );
    assert_eq!(warnings[0].cluster.as_deref(), Some("plain"));
    let mut required = fleet(&recipient);
    required.files.insert(
        "flotilla.yaml".into(),
        std::sync::Arc::from(
            "apiVersion: flotilla.dev/v1alpha1\nkind: FleetSettings\nspec:\n  requireAgentKeys: true\n",
        ),
    );
    let output = render(&required, Some([5; 32]));
    assert!(
        output
            .errors()
            .any(|d| d.message.contains("requireAgentKeys")),
        "{:?}",
        output.diagnostics
    );
}

#[test]
fn a_bad_agent_key_is_an_error_at_its_line() {
    let output = render(&fleet("age1notakey"), None);
    let error = output.errors().next().expect("an error");
    assert_eq!(error.file.as_deref(), Some("clusters/keyed.yaml"));
    assert_eq!(error.line, Some(6));
    assert!(
        error.message.starts_with("spec.agentKey:"),
        "{}",
        error.message
    );
}

#[test]
fn a_prepared_secret_seals_to_the_canonical_bytes_of_the_long_way() {
    let sealer = Sealer::from_hub_seed(&[6; 32]);
    let agent = key_of(AGENT);
    let secrets = [
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "namespace": "shop"},
            "type": "Opaque", "stringData": {"password": "hunter2"}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "tls", "namespace": "shop", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{}", "z": "\u{1}\"quoted\""}},
            "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}, "zzz": [1, {"a": null}]}),
        // The marker itself in the Secret: sealed the long way, to the same bytes.
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "odd", "labels": {"m": MARKER}},
            "stringData": {"k": MARKER}}),
        // Larger than the thread's kept buffer (several age chunks), then a small
        // one again in the same thread.
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "big", "namespace": "shop"},
            "stringData": {"blob": "b".repeat(3 * CHUNK)}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "small", "namespace": "shop"},
            "stringData": {"k": "v"}}),
    ];
    for (i, secret) in secrets.iter().enumerate() {
        let identity = format!("v1/Secret/shop/{i}");
        let prepared = sealer
            .prepare(secret, &identity)
            .expect("a Secret with values");
        assert_eq!(prepared.around.is_none(), i == 2, "{i}");
        let long_way = seal_secret(secret, (&sealer, &agent), &identity).expect("sealed");
        assert_eq!(
            sealer.seal_prepared(&prepared, &agent),
            flotilla_core::bundle::to_canonical_vec(&long_way),
            "{i}"
        );
    }
    let empty =
        serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "e"}});
    assert!(sealer.prepare(&empty, "v1/Secret//e").is_none());
}

#[test]
fn a_sealed_secret_is_kept_for_the_next_render_and_dropped_when_two_go_by_without_it() {
    let sealings = std::sync::Mutex::new(Sealings::new());
    let sealer = Sealer::from_hub_seed(&[6; 32]);
    let (agent, other) = (key_of(AGENT), key_of(OTHER));
    let secret = |password: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "db", "namespace": "shop"},
            "stringData": {"password": password}})
    };
    let key = Arc::new(flotilla_core::bundle::ResourceKey::new(
        "", "Secret", "shop", "db",
    ));
    let identity = key.to_string();
    let prepared = sealer
        .prepare(&secret("hunter2"), &identity)
        .expect("values");
    let seal = |prepared: &Prepared, recipient: &AgentKey| {
        sealer
            .sealed_resources_in(&sealings, &[(prepared, &key)], recipient)
            .remove(0)
    };
    let first = seal(&prepared, &agent);
    // What is kept is what sealing gives, and opens with the agent's identity.
    assert_eq!(
        &*first.canonical,
        &sealer.seal_prepared(&prepared, &agent)[..]
    );
    assert!(Arc::ptr_eq(&first, &seal(&prepared, &agent)));
    // The next render takes it as it is; the one after that too, since the render
    // between used it.
    for _ in 0..2 {
        sealings.lock().expect("not poisoned").next_render();
        assert!(Arc::ptr_eq(&first, &seal(&prepared, &agent)));
    }
    // Another agent, another value or another hub's sealer: sealed anew, to other bytes.
    let changed = sealer
        .prepare(&secret("hunter3"), &identity)
        .expect("values");
    let another_hub = Sealer::from_hub_seed(&[7; 32]);
    let elsewhere = another_hub
        .prepare(&secret("hunter2"), &identity)
        .expect("values");
    for sealed in [
        seal(&prepared, &other),
        seal(&changed, &agent),
        another_hub
            .sealed_resources_in(&sealings, &[(&elsewhere, &key)], &agent)
            .remove(0),
    ] {
        assert_ne!(sealed.canonical, first.canonical);
    }
    assert_eq!(sealings.lock().expect("not poisoned").len(), 4);
    let next_render = || sealings.lock().expect("not poisoned").next_render();
    // Renders that seal nothing drop nothing.
    for _ in 0..3 {
        next_render();
    }
    assert!(Arc::ptr_eq(&first, &seal(&prepared, &agent)));
    // Two renders that seal, but not it: dropped with what else they did not use,
    // and sealed again to the same bytes.
    for _ in 0..2 {
        next_render();
        seal(&changed, &agent);
    }
    assert_eq!(sealings.lock().expect("not poisoned").len(), 1);
    let again = seal(&prepared, &agent);
    assert!(!Arc::ptr_eq(&first, &again));
    assert_eq!(again.canonical, first.canonical);
}

#[test]
fn kept_headers_are_used_only_when_tagged_by_the_sealing_key_and_their_mac_verifies() {
    let _held = memo_held();
    let sealer = Sealer::from_hub_seed(&[5; 32]);
    let (agent, other) = (key_of(AGENT), key_of(OTHER));
    let first = sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2");
    sealer.seal(&other, "v1/Secret/shop/db", b"hunter2");
    let file = sealer.kept_headers();
    let entries = kept::parse(&file);
    assert_eq!(entries.len(), 2, "one header per recipient of this sealer");
    let (agent_key, _) = sealer.header_keys(&agent);
    let (other_key, _) = sealer.header_keys(&other);
    let entry = entries.get(&agent.0).expect("the agent's header");
    let header = &entry.1;
    assert!(
        first.starts_with(header),
        "the header every file of the agent starts with"
    );
    assert!(kept::verifies(header, &agent_key));
    assert!(sealer.verifies_offered(&agent.0, entry, &agent_key));
    // Not another recipient's, nor under another hub's sealing key.
    assert!(!kept::verifies(header, &other_key));
    assert!(!sealer.verifies_offered(&other.0, entry, &other_key));
    let foreign = Sealer::from_hub_seed(&[6; 32]);
    let (foreign_key, _) = foreign.header_keys(&agent);
    assert!(!kept::verifies(header, &foreign_key));
    assert!(!foreign.verifies_offered(&agent.0, entry, &foreign_key));
    // Any byte changed, or the MAC cut short, and it is not used.
    for at in [0, 30, header.len() / 2, header.len() - 5] {
        let mut damaged = header.clone();
        damaged[at] ^= 1;
        assert!(!kept::verifies(&damaged, &agent_key), "byte {at} changed");
        let tagged = (entry.0, damaged);
        assert!(!sealer.verifies_offered(&agent.0, &tagged, &agent_key));
    }
    assert!(!kept::verifies(&header[..header.len() - 4], &agent_key));
    // A file cut in its last entry keeps the entries before it; another file nothing.
    assert_eq!(kept::parse(&file[..file.len() - 10]).len(), 1);
    assert!(kept::parse(b"not a file of headers").is_empty());
}

/// `header` with its stanza's body replaced (and its MAC made again under
/// `file_key`): a header anyone who can open the file key could write.
fn another_body(header: &[u8], file_key: &[u8; 16]) -> Vec<u8> {
    let text = std::str::from_utf8(header).expect("text");
    let lines: Vec<&str> = text.lines().collect();
    let covered = format!("{}\n{}\n{}\n---", lines[0], lines[1], "A".repeat(43));
    kept::with_mac(covered.as_bytes(), file_key)
}

#[test]
fn a_process_offered_the_kept_headers_uses_them() {
    let _held = memo_held();
    // A seed no other test seals with: the header made here is no other's.
    let sealer = Sealer::from_hub_seed(&[11; 32]);
    let agent = key_of(AGENT);
    let sealed = sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2");
    let file = sealer.kept_headers();
    // A new process: no header in memory, the file offered; the same bytes.
    *HEADERS.write().unwrap_or_else(|e| e.into_inner()) = None;
    assert_eq!(offer_headers(&file), 1);
    assert_eq!(sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2"), sealed);
    // A header the file holds, tagged by the sealing key, is the one used: one made
    // different on purpose shows it.
    let (file_key, _) = sealer.header_keys(&agent);
    let header = &kept::parse(&file)[&agent.0].1;
    let different = another_body(header, &file_key);
    *HEADERS.write().unwrap_or_else(|e| e.into_inner()) = None;
    offer_headers(&sealer.file_of([(&agent.0, &different[..])]));
    assert!(
        sealer
            .seal(&agent, "v1/Secret/shop/db", b"hunter2")
            .starts_with(&different)
    );
    // The same header with a valid age MAC but tagged by another key (the agent can
    // open the file key, not make a tag) is not used.
    *HEADERS.write().unwrap_or_else(|e| e.into_inner()) = None;
    let foreign = Sealer::from_hub_seed(&[12; 32]);
    offer_headers(&foreign.file_of([(&agent.0, &different[..])]));
    assert_eq!(sealer.take_offered(&agent.0, &file_key), None);
    assert_eq!(sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2"), sealed);
    assert_eq!(open(AGENT, &sealed), Some(b"hunter2".to_vec()));
    *HEADERS.write().unwrap_or_else(|e| e.into_inner()) = None;
}

#[test]
fn the_kept_headers_keep_those_offered_and_not_used_yet() {
    let _held = memo_held();
    let sealer = Sealer::from_hub_seed(&[8; 32]);
    let (agent, other) = (key_of(AGENT), key_of(OTHER));
    sealer.seal(&agent, "v1/Secret/shop/db", b"a");
    sealer.seal(&other, "v1/Secret/shop/db", b"b");
    let file = sealer.kept_headers();
    // A new process renders one of the two clusters, and a third with a new key.
    *HEADERS.write().unwrap_or_else(|e| e.into_inner()) = None;
    offer_headers(&file);
    let third = AgentKey::parse(&age::x25519::Identity::generate().to_public().to_string())
        .expect("a recipient");
    sealer.seal(&agent, "v1/Secret/shop/db", b"a");
    sealer.seal(&third, "v1/Secret/shop/db", b"c");
    let kept = kept::parse(&sealer.kept_headers());
    let originally = kept::parse(&file);
    assert_eq!(
        kept.len(),
        3,
        "the one used, the one not used yet, the new one"
    );
    assert_eq!(kept.get(&other.0), originally.get(&other.0));
    assert_eq!(kept.get(&agent.0), originally.get(&agent.0));
    // Another hub's sealer keeps none of them.
    let foreign = Sealer::from_hub_seed(&[9; 32]);
    assert!(kept::parse(&foreign.kept_headers()).is_empty());
}

#[test]
fn agent_keys_read_on_the_fast_path_are_the_bech32_crates_and_the_rest_fall_back() {
    use rand_core::{RngCore as _, SeedableRng as _};
    let mut random = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for _ in 0..2_000 {
        let text = age::x25519::Identity::generate().to_public().to_string();
        let fast = AgentKey::parse_printed(text.as_bytes()).expect("age's own form");
        assert_eq!(Ok(AgentKey(fast)), AgentKey::parse_any(&text), "{text}");
        // One character changed: both refuse it (a Bech32 checksum catches it).
        let mut changed = text.clone().into_bytes();
        let at = 4 + random.next_u32() as usize % (changed.len() - 4);
        let was = changed[at];
        changed[at] = *BECH32_CHARSET.iter().find(|&&c| c != was).expect("another");
        let changed = String::from_utf8(changed).expect("ASCII");
        assert_eq!(
            AgentKey::parse_printed(changed.as_bytes()),
            None,
            "{changed}"
        );
        assert!(AgentKey::parse_any(&changed).is_err(), "{changed}");
    }
    // What the fast path leaves to the crate is still read: upper case, padding.
    let text = age::x25519::Identity::generate().to_public().to_string();
    let upper = text.to_uppercase();
    assert_eq!(AgentKey::parse_printed(upper.as_bytes()), None);
    assert_eq!(AgentKey::parse(&upper), AgentKey::parse(&text));
    assert_eq!(
        AgentKey::parse(&format!("  {text}\n")),
        AgentKey::parse(&text)
    );
}

/// What a reader of the store's seed could make of a sealed file with `sealer`'s
/// key: the file key that key derives for `agent`, and with it the payload opened
/// (one chunk), without the agent's private key.
fn open_with_derived_file_key(sealer: &Sealer, agent: &AgentKey, sealed: &[u8]) -> Option<Vec<u8>> {
    use ring::aead::{Aad, Nonce};
    let (file_key, _) = sealer.header_keys(agent);
    let mac_line = sealed.windows(4).position(|w| w == b"\n---")? + 1;
    let header_end = mac_line + sealed[mac_line..].iter().position(|&b| b == b'\n')? + 1;
    let nonce: [u8; 16] = sealed.get(header_end..header_end + 16)?.try_into().ok()?;
    let key = chacha20_poly1305_key(&hkdf_32(&nonce, &file_key, b"payload"));
    let mut body = sealed[header_end + 16..].to_vec();
    let mut chunk_nonce = [0u8; 12];
    chunk_nonce[11] = 1;
    key.open_in_place(
        Nonce::assume_unique_for_key(chunk_nonce),
        Aad::empty(),
        &mut body,
    )
    .ok()
    .map(|plain| plain.to_vec())
}

/// The store's seed alone opens no sealed value of a hub with a decryption identity:
/// the sealing key mixes in a secret derived from that identity. (Without one, the
/// fleet has no SOPS files, its Secrets are plain text in Git, and the seed's file
/// keys open their sealed copies: the helper below shows that it would open them.)
#[test]
fn the_stores_seed_alone_opens_no_sealed_value() {
    let seed = [13; 32];
    let agent = key_of(AGENT);
    let keys = crate::sops::DecryptionKeys::from_identity_file(OTHER).expect("an identity");
    let secret = keys.sealing_secret().expect("a secret");
    let sealer = Sealer::new(&seed, Some(&secret));
    let sealed = sealer.seal(&agent, "v1/Secret/shop/db", b"hunter2");
    assert_eq!(open(AGENT, &sealed).as_deref(), Some(&b"hunter2"[..]));
    assert_eq!(
        open_with_derived_file_key(&Sealer::from_hub_seed(&seed), &agent, &sealed),
        None,
        "the seed alone must not open it"
    );
    // The helper opens what the seed alone sealed, and what a key with the secret did.
    assert_eq!(
        open_with_derived_file_key(&sealer, &agent, &sealed).as_deref(),
        Some(&b"hunter2"[..])
    );
    let seed_only = Sealer::from_hub_seed(&seed).seal(&agent, "v1/Secret/shop/db", b"hunter2");
    assert_eq!(
        open_with_derived_file_key(&Sealer::from_hub_seed(&seed), &agent, &seed_only).as_deref(),
        Some(&b"hunter2"[..])
    );
    // The secret depends on the first identity only, and is the same every time.
    assert_eq!(
        crate::sops::DecryptionKeys::from_identity_file(OTHER)
            .expect("an identity")
            .sealing_secret(),
        Some(secret)
    );
    assert_ne!(
        crate::sops::DecryptionKeys::from_identity_file(AGENT)
            .expect("an identity")
            .sealing_secret(),
        Some(secret)
    );
    // Tenants' keys beside the platform's change nothing; without the platform's,
    // every tenant's key goes into it, so that no one tenant's derives it.
    let lines = |lines: &[String]| {
        crate::sops::DecryptionKeys::from_lines(lines)
            .expect("keys")
            .sealing_secret()
    };
    assert_eq!(
        lines(&[OTHER.to_string(), format!("@team-a {AGENT}")]),
        Some(secret)
    );
    let one_tenant = lines(&[format!("@team-a {AGENT}")]);
    let two_tenants = lines(&[format!("@team-a {AGENT}"), format!("@team-b {OTHER}")]);
    assert!(one_tenant.is_some() && two_tenants.is_some());
    assert_ne!(one_tenant, two_tenants);
    assert_ne!(two_tenants, Some(secret));
}
