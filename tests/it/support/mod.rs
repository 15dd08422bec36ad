//! What the end-to-end tests share: a hub started in-process on a Git repository made
//! from fleet-example (`hub`), bundles and published folders for agents (`agent`),
//! and processes of the real binary (`process`).

pub mod agent;
pub mod hub;
pub mod process;
