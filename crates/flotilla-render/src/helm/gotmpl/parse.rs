//! The parser: items into trees, as Go's `text/template/parse` builds them, with its
//! checks (defined functions and variables, `break` only inside `range`) and its
//! error messages.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use super::ParseError;
use super::lex::{Item, ItemKind, lex};

/// Deeper nesting of parentheses and control structures than this is refused, so
/// that hostile text cannot overflow the stack of the parser or of the executor.
/// (Go's own limit is 10000; real charts nest a few levels.)
pub(crate) const MAX_NESTING: usize = 200;

/// One template: a file's top level, or a `define`/`block`.
#[derive(Debug)]
pub(crate) struct Tree {
    /// The template's name (`define "x"` gives `x`).
    pub name: String,
    /// The name of the text it was parsed from, as errors show it.
    pub parse_name: Arc<str>,
    /// The whole text, to turn byte positions into lines and columns.
    pub text: Arc<str>,
    pub root: List,
}

impl Tree {
    /// Go's `parse.IsEmptyTree`: nothing but spaces and comments.
    pub fn is_empty(&self) -> bool {
        self.root.nodes.iter().all(|n| match n {
            Node::Text(t) => t.trim_matches([' ', '\t', '\r', '\n']).is_empty(),
            _ => false,
        })
    }

    /// `NAME:LINE:COL` of a byte position, as Go's `ErrorContext` prints it
    /// (the column is the byte offset in its line, counted from 0 after a newline,
    /// and from 0 on the first line too).
    pub fn location(&self, pos: usize) -> String {
        let pos = pos.min(self.text.len());
        let before = &self.text[..pos];
        let line = 1 + before.matches('\n').count();
        let col = match before.rfind('\n') {
            None => pos,
            Some(nl) => pos - (nl + 1),
        };
        format!("{}:{}:{}", self.parse_name, line, col)
    }
}

#[derive(Debug, Default)]
pub(crate) struct List {
    pub nodes: Vec<Node>,
}

#[derive(Debug)]
pub(crate) enum Node {
    Text(Box<str>),
    Action(Pipe),
    If(Control),
    With(Control),
    Range(Control),
    Template(TemplateCall),
    Break(usize),
    Continue(usize),
}

#[derive(Debug)]
pub(crate) struct Control {
    pub pos: usize,
    pub pipe: Pipe,
    pub list: List,
    pub else_list: Option<List>,
}

#[derive(Debug)]
pub(crate) struct TemplateCall {
    pub pos: usize,
    pub name: String,
    pub pipe: Option<Pipe>,
}

#[derive(Debug)]
pub(crate) struct Pipe {
    pub pos: usize,
    pub is_assign: bool,
    /// Declared or assigned variables, `$` included in the name.
    pub decl: Vec<String>,
    pub cmds: Vec<Command>,
}

#[derive(Debug)]
pub(crate) struct Command {
    pub pos: usize,
    pub args: Vec<Arg>,
}

/// An operand of a command.
#[derive(Debug)]
pub(crate) enum Arg {
    /// `.a.b`: the names without dots.
    Field {
        pos: usize,
        idents: Vec<String>,
    },
    /// `$x.a.b`: `idents[0]` is the variable.
    Variable {
        pos: usize,
        idents: Vec<String>,
    },
    /// `(pipeline).a.b` or `"str".a`.
    Chain {
        pos: usize,
        node: Box<Arg>,
        fields: Vec<String>,
    },
    Identifier {
        pos: usize,
        name: String,
    },
    Dot(usize),
    Nil(usize),
    Bool(usize, bool),
    Number(usize, Number),
    /// The unquoted text and the text as written.
    Str {
        pos: usize,
        text: Arc<str>,
        quoted: Box<str>,
    },
    Pipe(Box<Pipe>),
}

/// A number constant with what Go's parser knows about it.
#[derive(Debug, Clone)]
pub(crate) struct Number {
    pub text: String,
    pub int: Option<i64>,
    pub is_uint: bool,
    pub float: Option<f64>,
}

impl Arg {
    pub fn pos(&self) -> usize {
        match self {
            Arg::Field { pos, .. }
            | Arg::Variable { pos, .. }
            | Arg::Chain { pos, .. }
            | Arg::Identifier { pos, .. }
            | Arg::Str { pos, .. } => *pos,
            Arg::Dot(pos) | Arg::Nil(pos) | Arg::Bool(pos, _) | Arg::Number(pos, _) => *pos,
            Arg::Pipe(p) => p.pos,
        }
    }
}

