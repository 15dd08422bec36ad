//! minijinja templates (`*.j2` manifests) in strict mode: an undefined variable is an
//! error, never an empty string.
//!
//! Each render of a template for one cluster runs within two budgets of
//! [`Limits`]: fuel and the size of its output. minijinja charges one fuel for each
//! instruction and one for each 64 bytes of data a template builds, writes or hands
//! to a filter, and refuses an allocation of a known size (`'x' * n`, `a ~ a`)
//! before making it when the fuel left would not pay for it: an endless loop ends
//! with an error, and one template's values stay within fuel × 64 bytes (64 MB
//! with the default fuel). A few filters are wrapped where minijinja would allocate
//! or panic before it charges anything (`indent`, `slice`, `batch`, `format`) or
//! where a chain of them multiplies a string's length (`join`, `replace`): those
//! are held to the output's size or to fixed bounds.

use std::fmt::Write as _;
use std::io;

use minijinja::value::Value;
use minijinja::value::{Kwargs, StringInput};
use std::collections::HashMap;

use minijinja::{AutoEscape, Environment, Error, ErrorKind, Template, UndefinedBehavior};
use serde::Serialize;

use flotilla_core::diagnostic::Diagnostic;
use flotilla_core::limits::Limits;
use flotilla_core::snapshot::FleetSnapshot;

use crate::tenancy::Fence;

mod lists;

/// How deep macros and includes may call each other. minijinja's own limit (500)
/// can need more stack than a render thread has; real templates nest a few levels.
const RECURSION_LIMIT: usize = 64;

/// Every template of the fleet, compiled once per render and shared by all threads.
pub struct Templates {
    /// Every template: the engine of the platform's templates, which may load any.
    env: Environment<'static>,
    /// Per tenant with templates, an engine of only the templates its fence allows,
    /// in which loading any other is the tenant's error ([`Templates::confine`]).
    fenced: Vec<Environment<'static>>,
    /// The templates of tenants' workloads, each with its engine in `fenced`.
    fenced_of: HashMap<String, usize>,
    /// The templates whose `+` were made calls ([`lists::rewrite`]), to quote an
    /// error's expression as its author wrote it.
    rewritten: HashMap<String, (String, lists::Rewritten)>,
    fuel: u64,
    max_output_bytes: usize,
}

/// What a template sees.
#[derive(Serialize)]
pub struct Context<'a> {
    pub cluster: ClusterContext<'a>,
    pub workload: WorkloadContext<'a>,
    pub vars: &'a flotilla_core::model::Vars,
}

impl Context<'_> {
    /// The context as the template engine's value.
    pub fn to_value(&self) -> Value {
        value_of(self)
    }

    /// The context made of its three parts, each converted on its own
    /// ([`value_of`]) and shared by every render that sees the same: the value
    /// [`Context::to_value`] gives for them. A cluster's part is the same for all its
    /// workloads, a workload's for all clusters, and the merged variables often for
    /// all of a cluster's workloads.
    pub fn from_parts(cluster: &Value, workload: &Value, vars: &Value) -> Value {
        // The same struct, of values already converted (which the engine's own
        // serializer takes as they are).
        #[derive(Serialize)]
        struct Parts<'v> {
            cluster: &'v Value,
            workload: &'v Value,
            vars: &'v Value,
        }
        value_of(&Parts {
            cluster,
            workload,
            vars,
        })
    }
}

/// A part of the context as the template engine's value.
pub fn value_of(part: &impl Serialize) -> Value {
    Value::from(minijinja::value::Serde(part))
}

#[derive(Serialize)]
pub struct ClusterContext<'a> {
    pub name: &'a str,
    pub labels: &'a std::collections::BTreeMap<String, String>,
    pub vars: &'a flotilla_core::model::Vars,
}

#[derive(Serialize)]
pub struct WorkloadContext<'a> {
    pub name: &'a str,
    pub namespace: Option<&'a str>,
}

