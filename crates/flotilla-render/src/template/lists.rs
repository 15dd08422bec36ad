//! Joining lists within the template fuel.
//!
//! minijinja 3.1 joins lists lazily and charges nothing for it: `l + l` makes a
//! node that refers to `l` twice, the `chain` filter and `sum(start=[])` do the same,
//! and once such nodes nest 32 deep minijinja copies the whole list (or walks every
//! node) in one step, without fuel. Doubling a list 34 times (`{% set l = l + l %}`)
//! then asks for billions of items and the render runs out of memory; doubling an
//! empty list walks billions of nodes. minijinja has no hook into `+`, so flotilla
//! makes the three itself:
//!
//! - [`rewrite`] turns every `a + b` of a template's source into `__flotilla_add(a,
//!   b)` before the template is compiled, a chain `a + b - c + d` into one call with
//!   a marker before what is subtracted (the same lines; only columns move, and [`Rewritten::original_range`] maps an error's
//!   place back to the text its author wrote);
//! - [`add`] adds from the left, joining two lists into a new list, refusing before it starts when the fuel
//!   left would not pay for the items, and charging for every item it copies; any
//!   other `+` is minijinja's own;
//! - [`chain`] and [`sum`] do the same for those filters.
//!
//! A joined list is a plain list, as in Jinja2 (indexable, `is sequence`); minijinja's
//! lazy join was an iterable. Appending in a loop (`l = l + [x]`) copies the list
//! each time, as Jinja2 does, and pays for it.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::LazyLock;

use minijinja::machinery::{Token, ast, parse, tokenize};
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Expression, State, UndefinedBehavior};

/// The function every `+` becomes. A template that names it is refused (it is
/// flotilla's, and a template defining its own would escape the fuel).
pub(super) const ADD: &str = "__flotilla_add";

/// Marks, among the arguments of [`ADD`], that the next operand is subtracted (`a +
/// b - c + d` is one call: `__flotilla_add(a, b, __flotilla_minus, c, d)`).
pub(super) const MINUS: &str = "__flotilla_minus";

/// The names flotilla gives templates; a template that uses one is refused.
const RESERVED: &str = "__flotilla_";

/// The value of [`MINUS`].
#[derive(Debug)]
pub(super) struct Minus;

impl minijinja::value::Object for Minus {}

/// A template's source with every `+` made a call of [`ADD`].
#[derive(Debug, Clone)]
pub(crate) struct Rewritten {
    /// The text compiled.
    pub source: String,
    /// Where each edit is: (offset in `source`, offset in the original, bytes it
    /// wrote, bytes of the original it replaced), in order.
    edits: Vec<(usize, usize, usize, usize)>,
    /// Each chain of additions of the original (`a + b + c`, one call): its range
    /// and the range of each operand.
    chains: Vec<(Range<usize>, Vec<Range<usize>>)>,
}

impl Rewritten {
    /// The range of the original source that `range` of [`Rewritten::source`]
    /// comes from.
    pub fn original_range(&self, range: Range<usize>) -> Range<usize> {
        self.original_offset(range.start)..self.original_offset(range.end)
    }

    /// Where `failed` happened in the chain of additions at `range` of the original
    /// source: the range of the chain up to the addition that failed (as minijinja
    /// quotes its own `+`), and the text of the undefined operand if one was.
    pub fn failed_addition(
        &self,
        original: &str,
        range: Range<usize>,
        failed: &AddFailed,
    ) -> Option<(Range<usize>, Option<String>)> {
        let (at, operands) = self.chains.iter().find(|(at, _)| *at == range)?;
        // A chain of several calls counts its steps from the start of each call.
        if operands.len() > CHAIN_LINKS + 1 {
            return None;
        }
        let upto = at.start..operands.get(failed.step)?.end;
        let undefined = failed.undefined.and_then(|index| {
            Some(
                original
                    .get(operands.get(index)?.clone())?
                    .trim()
                    .to_string(),
            )
        });
        Some((upto, undefined))
    }

