//! Sprig's and Helm's defaults and flow control: `default`, `empty`, `coalesce`,
//! `all`, `any`, `ternary`, `fail`, `required`, and Helm's `lookup`, plus the
//! function a pure render refuses (`getHostByName`). Helm v4 deletes Sprig's `env`
//! and `expandenv` from its functions (a chart calling them fails to parse:
//! `function "env" not defined`), so they are not here either.

use super::args::{arity, arity_at_least, bool_param, deep_equal, is_empty, string_param};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

/// Sprig's `default DEFAULT [GIVEN]`: the given value unless it is empty.
pub fn default(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("default", args, 1)?;
    match args.get(1) {
        Some(given) if !is_empty(given) => Ok(given.clone()),
        _ => Ok(args[0].clone()),
    }
}

pub fn empty(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("empty", args, 1)?;
    Ok(Value::Bool(is_empty(&args[0])))
}

pub fn coalesce(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    Ok(args
        .iter()
        .find(|v| !is_empty(v))
        .cloned()
        .unwrap_or(Value::Nil))
}

pub fn all(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    Ok(Value::Bool(args.iter().all(|v| !is_empty(v))))
}

pub fn any(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    Ok(Value::Bool(args.iter().any(|v| !is_empty(v))))
}

pub fn ternary(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("ternary", args, 3)?;
    let condition = bool_param(&args[2])?;
    Ok(if condition {
        args[0].clone()
    } else {
        args[1].clone()
    })
}

pub fn deep_equal_fn(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("deepEqual", args, 2)?;
    Ok(Value::Bool(deep_equal(&args[0], &args[1])))
}

pub fn fail(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("fail", args, 1)?;
    let message = string_param(&args[0])?;
    Err(FuncError::new(message.to_string()))
}

/// Helm's `required MESSAGE VALUE`: the value, unless it is nil, missing or an empty
/// string, which fail the render with the message.
pub fn required(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("required", args, 2)?;
    let message = string_param(&args[0])?;
    match &args[1] {
        Value::Nil | Value::Missing => Err(FuncError::new(message.to_string())),
        Value::String(s) if s.is_empty() => Err(FuncError::new(message.to_string())),
        other => Ok(other.clone()),
    }
}

/// Helm's engine marks the messages of `fail` and `required` so that its error
/// report can show them alone: `execution error at (FILE:LINE:COL): MESSAGE`.
fn marked(result: FuncResult) -> FuncResult {
    result.map_err(|err| {
        if err.as_wrong_type().is_some() || super::is_call_site_error(&err) {
            err
        } else {
            FuncError::new(format!("HELM_ERR_START{}HELM_ERR_END", err.0))
        }
    })
}

/// `fail` as a render's table has it: its message marked for Helm's report.
pub fn engine_fail(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    marked(fail(host, args))
}

/// `required` as a render's table has it: its message marked for Helm's report.
pub fn engine_required(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    marked(required(host, args))
}

/// Helm's `lookup APIVERSION KIND NAMESPACE NAME`: a render here sees no cluster, as
/// `helm template` does, so the answer is an empty map; the user is warned, naming
/// the template, since a chart may behave differently against a live cluster.
pub fn lookup(host: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("lookup", args, 4)?;
    let parts = args
        .iter()
        .map(string_param)
        .collect::<Result<Vec<_>, _>>()?;
    let template = host.template_name().to_string();
    host.warn(format!(
        "{template}: lookup {} {} {}/{} returned an empty map: flotilla renders without a cluster, as `helm template` does",
        parts[0], parts[1], parts[2], parts[3]
    ));
    Ok(Value::map(Default::default()))
}

/// Sprig's `getHostByName`: refused, because a render opens no socket.
pub fn get_host_by_name(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("getHostByName", args, 1)?;
    let name = string_param(&args[0])?;
    Err(FuncError::new(format!(
        "getHostByName {name}: flotilla renders without the network, so a chart cannot resolve host names; put the address in the chart's values instead"
    )))
}
