//! Manifests read the way kustomize reads them.
//!
//! kustomize parses YAML with the Go `yaml.v3` library and turns every resource into
//! JSON before it writes it out, so its reading of an untagged plain scalar is the one
//! a Kubernetes cluster receives. That reading is neither YAML 1.1 nor strict YAML 1.2:
//!
//! - booleans are only `true`/`True`/`TRUE` and `false`/`False`/`FALSE`; `yes`, `on`,
//!   `y`, `off`, `no` and `n` stay strings;
//! - integers follow Go's literal syntax: `0755` and `0o755` are octal (493), `0x1F`
//!   and `0X1F` hexadecimal, `0b101` binary, and underscores are ignored (`1_000`);
//! - what is not an integer but looks like a decimal number is a float (`08` is 8,
//!   `1e3` is 1000, `.5` is 0.5); `.inf` and `.nan` cannot become JSON and are refused;
//! - a plain timestamp (`2001-12-14`, `2001-12-14T21:59:43.10-05:00`) becomes the
//!   RFC 3339 string Go writes for it (`2001-12-14T00:00:00Z`);
//! - `~`, `null`, `Null`, `NULL` and the empty scalar are null;
//! - quoted and block scalars are strings, and an explicit tag (`!!str 0755`,
//!   `!!int "0755"`) decides as it says.
//!
//! The reader works on the parser's events (no recursion, so deep nesting cannot
//! overflow the stack), expands anchors and merge keys (`<<`) within a budget that
//! refuses alias bombs, and refuses duplicate keys.

use flotilla_core::bundle::MAX_NESTING_DEPTH;
use serde_json::{Map, Number, Value};
use serde_saphyr::granit_parser::{Event, Options, Parser, ScalarStyle, Span, StructureStyle, Tag};

fn too_deep() -> String {
    format!(
        "the YAML nests sequences and mappings deeper than {MAX_NESTING_DEPTH} levels; flotilla \
         does not read it"
    )
}

/// A YAML problem: the message and the 1-based line it concerns, if known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub line: Option<u64>,
    pub message: String,
}

/// One document of a stream with the line its content starts on.
#[derive(Debug, Clone)]
pub struct Document {
    pub value: Value,
    pub line: u64,
}

/// Parser events a stream may produce, aliases expanded (refuses alias bombs).
const MAX_NODES: usize = 2_000_000;
/// Aliases a stream may use.
const MAX_ALIASES: usize = 1_000;

const ALIAS_BOMB: &str = "the YAML grows past the parser's limits once its anchors and aliases \
                          are expanded (an alias bomb?); flotilla does not read it";

/// Where a mapping is in its document: kustomize writes the values of a resource's
/// `metadata.annotations` as the text they were written with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Root,
    Metadata,
    Annotations,
    Other,
}

/// A collection being built.
enum Frame {
    Sequence {
        items: Vec<Value>,
        anchor: usize,
        nodes: usize,
        flow: bool,
    },
    Mapping {
        entries: Map<String, Value>,
        anchor: usize,
        nodes: usize,
        flow: bool,
        role: Role,
        /// The key whose value comes next, and its line.
        key: Option<(PendingKey, u64)>,
        /// Keys that came from a merge (`<<`): a later explicit key replaces them.
        merged: Vec<String>,
    },
}

enum PendingKey {
    Key(String),
    Merge,
}

/// An anchored value and how many nodes it holds.
struct Anchored {
    value: Value,
    nodes: usize,
}

struct Reader {
    stack: Vec<Frame>,
    anchors: Vec<Option<Anchored>>,
    nodes: usize,
    aliases: usize,
    /// How many flow collections (`[...]`, `{...}`) the parser is inside.
    flow_depth: usize,
    /// The lines the open flow collections start on.
    flow_lines: Vec<u64>,
    /// Whether a flow collection spans lines (see [`read_shape`]).
    multiline_flow: bool,
}

/// Reads every document of a stream; empty and null documents are skipped.
pub fn read_documents(text: &str) -> Result<Vec<Document>, ReadError> {
    read(text, None).map(|(documents, _)| documents)
}

