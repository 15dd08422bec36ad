//! The renderer against external references: the RFC 6902 and RFC 7396 conformance
//! suites, and `kubectl kustomize`.

mod kustomize_corpus;
mod kustomize_diff;
mod patch_conformance;
mod regressions;
