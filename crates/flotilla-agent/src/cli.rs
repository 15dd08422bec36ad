//! The edge agent's command line, shared by `flotilla agent` and the `flotilla-agent`
//! binary, and the settings built from it.
//!
//! Every flag can also come from a `FLOTILLA_AGENT_*` variable, never from the
//! operator's `FLOTILLA_*` ones, so that an operator's shell cannot redirect an agent
//! and an agent's environment cannot redirect an operator's commands.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;

use crate::backoff::BackoffPolicy;
use crate::client::Server;
use crate::logging::{LogFormat, init_logging};
use crate::sink::dir::DirSink;
use crate::sink::kube::{KubeOptions, KubeSink};
use crate::wait::Wait;
use crate::{Agent, AgentConfig};
use flotilla_core::signing::{PublicKey, TrustedKeys};

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The hub (http://, https://), a `flotilla publish` folder (file:///path) or a
    /// repository `flotilla publish --oci` pushes to (oci://REGISTRY/REPOSITORY).
    #[arg(long, env = "FLOTILLA_AGENT_SERVER", value_name = "URL")]
    pub server: String,
    /// With an oci:// or file:// server: the hub (http://, https://) to send status
    /// reports to, with --token-file. A report is sent at least every half
    /// --offline-after, since the hub never sees the agent's polls. Without it,
    /// reports are only kept in the state folder.
    #[arg(long, env = "FLOTILLA_AGENT_REPORT_TO", value_name = "URL")]
    pub report_to: Option<String>,
    /// With --report-to: the hub's `serve --offline-after`; the agent reports at
    /// least every half of it, so the hub does not count it offline.
    #[arg(long, env = "FLOTILLA_AGENT_OFFLINE_AFTER", default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub offline_after: Duration,
    /// With an oci:// server: the registry's user name (with --oci-password-file),
    /// instead of the Docker configuration file's credentials ($DOCKER_CONFIG/config.json
    /// or ~/.docker/config.json).
    #[arg(
        long,
        env = "FLOTILLA_AGENT_OCI_USERNAME",
        value_name = "USER",
        requires = "oci_password_file"
    )]
    pub oci_username: Option<String>,
    /// A file holding the password or token of --oci-username.
    #[arg(
        long,
        env = "FLOTILLA_AGENT_OCI_PASSWORD_FILE",
        value_name = "FILE",
        requires = "oci_username"
    )]
    pub oci_password_file: Option<PathBuf>,
    /// With an oci:// server: speak plain HTTP to it; only for a registry on this
    /// machine (localhost, 127.0.0.1, ::1).
    #[arg(long, env = "FLOTILLA_AGENT_OCI_PLAIN_HTTP")]
    pub oci_plain_http: bool,
    /// This cluster's name in the fleet.
    #[arg(long, env = "FLOTILLA_AGENT_CLUSTER", value_name = "NAME")]
    pub cluster: String,
    /// A file holding this cluster's token (from `flotilla token create`); required
    /// with an http(s) server. It is read again after the hub refuses a token.
    #[arg(long, env = "FLOTILLA_AGENT_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Where the agent keeps its last-known-good bundle, inventory and status (one
    /// folder per agent; it is locked while the agent runs).
    #[arg(long, env = "FLOTILLA_AGENT_STATE_DIR", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// Where to apply: `kube` (server-side apply through the Kubernetes API) or
    /// `dir:PATH` (one YAML file per resource, for k3s or MicroShift manifest folders).
    #[arg(long, env = "FLOTILLA_AGENT_SINK", value_name = "kube|dir:PATH", value_parser = parse_sink)]
    pub sink: SinkSpec,
    /// With `--sink dir:PATH`: also write a kustomization.yaml listing the files, as
    /// MicroShift's manifest loader requires.
    #[arg(long, env = "FLOTILLA_AGENT_KUSTOMIZATION")]
    pub kustomization: bool,
    /// With `--sink kube`: take over fields another field manager owns.
    #[arg(long, env = "FLOTILLA_AGENT_FORCE_CONFLICTS")]
    pub force_conflicts: bool,
    /// With `--sink kube`: prune Namespaces and CustomResourceDefinitions that left the
    /// bundle even without the `flotilla.dev/prune: allow` annotation (deleting one
    /// deletes everything in it, or every custom resource of its kind).
    #[arg(long, env = "FLOTILLA_AGENT_PRUNE_NAMESPACES_AND_CRDS")]
    pub prune_namespaces_and_crds: bool,
    /// With `--sink kube`: the namespace of the ConfigMap holding the cluster's copy of
    /// the inventory (default: the agent's own namespace in a cluster, else the
    /// kubeconfig context's).
    #[arg(
        long,
        env = "FLOTILLA_AGENT_INVENTORY_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub inventory_namespace: Option<String>,
    /// With `--sink kube`: apply each tenant's namespaced resources as the tenant's
    /// ServiceAccount `flotilla-tenant-<tenant>` in their namespace (which the bundle
    /// creates, bound to the ClusterRole `flotilla-tenant`), so that the API server
    /// holds them to that role; the agent's own role needs `impersonate` on
    /// `serviceaccounts` (docs/tenants.md).
    #[arg(long, env = "FLOTILLA_AGENT_IMPERSONATE_TENANTS")]
    pub impersonate_tenants: bool,
    /// With `--sink kube`: the longest wait for one answer of the Kubernetes API.
    #[arg(long, env = "FLOTILLA_AGENT_KUBE_TIMEOUT", default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub kube_timeout: Duration,
    /// With `--sink kube`, for bundles whose workloads depend on others
    /// (`spec.dependsOn`): how long the workloads of one apply phase may take to become
    /// healthy before the later phases are held back and the agent tries again later.
    #[arg(long, env = "FLOTILLA_AGENT_PHASE_TIMEOUT", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub phase_timeout: Duration,
    /// How long the hub may hold a poll open waiting for a change. `auto`: up to 4
    /// minutes, held shorter when a proxy or load balancer on the way cuts held polls
    /// (a folder or static server is then asked every 55 s); a duration: that, every
    /// time (a folder is re-read this often), below the idle timeout of any proxy on the way.
    #[arg(
        long,
        env = "FLOTILLA_AGENT_WAIT",
        default_value = "auto",
        value_name = "auto|DURATION"
    )]
    pub wait: Wait,
    /// How often to look for drift, and correct or report it as each workload's
    /// `spec.drift` says (0 to never).
    #[arg(long, env = "FLOTILLA_AGENT_RESYNC", default_value = "10m", value_parser = parse_duration, value_name = "DURATION")]
    pub resync: Duration,
    /// Send the last status report again after this long without a new one (0: never;
    /// the hub counts the agent's polls as it being seen, so none is needed).
    #[arg(long, env = "FLOTILLA_AGENT_HEARTBEAT", default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub heartbeat: Duration,
    /// Speak HTTP/2 to an http:// hub from the first byte (https:// negotiates it):
    /// repeated headers then cost a few bytes a poll. Only for servers that accept
    /// HTTP/2 without TLS, as the hub does.
    #[arg(long, env = "FLOTILLA_AGENT_HTTP2")]
    pub http2: bool,
    /// The longest wait between retries when the hub is unreachable.
    #[arg(long, env = "FLOTILLA_AGENT_MAX_BACKOFF", default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub max_backoff: Duration,
    /// TLS: a PEM file of CA certificates to trust besides the system's trust store
    /// (which honours SSL_CERT_FILE and SSL_CERT_DIR), such as a site's own CA that
    /// signed the hub's certificate.
    #[arg(long, env = "FLOTILLA_AGENT_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// TLS: this cluster's client certificate (PEM), for a hub started with
    /// --client-ca; its DNS names must include the cluster's name.
    #[arg(
        long,
        env = "FLOTILLA_AGENT_CLIENT_CERT",
        value_name = "PEM",
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// TLS: the private key of --client-cert (PEM).
    #[arg(
        long,
        env = "FLOTILLA_AGENT_CLIENT_KEY",
        value_name = "PEM",
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
    /// Log format on standard error.
    #[arg(long, env = "FLOTILLA_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Accept only bundles signed by this public key (a KEY.pub from `flotilla key
    /// generate`), with a sequence that never goes back. Repeat it to trust two keys
    /// while keys are rotated; in the variable, separate files with commas. Without
    /// it, bundles are checked against their digests only.
    #[arg(
        long = "trust-key",
        env = "FLOTILLA_AGENT_TRUST_KEY",
        value_name = "KEY.pub",
        value_delimiter = ','
    )]
    pub trust_keys: Vec<PathBuf>,
    /// A TenantPolicy file (docs/tenants.md): the tenant rules to enforce on every
    /// bundle instead of the rules the bundle carries, which its hub wrote. A bundle
    /// that puts a tenant's resource outside them is refused and the refusal
    /// reported.
    #[arg(long, env = "FLOTILLA_AGENT_TENANT_POLICY", value_name = "FILE")]
    pub tenant_policy: Option<PathBuf>,
    /// The platform's public key (from `flotilla key generate`, kept apart from the
    /// hub's signing key): enforce the tenant rules each bundle carries signed by
    /// it (`flotilla key sign-tenants`), and refuse a bundle without them.
    #[arg(
        long,
        env = "FLOTILLA_AGENT_TENANT_KEY",
        value_name = "KEY.pub",
        conflicts_with = "tenant_policy"
    )]
    pub tenant_key: Option<PathBuf>,
}