/// A scalar value that holds a hole of a template's shape (see [`crate::shape`]).
#[derive(Debug, Clone)]
pub struct HoleSite {
    /// The document it is in, counting the documents read.
    pub document: usize,
    /// Where it is in that document.
    pub path: Vec<Step>,
    /// Its text as read, holes written as [`HOLE_START`] index [`HOLE_END`].
    pub text: String,
    pub style: ScalarStyle,
    pub tag: Option<Tag>,
    pub in_flow: bool,
    /// A value of `metadata.annotations`, which is kept as its text.
    pub annotation: bool,
    /// The characters the scalar spans in the text (from, to).
    pub chars: (usize, usize),
}

/// One step into a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Key(String),
    Index(usize),
}

/// Marks a hole in the text of a template's shape: private-use characters, which
/// YAML reads as part of a plain or quoted scalar like a letter.
pub const HOLE_START: char = '\u{E000}';
pub const HOLE_END: char = '\u{E001}';

/// Reads a template's shape, whose holes are marked with [`HOLE_START`]: the
/// documents (each hole's scalar read with its markers, to be replaced) and where the
/// holes are (a hole with a core tag other than `!!str` cannot be read so: no shape).
/// An error also when a hole is anywhere but inside a scalar value on one line that
/// does not start the line (there a value could complete a document marker, `--`
/// and `-`), or when the shape has anchors, aliases or merge keys (which would copy
/// or move a hole).
pub fn read_shape(text: &str) -> Result<(Vec<Document>, Vec<HoleSite>), ReadError> {
    let mut holes = Vec::new();
    let (documents, multiline_flow) = read(text, Some(&mut holes))?;
    // A value shorter than its marker moves what follows it on its line to the
    // left, and across lines a flow collection's keys are checked against the
    // indentation of the block around it: a hole in a flow collection is used only
    // when no flow collection spans lines.
    if multiline_flow && holes.iter().any(|hole| hole.in_flow) {
        return Err(not_a_shape(1, "a hole in a flow collection of many lines"));
    }
    Ok((documents, holes))
}

fn not_a_shape(line: u64, why: &str) -> ReadError {
    ReadError {
        line: Some(line),
        message: format!("not a shape: {why}"),
    }
}

