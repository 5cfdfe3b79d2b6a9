//! The crate's modules import downward only, as `lib.rs` lists them: the core in its
//! layers, the chain (client, database) on the core alone, each extra on what it
//! extends, the metrics on everything. A module that reached up (the core naming the
//! client, the client naming admission) would no longer build without the features
//! above it, and a copier could not take the core or the chain alone. This reads the
//! sources as text: what `crate::` paths each module names outside comments and tests,
//! mapped to the module that defines them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The core, bottom first: each may import only the ones before it.
const CORE: [&str; 8] = [
    "stage", "header", "mode", "trace", "timing", "deadline", "problem", "ingress",
];

/// What a module outside the core may import besides the core.
fn allowed_above_core(module: &str) -> Option<&'static [&'static str]> {
    match module {
        // A named downstream (for the clients), the database, the tools: the core alone.
        "downstream" | "db" | "tools" => Some(&[]),
        // The clients: HTTP, and gRPC beside it.
        "client" | "grpc" => Some(&["downstream"]),
        // The job queue: the database envelope under it.
        "queue" => Some(&["db"]),
        // The extras of the client.
        "admission" | "hedging" | "retry_budget" => Some(&["client", "downstream"]),
        // The metrics report on every part.
        "metrics" => Some(&[
            "downstream",
            "grpc",
            "client",
            "db",
            "tools",
            "admission",
            "hedging",
            "retry_budget",
        ]),
        // The crate root re-exports; `testing` reaches anywhere (it is hidden).
        "lib" | "testing" => None,
        other => panic!("module {other} is not in the layering: add it to tests/layers.rs"),
    }
}

fn sources(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The top-level module a source file belongs to.
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_str().unwrap().trim_end_matches(".rs").to_owned()
}

/// The code of a file without comments and without its test modules (a unit test may
/// reach into `testing`, which reaches into everything).
fn code(text: &str, file: &Path) -> String {
    if file.file_name().is_some_and(|n| n == "tests.rs") {
        return String::new();
    }
    let mut kept = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" {
            match lines.peek() {
                // `mod tests;`: its own file, skipped as such.
                Some(next) if next.starts_with("mod ") && next.ends_with(';') => {
                    lines.next();
                    continue;
                }
                // An inline test module runs to the end of the file (checked below).
                Some(next) if next.starts_with("mod ") => break,
                _ => {}
            }
        }
        let line = line.split("//").next().unwrap();
        kept.push_str(line);
        kept.push('\n');
    }
    kept
}

/// The names `lib.rs` re-exports at the root, and the module each comes from.
fn root_names(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("pub use ")) {
        let (module, items) = line.trim_end_matches(';').split_once("::").unwrap();
        let items = items.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            names.insert(item.to_owned(), module.to_owned());
        }
    }
    names
}

/// Every top-level module the code names through `crate::`.
fn imports(code: &str, roots: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut name = |ident: &str| {
        let module = roots
            .get(ident)
            .cloned()
            .unwrap_or_else(|| ident.to_owned());
        found.insert(module);
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::B, C}`: the first segment of each item at the top level.
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        name(item.trim().split("::").next().unwrap());
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            if !item.trim().is_empty() {
                name(item.trim().split("::").next().unwrap());
            }
        } else {
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            name(&ident);
        }
    }
    found
}

#[test]
fn modules_import_downward_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let roots = root_names(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut upward = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        let text = std::fs::read_to_string(file).unwrap();
        let allowed: BTreeSet<&str> = match CORE.iter().position(|m| *m == module) {
            Some(layer) => CORE[..layer].iter().copied().collect(),
            None => match allowed_above_core(&module) {
                Some(above) => CORE.iter().chain(above).copied().collect(),
                None => continue,
            },
        };
        for import in imports(&code(&text, file), &roots) {
            if import != module && !allowed.contains(import.as_str()) {
                upward.push(format!("{} imports {import}", file.display()));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports against the layers:\n{}",
        upward.join("\n")
    );
}

/// The check above stops reading a file at an inline test module: code after one would
/// go unchecked.
#[test]
fn every_inline_test_module_is_last() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (at, pair) in lines.windows(2).enumerate() {
            let inline = pair[0].trim() == "#[cfg(test)]"
                && pair[1].starts_with("mod ")
                && pair[1].ends_with('{');
            if inline {
                let end = lines[at..].iter().position(|l| *l == "}").map(|p| p + at);
                assert_eq!(
                    end,
                    Some(lines.len() - 1),
                    "{}: code after the test module at line {}",
                    file.display(),
                    at + 1
                );
            }
        }
    }
}

#[test]
fn the_reader_finds_grouped_and_root_imports() {
    let roots = root_names("pub use stage::{Downstream, Stage};\npub use problem::Problem;");
    let code = "use crate::{metrics::X, Problem};\nlet d = crate::Downstream::new(\"a\");";
    let found = imports(code, &roots);
    let expected: BTreeSet<String> = ["metrics", "problem", "stage"].map(String::from).into();
    assert_eq!(found, expected);
}
