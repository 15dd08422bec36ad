//! Go's `text/template` (as Go 1.24 implements it), as Helm v4 uses it: the same
//! parse, the same execution rules (with Helm's `missingkey=zero`) and the same
//! printing of values, plus Helm's `include` and `tpl`.
//!
//! # Public API
//!
//! - [`TemplateSet::new`]`() -> TemplateSet`: an empty set (Helm's root template is
//!   named [`ROOT_NAME`], `gotpl`, which `tpl` templates and `include` errors show).
//! - [`TemplateSet::parse`]`(&mut self, name: &str, text: &str, funcs: &Funcs) ->
//!   Result<(), ParseError>`: parses one file into the set; its `define`s are global,
//!   a later one replaces an earlier one (an empty one never does), as in Go.
//!   Function names are checked against `funcs` (plus Go's builtins, `include`, `tpl`).
//! - [`TemplateSet::execute`]`(&self, name: &str, data: &Value, funcs: &Funcs, host:
//!   &mut dyn Host, budget: &Budget) -> Result<String, ExecError>`: runs a template.
//!   The set is `Send + Sync` and is never changed by executing: `tpl`'s templates
//!   live in the execution's own overlay. The output still holds Go's `<no value>`;
//!   Helm's render step passes each file's output through [`helm_clean_output`].
//! - [`TemplateSet::contains`], [`TemplateSet::names`].
//! - [`Funcs`]: `new()`, `insert(name, Func)`, `get(name) -> Option<Func>`,
//!   `is_defined(name)`, and `FromIterator<(&'static str, Func)>`. A listed function
//!   named like a builtin replaces it (Sprig's `slice` does in Helm).
//! - [`Budget`] (`fuel`, `max_output`, `max_depth`, `max_nesting`; `Default`), and
//!   [`ExecError`] (`kind: ExecErrorKind`, `message`, Go's text as `Display`,
//!   [`ExecError::helm_message`] for Helm's multi-line rewording), [`ParseError`]
//!   (Go's text as `Display`, [`ParseError::helm_message`] for Helm's).
//! - [`fmt`]: `sprint`, `sprintln`, `sprintf`, `display` (Go's `fmt` on values) and
//!   `quote_go` (`strconv.Quote`), for functions that print as Go does.
//!
//! # What functions receive
//!
//! Arguments come evaluated, the piped value last. [`Value::Missing`] is Go's
//! invalid value (`$x` holding no value, a field of no value, a nil `include`
//! argument); [`Value::Nil`] is a nil `interface{}` (a missing map key, a YAML
//! null). Both are Go's `nil` to a function taking `interface{}`; a function with a
//! typed Go parameter returns [`FuncError::wrong_type`] and the engine words the
//! error as Go does.
//!
//! # `include` and `tpl`
//!
//! `include NAME DATA` runs a template of the set (or of an enclosing `tpl`) into a
//! string: its `<no value>`s stay (Helm removes them only from the final file, so
//! `{{ include "x" . | quote }}` of a missing value gives `"<no value>"` inside and
//! `""` in the file). `tpl TEXT DATA` parses TEXT as a template named `gotpl`
//! that can use the set's defines and its own, runs it, and removes `<no value>`
//! from its output, as Helm does.

pub mod fmt;
pub mod sites;
pub mod value;

mod exec;
mod lex;
mod parse;
#[cfg(test)]
mod tests;

pub use exec::{Funcs, TemplateSet, helm_clean_output};
pub use value::{CYCLE_TEXT, Func, FuncError, FuncResult, Host, MapRef, Object, Value, Visit};

/// The name of Helm's root template, under which `tpl` parses its text.
pub const ROOT_NAME: &str = "gotpl";