/// The documents, and whether a flow collection spans lines; with `holes`, reads a
/// shape (see [`read_shape`]).
fn read(
    text: &str,
    mut holes: Option<&mut Vec<HoleSite>>,
) -> Result<(Vec<Document>, bool), ReadError> {
    let mut options = Options::default();
    // libyaml, and with it Go's yaml.v3, ends a block scalar that ends the input
    // without a line break without one.
    options.block_scalar_eof_without_line_feed = true;
    let mut parser = Parser::new_from_str_with_options(text, options);
    let mut documents = Vec::new();
    let mut reader = Reader {
        stack: Vec::new(),
        anchors: Vec::new(),
        nodes: 0,
        aliases: 0,
        flow_depth: 0,
        flow_lines: Vec::new(),
        multiline_flow: false,
    };
    let mut root_line: Option<u64> = None;
    let mut root: Option<Value> = None;
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|err| ReadError {
            line: Some(err.marker().line() as u64).filter(|&l| l > 0),
            // The parser stops flow collections (`[[[...]]]`) at its own nesting limit,
            // past flotilla's depth; both mean the same to a fleet author.
            message: if err.info().starts_with("recursion limit exceeded") {
                too_deep()
            } else {
                err.info()
            },
        })?;
        let line = span_line(&span);
        let completed = match event {
            Event::StreamStart | Event::StreamEnd => None,
            Event::DocumentStart(..) => {
                reader.anchors.clear();
                root_line = None;
                root = None;
                None
            }
            Event::DocumentEnd => {
                if let Some(value) = root.take()
                    && !value.is_null()
                {
                    documents.push(Document {
                        value,
                        line: root_line.unwrap_or(1),
                    });
                }
                None
            }
            Event::Scalar(text, style, anchor, tag) => {
                if reader.stack.is_empty() && root_line.is_none() {
                    root_line = Some(line);
                }
                reader.count(1, line)?;
                if let Some(holes) = holes.as_deref_mut() {
                    if anchor != 0 {
                        return Err(not_a_shape(line, "an anchor"));
                    }
                    if text.contains(HOLE_START) {
                        if reader.expects_key() {
                            return Err(not_a_shape(line, "a hole in a key"));
                        }
                        // Only a flow collection of many lines puts a value at a
                        // line's start, and the rule for those (below) refuses it
                        // too; kept so that this reason stands on its own.
                        if span.start.col() == 0 {
                            return Err(not_a_shape(line, "a hole scalar at the start of a line"));
                        }
                        if span.end.line() != span.start.line()
                            || !matches!(
                                style,
                                ScalarStyle::Plain
                                    | ScalarStyle::SingleQuoted
                                    | ScalarStyle::DoubleQuoted
                            )
                        {
                            return Err(not_a_shape(line, "a hole in a scalar of many lines"));
                        }
                        let Some(path) = reader.path() else {
                            return Err(not_a_shape(line, "a hole outside a collection"));
                        };
                        holes.push(HoleSite {
                            document: documents.len(),
                            path,
                            text: text.to_string(),
                            style,
                            tag: tag.as_deref().cloned(),
                            in_flow: reader.flow_depth > 0,
                            annotation: reader.in_annotations(),
                            chars: (span.start.index(), span.end.index()),
                        });
                    }
                }
                if reader.expects_key() {
                    reader.push_key(&text, style, tag.as_deref(), line)?;
                    if holes.is_some() && reader.merge_pending() {
                        return Err(not_a_shape(line, "a merge key"));
                    }
                    None
                } else if reader.in_annotations() {
                    Some((Value::String(text.to_string()), 1))
                } else {
                    let value = resolve_in(&text, style, tag.as_deref(), reader.flow_depth > 0)
                        .map_err(|message| ReadError {
                            line: Some(line),
                            message,
                        })?;
                    reader.remember(anchor, &value, 1);
                    Some((value, 1))
                }
            }
            Event::SequenceStart(structure, anchor, _) => {
                if reader.stack.is_empty() && root_line.is_none() {
                    root_line = Some(line);
                }
                if holes.is_some() && anchor != 0 {
                    return Err(not_a_shape(line, "an anchor"));
                }
                reader.refuse_complex_key(line)?;
                reader.count(1, line)?;
                reader.refuse_deeper(line)?;
                let flow = structure == StructureStyle::Flow;
                reader.flow_depth += usize::from(flow);
                if flow {
                    reader.flow_lines.push(line);
                }
                reader.stack.push(Frame::Sequence {
                    items: Vec::new(),
                    anchor,
                    nodes: 1,
                    flow,
                });
                None
            }
            Event::MappingStart(structure, anchor, _) => {
                if reader.stack.is_empty() && root_line.is_none() {
                    root_line = Some(line);
                }
                if holes.is_some() && anchor != 0 {
                    return Err(not_a_shape(line, "an anchor"));
                }
                reader.refuse_complex_key(line)?;
                reader.count(1, line)?;
                reader.refuse_deeper(line)?;
                let flow = structure == StructureStyle::Flow;
                reader.flow_depth += usize::from(flow);
                if flow {
                    reader.flow_lines.push(line);
                }
                let role = reader.child_role();
                reader.stack.push(Frame::Mapping {
                    entries: Map::new(),
                    anchor,
                    nodes: 1,
                    flow,
                    role,
                    key: None,
                    merged: Vec::new(),
                });
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match reader.stack.pop() {
                Some(Frame::Sequence {
                    items,
                    anchor,
                    nodes,
                    flow,
                }) => {
                    reader.flow_depth -= usize::from(flow);
                    reader.end_flow(flow, line);
                    let value = Value::Array(items);
                    reader.remember(anchor, &value, nodes);
                    Some((value, nodes))
                }
                Some(Frame::Mapping {
                    entries,
                    anchor,
                    nodes,
                    flow,
                    ..
                }) => {
                    reader.flow_depth -= usize::from(flow);
                    reader.end_flow(flow, line);
                    let value = Value::Object(entries);
                    reader.remember(anchor, &value, nodes);
                    Some((value, nodes))
                }
                None => None,
            },
            Event::Alias(id) => {
                if reader.stack.is_empty() && root_line.is_none() {
                    root_line = Some(line);
                }
                if holes.is_some() {
                    return Err(not_a_shape(line, "an alias"));
                }
                reader.aliases += 1;
                if reader.aliases > MAX_ALIASES {
                    return Err(ReadError {
                        line: Some(line),
                        message: ALIAS_BOMB.into(),
                    });
                }
                let Some(Some(anchored)) = reader.anchors.get(id) else {
                    return Err(ReadError {
                        line: Some(line),
                        message: "an alias refers to an anchor that is not defined before it"
                            .into(),
                    });
                };
                let nodes = anchored.nodes;
                let value = anchored.value.clone();
                reader.count(nodes, line)?;
                if reader.expects_key() {
                    match value {
                        Value::String(key) => {
                            reader.push_key(&key, ScalarStyle::DoubleQuoted, None, line)?;
                            None
                        }
                        _ => {
                            return Err(ReadError {
                                line: Some(line),
                                message: "a mapping key must be a scalar".into(),
                            });
                        }
                    }
                } else {
                    Some((value, nodes))
                }
            }
            _ => None,
        };
        if let Some((value, nodes)) = completed {
            match reader.stack.last_mut() {
                None => root = Some(value),
                Some(_) => reader.attach(value, nodes, line)?,
            }
        }
    }
    Ok((documents, reader.multiline_flow))
}

