//! Sprig's arithmetic and number conversions. Integer functions convert each
//! argument as `cast.ToInt64` does and return Go's `int64`; the `...f` functions go
//! through exact decimals (as Sprig's shopspring/decimal does, so `addf 0.1 0.2` is
//! `0.3`) and return `float64`.

use super::args::{arity, arity_at_least, int_param, string_param, strval, to_float64, to_int64};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Value};

fn divide_by_zero() -> FuncError {
    FuncError::new("runtime error: integer divide by zero")
}

pub fn add1(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("add1", args, 1)?;
    Ok(Value::Int64(to_int64(&args[0]).wrapping_add(1)))
}

pub fn add(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    Ok(Value::Int64(
        args.iter()
            .fold(0i64, |sum, v| sum.wrapping_add(to_int64(v))),
    ))
}

pub fn sub(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("sub", args, 2)?;
    Ok(Value::Int64(
        to_int64(&args[0]).wrapping_sub(to_int64(&args[1])),
    ))
}

pub fn div(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("div", args, 2)?;
    let divisor = to_int64(&args[1]);
    if divisor == 0 {
        return Err(divide_by_zero());
    }
    Ok(Value::Int64(to_int64(&args[0]).wrapping_div(divisor)))
}

pub fn modulo(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("mod", args, 2)?;
    let divisor = to_int64(&args[1]);
    if divisor == 0 {
        return Err(divide_by_zero());
    }
    Ok(Value::Int64(to_int64(&args[0]).wrapping_rem(divisor)))
}

pub fn mul(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("mul", args, 1)?;
    Ok(Value::Int64(
        args[1..].iter().fold(to_int64(&args[0]), |product, v| {
            product.wrapping_mul(to_int64(v))
        }),
    ))
}

fn extreme(name: &str, args: &[Value], want_max: bool) -> FuncResult {
    arity_at_least(name, args, 1)?;
    let mut best = to_int64(&args[0]);
    for v in &args[1..] {
        let x = to_int64(v);
        if (want_max && x > best) || (!want_max && x < best) {
            best = x;
        }
    }
    Ok(Value::Int64(best))
}

pub fn max(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    extreme("max", args, true)
}
pub fn biggest(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    extreme("biggest", args, true)
}
pub fn min(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    extreme("min", args, false)
}

/// Go's `math.Max` and `math.Min`: NaN wins, and +0 beats -0 for max.
fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_positive() { a } else { b }
    } else if a > b {
        a
    } else {
        b
    }
}

fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else if a == 0.0 && b == 0.0 {
        if a.is_sign_negative() { a } else { b }
    } else if a < b {
        a
    } else {
        b
    }
}

pub fn maxf(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("maxf", args, 1)?;
    Ok(Value::Float(
        args[1..]
            .iter()
            .fold(to_float64(&args[0]), |m, v| go_max(m, to_float64(v))),
    ))
}

pub fn minf(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("minf", args, 1)?;
    Ok(Value::Float(
        args[1..]
            .iter()
            .fold(to_float64(&args[0]), |m, v| go_min(m, to_float64(v))),
    ))
}

pub fn floor(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("floor", args, 1)?;
    Ok(Value::Float(to_float64(&args[0]).floor()))
}

pub fn ceil(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("ceil", args, 1)?;
    Ok(Value::Float(to_float64(&args[0]).ceil()))
}

/// Sprig's `round VALUE PLACES [ROUND_ON]`, with its own rule: the scaled value's
/// fraction at or above ROUND_ON (0.5) rounds up.
pub fn round(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("round", args, 2)?;
    let value = to_float64(&args[0]);
    let places = int_param(&args[1])? as f64;
    let round_on = match args.get(2) {
        Some(Value::Float(f)) => *f,
        Some(Value::Int(i)) => *i as f64,
        Some(other) => return Err(super::args::wrong_type("float64", other)),
        None => 0.5,
    };
    let pow = 10f64.powf(places);
    let digit = pow * value;
    let fraction = digit - digit.trunc();
    let rounded = if fraction >= round_on {
        digit.ceil()
    } else {
        digit.floor()
    };
    Ok(Value::Float(rounded / pow))
}

pub fn int64(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("int64", args, 1)?;
    Ok(Value::Int64(to_int64(&args[0])))
}

pub fn int(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("int", args, 1)?;
    Ok(Value::Int(to_int64(&args[0])))
}

pub fn float64(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("float64", args, 1)?;
    Ok(Value::Float(to_float64(&args[0])))
}

/// Sprig's `atoi`: Go's `strconv.Atoi`, 0 when the string is no decimal integer.
pub fn atoi(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("atoi", args, 1)?;
    let s = string_param(&args[0])?;
    let digits = s.strip_prefix(['+', '-']).unwrap_or(&s);
    let parsed = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<i64>().unwrap_or(0)
    } else {
        0
    };
    Ok(Value::Int(parsed))
}

/// Sprig's `toDecimal`: the value's string form read as an octal number, 0 if it is
/// none.
pub fn to_decimal(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("toDecimal", args, 1)?;
    let text = strval(&args[0]);
    let digits = text.strip_prefix(['+', '-']).unwrap_or(&text);
    let parsed = if !digits.is_empty() && digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        i64::from_str_radix(&text, 8).unwrap_or(0)
    } else {
        0
    };
    Ok(Value::Int64(parsed))
}

/// An exact decimal: `mantissa` times ten to `exponent`.
#[derive(Clone, Copy)]
struct Decimal {
    mantissa: i128,
    exponent: i32,
}

