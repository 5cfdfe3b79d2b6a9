//! The generated code in `src/proto/` is what `proto/pricing.proto` gives today.
//!
//! It is committed, so that building the services needs no protobuf compiler and a
//! reader can open it; this test compiles the `.proto` with protox (in Rust) and
//! tonic-prost-build into a temporary folder and compares. `UPDATE_PROTO=1 cargo test
//! -p pricing-service --test generated` writes it instead.

use std::path::Path;

#[test]
fn the_committed_code_is_what_the_proto_gives() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile_dir();
    let files = protox::compile([root.join("proto/pricing.proto")], [root.join("proto")])
        .expect("the .proto compiles");
    tonic_prost_build::configure()
        .build_transport(true)
        .out_dir(&out)
        .compile_fds(files)
        .expect("tonic-prost-build generates");
    let generated = std::fs::read_to_string(out.join("pricing.v1.rs")).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
    let committed_path = root.join("src/proto/pricing.v1.rs");
    if std::env::var_os("UPDATE_PROTO").is_some() {
        std::fs::write(&committed_path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == generated,
        "src/proto/pricing.v1.rs is not what proto/pricing.proto gives: run \
         UPDATE_PROTO=1 cargo test -p pricing-service --test generated"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pricing-proto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
