//! The deployment files in `deploy/`, read into the Kubernetes types (no API server can
//! run here): images, probes, volumes, the agent's settings as its command line reads
//! them, and the agent's RBAC, which must grant what the kube sink uses, and no more.

use crate::support as agent_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use agent_support::bundle;
use agent_support::kube::*;
use clap::{Args, Command, Parser};
use flotilla_agent::cli::AgentArgs;
use flotilla_agent::sink::Sink;
use flotilla_core::status::ResourceState;
use flotilla_kube_fake::FakeApiServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Container, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The documents of a YAML file in `deploy/`.
fn documents(file: &str) -> Vec<Value> {
    let path = deploy_dir().join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// One document as its Kubernetes type. Written back, it must be the document again:
/// a misspelt or misplaced field would be lost on the way.
fn typed<T: DeserializeOwned + Serialize>(documents: &[Value], kind: &str, name: &str) -> T {
    let document = documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"));
    let value: T = serde_json::from_value(document.clone())
        .unwrap_or_else(|err| panic!("{kind} {name}: {err}"));
    assert_eq!(
        &serde_json::to_value(&value).expect("serialises"),
        document,
        "{kind} {name} has fields its type does not know"
    );
    value
}

fn only_container(deployment: &Deployment) -> Container {
    let spec = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod spec");
    assert_eq!(spec.containers.len(), 1);
    spec.containers[0].clone()
}

/// The volume a container mounts at `path`, and the pod volume behind it.
fn volume_at(deployment: &Deployment, path: &str) -> k8s_openapi::api::core::v1::Volume {
    let container = only_container(deployment);
    let mount = container
        .volume_mounts
        .unwrap_or_default()
        .into_iter()
        .find(|m| path.starts_with(&m.mount_path))
        .unwrap_or_else(|| panic!("nothing is mounted at {path}"));
    let spec = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod spec");
    spec.volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == mount.name)
        .expect("the mounted volume exists")
}

fn is_single_recreated(deployment: &Deployment) {
    let spec = deployment.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(1), "one writer per state folder");
    assert_eq!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
        Some("Recreate")
    );
}

#[test]
fn the_hub_runs_serve_with_its_state_on_a_volume_and_health_probes() {
    let docs = documents("hub.yaml");
    let namespace: Namespace = typed(&docs, "Namespace", "flotilla");
    let hub: Deployment = typed(&docs, "Deployment", "flotilla-hub");
    let service: Service = typed(&docs, "Service", "flotilla-hub");
    let claim: PersistentVolumeClaim = typed(&docs, "PersistentVolumeClaim", "flotilla-hub-state");
    let secret: Secret = typed(&docs, "Secret", "flotilla-hub-webhook");
    let in_namespace = namespace.metadata.name.clone();
    for meta in [
        &hub.metadata,
        &service.metadata,
        &claim.metadata,
        &secret.metadata,
    ] {
        assert_eq!(meta.namespace, in_namespace);
    }
    is_single_recreated(&hub);

    let container = only_container(&hub);
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/flotilla-dev/flotilla:0.1.0")
    );
    let args = container.args.clone().unwrap_or_default();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    assert_eq!(args.first().map(String::as_str), Some("serve"));
    assert_eq!(flag("--listen").as_deref(), Some("0.0.0.0:8080"));
    assert_eq!(flag("--state-dir").as_deref(), Some("/var/lib/flotilla"));

    // Liveness on /healthz, readiness on /readyz, both on the port serve listens on.
    let port = container.ports.clone().unwrap_or_default();
    assert_eq!(
        (port[0].name.as_deref(), port[0].container_port),
        (Some("http"), 8080)
    );
    let probe = |probe: Option<k8s_openapi::api::core::v1::Probe>| {
        let get = probe.and_then(|p| p.http_get).expect("an HTTP probe");
        (get.path.unwrap_or_default(), get.port)
    };
    let http = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("http".into());
    assert_eq!(
        probe(container.liveness_probe.clone()),
        ("/healthz".to_string(), http.clone())
    );
    assert_eq!(
        probe(container.readiness_probe.clone()),
        ("/readyz".to_string(), http.clone())
    );

    // The state folder is the claim; the webhook secret file comes from the Secret.
    let state = volume_at(&hub, "/var/lib/flotilla");
    assert_eq!(
        state.persistent_volume_claim.map(|c| c.claim_name),
        claim.metadata.name
    );
    let secret_file = flag("--webhook-secret-file").expect("a webhook secret");
    let webhook = volume_at(&hub, &secret_file);
    assert_eq!(
        webhook.secret.and_then(|s| s.secret_name),
        secret.metadata.name
    );
    let key = secret_file.rsplit('/').next().expect("a file name");
    assert!(secret.string_data.unwrap_or_default().contains_key(key));

    // The Service reaches the pods on the same named port.
    let service_spec = service.spec.expect("spec");
    let pod_labels = hub
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone());
    assert_eq!(service_spec.selector, pod_labels);
    assert_eq!(
        service_spec.ports.unwrap_or_default()[0].target_port,
        Some(http)
    );
}

