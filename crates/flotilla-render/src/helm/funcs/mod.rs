//! Sprig's (v3, as Helm v4 ships it) and Helm's plain template functions, each a
//! [`Func`]. A render resolves calls in [`all`]'s table; Go's builtins, `include`
//! and `tpl` are the engine's. Not here: `fromToml` and `toYamlPretty`.
//!
//! Public API:
//! - [`lookup`]`(name) -> Option<Func>` and [`names`]`()`: every function here.
//! - [`all`]`() -> Funcs`: the table a Helm render uses: every function here, the
//!   YAML functions (`toYaml`, `mustToYaml`, `fromYaml`, `fromYamlArray`), `toToml`,
//!   and the key
//!   and certificate functions of [`crate::helm::crypto`].
//! - [`is_call_site_error`]`(&FuncError) -> bool`: true for the errors Go's executor
//!   reports itself at the call (a wrong count or type of arguments), which Helm
//!   prints without the `error calling NAME: ` prefix.
//! - [`MUTATES_FIRST_ARG`]: the functions that change the map they are given
//!   (`set`, `unset`, `merge`, ...), in place as in Go: maps are references.
//!
//! Arguments convert as Go's `text/template` converts them for the Go signature:
//! a `string` parameter takes only a string (`wrong type for value; expected string;
//! got float64`), an `int` parameter only a Go `int`, while `interface{}` parameters
//! take anything and Sprig converts loosely (`cast.ToInt64`, `%v`). Results have
//! Go's types: `add` an `int64`, `len` and `atoi` an `int`, `addf` a `float64`.
//!
//! Deterministic: `now` is [`Host::now_unix`], the random functions draw from
//! [`Host::generated_bytes`], `getHostByName` fails, and `lookup` answers an empty
//! map with a warning. `env` and `expandenv` are absent, as in Helm v4.

mod args;
mod dates;
mod dicts;
mod encoding;
mod flow;
mod lists;
mod math;
mod paths;
mod random;
mod reflection;
mod regex;
mod semver;
pub use semver::{kube_version, kube_version_meets};
mod serial;
mod strings;
mod toml;
mod urls;

#[cfg(test)]
mod tests;

pub use args::{MAX_LIST_ITEMS, MAX_STRING_BYTES};
pub use encoding::to_json_text;

use crate::helm::gotmpl::Funcs;
use crate::helm::gotmpl::value::{Func, FuncError};

/// Helm's YAML functions, beside [`TABLE`] because they live on `helm::yaml`.
const YAML_FUNCS: &[(&str, Func)] = &[
    ("fromYaml", serial::from_yaml),
    ("fromYamlArray", serial::from_yaml_array),
    ("mustToYaml", serial::must_to_yaml),
    ("toToml", toml::to_toml),
    ("toYaml", serial::to_yaml),
];

/// Every function a Helm render's templates may call (besides Go's builtins,
/// `include` and `tpl`, which are the engine's).
pub fn all() -> Funcs {
    let mut funcs: Funcs = TABLE
        .iter()
        .chain(YAML_FUNCS)
        .chain(crate::helm::crypto::FUNCS)
        .copied()
        .collect();
    // Helm's engine replaces these two so its report shows their message alone.
    funcs.insert("fail", flow::engine_fail);
    funcs.insert("required", flow::engine_required);
    funcs
}

/// The functions that change their first argument (a map) in Go.
pub const MUTATES_FIRST_ARG: &[&str] = &[
    "merge",
    "mergeOverwrite",
    "mustMerge",
    "mustMergeOverwrite",
    "set",
    "unset",
];