    /// The offset of the original that `offset` of the rewritten source comes from:
    /// inside text an edit wrote, where that edit is.
    fn original_offset(&self, offset: usize) -> usize {
        let (mut rewritten, mut original) = (0, 0);
        for &(at, at_original, wrote, replaced) in &self.edits {
            if offset < at {
                break;
            }
            if offset < at + wrote {
                return at_original;
            }
            (rewritten, original) = (at + wrote, at_original + replaced);
        }
        original + (offset - rewritten)
    }
}

/// Why a template cannot be rewritten.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub line: usize,
    pub message: String,
}

impl Refusal {
    /// The refusal as the template's error, at its file and line.
    pub fn diagnostic(&self, path: &str) -> flotilla_core::diagnostic::Diagnostic {
        flotilla_core::diagnostic::Diagnostic::error(format!("template error: {}", self.message))
            .in_file(path)
            .at_line(Some(self.line as u64))
    }
}

/// A template [`rewrite`] left as it was because it did not parse, yet the engine
/// compiled: refused if it has a `+`, which would be free of fuel (the parser and the
/// engine read templates alike, so this is not known to happen).
pub(crate) fn unrewritten_plus(
    source: &str,
    syntax: minijinja::syntax::SyntaxConfig,
) -> Option<Refusal> {
    if !source.contains('+') {
        return None;
    }
    first_plus(source, syntax).map(unaccounted)
}

/// The template's source with every `+` a call of [`ADD`]; `Ok(None)` when it has no
/// `+` or does not parse (compiling it then reports the syntax error as its author
/// wrote it).
pub(crate) fn rewrite(
    name: &str,
    source: &str,
    syntax: minijinja::syntax::SyntaxConfig,
) -> Result<Option<Rewritten>, Refusal> {
    if let Some(at) = source.find(RESERVED) {
        return Err(Refusal {
            line: source[..at].matches('\n').count() + 1,
            message: format!(
                "names that begin with `{RESERVED}` are flotilla's own; a template may not \
                 use them"
            ),
        });
    }
    if !source.contains('+') {
        return Ok(None);
    }
    let Ok(tree) = parse(source, name, syntax.clone()) else {
        return Ok(None);
    };
    let mut adds = Vec::new();
    walk_stmt(&tree, 0, &mut adds);
    // The bracket depth before every token, and where the `+` tokens are: an
    // addition's operator is the last `+` inside its span at the depth of the span's
    // first token (its right operand binds tighter than `+` and holds none outside
    // brackets; minijinja has no unary `+`).
    let mut starts = Vec::new();
    let mut depth = 0usize;
    for token in tokenize(source, false, syntax.clone()) {
        let Ok((token, span)) = token else {
            // It parsed, so it tokenizes: compiled as it is, its `+` would be free.
            return Err(unaccounted(1));
        };
        let kind = match token {
            Token::Plus => Op::Plus,
            Token::Minus => Op::Minus,
            _ => Op::Other,
        };
        starts.push((span.start_offset as usize, depth, kind));
        match token {
            Token::ParenOpen | Token::BracketOpen | Token::BraceOpen => depth += 1,
            Token::ParenClose | Token::BracketClose | Token::BraceClose => {
                depth = depth.saturating_sub(1)
            }
            _ => {}
        }
    }
    let mut edits: Vec<Edit> = Vec::new();
    let mut chains = Vec::with_capacity(adds.len());
    for add in &adds {
        let first = starts.partition_point(|&(at, _, _)| at < add.start);
        let Some(&(at, depth_at_start, _)) = starts.get(first) else {
            return Err(unfound(add.line));
        };
        if at != add.start {
            return Err(unfound(add.line));
        }
        // The operator of each link, from the last one. A `+`: the last `+` at the
        // chain's depth before where the link ends (its right operand holds none
        // outside brackets). A `-` (its left operand an operation, whose span ends
        // where that operation does): the first token at the chain's depth after that
        // end (a `-` inside its right operand may be a negation, so the last one is
        // not it).
        let mut operators = Vec::with_capacity(add.links.len());
        for &(end, minus) in &add.links {
            let operator = match minus {
                // Past the closing brackets its span may leave out (`(a in b) - c`).
                Some(left_end) => starts[starts.partition_point(|&(at, _, _)| at < left_end)..]
                    .iter()
                    .find(|&&(_, depth, _)| depth <= depth_at_start)
                    .filter(|&&(_, depth, op)| op == Op::Minus && depth == depth_at_start)
                    .map(|&(at, _, _)| at),
                None => {
                    let last = starts.partition_point(|&(at, _, _)| at < end);
                    starts[first..last]
                        .iter()
                        .rev()
                        .find(|&&(_, depth, op)| op == Op::Plus && depth == depth_at_start)
                        .map(|&(at, _, _)| at)
                }
            };
            match operator {
                Some(operator) if operators.last().is_none_or(|&(later, _)| operator < later) => {
                    operators.push((operator, minus.is_some()))
                }
                _ => return Err(unfound(add.line)),
            }
        }
        operators.reverse();
        let end = add.links[0].0;
        let mut operands = Vec::with_capacity(operators.len() + 1);
        let mut from = add.start;
        for (index, &(operator, minus)) in operators.iter().enumerate() {
            operands.push(from..operator);
            from = operator + 1;
            // minijinja takes at most 2,000 arguments in a call: a longer chain is
            // calls of CHAIN_LINKS additions each, the one before the first argument
            // of the next.
            let closes = index > 0 && index % CHAIN_LINKS == 0;
            edits.push(Edit::operator(operator, closes, minus));
        }
        operands.push(from..end);
        chains.push((add.start..end, operands));
        edits.push(Edit::open(
            add.start,
            add.depth,
            1 + operators.len().saturating_sub(1) / CHAIN_LINKS,
        ));
        edits.push(Edit::close(end, add.depth));
    }
    edits.sort_by_key(|edit| (edit.at, edit.rank));
    let mut out = String::with_capacity(source.len() + adds.len() * (ADD.len() + 2));
    let mut map = Vec::with_capacity(edits.len());
    let mut copied = 0;
    for edit in &edits {
        // Two edits of one byte would mean two additions found the same `+`.
        let Some(text) = source.get(copied..edit.at) else {
            return Err(unaccounted(
                source[..edit.at.min(source.len())].matches('\n').count() + 1,
            ));
        };
        out.push_str(text);
        copied = edit.at;
        let before = out.len();
        out.push_str(&edit.text);
        copied += edit.removes;
        map.push((before, edit.at, edit.text.len(), edit.removes));
    }
    out.push_str(&source[copied..]);
    // Every `+` token is an addition (minijinja has no unary `+`): none may be left.
    if let Some(line) = first_plus(&out, syntax) {
        return Err(unaccounted(line));
    }
    if edits.is_empty() {
        return Ok(None);
    }
    Ok(Some(Rewritten {
        source: out,
        edits: map,
        chains,
    }))
}

