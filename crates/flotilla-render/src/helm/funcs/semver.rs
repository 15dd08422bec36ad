//! Sprig's `semver` and `semverCompare` with the rules of Masterminds semver v3 (as
//! Helm v4 links it): versions read loosely (`v1.2`, `1`, leading zeros), constraints
//! with `=`, `!=`, `>`, `<`, `>=`, `<=`, `~`, `^`, wildcards (`1.x`, `*`), hyphen
//! ranges (`1.2 - 1.4`), `,` or spaces for "and", `||` for "or", and prerelease
//! versions matched only by a group of constraints that names a prerelease itself
//! (`>=1.19-0`).

use std::cmp::Ordering;
use std::sync::{Arc, LazyLock};

use regex::Regex;

use super::args::{arity, string_param};
use crate::helm::gotmpl::value::{FuncError, FuncResult, Host, Object, Value};

const CV: &str = r"v?([0-9|x|X|\*]+)(\.[0-9|x|X|\*]+)?(\.[0-9|x|X|\*]+)?(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?";
const OPS: &str = r"=||!=|>|<|>=|=>|<=|=<|~|~>|\^";

fn build(pattern: String) -> Regex {
    // The patterns are this module's constants, compiled by every semver test.
    Regex::new(&pattern).expect("semver's constant patterns compile")
}

static LOOSE_VERSION: LazyLock<Regex> = LazyLock::new(|| {
    build(r"^v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?$".to_string())
});
static CONSTRAINT: LazyLock<Regex> = LazyLock::new(|| build(format!(r"^\s*({OPS})\s*({CV})\s*$")));
static RANGE: LazyLock<Regex> = LazyLock::new(|| build(format!(r"\s*({CV})\s+-\s+({CV})\s*")));
static FIND: LazyLock<Regex> = LazyLock::new(|| build(format!(r"({OPS})\s*({CV})")));
static VALID: LazyLock<Regex> = LazyLock::new(|| {
    build(format!(
        r"^(\s*({OPS})\s*({CV})\s*)((?:\s+|,\s*)({OPS})\s*({CV})\s*)*$"
    ))
});

/// A semantic version as Masterminds semver holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pub pre: String,
    pub metadata: String,
    pub original: String,
}

const ALLOWED: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-0123456789";

fn validate_prerelease(pre: &str) -> Result<(), &'static str> {
    for part in pre.split('.') {
        if part.is_empty() {
            return Err("invalid prerelease string");
        } else if part.bytes().all(|b| b.is_ascii_digit()) {
            if part.len() > 1 && part.starts_with('0') {
                return Err("version segment starts with 0");
            }
        } else if !part.chars().all(|c| ALLOWED.contains(c)) {
            return Err("invalid prerelease string");
        }
    }
    Ok(())
}

fn validate_metadata(meta: &str) -> Result<(), &'static str> {
    if meta
        .split('.')
        .any(|p| p.is_empty() || !p.chars().all(|c| ALLOWED.contains(c)))
    {
        return Err("invalid metadata string");
    }
    Ok(())
}

impl Version {
    /// Masterminds' `NewVersion` (in its default, coercing mode).
    pub fn parse(v: &str) -> Result<Version, String> {
        let caps = LOOSE_VERSION
            .captures(v)
            .ok_or_else(|| "invalid semantic version".to_string())?;
        let segment = |i: usize| -> Result<u64, String> {
            match caps.get(i) {
                None => Ok(0),
                Some(m) => m.as_str().trim_start_matches('.').parse::<u64>().map_err(|_| {
                    format!(
                        "error parsing version segment: strconv.ParseUint: parsing \"{}\": value out of range",
                        m.as_str().trim_start_matches('.')
                    )
                }),
            }
        };
        let pre = caps.get(5).map_or("", |m| m.as_str()).to_string();
        let metadata = caps.get(8).map_or("", |m| m.as_str()).to_string();
        if !pre.is_empty() {
            validate_prerelease(&pre)?;
        }
        if !metadata.is_empty() {
            validate_metadata(&metadata)?;
        }
        Ok(Version {
            major: segment(1)?,
            minor: segment(2)?,
            patch: segment(3)?,
            pre,
            metadata,
            original: v.to_string(),
        })
    }

    pub fn compare(&self, other: &Version) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => compare_prerelease(&self.pre, &other.pre),
            })
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre)?;
        }
        if !self.metadata.is_empty() {
            write!(f, "+{}", self.metadata)?;
        }
        Ok(())
    }
}

fn compare_prerelease(a: &str, b: &str) -> Ordering {
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..pa.len().max(pb.len()) {
        let d = compare_pre_part(
            pa.get(i).copied().unwrap_or(""),
            pb.get(i).copied().unwrap_or(""),
        );
        if d != Ordering::Equal {
            return d;
        }
    }
    Ordering::Equal
}