fn span_line(span: &Span) -> u64 {
    span.start.line() as u64
}

impl Reader {
    /// A collection may open only within the nesting depth every rendered resource
    /// keeps (and the agent checks), so nothing deeper is ever built.
    fn refuse_deeper(&self, line: u64) -> Result<(), ReadError> {
        if self.stack.len() >= MAX_NESTING_DEPTH {
            return Err(ReadError {
                line: Some(line),
                message: too_deep(),
            });
        }
        Ok(())
    }

    fn count(&mut self, nodes: usize, line: u64) -> Result<(), ReadError> {
        self.nodes += nodes;
        if self.nodes > MAX_NODES {
            return Err(ReadError {
                line: Some(line),
                message: ALIAS_BOMB.into(),
            });
        }
        Ok(())
    }

    /// The role of a mapping that starts now, from the one it is in.
    fn child_role(&self) -> Role {
        match self.stack.last() {
            None => Role::Root,
            Some(Frame::Mapping {
                role,
                key: Some((PendingKey::Key(key), _)),
                ..
            }) => match (role, key.as_str()) {
                (Role::Root, "metadata") => Role::Metadata,
                (Role::Metadata, "annotations") => Role::Annotations,
                _ => Role::Other,
            },
            Some(_) => Role::Other,
        }
    }

    /// Notes a flow collection that ends on another line than it began.
    fn end_flow(&mut self, flow: bool, line: u64) {
        if flow && self.flow_lines.pop() != Some(line) {
            self.multiline_flow = true;
        }
    }

    /// Whether the mapping being built waits for the value of a merge key (`<<`).
    fn merge_pending(&self) -> bool {
        matches!(
            self.stack.last(),
            Some(Frame::Mapping {
                key: Some((PendingKey::Merge, _)),
                ..
            })
        )
    }

    /// Where the node that comes next goes in its document; `None` at the root, or
    /// under a merge key.
    fn path(&self) -> Option<Vec<Step>> {
        if self.stack.is_empty() {
            return None;
        }
        self.stack
            .iter()
            .map(|frame| match frame {
                Frame::Sequence { items, .. } => Some(Step::Index(items.len())),
                Frame::Mapping {
                    key: Some((PendingKey::Key(key), _)),
                    ..
                } => Some(Step::Key(key.clone())),
                Frame::Mapping { .. } => None,
            })
            .collect()
    }

    fn in_annotations(&self) -> bool {
        matches!(
            self.stack.last(),
            Some(Frame::Mapping {
                role: Role::Annotations,
                ..
            })
        )
    }