/// An addition at `line` whose `+` [`rewrite`] did not find (none is known).
fn unfound(line: usize) -> Refusal {
    Refusal {
        line,
        message: "flotilla could not find the `+` of this addition; write the addition \
                  another way"
            .to_string(),
    }
}

/// A `+` at `line` that [`rewrite`] could not make a call (none is known).
fn unaccounted(line: usize) -> Refusal {
    Refusal {
        line,
        message: "flotilla could not make this `+` one it charges fuel for; write the \
                  addition another way"
            .to_string(),
    }
}

/// The line of the first `+` token of `source`, if it has one.
fn first_plus(source: &str, syntax: minijinja::syntax::SyntaxConfig) -> Option<usize> {
    tokenize(source, false, syntax)
        .map_while(Result::ok)
        .find(|(token, _)| matches!(token, Token::Plus))
        .map(|(_, span)| span.start_line as usize)
}

/// A chain of additions of the source (`a + b - c + d`: each link an addition, or a
/// subtraction whose left operand is an operation too, the left operand of each the
/// link before unless in parentheses; the last link an addition), made one call of
/// [`ADD`] so that a long chain nests no calls: where it starts, where each link
/// ends and, for a subtraction, where its left operand ends (the last link first),
/// its line, and how many chains enclose it.
struct Addition {
    start: usize,
    links: Vec<(usize, Option<usize>)>,
    line: usize,
    depth: usize,
}

