//! Whether this process may do what only root may (cut links, run PostgreSQL as
//! `postgres`).

/// Whether this process runs as root (the user id `id -u` prints).
pub(crate) fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}
