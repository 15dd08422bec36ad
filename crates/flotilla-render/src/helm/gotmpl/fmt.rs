//! Go's `fmt` printing of template values: `fmt.Sprint`, `fmt.Sprintln` and
//! `fmt.Sprintf` with Go's verbs, flags, widths and error forms (`%!d(string=x)`,
//! `%!d(MISSING)`, `%!(EXTRA int=3)`), and `strconv.Quote`.
//!
//! Not covered: explicit argument indexes (`%[1]d`), `%x`/`%b` of floats, `%p`.

use super::value::Value;

/// `fmt.Sprint`: operands side by side, a space between two when neither is a string.
pub fn sprint(args: &[Value]) -> String {
    let mut out = String::new();
    let mut prev_string = false;
    for (i, arg) in args.iter().enumerate() {
        let is_string = matches!(arg, Value::String(_));
        if i > 0 && !is_string && !prev_string {
            out.push(' ');
        }
        print_arg(&mut out, arg, 'v', &Flags::default());
        prev_string = is_string;
    }
    out
}

/// `fmt.Sprintln`: operands separated by spaces, then a newline.
pub fn sprintln(args: &[Value]) -> String {
    let mut out = String::new();
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        print_arg(&mut out, arg, 'v', &Flags::default());
    }
    out.push('\n');
    out
}

/// `fmt.Sprint` of one value (`%v`), as a template prints `{{ x }}`.
pub fn display(v: &Value) -> String {
    let mut out = String::new();
    print_arg(&mut out, v, 'v', &Flags::default());
    out
}

#[derive(Clone, Debug, Default)]
struct Flags {
    plus: bool,
    minus: bool,
    sharp: bool,
    space: bool,
    zero: bool,
    width: Option<usize>,
    prec: Option<usize>,
}

/// `fmt.Sprintf`.
pub fn sprintf(format: &str, args: &[Value]) -> String {
    let mut out = String::new();
    let mut arg_num = 0;
    let mut rest = format;
    while !rest.is_empty() {
        let Some(pct) = rest.find('%') else {
            out.push_str(rest);
            break;
        };
        out.push_str(&rest[..pct]);
        rest = &rest[pct + 1..];
        let mut flags = Flags::default();
        // Flags.
        loop {
            match rest.as_bytes().first() {
                Some(b'#') => flags.sharp = true,
                Some(b'0') => flags.zero = !flags.minus,
                Some(b'+') => flags.plus = true,
                Some(b'-') => {
                    flags.minus = true;
                    flags.zero = false;
                }
                Some(b' ') => flags.space = true,
                _ => break,
            }
            rest = &rest[1..];
        }
        // Width.
        if rest.starts_with('*') {
            rest = &rest[1..];
            match args.get(arg_num) {
                Some(Value::Int(n) | Value::Int64(n)) => {
                    let n = *n;
                    if n < 0 {
                        flags.minus = true;
                        flags.zero = false;
                    }
                    flags.width = Some(n.unsigned_abs() as usize);
                }
                _ => out.push_str("%!(BADWIDTH)"),
            }
            arg_num += 1;
        } else {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            if digits > 0 {
                flags.width = rest[..digits].parse().ok();
                rest = &rest[digits..];
            }
        }
        // Precision.
        if let Some(after_dot) = rest.strip_prefix('.') {
            rest = after_dot;
            if rest.starts_with('*') {
                rest = &rest[1..];
                match args.get(arg_num) {
                    Some(Value::Int(n) | Value::Int64(n)) if *n >= 0 => {
                        flags.prec = Some(*n as usize)
                    }
                    _ => out.push_str("%!(BADPREC)"),
                }
                arg_num += 1;
            } else {
                let digits =
                    rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                flags.prec = Some(rest[..digits].parse().unwrap_or(0));
                rest = &rest[digits..];
            }
        }
        let Some(verb) = rest.chars().next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        rest = &rest[verb.len_utf8()..];
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(arg_num) else {
            out.push_str("%!");
            out.push(verb);
            out.push_str("(MISSING)");
            continue;
        };
        arg_num += 1;
        print_arg(&mut out, arg, verb, &flags);
    }
    if arg_num < args.len() {
        out.push_str("%!(EXTRA ");
        for (i, arg) in args[arg_num..].iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            if matches!(arg, Value::Nil | Value::Missing) {
                out.push_str("<nil>");
            } else {
                out.push_str(&arg.type_name());
                out.push('=');
                print_arg(&mut out, arg, 'v', &Flags::default());
            }
        }
        out.push(')');
    }
    out
}