// The text forms Go's nodes print (`String()`), used in "at <...>" of errors.

impl std::fmt::Display for Arg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Arg::Field { idents, .. } => {
                for i in idents {
                    write!(f, ".{i}")?;
                }
                Ok(())
            }
            Arg::Variable { idents, .. } => f.write_str(&idents.join(".")),
            Arg::Chain { node, fields, .. } => {
                if let Arg::Pipe(_) = **node {
                    write!(f, "({node})")?;
                } else {
                    write!(f, "{node}")?;
                }
                for i in fields {
                    write!(f, ".{i}")?;
                }
                Ok(())
            }
            Arg::Identifier { name, .. } => f.write_str(name),
            Arg::Dot(_) => f.write_str("."),
            Arg::Nil(_) => f.write_str("nil"),
            Arg::Bool(_, b) => write!(f, "{b}"),
            Arg::Number(_, n) => f.write_str(&n.text),
            Arg::Str { quoted, .. } => f.write_str(quoted),
            Arg::Pipe(p) => write!(f, "({p})"),
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Pipe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.decl.is_empty() {
            f.write_str(&self.decl.join(", "))?;
            f.write_str(if self.is_assign { " = " } else { " := " })?;
        }
        for (i, c) in self.cmds.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for List {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for n in &self.nodes {
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

impl std::fmt::Display for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let control = |f: &mut std::fmt::Formatter<'_>, word: &str, c: &Control| {
            write!(f, "{{{{{word} {}}}}}{}", c.pipe, c.list)?;
            if let Some(e) = &c.else_list {
                write!(f, "{{{{else}}}}{e}")?;
            }
            f.write_str("{{end}}")
        };
        match self {
            Node::Text(t) => f.write_str(&super::fmt::quote_go(t)),
            Node::Action(p) => write!(f, "{{{{{p}}}}}"),
            Node::If(c) => control(f, "if", c),
            Node::With(c) => control(f, "with", c),
            Node::Range(c) => control(f, "range", c),
            Node::Template(t) => match &t.pipe {
                None => write!(f, "{{{{template {}}}}}", super::fmt::quote_go(&t.name)),
                Some(p) => write!(f, "{{{{template {} {p}}}}}", super::fmt::quote_go(&t.name)),
            },
            Node::Break(_) => f.write_str("{{break}}"),
            Node::Continue(_) => f.write_str("{{continue}}"),
        }
    }
}

/// Parses `text` (named `name`) into its top-level tree and the trees it defines.
/// `has_function` says which function names exist.
pub(crate) fn parse(
    name: &str,
    text: &str,
    has_function: &dyn Fn(&str) -> bool,
) -> Result<Vec<Tree>, ParseError> {
    let text: Arc<str> = Arc::from(text);
    let parse_name: Arc<str> = Arc::from(name);
    let mut items = lex(&text);
    items.reverse();
    let mut p = Parser {
        items,
        backed: Vec::new(),
        last_line: 1,
        vars: vec!["$".to_string()],
        range_depth: 0,
        depth: 0,
        action_line: 0,
        parse_name: parse_name.clone(),
        has_function,
        trees: HashMap::new(),
        order: Vec::new(),
    };
    let root = p.parse_top()?;
    let mut trees = vec![Tree {
        name: name.to_string(),
        parse_name: parse_name.clone(),
        text: text.clone(),
        root,
    }];
    for defined in p.order {
        if let Some(list) = p.trees.remove(&defined) {
            trees.push(Tree {
                name: defined,
                parse_name: parse_name.clone(),
                text: text.clone(),
                root: list,
            });
        }
    }
    Ok(trees)
}

struct Parser<'f> {
    /// Items still to read, last first.
    items: Vec<Item>,
    /// Items put back, last first.
    backed: Vec<Item>,
    last_line: usize,
    vars: Vec<String>,
    range_depth: usize,
    depth: usize,
    action_line: usize,
    parse_name: Arc<str>,
    has_function: &'f dyn Fn(&str) -> bool,
    trees: HashMap<String, List>,
    order: Vec<String>,
}

