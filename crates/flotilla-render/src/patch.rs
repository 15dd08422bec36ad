//! JSON Patch (RFC 6902) and JSON Merge Patch (RFC 7396) over [`serde_json::Value`].
//!
//! * [`apply_json_patch`] applies an RFC 6902 patch document (a JSON array of
//!   operation objects). It is atomic: when any operation fails, the target
//!   document is left exactly as it was.
//! * [`apply_merge_patch`] applies an RFC 7396 merge patch. It cannot fail.
//!
//! JSON pointers follow RFC 6901: `""` is the whole document, every other
//! pointer starts with `/`, `~1` decodes to `/` and `~0` to `~`. Array indices
//! are decimal without leading zeros; `-` (the element past the end) is only
//! accepted as the last token of the destination of `add`, `move` or `copy`.
//!
//! Nothing in this module panics on malformed input: every problem with the
//! patch or with how it fits the document is reported as a [`PatchError`]
//! naming the operation (0-based index and op name), the pointer and the cause.
//!
//! A JSON Patch can grow a document without bound (`copy` the root into a child
//! twelve times and it nests 4,096 deep; forty times and it holds 2^40 copies), so
//! every operation is checked against [`PatchLimits`] before its result is built:
//! the nesting depth (the one limit the agent applies too) and the size as JSON.

use std::fmt;

use serde_json::{Map, Number, Value};

use flotilla_core::bundle::{MAX_NESTING_DEPTH, approximate_json_size, nests_deeper_than};
use flotilla_core::limits::Limits;

/// How deep and how large a patched document may become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PatchLimits {
    /// The deepest nesting of arrays and objects (a scalar is at depth 0).
    pub max_depth: usize,
    /// The largest document, in bytes of compact JSON (escapes not counted).
    pub max_bytes: usize,
}

impl Default for PatchLimits {
    fn default() -> PatchLimits {
        PatchLimits {
            max_depth: MAX_NESTING_DEPTH,
            max_bytes: Limits::DEFAULT_MAX_RESOURCE_BYTES,
        }
    }
}

/// Which pointer of an operation an error is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// The operation's `path` member.
    Path,
    /// The operation's `from` member (`move` and `copy`), with its raw text.
    From(String),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Path => f.write_str("path"),
            Location::From(from) => write!(f, "from location {}", show(from)),
        }
    }
}

