//! Writes pricing-service's generated code from its `.proto`, or with `--check` fails
//! when the committed code is not what the `.proto` gives today.
//!
//! The code is committed so that a reader can open it and a build needs no protobuf
//! compiler; this is the one place that compiles the `.proto`, so the two cannot drift
//! apart unnoticed (CI runs `--check`).

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("unknown argument {other:?}; usage: pricing-codegen [--check]");
            return ExitCode::from(2);
        }
    };
    match run(check) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("pricing-codegen: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(check: bool) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let service = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("codegen/ lives inside pricing-service/")?;
    let proto = service.join("proto");
    let committed_path = service.join("src/proto/pricing.v1.rs");
    let out = std::env::temp_dir().join(format!("pricing-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;
    let files = protox::compile([proto.join("pricing.proto")], [&proto])?;
    tonic_prost_build::configure()
        .build_transport(true)
        .out_dir(&out)
        .compile_fds(files)?;
    let generated = std::fs::read_to_string(out.join("pricing.v1.rs"))?;
    std::fs::remove_dir_all(&out)?;
    if !check {
        std::fs::write(&committed_path, generated)?;
        println!("wrote {}", committed_path.display());
        return Ok(ExitCode::SUCCESS);
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if committed == generated {
        println!(
            "{} is what proto/pricing.proto gives",
            committed_path.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "{} is not what proto/pricing.proto gives: run \
         cargo run --manifest-path pricing-service/codegen/Cargo.toml",
        committed_path.display()
    );
    Ok(ExitCode::FAILURE)
}
