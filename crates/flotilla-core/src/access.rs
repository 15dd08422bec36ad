//! Who may see and steer what: the roles of people's tokens, and what a token scoped
//! to one tenant sees of the fleet and may steer (docs/tenants.md, "Roles for people").
//!
//! Pure decisions over bundles as the hub stores them: the hub reads the stored
//! bodies, calls these and answers by what they return.
//!
//! - A tenant's token sees a cluster when the bundle served to it names the tenant in
//!   `meta.tenants` (the tenant's workloads target it); on it, only the resources of
//!   the tenant's workloads.
//! - It sees a rollout when one of the rollout's clusters carries the tenant before or
//!   after the change, and may steer it only when everything the rollout changes is
//!   the tenant's: on every changing cluster, the bundle before and after, with the
//!   tenant's resources and marks left out, is the same.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::bundle::{BundleMeta, DriftPolicy, HookMark, ResourceKey, TenantMark};

/// What a person's token may do. Cluster tokens have no role: they are agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Reads the fleet, the rollouts and the web page.
    Viewer,
    /// A viewer who also pauses, resumes, promotes and aborts rollouts.
    Operator,
    /// Everything an operator does, and reads every cluster's bundles.
    Admin,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Admin];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// The role with its article, as a sentence names it: `a viewer`, `an operator`.
    pub fn with_article(self) -> &'static str {
        match self {
            Role::Viewer => "a viewer",
            Role::Operator => "an operator",
            Role::Admin => "an admin",
        }
    }

    /// The role named `text` (`viewer`, `operator`, `admin`).
    pub fn parse(text: &str) -> Result<Role, UnknownRole> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == text)
            .ok_or_else(|| UnknownRole(text.to_string()))
    }

    /// Pauses, resumes, promotes and aborts rollouts.
    pub fn steers(self) -> bool {
        self >= Role::Operator
    }

    /// Reads bundles, which may hold Secrets.
    pub fn reads_bundles(self) -> bool {
        self == Role::Admin
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is none of the roles.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a role; the roles are viewer, operator and admin")]
pub struct UnknownRole(pub String);

/// A bundle as tenant scoping reads it: its resources with their identities, and its
/// metadata.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScopedBundle {
    resources: Vec<(ResourceKey, Value)>,
    meta: BundleMeta,
}

impl ScopedBundle {
    /// Reads a stored bundle body: the canonical resource list, or
    /// `{"meta": …, "resources": […]}`. `None` when it is neither, or a resource has no
    /// identity, or the metadata does not fit the resources.
    pub fn parse(body: &[u8]) -> Option<ScopedBundle> {
        #[derive(serde::Deserialize)]
        struct WithMeta {
            meta: BundleMeta,
            resources: Vec<Value>,
        }
        let (meta, resources) = match body.first() {
            Some(b'{') => {
                let parsed: WithMeta = serde_json::from_slice(body).ok()?;
                (parsed.meta, parsed.resources)
            }
            _ => (BundleMeta::default(), serde_json::from_slice(body).ok()?),
        };
        Self::new(resources, meta)
    }

    /// A bundle made of these resources and this metadata (`None` as for [`parse`]).
    ///
    /// [`parse`]: ScopedBundle::parse
    pub fn new(resources: Vec<Value>, meta: BundleMeta) -> Option<ScopedBundle> {
        meta.check(resources.len()).ok()?;
        let resources = resources
            .into_iter()
            .map(|value| Some((ResourceKey::of(&value)?, value)))
            .collect::<Option<Vec<_>>>()?;
        Some(ScopedBundle { resources, meta })
    }

