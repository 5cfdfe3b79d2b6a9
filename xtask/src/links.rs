//! `cargo xtask check-links`: every relative link of every Markdown file in the
//! repository resolves, so the documentation cannot point at a file or a heading that
//! is gone.
//!
//! The files are git's (`git ls-files`: tracked, plus untracked ones that are not
//! ignored, so a new page is checked before its first commit). Each is read as GitHub
//! reads it, by a CommonMark parser (`pulldown-cmark`): every inline link or image and
//! every reference definition is checked, wherever it is (a quote, a list), and nothing
//! in code (fenced, indented, or a span) counts. A target with a scheme (`https:`,
//! `mailto:`) is left alone; any other must name a file or folder that git has, relative
//! to the file (or to the repository's root when it starts with `/`). A `#anchor` into
//! a Markdown file, or into the same file (`(#anchor)`), must name one of its headings,
//! by GitHub's rule for heading ids ([`slug`]).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use anyhow::Context as _;
use pulldown_cmark::{Event, LinkType, Options, Parser, Tag, TagEnd};

/// A link target and the (1-based) line it is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The line of the target's opening `(` (or of the reference definition).
    pub line: usize,
    /// The target as written, without angle brackets or a title.
    pub target: String,
}

/// A link that does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The Markdown file, relative to the repository's root.
    pub file: PathBuf,
    /// The line of the link.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
    }
}

/// Checks every Markdown file git has under `root`.
pub fn check_repository(root: &Path) -> anyhow::Result<(usize, Vec<Problem>)> {
    let files = git_files(root)?;
    let markdown: Vec<&PathBuf> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("md")))
        .collect();
    let mut checker = Checker::new(root, &files);
    let mut problems = Vec::new();
    for file in &markdown {
        problems.extend(checker.check_file(file)?);
    }
    Ok((markdown.len(), problems))
}

/// The files git has: tracked, and untracked but not ignored, that exist on disk.
fn git_files(root: &Path) -> anyhow::Result<BTreeSet<PathBuf>> {
    let output = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .context("cannot run git ls-files")?;
    anyhow::ensure!(
        output.status.success(),
        "git ls-files failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output
        .stdout
        .split(|&b| b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| PathBuf::from(String::from_utf8_lossy(name).into_owned()))
        .filter(|path| root.join(path).is_file())
        .collect())
}

/// Resolves links against a set of files, reading each Markdown target once.
pub struct Checker<'a> {
    root: &'a Path,
    files: &'a BTreeSet<PathBuf>,
    dirs: HashSet<PathBuf>,
    anchors: HashMap<PathBuf, HashSet<String>>,
}

impl<'a> Checker<'a> {
    /// A checker for `files`, paths relative to `root`.
    pub fn new(root: &'a Path, files: &'a BTreeSet<PathBuf>) -> Self {
        let dirs = files
            .iter()
            .flat_map(|f| f.ancestors().skip(1).map(Path::to_path_buf))
            .collect();
        Self {
            root,
            files,
            dirs,
            anchors: HashMap::new(),
        }
    }

    /// The problems of one file's links.
    pub fn check_file(&mut self, file: &Path) -> anyhow::Result<Vec<Problem>> {
        let text = std::fs::read_to_string(self.root.join(file))
            .with_context(|| format!("cannot read {}", file.display()))?;
        let mut problems = Vec::new();
        for link in links(&text) {
            if let Some(message) = self.resolve(file, &text, &link.target) {
                problems.push(Problem {
                    file: file.to_path_buf(),
                    line: link.line,
                    message,
                });
            }
        }
        Ok(problems)
    }