type PResult<T> = Result<T, ParseError>;

impl Parser<'_> {
    fn next(&mut self) -> Item {
        let item = self
            .backed
            .pop()
            .or_else(|| self.items.pop())
            .unwrap_or(Item {
                kind: ItemKind::Eof,
                pos: 0,
                val: String::new(),
                line: self.last_line,
            });
        self.last_line = item.line;
        item
    }

    fn backup(&mut self, item: Item) {
        self.backed.push(item);
    }

    fn peek(&mut self) -> Item {
        let item = self.next();
        self.backup(item.clone());
        item
    }

    fn next_non_space(&mut self) -> Item {
        loop {
            let item = self.next();
            if item.kind != ItemKind::Space {
                return item;
            }
        }
    }

    fn peek_non_space(&mut self) -> Item {
        let item = self.next_non_space();
        self.backup(item.clone());
        item
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            template: self.parse_name.to_string(),
            line: self.last_line,
            message: message.into(),
        }
    }

    fn unexpected(&self, item: &Item, context: &str) -> ParseError {
        if item.kind == ItemKind::Error {
            let mut extra = String::new();
            if self.action_line != 0 && self.action_line != item.line {
                extra = format!(
                    " in action started at {}:{}",
                    self.parse_name, self.action_line
                );
                if item.val.ends_with(" action") {
                    extra = extra[" in action".len()..].to_string();
                }
            }
            return self.error(format!("{}{}", item.val, extra));
        }
        self.error(format!("unexpected {} in {}", item.describe(), context))
    }

    fn expect(&mut self, kind: ItemKind, context: &str) -> PResult<Item> {
        let item = self.next_non_space();
        if item.kind != kind {
            return Err(self.unexpected(&item, context));
        }
        Ok(item)
    }

    fn enter(&mut self) -> PResult<()> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.error(format!(
                "max expression depth exceeded (flotilla allows {MAX_NESTING} nested levels)"
            )));
        }
        Ok(())
    }

    fn parse_top(&mut self) -> PResult<List> {
        let mut root = List::default();
        while self.peek().kind != ItemKind::Eof {
            if self.peek().kind == ItemKind::LeftDelim {
                let delim = self.next();
                let word = self.next_non_space();
                if word.kind == ItemKind::Define {
                    self.parse_definition()?;
                    continue;
                }
                self.backup(word);
                self.backup(delim);
            }
            match self.text_or_action()? {
                Parsed::Node(n) => root.nodes.push(n),
                Parsed::End => return Err(self.error("unexpected {{end}}")),
                Parsed::Else(_) => return Err(self.error("unexpected {{else}}")),
            }
        }
        if let Some(item) = self.items.last().filter(|i| i.kind == ItemKind::Error) {
            return Err(self.unexpected(&item.clone(), "input"));
        }
        Ok(root)
    }

    /// Records a defined template as Go's `(*Tree).add` does: an empty definition
    /// never replaces another, two non-empty ones in the same text are an error.
    fn add_tree(&mut self, name: String, list: List) -> PResult<()> {
        let is_empty = |list: &List| {
            list.nodes.iter().all(|n| match n {
                Node::Text(t) => t.trim_matches([' ', '\t', '\r', '\n']).is_empty(),
                _ => false,
            })
        };
        match self.trees.get(&name) {
            Some(existing) => {
                if is_empty(existing) {
                    self.trees.insert(name, list);
                } else if !is_empty(&list) {
                    return Err(self.error(format!(
                        "template: multiple definition of template {}",
                        super::fmt::quote_go(&name)
                    )));
                }
            }
            None => {
                self.order.push(name.clone());
                self.trees.insert(name, list);
            }
        }
        Ok(())
    }

    fn parse_definition(&mut self) -> PResult<()> {
        const CONTEXT: &str = "define clause";
        let item = self.next_non_space();
        if !matches!(item.kind, ItemKind::String | ItemKind::RawString) {
            return Err(self.unexpected(&item, CONTEXT));
        }
        let name = unquote(&item.val).map_err(|m| self.error(m))?;
        self.expect(ItemKind::RightDelim, CONTEXT)?;
        let saved_vars = std::mem::replace(&mut self.vars, vec!["$".to_string()]);
        let (list, end) = self.item_list()?;
        self.vars = saved_vars;
        if let Parsed::Else(_) = end {
            return Err(self.error(format!("unexpected {{{{else}}}} in {CONTEXT}")));
        }
        self.add_tree(name, list)
    }

    /// A list of nodes up to `{{end}}` or `{{else}}`.
    fn item_list(&mut self) -> PResult<(List, Parsed)> {
        let mut list = List::default();
        while self.peek_non_space().kind != ItemKind::Eof {
            match self.text_or_action()? {
                Parsed::Node(n) => list.nodes.push(n),
                other => return Ok((list, other)),
            }
        }
        if let Some(item) = self.items.last().filter(|i| i.kind == ItemKind::Error) {
            return Err(self.unexpected(&item.clone(), "input"));
        }
        Err(self.error("unexpected EOF"))
    }

    fn text_or_action(&mut self) -> PResult<Parsed> {
        let item = self.next_non_space();
        match item.kind {
            ItemKind::Text => Ok(Parsed::Node(Node::Text(item.val.into_boxed_str()))),
            ItemKind::LeftDelim => {
                self.action_line = item.line;
                let result = self.action();
                self.action_line = 0;
                result
            }
            _ => Err(self.unexpected(&item, "input")),
        }
    }

    fn action(&mut self) -> PResult<Parsed> {
        let item = self.next_non_space();
        match item.kind {
            ItemKind::Block => return self.block_control().map(Parsed::Node),
            ItemKind::Break | ItemKind::Continue => {
                let word = if item.kind == ItemKind::Break {
                    "break"
                } else {
                    "continue"
                };
                let next = self.next_non_space();
                if next.kind != ItemKind::RightDelim {
                    return Err(self.unexpected(&next, &format!("{{{{{word}}}}}")));
                }
                if self.range_depth == 0 {
                    return Err(self.error(format!("{{{{{word}}}}} outside {{{{range}}}}")));
                }
                return Ok(Parsed::Node(if item.kind == ItemKind::Break {
                    Node::Break(item.pos)
                } else {
                    Node::Continue(item.pos)
                }));
            }
            ItemKind::Else => {
                let peek = self.peek_non_space();
                if matches!(peek.kind, ItemKind::If | ItemKind::With) {
                    return Ok(Parsed::Else(peek.pos));
                }
                let item = self.expect(ItemKind::RightDelim, "else")?;
                return Ok(Parsed::Else(item.pos));
            }
            ItemKind::End => {
                self.expect(ItemKind::RightDelim, "end")?;
                return Ok(Parsed::End);
            }
            ItemKind::If => return self.control("if").map(|c| Parsed::Node(Node::If(c))),
            ItemKind::Range => return self.control("range").map(|c| Parsed::Node(Node::Range(c))),
            ItemKind::With => return self.control("with").map(|c| Parsed::Node(Node::With(c))),
            ItemKind::Template => return self.template_control().map(Parsed::Node),
            _ => {}
        }
        self.backup(item);
        // Variables declared here persist until the enclosing "end".
        let pipe = self.pipeline("command", ItemKind::RightDelim)?;
        Ok(Parsed::Node(Node::Action(pipe)))
    }

    fn control(&mut self, context: &str) -> PResult<Control> {
        self.enter()?;
        let vars_mark = self.vars.len();
        let pipe = self.pipeline(context, ItemKind::RightDelim)?;
        if context == "range" {
            self.range_depth += 1;
        }
        let (list, next) = self.item_list()?;
        if context == "range" {
            self.range_depth -= 1;
        }
        let mut else_list = None;
        if let Parsed::Else(else_pos) = next {
            let peek = self.peek();
            if context == "if" && peek.kind == ItemKind::If {
                self.next();
                let inner = self.control("if")?;
                else_list = Some(List {
                    nodes: vec![Node::If(inner)],
                });
            } else if context == "with" && peek.kind == ItemKind::With {
                self.next();
                let inner = self.control("with")?;
                else_list = Some(List {
                    nodes: vec![Node::With(inner)],
                });
            } else {
                let (list, next) = self.item_list()?;
                if !matches!(next, Parsed::End) {
                    return Err(self.error("expected end; found {{else}}"));
                }
                else_list = Some(list);
            }
            let _ = else_pos;
        }
        self.vars.truncate(vars_mark);
        self.depth -= 1;
        Ok(Control {
            pos: pipe.pos,
            pipe,
            list,
            else_list,
        })
    }

    fn template_name(&mut self, item: &Item, context: &str) -> PResult<String> {
        match item.kind {
            ItemKind::String | ItemKind::RawString => unquote(&item.val).map_err(|m| self.error(m)),
            _ => Err(self.unexpected(item, context)),
        }
    }

    fn template_control(&mut self) -> PResult<Node> {
        const CONTEXT: &str = "template clause";
        let item = self.next_non_space();
        let name = self.template_name(&item, CONTEXT)?;
        let next = self.next_non_space();
        let pipe = if next.kind != ItemKind::RightDelim {
            self.backup(next);
            Some(self.pipeline(CONTEXT, ItemKind::RightDelim)?)
        } else {
            None
        };
        Ok(Node::Template(TemplateCall {
            pos: item.pos,
            name,
            pipe,
        }))
    }

    fn block_control(&mut self) -> PResult<Node> {
        const CONTEXT: &str = "block clause";
        let item = self.next_non_space();
        let name = self.template_name(&item, CONTEXT)?;
        let pipe = self.pipeline(CONTEXT, ItemKind::RightDelim)?;
        self.enter()?;
        let saved_vars = std::mem::replace(&mut self.vars, vec!["$".to_string()]);
        let saved_range = std::mem::replace(&mut self.range_depth, 0);
        let (list, end) = self.item_list()?;
        self.vars = saved_vars;
        self.range_depth = saved_range;
        self.depth -= 1;
        if let Parsed::Else(_) = end {
            return Err(self.error(format!("unexpected {{{{else}}}} in {CONTEXT}")));
        }
        self.add_tree(name.clone(), list)?;
        Ok(Node::Template(TemplateCall {
            pos: item.pos,
            name,
            pipe: Some(pipe),
        }))
    }

    fn pipeline(&mut self, context: &str, end: ItemKind) -> PResult<Pipe> {
        let first = self.peek_non_space();
        let mut pipe = Pipe {
            pos: first.pos,
            is_assign: false,
            decl: Vec::new(),
            cmds: Vec::new(),
        };
        loop {
            let v = self.peek_non_space();
            if v.kind != ItemKind::Variable {
                break;
            }
            let v = self.next_non_space();
            let after = self.peek();
            let next = self.peek_non_space();
            match next.kind {
                ItemKind::Assign | ItemKind::Declare => {
                    pipe.is_assign = next.kind == ItemKind::Assign;
                    self.next_non_space();
                    pipe.decl.push(v.val.clone());
                    self.vars.push(v.val);
                    break;
                }
                ItemKind::Char if next.val == "," => {
                    self.next_non_space();
                    pipe.decl.push(v.val.clone());
                    self.vars.push(v.val);
                    if context == "range" && pipe.decl.len() < 2 {
                        match self.peek_non_space().kind {
                            ItemKind::Variable | ItemKind::RightDelim | ItemKind::RightParen => {
                                continue;
                            }
                            _ => return Err(self.error("range can only initialize variables")),
                        }
                    }
                    return Err(self.error(format!("too many declarations in {context}")));
                }
                _ => {
                    // Not a declaration: put the variable (and the space after it) back.
                    if after.kind == ItemKind::Space {
                        // peek_non_space consumed and restored the space's follower;
                        // restore the order: variable, space, follower.
                        let follower = self.next_non_space();
                        self.backup(follower);
                        self.backup(after);
                    }
                    self.backup(v);
                    break;
                }
            }
        }
        loop {
            let item = self.next_non_space();
            if item.kind == end {
                self.check_pipeline(&pipe, context)?;
                return Ok(pipe);
            }
            match item.kind {
                ItemKind::Bool
                | ItemKind::CharConstant
                | ItemKind::Complex
                | ItemKind::Dot
                | ItemKind::Field
                | ItemKind::Identifier
                | ItemKind::Number
                | ItemKind::Nil
                | ItemKind::RawString
                | ItemKind::String
                | ItemKind::Variable
                | ItemKind::LeftParen => {
                    self.backup(item);
                    let cmd = self.command()?;
                    pipe.cmds.push(cmd);
                }
                _ => return Err(self.unexpected(&item, context)),
            }
        }
    }

    fn check_pipeline(&self, pipe: &Pipe, context: &str) -> PResult<()> {
        if pipe.cmds.is_empty() {
            return Err(self.error(format!("missing value for {context}")));
        }
        for (i, c) in pipe.cmds.iter().enumerate().skip(1) {
            if matches!(
                c.args.first(),
                Some(Arg::Bool(..) | Arg::Dot(_) | Arg::Nil(_) | Arg::Number(..) | Arg::Str { .. })
            ) {
                return Err(self.error(format!(
                    "non executable command in pipeline stage {}",
                    i + 1
                )));
            }
        }
        Ok(())
    }

    fn command(&mut self) -> PResult<Command> {
        let pos = self.peek_non_space().pos;
        let mut cmd = Command {
            pos,
            args: Vec::new(),
        };
        loop {
            self.peek_non_space();
            if let Some(operand) = self.operand()? {
                cmd.args.push(operand);
            }
            let item = self.next();
            match item.kind {
                ItemKind::Space => continue,
                ItemKind::RightDelim | ItemKind::RightParen => self.backup(item),
                ItemKind::Pipe => {}
                _ => return Err(self.unexpected(&item, "operand")),
            }
            break;
        }
        if cmd.args.is_empty() {
            return Err(self.error("empty command"));
        }
        Ok(cmd)
    }

    fn operand(&mut self) -> PResult<Option<Arg>> {
        let Some(node) = self.term()? else {
            return Ok(None);
        };
        if self.peek().kind != ItemKind::Field {
            return Ok(Some(node));
        }
        let chain_pos = self.peek().pos;
        let mut fields = Vec::new();
        while self.peek().kind == ItemKind::Field {
            let item = self.next();
            fields.push(item.val[1..].to_string());
        }
        // Go folds a chain on a field or variable into one field or variable node,
        // positioned at the first chained field.
        Ok(Some(match node {
            Arg::Field { mut idents, .. } => {
                idents.extend(fields);
                Arg::Field {
                    pos: chain_pos,
                    idents,
                }
            }
            Arg::Variable { mut idents, .. } => {
                idents.extend(fields);
                Arg::Variable {
                    pos: chain_pos,
                    idents,
                }
            }
            Arg::Bool(..) | Arg::Str { .. } | Arg::Number(..) | Arg::Nil(_) | Arg::Dot(_) => {
                return Err(self.error(format!(
                    "unexpected . after term {}",
                    super::fmt::quote_go(&quote_arg(&node))
                )));
            }
            other => Arg::Chain {
                pos: chain_pos,
                node: Box::new(other),
                fields,
            },
        }))
    }

    fn term(&mut self) -> PResult<Option<Arg>> {
        let item = self.next_non_space();
        Ok(Some(match item.kind {
            ItemKind::Identifier => {
                if !(self.has_function)(&item.val) {
                    return Err(self.error(format!(
                        "function {} not defined",
                        super::fmt::quote_go(&item.val)
                    )));
                }
                Arg::Identifier {
                    pos: item.pos,
                    name: item.val,
                }
            }
            ItemKind::Dot => Arg::Dot(item.pos),
            ItemKind::Nil => Arg::Nil(item.pos),
            ItemKind::Variable => {
                let mut idents: Vec<String> = Vec::new();
                let mut parts = item.val.split('.');
                if let Some(first) = parts.next() {
                    idents.push(first.to_string());
                }
                if !self.vars.iter().any(|v| *v == idents[0]) {
                    return Err(self.error(format!(
                        "undefined variable {}",
                        super::fmt::quote_go(&idents[0])
                    )));
                }
                Arg::Variable {
                    pos: item.pos,
                    idents,
                }
            }
            ItemKind::Field => Arg::Field {
                pos: item.pos,
                idents: vec![item.val[1..].to_string()],
            },
            ItemKind::Bool => Arg::Bool(item.pos, item.val == "true"),
            ItemKind::CharConstant | ItemKind::Number => {
                let number = parse_number(&item.val, item.kind == ItemKind::CharConstant)
                    .map_err(|m| self.error(m))?;
                Arg::Number(item.pos, number)
            }
            ItemKind::Complex => {
                return Err(self.error(format!(
                    "complex number {} is not supported by flotilla",
                    super::fmt::quote_go(&item.val)
                )));
            }
            ItemKind::LeftParen => {
                self.enter()?;
                let pipe = self.pipeline("parenthesized pipeline", ItemKind::RightParen)?;
                self.depth -= 1;
                Arg::Pipe(Box::new(pipe))
            }
            ItemKind::String | ItemKind::RawString => {
                let text = unquote(&item.val).map_err(|m| self.error(m))?;
                Arg::Str {
                    pos: item.pos,
                    text: Arc::from(text),
                    quoted: item.val.into_boxed_str(),
                }
            }
            _ => {
                self.backup(item);
                return Ok(None);
            }
        }))
    }
}

