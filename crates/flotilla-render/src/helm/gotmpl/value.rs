//! The values a Go template computes with, modelled on the Go types Helm's templates
//! meet: what `sigs.k8s.io/yaml` gives for values files (every number a `float64`,
//! maps `map[string]interface{}`, lists `[]interface{}`), what template literals and
//! Go's builtins give (`int`), what Sprig's arithmetic gives (`int64`), and Helm's
//! structs (`.Release`, `.Chart`, `.Capabilities`, `.Files`, `.Template`) as objects
//! with fields and methods.
//!
//! Values are cheap to clone: strings, lists and maps are reference counted and
//! shared between threads, so parsed templates and the values of a chart can be held
//! once and rendered for many releases in parallel.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A Go value as a template sees it.
#[derive(Clone, Debug, Default)]
pub enum Value {
    /// A nil interface (`<nil>` when printed), e.g. a YAML `null`.
    #[default]
    Nil,
    /// What Go's template engine gets for a key missing from a map: an invalid
    /// `reflect.Value`, printed `<no value>` (which Helm then removes from the output).
    Missing,
    Bool(bool),
    /// Go's `int`: template literals, `len`, Sprig's `atoi`.
    Int(i64),
    /// Go's `int64`: Sprig's arithmetic (`add`, `mul`, `int64`, ...).
    Int64(i64),
    /// Go's `float64`: every number read from YAML or JSON values.
    Float(f64),
    String(Arc<str>),
    /// Go's `[]byte` (`.Files.GetBytes`), printed as a list of numbers by `%v`.
    Bytes(Arc<[u8]>),
    /// Go's `[]interface{}` (and the other slices: `[]string` from Sprig's
    /// `splitList`, `keys`, ... behave the same in templates).
    List(Arc<Vec<Value>>),
    /// Go's `map[string]interface{}`: iteration and printing in key order. A
    /// reference, as Go's maps are: `set`, `unset` and `merge` change the map every
    /// holder of it sees.
    Map(MapRef),
    /// A Go struct or pointer with fields and methods (Helm's `.Release`, `.Chart`,
    /// `.Capabilities`, `.Files`, ...).
    Object(Arc<dyn Object>),
}

/// A Go map: shared by reference and changed in place, as Go's maps are. Reads take
/// a snapshot of what they need (a value is cheap to clone), so no lock is held while
/// a template runs and a map given to `merge` twice never deadlocks.
#[derive(Clone, Default)]
pub struct MapRef(Arc<RwLock<BTreeMap<String, Value>>>);

impl MapRef {
    pub fn new(entries: BTreeMap<String, Value>) -> MapRef {
        MapRef(Arc::new(RwLock::new(entries)))
    }

