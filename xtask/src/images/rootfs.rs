//! The Debian root file system behind every image of [`super`]: made by `debootstrap`,
//! with the stand-ins' packages downloaded beside it, and imported as
//! [`BASE_IMAGE`].

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};

use super::{BASE_IMAGE, MADE_HERE, STAND_INS, SUITE};
use crate::stack::{run, which};

/// Makes `tree`: the root file system in `rootfs/`, each stand-in's packages in
/// `<folder>/debs/`; renamed into place when complete, so an interrupted run is redone.
pub(super) fn bootstrap(cache: &Path, tree: &Path, mirror: &str) -> anyhow::Result<()> {
    ensure!(
        which("debootstrap").is_some(),
        "debootstrap is not installed (Debian: apt-get install debootstrap)"
    );
    let partial = tree.with_extension("partial");
    remove_unmounted(&partial)?;
    std::fs::create_dir_all(&partial)?;
    // The .deb files, kept: a new tree after `rm -rf <cache>/bookworm` downloads nothing.
    let debs = std::path::absolute(cache)?.join("debootstrap");
    std::fs::create_dir_all(&debs)?;
    let rootfs = partial.join("rootfs");
    run(Command::new("debootstrap")
        .arg("--variant=minbase")
        .arg(format!("--cache-dir={}", debs.display()))
        .args([SUITE, &rootfs.to_string_lossy(), mirror]))?;
    for (_, folder, package) in STAND_INS {
        download(&rootfs, package, &partial.join(folder).join("debs"))?;
    }
    // As in Debian's official slim images: no package lists, no downloaded packages.
    for dir in ["var/lib/apt/lists", "var/cache/apt/archives"] {
        empty_files(&rootfs.join(dir))?;
    }
    std::fs::rename(&partial, tree)?;
    Ok(())
}

/// Downloads `package` and every dependency `rootfs` lacks into `dest`: the host's apt on
/// the tree's lists and packages, so exactly what installing it in that tree needs.
fn download(rootfs: &Path, package: &str, dest: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dest)?;
    let tree = [
        ("Dir::State", "var/lib/apt"),
        ("Dir::State::status", "var/lib/dpkg/status"),
        ("Dir::Etc::SourceList", "etc/apt/sources.list"),
        ("Dir::Etc::SourceParts", "etc/apt/sources.list.d"),
    ];
    run(Command::new("apt-get")
        .args(["--quiet", "--yes", "--no-install-recommends"])
        .args(tree.map(|(name, path)| format!("-o{name}={}", rootfs.join(path).display())))
        .arg(format!("-oDir::Cache::archives={}", dest.display()))
        // The tree is nobody's live system: no lock to take on it.
        .arg("-oDebug::NoLocking=1")
        .args(["install", "--download-only", package]))?;
    // apt's own bookkeeping, not packages.
    let _ = std::fs::remove_dir_all(dest.join("partial"));
    let _ = std::fs::remove_file(dest.join("lock"));
    Ok(())
}

/// `docker import` of `rootfs` as [`BASE_IMAGE`], `bash` its command (as Debian's).
pub(super) fn import(rootfs: &Path) -> anyhow::Result<()> {
    let mut tar = Command::new("tar")
        .arg("--numeric-owner")
        .arg("-C")
        .arg(rootfs)
        .args(["-c", "."])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run tar")?;
    let stdout = tar.stdout.take().expect("piped");
    let import = Command::new("docker")
        .args(["import", "--change", &format!("LABEL {MADE_HERE}")])
        .args(["--change", r#"CMD ["bash"]"#, "-", BASE_IMAGE])
        .stdin(stdout)
        .stdout(Stdio::null())
        .status()
        .context("cannot run docker import")?;
    ensure!(tar.wait()?.success(), "tar of {} failed", rootfs.display());
    ensure!(import.success(), "docker import failed");
    Ok(())
}

/// Removes the files (not the folders) directly in `dir`.
fn empty_files(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::remove_file(path)?;
        }
    }
    Ok(())
}

/// Removes what an interrupted debootstrap left at `dir`, unless /proc or /sys is still
/// mounted under it: removing files through such a mount would reach the host's.
fn remove_unmounted(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let dir = std::path::absolute(dir)?;
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if let Some(mount) = mounts
        .lines()
        .filter_map(|line| line.split_whitespace().nth(1))
        .find(|point| Path::new(point).starts_with(&dir))
    {
        bail!(
            "{mount} is still mounted (an interrupted debootstrap): unmount it, then remove {}",
            dir.display()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