fn quote_arg(a: &Arg) -> String {
    let mut s = String::new();
    let _ = write!(s, "{a}");
    s
}

enum Parsed {
    Node(Node),
    End,
    Else(usize),
}

/// Go's `strconv.Unquote` for the template's string and raw-string constants.
pub(crate) fn unquote(s: &str) -> Result<String, String> {
    let syntax = || "invalid syntax".to_string();
    if s.len() < 2 {
        return Err(syntax());
    }
    if let Some(body) = s.strip_prefix('`').and_then(|r| r.strip_suffix('`')) {
        if body.contains('`') {
            return Err(syntax());
        }
        return Ok(body.replace('\r', ""));
    }
    let body = s
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .ok_or_else(syntax)?;
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    while !rest.is_empty() {
        if rest.starts_with('"') || rest.starts_with('\n') {
            return Err(syntax());
        }
        let (c, tail) = unquote_char(rest, '"').ok_or_else(syntax)?;
        out.push_str(&c);
        rest = tail;
    }
    Ok(out)
}

/// One (possibly escaped) character of a quoted literal: its text (`\xff` gives the
/// raw byte's replacement, as a Rust string cannot hold lone bytes) and the rest.
fn unquote_char(s: &str, quote: char) -> Option<(String, &str)> {
    let mut chars = s.chars();
    let c = chars.next()?;
    if c != '\\' {
        return Some((c.to_string(), chars.as_str()));
    }
    let e = chars.next()?;
    let rest = chars.as_str();
    let simple = match e {
        'a' => Some('\u{7}'),
        'b' => Some('\u{8}'),
        'f' => Some('\u{c}'),
        'n' => Some('\n'),
        'r' => Some('\r'),
        't' => Some('\t'),
        'v' => Some('\u{b}'),
        '\\' => Some('\\'),
        '\'' | '"' => {
            if e != quote {
                return None;
            }
            Some(e)
        }
        _ => None,
    };
    if let Some(c) = simple {
        return Some((c.to_string(), rest));
    }
    let hex = |n: usize| -> Option<(u32, &str)> {
        if rest.len() < n || !rest.is_char_boundary(n) {
            return None;
        }
        let v = u32::from_str_radix(&rest[..n], 16).ok()?;
        if !rest[..n].chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        Some((v, &rest[n..]))
    };
    match e {
        'x' => {
            let (v, tail) = hex(2)?;
            // A byte escape: only ASCII can be held in a Rust string as itself.
            let c = char::from_u32(v)?;
            Some((
                if v < 0x80 {
                    c.to_string()
                } else {
                    '\u{FFFD}'.to_string()
                },
                tail,
            ))
        }
        'u' | 'U' => {
            let (v, tail) = hex(if e == 'u' { 4 } else { 8 })?;
            Some((char::from_u32(v)?.to_string(), tail))
        }
        '0'..='7' => {
            let digits = format!("{e}{}", rest.get(..2)?);
            if !digits.chars().all(|c| ('0'..='7').contains(&c)) {
                return None;
            }
            let v = u32::from_str_radix(&digits, 8).ok()?;
            if v > 255 {
                return None;
            }
            let c = char::from_u32(v)?;
            Some((
                if v < 0x80 {
                    c.to_string()
                } else {
                    '\u{FFFD}'.to_string()
                },
                &rest[2..],
            ))
        }
        _ => None,
    }
}