fn print_arg(out: &mut String, arg: &Value, verb: char, flags: &Flags) {
    if verb == 'T' {
        match arg {
            Value::Nil | Value::Missing => pad(out, "<nil>", flags),
            _ => fmt_s(out, &arg.type_name(), flags),
        }
        return;
    }
    print_value(out, arg, verb, flags);
}

fn print_value(out: &mut String, arg: &Value, verb: char, flags: &Flags) {
    match arg {
        Value::Nil | Value::Missing => match verb {
            'v' => pad(out, "<nil>", flags),
            _ => bad_verb(out, arg, verb, flags),
        },
        Value::Bool(b) => match verb {
            't' | 'v' => pad(out, if *b { "true" } else { "false" }, flags),
            _ => bad_verb(out, arg, verb, flags),
        },
        Value::Int(i) | Value::Int64(i) => fmt_int(out, arg, *i as i128, verb, flags),
        Value::Float(f) => fmt_float_verb(out, arg, *f, verb, flags),
        Value::String(s) => fmt_string(out, arg, s, verb, flags),
        Value::Bytes(b) => match verb {
            's' | 'q' | 'x' | 'X' => {
                let s = String::from_utf8_lossy(b);
                fmt_string(out, arg, &s, verb, flags)
            }
            _ => {
                out.push('[');
                for (i, byte) in b.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    let v = Value::Int(i64::from(*byte));
                    fmt_int(out, &v, i128::from(*byte), verb, flags);
                }
                out.push(']');
            }
        },
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                print_value(out, item, verb, flags);
            }
            out.push(']');
        }
        Value::Map(map) => {
            let Some(_visit) = map.visit() else {
                out.push_str(super::value::CYCLE_TEXT);
                return;
            };
            out.push_str("map[");
            for (i, (k, v)) in map.entries().iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                fmt_string(out, &Value::string(k.as_str()), k, verb, flags);
                out.push(':');
                print_value(out, v, verb, flags);
            }
            out.push(']');
        }
        Value::Object(o) => match verb {
            'v' | 's' | 'x' | 'X' | 'q' => {
                let s = o.display();
                fmt_string(out, &Value::string(s.as_str()), &s, verb, flags)
            }
            _ => bad_verb(out, arg, verb, flags),
        },
    }
}

fn bad_verb(out: &mut String, arg: &Value, verb: char, flags: &Flags) {
    out.push_str("%!");
    out.push(verb);
    out.push('(');
    match arg {
        Value::Nil | Value::Missing => out.push_str("<nil>"),
        _ => {
            out.push_str(&arg.type_name());
            out.push('=');
            print_value(out, arg, 'v', flags);
        }
    }
    out.push(')');
}

/// Writes `s` padded to the width, with spaces (or zeros) on the left, or spaces
/// on the right with `-`.
fn pad(out: &mut String, s: &str, flags: &Flags) {
    pad_with(out, s, flags, flags.zero)
}

fn pad_with(out: &mut String, s: &str, flags: &Flags, zero: bool) {
    let width = flags.width.unwrap_or(0);
    let len = s.chars().count();
    if len >= width {
        out.push_str(s);
        return;
    }
    let padding = width - len;
    if flags.minus {
        out.push_str(s);
        out.extend(std::iter::repeat_n(' ', padding));
    } else {
        out.extend(std::iter::repeat_n(if zero { '0' } else { ' ' }, padding));
        out.push_str(s);
    }
}