    /// Whether the tenant's workloads are in this bundle.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.meta.tenants.contains_key(tenant)
    }

    /// The workload of the resource at `index`, if the bundle names workloads.
    fn workload(&self, index: usize) -> Option<&str> {
        self.meta.workloads.get(index).map(String::as_str)
    }

    fn is_tenants(&self, tenant: &str, workload: Option<&str>) -> bool {
        workload
            .and_then(|w| self.meta.tenant_of(w))
            .is_some_and(|(owner, _)| owner == tenant)
    }

    /// Every resource's identity and its workload (when the bundle names workloads),
    /// in bundle order: what a bundle holds, without its content.
    pub fn identities(&self) -> impl Iterator<Item = (&ResourceKey, Option<&str>)> {
        self.resources
            .iter()
            .enumerate()
            .map(|(index, (key, _))| (key, self.workload(index)))
    }

    /// The identities of the tenant's resources in this bundle, in bundle order.
    pub fn resources_of<'a>(&'a self, tenant: &'a str) -> impl Iterator<Item = &'a ResourceKey> {
        self.resources
            .iter()
            .enumerate()
            .filter(move |(index, _)| self.is_tenants(tenant, self.workload(*index)))
            .map(|(_, (key, _))| key)
    }

    /// What scoping reads of this bundle when it shows a tenant the fleet: each
    /// tenant's workloads and resources, without the resources' content.
    pub fn index(&self) -> TenantIndex {
        let tenants = self
            .meta
            .tenants
            .iter()
            .map(|(name, mark)| {
                let entry = TenantEntry {
                    workloads: mark.workloads.clone(),
                    resources: self.resources_of(name).cloned().collect(),
                };
                (name.clone(), entry)
            })
            .collect();
        TenantIndex { tenants }
    }

    /// Everything in the bundle that is not the tenant's: the other resources (each
    /// with its workload and Helm hook mark), the phases without the tenant's
    /// workloads, the other workloads' drift policies and the other tenants' marks.
    fn rest<'a>(&'a self, tenant: &str) -> Rest<'a> {
        let hooks: BTreeMap<usize, &HookMark> =
            self.meta.hooks.iter().map(|h| (h.resource, h)).collect();
        let resources = self
            .resources
            .iter()
            .enumerate()
            .filter(|(index, _)| !self.is_tenants(tenant, self.workload(*index)))
            .map(|(index, (key, value))| {
                let hook = hooks.get(&index).map(|h| HookMark {
                    resource: 0,
                    ..(*h).clone()
                });
                (key, (self.workload(index), value, hook))
            })
            .collect();
        let theirs = |workload: &str| self.is_tenants(tenant, Some(workload));
        let phases = self
            .meta
            .phases
            .iter()
            .map(|phase| {
                phase
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !theirs(w))
                    .collect::<Vec<_>>()
            })
            .filter(|phase| !phase.is_empty())
            .collect();
        let drift = self
            .meta
            .drift
            .iter()
            .filter(|(w, _)| !theirs(w))
            .map(|(w, p)| (w.as_str(), *p))
            .collect();
        let tenants = self
            .meta
            .tenants
            .iter()
            .filter(|(name, _)| name.as_str() != tenant)
            .map(|(name, mark)| (name.as_str(), mark))
            .collect();
        Rest {
            resources,
            phases,
            drift,
            tenants,
        }
    }
}

/// Each tenant of one bundle with its workloads and the identities of its resources:
/// what showing a tenant the fleet needs, small enough to keep for every served
/// digest (made by [`ScopedBundle::index`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantIndex {
    tenants: BTreeMap<String, TenantEntry>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct TenantEntry {
    workloads: Vec<String>,
    resources: Vec<ResourceKey>,
}

impl TenantIndex {
    /// Whether the tenant's workloads are in the bundle.
    pub fn has_tenant(&self, tenant: &str) -> bool {
        self.tenants.contains_key(tenant)
    }

    /// The identities of the tenant's resources, in bundle order.
    pub fn resources_of(&self, tenant: &str) -> &[ResourceKey] {
        self.tenants
            .get(tenant)
            .map_or(&[], |entry| entry.resources.as_slice())
    }

    /// The tenant's workloads in the bundle.
    pub fn workloads_of(&self, tenant: &str) -> &[String] {
        self.tenants
            .get(tenant)
            .map_or(&[], |entry| entry.workloads.as_slice())
    }
}

/// What a bundle holds that is not one tenant's (see [`ScopedBundle::rest`]).
#[derive(PartialEq)]
struct Rest<'a> {
    resources: BTreeMap<&'a ResourceKey, (Option<&'a str>, &'a Value, Option<HookMark>)>,
    phases: Vec<Vec<&'a str>>,
    drift: BTreeMap<&'a str, DriftPolicy>,
    tenants: BTreeMap<&'a str, &'a TenantMark>,
}

/// Whether going from `before` to `after` changes only what is the tenant's: every
/// resource added, removed or changed belongs to the tenant's workloads (on the side
/// it is on), and nothing else of the bundle moves.
pub fn changes_only_of(tenant: &str, before: &ScopedBundle, after: &ScopedBundle) -> bool {
    before.rest(tenant) == after.rest(tenant)
}

/// One changing cluster of a rollout, as read for tenant scoping: the bundle it was
/// served when the rollout started (an empty bundle for a new cluster) and the one the
/// rollout brings. `None`: the stored bundle could not be read.
#[derive(Clone, Copy, Debug)]
pub struct MemberBundles<'a> {
    pub cluster: &'a str,
    pub before: Option<&'a ScopedBundle>,
    pub after: Option<&'a ScopedBundle>,
}

