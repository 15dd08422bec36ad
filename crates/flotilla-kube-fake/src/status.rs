//! The `Status` documents the API server answers errors with, built as
//! `staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go` builds them (NewNotFound,
//! NewConflict, NewForbidden, NewInvalid, NewBadRequest, NewInternalError, ...), so the
//! messages have the shapes clients and operators meet on a real cluster.

use serde_json::{Value, json};

/// An answer that is not a success: the HTTP status code and its JSON body.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub body: Value,
}

/// A resource qualified by its group, printed as `configmaps` or `deployments.apps`
/// (`schema.GroupResource.String()`).
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn failure(code: u16, reason: Option<&str>, message: String, details: Option<Value>) -> ApiError {
    let mut body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "message": message, "code": code});
    if let Some(reason) = reason {
        body["reason"] = json!(reason);
    }
    if let Some(details) = details {
        body["details"] = details;
    }
    ApiError { code, body }
}

fn details(group: &str, resource: &str, name: &str) -> Value {
    let mut details = json!({"kind": resource});
    if !name.is_empty() {
        details["name"] = json!(name);
    }
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    details
}

/// `NewNotFound`: `configmaps "cfg" not found`.
pub fn not_found(group: &str, resource: &str, name: &str) -> ApiError {
    failure(
        404,
        Some("NotFound"),
        format!("{} {name:?} not found", qualified(group, resource)),
        Some(details(group, resource, name)),
    )
}

/// The answer for a path no API serves (an unknown group, an unserved version):
/// `staging/src/k8s.io/apiserver/pkg/util/notfoundhandler/notfoundhandler.go`.
pub fn no_such_resource() -> ApiError {
    failure(
        404,
        Some("NotFound"),
        "the server could not find the requested resource".into(),
        Some(json!({})),
    )
}

/// `NewConflict`: `Operation cannot be fulfilled on configmaps "cfg": <why>`.
pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
    failure(
        409,
        Some("Conflict"),
        format!(
            "Operation cannot be fulfilled on {} {name:?}: {why}",
            qualified(group, resource)
        ),
        Some(details(group, resource, name)),
    )
}

/// `NewApplyConflict`: a server-side apply conflict, one cause per field
/// (`staging/src/k8s.io/apimachinery/pkg/util/managedfields/internal/conflict.go`).
pub fn apply_conflict(message: String, causes: Vec<(String, String)>) -> ApiError {
    let causes: Vec<Value> = causes
        .into_iter()
        .map(|(field, message)| json!({"reason": "FieldManagerConflict", "message": message, "field": field}))
        .collect();
    failure(
        409,
        Some("Conflict"),
        message,
        Some(json!({"causes": causes})),
    )
}

/// `NewForbidden`: `configmaps "cfg" is forbidden: <why>`.
pub fn forbidden(group: &str, resource: &str, name: &str, why: &str) -> ApiError {
    let message = if name.is_empty() {
        format!("{} is forbidden: {why}", qualified(group, resource))
    } else {
        format!(
            "{} {name:?} is forbidden: {why}",
            qualified(group, resource)
        )
    };
    failure(
        403,
        Some("Forbidden"),
        message,
        Some(details(group, resource, name)),
    )
}

/// `NewInvalid`: `ConfigMap "cfg" is invalid: <field errors>`, 422.
pub fn invalid(group: &str, kind: &str, name: &str, errors: &[(String, String)]) -> ApiError {
    let qualified_kind = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    // `field.ErrorList.ToAggregate()` prints one error as itself and several in brackets.
    let texts: Vec<String> = errors
        .iter()
        .map(|(field, message)| format!("{field}: {message}"))
        .collect();
    let aggregate = if texts.len() == 1 {
        texts[0].clone()
    } else {
        format!("[{}]", texts.join(", "))
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|(field, message)| json!({"reason": "FieldValueInvalid", "message": message, "field": field}))
        .collect();
    let mut details = json!({"name": name, "kind": kind, "causes": causes});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    failure(
        422,
        Some("Invalid"),
        format!("{qualified_kind} {name:?} is invalid: {aggregate}"),
        Some(details),
    )
}

/// `NewBadRequest`.
pub fn bad_request(message: impl Into<String>) -> ApiError {
    failure(400, Some("BadRequest"), message.into(), None)
}

/// `NewInternalError`: `Internal error occurred: <why>`.
pub fn internal(why: &str) -> ApiError {
    failure(
        500,
        Some("InternalError"),
        format!("Internal error occurred: {why}"),
        Some(json!({"causes": [{"message": why}]})),
    )
}

/// An error that is not a `StatusError` reaching the handler: `ErrorToAPIStatus` turns it
/// into a 500 that carries only the message (this is how "failed to create typed patch
/// object" arrives; see kubernetes/kubernetes#122480).
pub fn untyped_500(message: String) -> ApiError {
    failure(500, None, message, None)
}

/// `NewUnauthorized("Unauthorized")`, as the authentication filter answers
/// (`staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go`).
pub fn unauthorized() -> ApiError {
    failure(401, Some("Unauthorized"), "Unauthorized".into(), None)
}

/// Any other failure, for injected faults (429, 503, ...).
pub fn other(code: u16, reason: &str, message: &str) -> ApiError {
    failure(code, Some(reason), message.to_string(), None)
}

/// The `Status` a successful delete of an object without finalizers returns
/// (`staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`, `Delete`).
pub fn deleted(group: &str, resource: &str, name: &str, uid: &str) -> Value {
    let mut details = details(group, resource, name);
    details["uid"] = json!(uid);
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
           "details": details})
}
