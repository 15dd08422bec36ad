//! The executor: walks parsed trees with a data value as Go's `text/template`
//! executes them (with Helm's `missingkey=zero`), Go's builtin functions, and
//! Helm's `include` and `tpl`.

use std::collections::HashMap;
use std::sync::Arc;

use super::fmt::{display, quote_go, sprint, sprintf, sprintln};
use super::parse::{self, Arg, Command, Control, Node, Pipe, TemplateCall, Tree};
use super::value::{Func, FuncError, Host, Value};
use super::{Budget, ExecError, ExecErrorKind, ParseError, ROOT_NAME, TraceEntry};

/// Template functions by name (Sprig's and Helm's; Go's builtins, `include` and
/// `tpl` are the engine's own and need not be listed).
#[derive(Clone, Default)]
pub struct Funcs {
    map: HashMap<String, Func>,
}

impl Funcs {
    pub fn new() -> Funcs {
        Funcs::default()
    }

    /// Adds (or replaces) a function; a function named like one of Go's builtins
    /// replaces the builtin, as `template.Funcs` does (Sprig's `slice` does).
    pub fn insert(&mut self, name: impl Into<String>, func: Func) {
        self.map.insert(name.into(), func);
    }

    pub fn get(&self, name: &str) -> Option<Func> {
        self.map.get(name).copied()
    }

    /// Whether a template may call `name`: a listed function, a builtin,
    /// `include` or `tpl`.
    pub fn is_defined(&self, name: &str) -> bool {
        self.map.contains_key(name)
            || BUILTINS.contains(&name)
            || name == "include"
            || name == "tpl"
    }
}

impl std::fmt::Debug for Funcs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.map.keys().collect();
        names.sort();
        f.debug_struct("Funcs").field("names", &names).finish()
    }
}

