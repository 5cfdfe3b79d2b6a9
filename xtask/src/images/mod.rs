//! `cargo xtask images`: every image `docker-compose.yml` runs (but Grafana, Jaeger and
//! k6), made without a container registry from Debian's packages and the host's binaries
//! (docs/docker.md), under names of their own that `docker-compose.offline.yml` points at.
//!
//! 1. `debootstrap` a Debian bookworm root file system into the cache, with the packages of
//!    PostgreSQL 15 and Prometheus downloaded beside it; only when an image below must be
//!    made, and once: the cache is reused while it exists.
//! 2. `docker import` it as [`BASE_IMAGE`], unless the engine has it.
//! 3. Build [`POSTGRES_IMAGE`] and [`PROMETHEUS_IMAGE`] on it from `xtask/images/`, the
//!    packages in the build context (no network); one built from the same files is kept.
//! 4. Build the service images from the Dockerfile's `*-prebuilt` targets (the host's
//!    binaries, no `rust` image) on [`BASE_IMAGE`].
//!
//! No stand-in takes the name of a registry's image: with a registry, compose without the
//! override pulls the real ones and never runs a stand-in by mistake.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, ensure};
use test_support::process::binary_dir;

use crate::stack::{build_services, run, workspace};

mod rootfs;

/// The debootstrap tree: the stand-ins' base, and the services' (the Dockerfile's
/// `BASE_IMAGE`, `debian:bookworm-slim` by default).
pub const BASE_IMAGE: &str = "deadline-propagation/offline-debian:bookworm";
/// Debian's PostgreSQL 15, for docker-compose.yml's `postgres:15`.
pub const POSTGRES_IMAGE: &str = "deadline-propagation/offline-postgres:15";
/// Debian's Prometheus 2.42, for docker-compose.yml's `prom/prometheus:v3.5.0`: it reads
/// the project's configuration and takes compose's flags as v3 does.
pub const PROMETHEUS_IMAGE: &str = "deadline-propagation/offline-prometheus:debian";
/// The override that points docker-compose.yml at the stand-ins.
pub const OVERRIDE: &str = "docker-compose.offline.yml";
/// The Dockerfile's prebuilt targets, one per service; [`image`] names each one's image.
pub const SERVICE_TARGETS: [&str; 4] = [
    "catalog-service",
    "pricing-service",
    "orders-service",
    "shipping-worker",
];

/// The name docker-compose.yml gives `service`'s image.
pub fn image(service: &str) -> String {
    format!("deadline-propagation/{service}:dev")
}
/// The label on every image made here (the Dockerfiles in `xtask/images/` set it too).
const MADE_HERE: &str = "dev.deadline-propagation.made-by=cargo-xtask-images";
/// The label holding the hash of a stand-in's files ([`recipe`]): one built from other
/// files is built again, an up-to-date one needs no root file system (no debootstrap).
const RECIPE_LABEL: &str = "dev.deadline-propagation.recipe";
/// The Debian release of every image.
const SUITE: &str = "bookworm";

/// The stand-ins on [`BASE_IMAGE`]: image, folder in `xtask/images/`, Debian package.
const STAND_INS: [(&str, &str, &str); 2] = [
    (POSTGRES_IMAGE, "postgres", "postgresql-15"),
    (PROMETHEUS_IMAGE, "prometheus", "prometheus"),
];

/// `cargo xtask images`.
#[derive(clap::Args, Debug)]
pub struct ImagesArgs {
    /// Which build of the services goes into their images (`dev` is target/debug).
    #[arg(long, default_value = "dev", value_parser = ["dev", "release"])]
    pub profile: String,
    /// Use the binaries as they are instead of running `cargo build` first.
    #[arg(long)]
    pub no_build: bool,
    /// Where the root file system and the packages are kept between runs (default:
    /// target/images). Delete it to start from nothing.
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// The Debian mirror for debootstrap and the packages.
    #[arg(long, default_value = "http://deb.debian.org/debian")]
    pub mirror: String,
}

