//! `cargo xtask readme-tables`: the docs' result tables, numbers only, rendered from the
//! summaries under `docs/results/` so no published figure drifts from its run.
//!
//! A table is the lines between `<!-- results:DIR [FIGURE ...] -->` and
//! `<!-- results:end -->` in README.md or docs/: the rows of the figures named from
//! `docs/results/DIR/summary.json`, or its first table ([`summary::KEY_FIGURES`]).

use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::summary::{self, Summary};

const BEGIN: &str = "<!-- results:";
const END: &str = "<!-- results:end -->";

/// Renders the tables of README.md and docs/*.md (`check`: writes none); the files changed.
pub fn update(workspace: &Path, check: bool) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = vec![workspace.join("README.md")];
    for entry in std::fs::read_dir(workspace.join("docs"))? {
        files.push(entry?.path());
    }
    files.retain(|f| f.extension().is_some_and(|e| e == "md"));
    files.sort();
    let mut changed = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        let new = render(&text, &workspace.join("docs/results"))
            .with_context(|| format!("in {}", file.display()))?;
        if new != text {
            if !check {
                std::fs::write(&file, &new)?;
            }
            changed.push(file);
        }
    }
    Ok(changed)
}

/// Where the next block starts: a marker at a line's start (not quoted in prose).
fn next_block(text: &str) -> Option<usize> {
    text.match_indices(BEGIN)
        .map(|(at, _)| at)
        .find(|&at| (at == 0 || text[..at].ends_with('\n')) && !text[at..].starts_with(END))
}

/// `text` with every table block filled from the summaries under `results`.
fn render(text: &str, results: &Path) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = next_block(rest) {
        let open = start + rest[start..].find("-->\n").context("an unclosed marker")? + 4;
        let mut words = rest[start + BEGIN.len()..open - 4].split_whitespace();
        let dir = words
            .next()
            .context("a marker without its results folder")?;
        let rows: Vec<&str> = words.collect();
        let close = open
            + rest[open..]
                .find(END)
                .with_context(|| format!("no {END}"))?;
        let path = results.join(dir).join("summary.json");
        let json = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let summary: Summary = serde_json::from_str(&json)?;
        let table = match rows.is_empty() {
            true => summary::key_table(&summary),
            false => summary::markdown_table_of(&summary, &rows),
        };
        out.push_str(&rest[..open]);
        out.push('\n');
        out.push_str(&table);
        out.push('\n');
        // Past the end marker, so that the next block of the file is found too.
        out.push_str(END);
        rest = &rest[close + END.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_of_a_file_is_rendered() {
        let results = crate::stack::workspace().join("docs/results");
        let block = |rows| format!("<!-- results:goodput {rows} -->\nold\n<!-- results:end -->\n");
        let text = format!(
            "{}A `{}` in the prose.\n{}",
            block("p99_ms"),
            BEGIN,
            block("p50_ms")
        );
        let new = render(&text, &results).unwrap();
        assert!(!new.contains("old"), "{new}");
        assert!(new.contains("| p99 latency, ms |") && new.contains("| p50 latency, ms |"));
        assert_eq!(
            render(&new, &results).unwrap(),
            new,
            "rendering twice changes nothing"
        );
    }

    #[test]
    fn a_block_gets_its_runs_table_and_the_text_around_it_stays() {
        let results = crate::stack::workspace().join("docs/results");
        let text =
            "Before.\n\n<!-- results:goodput p99_ms -->\nold\n<!-- results:end -->\n\nAfter.\n";
        let new = render(text, &results).unwrap();
        assert!(new.starts_with("Before.\n\n<!-- results:goodput p99_ms -->\n\n| | legacy |"));
        assert!(
            new.contains("| p99 latency, ms |") && !new.contains("goodput:"),
            "{new}"
        );
        assert!(
            new.ends_with("|\n\n<!-- results:end -->\n\nAfter.\n"),
            "{new}"
        );
        assert_eq!(
            render(&new, &results).unwrap(),
            new,
            "a second run changes nothing"
        );
        assert!(render("<!-- results:nope -->\n<!-- results:end -->\n", &results).is_err());
        assert!(render("<!-- results:goodput -->\nno end\n", &results).is_err());
    }
}