impl Templates {
    /// Compiles the given template files with the default [`Limits`]; syntax errors
    /// become diagnostics.
    pub fn compile<'a>(
        snapshot: &FleetSnapshot,
        paths: impl IntoIterator<Item = &'a String>,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Templates {
        Templates::compile_with(snapshot, paths, &Limits::default(), diagnostics)
    }

    /// Compiles the given template files, to be rendered within `limits`.
    pub fn compile_with<'a>(
        snapshot: &FleetSnapshot,
        paths: impl IntoIterator<Item = &'a String>,
        limits: &Limits,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Templates {
        let mut env = engine(limits);
        let mut rewritten = HashMap::new();
        for path in paths {
            let Some(source) = snapshot.files.get(path) else {
                continue;
            };
            let compiled = match lists::rewrite(path, source, syntax()) {
                Ok(None) => source.to_string(),
                Ok(Some(done)) => {
                    let text = done.source.clone();
                    rewritten.insert(path.clone(), (source.to_string(), done));
                    text
                }
                Err(refusal) => {
                    diagnostics.push(refusal.diagnostic(path));
                    continue;
                }
            };
            match env.add_template_owned(path.clone(), compiled) {
                Err(err) => diagnostics.push(describe(
                    &err,
                    path,
                    Some(source),
                    rewritten.get(path).map(|(_, map)| map),
                )),
                Ok(())
                    if !rewritten.contains_key(path)
                        && let Some(refusal) = lists::unrewritten_plus(source, syntax()) =>
                {
                    env.remove_template(path);
                    diagnostics.push(refusal.diagnostic(path));
                }
                Ok(()) => {}
            }
        }
        Templates {
            env,
            fenced: Vec::new(),
            fenced_of: HashMap::new(),
            rewritten,
            fuel: limits.template_fuel,
            max_output_bytes: limits.max_template_output_bytes,
        }
    }

    /// Confines the templates at `owned` (those of one tenant's workloads, manifests
    /// and Helm values) to what `fence` allows: they are rendered by an engine that
    /// holds only the fleet's templates inside the fence, and a template it renders
    /// that loads any other (`{% include %}`, `{% import %}`, `{% from %}`,
    /// `{% extends %}`, by any name, existing or not) fails with the fence's refusal
    /// at the line that loads it. The platform's templates keep the engine of every
    /// template. Syntax errors were reported by [`Templates::compile_with`].
    pub(crate) fn confine<'a>(
        &mut self,
        owned: impl IntoIterator<Item = &'a String>,
        fence: Fence,
        limits: &Limits,
    ) {
        let mut env = engine(limits);
        let inside: Vec<(String, String)> = self
            .env
            .templates()
            .filter(|(name, _)| fence.allows(name))
            .map(|(name, template)| (name.to_string(), template.source().to_string()))
            .collect();
        for (name, source) in inside {
            // It compiled in the engine of every template, so it compiles here.
            let _ = env.add_template_owned(name, source);
        }
        env.set_loader(move |name| {
            if fence.allows(name) {
                return Ok(None::<String>);
            }
            let refusal = fence.refusal(name);
            Err(Error::new(ErrorKind::InvalidOperation, refusal.clone())
                .with_source(Refused(refusal)))
        });
        let index = self.fenced.len();
        self.fenced.push(env);
        for path in owned {
            self.fenced_of.insert(path.clone(), index);
        }
    }

    /// Renders one template; `None` if it failed to compile (already reported).
    /// `context` is a `minijinja::Value` made from a [`Context`] (converted once for
    /// every template of a workload, see [`Context::to_value`]).
    pub fn render(&self, path: &str, context: &Value) -> Option<Result<String, Diagnostic>> {
        let template = self.template(path)?;
        Some(self.render_template(&template, path, context))
    }

    /// The compiled template at `path`; `None` if it failed to compile. Looking one
    /// up takes a lock in the engine: a render of many clusters looks each up once.
    pub fn template(&self, path: &str) -> Option<Template<'_, '_>> {
        let env = match self.fenced_of.get(path) {
            Some(&index) => &self.fenced[index],
            None => &self.env,
        };
        env.get_template(path).ok()
    }

    /// Renders `template` (the one at `path`, from [`Templates::template`]).
    pub fn render_template(
        &self,
        template: &Template<'_, '_>,
        path: &str,
        context: &Value,
    ) -> Result<String, Diagnostic> {
        let _marked = crate::progress::rendering(path, context);
        let source = template.source();
        // Room for about the template's own text, which most outputs are.
        let room = (source.len() + source.len() / 4 + 64).min(self.max_output_bytes);
        let mut output = CappedWriter {
            bytes: Vec::with_capacity(room),
            cap: self.max_output_bytes,
        };
        // minijinja 2.24 panicked on a few inputs (found by fuzzing: a backwards slice
        // of an empty string, `''[2::-1]`; 3.1 fixed it); should the engine panic
        // again, the panic is this template's error, not the end of the render.
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render_captured_to(context.clone(), &mut output)
        })) {
            Ok(result) => result,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                return Err(Diagnostic::error(format!(
                    "template error: the template engine failed on this template ({why})"
                ))
                .in_file(path));
            }
        };
        match result {
            Ok(_) => String::from_utf8(output.bytes).map_err(|_| {
                Diagnostic::error("template error: the output is not UTF-8 text").in_file(path)
            }),
            Err(err) if output.bytes.len() >= self.max_output_bytes && is_write_failure(&err) => {
                Err(Diagnostic::error(format!(
                    "the template writes more than {} bytes for this cluster, the limit for one \
                     template's output (--max-template-output)",
                    self.max_output_bytes
                ))
                .in_file(path))
            }
            Err(err) if err.kind() == ErrorKind::OutOfFuel => Err(Diagnostic::error(format!(
                "the template needs more than {} fuel for this cluster (one for each \
                 instruction and each 64 bytes it builds or writes), the limit for one template \
                 (--template-fuel): a loop too long or without end, or a string too large?",
                self.fuel
            ))
            .in_file(path)
            .at_line(err.line().map(|line| line as u64))),
            Err(err) => match refused(&err) {
                // At the template and line that load the file, which may be one
                // the rendered template includes.
                Some((at, refusal)) => Err(Diagnostic::error(refusal.0.clone())
                    .in_file(at.name().unwrap_or(path))
                    .at_line(at.line().map(|line| line as u64))),
                None => Err(match self.rewritten.get(path) {
                    Some((original, map)) => describe(&err, path, Some(original), Some(map)),
                    None => describe(&err, path, Some(source), None),
                }),
            },
        }
    }
}

/// A tenant's template loaded a template outside the tenant's fence: the refusal.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(String);

/// The refusal in `err`, if the fence of a tenant's engine refused a template, with
/// the error that says where: an included template's error is the source of the
/// including one's.
fn refused(err: &Error) -> Option<(&Error, &Refused)> {
    let mut at = err;
    loop {
        let source = std::error::Error::source(at)?;
        if let Some(refused) = source.downcast_ref::<Refused>() {
            return Some((at, refused));
        }
        at = source.downcast_ref::<Error>()?;
    }
}

/// An engine with flotilla's settings: strict undefined values, no escaping, the
/// limits' fuel, and the filters made safe within `limits`.
fn engine(limits: &Limits) -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_syntax(syntax());
    env.set_fuel(Some(limits.template_fuel));
    env.set_recursion_limit(RECURSION_LIMIT);
    // `debug()` prints the engine's state, the names of every template in the
    // fleet among it: a template's output would then depend on files that are
    // not its inputs (and a manifest has no use for it).
    env.remove_global("debug");
    let cap = limits.max_template_output_bytes;
    env.add_filter("join", move |value: &Value, joiner: Option<&str>| {
        capped_join(value, joiner, cap)
    });
    env.add_filter("format", checked_format);
    env.add_function(lists::ADD, lists::add);
    env.add_global(lists::MINUS, Value::from_object(lists::Minus));
    env.add_filter("chain", lists::chain);
    env.add_filter("sum", lists::sum);
    env.set_formatter(move |out, state, value| checked_write(out, state, value, cap));
    env.add_filter(
        "indent",
        move |value: StringInput<'_>,
              width: Option<usize>,
              first: Option<bool>,
              blank: Option<bool>,
              kwargs: Kwargs| { checked_indent(value, width, first, blank, kwargs, cap) },
    );
    env.add_filter(
        "replace",
        move |state: &mut minijinja::State<'_, '_>,
              value: StringInput<'_>,
              from: StringInput<'_>,
              to: StringInput<'_>| { checked_replace(state, value, from, to, cap) },
    );
    env.add_filter(
        "slice",
        |state: &minijinja::State<'_, '_>, value: Value, count: usize, fill: Option<Value>| {
            checked_count("slice", count)?;
            minijinja::filters::slice(state, value, count, fill)
        },
    );
    env.add_filter(
        "batch",
        |state: &minijinja::State<'_, '_>, value: Value, count: usize, fill: Option<Value>| {
            checked_count("batch", count)?;
            minijinja::filters::batch(state, value, count, fill)
        },
    );
    env
}

