//! Conformance tests for JSON Patch (RFC 6902) and JSON Merge Patch (RFC 7396).
//!
//! Table-driven over the shared test data:
//! * `json-patch-tests/{tests,spec_tests}.json`: records with `doc`, `patch`
//!   and `expected` or `error` (records marked `disabled`, or holding only a
//!   `comment`, are skipped);
//! * `json-merge-patch/rfc7396-test-cases.json`: groups with `given` and
//!   `cases` of `patch` / `result` (RFC 7396 appendix A).
//!
//! The data lives in `../shared/testdata` beside the checkout; without it (a fresh
//! clone) these tests say that they skip, and CI, which has it, runs them.

use flotilla_render::patch::{PatchError, apply_json_patch, apply_merge_patch};

use serde_json::{Value, json};

/// Reads one file of the shared test data, or `None` (after saying why the test
/// skips) when the data is not beside this checkout.
fn load(test: &str, relative: &str) -> Option<Value> {
    let path = match flotilla_testkit::shared_testdata(relative) {
        Ok(path) => path,
        Err(reason) => {
            flotilla_testkit::can_run(test, Some(reason));
            return None;
        }
    };
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read test data {}: {e}", path.display()));
    Some(
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display())),
    )
}

/// Outcome of running one json-patch-tests file.
#[derive(Debug, Default)]
struct Tally {
    ran: usize,
    skipped: usize,
    failures: Vec<String>,
}

fn run_json_patch_file(records: &Value, relative: &str) -> Tally {
    let records = records
        .as_array()
        .unwrap_or_else(|| panic!("{relative}: top level must be an array"));
    let mut tally = Tally::default();
    for (i, record) in records.iter().enumerate() {
        // Not every record has a comment; the expected error text also
        // identifies a case.
        let comment = record
            .get("comment")
            .or_else(|| record.get("error"))
            .and_then(Value::as_str)
            .unwrap_or("(no comment)");
        let label = format!("{relative} #{i} {comment:?}");
        let disabled = record.get("disabled").and_then(Value::as_bool) == Some(true);
        let (Some(doc), Some(patch)) = (record.get("doc"), record.get("patch")) else {
            // A record holding only a comment.
            tally.skipped += 1;
            continue;
        };
        if disabled {
            tally.skipped += 1;
            continue;
        }
        tally.ran += 1;

        let mut actual = doc.clone();
        let outcome = apply_json_patch(&mut actual, patch);
        match (record.get("expected"), record.get("error"), outcome) {
            (_, Some(error), Ok(())) => tally.failures.push(format!(
                "{label}: expected an error ({error}), but the patch applied, giving {actual}"
            )),
            (_, Some(_), Err(_)) if actual != *doc => tally.failures.push(format!(
                "{label}: failed patch changed the document to {actual}"
            )),
            (_, Some(_), Err(_)) => {}
            (_, None, Err(e)) => tally
                .failures
                .push(format!("{label}: unexpected error: {e}")),
            (Some(expected), None, Ok(())) if actual != *expected => tally
                .failures
                .push(format!("{label}: got {actual}, expected {expected}")),
            // No `expected`: the patch only has to apply.
            (_, None, Ok(())) => {}
        }
    }
    tally
}

fn check(test: &str, relative: &str) {
    let Some(records) = load(test, relative) else {
        return;
    };
    let tally = run_json_patch_file(&records, relative);
    assert!(tally.ran > 0, "{relative}: no cases ran");
    assert!(
        tally.failures.is_empty(),
        "{relative}: {} of {} cases failed:\n{}",
        tally.failures.len(),
        tally.ran,
        tally.failures.join("\n")
    );
    println!(
        "{relative}: {} passed, {} skipped",
        tally.ran, tally.skipped
    );
}

#[test]
fn json_patch_tests() {
    check("json_patch_tests", "json-patch-tests/tests.json");
}

#[test]
fn json_patch_spec_tests() {
    check("json_patch_spec_tests", "json-patch-tests/spec_tests.json");
}