/// Where the agent applies bundles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSpec {
    Kube,
    Dir(PathBuf),
}

fn parse_sink(text: &str) -> Result<SinkSpec, String> {
    if text == "kube" {
        return Ok(SinkSpec::Kube);
    }
    match text.strip_prefix("dir:") {
        Some(path) if !path.is_empty() => Ok(SinkSpec::Dir(PathBuf::from(path))),
        _ => Err(format!(
            "{text:?} is not a sink: use `kube` or `dir:PATH` (for example dir:/var/lib/rancher/k3s/server/manifests/flotilla)"
        )),
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(text).map_err(|err| format!("{err} (write it like 30s, 10m or 1h)"))
}

/// The validated configuration of one agent run.
struct Settings {
    config: AgentConfig,
    sink: SinkSpec,
    kustomization: bool,
    kube: KubeOptions,
}

fn settings(args: &AgentArgs) -> anyhow::Result<Settings> {
    let server = Server::parse(&args.server)?;
    if args.kustomization && args.sink == SinkSpec::Kube {
        bail!("--kustomization only applies to `--sink dir:PATH`");
    }
    let kube_only = [
        ("--force-conflicts", args.force_conflicts),
        (
            "--prune-namespaces-and-crds",
            args.prune_namespaces_and_crds,
        ),
        ("--inventory-namespace", args.inventory_namespace.is_some()),
        ("--impersonate-tenants", args.impersonate_tenants),
    ];
    for (flag, given) in kube_only {
        if given && args.sink != SinkSpec::Kube {
            bail!("{flag} only applies to `--sink kube`");
        }
    }
    if args.kube_timeout < Duration::from_secs(1) {
        bail!("--kube-timeout must be at least 1s");
    }
    if args.phase_timeout < Duration::from_secs(1) {
        bail!("--phase-timeout must be at least 1s");
    }
    crate::sink::check_cluster_name(&args.cluster).map_err(anyhow::Error::msg)?;
    if args.max_backoff < Duration::from_secs(1) {
        bail!("--max-backoff must be at least 1s");
    }
    let is_oci = matches!(server, Server::Oci(_));
    for (flag, given) in [
        ("--oci-plain-http", args.oci_plain_http),
        ("--oci-username", args.oci_username.is_some()),
    ] {
        if given && !is_oci {
            bail!("{flag} only applies to an oci:// --server");
        }
    }
    if let Server::Oci(repository) = &server
        && args.oci_plain_http
        && !repository.is_loopback()
    {
        return Err(flotilla_oci::OciError::PlainHttpNotLoopback {
            host: repository.host().to_string(),
        }
        .into());
    }
    let report_to = match &args.report_to {
        None => None,
        Some(_) if matches!(server, Server::Http(_)) => {
            bail!(
                "--report-to is for an oci:// or file:// --server; a hub takes the reports itself"
            )
        }
        Some(text) => match url::Url::parse(text) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => Some(url),
            _ => bail!("--report-to {text:?} is not an http:// or https:// URL of a hub"),
        },
    };
    if report_to.is_some() && args.token_file.is_none() {
        bail!("--report-to needs --token-file: the hub takes reports with the cluster's token");
    }
    if args.offline_after < Duration::from_secs(2) {
        bail!("--offline-after must be at least 2s");
    }
    let credentials = match (&args.oci_username, &args.oci_password_file) {
        (Some(username), Some(file)) => {
            let password = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read --oci-password-file {}", file.display()))?;
            Some(flotilla_oci::Credentials {
                username: username.clone(),
                password: password.trim_end_matches(['\r', '\n']).to_string(),
            })
        }
        _ => match (&server, flotilla_oci::docker_config_path()) {
            (Server::Oci(repository), Some(path)) => {
                flotilla_oci::Credentials::from_docker_config(&path, &repository.registry)?
            }
            _ => None,
        },
    };
    let mut config = AgentConfig::new(server, &args.cluster, args.state_dir.clone());
    config.registry = flotilla_oci::RegistryOptions {
        plain_http: args.oci_plain_http,
        credentials,
    };
    // The hub never sees a registry's or a folder's polls: the reports say the agent
    // is alive, at least every half --offline-after.
    let heartbeat = match report_to {
        Some(_) => {
            let half = args.offline_after / 2;
            if args.heartbeat.is_zero() {
                half
            } else {
                args.heartbeat.min(half)
            }
        }
        None => args.heartbeat,
    };
    config.report_to = report_to;
    config.trusted = trusted_keys(&args.trust_keys)?;
    config.tenant_policy = match &args.tenant_policy {
        Some(path) => Some(crate::tenancy::TenantPolicy::read(path).map_err(anyhow::Error::msg)?),
        None => None,
    };
    config.tenant_key = match &args.tenant_key {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|err| {
                anyhow::anyhow!("cannot read --tenant-key {}: {err}", path.display())
            })?;
            Some(
                flotilla_core::signing::PublicKey::parse(&text)
                    .map_err(|err| anyhow::anyhow!("--tenant-key {}: {err}", path.display()))?,
            )
        }
        None => None,
    };
    config.token_file = args.token_file.clone();
    config.wait = args.wait;
    config.resync = args.resync;
    config.heartbeat = heartbeat;
    config.tls = crate::client::TlsOptions {
        ca_file: args.ca_file.clone(),
        client_cert: args.client_cert.clone().zip(args.client_key.clone()),
    };
    config.http2 = args.http2;
    config.backoff = BackoffPolicy {
        cap: args.max_backoff,
        auth_retry: args.max_backoff.min(crate::backoff::AUTH_RETRY),
        ..BackoffPolicy::default()
    };
    Ok(Settings {
        config,
        sink: args.sink.clone(),
        kustomization: args.kustomization,
        kube: KubeOptions {
            force_conflicts: args.force_conflicts,
            prune_namespaces_and_crds: args.prune_namespaces_and_crds,
            request_timeout: args.kube_timeout,
            phase_timeout: args.phase_timeout,
            inventory_namespace: args.inventory_namespace.clone(),
            impersonate_tenants: args.impersonate_tenants,
            ..KubeOptions::default()
        },
    })
}

