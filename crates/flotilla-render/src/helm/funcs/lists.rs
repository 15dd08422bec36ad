//! Sprig's list functions. Go's `append` and friends never change their argument:
//! each returns a new list, as here.

use super::args::{
    arity, arity_at_least, check_list_len, deep_equal, int_param, is_empty, kind_of,
    nil_dereference, slice_items, string_list, to_int64,
};
use super::strings::strslice;
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

/// The items of the list argument of a Sprig list function, or Sprig's error naming
/// the operation (`Cannot push on type string`). A nil makes Go's reflection panic.
fn list_arg(v: &Value, operation: &str) -> Result<Vec<Value>, FuncError> {
    match v {
        Value::Nil | Value::Missing => Err(nil_dereference()),
        other => slice_items(other)
            .ok_or_else(|| FuncError::new(format!("Cannot {operation} type {}", kind_of(other)))),
    }
}

pub fn list(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    Ok(Value::list(args.to_vec()))
}

fn push_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 2)?;
    let mut items = list_arg(&args[0], "push on")?;
    check_list_len(items.len() + 1, name)?;
    items.push(args[1].clone());
    Ok(Value::list(items))
}

pub fn append(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    push_named("append", args)
}
pub fn push(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    push_named("push", args)
}
pub fn must_append(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    push_named("mustAppend", args)
}
pub fn must_push(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    push_named("mustPush", args)
}

fn prepend_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 2)?;
    let items = list_arg(&args[0], "prepend on")?;
    check_list_len(items.len() + 1, name)?;
    let mut out = Vec::with_capacity(items.len() + 1);
    out.push(args[1].clone());
    out.extend(items);
    Ok(Value::list(out))
}

pub fn prepend(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    prepend_named("prepend", args)
}
pub fn must_prepend(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    prepend_named("mustPrepend", args)
}

fn first_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let items = list_arg(&args[0], "find first on")?;
    Ok(items.first().cloned().unwrap_or(Value::Nil))
}
pub fn first(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    first_named("first", args)
}
pub fn must_first(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    first_named("mustFirst", args)
}

fn last_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let items = list_arg(&args[0], "find last on")?;
    Ok(items.last().cloned().unwrap_or(Value::Nil))
}
pub fn last(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    last_named("last", args)
}
pub fn must_last(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    last_named("mustLast", args)
}

fn rest_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let items = list_arg(&args[0], "find rest on")?;
    Ok(Value::list(items.into_iter().skip(1).collect()))
}
pub fn rest(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    rest_named("rest", args)
}
pub fn must_rest(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    rest_named("mustRest", args)
}

fn initial_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let mut items = list_arg(&args[0], "find initial on")?;
    items.pop();
    Ok(Value::list(items))
}
pub fn initial(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    initial_named("initial", args)
}
pub fn must_initial(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    initial_named("mustInitial", args)
}

fn reverse_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let mut items = list_arg(&args[0], "find reverse on")?;
    items.reverse();
    Ok(Value::list(items))
}
pub fn reverse(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    reverse_named("reverse", args)
}
pub fn must_reverse(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    reverse_named("mustReverse", args)
}

fn compact_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let items = list_arg(&args[0], "compact on")?;
    Ok(Value::list(
        items.into_iter().filter(|v| !is_empty(v)).collect(),
    ))
}
pub fn compact(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    compact_named("compact", args)
}
pub fn must_compact(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    compact_named("mustCompact", args)
}

fn uniq_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 1)?;
    let items = list_arg(&args[0], "find uniq on")?;
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        if !out.iter().any(|seen| deep_equal(seen, &item)) {
            out.push(item);
        }
    }
    Ok(Value::list(out))
}
pub fn uniq(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    uniq_named("uniq", args)
}
pub fn must_uniq(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    uniq_named("mustUniq", args)
}

fn without_named(name: &str, args: &[Value]) -> FuncResult {
    arity_at_least(name, args, 1)?;
    let items = list_arg(&args[0], "find without on")?;
    let omit = &args[1..];
    Ok(Value::list(
        items
            .into_iter()
            .filter(|item| !omit.iter().any(|o| deep_equal(o, item)))
            .collect(),
    ))
}
pub fn without(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    without_named("without", args)
}
pub fn must_without(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    without_named("mustWithout", args)
}

fn has_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 2)?;
    if matches!(args[1], Value::Nil | Value::Missing) {
        return Ok(Value::Bool(false));
    }
    let items = list_arg(&args[1], "find has on")?;
    Ok(Value::Bool(
        items.iter().any(|item| deep_equal(&args[0], item)),
    ))
}
pub fn has(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    has_named("has", args)
}
pub fn must_has(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    has_named("mustHas", args)
}