/// Masterminds' prerelease part order: a missing part is lower, numbers are below
/// words and compare as numbers, words compare as bytes.
fn compare_pre_part(s: &str, o: &str) -> Ordering {
    if s == o {
        return Ordering::Equal;
    }
    if s.is_empty() {
        return Ordering::Less;
    }
    if o.is_empty() {
        return Ordering::Greater;
    }
    match (s.parse::<u64>(), o.parse::<u64>()) {
        (Err(_), Err(_)) => {
            if s > o {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
        (_, Err(_)) => Ordering::Less,
        (Err(_), _) => Ordering::Greater,
        (Ok(si), Ok(oi)) => {
            if si > oi {
                Ordering::Greater
            } else {
                Ordering::Less
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Constraint {
    op: String,
    version: Version,
    dirty: bool,
    minor_dirty: bool,
    patch_dirty: bool,
}

fn is_x(s: &str) -> bool {
    matches!(s, "x" | "X" | "*")
}

fn parse_constraint(c: &str) -> Result<Constraint, String> {
    let caps = CONSTRAINT
        .captures(c)
        .ok_or_else(|| format!("improper constraint: {}", super::args::go_quote(c)))?;
    let group = |i: usize| caps.get(i).map_or("", |m| m.as_str());
    let (major, minor, patch, pre) = (group(3), group(4), group(5), group(6));
    let (mut dirty, mut minor_dirty, mut patch_dirty) = (false, false, false);
    let text = if is_x(major) || major.is_empty() {
        dirty = true;
        format!("0.0.0{pre}")
    } else if is_x(minor.trim_start_matches('.')) || minor.is_empty() {
        dirty = true;
        minor_dirty = true;
        format!("{major}.0.0{pre}")
    } else if is_x(patch.trim_start_matches('.')) || patch.is_empty() {
        dirty = true;
        patch_dirty = true;
        format!("{major}{minor}.0{pre}")
    } else {
        group(2).to_string()
    };
    let version = Version::parse(&text).map_err(|_| "constraint parser error".to_string())?;
    Ok(Constraint {
        op: group(1).to_string(),
        version,
        dirty,
        minor_dirty,
        patch_dirty,
    })
}

impl Constraint {
    fn check(&self, v: &Version, include_pre: bool) -> bool {
        if !v.pre.is_empty() && !include_pre {
            return false;
        }
        let c = &self.version;
        match self.op.as_str() {
            "" | "=" => {
                if self.dirty {
                    self.tilde(v)
                } else {
                    v.compare(c) == Ordering::Equal
                }
            }
            "!=" => self.not_equal(v),
            ">" => {
                if !self.dirty {
                    return v.compare(c) == Ordering::Greater;
                }
                if v.major != c.major {
                    return v.major > c.major;
                }
                if self.minor_dirty {
                    return false;
                }
                if self.patch_dirty {
                    return v.minor > c.minor;
                }
                v.compare(c) == Ordering::Greater
            }
            "<" => v.compare(c) == Ordering::Less,
            ">=" | "=>" => v.compare(c) != Ordering::Less,
            "<=" | "=<" => {
                if !self.dirty {
                    return v.compare(c) != Ordering::Greater;
                }
                if v.major > c.major {
                    return false;
                }
                !(v.major == c.major && v.minor > c.minor && !self.minor_dirty)
            }
            "~" | "~>" => self.tilde(v),
            "^" => self.caret(v),
            _ => false,
        }
    }

    fn not_equal(&self, v: &Version) -> bool {
        let c = &self.version;
        if self.dirty {
            if c.major != v.major {
                return true;
            }
            if c.minor != v.minor && !self.minor_dirty {
                return true;
            } else if self.minor_dirty {
                return false;
            } else if c.patch != v.patch && !self.patch_dirty {
                return true;
            } else if self.patch_dirty {
                if !v.pre.is_empty() || !c.pre.is_empty() {
                    return compare_prerelease(&v.pre, &c.pre) != Ordering::Equal;
                }
                return false;
            }
        }
        v.compare(c) != Ordering::Equal
    }

    fn tilde(&self, v: &Version) -> bool {
        let c = &self.version;
        if v.compare(c) == Ordering::Less {
            return false;
        }
        if c.major == 0 && c.minor == 0 && c.patch == 0 && !self.minor_dirty && !self.patch_dirty {
            return true;
        }
        if v.major != c.major {
            return false;
        }
        v.minor == c.minor || self.minor_dirty
    }

    fn caret(&self, v: &Version) -> bool {
        let c = &self.version;
        if v.compare(c) == Ordering::Less {
            return false;
        }
        if c.major > 0 || self.minor_dirty {
            return v.major == c.major;
        }
        if v.major > 0 {
            return false;
        }
        if c.minor > 0 || self.patch_dirty {
            return v.minor == c.minor;
        }
        if v.minor > 0 {
            return false;
        }
        c.patch == v.patch
    }
}

/// Masterminds' `Constraints`: groups joined by `||`, each a list of constraints
/// that must all hold.
pub struct Constraints {
    groups: Vec<(Vec<Constraint>, bool)>,
}

impl Constraints {
    pub fn parse(c: &str) -> Result<Constraints, String> {
        let mut rewritten = c.to_string();
        for caps in RANGE.captures_iter(c) {
            let whole = caps.get(0).map_or("", |m| m.as_str());
            let from = caps.get(1).map_or("", |m| m.as_str());
            let to = caps.get(11).map_or("", |m| m.as_str());
            rewritten = rewritten.replacen(whole, &format!(">= {from}, <= {to} "), 1);
        }
        let mut groups = Vec::new();
        for part in rewritten.split("||") {
            if !VALID.is_match(part) {
                return Err(format!(
                    "improper constraint: {}",
                    super::args::go_quote(part)
                ));
            }
            let found: Vec<&str> = FIND.find_iter(part).map(|m| m.as_str()).collect();
            let texts = if found.is_empty() { vec![part] } else { found };
            let constraints = texts
                .iter()
                .map(|t| parse_constraint(t))
                .collect::<Result<Vec<_>, _>>()?;
            let has_pre = constraints.iter().any(|c| !c.version.pre.is_empty());
            groups.push((constraints, has_pre));
        }
        Ok(Constraints { groups })
    }

    pub fn check(&self, v: &Version) -> bool {
        self.groups
            .iter()
            .any(|(group, has_pre)| group.iter().all(|c| c.check(v, *has_pre)))
    }
}

/// `v` and the version as Helm reads a Kubernetes version (`--kube-version`,
/// Masterminds semver's loose form: `1.31` is `v1.31.0`); `None` when it is not one.
pub fn kube_version(text: &str) -> Option<String> {
    Version::parse(text).ok().map(|v| format!("v{v}"))
}

/// Whether Kubernetes `version` (as [`kube_version`] gives it) meets a chart's
/// `kubeVersion` constraint, as Helm checks it before it renders; `Err` for a
/// constraint that does not parse.
pub fn kube_version_meets(constraint: &str, version: &str) -> Result<bool, String> {
    let constraints = Constraints::parse(constraint)?;
    let version = Version::parse(version)?;
    Ok(constraints.check(&version))
}

pub fn semver_compare(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("semverCompare", args, 2)?;
    let constraint = string_param(&args[0])?;
    let version = string_param(&args[1])?;
    let constraints = Constraints::parse(&constraint).map_err(FuncError::new)?;
    let version = Version::parse(&version).map_err(FuncError::new)?;
    Ok(Value::Bool(constraints.check(&version)))
}

/// `*semver.Version` as templates see it: `.Major`, `.Minor`, `.Patch` (`uint64`,
/// here Go `int64`s), `.Prerelease`, `.Metadata`, `.Original`, `.String`, and
/// `.Compare` with another version.
#[derive(Debug)]
struct VersionObject(Version);

impl Object for VersionObject {
    fn type_name(&self) -> &str {
        "*semver.Version"
    }

    fn field(&self, name: &str) -> Option<Value> {
        let v = &self.0;
        Some(match name {
            "Major" => Value::Int64(v.major as i64),
            "Minor" => Value::Int64(v.minor as i64),
            "Patch" => Value::Int64(v.patch as i64),
            "Prerelease" => Value::string(v.pre.as_str()),
            "Metadata" => Value::string(v.metadata.as_str()),
            "Original" => Value::string(v.original.as_str()),
            "String" => Value::string(v.to_string()),
            _ => return None,
        })
    }

    fn call(&self, name: &str, args: &[Value]) -> Option<FuncResult> {
        let other = match args {
            [Value::Object(o)] if o.type_name() == "*semver.Version" => {
                Version::parse(&o.display())
            }
            _ => return None,
        };
        let other = match other {
            Ok(v) => v,
            Err(e) => return Some(Err(FuncError::new(e))),
        };
        let ordering = self.0.compare(&other);
        Some(Ok(match name {
            "Compare" => Value::Int(match ordering {
                Ordering::Less => -1,
                Ordering::Equal => 0,
                Ordering::Greater => 1,
            }),
            "LessThan" => Value::Bool(ordering == Ordering::Less),
            "GreaterThan" => Value::Bool(ordering == Ordering::Greater),
            "Equal" => Value::Bool(ordering == Ordering::Equal),
            _ => return None,
        }))
    }

    fn display(&self) -> String {
        self.0.to_string()
    }
}

pub fn semver(_: &mut dyn Host, args: &[Value]) -> FuncResult {
    arity("semver", args, 1)?;
    let text = string_param(&args[0])?;
    let version = Version::parse(&text).map_err(FuncError::new)?;
    Ok(Value::Object(Arc::new(VersionObject(version))))
}
