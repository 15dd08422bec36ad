//! Sprig's type tests: `typeOf`, `typeIs`, `typeIsLike`, `kindOf`, `kindIs`.
//! Lists are Go's `[]interface {}` here, including the lists Sprig builds as
//! `[]string` (`splitList`, `keys`): `typeOf (splitList "," "a")` prints
//! `[]interface {}` where Go prints `[]string`.

use super::args::{arity, string_param};
use crate::helm::gotmpl::value::{FuncResult, Host, Value};

pub fn type_of(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("typeOf", args, 1)?;
    Ok(Value::string(args[0].type_name()))
}

pub fn type_is(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("typeIs", args, 2)?;
    let target = string_param(&args[0])?;
    Ok(Value::Bool(*target == *args[1].type_name()))
}

pub fn type_is_like(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("typeIsLike", args, 2)?;
    let target = string_param(&args[0])?;
    let actual = args[1].type_name();
    Ok(Value::Bool(
        *target == *actual || format!("*{target}") == actual,
    ))
}

pub fn kind_of(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("kindOf", args, 1)?;
    Ok(Value::string(args[0].kind_name()))
}

pub fn kind_is(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("kindIs", args, 2)?;
    let target = string_param(&args[0])?;
    Ok(Value::Bool(*target == *args[1].kind_name()))
}