/// Reads every `--trust-key` file; one that is missing or not a public key stops the
/// agent before it starts (an agent that silently trusted fewer keys would refuse
/// every bundle, or one that trusted none would check digests only).
fn trusted_keys(paths: &[PathBuf]) -> anyhow::Result<TrustedKeys> {
    let mut keys = Vec::with_capacity(paths.len());
    for path in paths {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --trust-key {}", path.display()))?;
        let key =
            PublicKey::parse(&text).with_context(|| format!("--trust-key {}", path.display()))?;
        keys.push(key);
    }
    Ok(TrustedKeys::new(keys))
}

/// Runs the agent until SIGTERM or Ctrl-C.
pub fn run_agent(args: &AgentArgs) -> anyhow::Result<()> {
    let settings = settings(args)?;
    init_logging(args.log_format);
    // One thread is plenty for one agent, and keeps its footprint small.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let Settings {
            config,
            sink,
            kustomization,
            kube,
        } = settings;
        match sink {
            SinkSpec::Kube => {
                let sink = KubeSink::connect(kube).await?;
                Agent::new(config, sink).run(shutdown_signal()).await?;
            }
            SinkSpec::Dir(path) => {
                let sink = DirSink::new(&path, &config.state_dir, kustomization);
                Agent::new(config, sink).run(shutdown_signal()).await?;
            }
        }
        Ok(())
    })
}

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<AgentArgs, clap::Error> {
        #[derive(Parser)]
        struct Wrapper {
            #[command(flatten)]
            agent: AgentArgs,
        }
        let mut argv = vec!["agent"];
        argv.extend_from_slice(args);
        Wrapper::try_parse_from(argv).map(|w| w.agent)
    }

    #[test]
    fn parses_the_documented_command_line() {
        let args = parse(&[
            "--server",
            "https://hub.example:8443",
            "--cluster",
            "edge-1",
            "--token-file",
            "/etc/flotilla/token",
            "--state-dir",
            "/var/lib/flotilla",
            "--sink",
            "dir:/var/lib/rancher/k3s/server/manifests/flotilla",
            "--wait",
            "45s",
            "--resync",
            "15m",
        ])
        .expect("parses");
        assert_eq!(
            args.sink,
            SinkSpec::Dir(PathBuf::from(
                "/var/lib/rancher/k3s/server/manifests/flotilla"
            ))
        );
        let settings = settings(&args).expect("valid");
        assert_eq!(settings.config.wait, Wait::Fixed(Duration::from_secs(45)));
        assert_eq!(settings.config.resync, Duration::from_secs(900));
        assert_eq!(settings.config.backoff.cap, Duration::from_secs(300));
    }

    #[test]
    fn the_command_line_defaults_are_the_library_defaults() {
        let args = parse(&[
            "--server",
            "file:///srv/f",
            "--cluster",
            "edge-1",
            "--state-dir",
            "/var/lib/flotilla",
            "--sink",
            "dir:/x",
        ])
        .expect("parses");
        let settings = settings(&args).expect("valid");
        let library = crate::AgentConfig::new(
            settings.config.server.clone(),
            "edge-1",
            settings.config.state_dir.clone(),
        );
        assert_eq!(settings.config.wait, library.wait);
        assert_eq!(settings.config.wait, Wait::Auto);
        assert_eq!(settings.config.heartbeat, Duration::ZERO);
        assert_eq!(settings.config.heartbeat, library.heartbeat);
        assert_eq!(settings.config.resync, library.resync);
    }

    #[test]
    fn refuses_a_cluster_name_that_cannot_be_a_label_value() {
        let long = "e".repeat(64);
        let args = parse(&[
            "--server",
            "file:///srv/f",
            "--cluster",
            &long,
            "--state-dir",
            "/s",
            "--sink",
            "kube",
        ])
        .expect("parses");
        let err = settings(&args).err().expect("refused").to_string();
        assert!(
            err.contains("64 characters") && err.contains("flotilla.dev/cluster"),
            "{err}"
        );
    }

    #[test]
    fn refuses_bad_sinks_and_mismatched_flags() {
        let base = [
            "--server",
            "file:///srv/f",
            "--cluster",
            "c",
            "--state-dir",
            "/s",
        ];
        let with = |extra: &[&str]| {
            let mut all: Vec<&str> = base.to_vec();
            all.extend_from_slice(extra);
            parse(&all)
        };
        let err = with(&["--sink", "dir:"]).expect_err("refused");
        assert!(err.to_string().contains("dir:PATH"), "{err}");
        assert!(with(&["--sink", "helm"]).is_err());
        let args = with(&["--sink", "kube", "--kustomization"]).expect("parses");
        assert!(settings(&args).is_err());
        let args = with(&["--sink", "dir:/x", "--force-conflicts"]).expect("parses");
        assert!(settings(&args).is_err());
        let args = with(&["--sink", "dir:/x", "--prune-namespaces-and-crds"]).expect("parses");
        assert!(settings(&args).is_err());
        let args = with(&["--sink", "dir:/x", "--impersonate-tenants"]).expect("parses");
        let err = settings(&args).err().expect("refused");
        assert!(
            err.to_string()
                .contains("--impersonate-tenants only applies to `--sink kube`"),
            "{err}"
        );
        let args = with(&["--sink", "kube", "--impersonate-tenants"]).expect("parses");
        assert!(settings(&args).expect("valid").kube.impersonate_tenants);
        let args = with(&["--sink", "kube"]).expect("parses");
        assert!(!settings(&args).expect("valid").kube.impersonate_tenants);
        let args = with(&[
            "--sink",
            "kube",
            "--prune-namespaces-and-crds",
            "--kube-timeout",
            "5s",
            "--phase-timeout",
            "2m",
            "--inventory-namespace",
            "ops",
        ])
        .expect("parses");
        let kube = settings(&args).expect("valid").kube;
        assert!(kube.prune_namespaces_and_crds);
        assert_eq!(kube.request_timeout, Duration::from_secs(5));
        assert_eq!(kube.phase_timeout, Duration::from_secs(120));
        let args = with(&["--sink", "kube"]).expect("parses");
        assert_eq!(
            settings(&args).expect("valid").kube.phase_timeout,
            Duration::from_secs(600)
        );
        let args = with(&["--sink", "kube", "--phase-timeout", "500ms"]).expect("parses");
        let err = settings(&args).err().expect("refused");
        assert!(err.to_string().contains("--phase-timeout"), "{err}");
        assert_eq!(kube.inventory_namespace.as_deref(), Some("ops"));
        assert!(with(&["--sink", "dir:/x", "--wait", "0"]).is_err());
        let args = with(&["--sink", "dir:/x", "--wait", "auto"]).expect("parses");
        assert_eq!(settings(&args).expect("valid").config.wait, Wait::Auto);
        let args = with(&["--sink", "kube", "--resync", "0"]).expect("parses");
        assert_eq!(
            settings(&args).expect("valid").config.resync,
            Duration::ZERO
        );
    }

    #[test]
    fn an_oci_server_reports_to_a_hub_at_least_every_half_offline_after() {
        let agent = |server: &str, extra: &[&str]| {
            let mut all = vec![
                "--server",
                server,
                "--cluster",
                "c",
                "--state-dir",
                "/s",
                "--sink",
                "dir:/x",
            ];
            all.extend_from_slice(extra);
            settings(&parse(&all).expect("parses"))
        };
        let oci = "oci://registry.example:5000/fleet/bundles";
        let config = agent(oci, &[]).expect("valid").config;
        assert!(matches!(config.server, Server::Oci(_)));
        assert_eq!((config.report_to, config.heartbeat), (None, Duration::ZERO));
        let token = ["--report-to", "https://hub.example", "--token-file", "/t"];
        let config = agent(oci, &token).expect("valid").config;
        assert_eq!(config.heartbeat, Duration::from_secs(150));
        let mut more = token.to_vec();
        more.extend(["--offline-after", "1m", "--heartbeat", "2m"]);
        assert_eq!(
            agent(oci, &more).expect("valid").config.heartbeat,
            Duration::from_secs(30)
        );
        let refused =
            |server: &str, extra: &[&str]| agent(server, extra).err().expect("refused").to_string();
        assert!(refused(oci, &["--report-to", "https://hub.example"]).contains("--token-file"));
        assert!(refused(oci, &["--report-to", "ftp://x", "--token-file", "/t"]).contains("http"));
        assert!(refused("https://hub.example", &token).contains("--report-to"));
        assert!(refused("file:///f", &["--oci-plain-http"]).contains("oci://"));
        assert!(refused(oci, &["--oci-plain-http"]).contains("plain HTTP"));
        assert!(agent("oci://127.0.0.1:5000/f", &["--oci-plain-http"]).is_ok());
    }

    #[test]
    fn trusts_every_key_given_and_refuses_a_file_that_is_not_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, seed: u8| {
            let path = dir.path().join(name);
            let key = flotilla_core::signing::SigningKey::from_seed([seed; 32]);
            std::fs::write(&path, key.public_key().to_file_text()).expect("writes");
            (path.display().to_string(), key.key_id().to_string())
        };
        let (old, old_id) = write("old.pub", 1);
        let (new, new_id) = write("new.pub", 2);
        let base = [
            "--server",
            "file:///srv/f",
            "--cluster",
            "c",
            "--state-dir",
            "/s",
            "--sink",
            "kube",
        ];
        let with = |extra: &[&str]| {
            let mut all: Vec<&str> = base.to_vec();
            all.extend_from_slice(extra);
            settings(&parse(&all).expect("parses"))
        };
        let config = with(&["--trust-key", &old, "--trust-key", &new])
            .expect("valid")
            .config;
        assert_eq!(config.trusted.ids(), vec![old_id.as_str(), new_id.as_str()]);
        assert!(with(&[]).expect("valid").config.trusted.is_empty());
        let private = dir.path().join("key");
        std::fs::write(
            &private,
            flotilla_core::signing::SigningKey::from_seed([3; 32]).to_file_text(),
        )
        .expect("writes");
        let err = with(&["--trust-key", &private.display().to_string()])
            .err()
            .expect("refused");
        assert!(
            format!("{err:#}").contains("not a flotilla public key"),
            "{err:#}"
        );
        let err = with(&["--trust-key", "/no/such.pub"])
            .err()
            .expect("refused");
        assert!(
            format!("{err:#}").contains("cannot read --trust-key /no/such.pub"),
            "{err:#}"
        );
    }
}
