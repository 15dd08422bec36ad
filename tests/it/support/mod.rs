//! What the end-to-end tests share: a hub started in-process on a Git repository made
//! from fleet-example (`hub`), and bundles and published folders for agents (`agent`).

pub mod agent;
pub mod hub;