/// What a token is, for finding the operators of a chain.
#[derive(Clone, Copy, PartialEq)]
enum Op {
    Plus,
    Minus,
    Other,
}

/// The most additions one call of [`ADD`] makes.
const CHAIN_LINKS: usize = 500;

/// One change to the source, applied in order of `(at, rank)`.
struct Edit {
    at: usize,
    /// At one offset: closing parentheses first (innermost first), then the
    /// operator, then opening calls (outermost first).
    rank: (u8, isize),
    removes: usize,
    text: String,
}

impl Edit {
    fn open(at: usize, depth: usize, calls: usize) -> Edit {
        Edit {
            at,
            rank: (2, depth as isize),
            removes: 0,
            // After a space: glued to a keyword before it (`not(a)+b`), the name
            // would be read as part of it.
            text: format!(" {ADD}(").repeat(calls),
        }
    }

    fn operator(at: usize, closes_a_call: bool, minus: bool) -> Edit {
        let close = if closes_a_call { ")" } else { "" };
        let text = if minus {
            format!("{close}, {MINUS},")
        } else {
            format!("{close},")
        };
        Edit {
            at,
            rank: (1, 0),
            removes: 1,
            text,
        }
    }

    fn close(at: usize, depth: usize) -> Edit {
        Edit {
            at,
            rank: (0, -(depth as isize)),
            removes: 0,
            text: ")".to_string(),
        }
    }
}

