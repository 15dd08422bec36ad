//! Which kinds the API server serves, through kube-rs's discovery
//! (`kube::discovery::pinned_group` for one group-version, `kube::discovery::group` for
//! every served version of a group). Answers are kept for one apply: an apply may
//! install CRDs, so the next one asks again.

use std::collections::HashMap;

use kube::core::{ApiResource, GroupVersion};
use kube::discovery::{ApiGroup, Scope};

use super::Api;
use super::failure::Failure;

/// What discovery says about one kind.
#[derive(Clone, Debug)]
pub(crate) struct Found {
    pub resource: ApiResource,
    pub namespaced: bool,
}

#[derive(Default)]
pub(crate) struct Discovery {
    /// apiVersion → the kinds it serves; `None` when that version is not served.
    pinned: HashMap<String, Option<Vec<Found>>>,
    /// group → the kinds of every served version, preferred version first.
    groups: HashMap<String, Option<Vec<Found>>>,
}

fn kinds_of(group: &ApiGroup, version: &str) -> Vec<Found> {
    group
        .versioned_resources(version)
        .into_iter()
        .map(|(resource, capabilities)| Found {
            resource,
            namespaced: capabilities.scope == Scope::Namespaced,
        })
        .collect()
}

/// An answer that says "not served" rather than "cannot tell".
fn not_served(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(response) => response.code == 404,
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}

impl Discovery {
    /// The kind in exactly this apiVersion, or `None` if it is not served there.
    pub async fn resolve(
        &mut self,
        api: &Api,
        api_version: &str,
        kind: &str,
    ) -> Result<Option<Found>, Failure> {
        if !self.pinned.contains_key(api_version) {
            let served = match api_version.parse::<GroupVersion>() {
                Err(_) => None,
                Ok(gv) => {
                    match api
                        .guard(kube::discovery::pinned_group(api.client(), &gv))
                        .await?
                    {
                        Ok(group) => Some(kinds_of(&group, &gv.version)),
                        Err(err) if not_served(&err) => None,
                        Err(err) => return Err(Failure::from_kube(err)),
                    }
                }
            };
            self.pinned.insert(api_version.to_string(), served);
        }
        Ok(self.pinned[api_version]
            .as_ref()
            .and_then(|kinds| kinds.iter().find(|f| f.resource.kind == kind))
            .cloned())
    }

    /// The kind in any served version of `group`, the preferred one first; `None` if
    /// no version serves it.
    pub async fn resolve_in_group(
        &mut self,
        api: &Api,
        group: &str,
        kind: &str,
    ) -> Result<Option<Found>, Failure> {
        if !self.groups.contains_key(group) {
            let served = match api
                .guard(kube::discovery::group(api.client(), group))
                .await?
            {
                Ok(found) => {
                    let preferred = found.preferred_version_or_latest().to_string();
                    let mut versions: Vec<String> = found.versions().map(str::to_string).collect();
                    versions.sort_by_key(|v| *v != preferred);
                    Some(
                        versions
                            .iter()
                            .flat_map(|v| kinds_of(&found, v))
                            .collect::<Vec<_>>(),
                    )
                }
                Err(err) if not_served(&err) => None,
                Err(err) => return Err(Failure::from_kube(err)),
            };
            self.groups.insert(group.to_string(), served);
        }
        Ok(self.groups[group]
            .as_ref()
            .and_then(|kinds| kinds.iter().find(|f| f.resource.kind == kind))
            .cloned())
    }

    /// Forgets what was learnt about `api_version` (after a CRD became Established).
    pub fn forget(&mut self, api_version: &str) {
        self.pinned.remove(api_version);
        if let Ok(gv) = api_version.parse::<GroupVersion>() {
            self.groups.remove(&gv.group);
        }
    }
}