/// The agent's command-line arguments for these `FLOTILLA_AGENT_*` variables, as its
/// own parser reads them.
fn agent_settings(variables: &BTreeMap<String, String>) -> AgentArgs {
    let command = AgentArgs::augment_args(Command::new("flotilla-agent"));
    let mut argv = vec!["flotilla-agent".to_string()];
    for (name, value) in variables {
        let arg = command
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == name.as_str()))
            .unwrap_or_else(|| panic!("{name} is not a variable the agent reads"));
        let long = arg.get_long().expect("a long flag");
        if arg.get_action().takes_values() {
            argv.extend([format!("--{long}"), value.clone()]);
        } else if value == "true" {
            argv.push(format!("--{long}"));
        }
    }
    #[derive(Parser)]
    struct Agent {
        #[command(flatten)]
        agent: AgentArgs,
    }
    Agent::try_parse_from(&argv)
        .unwrap_or_else(|err| panic!("{argv:?}: {err}"))
        .agent
}

#[test]
fn the_agent_runs_with_its_service_account_its_token_and_a_persistent_state_folder() {
    let docs = documents("agent.yaml");
    let agent: Deployment = typed(&docs, "Deployment", "flotilla-agent");
    let account: ServiceAccount = typed(&docs, "ServiceAccount", "flotilla-agent");
    let binding: ClusterRoleBinding = typed(&docs, "ClusterRoleBinding", "flotilla-agent");
    let role: ClusterRole = typed(&docs, "ClusterRole", "flotilla-agent");
    let token: Secret = typed(&docs, "Secret", "flotilla-agent-token");
    let claim: PersistentVolumeClaim =
        typed(&docs, "PersistentVolumeClaim", "flotilla-agent-state");
    let _: Namespace = typed(&docs, "Namespace", "flotilla-system");
    is_single_recreated(&agent);

    let container = only_container(&agent);
    assert_eq!(
        container.image.as_deref(),
        Some("ghcr.io/flotilla-dev/flotilla-agent:0.1.0")
    );
    assert_eq!(
        container.command,
        Some(vec!["/usr/local/bin/flotilla-agent".to_string()])
    );
    let variables: BTreeMap<String, String> = container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    let settings = agent_settings(&variables);
    assert_eq!(settings.sink, flotilla_agent::cli::SinkSpec::Kube);

    let token_file = settings
        .token_file
        .expect("a token file")
        .display()
        .to_string();
    assert_eq!(
        volume_at(&agent, &token_file)
            .secret
            .and_then(|s| s.secret_name),
        token.metadata.name
    );
    assert!(
        token
            .string_data
            .unwrap_or_default()
            .contains_key(token_file.rsplit('/').next().unwrap_or_default())
    );
    let state = volume_at(&agent, &settings.state_dir.display().to_string());
    assert_eq!(
        state.persistent_volume_claim.map(|c| c.claim_name),
        claim.metadata.name
    );

    // The pod runs as the service account the ClusterRole is bound to.
    let pod = agent
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    assert_eq!(pod.service_account_name, account.metadata.name);
    assert_eq!(
        binding.role_ref.name,
        role.metadata.name.clone().unwrap_or_default()
    );
    let subject = &binding.subjects.unwrap_or_default()[0];
    assert_eq!(
        (
            subject.kind.as_str(),
            Some(subject.name.clone()),
            subject.namespace.clone()
        ),
        (
            "ServiceAccount",
            account.metadata.name.clone(),
            account.metadata.namespace.clone()
        )
    );
    assert_eq!(agent.metadata.namespace, account.metadata.namespace);
}