#[test]
fn json_merge_patch_rfc7396() {
    let Some(groups) = load(
        "json_merge_patch_rfc7396",
        "json-merge-patch/rfc7396-test-cases.json",
    ) else {
        return;
    };
    let groups = groups.as_array().expect("top level must be an array");
    let mut ran = 0;
    let mut failures = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let given = group
            .get("given")
            .unwrap_or_else(|| panic!("group #{g}: missing \"given\""));
        let cases = group
            .get("cases")
            .and_then(Value::as_array)
            .unwrap_or_else(|| panic!("group #{g}: missing \"cases\""));
        for (c, case) in cases.iter().enumerate() {
            let (Some(patch), Some(result)) = (case.get("patch"), case.get("result")) else {
                panic!("group #{g} case #{c}: needs \"patch\" and \"result\"");
            };
            ran += 1;
            let mut actual = given.clone();
            apply_merge_patch(&mut actual, patch);
            if actual != *result {
                failures.push(format!(
                    "group #{g} case #{c}: {given} + {patch} gave {actual}, expected {result}"
                ));
            }
        }
    }
    assert!(ran > 0, "no merge patch cases ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!("rfc7396-test-cases.json: {ran} passed");
}

// ---------------------------------------------------------------------------
// Error messages (exact text) and atomicity
// ---------------------------------------------------------------------------

fn error_of(doc: Value, ops: Value) -> String {
    let mut doc = doc;
    let before = doc.clone();
    let err: PatchError = apply_json_patch(&mut doc, &ops).expect_err("patch should fail");
    assert_eq!(
        doc, before,
        "a failed patch must leave the document as it was"
    );
    err.to_string()
}

#[test]
fn message_path_does_not_exist() {
    assert_eq!(
        error_of(
            json!({"spec": {"template": {}}}),
            json!([
                {"op": "test", "path": "/spec/template", "value": {}},
                {"op": "add", "path": "/spec/paused", "value": true},
                {"op": "replace", "path": "/spec/replicas", "value": 3}
            ])
        ),
        "operation 2 (replace /spec/replicas): path does not exist"
    );
    assert_eq!(
        error_of(
            json!({"a": 1}),
            json!([{"op": "copy", "from": "/b", "path": "/c"}])
        ),
        "operation 0 (copy /c): from location /b does not exist"
    );
    assert_eq!(
        error_of(
            json!({"a": 1}),
            json!([{"op": "add", "path": "/x/y", "value": 1}])
        ),
        "operation 0 (add /x/y): parent of path does not exist"
    );
    assert_eq!(
        error_of(
            json!({"a": 1}),
            json!([{"op": "add", "path": "/a/b", "value": 1}])
        ),
        "operation 0 (add /a/b): parent of path is a number, not an object or array"
    );
}

#[test]
fn message_test_value_differs() {
    assert_eq!(
        error_of(
            json!({"a": 1}),
            json!([{"op": "test", "path": "/a", "value": 2}])
        ),
        "operation 0 (test /a): value differs"
    );
}

#[test]
fn message_missing_and_malformed_fields() {
    assert_eq!(
        error_of(
            json!({}),
            json!([{"op": "add", "path": "/a", "value": 1}, {"op": "remove"}])
        ),
        "operation 1: missing field \"path\""
    );
    assert_eq!(
        error_of(json!({}), json!([{"path": "/a"}])),
        "operation 0: missing field \"op\""
    );
    assert_eq!(
        error_of(json!([1]), json!([{"op": "replace", "path": "/0"}])),
        "operation 0: missing field \"value\""
    );
    assert_eq!(
        error_of(json!([1]), json!([{"op": "move", "path": "/0"}])),
        "operation 0: missing field \"from\""
    );
    assert_eq!(
        error_of(json!({}), json!([{"op": "add", "path": null, "value": 1}])),
        "operation 0: field \"path\" must be a string, found null"
    );
    assert_eq!(
        error_of(json!({}), json!([{"op": "spam", "path": "/a"}])),
        "operation 0: unknown op \"spam\""
    );
    assert_eq!(
        error_of(json!({}), json!([42])),
        "operation 0: must be a JSON object, found a number"
    );
    assert_eq!(
        error_of(json!({}), json!({"op": "add", "path": "/a", "value": 1})),
        "patch must be a JSON array of operations, found an object"
    );
}

#[test]
fn message_move_into_child() {
    assert_eq!(
        error_of(
            json!({"a": {"b": {}}}),
            json!([
                {"op": "test", "path": "/a/b", "value": {}},
                {"op": "add", "path": "/x", "value": 1},
                {"op": "remove", "path": "/x"},
                {"op": "move", "from": "/a", "path": "/a/b"}
            ])
        ),
        "operation 3 (move /a/b): cannot move a location into one of its children"
    );
}

