//! Where the built-in Kubernetes kinds merge lists by key: the fields the Kubernetes
//! API marks with a `merge` patch strategy, and the types on the way to them.
//! Everything not listed here is replaced as a whole.

use serde_json::Value;

/// How a list merges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMerge {
    /// A list of strings: the union.
    Primitive,
    /// A list of objects, merged by these keys.
    Keys(&'static [&'static str]),
}

/// A place in a resource's schema.
#[derive(Clone, Copy, Debug)]
pub enum Node {
    Map(&'static [Field]),
    List {
        merge: Option<ListMerge>,
        elements: Option<&'static [Field]>,
    },
}

#[derive(Debug)]
pub struct Field {
    name: &'static str,
    node: Node,
}

impl Node {
    pub fn field(self, name: &str) -> Option<Node> {
        match self {
            Node::Map(fields) => fields.iter().find(|f| f.name == name).map(|f| f.node),
            Node::List { .. } => None,
        }
    }

    pub fn list_merge(self) -> Option<ListMerge> {
        match self {
            Node::List { merge, .. } => merge,
            Node::Map(_) => None,
        }
    }

    pub fn elements(self) -> Option<Node> {
        match self {
            Node::List { elements, .. } => elements.map(Node::Map),
            Node::Map(_) => None,
        }
    }
}

const fn map(name: &'static str, fields: &'static [Field]) -> Field {
    Field {
        name,
        node: Node::Map(fields),
    }
}

/// A list merged by `keys`, whose elements are `elements`.
const fn keyed(
    name: &'static str,
    keys: &'static [&'static str],
    elements: &'static [Field],
) -> Field {
    Field {
        name,
        node: Node::List {
            merge: Some(ListMerge::Keys(keys)),
            elements: Some(elements),
        },
    }
}

const fn union(name: &'static str) -> Field {
    Field {
        name,
        node: Node::List {
            merge: Some(ListMerge::Primitive),
            elements: None,
        },
    }
}

const NOTHING: &[Field] = &[];

const OBJECT_META: &[Field] = &[
    union("finalizers"),
    keyed("ownerReferences", &["uid"], NOTHING),
];

const CONTAINER: &[Field] = &[
    keyed("env", &["name"], NOTHING),
    keyed("ports", &["containerPort", "protocol"], NOTHING),
    keyed("volumeMounts", &["mountPath"], NOTHING),
    keyed("volumeDevices", &["devicePath"], NOTHING),
];

/// Ephemeral containers merge `env` and mounts, but replace `ports`.
const EPHEMERAL_CONTAINER: &[Field] = &[
    keyed("env", &["name"], NOTHING),
    keyed("volumeMounts", &["mountPath"], NOTHING),
    keyed("volumeDevices", &["devicePath"], NOTHING),
];

const POD_SPEC: &[Field] = &[
    keyed("containers", &["name"], CONTAINER),
    keyed("initContainers", &["name"], CONTAINER),
    keyed("ephemeralContainers", &["name"], EPHEMERAL_CONTAINER),
    keyed("volumes", &["name"], NOTHING),
    keyed("imagePullSecrets", &["name"], NOTHING),
    keyed("hostAliases", &["ip"], NOTHING),
    keyed(
        "topologySpreadConstraints",
        &["topologyKey", "whenUnsatisfiable"],
        NOTHING,
    ),
];

const POD_TEMPLATE_SPEC: &[Field] = &[map("metadata", OBJECT_META), map("spec", POD_SPEC)];

const CONDITIONS: &[Field] = &[keyed("conditions", &["type"], NOTHING)];

const WORKLOAD_SPEC: &[Field] = &[map("template", POD_TEMPLATE_SPEC)];

const JOB_TEMPLATE_SPEC: &[Field] = &[map("metadata", OBJECT_META), map("spec", WORKLOAD_SPEC)];

const POD: &[Field] = &[
    map("metadata", OBJECT_META),
    map("spec", POD_SPEC),
    map(
        "status",
        &[
            keyed("conditions", &["type"], NOTHING),
            keyed("podIPs", &["ip"], NOTHING),
        ],
    ),
];

const POD_TEMPLATE: &[Field] = &[
    map("metadata", OBJECT_META),
    map("template", POD_TEMPLATE_SPEC),
];

const WORKLOAD: &[Field] = &[
    map("metadata", OBJECT_META),
    map("spec", WORKLOAD_SPEC),
    map("status", CONDITIONS),
];

const CRON_JOB: &[Field] = &[
    map("metadata", OBJECT_META),
    map("spec", &[map("jobTemplate", JOB_TEMPLATE_SPEC)]),
];

const SERVICE: &[Field] = &[
    map("metadata", OBJECT_META),
    map("spec", &[keyed("ports", &["port", "protocol"], NOTHING)]),
    map("status", CONDITIONS),
];

const SERVICE_ACCOUNT: &[Field] = &[
    map("metadata", OBJECT_META),
    keyed("secrets", &["name"], NOTHING),
];

const WEBHOOK_CONFIGURATION: &[Field] = &[
    map("metadata", OBJECT_META),
    keyed("webhooks", &["name"], NOTHING),
];

const CSI_NODE: &[Field] = &[
    map("metadata", OBJECT_META),
    map("spec", &[keyed("drivers", &["name"], NOTHING)]),
];

const NODE: &[Field] = &[
    map("metadata", OBJECT_META),
    map("spec", &[union("podCIDRs")]),
    map(
        "status",
        &[
            keyed("addresses", &["type"], NOTHING),
            keyed("conditions", &["type"], NOTHING),
        ],
    ),
];

const WITH_CONDITIONS: &[Field] = &[map("metadata", OBJECT_META), map("status", CONDITIONS)];

const COMPONENT_STATUS: &[Field] = &[
    map("metadata", OBJECT_META),
    keyed("conditions", &["type"], NOTHING),
];

const ANY_BUILT_IN: &[Field] = &[map("metadata", OBJECT_META)];

/// Whether an API group is one of Kubernetes' own.
fn is_built_in_group(group: &str) -> bool {
    group.is_empty()
        || matches!(
            group,
            "apps" | "batch" | "policy" | "autoscaling" | "extensions"
        )
        || group.ends_with(".k8s.io")
}

/// The schema of a resource of this API group and kind, if it is a built-in kind.
pub fn for_kind(group: &str, kind: &str) -> Option<Node> {
    if !is_built_in_group(group) {
        return None;
    }
    let fields = match kind {
        "Pod" => POD,
        "PodTemplate" => POD_TEMPLATE,
        "Deployment"
        | "ReplicaSet"
        | "DaemonSet"
        | "StatefulSet"
        | "ReplicationController"
        | "Job" => WORKLOAD,
        "CronJob" => CRON_JOB,
        "Service" => SERVICE,
        "ServiceAccount" => SERVICE_ACCOUNT,
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => WEBHOOK_CONFIGURATION,
        "CSINode" => CSI_NODE,
        "Node" => NODE,
        "Namespace" | "PersistentVolumeClaim" | "APIService" | "PodDisruptionBudget" => {
            WITH_CONDITIONS
        }
        "ComponentStatus" => COMPONENT_STATUS,
        _ => ANY_BUILT_IN,
    };
    Some(Node::Map(fields))
}

/// The schema for a resource, from its `apiVersion` and `kind`.
pub fn for_resource(value: &Value) -> Option<Node> {
    let api_version = value.get("apiVersion")?.as_str()?;
    let kind = value.get("kind")?.as_str()?;
    if kind.is_empty() || api_version.is_empty() {
        return None;
    }
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    for_kind(group, kind)
}