/// Why a JSON Patch could not be applied.
///
/// Every message names the failing operation by its 0-based index and, once
/// the op name is known, the op name and its `path`, e.g.
/// `operation 2 (replace /spec/replicas): path does not exist`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PatchError {
    /// The patch document is not a JSON array.
    #[error("patch must be a JSON array of operations, found {found}")]
    NotAnArray { found: &'static str },

    /// An element of the patch array is not a JSON object.
    #[error("operation {index}: must be a JSON object, found {found}")]
    NotAnObject { index: usize, found: &'static str },

    /// A member the operation requires (`op`, `path`, `from`, `value`) is absent.
    #[error("operation {index}: missing field \"{field}\"")]
    MissingField { index: usize, field: &'static str },

    /// `op`, `path` or `from` is present but not a string.
    #[error("operation {index}: field \"{field}\" must be a string, found {found}")]
    NotAString {
        index: usize,
        field: &'static str,
        found: &'static str,
    },

    /// `op` is not one of add, remove, replace, move, copy, test.
    #[error("operation {index}: unknown op {op:?}")]
    UnknownOp { index: usize, op: String },

    /// `path` or `from` is not a valid JSON pointer.
    #[error(
        "operation {index} ({op} {}): invalid JSON pointer {pointer:?} in field \"{field}\": {reason}",
        show(.path)
    )]
    InvalidPointer {
        index: usize,
        op: &'static str,
        path: String,
        field: &'static str,
        pointer: String,
        reason: &'static str,
    },

    /// The value the pointer refers to does not exist.
    #[error("operation {index} ({op} {}): {location} does not exist", show(.path))]
    NotFound {
        index: usize,
        op: &'static str,
        path: String,
        location: Location,
    },

    /// The object or array that should receive a new value does not exist.
    #[error("operation {index} ({op} {}): parent of path does not exist", show(.path))]
    ParentNotFound {
        index: usize,
        op: &'static str,
        path: String,
    },

    /// The value that should receive a new member is not an object or array.
    #[error(
        "operation {index} ({op} {}): parent of path is {found}, not an object or array",
        show(.path)
    )]
    ParentNotContainer {
        index: usize,
        op: &'static str,
        path: String,
        found: &'static str,
    },

    /// An array index is well formed but past the end of the array.
    #[error(
        "operation {index} ({op} {}): array index {array_index} in {location} is out of bounds (array length {len})",
        show(.path)
    )]
    IndexOutOfBounds {
        index: usize,
        op: &'static str,
        path: String,
        location: Location,
        array_index: usize,
        len: usize,
    },

    /// A pointer token used on an array is not a valid index there
    /// (`01`, `1e0`, `-1`, or `-` where no new element is being added).
    #[error(
        "operation {index} ({op} {}): invalid array index {token:?} in {location}: {reason}",
        show(.path)
    )]
    InvalidIndex {
        index: usize,
        op: &'static str,
        path: String,
        location: Location,
        token: String,
        reason: &'static str,
    },

    /// A `test` operation found a different value.
    #[error("operation {index} (test {}): value differs", show(.path))]
    TestFailed { index: usize, path: String },

    /// A `move` whose `from` is a proper prefix of its `path`.
    #[error(
        "operation {index} (move {}): cannot move a location into one of its children",
        show(.path)
    )]
    MoveIntoChild {
        index: usize,
        path: String,
        from: String,
    },

    /// A `remove` of the whole document (`path` is `""`).
    #[error("operation {index} (remove \"\"): cannot remove the whole document")]
    RemoveRoot { index: usize },

    /// The operation would nest the document deeper than [`PatchLimits::max_depth`].
    #[error(
        "operation {index} ({op} {}): the result would nest arrays and objects deeper than {limit} levels",
        show(.path)
    )]
    TooDeep {
        index: usize,
        op: &'static str,
        path: String,
        limit: usize,
    },

    /// The operation would make the document larger than [`PatchLimits::max_bytes`].
    #[error(
        "operation {index} ({op} {}): the result would be larger than {limit} bytes as JSON",
        show(.path)
    )]
    TooLarge {
        index: usize,
        op: &'static str,
        path: String,
        limit: usize,
    },
}

impl PatchError {
    /// The 0-based index of the failing operation, when the error is about one.
    #[must_use]
    pub fn operation_index(&self) -> Option<usize> {
        match self {
            PatchError::NotAnArray { .. } => None,
            PatchError::NotAnObject { index, .. }
            | PatchError::MissingField { index, .. }
            | PatchError::NotAString { index, .. }
            | PatchError::UnknownOp { index, .. }
            | PatchError::InvalidPointer { index, .. }
            | PatchError::NotFound { index, .. }
            | PatchError::ParentNotFound { index, .. }
            | PatchError::ParentNotContainer { index, .. }
            | PatchError::IndexOutOfBounds { index, .. }
            | PatchError::InvalidIndex { index, .. }
            | PatchError::TestFailed { index, .. }
            | PatchError::MoveIntoChild { index, .. }
            | PatchError::TooDeep { index, .. }
            | PatchError::TooLarge { index, .. }
            | PatchError::RemoveRoot { index } => Some(*index),
        }
    }
}

/// Applies an RFC 6902 JSON Patch to `doc`, within the default [`PatchLimits`].
///
/// `ops` must be a JSON array of operation objects. The whole patch is
/// validated (members, op names, pointer syntax) before anything is applied,
/// and the operations are then applied in order to a copy of `doc`, which
/// replaces `doc` only if every operation succeeded: on error `doc` is
/// unchanged. Members an operation does not use are ignored.
///
/// # Errors
///
/// Returns a [`PatchError`] when `ops` is not an array of well-formed
/// operations, or when an operation cannot be applied (a location that does
/// not exist, a bad array index, a failed `test`, a `move` into its own child,
/// a result too deep or too large).
pub fn apply_json_patch(doc: &mut Value, ops: &Value) -> Result<(), PatchError> {
    apply_json_patch_within(doc, ops, &PatchLimits::default())
}