impl FromIterator<(&'static str, Func)> for Funcs {
    fn from_iter<I: IntoIterator<Item = (&'static str, Func)>>(iter: I) -> Funcs {
        Funcs {
            map: iter.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }
}

const BUILTINS: &[&str] = &[
    "and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf",
    "println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne",
];

/// Parsed templates by name: every file of a chart and its subcharts, and every
/// `define` in them, in one set as Helm parses them.
#[derive(Debug, Default)]
pub struct TemplateSet {
    templates: HashMap<String, Arc<Tree>>,
}

impl TemplateSet {
    pub fn new() -> TemplateSet {
        TemplateSet::default()
    }

    /// Parses `text` as the template `name` and adds it and its `define`s to the
    /// set. A later definition replaces an earlier one, except that an empty one
    /// (only spaces) never replaces another, as in Go.
    pub fn parse(&mut self, name: &str, text: &str, funcs: &Funcs) -> Result<(), ParseError> {
        let trees = parse::parse(name, text, &|f| funcs.is_defined(f))?;
        for tree in trees {
            associate(&mut self.templates, tree);
        }
        Ok(())
    }

    /// Whether a template of that name was parsed or defined.
    pub fn contains(&self, name: &str) -> bool {
        self.templates.contains_key(name)
    }

    /// The names of the set's templates, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.templates.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// Executes the template `name` with `data` as dot (and `$`).
    pub fn execute(
        &self,
        name: &str,
        data: &Value,
        funcs: &Funcs,
        host: &mut dyn Host,
        budget: &Budget,
    ) -> Result<String, ExecError> {
        let Some(tree) = self.templates.get(name).cloned() else {
            let message = format!(
                "template: no template {} associated with template {}",
                quote_go(name),
                quote_go(ROOT_NAME)
            );
            return Err(ExecError::plain(message));
        };
        let mut exec = Exec {
            set: self,
            funcs,
            host,
            budget,
            fuel: budget.fuel,
            depth: 0,
            nesting: 0,
            overlays: Vec::new(),
        };
        let mut out = String::new();
        exec.run_tree(&tree, dotted(data.clone()), &mut out)?;
        Ok(out)
    }
}

fn associate(templates: &mut HashMap<String, Arc<Tree>>, tree: Tree) {
    if templates.contains_key(&tree.name) && tree.is_empty() {
        return;
    }
    templates.insert(tree.name.clone(), Arc::new(tree));
}

/// A value with whether its Go static type is `interface{}` (a map's or a list's
/// element), which only changes the type errors name.
#[derive(Clone, Debug)]
struct Dot {
    value: Value,
    iface: bool,
}

/// The data a template starts with: Go's `reflect.ValueOf(data)`, where a nil
/// interface is no value at all.
fn dotted(value: Value) -> Dot {
    Dot {
        value: match value {
            Value::Nil => Value::Missing,
            v => v,
        },
        iface: false,
    }
}

/// What the executor was at, for the position and `at <...>` of errors.
#[derive(Clone, Copy)]
enum At<'t> {
    Nothing,
    Node(&'t Node),
    Pipe(&'t Pipe),
    Cmd(&'t Command),
    Arg(&'t Arg),
    Template(&'t TemplateCall),
}

impl At<'_> {
    fn pos_and_context(&self) -> Option<(usize, String)> {
        match self {
            At::Nothing => None,
            At::Node(n) => Some((node_pos(n), n.to_string())),
            At::Pipe(p) => Some((p.pos, p.to_string())),
            At::Cmd(c) => Some((c.pos, c.to_string())),
            At::Arg(a) => Some((a.pos(), a.to_string())),
            At::Template(t) => Some((t.pos, template_call_text(t))),
        }
    }
}

fn node_pos(n: &Node) -> usize {
    match n {
        Node::Text(_) => 0,
        Node::Action(p) => p.pos,
        Node::If(c) | Node::With(c) | Node::Range(c) => c.pos,
        Node::Template(t) => t.pos,
        Node::Break(p) | Node::Continue(p) => *p,
    }
}

fn template_call_text(t: &TemplateCall) -> String {
    match &t.pipe {
        None => format!("{{{{template {}}}}}", quote_go(&t.name)),
        Some(p) => format!("{{{{template {} {p}}}}}", quote_go(&t.name)),
    }
}

struct Frame<'t> {
    tree: &'t Tree,
    vars: Vec<(&'t str, Dot)>,
    at: At<'t>,
}

enum Stop {
    Break,
    Continue,
    Err(ExecError),
}

impl From<ExecError> for Stop {
    fn from(e: ExecError) -> Stop {
        Stop::Err(e)
    }
}

type EResult<T> = Result<T, ExecError>;

struct Exec<'a> {
    set: &'a TemplateSet,
    funcs: &'a Funcs,
    host: &'a mut dyn Host,
    budget: &'a Budget,
    fuel: u64,
    depth: usize,
    nesting: usize,
    /// Templates defined by the `tpl` calls under way, innermost last.
    overlays: Vec<Arc<HashMap<String, Arc<Tree>>>>,
}

impl<'a> Exec<'a> {
    fn lookup(&self, name: &str) -> Option<Arc<Tree>> {
        for overlay in self.overlays.iter().rev() {
            if let Some(t) = overlay.get(name) {
                return Some(t.clone());
            }
        }
        self.set.templates.get(name).cloned()
    }

    fn error_at(&self, f: &Frame<'_>, kind: ExecErrorKind, message: String) -> ExecError {
        match f.at.pos_and_context() {
            None => ExecError::new(
                kind,
                format!("template: {}: {}", f.tree.name, message),
                Some(TraceEntry {
                    location: f.tree.name.clone(),
                    executed: String::new(),
                    message: message.clone(),
                }),
            ),
            Some((pos, context)) => {
                let location = f.tree.location(pos);
                let executed = format!("executing {} at <{}>:", quote_go(&f.tree.name), context);
                ExecError::new(
                    kind,
                    format!(
                        "template: {location}: executing {} at <{context}>: {message}",
                        quote_go(&f.tree.name)
                    ),
                    Some(TraceEntry {
                        location,
                        executed,
                        message,
                    }),
                )
            }
        }
    }

    fn err(&self, f: &Frame<'_>, message: String) -> ExecError {
        self.error_at(f, ExecErrorKind::Template, message)
    }

    fn burn(&mut self, f: &Frame<'_>, cost: u64) -> EResult<()> {
        if self.fuel < cost {
            self.fuel = 0;
            return Err(self.error_at(
                f,
                ExecErrorKind::Fuel,
                format!(
                    "out of fuel: the templates took more than {} steps (flotilla's render budget); a loop may not end",
                    self.budget.fuel
                ),
            ));
        }
        self.fuel -= cost;
        Ok(())
    }

    fn write(&mut self, f: &Frame<'_>, out: &mut String, s: &str) -> EResult<()> {
        self.burn(f, s.len() as u64 / 16)?;
        if out.len() + s.len() > self.budget.max_output {
            return Err(self.error_at(
                f,
                ExecErrorKind::OutputSize,
                format!(
                    "output too large: more than {} bytes (flotilla's render budget)",
                    self.budget.max_output
                ),
            ));
        }
        out.push_str(s);
        Ok(())
    }

    fn enter(&mut self, f: &Frame<'_>) -> EResult<()> {
        self.nesting += 1;
        if self.nesting > self.budget.max_nesting {
            return Err(self.error_at(
                f,
                ExecErrorKind::Depth,
                format!(
                    "exceeded maximum nesting ({}) of templates, control structures and parentheses",
                    self.budget.max_nesting
                ),
            ));
        }
        Ok(())
    }

    fn enter_template(&mut self, f: &Frame<'_>) -> EResult<()> {
        if self.depth >= self.budget.max_depth {
            return Err(self.error_at(
                f,
                ExecErrorKind::Depth,
                format!(
                    "exceeded maximum template depth ({})",
                    self.budget.max_depth
                ),
            ));
        }
        self.depth += 1;
        self.enter(f)
    }

    fn leave_template(&mut self) {
        self.depth -= 1;
        self.nesting -= 1;
    }

    fn run_tree(&mut self, tree: &Tree, dot: Dot, out: &mut String) -> EResult<()> {
        let mut frame = Frame {
            tree,
            vars: vec![("$", dot.clone())],
            at: At::Nothing,
        };
        match self.walk_list(&mut frame, &dot, &tree.root, out) {
            Ok(()) => Ok(()),
            Err(Stop::Err(e)) => Err(e),
            // The parser only allows break and continue inside range.
            Err(Stop::Break | Stop::Continue) => Ok(()),
        }
    }

    fn walk_list<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        list: &'t parse::List,
        out: &mut String,
    ) -> Result<(), Stop> {
        for node in &list.nodes {
            self.walk(f, dot, node, out)?;
        }
        Ok(())
    }

    fn walk<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        node: &'t Node,
        out: &mut String,
    ) -> Result<(), Stop> {
        f.at = At::Node(node);
        self.burn(f, 1)?;
        match node {
            Node::Text(t) => self.write(f, out, t)?,
            Node::Action(pipe) => {
                let v = self.eval_pipeline(f, dot, pipe)?;
                if pipe.decl.is_empty() {
                    f.at = At::Node(node);
                    let text = match &v.value {
                        Value::Nil | Value::Missing => "<no value>".to_string(),
                        Value::String(s) => s.to_string(),
                        other => display(other),
                    };
                    self.write(f, out, &text)?;
                }
            }
            Node::If(c) => self.walk_if_with(f, dot, c, false, out)?,
            Node::With(c) => self.walk_if_with(f, dot, c, true, out)?,
            Node::Range(c) => self.walk_range(f, dot, c, out)?,
            Node::Template(t) => self.walk_template(f, dot, t, out)?,
            Node::Break(_) => return Err(Stop::Break),
            Node::Continue(_) => return Err(Stop::Continue),
        }
        Ok(())
    }

    fn walk_if_with<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        c: &'t Control,
        with: bool,
        out: &mut String,
    ) -> Result<(), Stop> {
        self.enter(f)?;
        let mark = f.vars.len();
        let v = self.eval_pipeline(f, dot, &c.pipe)?;
        let result = if v.value.truthy() {
            if with {
                self.walk_list(f, &v, &c.list, out)
            } else {
                self.walk_list(f, dot, &c.list, out)
            }
        } else if let Some(e) = &c.else_list {
            self.walk_list(f, dot, e, out)
        } else {
            Ok(())
        };
        f.vars.truncate(mark);
        self.nesting -= 1;
        result
    }

    fn walk_range<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        c: &'t Control,
        out: &mut String,
    ) -> Result<(), Stop> {
        self.enter(f)?;
        let outer = f.vars.len();
        let v = self.eval_pipeline(f, dot, &c.pipe)?;
        let mark = f.vars.len();
        let decls = c.pipe.decl.len();
        let mut ran = false;
        let mut result = Ok(());
        {
            let mut one = |this: &mut Exec<'a>,
                           f: &mut Frame<'t>,
                           index: Value,
                           elem: Dot|
             -> Result<bool, Stop> {
                ran = true;
                this.burn(f, 1)?;
                if decls > 0 {
                    f.vars[mark - 1].1 = elem.clone();
                }
                if decls > 1 {
                    f.vars[mark - 2].1 = Dot {
                        value: index,
                        iface: false,
                    };
                }
                let r = this.walk_list(f, &elem, &c.list, out);
                f.vars.truncate(mark);
                match r {
                    Ok(()) | Err(Stop::Continue) => Ok(true),
                    Err(Stop::Break) => Ok(false),
                    Err(e) => Err(e),
                }
            };
            let iface = |value: &Value| Dot {
                value: value.clone(),
                iface: true,
            };
            match &v.value {
                Value::List(items) => {
                    for (i, item) in items.iter().enumerate() {
                        match one(self, f, Value::Int(i as i64), iface(item)) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
                Value::Bytes(bytes) => {
                    for (i, b) in bytes.iter().enumerate() {
                        let elem = Dot {
                            value: Value::Int(i64::from(*b)),
                            iface: false,
                        };
                        match one(self, f, Value::Int(i as i64), elem) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
                Value::Map(map) => {
                    for (k, item) in map.entries().iter() {
                        match one(self, f, Value::string(k.as_str()), iface(item)) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
                Value::Int(n) | Value::Int64(n) => {
                    if decls > 1 {
                        return Err(Stop::Err(self.err(
                            f,
                            format!(
                                "can't use {} to iterate over more than one variable",
                                display(&v.value)
                            ),
                        )));
                    }
                    let int64 = matches!(v.value, Value::Int64(_));
                    for i in 0..(*n).max(0) {
                        let elem = Dot {
                            value: if int64 {
                                Value::Int64(i)
                            } else {
                                Value::Int(i)
                            },
                            iface: false,
                        };
                        match one(self, f, Value::Missing, elem) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
                Value::Nil | Value::Missing => {}
                Value::Object(object) => {
                    let Some(items) = object.range_items() else {
                        return Err(Stop::Err(
                            self.err(f, format!("range can't iterate over {}", display(&v.value))),
                        ));
                    };
                    for (key, item) in items {
                        match one(self, f, key, iface(&item)) {
                            Ok(true) => {}
                            Ok(false) => break,
                            Err(e) => {
                                result = Err(e);
                                break;
                            }
                        }
                    }
                }
                other => {
                    return Err(Stop::Err(
                        self.err(f, format!("range can't iterate over {}", display(other))),
                    ));
                }
            }
        }
        result?;
        if !ran && let Some(e) = &c.else_list {
            self.walk_list(f, dot, e, out)?;
        }
        f.vars.truncate(outer);
        self.nesting -= 1;
        Ok(())
    }

    fn walk_template<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        t: &'t TemplateCall,
        out: &mut String,
    ) -> Result<(), Stop> {
        f.at = At::Template(t);
        let Some(tree) = self.lookup(&t.name) else {
            return Err(Stop::Err(
                self.err(f, format!("template {} not defined", quote_go(&t.name))),
            ));
        };
        self.enter_template(f)?;
        let new_dot = match &t.pipe {
            Some(p) => self.eval_pipeline(f, dot, p)?,
            None => Dot {
                value: Value::Missing,
                iface: false,
            },
        };
        let result = self.run_tree(&tree, new_dot, out);
        self.leave_template();
        result.map_err(Stop::Err)
    }

    fn eval_pipeline<'t>(&mut self, f: &mut Frame<'t>, dot: &Dot, pipe: &'t Pipe) -> EResult<Dot> {
        f.at = At::Pipe(pipe);
        let mut value: Option<Dot> = None;
        for cmd in &pipe.cmds {
            let v = self.eval_command(f, dot, cmd, value.take())?;
            // Go digs a value out of its interface{} after each command: a nil
            // interface becomes no value.
            value = Some(Dot {
                value: match v.value {
                    Value::Nil => Value::Missing,
                    other => other,
                },
                iface: false,
            });
        }
        let value = value.unwrap_or(Dot {
            value: Value::Missing,
            iface: false,
        });
        for name in &pipe.decl {
            if pipe.is_assign {
                match f.vars.iter_mut().rev().find(|(n, _)| *n == name.as_str()) {
                    Some(slot) => slot.1 = value.clone(),
                    None => return Err(self.err(f, format!("undefined variable: {name}"))),
                }
            } else {
                f.vars.push((name.as_str(), value.clone()));
            }
        }
        Ok(value)
    }

    fn not_a_function(&self, f: &Frame<'_>, args: &[Arg], final_: &Option<Dot>) -> EResult<()> {
        if args.len() > 1 || final_.is_some() {
            return Err(self.err(
                f,
                format!("can't give argument to non-function {}", args[0]),
            ));
        }
        Ok(())
    }

    fn eval_command<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        cmd: &'t Command,
        final_: Option<Dot>,
    ) -> EResult<Dot> {
        self.burn(f, 1)?;
        let first = &cmd.args[0];
        match first {
            Arg::Field { idents, .. } => {
                f.at = At::Arg(first);
                let receiver = dot.clone();
                return self.eval_field_chain(f, dot, receiver, first, idents, Some(cmd), final_);
            }
            Arg::Chain { node, fields, .. } => {
                f.at = At::Arg(first);
                if let Arg::Nil(_) = **node {
                    return Err(self.err(f, format!("indirection through explicit nil in {first}")));
                }
                let receiver = self.eval_arg(f, dot, node)?;
                f.at = At::Arg(first);
                return self.eval_field_chain(f, dot, receiver, first, fields, Some(cmd), final_);
            }
            Arg::Identifier { name, .. } => {
                return self.eval_function(f, dot, first, name, Some(cmd), final_);
            }
            Arg::Pipe(p) => {
                self.not_a_function(f, &cmd.args, &final_)?;
                self.enter(f)?;
                let v = self.eval_pipeline(f, dot, p);
                self.nesting -= 1;
                return v;
            }
            Arg::Variable { idents, .. } => {
                f.at = At::Arg(first);
                let value = self.var_value(f, &idents[0])?;
                if idents.len() == 1 {
                    self.not_a_function(f, &cmd.args, &final_)?;
                    return Ok(value);
                }
                return self.eval_field_chain(
                    f,
                    dot,
                    value,
                    first,
                    &idents[1..],
                    Some(cmd),
                    final_,
                );
            }
            _ => {}
        }
        f.at = At::Arg(first);
        self.not_a_function(f, &cmd.args, &final_)?;
        match first {
            Arg::Nil(_) => Err(self.err(f, "nil is not a command".to_string())),
            Arg::Dot(_) => Ok(dot.clone()),
            other => Ok(Dot {
                value: self.constant(f, other)?,
                iface: false,
            }),
        }
    }

    fn constant(&self, f: &Frame<'_>, arg: &Arg) -> EResult<Value> {
        Ok(match arg {
            Arg::Bool(_, b) => Value::Bool(*b),
            Arg::Str { text, .. } => Value::String(text.clone()),
            Arg::Number(_, n) => {
                let t = &n.text;
                let hex_int = t.len() > 2
                    && t.starts_with('0')
                    && matches!(t.as_bytes()[1], b'x' | b'X')
                    && !t.contains(['p', 'P']);
                let rune = t.starts_with('\'');
                match (n.float, n.int) {
                    (Some(x), _) if !hex_int && !rune && t.contains(['.', 'e', 'E', 'p', 'P']) => {
                        Value::Float(x)
                    }
                    (_, Some(i)) => Value::Int(i),
                    _ => return Err(self.err(f, format!("{t} overflows int"))),
                }
            }
            _ => Value::Missing,
        })
    }

    fn var_value(&self, f: &Frame<'_>, name: &str) -> EResult<Dot> {
        match f.vars.iter().rev().find(|(n, _)| *n == name) {
            Some((_, v)) => Ok(v.clone()),
            None => Err(self.err(f, format!("undefined variable: {name}"))),
        }
    }

    /// An argument of a function or method, as Go's `evalArg` gets it for an
    /// `interface{}` parameter.
    fn eval_arg<'t>(&mut self, f: &mut Frame<'t>, dot: &Dot, arg: &'t Arg) -> EResult<Dot> {
        f.at = At::Arg(arg);
        match arg {
            Arg::Dot(_) => Ok(dot.clone()),
            Arg::Nil(_) => Ok(Dot {
                value: Value::Nil,
                iface: true,
            }),
            Arg::Field { idents, .. } => {
                self.eval_field_chain(f, dot, dot.clone(), arg, idents, None, None)
            }
            Arg::Variable { idents, .. } => {
                let value = self.var_value(f, &idents[0])?;
                if idents.len() == 1 {
                    return Ok(value);
                }
                self.eval_field_chain(f, dot, value, arg, &idents[1..], None, None)
            }
            Arg::Pipe(p) => {
                self.enter(f)?;
                let v = self.eval_pipeline(f, dot, p);
                self.nesting -= 1;
                v
            }
            Arg::Identifier { name, .. } => self.eval_function(f, dot, arg, name, None, None),
            Arg::Chain { node, fields, .. } => {
                if let Arg::Nil(_) = **node {
                    return Err(self.err(f, format!("indirection through explicit nil in {arg}")));
                }
                let receiver = self.eval_arg(f, dot, node)?;
                f.at = At::Arg(arg);
                self.eval_field_chain(f, dot, receiver, arg, fields, None, None)
            }
            other => Ok(Dot {
                value: self.constant(f, other)?,
                iface: false,
            }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn eval_field_chain<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        mut receiver: Dot,
        node: &'t Arg,
        idents: &'t [String],
        cmd: Option<&'t Command>,
        final_: Option<Dot>,
    ) -> EResult<Dot> {
        let n = idents.len();
        for ident in &idents[..n - 1] {
            receiver = self.eval_field(f, dot, ident, node, None, None, receiver)?;
        }
        self.eval_field(f, dot, &idents[n - 1], node, cmd, final_, receiver)
    }

    #[allow(clippy::too_many_arguments)]
    fn eval_field<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        name: &str,
        node: &'t Arg,
        cmd: Option<&'t Command>,
        final_: Option<Dot>,
        receiver: Dot,
    ) -> EResult<Dot> {
        let has_args = cmd.is_some_and(|c| c.args.len() > 1) || final_.is_some();
        match &receiver.value {
            Value::Missing => Ok(receiver),
            Value::Nil => Err(self.err(f, format!("nil pointer evaluating interface {{}}.{name}"))),
            Value::Map(map) => {
                if has_args {
                    return Err(self.err(f, format!("{name} is not a method but has arguments")));
                }
                Ok(Dot {
                    value: map.get(name).unwrap_or(Value::Nil),
                    iface: true,
                })
            }
            Value::Object(obj) => {
                let obj = obj.clone();
                if !has_args && let Some(v) = obj.field(name) {
                    return Ok(Dot {
                        value: v,
                        iface: false,
                    });
                }
                let mut argv = Vec::new();
                if let Some(c) = cmd {
                    for a in &c.args[1..] {
                        argv.push(self.eval_arg(f, dot, a)?.value);
                    }
                }
                if let Some(fin) = final_ {
                    argv.push(fin.value);
                }
                f.at = At::Arg(node);
                if self.host.sites() && argv.iter().any(super::sites::marked) {
                    let message = format!("{name} is given a site's stand-in");
                    return Err(self.func_error(f, name, FuncError::new(message)));
                }
                match obj.call(name, &argv) {
                    Some(Ok(v)) => Ok(Dot {
                        value: v,
                        iface: false,
                    }),
                    Some(Err(e)) => {
                        if let Some(c) = cmd {
                            f.at = At::Cmd(c);
                        }
                        Err(self.func_error(f, name, e))
                    }
                    None => {
                        if has_args && obj.field(name).is_some() {
                            return Err(self.err(
                                f,
                                format!("{name} has arguments but cannot be invoked as function"),
                            ));
                        }
                        Err(self.err(
                            f,
                            format!("can't evaluate field {name} in type {}", obj.type_name()),
                        ))
                    }
                }
            }
            other => {
                let type_name = if receiver.iface {
                    "interface {}".to_string()
                } else {
                    other.type_name()
                };
                Err(self.err(
                    f,
                    format!("can't evaluate field {name} in type {type_name}"),
                ))
            }
        }
    }

    fn func_error(&self, f: &Frame<'_>, name: &str, e: FuncError) -> ExecError {
        let mut err = self.err(f, format!("error calling {name}: {e}"));
        // Go's error chain ends in the function's own error, which Helm cannot parse.
        err.trace = None;
        err
    }

    fn check_arity(
        &self,
        f: &Frame<'_>,
        name: &str,
        explicit: usize,
        total: usize,
        want: usize,
        variadic: bool,
    ) -> EResult<()> {
        if variadic {
            if total < want {
                return Err(self.err(
                    f,
                    format!("wrong number of args for {name}: want at least {want} got {explicit}"),
                ));
            }
        } else if total != want {
            return Err(self.err(
                f,
                format!("wrong number of args for {name}: want {want} got {total}"),
            ));
        }
        Ok(())
    }

    fn eval_function<'t>(
        &mut self,
        f: &mut Frame<'t>,
        dot: &Dot,
        ident: &'t Arg,
        name: &str,
        cmd: Option<&'t Command>,
        final_: Option<Dot>,
    ) -> EResult<Dot> {
        f.at = At::Arg(ident);
        let args: &'t [Arg] = match cmd {
            Some(c) => &c.args[1..],
            None => &[],
        };
        let total = args.len() + usize::from(final_.is_some());
        let user = self.funcs.get(name);
        let builtin = user.is_none() && BUILTINS.contains(&name);
        if builtin {
            let (want, variadic) = match name {
                "and" | "or" | "index" | "slice" | "eq" | "printf" | "call" => (1, true),
                "not" | "len" => (1, false),
                "ne" | "lt" | "le" | "gt" | "ge" => (2, false),
                _ => (0, true),
            };
            self.check_arity(f, name, args.len(), total, want, variadic)?;
            if name == "and" || name == "or" {
                let mut last = Dot {
                    value: Value::Missing,
                    iface: false,
                };
                for a in args {
                    last = self.eval_arg(f, dot, a)?;
                    if last.value.truthy() == (name == "or") {
                        return Ok(last);
                    }
                }
                if let Some(fin) = final_ {
                    last = fin;
                }
                return Ok(last);
            }
        } else if user.is_none() && name != "include" && name != "tpl" {
            return Err(self.err(f, format!("{} is not a defined function", quote_go(name))));
        }
        let mut argv: Vec<Value> = Vec::with_capacity(total);
        for a in args {
            argv.push(self.eval_arg(f, dot, a)?.value);
        }
        if let Some(fin) = &final_ {
            argv.push(fin.value.clone());
        }
        // Errors of the call are reported at the whole command.
        let set_cmd_at = |f: &mut Frame<'t>| {
            f.at = match cmd {
                Some(c) => At::Cmd(c),
                None => At::Arg(ident),
            }
        };
        if self.host.sites()
            && let Err(message) = super::sites::check_call(name, &argv)
        {
            if user.is_some()
                && let Some(value) = self.host.defer(name, &argv)
            {
                return Ok(Dot {
                    value,
                    iface: false,
                });
            }
            set_cmd_at(f);
            return Err(self.func_error(f, name, FuncError::new(message)));
        }
        let result = if user.is_none() && name == "include" {
            set_cmd_at(f);
            return self.include(f, &argv, args);
        } else if user.is_none() && name == "tpl" {
            set_cmd_at(f);
            return self.tpl(f, &argv, args);
        } else if builtin {
            self.builtin(name, &argv, args)
        } else {
            match user {
                Some(func) => func(&mut *self.host, &argv),
                None => Err(FuncError::new("unknown function")),
            }
        };
        match result {
            Ok(v) => {
                if let Value::String(s) = &v {
                    self.burn(f, s.len() as u64 / 16)?;
                }
                Ok(Dot {
                    value: v,
                    iface: false,
                })
            }
            Err(e) => {
                if let Some((index, expected)) = e.as_wrong_type() {
                    return Err(self.wrong_type(f, index, expected, &argv, args, cmd));
                }
                set_cmd_at(f);
                Err(self.func_error(f, name, e))
            }
        }
    }

    /// Go's own argument type errors, reported at the argument.
    fn wrong_type<'t>(
        &self,
        f: &mut Frame<'t>,
        index: usize,
        expected: &str,
        argv: &[Value],
        args: &'t [Arg],
        cmd: Option<&'t Command>,
    ) -> ExecError {
        let value = argv.get(index).cloned().unwrap_or(Value::Missing);
        match args.get(index) {
            Some(node) => {
                f.at = At::Arg(node);
                let literal_kind = match expected {
                    "string" => Some("string"),
                    "bool" => Some("bool"),
                    "float64" | "float32" => Some("float"),
                    "int" | "int64" | "int32" | "int8" | "int16" => Some("integer"),
                    _ => None,
                };
                match (node, literal_kind) {
                    (Arg::Nil(_), _) => {
                        return self.err(f, format!("cannot assign nil to {expected}"));
                    }
                    (Arg::Number(..) | Arg::Str { .. } | Arg::Bool(..), Some(kind)) => {
                        return self.err(f, format!("expected {kind}; found {node}"));
                    }
                    _ => {}
                }
            }
            None => {
                if let Some(c) = cmd {
                    f.at = At::Cmd(c);
                }
            }
        }
        match value {
            Value::Missing => self.err(f, format!("invalid value; expected {expected}")),
            Value::Nil => self.err(
                f,
                format!("wrong type for value; expected {expected}; got interface {{}}"),
            ),
            other => self.err(
                f,
                format!(
                    "wrong type for value; expected {expected}; got {}",
                    other.type_name()
                ),
            ),
        }
    }

    fn include<'t>(&mut self, f: &mut Frame<'t>, argv: &[Value], args: &'t [Arg]) -> EResult<Dot> {
        if argv.len() != 2 {
            return Err(self.err(
                f,
                format!(
                    "wrong number of args for include: want 2 got {}",
                    argv.len()
                ),
            ));
        }
        let Some(name) = argv[0].as_str() else {
            return Err(self.wrong_type(f, 0, "string", argv, args, None));
        };
        let Some(tree) = self.lookup(name) else {
            let inner = ExecError::plain(format!(
                "template: no template {} associated with template {}",
                quote_go(name),
                quote_go(ROOT_NAME)
            ));
            return Err(self.wrap_call_error(f, "include", inner));
        };
        self.enter_template(f)?;
        let mut buf = String::new();
        let result = self.run_tree(&tree, dotted(argv[1].clone()), &mut buf);
        self.leave_template();
        match result {
            Ok(()) => {
                self.burn(f, buf.len() as u64 / 16)?;
                Ok(Dot {
                    value: Value::string(buf),
                    iface: false,
                })
            }
            Err(inner) => Err(self.wrap_call_error(f, "include", inner)),
        }
    }

    /// `error calling NAME: INNER`, keeping the inner error's kind and, for Helm's
    /// error report, its trace.
    fn wrap_call_error(&self, f: &Frame<'_>, name: &str, inner: ExecError) -> ExecError {
        let mut err = self.error_at(f, inner.kind, format!("error calling {name}: {inner}"));
        match (&mut err.trace, inner.trace) {
            (Some(outer), Some(inner_trace)) => {
                if let Some(first) = outer.first_mut()
                    && let Some(cut) = first.message.find(" template:")
                {
                    first.message.truncate(cut);
                }
                for entry in inner_trace {
                    if outer.last() != Some(&entry) {
                        outer.push(entry);
                    }
                }
            }
            (trace, None) => *trace = None,
            _ => {}
        }
        err
    }

    fn tpl<'t>(&mut self, f: &mut Frame<'t>, argv: &[Value], args: &'t [Arg]) -> EResult<Dot> {
        if argv.len() != 2 {
            return Err(self.err(
                f,
                format!("wrong number of args for tpl: want 2 got {}", argv.len()),
            ));
        }
        let Some(text) = argv[0].as_str() else {
            return Err(self.wrong_type(f, 0, "string", argv, args, None));
        };
        let funcs = self.funcs;
        let trees = match parse::parse(ROOT_NAME, text, &|n| funcs.is_defined(n)) {
            Ok(t) => t,
            Err(e) => {
                let mut err = self.err(
                    f,
                    format!(
                        "error calling tpl: cannot parse template {}: {e}",
                        quote_go(text)
                    ),
                );
                err.trace = None;
                return Err(err);
            }
        };
        self.burn(f, text.len() as u64 / 16 + 1)?;
        let mut overlay: HashMap<String, Arc<Tree>> = HashMap::new();
        let mut top = None;
        for tree in trees {
            if tree.name == ROOT_NAME && top.is_none() {
                top = Some(Arc::new(tree));
                continue;
            }
            if tree.is_empty()
                && (overlay.contains_key(&tree.name) || self.lookup(&tree.name).is_some())
            {
                continue;
            }
            overlay.insert(tree.name.clone(), Arc::new(tree));
        }
        let Some(top) = top else {
            return Ok(Dot {
                value: Value::string(""),
                iface: false,
            });
        };
        self.enter_template(f)?;
        self.overlays.push(Arc::new(overlay));
        let mut buf = String::new();
        let result = self.run_tree(&top, dotted(argv[1].clone()), &mut buf);
        self.overlays.pop();
        self.leave_template();
        match result {
            Ok(()) => Ok(Dot {
                value: Value::string(helm_clean_output(&buf)),
                iface: false,
            }),
            Err(inner) => {
                let kind = inner.kind;
                let mut err = self.error_at(
                    f,
                    kind,
                    format!(
                        "error calling tpl: error during tpl function execution for {}: {inner}",
                        quote_go(text)
                    ),
                );
                err.trace = None;
                Err(err)
            }
        }
    }

    fn builtin(&mut self, name: &str, argv: &[Value], args: &[Arg]) -> Result<Value, FuncError> {
        match name {
            "not" => Ok(Value::Bool(!argv[0].truthy())),
            "len" => builtin_len(&argv[0]),
            "index" => builtin_index(&argv[0], &argv[1..]),
            "slice" => builtin_slice(&argv[0], &argv[1..]),
            "eq" => builtin_eq(&argv[0], &argv[1..]).map(Value::Bool),
            "ne" => builtin_eq(&argv[0], &argv[1..2]).map(|b| Value::Bool(!b)),
            "lt" => builtin_lt(&argv[0], &argv[1]).map(Value::Bool),
            "le" => Ok(Value::Bool(
                builtin_lt(&argv[0], &argv[1])? || builtin_eq(&argv[0], &argv[1..2])?,
            )),
            "gt" => Ok(Value::Bool(
                !(builtin_lt(&argv[0], &argv[1])? || builtin_eq(&argv[0], &argv[1..2])?),
            )),
            "ge" => Ok(Value::Bool(!builtin_lt(&argv[0], &argv[1])?)),
            "print" => Ok(Value::string(sprint(&nils(argv)))),
            "println" => Ok(Value::string(sprintln(&nils(argv)))),
            "printf" => match &argv[0] {
                Value::String(format) => Ok(Value::string(sprintf(format, &nils(&argv[1..])))),
                _ => Err(FuncError::wrong_type(0, "string")),
            },
            "html" => Ok(Value::string(html_escape(&escaper_text(argv)))),
            "js" => Ok(Value::string(js_escape(&escaper_text(argv)))),
            "urlquery" => Ok(Value::string(query_escape(&escaper_text(argv)))),
            "call" => match &argv[0] {
                Value::Nil | Value::Missing => Err(FuncError::new("call of nil")),
                other => Err(FuncError::new(format!(
                    "non-function {} of type {}",
                    args.first().map(|a| a.to_string()).unwrap_or_default(),
                    other.type_name()
                ))),
            },
            _ => Err(FuncError::new(format!("{name} is not a builtin"))),
        }
    }
}

