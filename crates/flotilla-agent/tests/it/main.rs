//! The agent against a hub stand-in over HTTP, the `flotilla-agent` binary killed at
//! random moments, the kube sink against the fake API server (in process, and the real
//! kube client and the binary over HTTPS), the files in `deploy/`, and (ignored by
//! default) a live Kubernetes cluster.

mod agent_http;
mod agent_kill;
mod agent_kube_live;
mod deploy_files;
mod kube_drift;
mod kube_hooks;
mod kube_https;
mod kube_impersonation;
mod kube_phases;
mod kube_scenarios;
mod support;