/// Limits of one execution, so that hostile templates end with an error.
#[derive(Clone, Debug)]
pub struct Budget {
    /// Steps allowed: one per node walked, command evaluated and range iteration,
    /// and one per 16 bytes written or returned by a function.
    pub fuel: u64,
    /// Bytes one output (the template's, or one `include`'s) may reach.
    pub max_output: usize,
    /// Nested `template`/`include`/`tpl` calls allowed (Helm allows 1000 recursive
    /// includes of one name; this lower default keeps a 2 MiB thread stack safe).
    pub max_depth: usize,
    /// Nested templates, control structures and parenthesised pipelines allowed in
    /// all, which bounds the executor's stack.
    pub max_nesting: usize,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget {
            fuel: 50_000_000,
            max_output: 32 << 20,
            max_depth: 100,
            max_nesting: 1000,
        }
    }
}

/// A template that does not parse: Go's message is `template: NAME:LINE: MESSAGE`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("template: {template}:{line}: {message}")]
pub struct ParseError {
    pub template: String,
    pub line: usize,
    pub message: String,
}

impl ParseError {
    /// Helm's rewording: `parse error at (NAME:LINE): MESSAGE`, with only the text
    /// after the last `: ` of Go's message.
    pub fn helm_message(&self) -> String {
        let full = self.to_string();
        let last = full.rsplit(": ").next().unwrap_or(&full);
        format!("parse error at ({}:{}): {last}", self.template, self.line)
    }
}

/// What stopped an execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecErrorKind {
    /// An error of the template itself, as Go reports it.
    Template,
    /// The fuel of the [`Budget`] ran out.
    Fuel,
    /// An output grew past the [`Budget`]'s `max_output`.
    OutputSize,
    /// Templates or structures nested past the [`Budget`]'s limits.
    Depth,
}

/// One link of the chain Helm prints for an execution error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TraceEntry {
    pub location: String,
    pub executed: String,
    pub message: String,
}

/// An execution error, worded as Go's `text/template` words it:
/// `template: t/templates/a.yaml:3:31: executing "t/templates/a.yaml" at <eq .Values.int 3>: error calling eq: ...`.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct ExecError {
    pub kind: ExecErrorKind,
    pub message: String,
    /// The chain Helm can reformat; `None` where Helm keeps Go's text.
    pub(crate) trace: Option<Vec<TraceEntry>>,
}

impl ExecError {
    fn new(kind: ExecErrorKind, message: String, entry: Option<TraceEntry>) -> ExecError {
        ExecError {
            kind,
            message,
            trace: entry.map(|e| vec![e]),
        }
    }

    /// An error outside any template position (`template: no template ...`).
    fn plain(message: String) -> ExecError {
        let entry = TraceEntry {
            location: String::new(),
            executed: String::new(),
            message: message.clone(),
        };
        ExecError {
            kind: ExecErrorKind::Template,
            message,
            trace: Some(vec![entry]),
        }
    }

    /// Helm's rewording of an execution error of a chart file: `fail` and
    /// `required` messages as `execution error at (FILE:LINE:COL): MESSAGE`,
    /// template errors as the indented multi-line trace Helm v4 prints, and Go's
    /// text where Helm keeps it (errors of functions).
    pub fn helm_message(&self) -> String {
        const START: &str = "HELM_ERR_START";
        const END: &str = "HELM_ERR_END";
        let mut tokens = self.message.splitn(3, ": ");
        let (Some(_), Some(location), Some(rest)) = (tokens.next(), tokens.next(), tokens.next())
        else {
            return self.message.clone();
        };
        if let (Some(s), Some(e)) = (rest.find(START), rest.rfind(END))
            && s + START.len() <= e
        {
            return format!(
                "execution error at ({location}): {}",
                &rest[s + START.len()..e]
            );
        }
        let Some(trace) = &self.trace else {
            return self.message.clone();
        };
        if trace.first().is_some_and(|t| t.location.is_empty()) {
            return self.message.clone();
        }
        let mut out = String::new();
        for entry in trace {
            if !entry.location.is_empty() {
                out.push_str(&entry.location);
                out.push_str("\n  ");
            }
            if !entry.executed.is_empty() {
                out.push_str(&entry.executed);
                out.push_str("\n    ");
            }
            if !entry.message.is_empty() {
                out.push_str(&entry.message);
                out.push('\n');
            }
        }
        out.trim().to_string()
    }
}