/// [`apply_json_patch`] within the given limits. Each operation is checked before
/// its result is built, so a patch that would grow the document past them costs no
/// more memory than about twice `limits.max_bytes`.
pub fn apply_json_patch_within(
    doc: &mut Value,
    ops: &Value,
    limits: &PatchLimits,
) -> Result<(), PatchError> {
    if ops.as_array().is_some_and(Vec::is_empty) {
        return Ok(());
    }
    let mut work = doc.clone();
    apply_json_patch_in_place(&mut work, ops, limits)?;
    *doc = work;
    Ok(())
}

/// As [`apply_json_patch_within`], but patching `doc` itself: after an error it is
/// left partly patched, for a caller that then drops it.
pub fn apply_json_patch_in_place(
    doc: &mut Value,
    ops: &Value,
    limits: &PatchLimits,
) -> Result<(), PatchError> {
    let ops = parse_patch(ops)?;
    let mut size = approximate_json_size(doc, usize::MAX);
    for op in &ops {
        op.apply(doc, &mut size, limits)?;
    }
    Ok(())
}

/// Applies an RFC 7396 JSON Merge Patch to `doc`.
///
/// An object patch merges member by member (a `null` member removes the key,
/// any other member is merged recursively); any other patch value replaces
/// the document outright.
pub fn apply_merge_patch(doc: &mut Value, patch: &Value) {
    let Value::Object(members) = patch else {
        *doc = patch.clone();
        return;
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Value::Object(target) = doc {
        for (key, value) in members {
            if value.is_null() {
                take_member(target, key);
            } else {
                apply_merge_patch(target.entry(key.as_str()).or_insert(Value::Null), value);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing of the patch document
// ---------------------------------------------------------------------------

/// One validated operation, borrowing from the patch document.
struct Operation<'a> {
    index: usize,
    op: &'static str,
    path_raw: &'a str,
    path: Vec<String>,
    action: Action<'a>,
}

enum Action<'a> {
    Add(&'a Value),
    Remove,
    Replace(&'a Value),
    Move {
        from_raw: &'a str,
        from: Vec<String>,
    },
    Copy {
        from_raw: &'a str,
        from: Vec<String>,
    },
    Test(&'a Value),
}

fn parse_patch(ops: &Value) -> Result<Vec<Operation<'_>>, PatchError> {
    let Value::Array(items) = ops else {
        return Err(PatchError::NotAnArray {
            found: describe(ops),
        });
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| parse_operation(index, item))
        .collect()
}

fn parse_operation(index: usize, item: &Value) -> Result<Operation<'_>, PatchError> {
    let Value::Object(members) = item else {
        return Err(PatchError::NotAnObject {
            index,
            found: describe(item),
        });
    };
    let op_name = string_member(index, members, "op")?;
    let op = match op_name {
        "add" => "add",
        "remove" => "remove",
        "replace" => "replace",
        "move" => "move",
        "copy" => "copy",
        "test" => "test",
        other => {
            return Err(PatchError::UnknownOp {
                index,
                op: other.to_owned(),
            });
        }
    };
    let path_raw = string_member(index, members, "path")?;
    let pointer = |field: &'static str, raw: &str| {
        parse_pointer(raw).map_err(|reason| PatchError::InvalidPointer {
            index,
            op,
            path: path_raw.to_owned(),
            field,
            pointer: raw.to_owned(),
            reason,
        })
    };
    let path = pointer("path", path_raw)?;
    let value = || {
        members.get("value").ok_or(PatchError::MissingField {
            index,
            field: "value",
        })
    };
    let action = match op {
        "add" => Action::Add(value()?),
        "remove" => Action::Remove,
        "replace" => Action::Replace(value()?),
        "test" => Action::Test(value()?),
        _ => {
            let from_raw = string_member(index, members, "from")?;
            let from = pointer("from", from_raw)?;
            if op == "move" {
                Action::Move { from_raw, from }
            } else {
                Action::Copy { from_raw, from }
            }
        }
    };
    Ok(Operation {
        index,
        op,
        path_raw,
        path,
        action,
    })
}

fn string_member<'a>(
    index: usize,
    members: &'a Map<String, Value>,
    field: &'static str,
) -> Result<&'a str, PatchError> {
    match members.get(field) {
        None => Err(PatchError::MissingField { index, field }),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(PatchError::NotAString {
            index,
            field,
            found: describe(other),
        }),
    }
}

/// Splits an RFC 6901 pointer into decoded reference tokens.
fn parse_pointer(raw: &str) -> Result<Vec<String>, &'static str> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = raw.strip_prefix('/') else {
        return Err("must be empty or start with '/'");
    };
    rest.split('/').map(unescape_token).collect()
}