fn walk_stmts(stmts: &[ast::Stmt<'_>], depth: usize, adds: &mut Vec<Addition>) {
    for stmt in stmts {
        walk_stmt(stmt, depth, adds);
    }
}

fn walk_stmt(stmt: &ast::Stmt<'_>, depth: usize, adds: &mut Vec<Addition>) {
    use ast::Stmt;
    let mut expr = |e: &ast::Expr<'_>| walk_expr(e, depth, adds);
    match stmt {
        Stmt::Template(s) => walk_stmts(&s.children, depth, adds),
        Stmt::EmitExpr(s) => expr(&s.expr),
        Stmt::EmitRaw(_) => {}
        Stmt::ForLoop(s) => {
            expr(&s.target);
            expr(&s.iter);
            if let Some(filter) = &s.filter_expr {
                expr(filter);
            }
            walk_stmts(&s.body, depth, adds);
            walk_stmts(&s.else_body, depth, adds);
        }
        Stmt::IfCond(s) => {
            expr(&s.expr);
            walk_stmts(&s.true_body, depth, adds);
            walk_stmts(&s.false_body, depth, adds);
        }
        Stmt::WithBlock(s) => {
            for (target, value) in &s.assignments {
                expr(target);
                expr(value);
            }
            walk_stmts(&s.body, depth, adds);
        }
        Stmt::Set(s) => {
            expr(&s.target);
            expr(&s.expr);
        }
        Stmt::SetBlock(s) => {
            expr(&s.target);
            if let Some(filter) = &s.filter {
                expr(filter);
            }
            walk_stmts(&s.body, depth, adds);
        }
        Stmt::AutoEscape(s) => {
            expr(&s.enabled);
            walk_stmts(&s.body, depth, adds);
        }
        Stmt::FilterBlock(s) => {
            expr(&s.filter);
            walk_stmts(&s.body, depth, adds);
        }
        Stmt::Block(s) => walk_stmts(&s.body, depth, adds),
        Stmt::Import(s) => {
            expr(&s.expr);
            expr(&s.name);
        }
        Stmt::FromImport(s) => {
            expr(&s.expr);
            for (name, alias) in &s.names {
                expr(name);
                if let Some(alias) = alias {
                    expr(alias);
                }
            }
        }
        Stmt::Extends(s) => expr(&s.name),
        Stmt::Include(s) => expr(&s.name),
        Stmt::Macro(s) => walk_macro(s, depth, adds),
        Stmt::CallBlock(s) => {
            walk_call(&s.call, depth, adds);
            walk_macro(&s.macro_decl, depth, adds);
        }
        Stmt::Do(s) => walk_call(&s.call, depth, adds),
        // `continue`, `break` (minijinja's loop_controls) and any statement a later
        // minijinja adds: an addition they hold is caught by the check of `rewrite`.
        #[allow(unreachable_patterns)]
        _ => {}
    }
}

fn walk_macro(m: &ast::Macro<'_>, depth: usize, adds: &mut Vec<Addition>) {
    for e in m.args.iter().chain(&m.defaults) {
        walk_expr(e, depth, adds);
    }
    walk_stmts(&m.body, depth, adds);
}

fn walk_call(call: &ast::Call<'_>, depth: usize, adds: &mut Vec<Addition>) {
    walk_expr(&call.expr, depth, adds);
    walk_args(&call.args, depth, adds);
}

fn walk_args(args: &[ast::CallArg<'_>], depth: usize, adds: &mut Vec<Addition>) {
    for arg in args {
        match arg {
            ast::CallArg::Pos(e)
            | ast::CallArg::Kwarg(_, e)
            | ast::CallArg::PosSplat(e)
            | ast::CallArg::KwargSplat(e) => walk_expr(e, depth, adds),
        }
    }
}

fn walk_expr(expr: &ast::Expr<'_>, depth: usize, adds: &mut Vec<Addition>) {
    use ast::Expr;
    match expr {
        Expr::Var(_) | Expr::Const(_) => {}
        Expr::Slice(e) => {
            walk_expr(&e.expr, depth, adds);
            for part in [&e.start, &e.stop, &e.step].into_iter().flatten() {
                walk_expr(part, depth, adds);
            }
        }
        Expr::UnaryOp(e) => walk_expr(&e.expr, depth, adds),
        Expr::BinOp(e) if matches!(e.op, ast::BinOpKind::Add) => {
            let span = e.span();
            let start = span.start_offset;
            let mut links = vec![(span.end_offset as usize, None)];
            let mut rights = vec![&e.right];
            let mut left = &e.left;
            while let Expr::BinOp(inner) = left
                && inner.span().start_offset == start
            {
                let minus = match (inner.op, &inner.left) {
                    (ast::BinOpKind::Add, _) => None,
                    // A subtraction whose left operand is itself an operation (whose
                    // span ends where its own does): its `-` is the token there. One
                    // whose left operand is not stays the chain's first operand.
                    (ast::BinOpKind::Sub, Expr::BinOp(before))
                        if before.span().start_offset == start =>
                    {
                        Some(before.span().end_offset as usize)
                    }
                    _ => break,
                };
                links.push((inner.span().end_offset as usize, minus));
                rights.push(&inner.right);
                left = &inner.left;
            }
            adds.push(Addition {
                start: start as usize,
                links,
                line: span.start_line as usize,
                depth,
            });
            walk_expr(left, depth + 1, adds);
            for right in rights {
                walk_expr(right, depth + 1, adds);
            }
        }
        Expr::BinOp(e) => {
            walk_expr(&e.left, depth, adds);
            walk_expr(&e.right, depth, adds);
        }
        Expr::Compare(e) => {
            walk_expr(&e.expr, depth, adds);
            for op in &e.ops {
                walk_expr(&op.expr, depth, adds);
            }
        }
        Expr::IfExpr(e) => {
            walk_expr(&e.test_expr, depth, adds);
            walk_expr(&e.true_expr, depth, adds);
            if let Some(e) = &e.false_expr {
                walk_expr(e, depth, adds);
            }
        }
        Expr::Filter(e) => {
            if let Some(inner) = &e.expr {
                walk_expr(inner, depth, adds);
            }
            walk_args(&e.args, depth, adds);
        }
        Expr::Test(e) => {
            walk_expr(&e.expr, depth, adds);
            walk_args(&e.args, depth, adds);
        }
        Expr::GetAttr(e) => walk_expr(&e.expr, depth, adds),
        Expr::GetItem(e) => {
            walk_expr(&e.expr, depth, adds);
            walk_expr(&e.subscript_expr, depth, adds);
        }
        Expr::Call(e) => walk_call(e, depth, adds),
        Expr::List(e) => e.items.iter().for_each(|i| walk_expr(i, depth, adds)),
        Expr::Tuple(e) => e.items.iter().for_each(|i| walk_expr(i, depth, adds)),
        Expr::Map(e) => {
            for item in e.keys.iter().chain(&e.values) {
                walk_expr(item, depth, adds);
            }
        }
    }
}

/// A list that [`add`], [`chain`] and [`sum`] join themselves: a sequence or an
/// iterable, not a tuple (minijinja joins tuples eagerly, and charges for it).
fn is_list(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable) && !value.is_tuple()
}

/// Fuel for one item copied: minijinja charges half a fuel to visit an item and half
/// a fuel for its slot in a new list.
const FUEL_PER_ITEM: u64 = 1;

/// Refuses, before anything is copied, to join `items` when the fuel left would not
/// pay for them.
fn ensure_fuel(state: &State, items: usize) -> Result<(), Error> {
    if let Some((_, remaining)) = state.fuel_levels()
        && (items as u64).saturating_mul(FUEL_PER_ITEM) > remaining
    {
        return Err(Error::new(
            ErrorKind::OutOfFuel,
            format!("joining lists of {items} items needs more fuel than is left"),
        ));
    }
    Ok(())
}

/// The items of `parts` in one new list, paid for with fuel: refused at once when
/// their number is known and the fuel left would not pay, else charged as they are
/// copied. A map contributes its keys, as when it is iterated.
fn join(state: &State, parts: &[Value]) -> Result<Value, Error> {
    let known = parts
        .iter()
        .try_fold(0usize, |sum, part| sum.checked_add(part.len()?));
    if let Some(items) = known {
        ensure_fuel(state, items)?;
    }
    let mut items = Vec::with_capacity(known.unwrap_or(0).min(1024));
    for part in parts {
        for item in part.try_iter()?.checked() {
            state.consume_fuel(FUEL_PER_ITEM)?;
            items.push(item?);
        }
    }
    Ok(Value::from(items))
}

/// An environment of its own to evaluate minijinja's `+` in, for what is not two
/// lists (numbers, strings, tuples): minijinja does not offer the operation to
/// Rust code otherwise.
static PLAIN: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env
});

