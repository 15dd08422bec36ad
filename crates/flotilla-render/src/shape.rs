//! Reading a template's output without parsing its YAML again.
//!
//! Most per-cluster templates are YAML with a few `{{ … }}` values in it, and their
//! outputs differ from one cluster to the next only where those values are. Parsing
//! every output as YAML was most of the time of a templated fleet's render. So each
//! template's *shape* is read once: its text with every `{{ … }}` replaced by a
//! marker, parsed into documents in which each marker's scalar is a hole. An output
//! is then read by finding the template's literal text around each value, checking
//! that each value is one YAML would read as part of its scalar (and nothing more),
//! and putting the scalar, read by the same rules as the YAML reader's, into a copy
//! of the shape.
//!
//! This does not depend on how the template engine ran: whatever the output is, it
//! is read this way only if it is the template's literal text with a value in each
//! hole, and then the documents are those the YAML reader gives for that text (the
//! property test in `tests/it/shape.rs` checks it on generated templates and
//! values). Any other output, and any value the checks refuse, is parsed as before:
//! the fast path can make a render faster, never different.

use serde_json::Value;
use serde_saphyr::granit_parser::ScalarStyle;

use crate::kyaml::{self, Document, HOLE_END, HOLE_START, HoleSite, Step};

/// A template's literal text and its documents with holes.
#[derive(Debug)]
pub struct Shape {
    /// The text before the first value, between values, and after the last.
    literals: Vec<String>,
    documents: Vec<Document>,
    holes: Vec<HoleSite>,
}

impl Shape {
    /// The shape of a template, or `None` when it has none this module can use: a
    /// statement or comment tag (`{% … %}`, `{# … #}`), whitespace control, two
    /// values with no text between them, a value outside a one-line scalar value,
    /// or YAML the reader refuses.
    pub fn of_template(source: &str) -> Option<Shape> {
        if source.contains("{%") || source.contains("{#") {
            return None;
        }
        if source.contains(HOLE_START) || source.contains(HOLE_END) {
            return None;
        }
        let mut literals = Vec::new();
        let mut marked = String::with_capacity(source.len());
        // Where each marker starts in `marked`, in characters.
        let mut marker_at = Vec::new();
        let mut marked_chars = 0;
        let mut rest = source;
        while let Some(start) = rest.find("{{") {
            let end = start + rest[start..].find("}}")?;
            let expression = &rest[start + 2..end];
            if expression.contains('\n')
                || expression.starts_with('-')
                || expression.ends_with('-')
                || expression.contains("{{")
            {
                return None;
            }
            let literal = &rest[..start];
            if !literals.is_empty() && literal.is_empty() {
                return None;
            }
            literals.push(literal.to_string());
            marked.push_str(literal);
            marked_chars += literal.chars().count();
            marker_at.push(marked_chars);
            let marker = format!("{HOLE_START}{}{HOLE_END}", literals.len() - 1);
            marked_chars += marker.chars().count();
            marked.push_str(&marker);
            rest = &rest[end + 2..];
        }
        literals.push(rest.to_string());
        marked.push_str(rest);
        let (documents, holes) = kyaml::read_shape(&marked).ok()?;
        // Every value is in exactly one scalar, and the scalar is where its marker
        // is: none in a comment, none made by an escape sequence (`"\uE000"`).
        let mut seen = vec![false; literals.len() - 1];
        for site in &holes {
            for index in hole_indexes(&site.text)? {
                if std::mem::replace(seen.get_mut(index)?, true) {
                    return None;
                }
                if !(site.chars.0..site.chars.1).contains(&marker_at[index]) {
                    return None;
                }
            }
        }
        if seen.contains(&false) {
            return None;
        }
        Some(Shape {
            literals,
            documents,
            holes,
        })
    }

    /// The documents of `text`, an output of the template, without parsing it; `None`
    /// when the text is not the template's literal text with values in its holes that
    /// YAML would read as this shape says. The caller then parses the text.
    pub fn read(&self, text: &str) -> Option<Vec<Document>> {
        let values = self.values(text)?;
        let scalars = self.scalars(&values)?;
        let mut documents = self.documents.clone();
        for (site, value) in self.holes.iter().zip(scalars) {
            *place(&mut documents.get_mut(site.document)?.value, &site.path)? = value;
        }
        Some(documents)
    }