fn unescape_token(token: &str) -> Result<String, &'static str> {
    if !token.contains('~') {
        return Ok(token.to_owned());
    }
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return Err("'~' must be followed by '0' or '1'"),
            }
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Application
// ---------------------------------------------------------------------------

/// A failure while resolving a pointer, before the operation context is known.
enum Fault {
    NotFound,
    ParentNotFound,
    ParentNotContainer(&'static str),
    OutOfBounds { index: usize, len: usize },
    InvalidIndex { token: String, reason: &'static str },
}

impl Operation<'_> {
    /// Applies the operation to `doc`, whose size as JSON is `size` (kept up to date).
    fn apply(
        &self,
        doc: &mut Value,
        size: &mut usize,
        limits: &PatchLimits,
    ) -> Result<(), PatchError> {
        let at_path = |fault| self.error(fault, Location::Path);
        match &self.action {
            Action::Add(value) => {
                self.check_depth(value, limits)?;
                let added = self.check_size(value, *size, limits)?;
                let placed = add(doc, &self.path, (*value).clone()).map_err(at_path)?;
                self.grow(size, added, placed, limits)
            }
            Action::Remove => {
                if self.path.is_empty() {
                    return Err(PatchError::RemoveRoot { index: self.index });
                }
                let taken = remove(doc, &self.path).map_err(at_path)?;
                shrink(size, &taken);
                Ok(())
            }
            Action::Replace(value) => {
                self.check_depth(value, limits)?;
                let added = self.check_size(value, *size, limits)?;
                let target = lookup_mut(doc, &self.path).map_err(at_path)?;
                let old = std::mem::replace(target, (*value).clone());
                *size = size.saturating_sub(approximate_json_size(&old, usize::MAX));
                *size = size.saturating_add(added);
                self.within_size(*size, limits)
            }
            Action::Test(expected) => {
                let actual = lookup(doc, &self.path).map_err(at_path)?;
                if json_eq(actual, expected) {
                    Ok(())
                } else {
                    Err(PatchError::TestFailed {
                        index: self.index,
                        path: self.path_raw.to_owned(),
                    })
                }
            }
            Action::Copy { from_raw, from } => {
                let source = lookup(doc, from)
                    .map_err(|fault| self.error(fault, Location::From((*from_raw).to_owned())))?;
                // Measured before it is cloned: a copy that would break a limit is
                // never made.
                self.check_depth(source, limits)?;
                let added = self.check_size(source, *size, limits)?;
                let value = source.clone();
                let placed = add(doc, &self.path, value).map_err(at_path)?;
                self.grow(size, added, placed, limits)
            }
            Action::Move { from_raw, from } => {
                let at_from = |fault| self.error(fault, Location::From((*from_raw).to_owned()));
                if *from == self.path {
                    // Moving a value onto itself changes nothing, but the
                    // location must still exist.
                    return lookup(doc, from).map(drop).map_err(at_from);
                }
                if self.path.starts_with(from) {
                    return Err(PatchError::MoveIntoChild {
                        index: self.index,
                        path: self.path_raw.to_owned(),
                        from: (*from_raw).to_owned(),
                    });
                }
                self.check_depth(lookup(doc, from).map_err(at_from)?, limits)?;
                let taken = remove(doc, from).map_err(at_from)?;
                shrink(size, &taken);
                let added = approximate_json_size(&taken.value, usize::MAX);
                let placed = add(doc, &self.path, taken.value).map_err(at_path)?;
                self.grow(size, added, placed, limits)
            }
        }
    }

    /// Refuses a value that would nest too deep at this operation's path: it sits
    /// inside one container per token of the path.
    fn check_depth(&self, value: &Value, limits: &PatchLimits) -> Result<(), PatchError> {
        let room = limits.max_depth.checked_sub(self.path.len());
        match room {
            Some(room) if !nests_deeper_than(value, room) => Ok(()),
            _ => Err(PatchError::TooDeep {
                index: self.index,
                op: self.op,
                path: self.path_raw.to_owned(),
                limit: limits.max_depth,
            }),
        }
    }

    /// The size of a value about to be added, refused before it is built when the
    /// document could not hold it.
    fn check_size(
        &self,
        value: &Value,
        size: usize,
        limits: &PatchLimits,
    ) -> Result<usize, PatchError> {
        let room = limits.max_bytes.saturating_sub(size);
        let added = approximate_json_size(value, room);
        if added > room {
            return Err(self.too_large(limits));
        }
        Ok(added)
    }

    /// Accounts for a value of `added` bytes placed in the document (and what it
    /// replaced), and checks the total.
    fn grow(
        &self,
        size: &mut usize,
        added: usize,
        placed: Placed,
        limits: &PatchLimits,
    ) -> Result<(), PatchError> {
        if let Some(old) = &placed.replaced {
            *size = size.saturating_sub(approximate_json_size(old, usize::MAX));
        }
        *size = size.saturating_add(added).saturating_add(placed.overhead);
        self.within_size(*size, limits)
    }

    fn within_size(&self, size: usize, limits: &PatchLimits) -> Result<(), PatchError> {
        if size > limits.max_bytes {
            Err(self.too_large(limits))
        } else {
            Ok(())
        }
    }

    fn too_large(&self, limits: &PatchLimits) -> PatchError {
        PatchError::TooLarge {
            index: self.index,
            op: self.op,
            path: self.path_raw.to_owned(),
            limit: limits.max_bytes,
        }
    }

    fn error(&self, fault: Fault, location: Location) -> PatchError {
        let index = self.index;
        let op = self.op;
        let path = self.path_raw.to_owned();
        match fault {
            Fault::NotFound => PatchError::NotFound {
                index,
                op,
                path,
                location,
            },
            Fault::ParentNotFound => PatchError::ParentNotFound { index, op, path },
            Fault::ParentNotContainer(found) => PatchError::ParentNotContainer {
                index,
                op,
                path,
                found,
            },
            Fault::OutOfBounds {
                index: array_index,
                len,
            } => PatchError::IndexOutOfBounds {
                index,
                op,
                path,
                location,
                array_index,
                len,
            },
            Fault::InvalidIndex { token, reason } => PatchError::InvalidIndex {
                index,
                op,
                path,
                location,
                token,
                reason,
            },
        }
    }
}

/// An array reference token: a position, or `-` (past the last element).
enum ArrayIndex {
    At(usize),
    End,
}

fn parse_array_index(token: &str) -> Result<ArrayIndex, Fault> {
    if token == "-" {
        return Ok(ArrayIndex::End);
    }
    let invalid = |reason| Fault::InvalidIndex {
        token: token.to_owned(),
        reason,
    };
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("expected a non-negative decimal integer"));
    }
    if token.len() > 1 && token.starts_with('0') {
        return Err(invalid("leading zeros are not allowed"));
    }
    token
        .parse::<usize>()
        .map(ArrayIndex::At)
        .map_err(|_| invalid("index is too large"))
}