fn fmt_s(out: &mut String, s: &str, flags: &Flags) {
    match flags.prec {
        Some(p) => {
            let truncated: String = s.chars().take(p).collect();
            pad(out, &truncated, flags)
        }
        None => pad(out, s, flags),
    }
}

fn fmt_string(out: &mut String, arg: &Value, s: &str, verb: char, flags: &Flags) {
    match verb {
        'v' | 's' => fmt_s(out, s, flags),
        'q' => {
            let s = match flags.prec {
                Some(p) => s.chars().take(p).collect(),
                None => s.to_string(),
            };
            let quoted = if flags.sharp && can_backquote(&s) {
                format!("`{s}`")
            } else if flags.plus {
                quote_ascii(&s)
            } else {
                quote_go(&s)
            };
            pad(out, &quoted, flags)
        }
        'x' | 'X' => {
            let bytes = s.as_bytes();
            let bytes = match flags.prec {
                Some(p) if p < bytes.len() => &bytes[..p],
                _ => bytes,
            };
            let mut hex = String::new();
            for (i, b) in bytes.iter().enumerate() {
                if flags.space && i > 0 {
                    hex.push(' ');
                }
                if flags.sharp && (flags.space || i == 0) {
                    hex.push_str(if verb == 'x' { "0x" } else { "0X" });
                }
                if verb == 'x' {
                    hex.push_str(&format!("{b:02x}"));
                } else {
                    hex.push_str(&format!("{b:02X}"));
                }
            }
            pad_with(out, &hex, flags, false)
        }
        _ => bad_verb(out, arg, verb, flags),
    }
}

fn fmt_int(out: &mut String, arg: &Value, n: i128, verb: char, flags: &Flags) {
    let (base, upper) = match verb {
        'v' | 'd' => (10, false),
        'b' => (2, false),
        'o' | 'O' => (8, false),
        'x' => (16, false),
        'X' => (16, true),
        'c' => {
            let c = u32::try_from(n)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            return pad(out, &c.to_string(), flags);
        }
        'q' => {
            let c = u32::try_from(n)
                .ok()
                .and_then(char::from_u32)
                .unwrap_or('\u{FFFD}');
            return pad(out, &quote_rune(c), flags);
        }
        'U' => {
            let mut s = format!("U+{:04X}", n.max(0));
            if let Some(c) = u32::try_from(n).ok().and_then(char::from_u32)
                && flags.sharp
                && is_print(c)
            {
                s.push_str(&format!(" '{c}'"));
            }
            return pad_with(out, &s, flags, false);
        }
        _ => return bad_verb(out, arg, verb, flags),
    };
    let negative = n < 0;
    let magnitude = n.unsigned_abs();
    let mut digits = match base {
        2 => format!("{magnitude:b}"),
        8 => format!("{magnitude:o}"),
        16 if upper => format!("{magnitude:X}"),
        16 => format!("{magnitude:x}"),
        _ => magnitude.to_string(),
    };
    let mut prec = 0;
    if let Some(p) = flags.prec {
        if p == 0 && magnitude == 0 {
            let blank = Flags {
                zero: false,
                ..flags.clone()
            };
            return pad(out, "", &blank);
        }
        prec = p;
    } else if let Some(w) = flags.width
        && flags.zero
        && !flags.minus
    {
        prec = w;
        if negative || flags.plus || flags.space {
            prec = prec.saturating_sub(1);
        }
    }
    if digits.len() < prec {
        digits = "0".repeat(prec - digits.len()) + &digits;
    }
    let mut prefix = String::new();
    if flags.sharp {
        match base {
            2 => prefix.push_str("0b"),
            8 if !digits.starts_with('0') => prefix.push('0'),
            16 => prefix.push_str(if upper { "0X" } else { "0x" }),
            _ => {}
        }
    }
    if verb == 'O' {
        prefix = "0o".to_string();
    }
    let sign = if negative {
        "-"
    } else if flags.plus {
        "+"
    } else if flags.space {
        " "
    } else {
        ""
    };
    pad_with(out, &format!("{sign}{prefix}{digits}"), flags, false)
}

