//! Helm charts, rendered natively: Go's `text/template` ([`gotmpl`]) with Sprig's and
//! Helm's functions ([`funcs`]), charts and their dependencies read from bytes
//! ([`chart`]), values coalesced as Helm coalesces them ([`values`]), and YAML written
//! and read as Helm's Go libraries do ([`yaml`]); [`render`] renders a release as
//! Helm's engine does. Pure: files come in as bytes, no
//! file, socket or clock is touched here.

pub mod chart;
pub mod crypto;
pub mod funcs;
pub mod gotmpl;
pub mod render;
pub mod schema;
pub mod values;
pub mod yaml;