/// Writes a value as minijinja does, after refusing a list or map whose written form
/// could not fit in the output: each item takes at least two bytes (`1, `), so one
/// of more than half the cap's items is refused before anything is written. A list
/// can be made long lazily, for little fuel (`l + l`, doubled), and minijinja writes
/// it without charging fuel.
fn checked_write(
    out: &mut minijinja::Output<'_>,
    state: &mut minijinja::State<'_, '_>,
    value: &Value,
    cap: usize,
) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    let what = match value.kind() {
        ValueKind::Seq | ValueKind::Iterable => "list",
        ValueKind::Map => "map",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    if let Some(items) = value.len()
        && items > cap / 2
    {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "a {what} of {items} items is more than {cap} bytes when written, the limit \
                 for one template's output (--max-template-output)"
            ),
        ));
    }
    minijinja::escape_formatter(out, state, value)
}

/// The default delimiters, keeping a template's last newline (a manifest file ends
/// with one, and its rendered text keeps it).
fn syntax() -> minijinja::syntax::SyntaxConfig {
    minijinja::syntax::SyntaxConfig::builder()
        .keep_trailing_newline(true)
        .build()
        .expect("the default delimiters are valid")
}

/// The widest field and the most digits `format` may write for one placeholder.
const MAX_FORMAT_WIDTH: usize = 10_000;

/// minijinja's `format` filter, after refusing what makes it panic or abort (each
/// found by fuzzing, minijinja 2.24): its printf-style parser steps through a
/// `%(key)` mapping key one byte at a time and panics on a character of more than
/// one byte there; a width such as `%555555555555d` pads by allocating that many
/// bytes at once; a precision past 65,535 (`%.99999f`) panics in Rust's own
/// formatting. Such placeholders are refused with an error (real keys are
/// identifiers, real widths are small).
fn checked_format(
    state: &mut minijinja::State<'_, '_>,
    value: &Value,
    args: minijinja::value::Rest<minijinja::value::ValueOrKwargs>,
) -> Result<Value, Error> {
    if let Some(text) = value.as_str() {
        check_printf_placeholders(text)?;
    }
    minijinja::filters::format(state, value, args)
}

/// Checks every `%` placeholder of a printf-style format string (see
/// [`checked_format`]); what it does not refuse, minijinja parses as before.
fn check_printf_placeholders(text: &str) -> Result<(), Error> {
    let refuse = |message: String| Err(Error::new(ErrorKind::InvalidOperation, message));
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(found) = text[at..].find('%') {
        at += found + 1;
        if bytes.get(at) == Some(&b'%') {
            at += 1;
            continue;
        }
        if bytes.get(at) == Some(&b'(') {
            let key_end = text[at..].find(')').map_or(text.len(), |end| at + end);
            if !text[at + 1..key_end].is_ascii() {
                return refuse(
                    "format: a %(key) placeholder may hold only ASCII characters".to_string(),
                );
            }
            at = (key_end + 1).min(text.len());
        }
        while matches!(bytes.get(at), Some(b'#' | b'0' | b'-' | b' ' | b'+')) {
            at += 1;
        }
        for what in ["width", "precision"] {
            if what == "precision" {
                if bytes.get(at) != Some(&b'.') {
                    break;
                }
                at += 1;
            }
            let digits = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            let number = &text[at..at + digits];
            at += digits;
            if digits > 0
                && number
                    .parse::<usize>()
                    .map_or(true, |n| n > MAX_FORMAT_WIDTH)
            {
                return refuse(format!(
                    "format: a placeholder's {what} may be at most {MAX_FORMAT_WIDTH}, not {number}"
                ));
            }
        }
    }
    Ok(())
}

/// minijinja's `indent`, refusing a width that would make a string longer than `cap`
/// bytes: minijinja makes the indentation first (`" ".repeat(width)`), so
/// `indent(555555555555)` asked for 555 GB at once and aborted the process (found by
/// fuzzing).
fn checked_indent(
    value: StringInput<'_>,
    width: Option<usize>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
    cap: usize,
) -> Result<Value, Error> {
    let asked = match width {
        Some(width) => width,
        None => kwargs.peek::<Option<usize>>("width")?.unwrap_or(4),
    };
    let lines = value.as_str().matches('\n').count() + 1;
    let size = asked
        .checked_mul(lines)
        .and_then(|n| n.checked_add(value.as_str().len()));
    within_output_cap(&format!("indent({asked})"), size, cap)?;
    minijinja::filters::indent(value, width, first, blank, kwargs)
}

/// minijinja's `replace`, refusing a result longer than `cap` bytes: replacing the
/// empty string inserts `to` between every two characters, so a chain of them
/// multiplies a string's length.
fn checked_replace(
    state: &mut minijinja::State<'_, '_>,
    value: StringInput<'_>,
    from: StringInput<'_>,
    to: StringInput<'_>,
    cap: usize,
) -> Result<Value, Error> {
    let (text, from_text) = (value.as_str(), from.as_str());
    let matches = if from_text.is_empty() {
        text.chars().count() + 1
    } else {
        text.matches(from_text).count()
    };
    let size = matches
        .checked_mul(to.as_str().len())
        .and_then(|added| added.checked_add(text.len()));
    within_output_cap("replace", size, cap)?;
    minijinja::filters::replace(state, value, from, to)
}