    /// The map, read-locked. A lock poisoned by a panic elsewhere still holds a
    /// whole map (every change is one insert or remove), so it is used as is.
    pub fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Value>> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The map, write-locked (held only for one change, never across a call out).
    pub fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Value>> {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn get(&self, key: &str) -> Option<Value> {
        self.read().get(key).cloned()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.read().contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    pub fn keys(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// The entries in key order, as they are now.
    pub fn entries(&self) -> Vec<(String, Value)> {
        self.read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// A shallow copy of the map as it is now.
    pub fn snapshot(&self) -> BTreeMap<String, Value> {
        self.read().clone()
    }

    pub fn insert(&self, key: String, value: Value) -> Option<Value> {
        self.write().insert(key, value)
    }

    pub fn remove(&self, key: &str) -> Option<Value> {
        self.write().remove(key)
    }

    /// Whether both are the same Go map (not merely equal).
    pub fn same(&self, other: &MapRef) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Marks the map as being walked (printed, copied, marshalled) on this thread
    /// until the guard drops; `None` when it already is: the map holds itself
    /// (`set $d "self" $d`), and a walk that went on would never end.
    pub fn visit(&self) -> Option<Visit> {
        let id = Arc::as_ptr(&self.0) as *const () as usize;
        VISITING.with(|visiting| {
            let mut visiting = visiting.borrow_mut();
            if visiting.contains(&id) {
                None
            } else {
                visiting.push(id);
                Some(Visit(id))
            }
        })
    }
}

thread_local! {
    /// The maps being walked on this thread, innermost last (see [`MapRef::visit`]).
    static VISITING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// A map being walked; see [`MapRef::visit`].
#[derive(Debug)]
pub struct Visit(usize);

impl Drop for Visit {
    fn drop(&mut self) {
        VISITING.with(|visiting| {
            let mut visiting = visiting.borrow_mut();
            if let Some(at) = visiting.iter().rposition(|&id| id == self.0) {
                visiting.remove(at);
            }
        });
    }
}

/// What printing writes for a map inside itself (Go would recurse until it crashed).
pub const CYCLE_TEXT: &str = "<cycle>";

impl fmt::Debug for MapRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.try_read() {
            Ok(map) => f.debug_map().entries(map.iter()).finish(),
            Err(_) => f.write_str("{<locked>}"),
        }
    }
}

impl From<BTreeMap<String, Value>> for MapRef {
    fn from(entries: BTreeMap<String, Value>) -> MapRef {
        MapRef::new(entries)
    }
}

/// A Go struct (or a named type with methods) that templates reach into: `.Field`,
/// `.Method arg...`.
pub trait Object: fmt::Debug + Send + Sync {
    /// The Go type's name as `%T` and Sprig's `typeOf` print it, e.g. `*chart.Metadata`.
    fn type_name(&self) -> &str;
    /// The field (or argument-less method) of that name, if the type has one.
    fn field(&self, name: &str) -> Option<Value>;
    /// Calls the method of that name with arguments, if the type has one.
    fn call(&self, name: &str, args: &[Value]) -> Option<FuncResult> {
        let _ = (name, args);
        None
    }
    /// Go's `reflect.Kind` of the value a template holds, as `kindOf` prints it:
    /// `ptr` for Helm's pointers (`.Chart`, `.Capabilities`), `struct` for a struct
    /// held by value (Sprig's certificates).
    fn kind(&self) -> &'static str {
        "ptr"
    }
    /// Go's truth of the value (`if`, `and`, `empty`): a pointer or struct is true;
    /// a map or slice type (Helm's `.Files`) only when it has entries.
    fn truthy(&self) -> bool {
        true
    }
    /// The fields as `encoding/json` writes the struct (JSON names, `omitempty`
    /// applied), in Go's field order, so `toJson` and `toYaml` marshal it as Go
    /// does; `None` for a type Go would not marshal to an object.
    fn json_fields(&self) -> Option<Vec<(String, Value)>> {
        None
    }
    /// What `%v` and `print` write: the value of a `String()` method where the Go type
    /// has one (`.Capabilities.KubeVersion` prints `v1.31.4`), else Go's struct form.
    fn display(&self) -> String;
    /// For a Go map or slice type (Helm's `.Files`, `.Capabilities.APIVersions`): its
    /// entries as `range` visits them (a map's keys sorted, a slice's indexes) and
    /// `len` counts them; `None` for a struct.
    fn range_items(&self) -> Option<Vec<(Value, Value)>> {
        None
    }
}

/// What a function returns: a value, or the error Go reports after
/// `error calling NAME: `.
pub type FuncResult = Result<Value, FuncError>;

/// A template function's error, as the message after `error calling NAME: `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuncError(pub String);

/// Marks a [`FuncError`] made by [`FuncError::wrong_type`].
const WRONG_TYPE_MARK: &str = "\u{0}wrong-type:";

impl FuncError {
    pub fn new(message: impl Into<String>) -> FuncError {
        FuncError(message.into())
    }

    /// The argument at `index` (0-based; a piped value counts as the last argument)
    /// does not fit the Go parameter type `expected` (`string`, `int`, `float64`,
    /// `bool`, `[]interface {}`, ...). Go's template engine checks this before the
    /// call, so the engine reports it as Go does, at the argument, without
    /// `error calling NAME:` (e.g. `wrong type for value; expected string; got
    /// float64`, `invalid value; expected string`, `expected string; found 3`).
    pub fn wrong_type(index: usize, expected: &str) -> FuncError {
        FuncError(format!("{WRONG_TYPE_MARK}{index}:{expected}"))
    }

    /// The argument index and expected type of a [`FuncError::wrong_type`] error.
    pub fn as_wrong_type(&self) -> Option<(usize, &str)> {
        let rest = self.0.strip_prefix(WRONG_TYPE_MARK)?;
        let (index, expected) = rest.split_once(':')?;
        Some((index.parse().ok()?, expected))
    }
}

impl fmt::Display for FuncError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FuncError {}

/// What a function may ask of the render it runs in.
pub trait Host {
    /// The template being executed, as Helm names it (`chart/templates/x.yaml`).
    fn template_name(&self) -> &str;
    /// `len` bytes for a generating function (`randAlphaNum`, `uuidv4`, `genCA`, ...),
    /// derived deterministically from the render's secret seed, the release, the
    /// template, the function, its arguments and how many times the same call was made
    /// before in the same template: never from a clock or the operating system.
    fn generated_bytes(&mut self, function: &str, args: &[Value], len: usize) -> Vec<u8>;
    /// The time `now` returns, as seconds since the Unix epoch (UTC): the time of the
    /// commit that last changed the release's inputs.
    fn now_unix(&self) -> i64;
    /// Records a warning for the user (`lookup` returned an empty map, ...).
    fn warn(&mut self, message: String);
    /// Called by the release renderer before each template runs, so generated bytes
    /// can depend on the template (its calls' counts start again at zero).
    fn begin_template(&mut self, name: &str) {
        let _ = name;
    }
    /// Whether the values hold sites' stand-ins, so that every call is checked by
    /// [`super::sites::check_call`] (see [`super::sites`]).
    fn sites(&self) -> bool {
        false
    }
    /// The digest `sha256sum` writes for `text`: Sprig's (SHA-256, hexadecimal), or
    /// a keyed one where the host knows the text holds secret values.
    fn sha256_hex(&self, text: &str) -> String {
        crate::seal::sha256_hex(text.as_bytes())
    }
    /// The key the other digests (`sha1sum`, `sha512sum`, `adler32sum`) are keyed
    /// with over `text`, where the host knows it holds secret values.
    fn secret_key_for(&self, text: &str) -> Option<[u8; 32]> {
        let _ = text;
        None
    }
    /// A call that [`super::sites::check_call`] refused, in a render with stand-ins:
    /// the host may answer it with a stand-in of its own for the call's result, which
    /// it works out for each cluster (see [`super::sites::deferred_text`]); `None`
    /// fails the render.
    fn defer(&mut self, name: &str, args: &[Value]) -> Option<Value> {
        let _ = (name, args);
        None
    }
}

/// A template function: Sprig's, Helm's or Go's own builtins. It gets the render's
/// host and the evaluated arguments.
pub type Func = fn(&mut dyn Host, &[Value]) -> FuncResult;

impl Value {
    pub fn string(s: impl Into<Arc<str>>) -> Value {
        Value::String(s.into())
    }

    pub fn list(items: Vec<Value>) -> Value {
        Value::List(Arc::new(items))
    }

    pub fn map(entries: BTreeMap<String, Value>) -> Value {
        Value::Map(MapRef::new(entries))
    }

    /// A copy that shares no map with `self` (Sprig's `deepCopy`; each release's
    /// values before its render, so that `set` in one render never reaches the
    /// chart's parsed values that other renders share).
    pub fn deep_copy(&self) -> Value {
        match self {
            Value::Map(m) => {
                // A map inside itself stays shared there: a copy would never end.
                let Some(_visit) = m.visit() else {
                    return self.clone();
                };
                Value::map(
                    m.entries()
                        .into_iter()
                        .map(|(k, v)| (k, v.deep_copy()))
                        .collect(),
                )
            }
            Value::List(items) => Value::list(items.iter().map(Value::deep_copy).collect()),
            other => other.clone(),
        }
    }

    /// Go's `reflect.Kind` name, as Sprig's `kindOf` prints it.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Nil | Value::Missing => "invalid",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Int64(_) => "int64",
            Value::Float(_) => "float64",
            Value::String(_) => "string",
            Value::Bytes(_) | Value::List(_) => "slice",
            Value::Map(_) => "map",
            Value::Object(o) => o.kind(),
        }
    }