    /// The value in each hole of `text`, an output of the template: `None` unless
    /// `text` is the template's literal text with a value in each hole, every value
    /// one YAML reads as part of its scalar and nothing more. (What the template
    /// writes, [`Shape::text_with`] these values, is then read as the shape's
    /// documents with [`Shape::scalars`] at its sites.)
    pub fn values<'t>(&self, text: &'t str) -> Option<Vec<&'t str>> {
        let values = self.values_in(text)?;
        for site in &self.holes {
            for (position, part) in parts(&site.text).enumerate() {
                if let Part::Hole(index) = part
                    && !fits(values.get(index)?, site.style, position == 0)
                {
                    return None;
                }
            }
        }
        Some(values)
    }

    /// The scalar at each site (see [`Shape::sites`]) for these values of the
    /// holes, read by the YAML reader's rules; `None` when one cannot be read (the
    /// output is then left to the parser, which says why).
    pub fn scalars(&self, values: &[impl AsRef<str>]) -> Option<Vec<Value>> {
        self.holes
            .iter()
            .map(|site| {
                let mut scalar = String::with_capacity(site.text.len());
                for part in parts(&site.text) {
                    match part {
                        Part::Text(literal) => scalar.push_str(literal),
                        Part::Hole(index) => scalar.push_str(values.get(index)?.as_ref()),
                    }
                }
                if site.annotation {
                    Some(Value::String(scalar))
                } else {
                    kyaml::resolve_in(&scalar, site.style, site.tag.as_ref(), site.in_flow).ok()
                }
            })
            .collect()
    }

    /// The template's output with these values in its holes: its literal text with
    /// a value between each two literals.
    pub fn text_with(&self, values: &[impl AsRef<str>]) -> String {
        let mut text = String::new();
        for (literal, value) in self.literals.iter().zip(values) {
            text.push_str(literal);
            text.push_str(value.as_ref());
        }
        if let Some(last) = self.literals.last() {
            text.push_str(last);
        }
        text
    }

    /// Whether an output could hold a CustomResourceDefinition, which makes kinds
    /// cluster-scoped: a document's `kind` says so, or is a value of the template.
    pub fn may_define_crd(&self) -> bool {
        self.holes
            .iter()
            .any(|site| matches!(site.path.as_slice(), [Step::Key(k)] if k == "kind"))
            || self.documents.iter().any(|d| {
                d.value.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition")
            })
    }

    /// The shape's documents, each site's scalar holding the text it was read with
    /// (holes marked).
    pub fn documents(&self) -> &[Document] {
        &self.documents
    }

    /// The scalars that hold holes, in the order [`Shape::scalars`] gives their values.
    pub fn sites(&self) -> &[HoleSite] {
        &self.holes
    }

    /// The value in each hole: `text` must be the literals with one value between each
    /// two (the first place the next literal appears ends a value).
    fn values_in<'t>(&self, text: &'t str) -> Option<Vec<&'t str>> {
        let (first, rest) = self.literals.split_first()?;
        let (last, middle) = rest.split_last()?;
        let mut rest = text.strip_prefix(first.as_str())?;
        let mut values = Vec::with_capacity(self.literals.len() - 1);
        for literal in middle {
            let at = rest.find(literal.as_str())?;
            values.push(&rest[..at]);
            rest = &rest[at + literal.len()..];
        }
        values.push(rest.strip_suffix(last.as_str())?);
        Some(values)
    }
}

/// Whether YAML reads `value`, put into a one-line scalar of `style`, as characters
/// of that scalar and nothing else.
fn fits(value: &str, style: ScalarStyle, at_start: bool) -> bool {
    match style {
        // Letters, digits and `_ . / + -` cannot end a plain scalar, start a comment
        // or a flow collection, or be read as an indicator once the scalar has begun;
        // at its start only a letter or digit is safe (`-`, `.` and `+` begin
        // indicators or document markers there). An empty value could leave a `:`
        // before a space.
        ScalarStyle::Plain => {
            let mut chars = value.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphanumeric() || (!at_start && plain_safe(c)))
                && chars.all(plain_safe)
        }
        ScalarStyle::SingleQuoted => value.chars().all(|c| quoted_safe(c) && c != '\''),
        ScalarStyle::DoubleQuoted => value
            .chars()
            .all(|c| quoted_safe(c) && c != '"' && c != '\\'),
        _ => false,
    }
}

fn plain_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '+' | '-')
}

/// Printable characters that are not line breaks (YAML's own and Unicode's), not a
/// byte order mark, and not the hole markers.
fn quoted_safe(c: char) -> bool {
    !c.is_control()
        && !matches!(
            c,
            '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{FEFF}' | '\u{FFFE}' | '\u{FFFF}'
        )
        && c != HOLE_START
        && c != HOLE_END
}