/// Refuses a string a filter would build (`size` bytes; `None` past `usize`) when it
/// is longer than one template may write: a filter can multiply a string's length in
/// one instruction, which fuel does not see.
fn within_output_cap(what: &str, size: Option<usize>, cap: usize) -> Result<(), Error> {
    if size.is_none_or(|size| size > cap) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "{what} would build a string of more than {cap} bytes, the limit for one \
                 template's output (--max-template-output)"
            ),
        ));
    }
    Ok(())
}

/// The most parts `slice` and `batch` may make: as many items as `range()` may
/// give (minijinja's own limit).
const MAX_PARTS: usize = 100_000;

/// Refuses a `slice` or `batch` count past [`MAX_PARTS`]: minijinja reserves room for
/// `count` items (or slices) before it looks at the value, so a count of billions
/// asked for terabytes at once and aborted the process (found by fuzzing).
fn checked_count(filter: &str, count: usize) -> Result<(), Error> {
    if count > MAX_PARTS {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{filter}({count}): at most {MAX_PARTS} parts"),
        ));
    }
    Ok(())
}

/// minijinja's `join` (items as text, `joiner` between them; a string joins its
/// characters), refusing to build a string longer than `cap` bytes.
fn capped_join(value: &Value, joiner: Option<&str>, cap: usize) -> Result<Value, Error> {
    let joiner = joiner.unwrap_or_default();
    let items = value.try_iter().map_err(|err| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("cannot join value of type {}", value.kind()),
        )
        .with_source(err)
    })?;
    let mut output = String::new();
    for (index, item) in items.enumerate() {
        if index > 0 {
            output.push_str(joiner);
        }
        match item.as_str() {
            Some(text) => output.push_str(text),
            None => {
                let _ = write!(output, "{item}");
            }
        }
        within_output_cap("join", Some(output.len()), cap)?;
    }
    Ok(Value::from(output))
}

fn is_write_failure(err: &minijinja::Error) -> bool {
    err.kind() == ErrorKind::WriteFailure
}

/// Collects a template's output and refuses to grow past `cap` bytes, which stops
/// the render at once.
struct CappedWriter {
    bytes: Vec<u8>,
    cap: usize,
}