    /// Go's type name, as `%T` and Sprig's `typeOf` print it.
    pub fn type_name(&self) -> String {
        match self {
            Value::Nil | Value::Missing => "<nil>".to_string(),
            Value::Bool(_) => "bool".to_string(),
            Value::Int(_) => "int".to_string(),
            Value::Int64(_) => "int64".to_string(),
            Value::Float(_) => "float64".to_string(),
            Value::String(_) => "string".to_string(),
            Value::Bytes(_) => "[]uint8".to_string(),
            Value::List(_) => "[]interface {}".to_string(),
            Value::Map(_) => "map[string]interface {}".to_string(),
            Value::Object(o) => o.type_name().to_string(),
        }
    }

    /// Go's truth (`if`, `with`, `and`, `or`, `not`): false, 0, nil, and empty
    /// strings, lists and maps are false.
    pub fn truthy(&self) -> bool {
        match self {
            Value::Nil | Value::Missing => false,
            Value::Bool(b) => *b,
            Value::Int(i) | Value::Int64(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::String(s) => !s.is_empty(),
            Value::Bytes(b) => !b.is_empty(),
            Value::List(l) => !l.is_empty(),
            Value::Map(m) => !m.is_empty(),
            Value::Object(o) => o.truthy(),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Converts parsed JSON (as `serde_json` gives it) the way Helm's values are read:
    /// every number becomes a `float64`.
    pub fn from_json(json: &serde_json::Value) -> Value {
        match json {
            serde_json::Value::Null => Value::Nil,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => Value::Float(n.as_f64().unwrap_or(0.0)),
            serde_json::Value::String(s) => Value::string(s.as_str()),
            serde_json::Value::Array(items) => {
                Value::list(items.iter().map(Value::from_json).collect())
            }
            serde_json::Value::Object(map) => Value::map(
                map.iter()
                    .map(|(k, v)| (k.clone(), Value::from_json(v)))
                    .collect(),
            ),
        }
    }
}
