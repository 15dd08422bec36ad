//! Go's shortest forms of a float: `strconv.FormatFloat(f, 'g', -1, 64)`, as YAML
//! and JSON write numbers, and `fmt`'s `%v`.

/// Go's `strconv.FormatFloat(f, 'g', -1, 64)` (or 32 bits with `single`): the shortest
/// digits, in exponent form when the exponent is below -4 or at least 6 (Go's rule
/// for the shortest precision).
pub(crate) fn format_g(f: f64, single: bool) -> String {
    format_shortest(f, single, 6)
}

/// Go's `%v` of a float64 (`fmt` switches to an exponent at 21 digits, not 6).
pub fn format_float_v(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    format_shortest(f, false, 21)
}

fn format_shortest(f: f64, single: bool, exponent_limit: i32) -> String {
    let scientific = if single {
        format!("{:e}", f as f32)
    } else {
        format!("{f:e}")
    };
    let (negative, rest) = match scientific.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, scientific.as_str()),
    };
    let (mantissa, exponent) = rest.split_once('e').unwrap_or((rest, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    if digits == "0" {
        out.push('0');
        return out;
    }
    if !(-4..exponent_limit).contains(&exponent) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        out.push_str(&format!("{:02}", exponent.abs()));
        return out;
    }
    let point = exponent + 1;
    if point <= 0 {
        out.push_str("0.");
        out.push_str(&"0".repeat((-point) as usize));
        out.push_str(&digits);
    } else if point as usize >= digits.len() {
        out.push_str(&digits);
        out.push_str(&"0".repeat(point as usize - digits.len()));
    } else {
        out.push_str(&digits[..point as usize]);
        out.push('.');
        out.push_str(&digits[point as usize..]);
    }
    out
}