    fn expects_key(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Mapping { key: None, .. }))
    }

    fn refuse_complex_key(&self, line: u64) -> Result<(), ReadError> {
        if self.expects_key() {
            return Err(ReadError {
                line: Some(line),
                message: "a mapping key must be a scalar (a string), not a list or a mapping"
                    .into(),
            });
        }
        Ok(())
    }

    fn push_key(
        &mut self,
        text: &str,
        style: ScalarStyle,
        tag: Option<&Tag>,
        line: u64,
    ) -> Result<(), ReadError> {
        let Some(Frame::Mapping {
            entries,
            key,
            merged,
            ..
        }) = self.stack.last_mut()
        else {
            return Ok(());
        };
        let pending = if text == "<<" && style == ScalarStyle::Plain && tag.is_none() {
            PendingKey::Merge
        } else {
            if entries.contains_key(text) {
                if let Some(at) = merged.iter().position(|k| k == text) {
                    merged.swap_remove(at);
                } else {
                    return Err(ReadError {
                        line: Some(line),
                        message: format!(
                            "duplicate key {text:?}; each key may appear once in a mapping"
                        ),
                    });
                }
            }
            PendingKey::Key(text.to_string())
        };
        *key = Some((pending, line));
        Ok(())
    }

    /// Keeps a copy of an anchored node for the aliases that follow.
    fn remember(&mut self, anchor: usize, value: &Value, nodes: usize) {
        if anchor == 0 {
            return;
        }
        if self.anchors.len() <= anchor {
            self.anchors.resize_with(anchor + 1, || None);
        }
        self.anchors[anchor] = Some(Anchored {
            value: value.clone(),
            nodes,
        });
    }

    /// Puts a completed node into the collection being built.
    fn attach(&mut self, value: Value, nodes: usize, line: u64) -> Result<(), ReadError> {
        match self.stack.last_mut() {
            Some(Frame::Sequence {
                items,
                nodes: total,
                ..
            }) => {
                items.push(value);
                *total += nodes;
            }
            Some(Frame::Mapping {
                entries,
                key,
                merged,
                nodes: total,
                role,
                ..
            }) => {
                *total += nodes;
                // kustomize writes annotations as text: what is not a single value
                // becomes empty.
                let value = match (*role, value) {
                    (Role::Annotations, Value::String(text)) => Value::String(text),
                    (Role::Annotations, Value::Array(_) | Value::Object(_)) => {
                        Value::String(String::new())
                    }
                    (Role::Annotations, Value::Null) => Value::String("null".into()),
                    (Role::Annotations, other) => Value::String(other.to_string()),
                    (_, value) => value,
                };
                match key.take() {
                    Some((PendingKey::Key(name), _)) => {
                        entries.insert(name, value);
                    }
                    Some((PendingKey::Merge, key_line)) => {
                        let sources = match value {
                            Value::Object(map) => vec![map],
                            Value::Array(items) => items
                                .into_iter()
                                .map(|item| match item {
                                    Value::Object(map) => Ok(map),
                                    _ => Err(()),
                                })
                                .collect::<Result<Vec<_>, ()>>()
                                .map_err(|()| merge_error(key_line))?,
                            _ => return Err(merge_error(key_line)),
                        };
                        for source in sources {
                            for (name, entry) in source {
                                if !entries.contains_key(&name) {
                                    merged.push(name.clone());
                                    entries.insert(name, entry);
                                }
                            }
                        }
                    }
                    None => {
                        return Err(ReadError {
                            line: Some(line),
                            message: "a mapping key must be a scalar".into(),
                        });
                    }
                }
            }
            None => {}
        }
        Ok(())
    }
}

fn merge_error(line: u64) -> ReadError {
    ReadError {
        line: Some(line),
        message: "a merge key (<<) must be given a mapping or a list of mappings".into(),
    }
}

/// What an explicit tag asks a scalar to be.
enum Wanted {
    Any,
    Str,
    Int,
    Float,
    Bool,
    Null,
    Timestamp,
}