#[test]
fn the_systemd_unit_runs_the_dir_sink_into_the_k3s_manifests_folder() {
    let path = deploy_dir().join("flotilla-agent.service");
    let text = std::fs::read_to_string(&path).expect("reads the unit");
    let lines: Vec<(&str, &str)> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .collect();
    let value = |key: &str| lines.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
    assert_eq!(value("ExecStart"), Some("/usr/local/bin/flotilla-agent"));
    let mut variables: BTreeMap<String, String> = lines
        .iter()
        .filter(|(k, _)| *k == "Environment")
        .filter_map(|(_, v)| v.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    // Read by the C library the agent runs on, not by the agent.
    assert_eq!(
        variables.remove("GLIBC_TUNABLES").as_deref(),
        Some("glibc.malloc.mmap_threshold=1048576")
    );
    let settings = agent_settings(&variables);
    assert_eq!(
        settings.sink,
        flotilla_agent::cli::SinkSpec::Dir("/var/lib/rancher/k3s/server/manifests/flotilla".into())
    );
    // The state folder is the unit's StateDirectory, which systemd keeps across restarts.
    assert_eq!(
        settings.state_dir,
        PathBuf::from("/var/lib").join(value("StateDirectory").expect("a state directory"))
    );
    assert!(
        value("ReadWritePaths").is_some_and(|p| settings.sink
            == flotilla_agent::cli::SinkSpec::Dir(PathBuf::from(p).join("flotilla")))
    );
    assert_eq!(value("Restart"), Some("always"));
}

/// A bundle that takes the kube sink down every path it has: CRDs and their wait,
/// Namespaces, workloads (and their health), a Job, RBAC objects that grant what the
/// agent does not hold, a webhook; then a second bundle that prunes most of it.
fn tour() -> (flotilla_core::bundle::Bundle, flotilla_core::bundle::Bundle) {
    let rbac = |kind: &str, namespace: &str, name: &str, rest: Value| {
        object("rbac.authorization.k8s.io/v1", kind, namespace, name, rest)
    };
    let gadgets = crd(
        "example.com",
        "Gadget",
        "gadgets",
        json!([served("v1", true)]),
    );
    let kept = vec![
        gadgets.clone(),
        kube_namespace("shop"),
        deployment("shop", "web", 1),
        object(
            "batch/v1",
            "Job",
            "shop",
            "seed",
            json!({"spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "seed", "image": "busybox:1.36"}]}}}}),
        ),
        object(
            "v1",
            "Service",
            "shop",
            "checker",
            json!({"spec": {"ports": [{"port": 443}]}}),
        ),
        object(
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "",
            "checker",
            json!({"webhooks": [{"name": "checker.example.com", "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "clientConfig": {"service": {"namespace": "shop", "name": "checker"}},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"]}]}]}),
        ),
    ];
    let mut first = kept.clone();
    first.extend([
        kube_config_map("shop", "settings", "1"),
        object("example.com/v1", "Gadget", "shop", "g1", json!({"spec": {}})),
        rbac("Role", "shop", "pod-reader", json!({"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})),
        rbac("RoleBinding", "shop", "pod-reader", json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "shop"}]})),
        rbac("ClusterRole", "", "node-watcher", json!({"rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["watch"]}]})),
        rbac("ClusterRoleBinding", "", "node-watcher", json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-watcher"},
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "shop"}]})),
    ]);
    (bundle("edge-1", first), bundle("edge-1", kept))
}

