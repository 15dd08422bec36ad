//! Writing: a [`Value`] through Go's JSON encoding, then go-yaml v2's emitter, whose
//! decisions (scalar styles, indentation, folding) are reproduced here step by step.

use std::cmp::Ordering;

use super::floats::format_g;
use super::{MAX_DEPTH, YamlError};
use crate::helm::gotmpl::Value;

/// A value as go-yaml v2 sees it after the JSON step.
enum Node {
    /// A plain scalar go-yaml writes as it is: `null`, `true`, a number.
    Literal(String),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

/// `sigs.k8s.io/yaml.Marshal`: the YAML text, ending with a line break.
pub fn marshal(value: &Value) -> Result<String, YamlError> {
    let node = to_node(value, 0)?;
    let mut emitter = Emitter::default();
    emitter.node(&node, Context::default());
    // The document's end: go-yaml ends the last line.
    emitter.indent = -1;
    emitter.write_indent();
    Ok(emitter.out)
}

/// Helm's `toYaml`: [`marshal`] without the final line break. (Helm's template function
/// writes an empty string where this is an error.)
pub fn to_yaml(value: &Value) -> Result<String, YamlError> {
    let mut text = marshal(value)?;
    if text.ends_with('\n') {
        text.pop();
    }
    Ok(text)
}

fn to_node(value: &Value, depth: usize) -> Result<Node, YamlError> {
    if depth > MAX_DEPTH {
        return Err(YamlError::new(format!(
            "json: the value nests deeper than {MAX_DEPTH} levels; flotilla does not write it"
        )));
    }
    Ok(match value {
        Value::Nil | Value::Missing => Node::Literal("null".into()),
        Value::Bool(b) => Node::Literal(b.to_string()),
        Value::Int(i) | Value::Int64(i) => Node::Literal(i.to_string()),
        Value::Float(f) => Node::Literal(float_text(*f)?),
        Value::String(s) => Node::Str(s.to_string()),
        Value::Bytes(bytes) => Node::Str(base64(bytes)),
        Value::List(items) => Node::Seq(
            items
                .iter()
                .map(|item| to_node(item, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        Value::Map(entries) => {
            let Some(_visit) = entries.visit() else {
                return Err(YamlError::new(
                    "json: unsupported value: encountered a cycle via map[string]interface {}",
                ));
            };
            let mut pairs = entries
                .entries()
                .iter()
                .map(|(k, v)| Ok((k.clone(), to_node(v, depth + 1)?)))
                .collect::<Result<Vec<_>, YamlError>>()?;
            pairs.sort_by(|a, b| key_order(&a.0, &b.0));
            Node::Map(pairs)
        }
        Value::Object(object) if object.json_fields().is_some() => {
            let fields = object.json_fields().unwrap_or_default();
            let mut pairs = fields
                .iter()
                .map(|(k, v)| Ok((k.clone(), to_node(v, depth + 1)?)))
                .collect::<Result<Vec<_>, YamlError>>()?;
            // Through JSON and back, a struct's keys come out sorted like a map's.
            pairs.sort_by(|a, b| key_order(&a.0, &b.0));
            Node::Map(pairs)
        }
        Value::Object(object) => {
            return Err(YamlError::new(format!(
                "flotilla cannot write a {} as YAML",
                object.type_name()
            )));
        }
    })
}

/// A float64 as it comes out of JSON and then go-yaml: JSON writes a whole number
/// below 1e21 without a fraction, go-yaml reads that back as an integer where it fits
/// 64 bits, and writes every other float with `strconv.FormatFloat(f, 'g', -1, 64)`.
fn float_text(f: f64) -> Result<String, YamlError> {
    if f.is_nan() {
        return Err(YamlError::new("json: unsupported value: NaN"));
    }
    if f.is_infinite() {
        let sign = if f > 0.0 { "+" } else { "-" };
        return Err(YamlError::new(format!(
            "json: unsupported value: {sign}Inf"
        )));
    }
    if f == f.trunc() && f.abs() < 1e21 {
        // Rust writes the shortest digits that read back as `f`, as Go's JSON does.
        let text = format!("{f}");
        if let Ok(i) = text.parse::<i64>() {
            return Ok(i.to_string());
        }
        if let Ok(u) = text.parse::<u64>() {
            return Ok(u.to_string());
        }
    }
    Ok(format_g(f, false))
}

/// Go's `encoding/json` writes `[]byte` as standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// go-yaml v2's order of map keys: letters by code point, runs of digits by their
/// number, and anything else before a letter.
pub fn key_order(a: &str, b: &str) -> Ordering {
    if key_less(a, b) {
        Ordering::Less
    } else if key_less(b, a) {
        Ordering::Greater
    } else {
        Ordering::Equal
    }
}

fn key_less(a: &str, b: &str) -> bool {
    let ar: Vec<char> = a.chars().collect();
    let br: Vec<char> = b.chars().collect();
    let digit = |c: char| c.is_ascii_digit();
    for i in 0..ar.len().min(br.len()) {
        if ar[i] == br[i] {
            continue;
        }
        let al = ar[i].is_alphabetic();
        let bl = br[i].is_alphabetic();
        if al && bl {
            return ar[i] < br[i];
        }
        if al || bl {
            return bl;
        }
        let (mut an, mut bn) = (0i64, 0i64);
        if ar[i] == '0' || br[i] == '0' {
            // A zero inside a number that already has a nonzero digit counts.
            let mut j = i;
            while j > 0 && digit(ar[j - 1]) {
                j -= 1;
                if ar[j] != '0' {
                    an = 1;
                    bn = 1;
                    break;
                }
            }
        }
        let mut ai = i;
        while ai < ar.len() && digit(ar[ai]) {
            an = an
                .wrapping_mul(10)
                .wrapping_add(i64::from(ar[ai] as u8 - b'0'));
            ai += 1;
        }
        let mut bi = i;
        while bi < br.len() && digit(br[bi]) {
            bn = bn
                .wrapping_mul(10)
                .wrapping_add(i64::from(br[bi] as u8 - b'0'));
            bi += 1;
        }
        if an != bn {
            return an < bn;
        }
        if ai != bi {
            return ai < bi;
        }
        return ar[i] < br[i];
    }
    ar.len() < br.len()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    Plain,
    Single,
    Double,
    Literal,
}

/// Where a node is written (go-yaml's `*_context` flags).
#[derive(Clone, Copy, Default)]
struct Context {
    mapping: bool,
    simple_key: bool,
}

/// go-yaml's emitter state, for block collections (flow only for `{}` and `[]`).
struct Emitter {
    out: String,
    column: usize,
    whitespace: bool,
    indention: bool,
    indent: i64,
    indents: Vec<i64>,
}

impl Default for Emitter {
    fn default() -> Emitter {
        Emitter {
            out: String::new(),
            column: 0,
            whitespace: true,
            indention: true,
            indent: -1,
            indents: Vec::new(),
        }
    }
}

const BEST_INDENT: i64 = 2;
const BEST_WIDTH: usize = 80;

impl Emitter {
    fn put(&mut self, c: char) {
        self.out.push(c);
        self.column += 1;
    }

    fn put_break(&mut self) {
        self.out.push('\n');
        self.column = 0;
    }

    fn write_break(&mut self, c: char) {
        if c == '\n' {
            self.put_break();
        } else {
            self.out.push(c);
            self.column = 0;
        }
    }

    fn write_indent(&mut self) {
        let indent = self.indent.max(0) as usize;
        if !self.indention || self.column > indent || (self.column == indent && !self.whitespace) {
            self.put_break();
        }
        while self.column < indent {
            self.put(' ');
        }
        self.whitespace = true;
        self.indention = true;
    }

    fn write_indicator(
        &mut self,
        indicator: &str,
        need_whitespace: bool,
        is_whitespace: bool,
        is_indention: bool,
    ) {
        if need_whitespace && !self.whitespace {
            self.put(' ');
        }
        for c in indicator.chars() {
            self.put(c);
        }
        self.whitespace = is_whitespace;
        self.indention = self.indention && is_indention;
    }

    fn increase_indent(&mut self, flow: bool, indentless: bool) {
        self.indents.push(self.indent);
        if self.indent < 0 {
            self.indent = if flow { BEST_INDENT } else { 0 };
        } else if !indentless {
            self.indent += BEST_INDENT;
        }
    }

    fn pop_indent(&mut self) {
        self.indent = self.indents.pop().unwrap_or(-1);
    }

    fn node(&mut self, node: &Node, context: Context) {
        match node {
            Node::Literal(text) => self.scalar(text, Style::Plain, context),
            Node::Str(text) => {
                let style = if text.contains('\n') {
                    Style::Literal
                } else if plain_reads_as_string(text) {
                    Style::Plain
                } else {
                    Style::Double
                };
                self.scalar(text, style, context);
            }
            Node::Seq(items) if items.is_empty() => {
                self.write_indicator("[", true, true, false);
                self.write_indicator("]", false, false, false);
            }
            Node::Map(entries) if entries.is_empty() => {
                self.write_indicator("{", true, true, false);
                self.write_indicator("}", false, false, false);
            }
            Node::Seq(items) => {
                self.increase_indent(false, context.mapping && !self.indention);
                for item in items {
                    self.write_indent();
                    self.write_indicator("-", true, false, true);
                    self.node(item, Context::default());
                }
                self.pop_indent();
            }
            Node::Map(entries) => {
                self.increase_indent(false, false);
                for (key, value) in entries {
                    self.write_indent();
                    let key_node = Node::Str(key.clone());
                    let analysis = analyze(key);
                    if !analysis.multiline && key.len() <= 128 {
                        self.node(
                            &key_node,
                            Context {
                                mapping: false,
                                simple_key: true,
                            },
                        );
                        self.write_indicator(":", false, false, false);
                    } else {
                        self.write_indicator("?", true, false, true);
                        self.node(
                            &key_node,
                            Context {
                                mapping: true,
                                simple_key: false,
                            },
                        );
                        self.write_indent();
                        self.write_indicator(":", true, false, true);
                    }
                    self.node(
                        value,
                        Context {
                            mapping: true,
                            simple_key: false,
                        },
                    );
                }
                self.pop_indent();
            }
        }
    }

    fn scalar(&mut self, text: &str, requested: Style, context: Context) {
        let analysis = analyze(text);
        let mut style = requested;
        if context.simple_key && analysis.multiline {
            style = Style::Double;
        }
        if style == Style::Plain
            && (!analysis.block_plain_allowed || (text.is_empty() && context.simple_key))
        {
            style = Style::Single;
        }
        if style == Style::Single && !analysis.single_quoted_allowed {
            style = Style::Double;
        }
        if style == Style::Literal && (!analysis.block_allowed || context.simple_key) {
            style = Style::Double;
        }
        self.increase_indent(true, false);
        let chars: Vec<char> = text.chars().collect();
        let allow_breaks = !context.simple_key;
        match style {
            Style::Plain => self.write_plain(&chars, allow_breaks),
            Style::Single => self.write_single(&chars, allow_breaks),
            Style::Double => self.write_double(&chars, allow_breaks),
            Style::Literal => self.write_literal(&chars),
        }
        self.pop_indent();
    }

    fn write_plain(&mut self, value: &[char], allow_breaks: bool) {
        if !self.whitespace {
            self.put(' ');
        }
        let mut spaces = false;
        let mut breaks = false;
        for (i, &c) in value.iter().enumerate() {
            if c == ' ' {
                if allow_breaks && !spaces && self.column > BEST_WIDTH && !is_space_at(value, i + 1)
                {
                    self.write_indent();
                } else {
                    self.put(c);
                }
                spaces = true;
            } else if is_break(c) {
                if !breaks && c == '\n' {
                    self.put_break();
                }
                self.write_break(c);
                self.indention = true;
                breaks = true;
            } else {
                if breaks {
                    self.write_indent();
                }
                self.put(c);
                self.indention = false;
                spaces = false;
                breaks = false;
            }
        }
        self.whitespace = false;
        self.indention = false;
    }

    fn write_single(&mut self, value: &[char], allow_breaks: bool) {
        self.write_indicator("'", true, false, false);
        let mut spaces = false;
        let mut breaks = false;
        for (i, &c) in value.iter().enumerate() {
            if c == ' ' {
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i > 0
                    && i + 1 < value.len()
                    && !is_space_at(value, i + 1)
                {
                    self.write_indent();
                } else {
                    self.put(c);
                }
                spaces = true;
            } else if is_break(c) {
                if !breaks && c == '\n' {
                    self.put_break();
                }
                self.write_break(c);
                self.indention = true;
                breaks = true;
            } else {
                if breaks {
                    self.write_indent();
                }
                if c == '\'' {
                    self.put('\'');
                }
                self.put(c);
                self.indention = false;
                spaces = false;
                breaks = false;
            }
        }
        self.write_indicator("'", false, false, false);
        self.whitespace = false;
        self.indention = false;
    }

    fn write_double(&mut self, value: &[char], allow_breaks: bool) {
        self.write_indicator("\"", true, false, false);
        // go-yaml checks for a byte order mark at the start of the value, not at each
        // character: a value that starts with one has every character escaped.
        let bom = value.first() == Some(&'\u{FEFF}');
        let mut spaces = false;
        for (i, &c) in value.iter().enumerate() {
            if !is_printable(c) || bom || is_break(c) || c == '"' || c == '\\' {
                self.put('\\');
                match c {
                    '\0' => self.put('0'),
                    '\u{7}' => self.put('a'),
                    '\u{8}' => self.put('b'),
                    '\t' => self.put('t'),
                    '\n' => self.put('n'),
                    '\u{b}' => self.put('v'),
                    '\u{c}' => self.put('f'),
                    '\r' => self.put('r'),
                    '\u{1b}' => self.put('e'),
                    '"' => self.put('"'),
                    '\\' => self.put('\\'),
                    '\u{85}' => self.put('N'),
                    '\u{a0}' => self.put('_'),
                    '\u{2028}' => self.put('L'),
                    '\u{2029}' => self.put('P'),
                    _ => {
                        let code = c as u32;
                        let (letter, width) = if code <= 0xFF {
                            ('x', 2)
                        } else if code <= 0xFFFF {
                            ('u', 4)
                        } else {
                            ('U', 8)
                        };
                        self.put(letter);
                        for ch in format!("{code:0width$X}").chars() {
                            self.put(ch);
                        }
                    }
                }
                spaces = false;
            } else if c == ' ' {
                if allow_breaks
                    && !spaces
                    && self.column > BEST_WIDTH
                    && i > 0
                    && i + 1 < value.len()
                {
                    self.write_indent();
                    if is_space_at(value, i + 1) {
                        self.put('\\');
                    }
                } else {
                    self.put(c);
                }
                spaces = true;
            } else {
                self.put(c);
                spaces = false;
            }
        }
        self.write_indicator("\"", false, false, false);
        self.whitespace = false;
        self.indention = false;
    }

    fn write_literal(&mut self, value: &[char]) {
        self.write_indicator("|", true, false, false);
        if value.first().is_some_and(|&c| c == ' ' || is_break(c)) {
            self.write_indicator(&BEST_INDENT.to_string(), false, false, false);
        }
        let chomp = match value {
            [] => Some("-"),
            [.., last] if !is_break(*last) => Some("-"),
            [_] => Some("+"),
            [.., before, _] if is_break(*before) => Some("+"),
            _ => None,
        };
        if let Some(chomp) = chomp {
            self.write_indicator(chomp, false, false, false);
        }
        self.put_break();
        self.indention = true;
        self.whitespace = true;
        let mut breaks = true;
        for &c in value {
            if is_break(c) {
                self.write_break(c);
                self.indention = true;
                breaks = true;
            } else {
                if breaks {
                    self.write_indent();
                }
                self.put(c);
                self.indention = false;
                breaks = false;
            }
        }
    }
}

fn is_space_at(value: &[char], i: usize) -> bool {
    value.get(i) == Some(&' ')
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\n' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// The characters go-yaml writes as they are (YAML's printable set, within the
/// Basic Multilingual Plane).
fn is_printable(c: char) -> bool {
    let code = c as u32;
    c == '\n'
        || (0x20..=0x7E).contains(&code)
        || (0xA0..=0xD7FF).contains(&code)
        || ((0xE000..=0xFFFD).contains(&code) && code != 0xFEFF)
}

/// What go-yaml's `yaml_emitter_analyze_scalar` finds out about a value.
struct Analysis {
    multiline: bool,
    block_plain_allowed: bool,
    single_quoted_allowed: bool,
    block_allowed: bool,
}

fn analyze(text: &str) -> Analysis {
    if text.is_empty() {
        return Analysis {
            multiline: false,
            block_plain_allowed: true,
            single_quoted_allowed: true,
            block_allowed: false,
        };
    }
    let value: Vec<char> = text.chars().collect();
    let mut block_indicators = text.starts_with("---") || text.starts_with("...");
    let mut line_breaks = false;
    let mut special_characters = false;
    let mut leading_space = false;
    let mut leading_break = false;
    let mut trailing_space = false;
    let mut trailing_break = false;
    let mut break_space = false;
    let mut space_break = false;
    let mut preceded_by_whitespace = true;
    let mut previous_space = false;
    let mut previous_break = false;
    let last = value.len() - 1;
    for (i, &c) in value.iter().enumerate() {
        let followed_by_whitespace = i == last || is_blank(value[i + 1]);
        if i == 0 {
            match c {
                '#' | ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"'
                | '%' | '@' | '`' => block_indicators = true,
                '?' | ':' | '-' if followed_by_whitespace => block_indicators = true,
                _ => {}
            }
        } else {
            match c {
                ':' if followed_by_whitespace => block_indicators = true,
                '#' if preceded_by_whitespace => block_indicators = true,
                _ => {}
            }
        }
        if !is_printable(c) {
            special_characters = true;
        }
        if c == ' ' {
            leading_space |= i == 0;
            trailing_space |= i == last;
            break_space |= previous_break;
            previous_space = true;
            previous_break = false;
        } else if is_break(c) {
            line_breaks = true;
            leading_break |= i == 0;
            trailing_break |= i == last;
            space_break |= previous_space;
            previous_space = false;
            previous_break = true;
        } else {
            previous_space = false;
            previous_break = false;
        }
        preceded_by_whitespace = is_blank(c) || is_break(c) || c == '\0';
    }
    let mut analysis = Analysis {
        multiline: line_breaks,
        block_plain_allowed: true,
        single_quoted_allowed: true,
        block_allowed: true,
    };
    if leading_space || leading_break || trailing_space || trailing_break {
        analysis.block_plain_allowed = false;
    }
    if trailing_space {
        analysis.block_allowed = false;
    }
    if break_space {
        analysis.block_plain_allowed = false;
        analysis.single_quoted_allowed = false;
    }
    if space_break || special_characters {
        analysis.block_plain_allowed = false;
        analysis.single_quoted_allowed = false;
        analysis.block_allowed = false;
    }
    if line_breaks || block_indicators {
        analysis.block_plain_allowed = false;
    }
    analysis
}

/// Whether go-yaml would read the text, written plain, back as the same string (not a
/// number, boolean, null, timestamp or sexagesimal number).
fn plain_reads_as_string(text: &str) -> bool {
    // go-yaml's table gives `<<` the merge tag, yet Helm writes it plain.
    if text == "<<" {
        return true;
    }
    matches!(
        super::read::resolve_plain(text),
        super::read::Scalar::Str(_)
    ) && !is_base60_float(text)
}

/// `^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$`: go-yaml quotes these (`12:30`)
/// since YAML 1.1 reads them as numbers.
fn is_base60_float(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut at = usize::from(matches!(bytes.first(), Some(b'+' | b'-')));
    if !bytes.get(at).is_some_and(u8::is_ascii_digit) {
        return false;
    }
    at += 1;
    while bytes
        .get(at)
        .is_some_and(|b| b.is_ascii_digit() || *b == b'_')
    {
        at += 1;
    }
    let mut groups = 0;
    while bytes.get(at) == Some(&b':') {
        at += 1;
        let start = at;
        if bytes.get(at).is_some_and(|b| (b'0'..=b'5').contains(b))
            && bytes.get(at + 1).is_some_and(u8::is_ascii_digit)
        {
            at += 2;
        } else if bytes.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return false;
        }
        groups += 1;
    }
    if groups == 0 {
        return false;
    }
    if bytes.get(at) == Some(&b'.') {
        at += 1;
        while bytes
            .get(at)
            .is_some_and(|b| b.is_ascii_digit() || *b == b'_')
        {
            at += 1;
        }
    }
    at == bytes.len()
}