static PLAIN_ADD: LazyLock<Expression<'static, 'static>> = LazyLock::new(|| {
    PLAIN
        .compile_expression("a + b")
        .expect("`a + b` is an expression")
});

/// `a + b + …` in a template (see [`rewrite`]): added from the left, two lists
/// joined within the fuel ([`join`]), anything else as minijinja adds it.
pub(super) fn add(state: &State, operands: Rest<Value>) -> Result<Value, Error> {
    let mut operands = operands.0.into_iter().peekable();
    let mut sum = operands
        .next()
        .ok_or_else(|| Error::from(ErrorKind::MissingArgument))?;
    let mut step = 0;
    while let Some(mut operand) = operands.next() {
        let minus = operand.downcast_object_ref::<Minus>().is_some();
        if minus {
            operand = operands
                .next()
                .ok_or_else(|| Error::from(ErrorKind::MissingArgument))?;
        }
        step += 1;
        let undefined = if sum.is_undefined() {
            Some(0)
        } else {
            operand.is_undefined().then_some(step)
        };
        let done = if minus {
            subtract(sum, operand)
        } else {
            add_two(state, sum, operand)
        };
        sum = done.map_err(|err| match err.kind() {
            ErrorKind::InvalidOperation => err.with_source(AddFailed { step, undefined }),
            _ => err,
        })?;
        // The engine charges for the value a call returns; a sum made on the way is
        // charged here, as minijinja charges each of its own `+`.
        if operands.peek().is_some() {
            charge_made(state, &sum)?;
        }
    }
    Ok(sum)
}

static PLAIN_SUB: LazyLock<Expression<'static, 'static>> = LazyLock::new(|| {
    PLAIN
        .compile_expression("a - b")
        .expect("`a - b` is an expression")
});

/// `a - b` in a chain of additions, as minijinja subtracts: two integers of i64's
/// range or floats here, anything else by minijinja itself (a subtraction makes no
/// list or string, so it costs no more than the value it returns).
fn subtract(a: Value, b: Value) -> Result<Value, Error> {
    if let (Some(x), Some(y)) = (small_int(&a), small_int(&b)) {
        return Ok(int_value(i128::from(x) - i128::from(y)));
    }
    if a.is_undefined() || b.is_undefined() {
        return Err(unsupported('-', &a, &b));
    }
    minijinjas(&PLAIN_SUB, a, b)
}