/// Makes every image; prints one line per step with its duration.
pub fn images(args: &ImagesArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let cache = args
        .cache
        .clone()
        .unwrap_or_else(|| binary_dir(&workspace(), "dev").with_file_name("images"));
    let tree = cache.join(SUITE);
    let base_missing = !exists(BASE_IMAGE)?;
    let mut stand_ins = Vec::new();
    for (image, folder, _) in STAND_INS {
        let recipe = recipe(folder)?;
        if !exists(image)? || base_missing || label(image, RECIPE_LABEL)? != recipe {
            // A new base image is a new foundation: what stands on it is built again.
            stand_ins.push((image, folder, recipe));
        } else {
            println!("images: {image} is up to date, kept");
        }
    }
    if (base_missing || !stand_ins.is_empty()) && !tree.exists() {
        step("debootstrap and packages", || {
            rootfs::bootstrap(&cache, &tree, &args.mirror)
        })?;
    }
    if base_missing {
        step(&format!("docker import {BASE_IMAGE}"), || {
            rootfs::import(&tree.join("rootfs"))
        })?;
    } else {
        println!("images: {BASE_IMAGE} exists, kept");
    }
    for (image, folder, recipe) in stand_ins {
        step(&format!("docker build {image}"), || {
            build_stand_in(image, folder, &recipe, &tree.join(folder))
        })?;
    }
    if !args.no_build {
        step("cargo build (services)", || {
            build_services(&args.profile, &[])
        })?;
    }
    let binaries = binary_dir(&workspace(), &args.profile);
    let context = cache.join("services");
    for target in SERVICE_TARGETS {
        let image = image(target);
        step(&format!("docker build {image}"), || {
            build_service(&binaries, &context, target, &image)
        })?;
    }
    println!("images: done in {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Runs `work`, then prints what it was and how long it took.
fn step(what: &str, work: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let started = Instant::now();
    work().with_context(|| format!("images: {what}"))?;
    println!("images: {what}: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Builds a stand-in from `xtask/images/<folder>/` in `context` (with its `debs/`).
fn build_stand_in(image: &str, folder: &str, recipe: &str, context: &Path) -> anyhow::Result<()> {
    for path in recipe_files(folder)? {
        std::fs::copy(&path, context.join(path.file_name().expect("a file")))?;
    }
    let dockerfile = context.join("Dockerfile");
    let label = format!("{RECIPE_LABEL}={recipe}");
    docker_build(&dockerfile, &["--label", &label], image, context)
}

/// The files of `xtask/images/<folder>/`, in name order.
fn recipe_files(folder: &str) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = std::fs::read_dir(workspace().join("xtask/images").join(folder))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<Vec<_>, _>>()?;
    files.sort();
    Ok(files)
}

/// A hash of the names and contents of a stand-in's files (64-bit FNV-1a: stable
/// between runs and Rust versions, which std's hasher does not promise).
fn recipe(folder: &str) -> anyhow::Result<String> {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for path in recipe_files(folder)? {
        let name = path.file_name().expect("a file").as_encoded_bytes();
        for &byte in name.iter().chain(&[0]).chain(&std::fs::read(&path)?) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(format!("{hash:016x}"))
}

/// Builds `image` from the Dockerfile's `<target>-prebuilt` stage and the binaries.
fn build_service(binaries: &Path, context: &Path, target: &str, image: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(context)?;
    for name in SERVICE_TARGETS {
        let binary = binaries.join(name);
        ensure!(
            binary.exists(),
            "{} is missing: build it first (cargo build -p {name})",
            binary.display()
        );
        std::fs::copy(&binary, context.join(name))?;
    }
    let target = format!("{target}-prebuilt");
    let base = format!("BASE_IMAGE={BASE_IMAGE}");
    let options = ["--target", &target, "--build-arg", &base];
    docker_build(&workspace().join("Dockerfile"), &options, image, context)
}

/// `docker build` with Docker's legacy builder: with BuildKit, the Dockerfile's
/// `# syntax=` line would make the build pull its frontend image from a registry.
fn docker_build(
    dockerfile: &Path,
    options: &[&str],
    image: &str,
    context: &Path,
) -> anyhow::Result<()> {
    run(Command::new("docker")
        .env("DOCKER_BUILDKIT", "0")
        .args(["build", "--quiet", "--file"])
        .arg(dockerfile)
        .args(["--tag", image])
        .args(options)
        .arg(context)
        .stdout(Stdio::null()))
}

/// Whether the engine has an image named `image`.
pub fn exists(image: &str) -> anyhow::Result<bool> {
    Ok(Command::new("docker")
        .args(["image", "inspect", image])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("cannot run docker (is Docker installed?)")?
        .success())
}

/// The value of `image`'s label `key`, empty when unset.
fn label(image: &str, key: &str) -> anyhow::Result<String> {
    inspect(image, &format!("{{{{index .Config.Labels \"{key}\"}}}}"))
}

/// `docker inspect --format <format> <id>`: of an image, a container or a volume.
pub fn inspect(id: &str, format: &str) -> anyhow::Result<String> {
    stdout(Command::new("docker").args(["inspect", "--format", format, id]))
}

/// What `command` prints, trimmed; an error with what it printed on stderr if it fails.
pub fn stdout(command: &mut Command) -> anyhow::Result<String> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success(), "{command:?} failed: {stderr}");
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tags made here are the names the files use: the services' in the compose
    /// file, the stand-ins' only in the override (none a registry serves), the base in
    /// the stand-ins' Dockerfiles.
    #[test]
    fn tags_are_the_names_the_files_use() {
        let read = |path: &str| std::fs::read_to_string(workspace().join(path)).unwrap();
        let (compose, offline) = (read("docker-compose.yml"), read(OVERRIDE));
        for image in SERVICE_TARGETS.map(image) {
            assert!(compose.contains(&format!("image: {image}\n")), "{image}");
        }
        for image in [BASE_IMAGE, POSTGRES_IMAGE, PROMETHEUS_IMAGE] {
            assert!(
                image.starts_with("deadline-propagation/offline-"),
                "{image}"
            );
            assert!(!compose.contains(image), "docker-compose.yml names {image}");
        }
        for image in [POSTGRES_IMAGE, PROMETHEUS_IMAGE] {
            assert!(offline.contains(&format!("image: {image}\n")), "{image}");
        }
        let dockerfile = read("Dockerfile");
        assert!(dockerfile.contains("FROM ${BASE_IMAGE} AS runtime\n"));
        for target in SERVICE_TARGETS {
            assert!(dockerfile.contains(&format!(" AS {target}-prebuilt\n")));
            assert!(dockerfile.contains(&format!(" AS {target}\n")));
        }
        for (_, folder, _) in STAND_INS {
            let text = read(&format!("xtask/images/{folder}/Dockerfile"));
            assert!(text.contains(&format!("FROM {BASE_IMAGE}\n")), "{folder}");
        }
    }

    /// The stand-ins are recognised as made here by the label their Dockerfiles set.
    #[test]
    fn stand_ins_carry_the_label() {
        for (_, folder, _) in STAND_INS {
            let path = workspace().join(format!("xtask/images/{folder}/Dockerfile"));
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains(&format!("LABEL {MADE_HERE}\n")),
                "{} lacks LABEL {MADE_HERE}",
                path.display()
            );
        }
    }

    /// The prebuilt targets must come before the build stage: the legacy builder builds
    /// every stage up to its target, and the build stage pulls the `rust` image.
    #[test]
    fn prebuilt_targets_come_before_the_build_stage() {
        let dockerfile = std::fs::read_to_string(workspace().join("Dockerfile")).unwrap();
        let build = dockerfile.find(" AS build\n").unwrap();
        for target in SERVICE_TARGETS {
            let prebuilt = dockerfile
                .find(&format!(" AS {target}-prebuilt\n"))
                .unwrap();
            assert!(
                prebuilt < build,
                "{target}-prebuilt is after the build stage"
            );
        }
    }
}
