//! YAML as Helm's Go libraries write and read it.
//!
//! Helm writes YAML with `sigs.k8s.io/yaml`: a value becomes JSON first (`encoding/json`:
//! map keys sorted, every whole `float64` an integer, `[]byte` base64), and the JSON is
//! then read and written again by go-yaml v2's emitter (2-space indentation, lists not
//! indented under their key, long plain and quoted lines folded at 80 columns, strings
//! quoted only where go-yaml would read them as something else). It reads YAML the same
//! way back: go-yaml v2 with YAML 1.1's scalars (`yes`/`no`/`on`/`off`/`y`/`n` are
//! booleans, also as keys), then through JSON, so every number is a `float64`.
//!
//! Public API:
//! - [`marshal`]: `yaml.Marshal` (ends with a line break); [`to_yaml`]: Helm's `toYaml`
//!   (the same without its final line break).
//! - [`from_yaml`]: `yaml.Unmarshal` into `interface{}` (the first document, any shape);
//!   [`from_yaml_map`]: into `map[string]interface{}` as values files and `fromYaml`
//!   read; [`from_yaml_array`]: into `[]interface{}` as `fromYamlArray` reads.
//! - [`split_manifests`] and [`parse_manifest`]: a rendered template split into documents
//!   as Helm splits it, and each document read as Kubernetes reads it;
//!   [`split_documents`]: a values file's documents as Kubernetes' `YAMLReader` cuts them.
//! - [`format_float_v`]: Go's `%v` of a float64; [`key_order`]: go-yaml's map key order.
//!
//! Every error's [`YamlError::message`] is the text Go reports where flotilla knows it
//! (`fromYaml` puts it under the key `Error`); the parser's own messages are libyaml's
//! in spirit, not always word for word.

mod emit;
mod floats;
mod read;

pub use emit::{key_order, marshal, to_yaml};
pub use floats::format_float_v;
pub use read::{
    from_yaml, from_yaml_array, from_yaml_map, parse_manifest, split_documents, split_manifests,
};

/// A YAML problem, worded as Go's libraries word it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    pub message: String,
}

impl YamlError {
    fn new(message: impl Into<String>) -> YamlError {
        YamlError {
            message: message.into(),
        }
    }
}

/// How deep values may nest when written or read: deeper is an error, not a stack
/// overflow.
pub const MAX_DEPTH: usize = 1_000;

/// Nodes a document may expand to once its aliases are followed (refuses alias bombs).
pub const MAX_NODES: usize = 1_000_000;

#[cfg(test)]
mod tests;
