//! The schemas resources are checked against, as one tree type ([`Node`]): the
//! compiled-in Kubernetes definitions of each minor version ([`Builtin`]), and the
//! `openAPIV3Schema` of the fleet's CustomResourceDefinitions ([`CustomKinds`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::sync::{Arc, OnceLock};

use serde_json::Value;

use super::Minor;

/// The Kubernetes OpenAPI definitions of every supported minor version, made by
/// `schemas/generate.py` (the format is described there).
static KUBERNETES: &[u8] = include_bytes!("../../schemas/kubernetes.json.gz");

/// What a value must be.
#[derive(Debug)]
pub(crate) enum Node {
    Any,
    String,
    Integer,
    Number,
    Boolean,
    /// An integer or a string (`x-kubernetes-int-or-string`, IntOrString).
    IntOrString,
    /// A resource quantity: a string or a number.
    Quantity,
    /// Any object.
    AnyObject,
    /// The built-in definition of this name.
    Ref(Box<str>),
    List(Box<Node>),
    Object(Box<ObjectNode>),
}

/// An object's fields, and what other keys may be.
#[derive(Debug, Default)]
pub(crate) struct ObjectNode {
    pub(crate) fields: HashMap<String, Node>,
    pub(crate) required: Vec<String>,
    /// The schema of every key that is not a field (a map's values).
    pub(crate) values: Option<Node>,
    /// Other keys are kept as they are (`x-kubernetes-preserve-unknown-fields`).
    pub(crate) open: bool,
    /// An embedded object, which has `apiVersion`, `kind` and `metadata` besides
    /// its fields (`x-kubernetes-embedded-resource`).
    pub(crate) embedded: bool,
}

/// The compiled-in definitions, read once per process.
pub(crate) struct Builtin {
    versions: BTreeMap<Minor, Version>,
    minors: Vec<Minor>,
}

/// One minor version's definitions, and the definition of each
/// `group/version/Kind` (`apps/v1/Deployment`, `v1/ConfigMap`).
pub(crate) struct Version {
    definitions: HashMap<String, Arc<Node>>,
    kinds: HashMap<String, Arc<Node>>,
}

impl Version {
    pub(crate) fn definition(&self, name: &str) -> Option<&Node> {
        self.definitions.get(name).map(|n| &**n)
    }

    pub(crate) fn kind(&self, gvk: &str) -> Option<&Node> {
        self.kinds.get(gvk).map(|n| &**n)
    }

    /// Whether some kind of `group` is served (`""`: the core group).
    pub(crate) fn serves_group(&self, group: &str) -> bool {
        self.kinds.keys().any(|gvk| split_gvk(gvk).0 == group)
    }

    /// The API versions (`apps/v1`) that serve `kind`, sorted: none for a kind
    /// every group has (`DeleteOptions`, `WatchEvent`) or a list.
    pub(crate) fn api_versions_of(&self, kind: &str) -> Vec<&str> {
        let mut found: Vec<&str> = self
            .kinds
            .keys()
            .filter(|gvk| is_resource_kind(gvk) && split_gvk(gvk).2 == kind)
            .map(|gvk| split_gvk(gvk).1)
            .collect();
        found.sort_unstable();
        found
    }

    /// The kinds `api_version` serves (not lists, nor the kinds every group has).
    pub(crate) fn kinds_of(&self, api_version: &str) -> Vec<&str> {
        self.kinds
            .keys()
            .filter(|gvk| is_resource_kind(gvk) && split_gvk(gvk).1 == api_version)
            .map(|gvk| split_gvk(gvk).2)
            .collect()
    }
}

/// `group/version/Kind` (or `version/Kind`) as (group, `group/version`, Kind).
fn split_gvk(gvk: &str) -> (&str, &str, &str) {
    let (api_version, kind) = gvk.rsplit_once('/').unwrap_or(("", gvk));
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    (group, api_version, kind)
}

/// Whether a `group/version/Kind` of the schemas is one a manifest may hold: not a
/// list, nor one of the kinds of the API's own messages that every group version has.
fn is_resource_kind(gvk: &str) -> bool {
    let kind = split_gvk(gvk).2;
    !kind.ends_with("List")
        && !matches!(
            kind,
            "DeleteOptions"
                | "WatchEvent"
                | "Status"
                | "APIGroup"
                | "APIVersions"
                | "APIResourceList"
        )
}

impl Builtin {
    pub(crate) fn get() -> &'static Builtin {
        static BUILTIN: OnceLock<Builtin> = OnceLock::new();
        BUILTIN.get_or_init(|| {
            Builtin::read(KUBERNETES).unwrap_or_else(|| Builtin {
                versions: BTreeMap::new(),
                minors: Vec::new(),
            })
        })
    }

    /// The definitions in `gzipped` (`None` if it is not what generate.py writes;
    /// a test reads the compiled-in file).
    fn read(gzipped: &[u8]) -> Option<Builtin> {
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(gzipped)
            .read_to_end(&mut text)
            .ok()?;
        let file: Value = serde_json::from_slice(&text).ok()?;
        let pool: Vec<Arc<Node>> = file
            .get("pool")?
            .as_array()?
            .iter()
            .map(|node| Arc::new(builtin_node(node)))
            .collect();
        let mut versions = BTreeMap::new();
        for (name, version) in file.get("versions")?.as_object()? {
            let minor = super::parse_minor(name)?;
            let definitions: HashMap<String, Arc<Node>> = version
                .get("defs")?
                .as_object()?
                .iter()
                .filter_map(|(name, index)| {
                    Some((name.clone(), pool.get(index.as_u64()? as usize)?.clone()))
                })
                .collect();
            let kinds = version
                .get("kinds")?
                .as_object()?
                .iter()
                .filter_map(|(gvk, name)| {
                    Some((gvk.clone(), definitions.get(name.as_str()?)?.clone()))
                })
                .collect();
            versions.insert(minor, Version { definitions, kinds });
        }
        let minors = versions.keys().copied().collect();
        Some(Builtin { versions, minors })
    }

    pub(crate) fn minors(&self) -> &[Minor] {
        &self.minors
    }

    pub(crate) fn version(&self, minor: Minor) -> Option<&Version> {
        self.versions.get(&minor)
    }
}