/// Every function, sorted by name (a test checks the order, [`lookup`] relies on it).
const TABLE: &[(&str, Func)] = &[
    ("abbrev", strings::abbrev),
    ("abbrevboth", strings::abbrevboth),
    ("add", math::add),
    ("add1", math::add1),
    ("add1f", math::add1f),
    ("addf", math::addf),
    ("adler32sum", encoding::adler32sum),
    ("ago", dates::ago),
    ("all", flow::all),
    ("any", flow::any),
    ("append", lists::append),
    ("atoi", math::atoi),
    ("b32dec", encoding::b32dec),
    ("b32enc", encoding::b32enc),
    ("b64dec", encoding::b64dec),
    ("b64enc", encoding::b64enc),
    ("base", paths::base),
    ("bcrypt", random::bcrypt),
    ("biggest", math::biggest),
    ("camelcase", strings::camelcase),
    ("cat", strings::cat),
    ("ceil", math::ceil),
    ("chunk", lists::chunk),
    ("clean", paths::clean),
    ("coalesce", flow::coalesce),
    ("compact", lists::compact),
    ("concat", lists::concat),
    ("contains", strings::contains),
    ("date", dates::date),
    ("dateInZone", dates::date_in_zone),
    ("dateModify", dates::date_modify),
    ("date_in_zone", dates::date_in_zone_snake),
    ("date_modify", dates::date_modify_snake),
    ("deepCopy", dicts::deep_copy),
    ("deepEqual", flow::deep_equal_fn),
    ("default", flow::default),
    ("dict", dicts::dict),
    ("dig", dicts::dig),
    ("dir", paths::dir),
    ("div", math::div),
    ("divf", math::divf),
    ("duration", dates::duration),
    ("durationRound", dates::duration_round),
    ("empty", flow::empty),
    ("ext", paths::ext),
    ("fail", flow::fail),
    ("first", lists::first),
    ("float64", math::float64),
    ("floor", math::floor),
    ("fromJson", encoding::from_json),
    ("fromJsonArray", encoding::from_json_array),
    ("get", dicts::get),
    ("getHostByName", flow::get_host_by_name),
    ("has", lists::has),
    ("hasKey", dicts::has_key),
    ("hasPrefix", strings::has_prefix),
    ("hasSuffix", strings::has_suffix),
    ("htmlDate", dates::html_date),
    ("htmlDateInZone", dates::html_date_in_zone),
    ("htpasswd", random::htpasswd),
    ("indent", strings::indent),
    ("initial", lists::initial),
    ("initials", strings::initials),
    ("int", math::int),
    ("int64", math::int64),
    ("isAbs", paths::is_abs),
    ("join", strings::join),
    ("kebabcase", strings::kebabcase),
    ("keys", dicts::keys),
    ("kindIs", reflection::kind_is),
    ("kindOf", reflection::kind_of),
    ("last", lists::last),
    ("list", lists::list),
    ("lookup", flow::lookup),
    ("lower", strings::lower),
    ("max", math::max),
    ("maxf", math::maxf),
    ("merge", dicts::merge),
    ("mergeOverwrite", dicts::merge_overwrite),
    ("min", math::min),
    ("minf", math::minf),
    ("mod", math::modulo),
    ("mul", math::mul),
    ("mulf", math::mulf),
    ("mustAppend", lists::must_append),
    ("mustChunk", lists::must_chunk),
    ("mustCompact", lists::must_compact),
    ("mustDateModify", dates::must_date_modify),
    ("mustDeepCopy", dicts::must_deep_copy),
    ("mustFirst", lists::must_first),
    ("mustFromJson", encoding::must_from_json),
    ("mustHas", lists::must_has),
    ("mustInitial", lists::must_initial),
    ("mustLast", lists::must_last),
    ("mustMerge", dicts::must_merge),
    ("mustMergeOverwrite", dicts::must_merge_overwrite),
    ("mustPrepend", lists::must_prepend),
    ("mustPush", lists::must_push),
    ("mustRegexFind", regex::must_regex_find),
    ("mustRegexFindAll", regex::must_regex_find_all),
    ("mustRegexMatch", regex::must_regex_match),
    ("mustRegexReplaceAll", regex::must_regex_replace_all),
    (
        "mustRegexReplaceAllLiteral",
        regex::must_regex_replace_all_literal,
    ),
    ("mustRegexSplit", regex::must_regex_split),
    ("mustRest", lists::must_rest),
    ("mustReverse", lists::must_reverse),
    ("mustSlice", lists::must_slice),
    ("mustToDate", dates::must_to_date),
    ("mustToJson", encoding::must_to_json),
    ("mustToPrettyJson", encoding::must_to_pretty_json),
    ("mustToRawJson", encoding::must_to_raw_json),
    ("mustUniq", lists::must_uniq),
    ("mustWithout", lists::must_without),
    ("must_date_modify", dates::must_date_modify_snake),
    ("nindent", strings::nindent),
    ("nospace", strings::nospace),
    ("now", dates::now),
    ("omit", dicts::omit),
    ("osBase", paths::base),
    ("osClean", paths::clean),
    ("osDir", paths::dir),
    ("osExt", paths::ext),
    ("osIsAbs", paths::is_abs),
    ("pick", dicts::pick),
    ("pluck", dicts::pluck),
    ("plural", strings::plural),
    ("prepend", lists::prepend),
    ("push", lists::push),
    ("quote", strings::quote),
    ("randAlpha", random::rand_alpha),
    ("randAlphaNum", random::rand_alpha_num),
    ("randAscii", random::rand_ascii),
    ("randBytes", random::rand_bytes),
    ("randInt", random::rand_int),
    ("randNumeric", random::rand_numeric),
    ("regexFind", regex::regex_find),
    ("regexFindAll", regex::regex_find_all),
    ("regexMatch", regex::regex_match),
    ("regexQuoteMeta", regex::regex_quote_meta),
    ("regexReplaceAll", regex::regex_replace_all),
    ("regexReplaceAllLiteral", regex::regex_replace_all_literal),
    ("regexSplit", regex::regex_split),
    ("repeat", strings::repeat),
    ("replace", strings::replace),
    ("required", flow::required),
    ("rest", lists::rest),
    ("reverse", lists::reverse),
    ("round", math::round),
    ("semver", semver::semver),
    ("semverCompare", semver::semver_compare),
    ("seq", lists::seq),
    ("set", dicts::set),
    ("sha1sum", encoding::sha1sum),
    ("sha256sum", encoding::sha256sum),
    ("sha512sum", encoding::sha512sum),
    ("shuffle", random::shuffle),
    ("slice", lists::slice),
    ("snakecase", strings::snakecase),
    ("sortAlpha", lists::sort_alpha),
    ("split", strings::split),
    ("splitList", strings::split_list),
    ("splitn", strings::splitn),
    ("squote", strings::squote),
    ("sub", math::sub),
    ("subf", math::subf),
    ("substr", strings::substr),
    ("swapcase", strings::swapcase),
    ("ternary", flow::ternary),
    ("title", strings::title),
    ("toDate", dates::to_date),
    ("toDecimal", math::to_decimal),
    ("toJson", encoding::to_json),
    ("toPrettyJson", encoding::to_pretty_json),
    ("toRawJson", encoding::to_raw_json),
    ("toString", strings::to_string),
    ("toStrings", strings::to_strings),
    ("trim", strings::trim),
    ("trimAll", strings::trim_all),
    ("trimPrefix", strings::trim_prefix),
    ("trimSuffix", strings::trim_suffix),
    ("trimall", strings::trimall),
    ("trunc", strings::trunc),
    ("tuple", lists::list),
    ("typeIs", reflection::type_is),
    ("typeIsLike", reflection::type_is_like),
    ("typeOf", reflection::type_of),
    ("uniq", lists::uniq),
    ("unixEpoch", dates::unix_epoch),
    ("unset", dicts::unset),
    ("until", lists::until),
    ("untilStep", lists::until_step),
    ("untitle", strings::untitle),
    ("upper", strings::upper),
    ("urlParse", urls::url_parse),
    ("uuidv4", random::uuidv4),
    ("values", dicts::values),
    ("without", lists::without),
    ("wrap", strings::wrap),
    ("wrapWith", strings::wrap_with),
];

/// The function of that name, if Sprig or Helm has it (and flotilla implements it).
pub fn lookup(name: &str) -> Option<Func> {
    TABLE
        .binary_search_by(|(n, _)| (*n).cmp(name))
        .ok()
        .map(|i| TABLE[i].1)
}

/// Every function name [`lookup`] resolves, sorted.
pub fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().map(|(n, _)| *n)
}

/// Whether Go's executor reports this error itself at the call site (a wrong count
/// or type of arguments: `wrong number of args for trimSuffix: want 2 got 1`), as
/// opposed to an error the function returned (`error calling NAME: ...`).
pub fn is_call_site_error(err: &FuncError) -> bool {
    args::CALL_SITE_PREFIXES
        .iter()
        .any(|p| err.0.starts_with(p))
}