fn fmt_float_verb(out: &mut String, arg: &Value, f: f64, verb: char, flags: &Flags) {
    let body = match verb {
        'v' | 'g' | 'G' => format_g(f, flags.prec, verb == 'G'),
        'e' | 'E' => format_e(f, flags.prec.unwrap_or(6), verb == 'E'),
        'f' | 'F' => format_f(f, flags.prec.unwrap_or(6)),
        _ => return bad_verb(out, arg, verb, flags),
    };
    // Sign handling as Go's fmtFloat does it.
    let (mut num, special) = if body.starts_with('-') || body.starts_with('+') {
        (body.clone(), body.contains("Inf") || body.contains("NaN"))
    } else {
        (
            format!("+{body}"),
            body.contains("Inf") || body.contains("NaN"),
        )
    };
    if flags.space && num.starts_with('+') && !flags.plus {
        num.replace_range(0..1, " ");
    }
    if special {
        if num[1..].starts_with('N') && !flags.space && !flags.plus {
            num.remove(0);
        }
        return pad_with(out, &num, flags, false);
    }
    if flags.plus || !num.starts_with('+') {
        let width = flags.width.unwrap_or(0);
        if flags.zero && !flags.minus && width > num.len() {
            out.push_str(&num[..1]);
            out.extend(std::iter::repeat_n('0', width - num.len()));
            out.push_str(&num[1..]);
            return;
        }
        return pad(out, &num, flags);
    }
    pad(out, &num[1..], flags)
}

/// Decimal digits of |f| (no leading or trailing zeros) and the decimal point's
/// position: `digits` × 10^(dp - len).
fn decimal_digits(f: f64, significant: Option<usize>) -> (String, i32) {
    if f == 0.0 {
        return (String::new(), 0);
    }
    let e = match significant {
        None => format!("{:e}", f.abs()),
        Some(n) => format!("{:.*e}", n.saturating_sub(1), f.abs()),
    };
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let digits = digits.trim_end_matches('0').to_string();
    if digits.is_empty() {
        return (String::new(), 0);
    }
    (digits, exp + 1)
}

fn special(f: f64) -> Option<String> {
    if f.is_nan() {
        Some("NaN".to_string())
    } else if f.is_infinite() {
        Some(if f > 0.0 { "+Inf" } else { "-Inf" }.to_string())
    } else {
        None
    }
}

fn sign(f: f64) -> &'static str {
    if f.is_sign_negative() { "-" } else { "" }
}

/// strconv's `%e` from digits: d.ddddde±XX with `prec` digits after the point.
fn e_from_digits(neg: &str, digits: &str, dp: i32, prec: usize, upper: bool) -> String {
    let mut s = String::from(neg);
    let first = digits.chars().next().unwrap_or('0');
    s.push(first);
    if prec > 0 {
        s.push('.');
        let rest: String = digits.chars().skip(1).take(prec).collect();
        s.push_str(&rest);
        s.extend(std::iter::repeat_n('0', prec - rest.len()));
    }
    let exp = if digits.is_empty() { 0 } else { dp - 1 };
    s.push(if upper { 'E' } else { 'e' });
    s.push(if exp < 0 { '-' } else { '+' });
    let a = exp.unsigned_abs();
    if a < 10 {
        s.push('0');
    }
    s.push_str(&a.to_string());
    s
}

/// strconv's `%f` from digits with `prec` digits after the point.
fn f_from_digits(neg: &str, digits: &str, dp: i32, prec: usize) -> String {
    let mut s = String::from(neg);
    let d = digits.as_bytes();
    if dp > 0 {
        for i in 0..dp as usize {
            s.push(d.get(i).map(|b| *b as char).unwrap_or('0'));
        }
    } else {
        s.push('0');
    }
    if prec > 0 {
        s.push('.');
        for i in 0..prec as i32 {
            let j = dp + i;
            let c = if j >= 0 {
                d.get(j as usize).map(|b| *b as char).unwrap_or('0')
            } else {
                '0'
            };
            s.push(c);
        }
    }
    s
}