    /// `None` when `target`, written in `file` (whose text is `text`), resolves.
    fn resolve(&mut self, file: &Path, text: &str, target: &str) -> Option<String> {
        if is_external(target) {
            return None;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((path, anchor)) => (path, Some(percent_decode(anchor))),
            None => (target, None),
        };
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() {
            let anchor = anchor.filter(|a| !a.is_empty())?;
            return (!anchors(text).contains(&anchor))
                .then(|| format!("`{target}`: no heading `#{anchor}` in this file"));
        }
        let decoded = percent_decode(path);
        let joined = match decoded.strip_prefix('/') {
            Some(from_root) => PathBuf::from(from_root),
            None => file.parent().unwrap_or(Path::new("")).join(&decoded),
        };
        let Some(resolved) = normalize(&joined) else {
            return Some(format!("`{target}` leaves the repository"));
        };
        self.exists_with_anchor(target, resolved, anchor)
    }

    /// `None` when `resolved` is a file or folder git has and `anchor`, if any, is a
    /// heading of it.
    fn exists_with_anchor(
        &mut self,
        target: &str,
        resolved: PathBuf,
        anchor: Option<String>,
    ) -> Option<String> {
        let is_file = self.files.contains(&resolved);
        let is_dir = resolved.as_os_str().is_empty() || self.dirs.contains(&resolved);
        if !is_file && !is_dir {
            return Some(format!("`{target}`: no file {}", resolved.display()));
        }
        let anchor = anchor.filter(|a| !a.is_empty())?;
        let markdown = resolved
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("md"));
        if !is_file || !markdown {
            // Line anchors (`#L10`) and the like: GitHub's, not the file's.
            return None;
        }
        let root = self.root;
        let known = self.anchors.entry(resolved.clone()).or_insert_with(|| {
            std::fs::read_to_string(root.join(&resolved))
                .map(|t| anchors(&t))
                .unwrap_or_default()
        });
        (!known.contains(&anchor)).then(|| {
            format!(
                "`{target}`: no heading `#{anchor}` in {}",
                resolved.display()
            )
        })
    }
}

/// A target with a scheme (`https://`, `mailto:`), which this does not check.
fn is_external(target: &str) -> bool {
    let scheme = target.split_once(':').map(|(s, _)| s);
    scheme.is_some_and(|s| {
        !s.is_empty()
            && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            && !s.contains('/')
    })
}

/// `a/./b/../c` as `a/c`; `None` when `..` climbs above the root.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for component in path.components() {
        match component {
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(part) => parts.push(part),
        }
    }
    Some(parts.iter().collect())
}

/// `%20` and the like, decoded; anything malformed is kept as written.
fn percent_decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// The parser as GitHub's Markdown needs it: tables, footnotes (`[^1]` is not a link),
/// strikethrough, task lists.
fn parser(text: &str) -> Parser<'_> {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS;
    Parser::new_ext(text, options)
}

/// The 1-based line of each byte offset of `text`.
struct Lines(Vec<usize>);

impl Lines {
    fn of(text: &str) -> Self {
        Self(text.match_indices('\n').map(|(at, _)| at).collect())
    }

    fn line(&self, offset: usize) -> usize {
        self.0.partition_point(|&newline| newline < offset) + 1
    }
}

/// Every link target of a Markdown text, outside code: inline links and images (a
/// reference link is checked at its definition, once), then reference definitions,
/// each in the order of the text.
pub fn links(text: &str) -> Vec<Link> {
    let lines = Lines::of(text);
    let parser = parser(text);
    let mut definitions: Vec<(usize, String)> = parser
        .reference_definitions()
        .iter()
        .map(|(_, def)| (def.span.start, def.dest.to_string()))
        .collect();
    let mut out = Vec::new();
    for (event, range) in parser.into_offset_iter() {
        let (Event::Start(Tag::Link {
            link_type,
            dest_url,
            ..
        })
        | Event::Start(Tag::Image {
            link_type,
            dest_url,
            ..
        })) = event
        else {
            continue;
        };
        if matches!(link_type, LinkType::Inline) {
            // The line of the target, where `](` opens it (a link's text may span lines).
            let source = &text[range.clone()];
            let at = source
                .rfind("](")
                .map_or(range.start, |i| range.start + i + 1);
            out.push(Link {
                line: lines.line(at),
                target: dest_url.to_string(),
            });
        }
    }
    definitions.sort();
    out.extend(definitions.into_iter().map(|(at, target)| Link {
        line: lines.line(at),
        target,
    }));
    out
}