impl Decimal {
    /// shopspring's `NewFromFloat`: the shortest decimal that reads back as the float.
    fn from_f64(f: f64) -> Option<Decimal> {
        if !f.is_finite() {
            return None;
        }
        if f == 0.0 {
            return Some(Decimal {
                mantissa: 0,
                exponent: 0,
            });
        }
        let formatted = format!("{:e}", f);
        let (mantissa, exp) = formatted.split_once('e')?;
        let fraction_digits = mantissa.split_once('.').map_or(0, |(_, frac)| frac.len()) as i32;
        let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
        Some(Decimal {
            mantissa: digits.parse().ok()?,
            exponent: exp.parse::<i32>().ok()? - fraction_digits,
        })
    }

    fn to_f64(self) -> f64 {
        format!("{}e{}", self.mantissa, self.exponent)
            .parse()
            .unwrap_or(f64::NAN)
    }

    fn scaled_to(self, exponent: i32) -> Option<i128> {
        let shift = u32::try_from(self.exponent - exponent).ok()?;
        self.mantissa.checked_mul(10i128.checked_pow(shift)?)
    }

    fn add(self, other: Decimal) -> Option<Decimal> {
        let exponent = self.exponent.min(other.exponent);
        let sum = self
            .scaled_to(exponent)?
            .checked_add(other.scaled_to(exponent)?)?;
        Some(Decimal {
            mantissa: sum,
            exponent,
        })
    }

    fn neg(self) -> Decimal {
        Decimal {
            mantissa: -self.mantissa,
            exponent: self.exponent,
        }
    }

    fn mul(self, other: Decimal) -> Option<Decimal> {
        Some(
            Decimal {
                mantissa: self.mantissa.checked_mul(other.mantissa)?,
                exponent: self.exponent.checked_add(other.exponent)?,
            }
            .normalized(),
        )
    }

    /// shopspring's `Div`: the quotient rounded (half away from zero) to 16 places.
    fn div(self, other: Decimal) -> Option<Decimal> {
        const PLACES: i32 = 16;
        let shift = self.exponent - other.exponent + PLACES;
        let (numerator, denominator) = if shift >= 0 {
            (
                self.mantissa
                    .checked_mul(10i128.checked_pow(u32::try_from(shift).ok()?)?)?,
                other.mantissa,
            )
        } else {
            (
                self.mantissa,
                other
                    .mantissa
                    .checked_mul(10i128.checked_pow(u32::try_from(-shift).ok()?)?)?,
            )
        };
        let quotient = numerator / denominator;
        let remainder = numerator % denominator;
        let rounded = if remainder.checked_mul(2)?.abs() >= denominator.abs() {
            quotient
                + if (numerator < 0) == (denominator < 0) {
                    1
                } else {
                    -1
                }
        } else {
            quotient
        };
        Some(
            Decimal {
                mantissa: rounded,
                exponent: -PLACES,
            }
            .normalized(),
        )
    }

    fn normalized(self) -> Decimal {
        let mut d = self;
        while d.mantissa != 0 && d.mantissa % 10 == 0 {
            d.mantissa /= 10;
            d.exponent += 1;
        }
        d
    }
}

#[derive(Clone, Copy)]
enum DecimalOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// Sprig's `execDecimalOp`: fold the operation over exact decimals, falling back to
/// float arithmetic only where a value is beyond what 128-bit decimals hold.
fn decimal_fold(first: &Value, rest: &[Value], op: DecimalOp) -> Result<f64, FuncError> {
    let mut acc_float = to_float64(first);
    let mut acc = Decimal::from_f64(acc_float);
    for v in rest {
        let x = to_float64(v);
        if matches!(op, DecimalOp::Div) && x == 0.0 {
            return Err(FuncError::new("decimal division by zero"));
        }
        let exact = acc.zip(Decimal::from_f64(x)).and_then(|(a, b)| match op {
            DecimalOp::Add => a.add(b),
            DecimalOp::Sub => a.add(b.neg()),
            DecimalOp::Mul => a.mul(b),
            DecimalOp::Div => a.div(b),
        });
        acc_float = match exact {
            Some(d) => d.to_f64(),
            None => match op {
                DecimalOp::Add => acc_float + x,
                DecimalOp::Sub => acc_float - x,
                DecimalOp::Mul => acc_float * x,
                DecimalOp::Div => acc_float / x,
            },
        };
        acc = exact.or_else(|| Decimal::from_f64(acc_float));
    }
    Ok(acc.map_or(acc_float, Decimal::to_f64))
}

pub fn add1f(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("add1f", args, 1)?;
    Ok(Value::Float(decimal_fold(
        &args[0],
        &[Value::Int(1)],
        DecimalOp::Add,
    )?))
}

pub fn addf(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    Ok(Value::Float(decimal_fold(
        &Value::Float(0.0),
        args,
        DecimalOp::Add,
    )?))
}

pub fn subf(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("subf", args, 1)?;
    Ok(Value::Float(decimal_fold(
        &args[0],
        &args[1..],
        DecimalOp::Sub,
    )?))
}

pub fn mulf(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("mulf", args, 1)?;
    Ok(Value::Float(decimal_fold(
        &args[0],
        &args[1..],
        DecimalOp::Mul,
    )?))
}

pub fn divf(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity_at_least("divf", args, 1)?;
    Ok(Value::Float(decimal_fold(
        &args[0],
        &args[1..],
        DecimalOp::Div,
    )?))
}