impl MemberBundles<'_> {
    /// Whether the tenant's workloads are on this cluster before or after the change.
    pub fn touches(&self, tenant: &str) -> bool {
        [self.before, self.after]
            .into_iter()
            .flatten()
            .any(|bundle| bundle.has_tenant(tenant))
    }
}

/// What a tenant's token may do with a rollout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RolloutAccess {
    /// It changes none of the tenant's clusters: the token does not see it.
    Hidden,
    /// The token sees it (and, of its clusters, those the tenant is on).
    Visible,
    /// Every change in it is the tenant's: an operator of the tenant may steer it.
    Steerable,
}

/// What a token scoped to `tenant` may do with a rollout whose changing clusters are
/// `members`.
pub fn rollout_access(tenant: &str, members: &[MemberBundles<'_>]) -> RolloutAccess {
    if !members.iter().any(|m| m.touches(tenant)) {
        return RolloutAccess::Hidden;
    }
    let all_theirs = members.iter().all(|m| match (m.before, m.after) {
        (Some(before), Some(after)) => changes_only_of(tenant, before, after),
        _ => false,
    });
    if all_theirs {
        RolloutAccess::Steerable
    } else {
        RolloutAccess::Visible
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config_map(name: &str, namespace: &str, value: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "namespace": namespace},
               "data": {"v": value}})
    }

    /// A bundle of `(workload, resource)` pairs, with tenants owning workloads.
    fn bundle(resources: &[(&str, Value)], tenants: &[(&str, &[&str])]) -> ScopedBundle {
        let mut meta = BundleMeta {
            workloads: resources.iter().map(|(w, _)| w.to_string()).collect(),
            ..BundleMeta::default()
        };
        for (tenant, workloads) in tenants {
            meta.tenants.insert(
                tenant.to_string(),
                TenantMark {
                    workloads: workloads.iter().map(|w| w.to_string()).collect(),
                    namespaces: vec![format!("{tenant}-*")],
                    cluster_scoped: Vec::new(),
                },
            );
        }
        ScopedBundle::new(resources.iter().map(|(_, r)| r.clone()).collect(), meta)
            .expect("a valid bundle")
    }

    #[test]
    fn roles_parse_and_say_what_they_allow() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Ok(role));
        }
        assert_eq!(
            Role::parse("owner").expect_err("unknown").to_string(),
            "\"owner\" is not a role; the roles are viewer, operator and admin"
        );
        assert_eq!(
            Role::ALL.map(|r| (r.steers(), r.reads_bundles())),
            [(false, false), (true, false), (true, true)]
        );
    }

    #[test]
    fn reads_stored_bodies_with_and_without_meta() {
        let plain = serde_json::to_vec(&json!([config_map("a", "x", "1")])).expect("json");
        let plain = ScopedBundle::parse(&plain).expect("plain");
        assert!(!plain.has_tenant("shop"));
        assert_eq!(plain.resources_of("shop").count(), 0);

        let with_meta = json!({
            "meta": {"workloads": ["web"], "tenants": {"shop": {"workloads": ["web"], "namespaces": ["shop"]}}},
            "resources": [config_map("a", "shop", "1")],
        });
        let with_meta =
            ScopedBundle::parse(&serde_json::to_vec(&with_meta).expect("json")).expect("with meta");
        assert!(with_meta.has_tenant("shop") && !with_meta.has_tenant("bank"));
        assert_eq!(
            with_meta
                .resources_of("shop")
                .map(|k| k.name())
                .collect::<Vec<_>>(),
            ["a"]
        );
        let index = with_meta.index();
        assert!(index.has_tenant("shop") && !index.has_tenant("bank"));
        assert_eq!(index.workloads_of("shop"), ["web"]);
        assert_eq!(
            index
                .resources_of("shop")
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>(),
            ["a"]
        );
        assert!(index.resources_of("bank").is_empty() && index.workloads_of("bank").is_empty());
        // Metadata that does not fit the resources, and bodies that are not bundles.
        let misfit = json!({"meta": {"workloads": ["web", "api"]}, "resources": [config_map("a", "x", "1")]});
        for body in [
            serde_json::to_vec(&misfit).expect("json"),
            b"not json".to_vec(),
            br#"[{"kind": "ConfigMap"}]"#.to_vec(),
        ] {
            assert_eq!(ScopedBundle::parse(&body), None);
        }
    }

    /// Each case: a change of one cluster's bundle, and whether it is only the shop's.
    #[test]
    fn a_change_is_the_tenants_only_when_nothing_else_moves() {
        let tenants: &[(&str, &[&str])] = &[("shop", &["web"]), ("bank", &["ledger"])];
        let base = vec![
            ("web", config_map("web", "shop", "1")),
            ("ledger", config_map("ledger", "bank", "1")),
            ("dns", config_map("dns", "kube-system", "1")),
        ];
        let with = |index: usize, resource: Option<(&'static str, Value)>| {
            let mut resources = base.clone();
            match resource {
                Some(r) => resources[index] = r,
                None => {
                    resources.remove(index);
                }
            }
            bundle(&resources, tenants)
        };
        let before = bundle(&base, tenants);
        let cases: Vec<(&str, ScopedBundle, bool)> = vec![
            ("nothing changes", before.clone(), true),
            (
                "the shop's resource changes",
                with(0, Some(("web", config_map("web", "shop", "2")))),
                true,
            ),
            ("the shop's resource goes", with(0, None), true),
            (
                "the bank's resource changes",
                with(1, Some(("ledger", config_map("ledger", "bank", "2")))),
                false,
            ),
            (
                "the platform's resource changes",
                with(2, Some(("dns", config_map("dns", "kube-system", "2")))),
                false,
            ),
            ("the platform's resource goes", with(2, None), false),
            (
                "a platform resource moves into the shop's workload",
                bundle(
                    &[
                        ("web", config_map("web", "shop", "1")),
                        ("ledger", config_map("ledger", "bank", "1")),
                        ("web", config_map("dns", "kube-system", "1")),
                    ],
                    tenants,
                ),
                false,
            ),
            (
                "another tenant's rules change",
                bundle(&base, &[("shop", &["web"]), ("bank", &["ledger", "audit"])]),
                false,
            ),
            (
                "the shop's own rules change",
                {
                    let mut b = bundle(&base, tenants);
                    if let Some(mark) = b.meta.tenants.get_mut("shop") {
                        mark.namespaces.push("shop-extra".into());
                    }
                    b
                },
                true,
            ),
            (
                "a platform workload's drift policy changes",
                {
                    let mut b = bundle(&base, tenants);
                    b.meta.drift.insert("dns".into(), DriftPolicy::Report);
                    b
                },
                false,
            ),
            (
                "the shop's drift policy changes",
                {
                    let mut b = bundle(&base, tenants);
                    b.meta.drift.insert("web".into(), DriftPolicy::Report);
                    b
                },
                true,
            ),
        ];
        for (case, after, expected) in cases {
            assert_eq!(changes_only_of("shop", &before, &after), expected, "{case}");
        }
    }

    #[test]
    fn a_rollout_is_seen_where_the_tenant_is_and_steered_only_when_all_of_it_is_theirs() {
        let tenants: &[(&str, &[&str])] = &[("shop", &["web"])];
        let shop_v1 = bundle(&[("web", config_map("web", "shop", "1"))], tenants);
        let shop_v2 = bundle(&[("web", config_map("web", "shop", "2"))], tenants);
        let platform_v1 = bundle(&[("dns", config_map("dns", "kube-system", "1"))], &[]);
        let platform_v2 = bundle(&[("dns", config_map("dns", "kube-system", "2"))], &[]);
        let empty = ScopedBundle::default();
        let member = |cluster, before, after| MemberBundles {
            cluster,
            before,
            after,
        };
        let cases = [
            (
                "the shop's change on its cluster",
                vec![member("a", Some(&shop_v1), Some(&shop_v2))],
                RolloutAccess::Steerable,
            ),
            (
                "the shop's first deploy to a new cluster",
                vec![member("a", Some(&empty), Some(&shop_v1))],
                RolloutAccess::Steerable,
            ),
            (
                "the shop's change and a platform change elsewhere",
                vec![
                    member("a", Some(&shop_v1), Some(&shop_v2)),
                    member("b", Some(&platform_v1), Some(&platform_v2)),
                ],
                RolloutAccess::Visible,
            ),
            (
                "a platform change only",
                vec![member("b", Some(&platform_v1), Some(&platform_v2))],
                RolloutAccess::Hidden,
            ),
            (
                "the shop's change, one bundle unreadable",
                vec![member("a", None, Some(&shop_v2))],
                RolloutAccess::Visible,
            ),
            ("no clusters", vec![], RolloutAccess::Hidden),
        ];
        for (case, members, expected) in cases {
            assert_eq!(rollout_access("shop", &members), expected, "{case}");
            assert_eq!(
                rollout_access("bank", &members),
                RolloutAccess::Hidden,
                "{case}: another tenant"
            );
        }
    }
}
