//! Go's `text/template`, as Helm uses it: the same parse, the same execution rules and
//! the same printing of values.

pub mod value;

pub use value::{Func, FuncError, FuncResult, Host, Object, Value};