/// strconv.FormatFloat(f, 'g', prec, 64); `None` is the shortest form.
fn format_g(f: f64, prec: Option<usize>, upper: bool) -> String {
    if let Some(s) = special(f) {
        return s;
    }
    let neg = sign(f);
    let (digits, dp) = match prec {
        None => decimal_digits(f, None),
        Some(p) => decimal_digits(f, Some(p.max(1))),
    };
    let nd = digits.len() as i32;
    let shortest = prec.is_none();
    let mut p = match prec {
        None => nd,
        Some(p) => p.max(1) as i32,
    };
    let mut eprec = p;
    if eprec > nd && nd >= dp {
        eprec = nd;
    }
    if shortest {
        eprec = 6;
    }
    let exp = dp - 1;
    if exp < -4 || exp >= eprec {
        if p > nd {
            p = nd;
        }
        return e_from_digits(neg, &digits, dp, (p - 1).max(0) as usize, upper);
    }
    if p > dp {
        p = nd;
    }
    f_from_digits(neg, &digits, dp, (p - dp).max(0) as usize)
}

fn format_e(f: f64, prec: usize, upper: bool) -> String {
    if let Some(s) = special(f) {
        return s;
    }
    let (digits, dp) = decimal_digits(f, Some(prec + 1));
    e_from_digits(sign(f), &digits, dp, prec, upper)
}

fn format_f(f: f64, prec: usize) -> String {
    if let Some(s) = special(f) {
        return s;
    }
    format!("{:.*}", prec, f)
}

/// Go's `strconv.IsPrint`, approximated: no control or format characters.
fn is_print(c: char) -> bool {
    !(c.is_control()
        || matches!(c, '\u{AD}' | '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}'))
}

fn escape_into(s: &mut String, c: char, quote: char, ascii_only: bool) {
    match c {
        '\u{7}' => s.push_str("\\a"),
        '\u{8}' => s.push_str("\\b"),
        '\u{c}' => s.push_str("\\f"),
        '\n' => s.push_str("\\n"),
        '\r' => s.push_str("\\r"),
        '\t' => s.push_str("\\t"),
        '\u{b}' => s.push_str("\\v"),
        '\\' => s.push_str("\\\\"),
        c if c == quote => {
            s.push('\\');
            s.push(c);
        }
        c if c.is_ascii() && !c.is_ascii_control() => s.push(c),
        c if !c.is_ascii() && is_print(c) && !ascii_only => s.push(c),
        c if (c as u32) < 0x80 => s.push_str(&format!("\\x{:02x}", c as u32)),
        c if (c as u32) < 0x10000 => s.push_str(&format!("\\u{:04x}", c as u32)),
        c => s.push_str(&format!("\\U{:08x}", c as u32)),
    }
}

/// Go's `strconv.Quote`.
pub fn quote_go(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        escape_into(&mut s, c, '"', false);
    }
    s.push('"');
    s
}

fn quote_ascii(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        escape_into(&mut s, c, '"', true);
    }
    s.push('"');
    s
}

fn quote_rune(c: char) -> String {
    let mut s = String::from("'");
    escape_into(&mut s, c, '\'', false);
    s.push('\'');
    s
}

fn can_backquote(s: &str) -> bool {
    s.chars()
        .all(|c| c != '`' && c != '\u{FEFF}' && (c == '\t' || !c.is_control()))
}

/// Go's `%#U` of a character: `U+0023 '#'`.
pub fn unicode_name(c: char) -> String {
    if is_print(c) {
        format!("U+{:04X} '{c}'", c as u32)
    } else {
        format!("U+{:04X}", c as u32)
    }
}