/// Function arguments as `interface{}` values: no value is a nil.
fn nils(argv: &[Value]) -> Vec<Value> {
    argv.iter()
        .map(|v| match v {
            Value::Missing => Value::Nil,
            other => other.clone(),
        })
        .collect()
}

/// The text `html`, `js` and `urlquery` escape: one string as is, else the
/// arguments printed (no value as `<no value>`).
fn escaper_text(argv: &[Value]) -> String {
    if let [Value::String(s)] = argv {
        return s.to_string();
    }
    let printable: Vec<Value> = argv
        .iter()
        .map(|v| match v {
            Value::Nil | Value::Missing => Value::string("<no value>"),
            other => other.clone(),
        })
        .collect();
    sprint(&printable)
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\0' => out.push('\u{FFFD}'),
            '"' => out.push_str("&#34;"),
            '\'' => out.push_str("&#39;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

fn js_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str("\\u003C"),
            '>' => out.push_str("\\u003E"),
            '&' => out.push_str("\\u0026"),
            '=' => out.push_str("\\u003D"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04X}", c as u32)),
            c if !c.is_ascii() && c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

fn builtin_len(item: &Value) -> Result<Value, FuncError> {
    let n = match item {
        Value::Missing => {
            return Err(FuncError::new(
                "reflect: call of reflect.Value.Type on zero Value",
            ));
        }
        Value::Nil => return Err(FuncError::new("len of nil pointer")),
        Value::String(s) => s.len(),
        Value::Bytes(b) => b.len(),
        Value::List(l) => l.len(),
        Value::Map(m) => m.len(),
        Value::Object(object) => match object.range_items() {
            Some(items) => items.len(),
            None => return Err(FuncError::new(format!("len of type {}", item.type_name()))),
        },
        other => return Err(FuncError::new(format!("len of type {}", other.type_name()))),
    };
    Ok(Value::Int(n as i64))
}

fn index_arg(index: &Value, cap: usize) -> Result<usize, FuncError> {
    let x = match index {
        Value::Int(i) | Value::Int64(i) => *i,
        Value::Nil | Value::Missing => {
            return Err(FuncError::new("cannot index slice/array with nil"));
        }
        other => {
            return Err(FuncError::new(format!(
                "cannot index slice/array with type {}",
                other.type_name()
            )));
        }
    };
    if x < 0 || x as u64 > cap as u64 {
        return Err(FuncError::new(format!("index out of range: {x}")));
    }
    Ok(x as usize)
}

fn builtin_index(item: &Value, indexes: &[Value]) -> Result<Value, FuncError> {
    if matches!(item, Value::Nil | Value::Missing) {
        return Err(FuncError::new("index of untyped nil"));
    }
    let mut item = item.clone();
    for index in indexes {
        item = match &item {
            Value::Nil | Value::Missing => return Err(FuncError::new("index of nil pointer")),
            Value::List(l) => {
                let x = index_arg(index, l.len())?;
                match l.get(x) {
                    Some(v) => v.clone(),
                    None => return Err(FuncError::new(format!("index out of range: {x}"))),
                }
            }
            Value::Bytes(_) | Value::String(_) => {
                let bytes: &[u8] = match &item {
                    Value::Bytes(b) => b,
                    Value::String(s) => s.as_bytes(),
                    _ => &[],
                };
                let x = index_arg(index, bytes.len())?;
                match bytes.get(x) {
                    Some(v) => Value::Int(i64::from(*v)),
                    None => return Err(FuncError::new(format!("index out of range: {x}"))),
                }
            }
            Value::Map(m) => match index {
                Value::String(k) => m.get(k).unwrap_or(Value::Nil),
                Value::Nil | Value::Missing => {
                    return Err(FuncError::new("value is nil; should be of type string"));
                }
                other => {
                    return Err(FuncError::new(format!(
                        "value has type {}; should be string",
                        other.type_name()
                    )));
                }
            },
            other => {
                return Err(FuncError::new(format!(
                    "can't index item of type {}",
                    other.type_name()
                )));
            }
        };
    }
    Ok(item)
}

fn builtin_slice(item: &Value, indexes: &[Value]) -> Result<Value, FuncError> {
    if matches!(item, Value::Nil | Value::Missing) {
        return Err(FuncError::new("slice of untyped nil"));
    }
    if indexes.len() > 3 {
        return Err(FuncError::new(format!(
            "too many slice indexes: {}",
            indexes.len()
        )));
    }
    let len = match item {
        Value::String(s) => {
            if indexes.len() == 3 {
                return Err(FuncError::new("cannot 3-index slice a string"));
            }
            s.len()
        }
        Value::List(l) => l.len(),
        Value::Bytes(b) => b.len(),
        other => {
            return Err(FuncError::new(format!(
                "can't slice item of type {}",
                other.type_name()
            )));
        }
    };
    let mut idx = [0, len, len];
    for (i, index) in indexes.iter().enumerate() {
        idx[i] = index_arg(index, len)?;
    }
    if idx[0] > idx[1] {
        return Err(FuncError::new(format!(
            "invalid slice index: {} > {}",
            idx[0], idx[1]
        )));
    }
    if indexes.len() == 3 && idx[1] > idx[2] {
        return Err(FuncError::new(format!(
            "invalid slice index: {} > {}",
            idx[1], idx[2]
        )));
    }
    Ok(match item {
        Value::String(s) => match s.get(idx[0]..idx[1]) {
            Some(sub) => Value::string(sub),
            None => Value::string(String::from_utf8_lossy(&s.as_bytes()[idx[0]..idx[1]]).as_ref()),
        },
        Value::List(l) => Value::list(l[idx[0]..idx[1]].to_vec()),
        Value::Bytes(b) => Value::Bytes(Arc::from(&b[idx[0]..idx[1]])),
        _ => Value::Missing,
    })
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum Kind {
    Invalid,
    Bool,
    Int,
    Float,
    String,
    Other,
}

fn basic_kind(v: &Value) -> Kind {
    match v {
        Value::Nil | Value::Missing => Kind::Invalid,
        Value::Bool(_) => Kind::Bool,
        Value::Int(_) | Value::Int64(_) => Kind::Int,
        Value::Float(_) => Kind::Float,
        Value::String(_) => Kind::String,
        _ => Kind::Other,
    }
}

fn int_of(v: &Value) -> i64 {
    match v {
        Value::Int(i) | Value::Int64(i) => *i,
        _ => 0,
    }
}

fn float_of(v: &Value) -> f64 {
    match v {
        Value::Float(f) => *f,
        _ => 0.0,
    }
}

fn builtin_eq(arg1: &Value, others: &[Value]) -> Result<bool, FuncError> {
    if others.is_empty() {
        return Err(FuncError::new("missing argument for comparison"));
    }
    let k1 = basic_kind(arg1);
    for arg in others {
        let k2 = basic_kind(arg);
        let truth = if k1 == Kind::Invalid || k2 == Kind::Invalid {
            k1 == k2
        } else if k1 != k2 || (k1 == Kind::Other && arg1.type_name() != arg.type_name()) {
            if k1 == Kind::Other && k2 == Kind::Other {
                return Err(FuncError::new(format!(
                    "non-comparable types {}: {}, {}: {}",
                    sprintf("%s", std::slice::from_ref(arg1)),
                    arg1.type_name(),
                    arg.type_name(),
                    display(arg)
                )));
            }
            return Err(FuncError::new(format!(
                "incompatible types for comparison: {} and {}",
                arg1.type_name(),
                arg.type_name()
            )));
        } else {
            match k1 {
                Kind::Bool => arg1.truthy() == arg.truthy(),
                Kind::Int => int_of(arg1) == int_of(arg),
                Kind::Float => float_of(arg1) == float_of(arg),
                Kind::String => arg1.as_str() == arg.as_str(),
                _ => match (arg1, arg) {
                    (Value::Object(a), Value::Object(b)) => Arc::ptr_eq(a, b),
                    _ => {
                        return Err(FuncError::new(format!(
                            "non-comparable type {}: {}",
                            sprintf("%s", std::slice::from_ref(arg)),
                            arg.type_name()
                        )));
                    }
                },
            }
        };
        if truth {
            return Ok(true);
        }
    }
    Ok(false)
}

fn builtin_lt(arg1: &Value, arg2: &Value) -> Result<bool, FuncError> {
    let k1 = basic_kind(arg1);
    let k2 = basic_kind(arg2);
    if matches!(k1, Kind::Invalid | Kind::Other) || matches!(k2, Kind::Invalid | Kind::Other) {
        return Err(FuncError::new("invalid type for comparison"));
    }
    if k1 != k2 {
        return Err(FuncError::new(format!(
            "incompatible types for comparison: {} and {}",
            arg1.type_name(),
            arg2.type_name()
        )));
    }
    Ok(match k1 {
        Kind::Int => int_of(arg1) < int_of(arg2),
        Kind::Float => float_of(arg1) < float_of(arg2),
        Kind::String => arg1.as_str() < arg2.as_str(),
        _ => return Err(FuncError::new("invalid type for comparison")),
    })
}

/// What Helm does to every rendered template (and to `tpl`'s output): removes
/// `<no value>`, which Go prints for missing values despite `missingkey=zero`.
pub fn helm_clean_output(rendered: &str) -> String {
    rendered.replace("<no value>", "")
}