/// A node of generate.py's compact form.
fn builtin_node(node: &Value) -> Node {
    match node {
        Value::String(s) => match s.as_str() {
            "s" => Node::String,
            "i" => Node::Integer,
            "n" => Node::Number,
            "b" => Node::Boolean,
            "x" => Node::IntOrString,
            "q" => Node::Quantity,
            "o" => Node::AnyObject,
            name if name.starts_with('#') => Node::Ref(name[1..].into()),
            _ => Node::Any,
        },
        Value::Object(map) => {
            if let Some(items) = map.get("[") {
                return Node::List(Box::new(builtin_node(items)));
            }
            let fields = map
                .get("p")
                .and_then(Value::as_object)
                .map(|p| {
                    p.iter()
                        .map(|(k, v)| (k.clone(), builtin_node(v)))
                        .collect()
                })
                .unwrap_or_default();
            let required = strings(map.get("r"));
            Node::Object(Box::new(ObjectNode {
                fields,
                required,
                values: map.get("{").map(builtin_node),
                open: false,
                embedded: false,
            }))
        }
        _ => Node::Any,
    }
}

/// The custom kinds the fleet's CustomResourceDefinitions define: per
/// `group/version/Kind`, each distinct schema (`None` for a version without one).
#[derive(Default)]
pub(crate) struct CustomKinds {
    kinds: HashMap<String, Vec<Option<Arc<Node>>>>,
    /// The schemas seen, to keep each distinct one once.
    seen: HashSet<(String, Option<String>)>,
}

impl CustomKinds {
    /// The kinds defined by `crds` (resources of kind CustomResourceDefinition;
    /// others are passed over).
    pub(crate) fn of<'v>(crds: impl IntoIterator<Item = &'v Value>) -> CustomKinds {
        let mut kinds = CustomKinds::default();
        for crd in crds {
            kinds.add(crd);
        }
        kinds
    }

    pub(crate) fn add(&mut self, crd: &Value) {
        if crd.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
            return;
        }
        let spec = crd.get("spec");
        let group = spec.and_then(|s| s.get("group")).and_then(Value::as_str);
        let kind = spec
            .and_then(|s| s.get("names"))
            .and_then(|n| n.get("kind"))
            .and_then(Value::as_str);
        let (Some(group), Some(kind)) = (group, kind) else {
            return;
        };
        let versions = spec
            .and_then(|s| s.get("versions"))
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        // apiextensions.k8s.io/v1beta1's schema for every version.
        let shared = spec
            .and_then(|s| s.get("validation"))
            .and_then(|v| v.get("openAPIV3Schema"));
        for version in versions {
            let Some(name) = version.get("name").and_then(Value::as_str) else {
                continue;
            };
            let schema = version
                .get("schema")
                .and_then(|s| s.get("openAPIV3Schema"))
                .or(shared);
            let gvk = format!("{group}/{name}/{kind}");
            let text = schema.map(Value::to_string);
            if !self.seen.insert((gvk.clone(), text)) {
                continue;
            }
            self.kinds
                .entry(gvk)
                .or_default()
                .push(schema.map(|s| Arc::new(custom_node(s))));
        }
    }

    pub(crate) fn get(&self, gvk: &str) -> &[Option<Arc<Node>>] {
        self.kinds.get(gvk).map(Vec::as_slice).unwrap_or_default()
    }
}

/// A CRD's structural schema as a node. What it does not model (`anyOf`, `oneOf`,
/// `allOf`, `not`) is not checked.
fn custom_node(schema: &Value) -> Node {
    let flag = |name: &str| schema.get(name).and_then(Value::as_bool) == Some(true);
    if flag("x-kubernetes-int-or-string") {
        return Node::IntOrString;
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties");
    let open = flag("x-kubernetes-preserve-unknown-fields");
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => Node::String,
        Some("integer") => Node::Integer,
        Some("number") => Node::Number,
        Some("boolean") => Node::Boolean,
        Some("array") => Node::List(Box::new(schema.get("items").map_or(Node::Any, custom_node))),
        Some("object") | None if properties.is_some() || additional.is_some() => {
            let values = match additional {
                Some(Value::Bool(true)) => Some(Node::Any),
                Some(Value::Object(schema)) if schema.is_empty() => Some(Node::Any),
                Some(schema @ Value::Object(_)) => Some(custom_node(schema)),
                _ => None,
            };
            let fields = properties
                .map(|p| p.iter().map(|(k, v)| (k.clone(), custom_node(v))).collect())
                .unwrap_or_default();
            let required = strings(schema.get("required"));
            // With neither fields nor a schema for other keys, an object keeps
            // what it is given only when it says so; a schema that names nothing
            // is taken as saying nothing.
            let open = open || (properties.is_none() && values.is_none());
            Node::Object(Box::new(ObjectNode {
                fields,
                required,
                values,
                open,
                embedded: flag("x-kubernetes-embedded-resource"),
            }))
        }
        Some("object") => Node::AnyObject,
        _ => Node::Any,
    }
}

/// The strings of a list of field names (`required`); none for anything else.
fn strings(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|f| Some(f.as_str()?.to_string()))
                .collect()
        })
        .unwrap_or_default()
}