/// Go's `parse.newNumber`: what the constant can be as an int, a uint and a float.
fn parse_number(text: &str, is_char: bool) -> Result<Number, String> {
    if is_char {
        let body = text
            .strip_prefix('\'')
            .and_then(|r| r.strip_suffix('\''))
            .ok_or_else(|| format!("malformed character constant: {text}"))?;
        let (c, tail) = unquote_char(body, '\'')
            .ok_or_else(|| format!("malformed character constant: {text}"))?;
        if !tail.is_empty() || body.starts_with('\'') {
            return Err(format!("malformed character constant: {text}"));
        }
        let rune = c.chars().next().map(|c| c as i64).unwrap_or(0);
        return Ok(Number {
            text: text.to_string(),
            int: Some(rune),
            is_uint: true,
            float: Some(rune as f64),
        });
    }
    let uint = parse_go_uint(text);
    let int = parse_go_int(text);
    let mut number = Number {
        text: text.to_string(),
        int,
        is_uint: uint.is_some(),
        float: None,
    };
    if let Some(i) = int {
        number.float = Some(i as f64);
    } else if let Some(u) = uint {
        number.float = Some(u as f64);
    } else {
        let Some(f) = parse_go_float(text) else {
            return Err(format!(
                "illegal number syntax: {}",
                super::fmt::quote_go(text)
            ));
        };
        if !text.contains(['.', 'e', 'E', 'p', 'P']) {
            return Err(format!("integer overflow: {}", super::fmt::quote_go(text)));
        }
        number.float = Some(f);
        if number.int.is_none() && f.fract() == 0.0 && f.abs() < 9.2e18 {
            number.int = Some(f as i64);
        }
        if !number.is_uint && f >= 0.0 && f.fract() == 0.0 && f < 1.8e19 {
            number.is_uint = true;
        }
    }
    Ok(number)
}

