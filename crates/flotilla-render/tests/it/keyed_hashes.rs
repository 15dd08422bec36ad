//! Hashes published over values decrypted from SOPS files are keyed: kustomize's
//! `secretGenerator` name suffix and Helm's `sha256sum` (a `checksum/secret`
//! annotation) are HMACs under a key derived from the file's data key, so a reader
//! of the bundle cannot test a guess of the values; hashes over anything else stay
//! exactly kustomize's and Helm's.

use std::sync::Arc;

use flotilla_core::snapshot::FleetSnapshot;
use flotilla_render::seal::AgentKey;
use flotilla_render::sops::{DecryptionKeys, SopsKeys, SopsWriter};
use flotilla_render::{RenderOptions, RenderOutput, render_with};
use serde_json::{Value, json};

const HEADER: &str = "apiVersion: flotilla.dev/v1alpha1\n";
const PASSWORD: &str = "correct-horse-battery-staple";

/// An age identity (its file's text) and its recipient.
fn identity() -> (String, AgentKey) {
    use age::secrecy::ExposeSecret as _;
    let identity = age::x25519::Identity::generate();
    let recipient = AgentKey::parse(&identity.to_public().to_string()).expect("a recipient");
    (identity.to_string().expose_secret().to_string(), recipient)
}

/// The fleet rendered with `identity` as the hub's key, clean or not.
fn render_any(files: &[(String, String)], identity: &str) -> RenderOutput {
    let keys = DecryptionKeys::from_identity_file(identity).expect("a key");
    let options = RenderOptions {
        sops: SopsKeys::Open(Arc::new(keys)),
        ..RenderOptions::default()
    };
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    render_with(&snapshot, &options)
}

fn render(files: &[(String, String)], identity: &str) -> RenderOutput {
    let output = render_any(files, identity);
    assert!(
        output.is_clean(),
        "{:?}",
        output.errors().collect::<Vec<_>>()
    );
    output
}

fn fleet(workload: &str, extra: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut files = vec![
        (
            "clusters/shop.yaml".to_string(),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: shop\n"),
        ),
        (format!("workloads/{workload}/workload.yaml"), String::new()),
    ];
    files.extend(extra);
    files
}

/// The one resource of `kind` in cluster `shop`'s bundle.
fn resource(output: &RenderOutput, kind: &str) -> Value {
    let bundle = &output.bundles["shop"];
    let found: Vec<Value> = bundle
        .resources
        .iter()
        .filter(|r| r.key.kind() == kind)
        .map(|r| r.value())
        .collect();
    assert_eq!(found.len(), 1, "{kind}: {found:?}");
    found[0].clone()
}

fn kustomize_fleet(creds: String) -> Vec<(String, String)> {
    let mut files = fleet(
        "pos",
        vec![
            (
                "workloads/pos/kustomization.yaml".to_string(),
                "namespace: pos\nresources: [deployment.yaml]\nsecretGenerator:\n  - name: creds\n    files: [creds.yaml]\n".to_string(),
            ),
            (
                "workloads/pos/deployment.yaml".to_string(),
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: pos\nspec:\n  template:\n    spec:\n      volumes:\n        - name: creds\n          secret:\n            secretName: creds\n".to_string(),
            ),
            ("workloads/pos/creds.yaml".to_string(), creds),
        ],
    );
    files[1].1 = format!(
        "{HEADER}kind: Workload\nmetadata:\n  name: pos\nspec:\n  namespace: pos\n  targets:\n    - clusterSelector: {{}}\n"
    );
    files
}