fn wanted(tag: Option<&Tag>) -> Wanted {
    let Some(tag) = tag else {
        return Wanted::Any;
    };
    if !tag.is_yaml_core_schema() {
        // An application tag (`!Ref x`) or `!` leaves the text as it is, as yaml.v3 does.
        return Wanted::Str;
    }
    match tag.suffix() {
        "int" => Wanted::Int,
        "float" => Wanted::Float,
        "bool" => Wanted::Bool,
        "null" => Wanted::Null,
        "timestamp" => Wanted::Timestamp,
        _ => Wanted::Str,
    }
}

/// Resolves one scalar to a JSON value as kustomize does.
pub fn resolve(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Value, String> {
    resolve_in(text, style, tag, false)
}

/// As [`resolve`]; inside a flow collection (`[...]`, `{...}`) kustomize keeps a
/// timestamp with a time of day (it holds a `:`) as its text.
pub(crate) fn resolve_in(
    text: &str,
    style: ScalarStyle,
    tag: Option<&Tag>,
    in_flow: bool,
) -> Result<Value, String> {
    let want = wanted(tag);
    if matches!(want, Wanted::Str) {
        return Ok(Value::String(text.to_string()));
    }
    if style != ScalarStyle::Plain && matches!(want, Wanted::Any) {
        return Ok(Value::String(text.to_string()));
    }
    let resolved = resolve_plain(text, in_flow)?;
    let fits = match want {
        Wanted::Any | Wanted::Str => true,
        Wanted::Int => matches!(&resolved, Value::Number(n) if !n.is_f64()),
        Wanted::Float => matches!(resolved, Value::Number(_)),
        Wanted::Bool => resolved.is_boolean(),
        Wanted::Null => resolved.is_null(),
        Wanted::Timestamp => resolved.is_string() && looks_like_timestamp(text),
    };
    if !fits {
        let tag = tag.map(ToString::to_string).unwrap_or_default();
        return Err(format!("cannot read {text:?} as {tag}"));
    }
    Ok(resolved)
}

fn looks_like_timestamp(text: &str) -> bool {
    parse_timestamp(text).is_some()
}

fn resolve_plain(text: &str, in_flow: bool) -> Result<Value, String> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Ok(Value::Null),
        "true" | "True" | "TRUE" => return Ok(Value::Bool(true)),
        "false" | "False" | "FALSE" => return Ok(Value::Bool(false)),
        ".nan" | ".NaN" | ".NAN" | ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF"
        | "-.inf" | "-.Inf" | "-.INF" => {
            return Err(format!(
                "{text} is not a number JSON can hold, so no manifest can carry it; quote it to mean the text"
            ));
        }
        _ => {}
    }
    let first = text.as_bytes()[0];
    match first {
        b'0'..=b'9' | b'+' | b'-' => {
            if first.is_ascii_digit()
                && !(in_flow && text.contains(':'))
                && let Some(timestamp) = parse_timestamp(text)
            {
                return Ok(Value::String(timestamp));
            }
            let plain: String = text.chars().filter(|&c| c != '_').collect();
            if let Some(number) = go_int(&plain) {
                return Ok(Value::Number(number));
            }
            if is_yaml_style_float(&plain)
                && let Ok(float) = plain.parse::<f64>()
            {
                return Ok(float_value(float));
            }
            Ok(Value::String(text.to_string()))
        }
        b'.' => match text.parse::<f64>() {
            Ok(float) if float.is_finite() && go_parses_float(text) => Ok(float_value(float)),
            _ => Ok(Value::String(text.to_string())),
        },
        _ => Ok(Value::String(text.to_string())),
    }
}

/// Rust reads more float spellings than Go (`.5e`, no; `.inf`, handled above); after
/// a leading dot Go takes digits, an optional exponent, and nothing else.
fn go_parses_float(text: &str) -> bool {
    let rest = &text[1..];
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    !mantissa.is_empty()
        && mantissa.bytes().all(|b| b.is_ascii_digit())
        && exponent.is_none_or(|e| {
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
        })
}

