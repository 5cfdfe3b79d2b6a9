//! `cargo xtask copy-check`: the crate is copyable, proven by copying it.
//!
//! The README tells a reader to `cp -r shared/`. That works only while its `Cargo.toml`
//! inherits nothing from this workspace and nothing reaches outside the folder. So the
//! check does what the reader would: a new project, the folder copied in, a two-line
//! `main`, `cargo build --offline`, and the program run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, ensure};

use crate::stack::workspace;

const MANIFEST: &str = r#"[package]
name = "copied"
version = "0.1.0"
edition = "2024"

[dependencies]
# The chain: the core, the budgeted client and the database envelope.
deadline-propagation = { path = "deadline-propagation", features = ["http-client", "sqlx"] }
"#;

const MAIN: &str = r#"fn main() {
    let policy = deadline_propagation::DeadlinePolicy::from_millis(2000, 1000);
    println!("clamped to {:?}", policy.accept(Some(std::time::Duration::from_secs(60))).0);
}
"#;

/// Copies `shared/` into a new project under the temp dir and builds it offline.
pub fn copy_check() -> anyhow::Result<()> {
    let project = std::env::temp_dir().join(format!("copy-check-{}", std::process::id()));
    if project.exists() {
        std::fs::remove_dir_all(&project)?;
    }
    std::fs::create_dir_all(project.join("src"))?;
    std::fs::write(project.join("Cargo.toml"), MANIFEST)?;
    std::fs::write(project.join("src/main.rs"), MAIN)?;
    let shared = workspace().join("shared");
    copy_dir(&shared, &project.join("deadline-propagation"))?;

    // Its own target dir, kept between runs, so a second check reuses the build.
    let target = workspace().join("target/copy-check");
    let cargo = std::env::var("CARGO").unwrap_or("cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&project)
        .args(["build", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .context("cannot run cargo build")?;
    ensure!(
        status.success(),
        "the copied crate does not build offline in {}",
        project.display()
    );
    let output = Command::new(target.join("debug/copied"))
        .output()
        .context("cannot run the copied program")?;
    let printed = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success() && printed.trim() == "clamped to 2s",
        "the copied program printed {printed:?}"
    );
    std::fs::remove_dir_all(&project)?;
    println!("copy-check: shared/ copied into a new project builds offline and runs");
    Ok(())
}

/// `cp -r from to`, without a `target/` a reader would not copy.
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (path, name) = (entry.path(), entry.file_name());
        if name == "target" {
            continue;
        }
        if entry.file_type()?.is_dir() {
            copy_dir(&path, &to.join(&name))?;
        } else {
            std::fs::copy(&path, to.join(&name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}