/// An integer of i64's range, as minijinja keeps most.
fn small_int(value: &Value) -> Option<i64> {
    value.is_integer().then(|| value.as_i64()).flatten()
}

/// An integer result as minijinja makes it: an i64 where it fits, else an i128.
fn int_value(n: i128) -> Value {
    match i64::try_from(n) {
        Ok(n) => Value::from(n),
        Err(_) => Value::from(n),
    }
}

/// minijinja's error for `op` on operands it cannot combine (one undefined, here),
/// which the engine completes with the undefined operand's name; here the operand's
/// text is added where the error is described ([`AddFailed`]).
fn unsupported(op: char, a: &Value, b: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tried to use {op} operator on unsupported types {} and {}",
            a.kind(),
            b.kind()
        ),
    )
}

/// `expression` (`a + b` or `a - b`) evaluated by minijinja, its error without the
/// helper's place, so that the engine places it at the template's operator.
fn minijinjas(
    expression: &Expression<'static, 'static>,
    a: Value,
    b: Value,
) -> Result<Value, Error> {
    expression
        .eval(minijinja::context! { a => a, b => b })
        .map_err(|err| match err.detail() {
            Some(detail) => Error::new(err.kind(), detail.to_string()),
            None => Error::from(err.kind()),
        })
}

/// Charges for a string or tuple made by an addition whose value is not returned to
/// the engine (which charges what it is given): a byte of string, or half a fuel an
/// item, as minijinja charges its own. Joined lists were paid for as they were made.
fn charge_made(state: &State, value: &Value) -> Result<(), Error> {
    if let Some(text) = value.as_str() {
        state.consume_fuel(text.len() as u64 / 64)
    } else if value.is_tuple() {
        state.consume_fuel(value.len().unwrap_or(0) as u64 / 2)
    } else {
        Ok(())
    }
}

/// `a + b`.
fn add_two(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    if is_list(&a) && is_list(&b) {
        return join(state, &[a, b]);
    }
    // minijinja joins two tuples eagerly and refuses one the fuel left would not pay
    // for; the helper below runs without fuel, so refuse it here.
    if a.is_tuple() && b.is_tuple() {
        ensure_fuel(
            state,
            a.len().unwrap_or(0).saturating_add(b.len().unwrap_or(0)) / 2,
        )?;
    }
    // The string or number minijinja makes is charged by the calling template as the
    // value a function returns; a too large one is refused before it is made, as
    // minijinja refuses it.
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        let bytes = (x.len() as u64).saturating_add(y.len() as u64);
        if let Some((_, remaining)) = state.fuel_levels()
            && bytes / 64 > remaining
        {
            return Err(Error::new(
                ErrorKind::OutOfFuel,
                format!("a string of {bytes} bytes needs more fuel than is left"),
            ));
        }
    }
    // Numbers and plain strings, the additions of most templates, made here as
    // minijinja makes them (integers in i128, a result that fits i64 as one; an
    // integer and a float as floats): the general way below is much slower.
    if let Some(sum) = plain_sum(&a, &b) {
        return Ok(sum);
    }
    if a.is_undefined() || b.is_undefined() {
        return Err(unsupported('+', &a, &b));
    }
    minijinjas(&PLAIN_ADD, a, b)
}

/// `a + b` for two integers of i64's range, two floats, an integer and a float, or
/// two strings neither of which is marked safe; `None` for anything else.
fn plain_sum(a: &Value, b: &Value) -> Option<Value> {
    let float = |v: &Value| {
        (v.is_number() && !v.is_integer())
            .then(|| f64::try_from(v.clone()).ok())
            .flatten()
    };
    if let (Some(x), Some(y)) = (small_int(a), small_int(b)) {
        return Some(int_value(i128::from(x) + i128::from(y)));
    }
    let number = |v: &Value| float(v).or_else(|| small_int(v).map(|x| x as f64));
    if (float(a).is_some() || float(b).is_some())
        && let (Some(x), Some(y)) = (number(a), number(b))
    {
        return Some(Value::from(x + y));
    }
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str())
        && a.kind() == ValueKind::String
        && b.kind() == ValueKind::String
        && !a.is_safe()
        && !b.is_safe()
    {
        return Some(Value::from([x, y].concat()));
    }
    None
}