fn slice_named(name: &str, args: &[Value]) -> FuncResult {
    arity_at_least(name, args, 1)?;
    let items = match &args[0] {
        Value::Nil | Value::Missing => return Err(nil_dereference()),
        other => slice_items(other).ok_or_else(|| {
            FuncError::new(format!(
                "list should be type of slice or array but {}",
                kind_of(other)
            ))
        })?,
    };
    if items.is_empty() {
        return Ok(Value::Nil);
    }
    let start = args.get(1).map(to_int64).unwrap_or(0);
    let end = args.get(2).map(to_int64).unwrap_or(items.len() as i64);
    if start < 0 || end < start || end > items.len() as i64 {
        return Err(FuncError::new(
            "reflect.Value.Slice: slice index out of bounds",
        ));
    }
    Ok(Value::list(items[start as usize..end as usize].to_vec()))
}
pub fn slice(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    slice_named("slice", args)
}
pub fn must_slice(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    slice_named("mustSlice", args)
}

pub fn concat(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let mut out: Vec<Value> = Vec::new();
    for arg in args {
        match arg {
            Value::Nil | Value::Missing => return Err(nil_dereference()),
            other => match slice_items(other) {
                Some(items) => out.extend(items),
                None => {
                    return Err(FuncError::new(format!(
                        "Cannot concat type {} as list",
                        kind_of(other)
                    )));
                }
            },
        }
        check_list_len(out.len(), "concat")?;
    }
    Ok(Value::list(out))
}

fn chunk_named(name: &str, args: &[Value]) -> FuncResult {
    arity(name, args, 2)?;
    let size = int_param(&args[0])?;
    let items = list_arg(&args[1], "chunk")?;
    if size <= 0 {
        return Err(FuncError::new("runtime error: integer divide by zero"));
    }
    Ok(Value::list(
        items
            .chunks(size as usize)
            .map(|c| Value::list(c.to_vec()))
            .collect(),
    ))
}
pub fn chunk(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    chunk_named("chunk", args)
}
pub fn must_chunk(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    chunk_named("mustChunk", args)
}

/// Sprig's `sortAlpha`: a list's items as strings, sorted by bytes; any other value
/// is a one-item list of its string form.
pub fn sort_alpha(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("sortAlpha", args, 1)?;
    let mut items = match &args[0] {
        v @ (Value::List(_) | Value::Bytes(_)) => strslice(v),
        other => vec![super::args::strval(other)],
    };
    items.sort();
    Ok(string_list(items))
}

/// Sprig's `untilStep`: Go ints from start towards stop by step.
fn until_step_values(start: i64, stop: i64, step: i64) -> Result<Vec<i64>, FuncError> {
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    let count = if stop < start {
        if step >= 0 {
            return Ok(Vec::new());
        }
        (start - stop - 1) / -step + 1
    } else {
        if step <= 0 || stop == start {
            return Ok(Vec::new());
        }
        (stop - start - 1) / step + 1
    };
    check_list_len(usize::try_from(count).unwrap_or(usize::MAX), "until")?;
    Ok((0..count).map(|i| (start + i * step) as i64).collect())
}

fn ints(values: Vec<i64>) -> Value {
    Value::list(values.into_iter().map(Value::Int).collect())
}

pub fn until(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("until", args, 1)?;
    let count = int_param(&args[0])?;
    let step = if count < 0 { -1 } else { 1 };
    Ok(ints(until_step_values(0, count, step)?))
}

pub fn until_step(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("untilStep", args, 3)?;
    let start = int_param(&args[0])?;
    let stop = int_param(&args[1])?;
    let step = int_param(&args[2])?;
    Ok(ints(until_step_values(start, stop, step)?))
}

/// Sprig's `seq`, like the Unix command: `seq END`, `seq START END`,
/// `seq START STEP END`, as one string of space-separated numbers.
pub fn seq(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    let params = args
        .iter()
        .map(int_param)
        .collect::<Result<Vec<i64>, _>>()?;
    let values = match params.as_slice() {
        [end] => {
            let inc = if *end < 1 { -1 } else { 1 };
            until_step_values(1, end.saturating_add(inc), inc)?
        }
        [start, end] => {
            let step = if end < start { -1 } else { 1 };
            until_step_values(*start, end.saturating_add(step), step)?
        }
        [start, step, end] => {
            let mut inc = 1;
            if end < start {
                inc = -1;
                if *step > 0 {
                    return Ok(Value::string(""));
                }
            }
            until_step_values(*start, end.saturating_add(inc), *step)?
        }
        _ => Vec::new(),
    };
    let text: Vec<String> = values.iter().map(i64::to_string).collect();
    Ok(Value::string(text.join(" ")))
}