/// The text of every heading, as rendered (a link's text without its target, code
/// without backticks, no emphasis marks or HTML).
pub fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for event in parser(text) {
        match (event, &mut current) {
            (Event::Start(Tag::Heading { .. }), _) => current = Some(String::new()),
            (Event::End(TagEnd::Heading(_)), heading) => out.extend(heading.take()),
            (Event::Text(t) | Event::Code(t), Some(heading)) => heading.push_str(&t),
            _ => {}
        }
    }
    out
}

/// The id GitHub gives a heading whose rendered text is `heading`: lowercased, every
/// character that is not a letter, a digit, `-`, `_` or a space dropped, and each space
/// turned into `-`.
pub fn slug(heading: &str) -> String {
    heading
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|&c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor a Markdown text offers: its headings' ids, a repeated id getting `-1`,
/// `-2`, ... as on GitHub, and the `id`/`name` of HTML anchors.
pub fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for heading in headings(text) {
        let base = slug(&heading);
        let count = seen.entry(base.clone()).or_insert(0);
        let id = match *count {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        };
        *count += 1;
        out.insert(id);
    }
    for event in parser(text) {
        let (Event::Html(html) | Event::InlineHtml(html)) = event else {
            continue;
        };
        for attribute in ["id=\"", "name=\""] {
            for (at, _) in html.match_indices(attribute) {
                let value = &html[at + attribute.len()..];
                if let Some(end) = value.find('"') {
                    out.insert(value[..end].to_owned());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of a one-heading document.
    fn rendered(heading: &str) -> String {
        let all = headings(&format!("# {heading}\n"));
        assert_eq!(all.len(), 1, "{heading}");
        all[0].clone()
    }

    fn targets(text: &str) -> Vec<(usize, String)> {
        links(text)
            .into_iter()
            .map(|l| (l.line, l.target))
            .collect()
    }

    #[test]
    fn slugs_follow_github() {
        assert_eq!(slug("Use it in your service"), "use-it-in-your-service");
        assert_eq!(
            slug("10. Pitfalls measured on the machines this is built on"),
            "10-pitfalls-measured-on-the-machines-this-is-built-on"
        );
        assert_eq!(
            slug("4.3 Observe end to end: the mode travels with the budget"),
            "43-observe-end-to-end-the-mode-travels-with-the-budget"
        );
        assert_eq!(slug(&rendered("3.7 `Server-Timing`")), "37-server-timing");
        assert_eq!(
            slug(&rendered("Outbound HTTPS: the `tls` feature")),
            "outbound-https-the-tls-feature"
        );
        assert_eq!(
            slug("A safe rollout: legacy, observe, propagate"),
            "a-safe-rollout-legacy-observe-propagate"
        );
        assert_eq!(
            slug(&rendered("`deadline_mode` and snake_case")),
            "deadline_mode-and-snake_case"
        );
        assert_eq!(slug("Q&A (for you) — twice"), "qa-for-you--twice");
        assert_eq!(
            slug(&rendered("Links: [the docs](docs/a.md) here")),
            "links-the-docs-here"
        );
        assert_eq!(slug(&rendered("**Bold** and *stars*")), "bold-and-stars");
        assert_eq!(slug("Ünïcode Wörds"), "ünïcode-wörds");
    }

    #[test]
    fn repeated_headings_get_numbered_ids() {
        let text = "# Results\n\n## Results\n\n### Results\n\n## Other\n";
        let ids = anchors(text);
        for id in ["results", "results-1", "results-2", "other"] {
            assert!(ids.contains(id), "{id} missing from {ids:?}");
        }
    }

    #[test]
    fn headings_skip_code_and_read_both_styles() {
        let text = "# One #\n\n```sh\n# not a heading\n```\n\nTwo\n===\n\n#no-space\n   ## Three\n\n- item\n---\n";
        assert_eq!(headings(text), ["One", "Two", "Three"]);
    }

    #[test]
    fn inline_links_images_and_definitions_are_found_with_their_lines() {
        let text = "Intro [a](docs/a.md) and ![chart](img/c.svg \"title\").\n\
                    A [split\nlink](b.md#part), [web](https://example.com).\n\n\
                    [ref]: ../c.md\n\
                    See [angle](<d e.md>) and [nested (x)](f(1).md).\n";
        assert_eq!(
            targets(text),
            [
                (1, "docs/a.md".to_owned()),
                (1, "img/c.svg".to_owned()),
                (3, "b.md#part".to_owned()),
                (3, "https://example.com".to_owned()),
                (6, "d e.md".to_owned()),
                (6, "f(1).md".to_owned()),
                (5, "../c.md".to_owned()),
            ]
        );
    }

    #[test]
    fn links_in_code_are_not_links() {
        let text = "Run `[x](not-a-link.md)` or\n\n```md\n[y](nope.md)\n```\n\n``a ` [z](no.md)`` then [real](yes.md).\n\n   ~~~\n   [w](nope.md)\n   ~~~\n";
        assert_eq!(targets(text), [(7, "yes.md".to_owned())]);
    }

    /// What a line scanner gets wrong: an indented code block is code, and a reference
    /// definition inside a quote or a list item is a definition; a reference link is
    /// checked once, at its definition.
    #[test]
    fn indented_code_is_code_and_definitions_count_in_quotes_and_lists() {
        let text = "Text.\n\n    [in code](indented.md)\n\n> [q]: quoted.md\n\n- item\n\n  [l]: listed.md\n\nUse [q] and [x][l].\n";
        assert_eq!(
            targets(text),
            [(5, "quoted.md".to_owned()), (9, "listed.md".to_owned())]
        );
    }

    #[test]
    fn a_code_span_may_cross_lines_within_a_paragraph() {
        let text = "See `cargo\n[x](no.md)` and [y](yes.md).\n";
        assert_eq!(targets(text), [(2, "yes.md".to_owned())]);
    }

    #[test]
    fn schemes_are_external_and_paths_are_not() {
        assert!(is_external("https://example.com/a"));
        assert!(is_external("mailto:someone@example.com"));
        assert!(!is_external("docs/a.md"));
        assert!(!is_external("#anchor"));
        assert!(!is_external("a.md#b:c"));
    }

    #[test]
    fn paths_normalize_inside_the_root_only() {
        assert_eq!(
            normalize(Path::new("docs/../README.md")),
            Some(PathBuf::from("README.md"))
        );
        assert_eq!(normalize(Path::new("./a/./b/")), Some(PathBuf::from("a/b")));
        assert_eq!(normalize(Path::new("docs/../../x")), None);
        assert_eq!(percent_decode("a%20b%zz"), "a b%zz");
    }

    #[test]
    fn the_checker_names_missing_files_and_headings() {
        let root = std::env::temp_dir().join(format!("check-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("docs")).unwrap();
        std::fs::write(
            root.join("README.md"),
            "# Top\n\n## Use it\n\n[ok](docs/a.md#part-one) [dir](docs/) [self](#use-it)\n\
             [gone](docs/gone.md) [bad](docs/a.md#nope) [up](../../x.md) [me](#nothing)\n\
             [root](/docs/a.md) [line](src/x.rs#L3)\n",
        )
        .unwrap();
        std::fs::write(
            root.join("docs/a.md"),
            "# A\n\n## Part one\n\n[back](../README.md#top)\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/x.rs"), "").unwrap();
        let files: BTreeSet<PathBuf> = ["README.md", "docs/a.md", "src/x.rs"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        let mut checker = Checker::new(&root, &files);
        let mut problems = checker.check_file(Path::new("README.md")).unwrap();
        problems.extend(checker.check_file(Path::new("docs/a.md")).unwrap());
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "README.md:6: `docs/gone.md`: no file docs/gone.md",
                "README.md:6: `docs/a.md#nope`: no heading `#nope` in docs/a.md",
                "README.md:6: `../../x.md` leaves the repository",
                "README.md:6: `#nothing`: no heading `#nothing` in this file",
            ]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
