//! No crate has an import circle between its files: for each crate's `src/`, the
//! references from one file's module to another's (`use crate::…`, `use super::…`,
//! `crate::x::` paths, a child module's name) form no cycle.
//!
//! A module's own `mod child;` and a module's references to its ancestors (a
//! child's `use super::*`, `crate::Item` of the crate's root) are the tree itself,
//! not circles, and are not counted; neither are test modules (`#[cfg(test)]`),
//! whose place is beside what they test. The reading is lexical (comments and
//! literals skipped, `use` trees expanded), which is enough for paths to modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Circles allowed to stay, each as the set of files in it (relative to the
/// workspace): none.
const ALLOWED: &[&[&str]] = &[];

/// One lexical token of Rust source that matters for paths.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens of `text`, without comments, string and character literals,
/// lifetimes and numbers.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i = skip_block_comment(&chars, i);
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if c == 'r' && matches!(next, Some('"' | '#')) && raw_string_start(&chars, i + 1) {
            i = skip_raw_string(&chars, i + 1);
        } else if c == '\'' {
            i = skip_quote(&chars, i);
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // A byte string's `b` (or a raw one's `br`) is no identifier.
            if !(matches!(word.as_str(), "b" | "br") && chars.get(i) == Some(&'"')) {
                out.push(Token::Ident(word));
            }
        } else if c == ':' && next == Some(':') {
            out.push(Token::Path);
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(Token::Punct(c));
            }
            i += 1;
        }
    }
    out
}

fn skip_block_comment(chars: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    i
}

/// Past the end of a string whose opening quote is before `i`.
fn skip_string(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Whether `#…#"` (or `"`) starts at `i`: a raw string, not `r#ident`.
fn raw_string_start(chars: &[char], mut i: usize) -> bool {
    while chars.get(i) == Some(&'#') {
        i += 1;
    }
    chars.get(i) == Some(&'"')
}

fn skip_raw_string(chars: &[char], mut i: usize) -> usize {
    let mut hashes = 0;
    while chars.get(i) == Some(&'#') {
        hashes += 1;
        i += 1;
    }
    i += 1;
    while i < chars.len() {
        if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
            return i + 1 + hashes;
        }
        i += 1;
    }
    i
}