/// The index of an existing element of an array of length `len`.
fn existing_index(token: &str, len: usize) -> Result<usize, Fault> {
    match parse_array_index(token)? {
        ArrayIndex::At(index) if index < len => Ok(index),
        ArrayIndex::At(index) => Err(Fault::OutOfBounds { index, len }),
        ArrayIndex::End => Err(Fault::InvalidIndex {
            token: "-".to_owned(),
            reason: "\"-\" is only valid as the last token of an add, move or copy destination",
        }),
    }
}

fn lookup<'v>(doc: &'v Value, tokens: &[String]) -> Result<&'v Value, Fault> {
    let mut current = doc;
    for token in tokens {
        current = match current {
            Value::Object(map) => map.get(token.as_str()).ok_or(Fault::NotFound)?,
            Value::Array(items) => {
                let index = existing_index(token, items.len())?;
                items.get(index).ok_or(Fault::NotFound)?
            }
            _ => return Err(Fault::NotFound),
        };
    }
    Ok(current)
}

fn lookup_mut<'v>(doc: &'v mut Value, tokens: &[String]) -> Result<&'v mut Value, Fault> {
    let mut current = doc;
    for token in tokens {
        current = match current {
            Value::Object(map) => map.get_mut(token.as_str()).ok_or(Fault::NotFound)?,
            Value::Array(items) => {
                let index = existing_index(token, items.len())?;
                items.get_mut(index).ok_or(Fault::NotFound)?
            }
            _ => return Err(Fault::NotFound),
        };
    }
    Ok(current)
}