#[test]
fn message_invalid_pointers_and_indices() {
    assert_eq!(
        error_of(json!({}), json!([{"op": "add", "path": "foo", "value": 1}])),
        "operation 0 (add foo): invalid JSON pointer \"foo\" in field \"path\": must be empty or start with '/'"
    );
    assert_eq!(
        error_of(
            json!({}),
            json!([{"op": "copy", "from": "/a~2", "path": "/b"}])
        ),
        "operation 0 (copy /b): invalid JSON pointer \"/a~2\" in field \"from\": '~' must be followed by '0' or '1'"
    );
    assert_eq!(
        error_of(
            json!({"bar": [1, 2]}),
            json!([{"op": "add", "path": "/bar/8", "value": 5}])
        ),
        "operation 0 (add /bar/8): array index 8 in path is out of bounds (array length 2)"
    );
    assert_eq!(
        error_of(
            json!(["a", "b"]),
            json!([{"op": "test", "path": "/01", "value": "b"}])
        ),
        "operation 0 (test /01): invalid array index \"01\" in path: leading zeros are not allowed"
    );
    assert_eq!(
        error_of(json!(["a", "b"]), json!([{"op": "remove", "path": "/1e0"}])),
        "operation 0 (remove /1e0): invalid array index \"1e0\" in path: expected a non-negative decimal integer"
    );
    assert_eq!(
        error_of(json!(["a"]), json!([{"op": "remove", "path": "/-"}])),
        "operation 0 (remove /-): invalid array index \"-\" in path: \"-\" is only valid as the last token of an add, move or copy destination"
    );
    assert_eq!(
        error_of(
            json!({"a": [1]}),
            json!([{"op": "move", "from": "/a/3", "path": "/b"}])
        ),
        "operation 0 (move /b): array index 3 in from location /a/3 is out of bounds (array length 1)"
    );
    assert_eq!(
        error_of(json!({"a": 1}), json!([{"op": "remove", "path": ""}])),
        "operation 0 (remove \"\"): cannot remove the whole document"
    );
}

#[test]
fn failed_patch_leaves_document_untouched() {
    let original = json!({"a": [1, 2, 3], "b": {"c": "d"}});
    let mut doc = original.clone();
    let ops = json!([
        {"op": "remove", "path": "/a/0"},
        {"op": "add", "path": "/b/e", "value": "f"},
        {"op": "move", "from": "/b/c", "path": "/z"},
        {"op": "test", "path": "/z", "value": "not d"}
    ]);
    let err = apply_json_patch(&mut doc, &ops).expect_err("test op must fail");
    assert_eq!(err.operation_index(), Some(3));
    assert_eq!(doc, original);
}

#[test]
fn test_op_compares_numbers_by_value_and_objects_unordered() {
    let mut doc = json!({"n": 1, "o": {"x": 1, "y": [2.0, {"z": null}]}});
    let ops = json!([
        {"op": "test", "path": "/n", "value": 1.0},
        {"op": "test", "path": "/o", "value": {"y": [2, {"z": null}], "x": 1.0}}
    ]);
    assert_eq!(apply_json_patch(&mut doc, &ops), Ok(()));
}

#[test]
fn move_within_array_and_to_end() {
    let mut doc = json!({"a": [1, 2, 3], "b": []});
    let ops = json!([
        {"op": "move", "from": "/a/0", "path": "/a/-"},
        {"op": "copy", "from": "/a", "path": "/b/-"},
        {"op": "add", "path": "/c~1d", "value": {"~": 0}},
        {"op": "replace", "path": "/c~1d/~0", "value": 1}
    ]);
    assert_eq!(apply_json_patch(&mut doc, &ops), Ok(()));
    assert_eq!(
        doc,
        json!({"a": [2, 3, 1], "b": [[2, 3, 1]], "c/d": {"~": 1}})
    );
}

fn keys(doc: &Value) -> Vec<&str> {
    doc.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn removal_keeps_member_order() {
    // Meaningful when serde_json's `preserve_order` feature is on: removing a
    // member must not reorder the others (with the default sorted map the
    // order is alphabetical either way).
    let mut doc = json!({"a": 1, "b": 2, "c": 3, "d": 4});
    let ops = json!([
        {"op": "remove", "path": "/a"},
        {"op": "move", "from": "/b", "path": "/e"}
    ]);
    assert_eq!(apply_json_patch(&mut doc, &ops), Ok(()));
    assert_eq!(keys(&doc), ["c", "d", "e"]);
    assert_eq!(doc, json!({"c": 3, "d": 4, "e": 2}));

    let mut doc = json!({"w": 1, "x": null, "y": 3, "z": 4});
    apply_merge_patch(&mut doc, &json!({"w": null, "zz": 0}));
    assert_eq!(keys(&doc), ["x", "y", "z", "zz"]);
    assert_eq!(doc, json!({"x": null, "y": 3, "z": 4, "zz": 0}));
}