#[test]
fn a_secret_generated_from_a_sops_file_gets_a_keyed_name_suffix() {
    let (identity_text, recipient) = identity();
    let document = json!({"stringData": {"password": PASSWORD}});
    let sops = |seed: u8| {
        SopsWriter::new([seed; 32], 1_700_000_000)
            .encrypt(&document, &recipient, "creds")
            .expect("encrypts")
    };
    let opened = render(&kustomize_fleet(sops(1)), &identity_text);
    let secret = resource(&opened, "Secret");
    let name = secret["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    assert!(
        name.starts_with("creds-") && name.len() == "creds-".len() + 10,
        "{name}"
    );
    // The Deployment refers to the suffixed name, as kustomize does.
    assert_eq!(
        resource(&opened, "Deployment")["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        name.as_str()
    );
    assert!(
        opened
            .sops_files
            .contains(&"workloads/pos/creds.yaml".to_string())
    );

    // The same file's decrypted text committed in plain gets kustomize's own hash:
    // another suffix, over the very same data.
    let plain_text = {
        // kustomize writes base64 in lines of 70 characters.
        let data = secret["data"]["creds.yaml"]
            .as_str()
            .expect("data")
            .replace('\n', "");
        use base64::Engine as _;
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .expect("base64"),
        )
        .expect("text")
    };
    assert!(plain_text.contains(PASSWORD), "{plain_text}");
    let plain = render(&kustomize_fleet(plain_text), &identity_text);
    let plain_secret = resource(&plain, "Secret");
    assert_eq!(plain_secret["data"], secret["data"]);
    let plain_name = plain_secret["metadata"]["name"].as_str().expect("a name");
    assert_ne!(plain_name, name, "a keyed suffix differs from kustomize's");
    assert!(plain.sops_files.is_empty());

    // Stable: the same file renders the same name; the same values encrypted anew
    // (a new data key) give a new one.
    let again = render(&kustomize_fleet(sops(1)), &identity_text);
    assert_eq!(
        resource(&again, "Secret")["metadata"]["name"],
        name.as_str()
    );
    let reencrypted = render(&kustomize_fleet(sops(2)), &identity_text);
    assert_ne!(
        resource(&reencrypted, "Secret")["metadata"]["name"],
        name.as_str()
    );
}