fn float_value(float: f64) -> Value {
    Number::from_f64(float).map_or(Value::Null, Value::Number)
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`, the shape yaml.v3 reads
/// as a float.
fn is_yaml_style_float(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = 0;
    if matches!(bytes.first(), Some(b'+' | b'-')) {
        at += 1;
    }
    let digits = |from: usize| {
        bytes[from..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    if bytes.get(at) == Some(&b'.') {
        let n = digits(at + 1);
        if n == 0 {
            return false;
        }
        at += 1 + n;
    } else {
        let n = digits(at);
        if n == 0 {
            return false;
        }
        at += n;
        if bytes.get(at) == Some(&b'.') {
            at += 1 + digits(at + 1);
        }
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        let n = digits(at);
        if n == 0 {
            return false;
        }
        at += n;
    }
    at == bytes.len()
}

/// An integer in Go's literal syntax (as `strconv.ParseInt(s, 0, 64)`, then
/// `ParseUint` for values past `i64`): optional sign, then `0x`, `0o`, `0b` or a
/// leading `0` (octal), or decimal.
fn go_int(text: &str) -> Option<Number> {
    let (negative, signed, rest) = match text.as_bytes().first()? {
        b'-' => (true, true, &text[1..]),
        b'+' => (false, true, &text[1..]),
        _ => (false, false, text),
    };
    let (radix, digits) =
        if let Some(hex) = rest.strip_prefix("0x").or_else(|| rest.strip_prefix("0X")) {
            (16, hex)
        } else if let Some(octal) = rest.strip_prefix("0o").or_else(|| rest.strip_prefix("0O")) {
            (8, octal)
        } else if let Some(binary) = rest.strip_prefix("0b").or_else(|| rest.strip_prefix("0B")) {
            (2, binary)
        } else if rest.len() > 1 && rest.starts_with('0') {
            (8, &rest[1..])
        } else {
            (10, rest)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    if negative {
        if magnitude <= i64::MAX as u64 + 1 {
            return Some(Number::from((magnitude as i128).wrapping_neg() as i64));
        }
        return None;
    }
    if magnitude <= i64::MAX as u64 {
        return Some(Number::from(magnitude as i64));
    }
    // Go's ParseUint takes no sign.
    (!signed).then(|| Number::from(magnitude))
}

/// A yaml.v3 timestamp (`YYYY-M-D`, with an optional `T`/`t`/space time, fraction
/// and zone) written as Go writes a `time.Time` in JSON (RFC 3339, fraction without
/// trailing zeros, `Z` for UTC).
fn parse_timestamp(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    if bytes.len() < 5 || !bytes[..4].iter().all(u8::is_ascii_digit) || bytes[4] != b'-' {
        return None;
    }
    let year: i32 = text[..4].parse().ok()?;
    let mut cursor = Cursor { text, at: 5 };
    let month = cursor.number(1, 2)?;
    cursor.expect(b'-')?;
    let day = cursor.number(1, 2)?;
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if cursor.done() {
        return Some(format!("{year:04}-{month:02}-{day:02}T00:00:00Z"));
    }
    let separator = cursor.next()?;
    let zoned = match separator {
        b'T' | b't' => true,
        b' ' => false,
        _ => return None,
    };
    let hour = cursor.number(1, 2)?;
    cursor.expect(b':')?;
    let minute = cursor.number(1, 2)?;
    cursor.expect(b':')?;
    let second = cursor.number(1, 2)?;
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let mut fraction = String::new();
    if cursor.peek() == Some(b'.') {
        cursor.at += 1;
        let start = cursor.at;
        while cursor.peek().is_some_and(|b| b.is_ascii_digit()) {
            cursor.at += 1;
        }
        if cursor.at == start {
            return None;
        }
        // Go keeps nanoseconds: digits past the ninth are dropped.
        let digits = &text[start..cursor.at.min(start + 9)];
        fraction = digits.trim_end_matches('0').to_string();
    }
    let zone = if zoned {
        match cursor.next()? {
            b'Z' => "Z".to_string(),
            sign @ (b'+' | b'-') => {
                let hours = cursor.number(2, 2)?;
                cursor.expect(b':')?;
                let minutes = cursor.number(2, 2)?;
                if hours > 23 || minutes > 59 {
                    return None;
                }
                if hours == 0 && minutes == 0 {
                    "Z".to_string()
                } else {
                    format!("{}{hours:02}:{minutes:02}", sign as char)
                }
            }
            _ => return None,
        }
    } else {
        "Z".to_string()
    };
    if !cursor.done() {
        return None;
    }
    let fraction = if fraction.is_empty() {
        String::new()
    } else {
        format!(".{fraction}")
    };
    Some(format!(
        "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}{fraction}{zone}"
    ))
}

struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    fn done(&self) -> bool {
        self.at == self.text.len()
    }

    /// Between `min` and `max` digits.
    fn number(&mut self, min: usize, max: usize) -> Option<u32> {
        let start = self.at;
        while self.at - start < max && self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        if self.at - start < min {
            return None;
        }
        self.text[start..self.at].parse().ok()
    }
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plain(text: &str) -> Value {
        resolve(text, ScalarStyle::Plain, None).expect("resolves")
    }

    #[test]
    fn scalars_resolve_as_kustomize_reads_them() {
        let cases = [
            ("yes", json!("yes")),
            ("on", json!("on")),
            ("y", json!("y")),
            ("off", json!("off")),
            ("True", json!(true)),
            ("FALSE", json!(false)),
            ("0755", json!(493)),
            ("0644", json!(420)),
            ("012", json!(10)),
            ("0o17", json!(15)),
            ("0X1F", json!(31)),
            ("0B101", json!(5)),
            ("-0x10", json!(-16)),
            ("1_000", json!(1000)),
            ("1__0", json!(10)),
            ("08", json!(8.0)),
            ("1e3", json!(1000.0)),
            (".5", json!(0.5)),
            ("+12", json!(12)),
            ("~", Value::Null),
            ("", Value::Null),
            ("0x", json!("0x")),
            ("0o8", json!("0o8")),
            ("1e", json!("1e")),
            ("12:30", json!("12:30")),
            ("18446744073709551615", json!(18446744073709551615u64)),
            ("2001-12-14", json!("2001-12-14T00:00:00Z")),
            ("2001-1-2", json!("2001-01-02T00:00:00Z")),
            (
                "2001-12-14T21:59:43.10-05:00",
                json!("2001-12-14T21:59:43.1-05:00"),
            ),
            ("2001-12-14 21:59:43.10", json!("2001-12-14T21:59:43.1Z")),
            ("2001-13-14", json!("2001-13-14")),
        ];
        for (text, expected) in cases {
            assert_eq!(plain(text), expected, "{text}");
        }
        assert!(resolve(".inf", ScalarStyle::Plain, None).is_err());
        assert_eq!(
            resolve("0755", ScalarStyle::SingleQuoted, None),
            Ok(json!("0755"))
        );
    }

    #[test]
    fn documents_anchors_and_merge_keys() {
        let text = "# c\na: &x {b: 1, c: 2}\nd:\n  <<: *x\n  c: 3\n---\n---\ne: [&y 1, *y]\n";
        let documents = read_documents(text).expect("reads");
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[0].line, 2);
        assert_eq!(documents[0].value["d"], json!({"b": 1, "c": 3}));
        assert_eq!(documents[1].value["e"], json!([1, 1]));
        assert_eq!(documents[1].line, 8);
        let text = "metadata:\n  annotations: {a: 0755, b: yes, c: ~, d: [1]}\n  labels: {a: 0755}\nspec:\n  annotations: {a: 0755}\n  t: [2001-12-14T21:59:43Z, 2001-12-14]\n";
        let value = &read_documents(text).expect("reads")[0].value;
        assert_eq!(
            value["metadata"]["annotations"],
            json!({"a": "0755", "b": "yes", "c": "~", "d": ""})
        );
        assert_eq!(value["metadata"]["labels"], json!({"a": 493}));
        assert_eq!(value["spec"]["annotations"], json!({"a": 493}));
        assert_eq!(
            value["spec"]["t"],
            json!(["2001-12-14T21:59:43Z", "2001-12-14T00:00:00Z"])
        );
        let err = read_documents("a: 1\na: 2\n").expect_err("duplicate key");
        assert_eq!(err.line, Some(2));
    }
}