/// Past a character literal, or past the quote of a lifetime.
fn skip_quote(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        let mut j = i + 2;
        while j < chars.len() && chars[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}

/// What one file says: the modules it declares (`mod x;`, not under
/// `#[cfg(test)]`) and the paths it refers to, each with the inline module it is
/// written in (relative to the file's module).
#[derive(Debug, Default)]
struct FileRefs {
    children: Vec<String>,
    paths: Vec<(Vec<String>, Vec<String>)>,
}

/// Reads the declarations and paths of one file's tokens.
fn read_refs(tokens: &[Token]) -> FileRefs {
    let mut refs = FileRefs::default();
    // The inline modules open here, with the brace depth each closes at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut cfg_test = false;
    let mut i = 0;
    while i < tokens.len() {
        let ident = |k: usize| match tokens.get(k) {
            Some(Token::Ident(word)) => Some(word.as_str()),
            _ => None,
        };
        match &tokens[i] {
            Token::Punct('#') if tokens.get(i + 1) == Some(&Token::Punct('[')) => {
                let end = matching(tokens, i + 1, '[', ']');
                let attribute = &tokens[i + 2..end];
                cfg_test |= attribute.first() == Some(&Token::Ident("cfg".into()))
                    && attribute.contains(&Token::Ident("test".into()))
                    && !attribute.contains(&Token::Ident("not".into()));
                i = end + 1;
                continue;
            }
            Token::Ident(word) if word == "mod" => {
                let name = ident(i + 1).unwrap_or_default().to_string();
                match tokens.get(i + 2) {
                    Some(Token::Punct(';')) if !cfg_test => refs.children.push(name),
                    Some(Token::Punct('{')) if cfg_test => {
                        i = matching(tokens, i + 2, '{', '}');
                    }
                    Some(Token::Punct('{')) => {
                        depth += 1;
                        inline.push((name, depth));
                        i += 2;
                    }
                    _ => {}
                }
                cfg_test = false;
                i += 1;
                continue;
            }
            Token::Ident(word) if word == "use" => {
                let end = (i..tokens.len())
                    .find(|&k| tokens[k] == Token::Punct(';'))
                    .unwrap_or(tokens.len());
                let within: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
                let mut paths = Vec::new();
                use_tree(&tokens[i + 1..end], &[], &mut paths);
                refs.paths
                    .extend(paths.into_iter().map(|p| (within.clone(), p)));
                i = end + 1;
                cfg_test = false;
                continue;
            }
            Token::Ident(_) if !matches!(tokens.get(i.wrapping_sub(1)), Some(Token::Path)) => {
                let mut path = vec![ident(i).unwrap_or_default().to_string()];
                let mut k = i + 1;
                while tokens.get(k) == Some(&Token::Path) {
                    match ident(k + 1) {
                        Some(word) => path.push(word.to_string()),
                        None => break,
                    }
                    k += 2;
                }
                if path.len() > 1 {
                    let within = inline.iter().map(|(n, _)| n.clone()).collect();
                    refs.paths.push((within, path));
                }
                i = k;
                continue;
            }
            Token::Punct('{') => {
                depth += 1;
                cfg_test = false;
            }
            Token::Punct('}') => {
                cfg_test = false;
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            Token::Punct(';') => cfg_test = false,
            _ => {}
        }
        i += 1;
    }
    refs
}

/// The index of the bracket closing the one at `open`.
fn matching(tokens: &[Token], open: usize, left: char, right: char) -> usize {
    let mut depth = 0;
    for (k, token) in tokens.iter().enumerate().skip(open) {
        if *token == Token::Punct(left) {
            depth += 1;
        } else if *token == Token::Punct(right) {
            depth -= 1;
            if depth == 0 {
                return k;
            }
        }
    }
    tokens.len()
}

/// Expands a `use` tree (`a::{b, c::d as e, self, *}`) into its paths.
fn use_tree(tokens: &[Token], prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::Ident(word) if word == "as" => break,
            Token::Ident(word) if word == "self" && !path.is_empty() => {}
            Token::Ident(word) => path.push(word.clone()),
            Token::Punct('{') => {
                let end = matching(tokens, i, '{', '}');
                let mut start = i + 1;
                let mut level = 0;
                for (k, token) in tokens.iter().enumerate().take(end + 1).skip(i + 1) {
                    match token {
                        Token::Punct('{') => level += 1,
                        Token::Punct('}') if level > 0 => level -= 1,
                        Token::Punct(',') | Token::Punct('}') if level == 0 => {
                            use_tree(&tokens[start..k], &path, out);
                            start = k + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            _ => {}
        }
        i += 1;
    }
    if !path.is_empty() {
        out.push(path);
    }
}

/// A crate's modules, by module path, with their files.
struct Crate {
    files: BTreeMap<Vec<String>, String>,
    refs: BTreeMap<String, FileRefs>,
}

/// The modules reachable from `root` (a file of `sources`, which maps each file's
/// path to its text): each `mod x;` of a file `d/m.rs` is `d/m/x.rs` or
/// `d/m/x/mod.rs`, of `d/mod.rs`, `d/lib.rs` or `d/main.rs` it is `d/x.rs` or
/// `d/x/mod.rs`.
fn modules(sources: &BTreeMap<String, String>, root: &str) -> Crate {
    let mut found = Crate {
        files: BTreeMap::new(),
        refs: BTreeMap::new(),
    };
    let mut pending = vec![(Vec::<String>::new(), root.to_string())];
    while let Some((module, file)) = pending.pop() {
        let Some(text) = sources.get(&file) else {
            continue;
        };
        let refs = read_refs(&tokens(text));
        let path = Path::new(&file);
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let parent = path.parent().unwrap_or(Path::new(""));
        let dir = match stem {
            "mod" | "lib" | "main" => parent.to_path_buf(),
            _ => parent.join(stem),
        };
        for child in &refs.children {
            let flat = dir.join(format!("{child}.rs")).display().to_string();
            let nested = dir.join(child).join("mod.rs").display().to_string();
            let file = if sources.contains_key(&flat) {
                flat
            } else {
                nested
            };
            let mut path = module.clone();
            path.push(child.clone());
            pending.push((path, file));
        }
        found.files.insert(module, file.clone());
        found.refs.insert(file, refs);
    }
    found
}

/// The edges file -> file of a crate, each with a path (or `mod` declaration) that
/// makes it.
fn edges(krate: &Crate) -> BTreeMap<(String, String), String> {
    let mut edges = BTreeMap::new();
    for (module, file) in &krate.files {
        let refs = &krate.refs[file];
        for child in &refs.children {
            let mut path = module.clone();
            path.push(child.clone());
            if let Some(to) = krate.files.get(&path) {
                edges
                    .entry((file.clone(), to.clone()))
                    .or_insert_with(|| format!("mod {child}"));
            }
        }
        for (within, path) in &refs.paths {
            let mut here = module.clone();
            here.extend(within.iter().cloned());
            let Some(target) = resolve(krate, module, &here, path, refs) else {
                continue;
            };
            // Itself, or an ancestor: the tree, not a circle.
            if target.len() <= module.len() && module[..target.len()] == target[..] {
                continue;
            }
            let to = krate.files[&target].clone();
            edges
                .entry((file.clone(), to))
                .or_insert_with(|| path.join("::"));
        }
    }
    edges
}

/// The module `path`, written in module `here` (inline modules included) of the
/// file module `module`, names: the deepest file module along it.
fn resolve(
    krate: &Crate,
    module: &[String],
    here: &[String],
    path: &[String],
    refs: &FileRefs,
) -> Option<Vec<String>> {
    let (mut base, rest): (Vec<String>, &[String]) = match path[0].as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => {
            let supers = path.iter().take_while(|s| *s == "super").count();
            let base = here[..here.len().checked_sub(supers)?].to_vec();
            (base, &path[supers..])
        }
        first if here.len() == module.len() && refs.children.iter().any(|c| c == first) => {
            (here.to_vec(), path)
        }
        _ => return None,
    };
    // An inline module's path ends at the file module holding it.
    while !krate.files.contains_key(&base) {
        base.pop()?;
    }
    for segment in rest {
        base.push(segment.clone());
        if !krate.files.contains_key(&base) {
            base.pop();
            break;
        }
    }
    Some(base)
}

/// The circles among files: each strongly connected set of more than one file, with
/// one cycle through it (each step with a path that makes it).
fn circles(edges: &BTreeMap<(String, String), String>) -> Vec<(BTreeSet<String>, Vec<String>)> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(at) = stack.pop() {
            for &to in next.get(at).into_iter().flatten() {
                if seen.insert(to) {
                    stack.push(to);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> =
        next.keys().map(|&file| (file, reach(file))).collect();
    let mut found: Vec<(BTreeSet<String>, Vec<String>)> = Vec::new();
    for (&file, reaches) in &reached {
        if !reaches.contains(file) || found.iter().any(|(set, _)| set.contains(file)) {
            continue;
        }
        let set: BTreeSet<String> = reaches
            .iter()
            .filter(|other| reached.get(**other).is_some_and(|r| r.contains(file)))
            .map(|s| s.to_string())
            .collect();
        found.push((set.clone(), cycle_through(file, &set, &next, edges)));
    }
    found
}

/// A shortest cycle from `file` back to it within `set`, as lines "a -> b (path)".
fn cycle_through(
    file: &str,
    set: &BTreeSet<String>,
    next: &BTreeMap<&str, Vec<&str>>,
    edges: &BTreeMap<(String, String), String>,
) -> Vec<String> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([file]);
    'search: while let Some(at) = queue.pop_front() {
        for &to in next.get(at).into_iter().flatten() {
            if !set.contains(to) || came_from.contains_key(to) {
                continue;
            }
            came_from.insert(to, at);
            if to == file {
                break 'search;
            }
            queue.push_back(to);
        }
    }
    let mut steps = Vec::new();
    let mut at = file;
    while let Some(&from) = came_from.get(at) {
        let why = &edges[&(from.to_string(), at.to_string())];
        steps.push(format!("{from} -> {at} ({why})"));
        at = from;
        if at == file {
            break;
        }
    }
    steps.reverse();
    steps
}

/// The circles of the crate whose files are `sources`, from each of `roots`.
fn crate_circles(
    sources: &BTreeMap<String, String>,
    roots: &[&str],
) -> Vec<(BTreeSet<String>, Vec<String>)> {
    let mut all = BTreeMap::new();
    for root in roots {
        all.extend(edges(&modules(sources, root)));
    }
    circles(&all)
}

/// Every `.rs` file under `dir`, by its path relative to `workspace`.
fn read_sources(workspace: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            read_sources(workspace, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("a source file reads");
            let relative = path.strip_prefix(workspace).unwrap_or(&path);
            out.insert(relative.display().to_string(), text);
        }
    }
}

#[test]
fn no_crate_has_an_import_circle_between_its_files() {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut crates: Vec<PathBuf> = vec![workspace.join("src")];
    let members = std::fs::read_dir(workspace.join("crates")).expect("crates/ reads");
    crates.extend(members.flatten().map(|e| e.path().join("src")));
    crates.sort();
    let mut failures = Vec::new();
    let mut allowed_seen = 0;
    for src in crates {
        let mut sources = BTreeMap::new();
        read_sources(&workspace, &src, &mut sources);
        let relative = src.strip_prefix(&workspace).expect("in the workspace");
        let roots: Vec<String> = ["lib.rs", "main.rs"]
            .iter()
            .map(|root| relative.join(root).display().to_string())
            .filter(|root| sources.contains_key(root))
            .collect();
        assert!(
            !roots.is_empty(),
            "{} has no lib.rs or main.rs",
            src.display()
        );
        let roots: Vec<&str> = roots.iter().map(String::as_str).collect();
        for (set, cycle) in crate_circles(&sources, &roots) {
            let allowed = ALLOWED
                .iter()
                .any(|files| set == files.iter().map(|f| f.to_string()).collect());
            if allowed {
                allowed_seen += 1;
            } else {
                failures.push(format!("a circle among {set:?}:\n  {}", cycle.join("\n  ")));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // An allowed circle that is gone is taken off the list.
    assert_eq!(
        allowed_seen,
        ALLOWED.len(),
        "a circle in ALLOWED is gone: remove it"
    );
}

fn sources(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, text)| (path.to_string(), text.to_string()))
        .collect()
}

#[test]
fn the_checker_finds_a_circle_between_siblings_and_prints_it() {
    let files = sources(&[
        ("src/lib.rs", "mod a;\nmod b;\npub struct Root;\n"),
        (
            "src/a.rs",
            "// use crate::b::Ignored; is a comment\nuse crate::b::{self, B};\n",
        ),
        ("src/b/mod.rs", "mod c;\npub struct B;\n"),
        (
            "src/b/c.rs",
            "use super::super::Root;\nfn f() { let _ = crate::a::A; }\n",
        ),
    ]);
    let found = crate_circles(&files, &["src/lib.rs"]);
    assert_eq!(found.len(), 1, "{found:?}");
    let (set, cycle) = &found[0];
    let expected: BTreeSet<String> = ["src/a.rs", "src/b/mod.rs", "src/b/c.rs"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(set, &expected);
    assert_eq!(
        cycle,
        &[
            "src/a.rs -> src/b/mod.rs (crate::b)",
            "src/b/mod.rs -> src/b/c.rs (mod c)",
            "src/b/c.rs -> src/a.rs (crate::a::A)",
        ]
        .map(String::from)
        .to_vec()
    );
}

#[test]
fn the_tree_itself_tests_and_literals_are_no_circle() {
    let files = sources(&[
        (
            "src/lib.rs",
            "mod a;\nmod b;\npub use a::A;\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "src/a.rs",
            "use super::*;\nuse crate::b::B;\npub struct A;\n\
             const S: &str = \"crate::b::x and crate::a\";\nconst R: &str = r#\"super::b\"#;\n",
        ),
        (
            "src/b.rs",
            "pub struct B;\nfn f<'a>(x: &'a str) -> char { let _ = crate::A; '\"' }\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n\
             pub mod inner {\n    use super::B;\n}\n",
        ),
        ("src/tests.rs", "use crate::a::A;\nuse crate::b::B;\n"),
    ]);
    let found = crate_circles(&files, &["src/lib.rs"]);
    assert!(found.is_empty(), "{found:?}");
    let krate = modules(&files, "src/lib.rs");
    let edges: Vec<(String, String)> = edges(&krate).into_keys().collect();
    assert_eq!(
        edges,
        [
            ("src/a.rs".to_string(), "src/b.rs".to_string()),
            ("src/lib.rs".to_string(), "src/a.rs".to_string()),
            ("src/lib.rs".to_string(), "src/b.rs".to_string()),
        ]
    );
}