/// An addition of a chain failed: which one (1 for the first `+`), and which
/// operand was undefined if one was (0 for the first).
#[derive(Debug, thiserror::Error)]
#[error("addition {step} of its chain failed")]
pub(crate) struct AddFailed {
    pub step: usize,
    pub undefined: Option<usize>,
}

/// minijinja's `chain` (a list of the items of every argument; maps chained with maps
/// are one map in which the last one holding a key wins), made eagerly and within the
/// fuel: minijinja's lazy chain can nest and be walked for nothing.
pub(super) fn chain(state: &State, value: Value, others: Rest<Value>) -> Result<Value, Error> {
    let mut parts = Vec::with_capacity(others.len() + 1);
    parts.push(value);
    parts.extend(others.iter().cloned());
    if parts.iter().all(|part| part.kind() == ValueKind::Map) {
        let entries = parts
            .iter()
            .try_fold(0usize, |sum, part| sum.checked_add(part.len().unwrap_or(0)));
        ensure_fuel(state, entries.unwrap_or(usize::MAX).saturating_mul(2))?;
        let mut merged = BTreeMap::new();
        for part in &parts {
            for key in part.try_iter()?.checked() {
                let key = key?;
                state.consume_fuel(2 * FUEL_PER_ITEM)?;
                let value = part.get_item(&key)?;
                // minijinja's chained maps look a key up from the last map back and
                // skip a map whose value for it is undefined.
                if !value.is_undefined() {
                    merged.insert(key, value);
                } else {
                    merged.entry(key).or_insert(Value::UNDEFINED);
                }
            }
        }
        return Ok(Value::from(merged));
    }
    join(state, &parts)
}

/// The value at `path` (`a.b.0`) of `value`, undefined where a step is missing, as
/// minijinja's `sum` and `map` look an attribute up.
fn path_of(value: &Value, path: &str) -> Value {
    let mut at = value.clone();
    for part in path.split('.') {
        let next = match part.parse::<usize>() {
            Ok(index) => at.get_item(&Value::from(index)).ok(),
            Err(_) => at.get_attr(part).ok(),
        };
        match next {
            Some(next) if !next.is_undefined() => at = next,
            _ => return Value::UNDEFINED,
        }
    }
    at
}

/// minijinja's `sum`. From a number (the default) it is minijinja's own; from
/// anything else (`sum(start=[])`, `sum(start='')`) the items are added with
/// flotilla's `+` ([`add`]), each sum on the way charged, and lists are joined in one
/// step when every item is one.
pub(super) fn sum(
    state: &State,
    values: Value,
    attribute: Option<&str>,
    start: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let attribute = match attribute {
        Some(attribute) => Some(attribute.to_string()),
        None => kwargs.get::<Option<&str>>("attribute")?.map(str::to_string),
    };
    let start = match start {
        Some(start) => start,
        None => kwargs
            .get::<Option<Value>>("start")?
            .unwrap_or(Value::from(0)),
    };
    kwargs.assert_all_used()?;
    if start.is_number() {
        return minijinja::filters::sum(
            state,
            values,
            attribute.as_deref(),
            Some(start),
            Kwargs::from_iter(std::iter::empty::<(&str, Value)>()),
        );
    }
    let mut parts = vec![start];
    for item in values.try_iter()?.checked() {
        state.consume_fuel(FUEL_PER_ITEM)?;
        let item = item?;
        let item = match &attribute {
            Some(path) => path_of(&item, path),
            None => item,
        };
        if !item.is_undefined() {
            parts.push(item);
        }
    }
    if parts.iter().all(is_list) {
        return join(state, &parts);
    }
    let mut parts = parts.into_iter().peekable();
    let mut sum = parts.next().unwrap_or_default();
    while let Some(part) = parts.next() {
        sum = add_two(state, sum, part)?;
        if parts.peek().is_some() {
            charge_made(state, &sum)?;
        }
    }
    Ok(sum)
}
