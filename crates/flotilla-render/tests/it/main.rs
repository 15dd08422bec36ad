//! The renderer against external references (the RFC 6902 and RFC 7396 conformance
//! suites, and `kubectl kustomize`), and property tests of its budgets.

mod budgets;
mod formats;
mod helm_charts;
mod helm_stencils;
mod helm_workloads;
mod hooks;
mod incremental;
mod keyed_hashes;
mod kustomize_corpus;
mod kustomize_diff;
mod order;
mod patch_conformance;
mod regressions;
mod shape;
mod sops_files;
mod stencil;
mod template_scopes;
mod tenants;
mod yaml_values;
