//! flotilla's end-to-end tests: the real renderer, hub, agent and command line, on real
//! Git repositories made in temporary folders. One test binary, linked once.

mod agent_e2e;
mod agent_file;
mod architecture;
mod bad_inputs;
mod bundle_deltas;
mod bundle_features;
mod chart_hooks;
mod cli_database;
mod diff_cli;
mod digest_properties;
mod dockerfile;
mod first_hour;
mod fleet_view;
mod formats_cli;
mod fuzz_regressions;
mod hub_api;
mod hub_connections;
mod hub_follow;
mod hub_hostile;
mod hub_objects;
mod hub_peers;
mod hub_scale;
mod mirror_deltas;
mod module_graph;
mod oci;
mod readme;
mod render_example;
mod roles;
mod rollout_e2e;
mod schema_check;
mod schemas;
mod sops_secrets;
mod support;
mod ui_browser;
mod validate_cli;