#[tokio::test(start_paused = true)]
async fn the_agents_cluster_role_grants_exactly_the_verbs_the_kube_sink_uses() {
    let docs = documents("agent.yaml");
    let role: ClusterRole = typed(&docs, "ClusterRole", "flotilla-agent");
    let rules = serde_json::to_value(role.rules.clone().unwrap_or_default()).expect("json");
    let fake = FakeApiServer::new().with_rules(&rules);
    let mut sink = sink(&fake, options());
    let (first, second) = tour();

    let outcome = sink.apply(&first, &[]).await;
    assert!(outcome.complete, "{outcome:#?}");
    fake.set_status(
        "batch/v1",
        "Job",
        "shop",
        "seed",
        json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}),
    );
    let health = sink.health(&first).await.expect("readable");
    assert!(
        health.iter().all(|h| h.state != ResourceState::Failed),
        "{health:#?}"
    );
    let outcome = sink.apply(&second, &prune_list(&first, &second)).await;
    assert!(outcome.complete, "{outcome:#?}");
    assert_eq!(outcome.count(ResourceState::Pruned), 6, "{outcome:#?}");

    // With --impersonate-tenants, a tenant's objects are applied as its ServiceAccount,
    // which the agent impersonates; that ServiceAccount's own rights are the
    // ClusterRole flotilla-tenant's (tested in kube_impersonation).
    fake.insert(
        documents("agent.yaml")
            .into_iter()
            .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "flotilla-tenant")
            .expect("deploy/agent.yaml ships the ClusterRole flotilla-tenant"),
        "kubectl",
    );
    let mut tenants = agent_support::kube::sink(
        &fake,
        flotilla_agent::sink::kube::KubeOptions {
            impersonate_tenants: true,
            ..options()
        },
    );
    let outcome = tenants.apply(&tenant_bundle(true, "1"), &[]).await;
    assert!(outcome.complete, "{outcome:#?}");

    // The agent's own checks; the impersonated ServiceAccount's are not its role's.
    let checks: Vec<_> = fake
        .checks()
        .into_iter()
        .filter(|c| c.user == flotilla_kube_fake::DEFAULT_USER)
        .collect();
    let refused: Vec<_> = checks.iter().filter(|c| c.rule.is_none()).collect();
    assert!(
        refused.is_empty(),
        "the ClusterRole lacks what the sink needs: {refused:#?}"
    );
    // Every verb of every rule was needed by some request of the tour.
    let used: BTreeSet<(usize, String)> = checks
        .iter()
        .filter_map(|c| c.rule.map(|rule| (rule, c.attributes.verb.clone())))
        .collect();
    let granted: BTreeSet<(usize, String)> = role
        .rules
        .unwrap_or_default()
        .iter()
        .enumerate()
        .flat_map(|(index, rule)| rule.verbs.iter().map(move |verb| (index, verb.clone())))
        .collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(
        unused.is_empty(),
        "the ClusterRole grants verbs the sink never uses: {unused:?}"
    );

    // docs/agent.md names every one of them in its RBAC table.
    let docs = std::fs::read_to_string(deploy_dir().join("../docs/agent.md"))
        .expect("reads docs/agent.md");
    let rbac = docs
        .split("### RBAC")
        .nth(1)
        .expect("an RBAC section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    for (_, verb) in &granted {
        assert!(
            rbac.contains(&format!("| `{verb}` |")),
            "docs/agent.md does not explain `{verb}`"
        );
    }
}
