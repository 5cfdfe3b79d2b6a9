//! No code: this crate only asks for features (see its Cargo.toml), so that every build
//! of the workspace shares one build of each dependency.