enum Part<'a> {
    Text(&'a str),
    Hole(usize),
}

/// The text and holes of a scalar of the shape, in order.
fn parts(text: &str) -> impl Iterator<Item = Part<'_>> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.strip_prefix(HOLE_START) {
            Some(hole) => {
                let end = hole.find(HOLE_END).unwrap_or(hole.len());
                let index = hole[..end].parse().unwrap_or(usize::MAX);
                rest = hole.get(end + HOLE_END.len_utf8()..).unwrap_or("");
                Some(Part::Hole(index))
            }
            None => {
                let end = rest.find(HOLE_START).unwrap_or(rest.len());
                let literal = &rest[..end];
                rest = &rest[end..];
                Some(Part::Text(literal))
            }
        }
    })
}

/// The holes of a scalar's text; `None` if a marker is malformed.
fn hole_indexes(text: &str) -> Option<Vec<usize>> {
    let mut indexes = Vec::new();
    for part in parts(text) {
        if let Part::Hole(index) = part {
            if index == usize::MAX {
                return None;
            }
            indexes.push(index);
        }
    }
    Some(indexes)
}

/// The node at `path` in `value`.
pub(crate) fn place<'v>(value: &'v mut Value, path: &[Step]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |node, step| match step {
        Step::Key(key) => node.as_object_mut()?.get_mut(key),
        Step::Index(index) => node.as_array_mut()?.get_mut(*index),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The template with these values read through its shape, and parsed.
    #[allow(clippy::type_complexity)]
    fn both(
        template: &str,
        values: &[&str],
    ) -> (
        Option<Vec<(Value, u64)>>,
        Result<Vec<(Value, u64)>, kyaml::ReadError>,
    ) {
        let shape = Shape::of_template(template).expect("a shape");
        let mut text = shape.literals[0].clone();
        for (value, literal) in values.iter().zip(&shape.literals[1..]) {
            text.push_str(value);
            text.push_str(literal);
        }
        let pairs = |docs: Vec<Document>| docs.into_iter().map(|d| (d.value, d.line)).collect();
        (
            shape.read(&text).map(pairs),
            kyaml::read_documents(&text).map(pairs),
        )
    }

    #[test]
    fn a_value_is_read_as_the_yaml_reader_reads_it() {
        let template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{{ cluster.name }}\n  annotations:\n    a: {{ x }}\ndata:\n  plain: {{ x }}\n  quoted: \"{{ x }}\"\n  single: '{{ x }}'\n  list: [{{ x }}, b]\n";
        for value in [
            "3",
            "0755",
            "yes",
            "true",
            "1e3",
            "null",
            "x-1",
            "2001-12-14",
            "0x1F",
        ] {
            let (fast, slow) = both(template, &["edge", value, value, value, value, value]);
            assert_eq!(fast.map(Ok), Some(slow), "{value}");
        }
        // What would change the YAML's structure is left to the parser.
        for value in ["a: b", "#x", "", "-", " 1", "[a]", "x\ny"] {
            let (fast, _) = both(template, &["edge", value, "1", "1", "1", "1"]);
            assert_eq!(fast, None, "{value:?}");
        }
    }

    #[test]
    fn templates_without_a_usable_shape_have_none() {
        for template in [
            "a: {% if x %}1{% endif %}\n",
            "a: {{ x }}{{ y }}\n",
            "{{ x }}: 1\n",
            "a: |\n  {{ x }}\n",
            "a: &anchor {{ x }}\nb: *anchor\n",
            "# {{ x }}\na: 1\n",
            "a: {{- x }}\n",
            "{{ x }}\n",
            // Found in review: a value hidden in a comment, its marker spelt by an
            // escape in a quoted scalar; and a value that completes `---` at the
            // start of a line inside a flow collection.
            "# {{ x }}\na: \"\\uE0000\\uE001\"\n",
            "a: \"x\" # {{ x }}\nb: \"\\U0000E0000\\U0000E001\"\n",
            "[\n-{{ x }} ]\n",
            "a: [\n.{{ x }}\n]\n",
            // And a value shorter than its marker, which moves a flow key on its
            // line to the left, past the indentation of the block around it.
            "   a: {b:\n {{ v }},k\n     : 1}\n",
        ] {
            assert!(Shape::of_template(template).is_none(), "{template:?}");
        }
    }
}