/// What placing a value in a document did besides adding the value: the value it
/// replaced, and the bytes its place takes as JSON (a member's key and colon, a
/// comma), so a document's size can be kept without measuring it again.
struct Placed {
    replaced: Option<Value>,
    overhead: usize,
}

/// A value taken out of a document, and the bytes its place took.
struct Taken {
    value: Value,
    overhead: usize,
}

/// Accounts for a value taken out of a document of `size` bytes.
fn shrink(size: &mut usize, taken: &Taken) {
    let removed = approximate_json_size(&taken.value, usize::MAX) + taken.overhead;
    *size = size.saturating_sub(removed);
}

/// RFC 6902 section 4.1: insert into an array, add or overwrite an object
/// member, or replace the whole document when `tokens` is empty.
fn add(doc: &mut Value, tokens: &[String], value: Value) -> Result<Placed, Fault> {
    let Some((last, parents)) = tokens.split_last() else {
        return Ok(Placed {
            replaced: Some(std::mem::replace(doc, value)),
            overhead: 0,
        });
    };
    let parent = lookup_mut(doc, parents).map_err(|fault| match fault {
        Fault::NotFound => Fault::ParentNotFound,
        other => other,
    })?;
    match parent {
        Value::Object(map) => {
            let overhead = if map.contains_key(last.as_str()) {
                0
            } else {
                member_overhead(last, !map.is_empty())
            };
            let replaced = map.insert(last.clone(), value);
            Ok(Placed { replaced, overhead })
        }
        Value::Array(items) => match parse_array_index(last)? {
            ArrayIndex::End => {
                let overhead = usize::from(!items.is_empty());
                items.push(value);
                Ok(Placed {
                    replaced: None,
                    overhead,
                })
            }
            ArrayIndex::At(index) if index <= items.len() => {
                let overhead = usize::from(!items.is_empty());
                items.insert(index, value);
                Ok(Placed {
                    replaced: None,
                    overhead,
                })
            }
            ArrayIndex::At(index) => Err(Fault::OutOfBounds {
                index,
                len: items.len(),
            }),
        },
        other => Err(Fault::ParentNotContainer(describe(other))),
    }
}

/// RFC 6902 section 4.2: remove and return the value at a non-empty pointer.
fn remove(doc: &mut Value, tokens: &[String]) -> Result<Taken, Fault> {
    let Some((last, parents)) = tokens.split_last() else {
        // The whole document cannot be removed; callers rule this out first.
        return Err(Fault::NotFound);
    };
    match lookup_mut(doc, parents)? {
        Value::Object(map) => {
            let value = take_member(map, last).ok_or(Fault::NotFound)?;
            let overhead = member_overhead(last, !map.is_empty());
            Ok(Taken { value, overhead })
        }
        Value::Array(items) => {
            let index = existing_index(last, items.len())?;
            let value = items.remove(index);
            let overhead = usize::from(!items.is_empty());
            Ok(Taken { value, overhead })
        }
        _ => Err(Fault::NotFound),
    }
}