impl io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.cap {
            // Keep what fits, so the caller sees the output reached the cap.
            let room = self.cap - self.bytes.len();
            self.bytes.extend_from_slice(&buf[..room]);
            return Err(io::Error::other("the template's output is over its limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `source` is the template as its author wrote it; `rewritten`, the map from the text
/// compiled back to it when that was rewritten ([`lists::rewrite`]).
fn describe(
    err: &minijinja::Error,
    path: &str,
    source: Option<&str>,
    rewritten: Option<&lists::Rewritten>,
) -> Diagnostic {
    let mut range = err
        .range()
        .map(|range| rewritten.map_or(range.clone(), |map| map.original_range(range)));
    // An addition flotilla made a call ([`lists::rewrite`]) is quoted, and names its
    // undefined operand, as minijinja quotes and names its own `+`.
    let mut undefined = None;
    if let (Some(map), Some(source), Some(at), Some(cause)) = (
        rewritten,
        source,
        range.clone(),
        std::error::Error::source(err),
    ) && let Some(failed) = cause.downcast_ref::<lists::AddFailed>()
        && let Some((upto, operand)) = map.failed_addition(source, at, failed)
    {
        range = Some(upto);
        undefined = operand;
    }
    let mut message = match (err.detail(), undefined) {
        (Some(detail), Some(operand)) => {
            format!(
                "template error: {}: {detail} (`{operand}` is undefined)",
                err.kind()
            )
        }
        (Some(detail), None) => format!("template error: {}: {detail}", err.kind()),
        (None, _) => format!("template error: {}", err.kind()),
    };
    // The offending expression, when minijinja knows it, is the most useful hint
    // (`unknown filter … in `vars.x | nope``), unless the detail names it already
    // ("`vars.replicas` is undefined").
    if let (Some(range), Some(source)) = (range, source)
        && let Some(snippet) = source.get(range)
        && !snippet.contains('\n')
        && snippet.len() < 120
        && !err
            .detail()
            .is_some_and(|detail| detail.contains(&format!("`{}`", snippet.trim())))
    {
        message.push_str(&format!(" in `{}`", snippet.trim()));
    }
    Diagnostic::error(message)
        .in_file(path)
        .at_line(err.line().map(|line| line as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Renders one template on its own with `limits`; the text of the result or error
    /// (of compiling it, or of rendering it).
    fn check(source: &str, limits: &Limits) -> Result<String, String> {
        let path = "workloads/w/manifests/t.yaml.j2".to_string();
        let snapshot = FleetSnapshot::from_files([(path.as_str(), source)]);
        let mut diagnostics = Vec::new();
        let templates = Templates::compile_with(&snapshot, [&path], limits, &mut diagnostics);
        if let Some(first) = diagnostics.first() {
            return Err(first.to_string());
        }
        let vars = flotilla_core::model::Vars::new();
        let labels = Default::default();
        let context = Context {
            cluster: ClusterContext {
                name: "c",
                labels: &labels,
                vars: &vars,
            },
            workload: WorkloadContext {
                name: "w",
                namespace: None,
            },
            vars: &vars,
        };
        templates
            .render(&path, &context.to_value())
            .expect("compiled")
            .map_err(|d| d.to_string())
    }

    #[test]
    fn a_context_made_of_parts_is_the_one_converted_whole() {
        let path = "workloads/w/manifests/t.yaml.j2".to_string();
        let source = "{{ cluster }}|{{ workload }}|{{ vars }}|{% for k in cluster %}{{ k }},{% endfor %}|\
            {% for k, v in cluster.labels|items %}{{ k }}={{ v }},{% endfor %}|\
            {{ cluster.vars.site }}|{{ vars.nested.a }}|{{ cluster|length }}|{{ vars|dictsort }}|\
            {{ workload.namespace }}|{{ cluster.vars|list }}|{{ vars is mapping }}|{{ 'site' in cluster.vars }}";
        let snapshot = FleetSnapshot::from_files([(path.as_str(), source)]);
        let mut diagnostics = Vec::new();
        let templates = Templates::compile(&snapshot, [&path], &mut diagnostics);
        assert!(diagnostics.is_empty(), "{diagnostics:?}");
        let vars: flotilla_core::model::Vars = serde_json::from_str(
            r#"{"site": "s-1", "n": 3, "nested": {"a": [1, "x"], "b": null}}"#,
        )
        .expect("vars");
        let merged: flotilla_core::model::Vars =
            serde_json::from_str(r#"{"z": 1, "nested": {"a": 2}, "a": true}"#).expect("vars");
        let labels = [("tier", "canary"), ("region", "eu")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for namespace in [None, Some("ns")] {
            let cluster = ClusterContext {
                name: "c",
                labels: &labels,
                vars: &vars,
            };
            let workload = WorkloadContext {
                name: "w",
                namespace,
            };
            let parts = Context::from_parts(
                &value_of(&cluster),
                &value_of(&workload),
                &value_of(&merged),
            );
            let whole = Context {
                cluster,
                workload,
                vars: &merged,
            }
            .to_value();
            let render = |context: &Value| templates.render(&path, context).expect("compiled");
            assert_eq!(render(&parts), render(&whole));
            assert!(render(&whole).is_ok());
        }
    }

    /// Each source is refused with an error containing its text.
    fn assert_refused(cases: &[(&str, &str)], limits: &Limits) {
        for (source, says) in cases {
            let err = check(source, limits).expect_err(source);
            assert!(err.contains(says), "{source}: {err}");
        }
    }

    /// Each source renders as minijinja's own filters render it.
    fn assert_as_minijinja(sources: &[&str], limits: &Limits) {
        let mut plain = Environment::new();
        plain.set_undefined_behavior(UndefinedBehavior::Strict);
        plain.set_auto_escape_callback(|_| AutoEscape::None);
        plain.set_syntax(syntax());
        for source in sources {
            let expect = plain.render_str(source, ()).expect(source);
            assert_eq!(check(source, limits), Ok(expect), "{source}");
        }
    }

    /// Renders `sources` with minijinja alone and with flotilla's engine (whose `+`
    /// is a call, see `lists`): the same text, or the same error.
    fn assert_same_as_minijinja(sources: &[&str]) {
        let path = "workloads/w/manifests/t.yaml.j2";
        let mut plain = Environment::new();
        plain.set_undefined_behavior(UndefinedBehavior::Strict);
        plain.set_auto_escape_callback(|_| AutoEscape::None);
        plain.set_syntax(syntax());
        for source in sources {
            let expect = plain
                .template_from_named_str(path, source)
                .and_then(|template| template.render(()))
                .map_err(|err| describe(&err, path, Some(source), None).to_string());
            assert_eq!(check(source, &Limits::default()), expect, "{source}");
        }
    }

    #[test]
    fn every_addition_renders_as_minijinja_renders_it() {
        assert_same_as_minijinja(&[
            "{{ 1 + 2 }}",
            "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 2 + 1 }} {{ 7 // 2 + 7 % 2 }}",
            "{{ 1 + -2 }} {{ -1 + 2 }} {{ - (1 + 2) }} {{ 1 + (-(2)) }}",
            "{{ 1 - 2 + 3 }} {{ 1 + 2 - 3 + 4 }} {{ 1 + (2 - 3) + 4 }}",
            "{{ 1 - 2 + 3 - 4 + 5 }} {{ 1 - 1 - 1 + 1 }} {{ 5 - -2 + 1 }} {{ 1 + 2 - -3 }}",
            "{{ (1 - 2) + 3 }} {{ 1 - (2 + 3) }} {{ 1.5 - 0.5 + 1 }} {{ 1 + 2 - 0.5 }}",
            "{{ -9223372036854775808 - 1 + 0 }} {{ 1 + 2 - true }} {{ 1 + x - 1 if x is defined else 0 }}",
            "{{ (1 in [1]) - 1 + 4 }} {{ 3 - 2 in (2 * 3 in [5]) - 1 + 4 }} {{ ((1 - 2)) - 3 + 4 }}",
            "{{ 'a' + 'b' ~ 'c' }} {{ '+' + '+' }} {{ 'a' ~ 1 + 2 }}",
            "{{ 1.5 + 2 }} {{ 0.1 + 0.2 }} {{ 9223372036854775807 + 1 }} {{ true + 1 }}",
            "{{ 2 + 1.5 }} {{ 9223372036854775807 + 9223372036854775807 }} {{ 1e308 + 1e308 }}",
            "{{ -9223372036854775808 + -1 }} {{ 18446744073709551615 + 1 }} {{ 3 + -3 }}",
            "{{ ('<'|safe + '>'|safe)|escape }} {{ ('<'|safe + '>')|escape }} {{ 'é' + 'ü' }}",
            "{{ [1] + [2, 3] }} {{ ([1] + [2]) | length }} {{ [[1] + [2]] + [[3]] }}",
            "{{ [1, 2][0:1] + [3] }} {{ (1, 2) + (3,) }} {{ range(2) + [5] }}",
            "{% set x = 1 %}{{ x + x + x }}{% for i in range(3) %}{{ i + 1 }}{% endfor %}",
            "{{ {'a': 1 + 1}['a'] + 1 }} {{ {'k': [1] + [2]} }}",
            "{{ 1 + 2 if 1 + 1 == 2 else 3 + 4 }} {{ 'x' if 1 + 1 > 1 }}",
            "{{ 1 + 1 is even }} {{ (1 + 1) is even }} {{ 1 + 2 in [3] }}",
            "{{ 1 + 2 | string }}",
            "{{ not(1)+1 }} {% if(1)+1 %}y{% endif %}{% for x in(range(2))+[5] %}{{ x }}{% endfor %}",
            "{{ ['a'] | sum(start='b') }} {{ [(1,), (2,)] | sum(start=()) }} {{ [1, 2] | sum(start=true) }}",
            "{{ (1 + 2) | string + 'x' }} {{ [3, 1] | sort | first + 1 }}",
            "{% macro m(a, b=1 + 1) %}{{ a + b }}{% endmacro %}{{ m(1 + 1) }}",
            "{% set ns = namespace(l=[]) %}{% for i in range(3) %}{% set ns.l = ns.l + [i] \
             %}{% endfor %}{{ ns.l }}",
            "{{ 1\n+\n2 }}\n{{ 3 +\n4 }}",
            "{% raw %}{{ 1 + 1 }}{% endraw %}{{ 1 + 1 }}{# 2 + 2 #}",
            "{{ range(3) | sum + 1 }} {{ [[1], [2]] | sum(start=[]) }}",
            "{{ [1] | chain([2], [3]) }} {{ {'a': 1} | chain({'b': 2}, {'a': 3}) }}",
            "{{ ({'a': 1} | chain({'a': 2})).a }} {{ [1] | chain('ab') | list }}",
            "{{ [{'a': [1]}, {'a': [2]}] | sum(attribute='a', start=[]) }}",
            "{% with a = 1 + 1 %}{{ a }}{% endwith %}{% filter upper %}{{ 'a' + 'b' }}{% endfilter %}",
            "{% set t %}{{ 1 + 1 }}{% endset %}{{ t }}{% if 1 + 1 %}y{% endif %}",
        ]);
        // A chain of additions is one call (of 500 additions at most, nested): as
        // long a chain as minijinja compiles renders the same.
        let chain = |n: usize| format!("{{{{ {} }}}}", vec!["1"; n].join(" + "));
        // `-` between them too: still one call, not one call in another per `-`.
        let mixed = |n: usize| format!("{{{{ 0{} }}}}", " - 1 + 2".repeat(n));
        assert_same_as_minijinja(&[&chain(1_000), &chain(2_500), &mixed(400)]);
        // Errors: the same message, at the same line, quoting the expression as written.
        assert_same_as_minijinja(&[
            "a\n{{ 'a' + 1 }}",
            "{{ [1] + 1 }}",
            "{{ [1] + (1,) }}",
            "{{ 1 + none }}",
            "{% set v = {} %}{{ v.missing + 1 }}",
            "{% set v = {} %}{{ 1 + v.missing }}",
            "{% set v = {} %}{{ 1 + 2 + v.missing + 3 }}",
            "{% set v = {} %}{{ v.missing + 2 + 3 }}",
            "{% set v = {} %}{{ 1 + 2 - v.missing + 1 }}",
            "{{ 1 + 2 - 'a' + 1 }}",
            "{{ 1 + 'a' + 2 }}",
            "a\n{{ 1 +\n 'a' }}",
            "{{ (1 + 2) + 'a' }}",
            "a\n{{ [1] + [2] | nosuch }}",
            "{{ [1, 'a'] | sum }}",
            "{{ 1 + nothing }}",
        ]);
    }

    #[test]
    fn a_joined_list_is_a_list_as_in_jinja2() {
        // minijinja's lazy join was an iterator: not indexable, "iterator" in errors.
        let limits = Limits::default();
        assert_eq!(check("{{ ([1] + [2])[1] }}", &limits).as_deref(), Ok("2"));
        assert_eq!(
            check("{{ [1] + [2] + 3 }}", &limits),
            Err(
                "workloads/w/manifests/t.yaml.j2:1: template error: invalid operation: tried \
                 to use + operator on unsupported types sequence and number in `[1] + [2] + 3`"
                    .to_string()
            )
        );
        assert_eq!(
            check("{{ [[1], 2] | sum(start=[]) }}", &limits),
            Err(
                "workloads/w/manifests/t.yaml.j2:1: template error: invalid operation: tried \
                 to use + operator on unsupported types sequence and number in `sum(start=[])`"
                    .to_string()
            )
        );
    }

    #[test]
    fn joining_lists_costs_fuel_before_the_list_is_made() {
        let limits = Limits::default();
        let out_of_fuel = |source: &str| {
            let err = check(source, &limits).expect_err("out of fuel");
            assert!(
                err.contains("the template needs more than 1000000 fuel"),
                "{source}: {err}"
            );
        };
        // A list doubled 34 times by `+`, by `chain` and by `sum`: refused at about
        // two million items (one fuel each), not made.
        let doubled =
            |step: &str| format!("{{% set l = [1] %}}{}{{{{ l | length }}}}", step.repeat(34));
        out_of_fuel(&doubled("{% set l = l + l %}"));
        out_of_fuel(&doubled("{% set l = l | chain(l) %}"));
        out_of_fuel(&doubled("{% set l = [l, l] | sum(start=[]) %}"));
        // `sum` from a list over one item that is not a list: the lists before it
        // are joined first (100 million items here), within the fuel.
        out_of_fuel(&format!(
            "{{% set b = [0] * 100000000 %}}{{{{ [{}0] | sum(start=[]) }}}}",
            "b, ".repeat(33)
        ));
        // `sum` of strings, and a chain of 500 strings of 100 kB: each sum on the way
        // (12.5 GB together) is charged, as minijinja charges each `+`.
        out_of_fuel("{% set s = 'x' * 1000000 %}{{ ([s] * 1000) | sum(start='') | length }}");
        out_of_fuel(&format!(
            "{{% set s = 'x' * 100000 %}}{{% set t = {} %}}ok",
            vec!["s"; 500].join(" + ")
        ));
        // A string doubled by `+` is refused before it is built, as with `~`.
        out_of_fuel(&format!(
            "{{% set s = 'x' * 1000 %}}{}{{{{ s | length }}}}",
            "{% set s = s + s %}".repeat(30)
        ));
        // Maps chained 10,000 deep are one map of three keys (minijinja's chain kept
        // every level and looked a key up through all of them).
        assert_eq!(
            check(
                &format!(
                    "{{% set d = {{'a': 1, 'b': 2}} %}}{}{{{{ d | length }}}} {{{{ d.nope is defined }}}}",
                    "{% set d = d | chain(d, {'c': 3}) %}".repeat(10_000)
                ),
                &limits
            )
            .as_deref(),
            Ok("3 False")
        );
        // An empty list doubled 60 times is empty, made at once.
        assert_eq!(
            check(
                &format!(
                    "{{% set l = [] %}}{}{{{{ l | length }}}}",
                    "{% set l = l + l %}".repeat(60)
                ),
                &limits
            )
            .as_deref(),
            Ok("0")
        );
        // A list of 1,000 items doubled 8 times (256,000 items) is within the fuel.
        let grown = format!(
            "{{% set l = range(1000) | list %}}{}{{{{ l | length }}}} {{{{ l[-1] }}}}",
            "{% set l = l + l %}".repeat(8)
        );
        assert_eq!(check(&grown, &limits).as_deref(), Ok("256000 999"));
    }

    #[test]
    fn a_template_may_not_name_flotillas_own_functions() {
        for source in [
            "a: 1\n{% set __flotilla_add = dict %}{{ [1] + [2] }}",
            "a: 1\n{{ 1 + __flotilla_minus }}",
        ] {
            assert_eq!(
                check(source, &Limits::default()),
                Err(
                    "workloads/w/manifests/t.yaml.j2:2: template error: names that begin with \
                     `__flotilla_` are flotilla's own; a template may not use them"
                        .to_string()
                ),
                "{source}"
            );
        }
    }

    #[test]
    fn an_endless_loop_runs_out_of_fuel() {
        let limits = Limits::default();
        let err = check(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            &limits,
        )
        .expect_err("out of fuel");
        assert_eq!(
            err,
            "workloads/w/manifests/t.yaml.j2:1: the template needs more than 1000000 fuel for \
             this cluster (one for each instruction and each 64 bytes it builds or writes), the \
             limit for one template (--template-fuel): a loop too long or without end, or a \
             string too large?"
        );
        assert!(check("{% for i in range(1000) %}{{ i }}{% endfor %}", &limits).is_ok());
    }

    #[test]
    fn output_past_the_cap_stops_the_render() {
        let limits = Limits {
            max_template_output_bytes: 1_000_000,
            ..Limits::default()
        };
        // 100 MB in pieces of 1,000 bytes: about 25,000 fuel when the cap stops it.
        let err = check(
            "a: 1\n{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
            &limits,
        )
        .expect_err("too much output");
        assert_eq!(
            err,
            "workloads/w/manifests/t.yaml.j2: the template writes more than 1000000 bytes for \
             this cluster, the limit for one template's output (--max-template-output)"
        );
        let text = check("{{ 'x' * 1000000 }}", &limits).expect("exactly at the cap");
        assert_eq!(text.len(), 1_000_000);
    }

    #[test]
    fn fuel_pays_for_the_data_a_template_builds_before_it_is_built() {
        let limits = Limits::default();
        // 1,000 bytes doubled `times` times, then its length.
        let doubled = |times: usize| {
            format!(
                "{{% set a = 'x' * 1000 %}}{}{{{{ a | length }}}}",
                "{% set a = a ~ a %}".repeat(times)
            )
        };
        // 100 MB in one expression, or a string doubled 30 times: refused before it
        // is allocated, once the fuel left would not pay for it.
        for source in ["{{ 'x' * 100000000 }}".to_string(), doubled(30)] {
            let err = check(&source, &limits).expect_err("out of fuel");
            assert!(
                err.contains("the template needs more than 1000000 fuel"),
                "{source}: {err}"
            );
        }
        // 12 doublings (4 MB) are well within the default fuel.
        assert_eq!(check(&doubled(12), &limits).as_deref(), Ok("4096000"));
    }

    #[test]
    fn a_list_too_long_to_write_is_refused_before_it_is_written() {
        let limits = Limits {
            max_template_output_bytes: 400_000,
            ..Limits::default()
        };
        // 300,000 items, within the fuel: more than the output could hold.
        let long = |tail: &str| {
            format!("{{% set l = range(100000) | list %}}{{% set l = l | chain(l, l) %}}{tail}")
        };
        let err = check(&long("{{ l }}"), &limits).expect_err("too long to write");
        assert!(
            err.contains(
                "a list of 300000 items is more than 400000 bytes when written, the limit \
                 for one template's output"
            ),
            "{err}"
        );
        assert_eq!(
            check(&long("{{ l | length }}"), &limits).as_deref(),
            Ok("300000")
        );
        // Lists and maps that fit are written as minijinja writes them.
        assert_as_minijinja(
            &["{{ [1, 'a', [2]] }}", "{{ {'a': 1} }}", "{{ range(3) }}"],
            &limits,
        );
    }

    #[test]
    fn format_refuses_a_mapping_key_minijinja_would_panic_on_and_formats_the_rest() {
        let limits = Limits::default();
        // What the fuzzer found, reduced: a non-ASCII character inside `%(`…`)`.
        for source in [
            "{{ '%(\u{4d8})s' | format(a=1) }}",
            "{{ '%(Ә' | format() }}",
        ] {
            let err = check(source, &limits).expect_err("refused");
            assert!(
                err.contains("format: a %(key) placeholder may hold only ASCII characters"),
                "{source}: {err}"
            );
        }
        // Everything else is minijinja's own format.
        for (source, expect) in [
            ("{{ '%s-%d' | format('a', 3) }}", "a-3"),
            ("{{ 'Ә %s' | format('é') }}", "Ә é"),
            ("{{ '%(k)s and (Ә)' | format({'k': 'v'}) }}", "v and (Ә)"),
        ] {
            assert_eq!(check(source, &limits).as_deref(), Ok(expect), "{source}");
        }
    }

    #[test]
    fn format_refuses_widths_and_precisions_that_would_abort_and_formats_the_rest() {
        let limits = Limits::default();
        assert_refused(
            &[
                (
                    "{{ '%555555555555d'|format(1) }}",
                    "a placeholder's width may be at most 10000, not 555555555555",
                ),
                (
                    "{{ 'x %(a)-+#0010001s'|format(a=1) }}",
                    "a placeholder's width may be at most 10000, not 10001",
                ),
                (
                    "{{ '%.555555555555f'|format(1.5) }}",
                    "a placeholder's precision may be at most 10000, not 555555555555",
                ),
                (
                    "{{ '%5.99999999999999999999999e'|format(1.5) }}",
                    "a placeholder's precision may be at most 10000, not 99999999999999999999999",
                ),
            ],
            &limits,
        );
        assert_as_minijinja(
            &[
                "{{ '%5d|%-5s|%05.2f|%%|%.3e'|format(42, 'ab', 3.14159, 2.5) }}",
                "{{ '%(a)s and %(b)08.3f'|format({'a': 1, 'b': 2.5}) }}",
                "{{ '100%% %s'|format('sure') }}",
                "{{ '%10000s'|format('') | length }}",
                "{{ 'no placeholders'|format() }}",
            ],
            &limits,
        );
    }

    #[test]
    fn a_panic_of_the_template_engine_is_the_templates_error() {
        let limits = Limits::default();
        // minijinja 2.24 indexed an empty string when slicing it backwards (3.1 does
        // not); a filter of the fleet's own that panics stands for whatever fault the
        // engine has next.
        assert_eq!(check("{{ ''[2::-568] }}", &limits).as_deref(), Ok(""));
        assert_eq!(check("{{ 'abc'[::-1] }}", &limits).as_deref(), Ok("cba"));
        let path = "workloads/w/manifests/t.yaml.j2".to_string();
        let snapshot = FleetSnapshot::from_files([(path.as_str(), "{{ 1 | explode }}")]);
        let mut diagnostics = Vec::new();
        let mut templates = Templates::compile_with(&snapshot, [&path], &limits, &mut diagnostics);
        templates.env.add_filter("explode", |_: Value| -> Value {
            panic!("index out of bounds: the len is 0 but the index is 2")
        });
        let err = templates
            .render(&path, &Value::UNDEFINED)
            .expect("compiled")
            .expect_err("an error, not a panic")
            .to_string();
        assert!(
            err.contains(
                "template error: the template engine failed on this template (index out of bounds"
            ),
            "{err}"
        );
    }

    #[test]
    fn indent_slice_batch_and_replace_refuse_sizes_past_their_bounds() {
        let limits = Limits::default();
        assert_refused(
            &[
                (
                    "{{ 0|indent|indent(555555555555) }}",
                    "indent(555555555555) would build a string of more than 4194304 bytes",
                ),
                (
                    "{{ 'a\nb'|indent(width=3000000) }}",
                    "indent(3000000) would build a string of more than 4194304 bytes",
                ),
                (
                    "{{ [1, 2]|slice(555555555555) }}",
                    "slice(555555555555): at most 100000 parts",
                ),
                (
                    "{{ ('x' * 3000)|replace('', 'y' * 3000) }}",
                    "replace would build a string of more than 4194304 bytes",
                ),
                (
                    "{{ [1, 2]|batch(555555555555) }}",
                    "batch(555555555555): at most 100000 parts",
                ),
            ],
            &limits,
        );
        // Within the limits, the filters are minijinja's own.
        assert_as_minijinja(
            &[
                "{{ 'a\nb\n\nc'|indent }}",
                "{{ 'a\nb\n\nc'|indent(2, true, true) }}",
                "{{ 'a\nb'|indent(width=3, first=true) }}",
                "{{ [1, 2, 3, 4, 5]|slice(2) }}",
                "{{ [1, 2, 3, 4, 5]|slice(3, 0) }}",
                "{{ [1, 2, 3, 4, 5]|batch(2) }}",
                "{{ [1, 2, 3]|batch(2, 'x') }}",
                "{{ 'a-b-c'|replace('-', '+') }}",
                "{{ 'abc'|replace('', '.') }}",
                "{{ 'aaa'|replace('a', '') }}",
            ],
            &limits,
        );
        let err = check("{{ 'a'|indent(2, nope=1) }}", &limits).expect_err("unknown keyword");
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn a_chain_of_joins_is_held_to_the_output_cap() {
        let limits = Limits {
            max_template_output_bytes: 1_000_000,
            ..Limits::default()
        };
        // Each join multiplies the length by about 1,000: 10^3, 10^6, 10^9 bytes.
        let source = "{{ ('x' * 1000) | join('y' * 999) | join('z' * 999) }}";
        let err = check(source, &limits).expect_err("too large");
        assert!(
            err.starts_with("workloads/w/manifests/t.yaml.j2")
                && err.contains(
                    "join would build a string of more than 1000000 bytes, the limit for one \
                     template's output (--max-template-output)"
                ),
            "{err}"
        );
        // Below the cap, join gives what minijinja's own gives.
        assert_as_minijinja(
            &[
                "{{ 'abc' | join('-') }}",
                "{{ [1, 'two', none, true, 2.5, [3]] | join(', ') }}",
                "{{ ['a', 'b'] | join }}",
                "{{ [] | join(',') }}",
                "{{ {'k': 1, 'l': 2} | join(',') }}",
                "{{ ('x' * 10) | join('y' * 3) | join }}",
            ],
            &limits,
        );
        let err = check("{{ 5 | join(',') }}", &limits).expect_err("not iterable");
        assert!(err.contains("cannot join value of type number"), "{err}");
    }

    #[test]
    fn deep_macro_recursion_is_an_error_not_a_stack_overflow() {
        let source = "{% macro down(n) %}{{ down(n + 1) }}{% endmacro %}{{ down(0) }}";
        // Rendered on a thread with the usual 2 MiB stack, as rayon's workers have.
        let err = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || check(source, &Limits::default()))
            .expect("thread")
            .join()
            .expect("no stack overflow")
            .expect_err("too deep");
        assert!(err.contains("recursion"), "{err}");
    }
}