fn helm_fleet(values: String) -> Vec<(String, String)> {
    let mut files = fleet(
        "web",
        vec![
            (
                "charts/web/Chart.yaml".to_string(),
                "apiVersion: v2\nname: web\nversion: 1.0.0\n".to_string(),
            ),
            (
                "charts/web/values.yaml".to_string(),
                "password: \"\"\nlevel: info\n".to_string(),
            ),
            (
                "charts/web/templates/secret.yaml".to_string(),
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: web\ndata:\n  password: {{ .Values.password | b64enc }}\n".to_string(),
            ),
            (
                "charts/web/templates/configmap.yaml".to_string(),
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  level: {{ .Values.level }}\n".to_string(),
            ),
            (
                "charts/web/templates/deployment.yaml".to_string(),
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  template:\n    metadata:\n      annotations:\n        checksum/secret: {{ include (print $.Template.BasePath \"/secret.yaml\") . | sha256sum }}\n        checksum/config: {{ include (print $.Template.BasePath \"/configmap.yaml\") . | sha256sum }}\n".to_string(),
            ),
            ("workloads/web/secrets.yaml".to_string(), values),
        ],
    );
    files[1].1 = format!(
        "{HEADER}kind: Workload\nmetadata:\n  name: web\nspec:\n  namespace: web\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: ../../charts/web\n    valuesFiles: [secrets.yaml]\n"
    );
    files
}

/// In a release whose values hold a decrypted value, every `sha256sum` is keyed (the
/// Secret's checksum and the ConfigMap's alike); with the same values in a plain
/// file, both are Helm's.
#[test]
fn helm_sha256sum_in_a_release_with_sops_values_is_keyed_and_elsewhere_is_helms() {
    use sha2::Digest as _;
    let (identity_text, recipient) = identity();
    let values = json!({"password": PASSWORD});
    let sops = |seed: u8| {
        SopsWriter::new([seed; 32], 1_700_000_000)
            .encrypt_also(&values, &recipient, "values", &["password".to_string()])
            .expect("encrypts")
    };
    let checksums = |output: &RenderOutput| {
        let annotations =
            resource(output, "Deployment")["spec"]["template"]["metadata"]["annotations"].clone();
        (
            annotations["checksum/secret"]
                .as_str()
                .expect("a checksum")
                .to_string(),
            annotations["checksum/config"]
                .as_str()
                .expect("a checksum")
                .to_string(),
        )
    };
    let secret_text = |password: &str| {
        use base64::Engine as _;
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: web\ndata:\n  password: {}\n",
            base64::engine::general_purpose::STANDARD.encode(password)
        )
    };
    let hex = |text: &str| {
        sha2::Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let config =
        hex("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web\ndata:\n  level: info\n");

    let opened = render(&helm_fleet(sops(1)), &identity_text);
    let (secret_sum, config_sum) = checksums(&opened);
    // Helm's own digest of the Secret's text would let a reader test a guess of the
    // password: it is not what is written.
    assert_ne!(secret_sum, hex(&secret_text(PASSWORD)));
    assert_eq!(secret_sum.len(), 64);
    assert_ne!(
        config_sum, config,
        "a release whose values hold a decrypted value keys every digest"
    );
    assert_eq!(config_sum.len(), 64);
    assert!(
        !resource(&opened, "Deployment")
            .to_string()
            .contains(PASSWORD)
    );

    // The same values in a plain file: Helm's digests exactly.
    let plain = render(
        &helm_fleet(format!("password: {PASSWORD}\n")),
        &identity_text,
    );
    assert_eq!(
        checksums(&plain),
        (hex(&secret_text(PASSWORD)), config.clone())
    );

    // Stable for the same file; a changed password changes it.
    assert_eq!(
        checksums(&render(&helm_fleet(sops(1)), &identity_text)).0,
        secret_sum
    );
    let changed = SopsWriter::new([1; 32], 1_700_000_000)
        .encrypt_also(
            &json!({"password": "another-long-password"}),
            &recipient,
            "values",
            &["password".to_string()],
        )
        .expect("encrypts");
    assert_ne!(
        checksums(&render(&helm_fleet(changed), &identity_text)).0,
        secret_sum
    );
}

/// A tenant's chart hashes over its own decrypted values and the platform's only:
/// `sha256sum` of a text holding another tenant's value is Helm's plain digest, so
/// that whether a digest comes out keyed tells the tenant nothing of another's
/// values (a guess hashed in its own chart would otherwise say, by the form of its
/// digest, whether it was right).
#[test]
fn a_tenants_sha256sum_is_not_keyed_by_another_tenants_values() {
    use sha2::Digest as _;
    let (identity_text, recipient) = identity();
    let files = two_tenants(
        &recipient,
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: guess\ndata:\n  digest: {{{{ sha256sum \"{PASSWORD}\" }}}}\n"
        ),
    );
    let output = render(&files, &identity_text);
    let guessed = output.bundles["shop"]
        .resources
        .iter()
        .find(|r| r.key.kind() == "ConfigMap" && r.key.name() == "guess")
        .map(|r| r.value())
        .expect("the guess");
    let plain: String = sha2::Sha256::digest(PASSWORD.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(guessed["data"]["digest"], plain.as_str());
    // team-a's own checksum over its value stays keyed.
    let annotations = resource_named(&output, "Deployment", "web")["spec"]["template"]["metadata"]
        ["annotations"]
        .clone();
    let secret_text = {
        use base64::Engine as _;
        format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: web\ndata:\n  password: {}\n",
            base64::engine::general_purpose::STANDARD.encode(PASSWORD)
        )
    };
    let helms: String = sha2::Sha256::digest(secret_text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let keyed = annotations["checksum/secret"].as_str().expect("a checksum");
    assert_eq!(keyed.len(), 64);
    assert_ne!(keyed, helms);
}

fn resource_named(output: &RenderOutput, kind: &str, name: &str) -> Value {
    output.bundles["shop"]
        .resources
        .iter()
        .find(|r| r.key.kind() == kind && r.key.name() == name)
        .map(|r| r.value())
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// A render error that quotes a value decrypted from a SOPS file (a chart's `fail`
/// here; Helm's and Go's own messages quote what they stumble on too) holds the
/// words `(a decrypted value)` where the value was: the hub keeps render errors and
/// shows them on its page.
#[test]
fn a_render_error_never_quotes_a_decrypted_value() {
    let (identity_text, recipient) = identity();
    let mut files = helm_fleet(sops_password(&recipient));
    files.push((
        "charts/web/templates/check.yaml".to_string(),
        "{{ fail (printf \"the password %s is too weak\" .Values.password) }}\n".to_string(),
    ));
    let output = render_any(&files, &identity_text);
    let errors: Vec<String> = output.errors().map(ToString::to_string).collect();
    assert!(!errors.is_empty(), "the chart fails");
    assert!(errors.iter().all(|e| !e.contains(PASSWORD)), "{errors:#?}");
    assert!(
        errors
            .iter()
            .any(|e| e.contains("the password (a decrypted value) is too weak")),
        "{errors:#?}"
    );
}

/// The values file `{"password": PASSWORD}`, its password encrypted to `recipient`.
fn sops_password(recipient: &AgentKey) -> String {
    SopsWriter::new([1; 32], 1_700_000_000)
        .encrypt_also(
            &json!({"password": PASSWORD}),
            recipient,
            "values",
            &["password".to_string()],
        )
        .expect("encrypts")
}

/// Sprig's other digests (`sha1sum`, `sha512sum`, `adler32sum`) in a release whose
/// values hold a decrypted value are keyed too, each in its own form (40 and 128
/// hexadecimal digits, a decimal number); with the values in a plain file they are
/// Sprig's.
#[test]
fn helms_other_digests_in_a_release_with_sops_values_are_keyed_and_elsewhere_are_sprigs() {
    use sha2::Digest as _;
    let (identity_text, recipient) = identity();
    let template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: digests\ndata:\n  sha1: {{ .Values.password | sha1sum | quote }}\n  sha512: {{ .Values.password | sha512sum | quote }}\n  adler32: {{ .Values.password | adler32sum | quote }}\n  plain: {{ \"level\" | sha1sum | quote }}\n";
    let with_template = |values: String| {
        let mut files = helm_fleet(values);
        files.push((
            "charts/web/templates/digests.yaml".to_string(),
            template.to_string(),
        ));
        files
    };
    let digests = |output: &RenderOutput| {
        let data = resource_named(output, "ConfigMap", "digests")["data"].clone();
        ["sha1", "sha512", "adler32", "plain"]
            .map(|k| data[k].as_str().expect("a digest").to_string())
    };
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let sprig = [
        hex(&sha1::Sha1::digest(PASSWORD.as_bytes())),
        hex(&sha2::Sha512::digest(PASSWORD.as_bytes())),
    ];
    let plain = digests(&render(
        &with_template(format!("password: {PASSWORD}\n")),
        &identity_text,
    ));
    assert_eq!(plain[..2], sprig, "Sprig's digests of a plain value");
    let opened = digests(&render(
        &with_template(sops_password(&recipient)),
        &identity_text,
    ));
    assert_ne!(opened[0], sprig[0]);
    assert_ne!(opened[1], sprig[1]);
    assert_ne!(opened[2], plain[2]);
    assert_eq!((opened[0].len(), opened[1].len()), (40, 128));
    assert!(opened[2].parse::<u32>().is_ok(), "{}", opened[2]);
    assert_ne!(
        opened[3], plain[3],
        "a release whose values hold a decrypted value keys every digest"
    );
    assert_eq!(opened[3].len(), 40);
}

/// A template can change a decrypted value before it hashes it: escape it (`quote`,
/// `toJson`, which writes `<`, `>` and `&` as `\u003c`…), join it to a user name and
/// encode the pair (basic authentication), encode it twice, change its case. None
/// of those texts holds the value as it was decrypted, and each digest would let a
/// reader test a guess of it: all are keyed, as every digest of a release whose
/// values hold a decrypted value is. The same chart with the values in a plain file
/// writes Sprig's digests, and another release in the same fleet whose values hold
/// no decrypted value does too.
#[test]
fn digests_of_transformed_decrypted_values_are_keyed() {
    use sha2::Digest as _;
    const TRICKY: &str = "pa\"ss<word>&more";
    let (identity_text, recipient) = identity();
    let transforms = [
        ("quoted", "{{ .Values.password | quote | sha256sum }}"),
        (
            "json",
            "{{ dict \"p\" .Values.password | toJson | sha256sum }}",
        ),
        (
            "basic",
            "{{ printf \"admin:%s\" .Values.password | b64enc | sha256sum }}",
        ),
        (
            "twice",
            "{{ .Values.password | b64enc | b64enc | sha256sum }}",
        ),
        ("upper", "{{ .Values.password | upper | sha256sum }}"),
    ];
    let template = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: digests\ndata:\n{}",
        transforms
            .iter()
            .map(|(key, expression)| format!("  {key}: {expression}\n"))
            .collect::<String>()
    );
    let with_template = |values: String| {
        let mut files = helm_fleet(values);
        files.push((
            "charts/web/templates/digests.yaml".to_string(),
            template.clone(),
        ));
        // A second workload of the same chart, its values plain and without secrets.
        files.push((
            "workloads/other/workload.yaml".to_string(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: other\nspec:\n  namespace: other\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: ../../charts/web\n    values:\n      password: not-a-secret-at-all\n"
            ),
        ));
        files
    };
    let digests = |output: &RenderOutput, namespace: &str| -> Vec<String> {
        let found = output.bundles["shop"]
            .resources
            .iter()
            .find(|r| {
                r.key.kind() == "ConfigMap"
                    && r.key.name() == "digests"
                    && r.key.namespace() == namespace
            })
            .map(|r| r.value())
            .expect("the digests");
        transforms
            .iter()
            .map(|(key, _)| found["data"][key].as_str().expect("a digest").to_string())
            .collect()
    };
    let sops = SopsWriter::new([1; 32], 1_700_000_000)
        .encrypt_also(
            &json!({"password": TRICKY}),
            &recipient,
            "values",
            &["password".to_string()],
        )
        .expect("encrypts");
    let plain_values = serde_json::to_string(&json!({"password": TRICKY})).expect("json");
    let plain = render(&with_template(plain_values), &identity_text);
    let opened = render(&with_template(sops.clone()), &identity_text);
    let sprig = digests(&plain, "web");
    // Sprig's digests of the plain file's texts, worked out here: what a reader
    // could test guesses against.
    let hex = |text: &str| {
        sha2::Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    use base64::Engine as _;
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    assert_eq!(
        sprig,
        [
            hex("\"pa\\\"ss<word>&more\""),
            hex("{\"p\":\"pa\\\"ss\\u003cword\\u003e\\u0026more\"}"),
            hex(&b64(&format!("admin:{TRICKY}"))),
            hex(&b64(&b64(TRICKY))),
            hex(&TRICKY.to_uppercase()),
        ]
    );
    let keyed = digests(&opened, "web");
    for ((key, _), (keyed, sprig)) in transforms.iter().zip(keyed.iter().zip(&sprig)) {
        assert_ne!(keyed, sprig, "{key}: a plain digest of a decrypted value");
        assert_eq!(keyed.len(), 64, "{key}");
    }
    // The same on every render.
    assert_eq!(
        digests(&render(&with_template(sops), &identity_text), "web"),
        keyed
    );
    // The other workload's release holds no decrypted value: Sprig's digests.
    let other = digests(&opened, "other");
    assert_eq!(other, digests(&plain, "other"));
    assert_eq!(other[4], hex("NOT-A-SECRET-AT-ALL"));
}

/// The file of the tenant `name` with `spec` (its lines, indented).
fn tenant(name: &str, spec: &str) -> (String, String) {
    (
        format!("tenants/{name}.yaml"),
        format!("{HEADER}kind: Tenant\nmetadata:\n  name: {name}\nspec:\n{spec}"),
    )
}

/// team-a's `web` (the chart reading the SOPS values file) and team-b's `guess`,
/// whose chart has one template, `guess`.
fn two_tenants(recipient: &AgentKey, guess: &str) -> Vec<(String, String)> {
    let mut files = helm_fleet(sops_password(recipient));
    files.extend([
        tenant(
            "team-a",
            "  workloads: [web]\n  namespaces: [web]\n  sharedPaths: [\"charts/web/**\"]\n",
        ),
        tenant("team-b", "  workloads: [guess]\n  namespaces: [guess]\n"),
        (
            "workloads/guess/workload.yaml".to_string(),
            format!(
                "{HEADER}kind: Workload\nmetadata:\n  name: guess\nspec:\n  namespace: guess\n  targets:\n    - clusterSelector: {{}}\n  helm:\n    chart: chart\n"
            ),
        ),
        (
            "workloads/guess/chart/Chart.yaml".to_string(),
            "apiVersion: v2\nname: guess\nversion: 1.0.0\n".to_string(),
        ),
        (
            "workloads/guess/chart/templates/guess.yaml".to_string(),
            guess.to_string(),
        ),
    ]);
    files
}

/// A message of a tenant's own template that holds another tenant's value (a guess
/// it wrote) keeps it: that it was taken out would tell the tenant it was right.
#[test]
fn a_tenants_own_messages_are_not_scrubbed_of_another_tenants_values() {
    let (identity_text, recipient) = identity();
    let files = two_tenants(
        &recipient,
        &format!("{{{{ fail \"is it {PASSWORD}?\" }}}}\n"),
    );
    let output = render_any(&files, &identity_text);
    let errors: Vec<String> = output.errors().map(ToString::to_string).collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains(&format!("is it {PASSWORD}?"))),
        "{errors:#?}"
    );
}

/// Releases filled in from a stencil (clusters whose values differ only in strings)
/// key their digests as releases rendered on their own do: the same bundles either
/// way, with the stencil taken.
#[test]
fn a_stencils_digests_are_keyed_as_a_release_of_its_own() {
    let (identity_text, recipient) = identity();
    let clusters = ["alpha", "bravo", "charlie"];
    let mut files = helm_fleet(sops_password(&recipient));
    files.retain(|(path, _)| !path.starts_with("clusters/"));
    files.push((
        "charts/web/templates/site.yaml".to_string(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: site\ndata:\n  site: {{ .Values.site | quote }}\n  joined: {{ printf \"%s:%s\" .Values.site .Values.password | sha256sum }}\n  alone: {{ .Values.site | sha256sum }}\n".to_string(),
    ));
    for name in clusters {
        files.push((
            format!("clusters/{name}.yaml"),
            format!("{HEADER}kind: Cluster\nmetadata:\n  name: {name}\n"),
        ));
        files.push((
            format!("overlays/{name}.yaml"),
            format!(
                "{HEADER}kind: Overlay\nmetadata:\n  name: {name}\nspec:\n  clusters: [{name}]\n  helmValues:\n    site: shop-{name}\n"
            ),
        ));
    }
    let keys = DecryptionKeys::from_identity_file(&identity_text).expect("a key");
    let snapshot = FleetSnapshot::from_files(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let render = |stencils: bool| {
        let output = render_with(
            &snapshot,
            &RenderOptions {
                sops: SopsKeys::Open(Arc::new(keys.clone())),
                helm_without_stencils: !stencils,
                ..RenderOptions::default()
            },
        );
        assert!(
            output.is_clean(),
            "{:?}",
            output.errors().collect::<Vec<_>>()
        );
        output
    };
    let (with, without) = (render(true), render(false));
    assert!(with.helm_stencil_releases > 0, "the stencil was taken");
    for name in clusters {
        assert_eq!(
            with.bundles[name].digest, without.bundles[name].digest,
            "{name}"
        );
        let site = with.bundles[name]
            .resources
            .iter()
            .find(|r| r.key.kind() == "ConfigMap" && r.key.name() == "site")
            .map(|r| r.value())
            .expect("the site");
        let alone = site["data"]["alone"].as_str().expect("a digest");
        assert_ne!(alone, sha256_hex(&format!("shop-{name}")), "{name}");
        assert_eq!(alone.len(), 64);
    }
}

/// SHA-256 in lower-case hexadecimal.
fn sha256_hex(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fleet whose workload `pos` is the kustomization `kustomization` (its text)
/// with `files` beside it.
fn kustomization_fleet(kustomization: String, files: Vec<(&str, String)>) -> Vec<(String, String)> {
    let mut extra = vec![(
        "workloads/pos/kustomization.yaml".to_string(),
        kustomization,
    )];
    extra.extend(
        files
            .into_iter()
            .map(|(name, text)| (format!("workloads/pos/{name}"), text)),
    );
    let mut files = fleet("pos", extra);
    files[1].1 = format!(
        "{HEADER}kind: Workload\nmetadata:\n  name: pos\nspec:\n  namespace: pos\n  targets:\n    - clusterSelector: {{}}\n"
    );
    files
}

/// The generated Secret's name, and its data.
fn generated(output: &RenderOutput) -> (String, Value) {
    let secret = resource(output, "Secret");
    (
        secret["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string(),
        secret["data"].clone(),
    )
}

/// A generated Secret's name suffix is keyed whenever a decrypted value went into
/// its data: literals written in a SOPS-encrypted kustomization, and a patch read
/// from a SOPS file (`patches:` and `patchesStrategicMerge:`) that sets its data
/// after it was generated. The same files in plain give kustomize's own suffix
/// over the same data; a plain patch of another object leaves it as kustomize's.
#[test]
fn generated_names_are_keyed_when_a_patch_or_literal_was_decrypted() {
    let (identity_text, recipient) = identity();
    let open = |files: &[(String, String)]| generated(&render(files, &identity_text));

    // Literals in the kustomization itself.
    let kustomization = json!({
        "namespace": "pos",
        "secretGenerator": [{"name": "creds", "literals": [format!("password={PASSWORD}")]}],
    });
    let encrypted = SopsWriter::new([3; 32], 1_700_000_000)
        .encrypt_also(
            &kustomization,
            &recipient,
            "kustomization",
            &["literals".to_string()],
        )
        .expect("encrypts");
    assert!(!encrypted.contains(PASSWORD));
    let plain_text = serde_json::to_string(&kustomization).expect("json");
    let (keyed_name, keyed_data) = open(&kustomization_fleet(encrypted, vec![]));
    let (plain_name, plain_data) = open(&kustomization_fleet(plain_text, vec![]));
    assert_eq!(keyed_data, plain_data);
    assert!(keyed_name.starts_with("creds-") && keyed_name.len() == plain_name.len());
    assert_ne!(keyed_name, plain_name, "literals of a SOPS kustomization");

    // The same literals in a generator's configuration read from a SOPS file.
    let config = json!({
        "apiVersion": "builtin",
        "kind": "SecretGenerator",
        "metadata": {"name": "creds"},
        "literals": [format!("password={PASSWORD}")],
    });
    let sops_config = SopsWriter::new([6; 32], 1_700_000_000)
        .encrypt_also(&config, &recipient, "generator", &["literals".to_string()])
        .expect("encrypts");
    let with = |config: String| {
        kustomization_fleet(
            "namespace: pos\ngenerators: [generator.yaml]\n".to_string(),
            vec![("generator.yaml", config)],
        )
    };
    let (keyed_name, keyed_data) = open(&with(sops_config));
    let (plain_name, plain_data) = open(&with(serde_json::to_string(&config).expect("json")));
    assert_eq!(keyed_data, plain_data);
    assert_ne!(
        keyed_name, plain_name,
        "a generator configured in a SOPS file"
    );

    // A patch from a SOPS file sets the generated Secret's data.
    let patch = json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "creds"},
        "stringData": {"password": PASSWORD},
    });
    let sops_patch = SopsWriter::new([4; 32], 1_700_000_000)
        .encrypt(&patch, &recipient, "patch")
        .expect("encrypts");
    let plain_patch = serde_json::to_string(&patch).expect("json");
    for field in [
        "patches:\n  - path: patch.yaml\n",
        "patchesStrategicMerge: [patch.yaml]\n",
    ] {
        let with = |patch: &str| {
            kustomization_fleet(
                format!(
                    "namespace: pos\nsecretGenerator:\n  - name: creds\n    literals: [user=admin]\n{field}"
                ),
                vec![("patch.yaml", patch.to_string())],
            )
        };
        let (keyed_name, keyed_data) = open(&with(&sops_patch));
        let (plain_name, plain_data) = open(&with(&plain_patch));
        assert_eq!(keyed_data, plain_data, "{field}");
        assert_ne!(keyed_name, plain_name, "{field}: a patch from a SOPS file");
    }

    // The same patch applied by a PatchTransformer configured in a plain file.
    let with = |patch: &str| {
        kustomization_fleet(
            "namespace: pos\nsecretGenerator:\n  - name: creds\n    literals: [user=admin]\ntransformers: [transformer.yaml]\n".to_string(),
            vec![
                (
                    "transformer.yaml",
                    "apiVersion: builtin\nkind: PatchTransformer\nmetadata:\n  name: set-password\npath: patch.yaml\n".to_string(),
                ),
                ("patch.yaml", patch.to_string()),
            ],
        )
    };
    let (keyed_name, keyed_data) = open(&with(&sops_patch));
    let (plain_name, plain_data) = open(&with(&plain_patch));
    assert_eq!(keyed_data, plain_data);
    assert_ne!(keyed_name, plain_name, "a PatchTransformer's patch file");

    // A SOPS patch of another object leaves the generated name as kustomize's.
    let other = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "other"},
        "data": {"a": PASSWORD},
    });
    let with = |patch: String| {
        kustomization_fleet(
            "namespace: pos\nresources: [other.yaml]\nsecretGenerator:\n  - name: creds\n    literals: [user=admin]\npatches:\n  - path: patch.yaml\n".to_string(),
            vec![
                ("other.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: other\ndata:\n  a: b\n".to_string()),
                ("patch.yaml", patch),
            ],
        )
    };
    let sops_other = SopsWriter::new([5; 32], 1_700_000_000)
        .encrypt_also(&other, &recipient, "other", &["a".to_string()])
        .expect("encrypts");
    assert_eq!(
        open(&with(sops_other)),
        open(&with(serde_json::to_string(&other).expect("json")))
    );
}

/// What a tenant's kustomizations make is keyed only by SOPS files that tenant may
/// read: a generator configured by a folder it builds (whose files flotilla cannot
/// follow one by one) is keyed with every SOPS file of the tenant's own fence, not
/// with another tenant's, so that another tenant encrypting its file anew does not
/// rename (and roll) this tenant's objects.
#[test]
fn another_tenants_sops_files_never_key_a_tenants_generated_names() {
    let (identity_text, recipient) = identity();
    let with_password = |seed: u8| {
        let mut files = helm_fleet(
            SopsWriter::new([seed; 32], 1_700_000_000)
                .encrypt_also(
                    &json!({"password": PASSWORD}),
                    &recipient,
                    "values",
                    &["password".to_string()],
                )
                .expect("encrypts"),
        );
        files.extend([
            tenant(
                "team-a",
                "  workloads: [web]\n  namespaces: [web]\n  sharedPaths: [\"charts/web/**\"]\n",
            ),
            tenant("team-b", "  workloads: [pos]\n  namespaces: [pos]\n"),
            (
                "workloads/pos/workload.yaml".to_string(),
                format!(
                    "{HEADER}kind: Workload\nmetadata:\n  name: pos\nspec:\n  namespace: pos\n  targets:\n    - clusterSelector: {{}}\n"
                ),
            ),
            (
                "workloads/pos/kustomization.yaml".to_string(),
                "namespace: pos\ngenerators: [gen]\n".to_string(),
            ),
            (
                "workloads/pos/gen/kustomization.yaml".to_string(),
                "resources: [config.yaml]\n".to_string(),
            ),
            (
                "workloads/pos/gen/config.yaml".to_string(),
                "apiVersion: builtin\nkind: SecretGenerator\nmetadata:\n  name: creds\nliterals: [user=admin]\n".to_string(),
            ),
        ]);
        files
    };
    let name = |seed: u8| {
        render(&with_password(seed), &identity_text).bundles["shop"]
            .resources
            .iter()
            .find(|r| r.key.kind() == "Secret" && r.key.namespace() == "pos")
            .map(|r| r.key.name().to_string())
            .expect("team-b's Secret")
    };
    let first = name(1);
    assert!(first.starts_with("creds-"), "{first}");
    assert_eq!(
        name(2),
        first,
        "team-a's file encrypted anew renames nothing of team-b's"
    );
}

/// A chart's own SOPS file, read with `.Files.Get` and changed before it is hashed,
/// keys every digest of the chart's releases too.
#[test]
fn a_charts_own_sops_file_keys_its_digests() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let (identity_text, recipient) = identity();
    let creds = json!({"stringData": {"password": PASSWORD}});
    let mut files = helm_fleet("password: \"\"\n".to_string());
    files.push((
        "charts/web/files/creds.yaml".to_string(),
        SopsWriter::new([7; 32], 1_700_000_000)
            .encrypt(&creds, &recipient, "creds")
            .expect("encrypts"),
    ));
    files.push((
        "charts/web/templates/digests.yaml".to_string(),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: digests\ndata:\n  twice: {{ .Files.Get \"files/creds.yaml\" | b64enc | b64enc | sha256sum }}\n".to_string(),
    ));
    // The file's text as the chart reads it, in a Secret (no agent key here).
    files.push((
        "charts/web/templates/file.yaml".to_string(),
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: file\ndata:\n  file: {{ .Files.Get \"files/creds.yaml\" | b64enc }}\n".to_string(),
    ));
    let opened = render(&files, &identity_text);
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let read = resource_named(&opened, "Secret", "file")["data"]["file"]
        .as_str()
        .expect("the file")
        .to_string();
    let read = base64::engine::general_purpose::STANDARD
        .decode(read)
        .expect("base64");
    assert!(String::from_utf8_lossy(&read).contains(PASSWORD));
    // Sprig's digest of the decrypted file encoded twice: what a reader could test
    // guesses against.
    let sprig: String = sha2::Sha256::digest(b64(b64(&read).as_bytes()).as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let keyed = resource_named(&opened, "ConfigMap", "digests")["data"]["twice"]
        .as_str()
        .expect("a digest")
        .to_string();
    assert_eq!(keyed.len(), 64);
    assert_ne!(keyed, sprig, "a plain digest of a decrypted file");
}