/// The bytes an object member takes besides its value: its quoted key, the colon,
/// and a comma when it has a neighbour.
fn member_overhead(key: &str, has_neighbour: bool) -> usize {
    key.len() + 3 + usize::from(has_neighbour)
}

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// JSON equality as RFC 6902 section 4.6 defines it for `test`: numbers by
/// numeric value (`1 == 1.0`), objects regardless of member order.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Number(x), Value::Number(y)) => number_eq(x, y),
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| json_eq(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key.as_str()).is_some_and(|y| json_eq(x, y)))
        }
        _ => false,
    }
}

fn number_eq(x: &Number, y: &Number) -> bool {
    match (integer(x), integer(y)) {
        (Some(x), Some(y)) => x == y,
        (Some(i), None) => y.as_f64().is_some_and(|f| float_equals_integer(f, i)),
        (None, Some(i)) => x.as_f64().is_some_and(|f| float_equals_integer(f, i)),
        (None, None) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

fn integer(n: &Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
}

/// Exact comparison, without rounding the integer through `f64`.
fn float_equals_integer(f: f64, i: i128) -> bool {
    // `i128::MAX as f64` rounds up to 2^127, so the range check is exact and
    // the cast below is lossless for every float that passes it.
    f.is_finite()
        && f.fract() == 0.0
        && f >= i128::MIN as f64
        && f < i128::MAX as f64
        && f as i128 == i
}

/// Removes an object member, keeping the other members in their order.
///
/// With `serde_json`'s `preserve_order` feature, `Map::remove` swaps the last
/// member into the hole; `retain` keeps the order whichever way the map is
/// built, so rendered manifests stay stable.
fn take_member(map: &mut Map<String, Value>, key: &str) -> Option<Value> {
    if !map.contains_key(key) {
        return None;
    }
    let mut taken = None;
    map.retain(|k, v| {
        if k == key {
            taken = Some(std::mem::take(v));
            false
        } else {
            true
        }
    });
    taken
}

/// A short description of a value's JSON type, for messages.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A pointer as shown in messages: the root pointer is shown as `""`.
fn show(pointer: &str) -> &str {
    if pointer.is_empty() { "\"\"" } else { pointer }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pointer_tokens_are_unescaped_in_order() {
        assert_eq!(
            parse_pointer("/~01/a~1b/~0/"),
            Ok(vec![
                "~1".to_owned(),
                "a/b".to_owned(),
                "~".to_owned(),
                String::new(),
            ])
        );
        assert_eq!(parse_pointer(""), Ok(Vec::new()));
        assert!(parse_pointer("/a~").is_err());
        assert!(parse_pointer("/a~2").is_err());
        assert!(parse_pointer("a").is_err());
    }

    /// Doubling the depth of a nest with each operation: round k copies the nest,
    /// 2^k levels deep, into its own innermost object. Twelve rounds nest 4,096
    /// deep, which used to overflow the stack of whoever cloned, dropped or wrote it.
    fn doubling_ops(rounds: u32) -> Value {
        let mut ops = vec![json!({"op": "add", "path": "/n", "value": {}})];
        for round in 0..rounds {
            let into = "/n".repeat(2usize.pow(round) + 1);
            ops.push(json!({"op": "copy", "from": "/n", "path": into}));
        }
        Value::Array(ops)
    }

    #[test]
    fn a_patch_cannot_nest_deeper_than_the_shared_limit() {
        let mut doc = json!({"kind": "ConfigMap"});
        let err = apply_json_patch(&mut doc, &doubling_ops(12)).expect_err("too deep");
        let path = "/n".repeat(65);
        assert_eq!(
            err.to_string(),
            format!(
                "operation 7 (copy {path}): the result would nest arrays and objects deeper than 100 levels"
            )
        );
        assert_eq!(
            doc,
            json!({"kind": "ConfigMap"}),
            "the document is unchanged"
        );
        // Below the limit the same operations apply.
        apply_json_patch(&mut doc, &doubling_ops(6)).expect("64 levels are fine");
        assert_eq!(flotilla_core::bundle::nesting_depth(&doc), 65);
    }

    #[test]
    fn a_patch_cannot_grow_a_document_past_its_size_limit() {
        // Forty copies of the root into itself would hold 2^40 copies.
        let mut ops = vec![json!({"op": "add", "path": "/a", "value": "x".repeat(1000)})];
        for round in 0..40 {
            ops.push(json!({"op": "copy", "from": "", "path": format!("/c{round}")}));
        }
        let mut doc = json!({});
        let limits = PatchLimits {
            max_depth: MAX_NESTING_DEPTH,
            max_bytes: 1_000_000,
        };
        let err =
            apply_json_patch_within(&mut doc, &Value::Array(ops), &limits).expect_err("too large");
        assert_eq!(
            err.to_string(),
            "operation 10 (copy /c9): the result would be larger than 1000000 bytes as JSON"
        );
        assert_eq!(err.operation_index(), Some(10));
        // Removing and replacing keeps the count honest: a document may be rewritten
        // many times over as long as it stays small.
        let mut churn = Vec::new();
        for _ in 0..2000 {
            churn.push(json!({"op": "add", "path": "/big", "value": "y".repeat(900)}));
            churn.push(json!({"op": "replace", "path": "/big", "value": "z".repeat(900)}));
            churn.push(json!({"op": "remove", "path": "/big"}));
        }
        let mut doc = json!({});
        apply_json_patch_within(&mut doc, &Value::Array(churn), &limits).expect("stays small");
        assert_eq!(doc, json!({}));
    }

    #[test]
    fn the_size_kept_is_the_size_of_the_document() {
        let limits = PatchLimits {
            max_depth: MAX_NESTING_DEPTH,
            max_bytes: 100,
        };
        // `{"k":[{"a":"…"}],"long-key":"x"}`, built up and moved around, ends exactly
        // at the limit; one more byte anywhere is refused.
        let ops = |text: &str| {
            json!([
                {"op": "add", "path": "/long-key", "value": "x"},
                {"op": "copy", "from": "/long-key", "path": "/tmp"},
                {"op": "move", "from": "/tmp", "path": "/t"},
                {"op": "remove", "path": "/t"},
                {"op": "add", "path": "/k", "value": []},
                {"op": "add", "path": "/k/-", "value": {"b": 1}},
                {"op": "replace", "path": "/k/0", "value": {"bb": 22}},
                {"op": "remove", "path": "/k/0"},
                {"op": "add", "path": "/k/-", "value": {"a": text}},
            ])
        };
        let fits = "y".repeat(100 - r#"{"k":[{"a":""}],"long-key":"x"}"#.len());
        let mut doc = json!({});
        apply_json_patch_within(&mut doc, &ops(&fits), &limits).expect("exactly at the limit");
        assert_eq!(serde_json::to_vec(&doc).expect("serialises").len(), 100);
        let mut doc = json!({});
        let err = apply_json_patch_within(&mut doc, &ops(&format!("{fits}y")), &limits)
            .expect_err("one byte over");
        assert!(matches!(err, PatchError::TooLarge { .. }), "{err}");
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(json_eq(&json!(1), &json!(1.0)));
        assert!(json_eq(&json!(-3), &json!(-3.0)));
        assert!(json_eq(&json!(0), &json!(-0.0)));
        assert!(json_eq(&json!(u64::MAX), &json!(u64::MAX)));
        assert!(!json_eq(&json!(1), &json!(1.5)));
        assert!(!json_eq(&json!(1), &json!("1")));
        // 2^53 + 1 is not representable as f64; it must not equal 2^53.
        assert!(!json_eq(
            &json!(9_007_199_254_740_993_u64),
            &json!(9_007_199_254_740_992.0)
        ));
        assert!(json_eq(
            &json!(9_007_199_254_740_992_u64),
            &json!(9_007_199_254_740_992.0)
        ));
        assert!(json_eq(
            &json!({"a": [1, {"b": 2}], "c": null}),
            &json!({"c": null, "a": [1.0, {"b": 2.0}]})
        ));
        assert!(!json_eq(&json!({"a": 1}), &json!({"a": 1, "b": 2})));
        assert!(!json_eq(&json!([1, 2]), &json!([2, 1])));
    }
}