/// Digits with Go's underscore rule: only between digits (or after a base prefix).
fn strip_underscores(digits: &str, prefixed: bool) -> Option<String> {
    if digits.is_empty() {
        return None;
    }
    let bytes = digits.as_bytes();
    let mut prev_digit = prefixed;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'_' {
            if !prev_digit || i + 1 == bytes.len() || bytes[i + 1] == b'_' {
                return None;
            }
            prev_digit = false;
        } else {
            prev_digit = true;
        }
    }
    Some(digits.replace('_', ""))
}

/// Go's `strconv.ParseUint(text, 0, 64)`.
fn parse_go_uint(text: &str) -> Option<u64> {
    let lower = text.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(r) = lower.strip_prefix("0x") {
        (16, r, true)
    } else if let Some(r) = lower.strip_prefix("0o") {
        (8, r, true)
    } else if let Some(r) = lower.strip_prefix("0b") {
        (2, r, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    let clean = strip_underscores(digits, prefixed)?;
    if clean.starts_with(['+', '-']) {
        return None;
    }
    u64::from_str_radix(&clean, radix).ok()
}

/// Go's `strconv.ParseInt(text, 0, 64)`.
fn parse_go_int(text: &str) -> Option<i64> {
    let (neg, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude = parse_go_uint(body)?;
    if neg {
        if magnitude <= i64::MAX as u64 + 1 {
            Some((magnitude as i128).wrapping_neg() as i64)
        } else {
            None
        }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's `strconv.ParseFloat(text, 64)` for decimal and hexadecimal literals.
fn parse_go_float(text: &str) -> Option<f64> {
    let (neg, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = body.to_ascii_lowercase();
    let value = if let Some(hex) = lower.strip_prefix("0x") {
        let (mantissa, exp) = hex.split_once('p')?;
        let exp: i32 = strip_underscores(exp.trim_start_matches(['+', '-']), false)?
            .parse::<i32>()
            .ok()
            .map(|e| if exp.starts_with('-') { -e } else { e })?;
        let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let int_clean = if int_part.is_empty() {
            String::new()
        } else {
            strip_underscores(int_part, true)?
        };
        let mut v = 0f64;
        for c in int_clean.chars().chain(frac_part.chars()) {
            v = v * 16.0 + f64::from(c.to_digit(16)?);
        }
        v * 2f64.powi(exp - 4 * frac_part.len() as i32)
    } else {
        let clean = strip_underscores(&lower, false)?;
        if clean.contains(['x', 'p']) || clean.starts_with(['+', '-']) {
            return None;
        }
        clean.parse::<f64>().ok()?
    };
    Some(if neg { -value } else { value })
}
