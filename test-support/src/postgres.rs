//! A throwaway PostgreSQL cluster for tests, from the binaries of Debian's
//! `postgresql-15` package.
//!
//! PostgreSQL refuses to run as root, and tests and CI run as root, so `initdb`,
//! `postgres` and `pg_ctl` run as the `postgres` user through `runuser`, in a temporary
//! folder owned by that user (docs/design.md §10). As any other user they run directly.
//!
//! Tear-down does not rely on destructors (statics are never dropped): the cluster is
//! started by a small shell watchdog whose stdin is a pipe from the test process. When
//! the test process exits, for whatever reason, the pipe closes, the watchdog's `read`
//! returns, and it stops the server and deletes the folder.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use sqlx::Connection as _;

/// A PostgreSQL server on a loopback port, owned by this test process.
pub struct PgCluster {
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    bindir: PathBuf,
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

impl PgCluster {
    /// Creates and starts a new cluster. Takes about a second.
    pub fn start() -> anyhow::Result<Self> {
        let bindir = bindir()?;
        let as_postgres = crate::privilege::is_root();
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "deadline-pg-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        // A folder of the same name can be left by a run that was killed (a process id
        // is reused): initdb refuses a non-empty data folder, so start from nothing.
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        if as_postgres {
            run(Command::new("chown")
                .arg("-R")
                .arg("postgres:postgres")
                .arg(&dir))?;
        }
        let mut initdb = Command::new(bindir.join("initdb"));
        initdb.arg("-D").arg(dir.join("data")).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(&mut as_user(initdb, as_postgres)).context("initdb failed")?;
        let cluster = Self {
            dir,
            port: free_port()?,
            as_postgres,
            bindir,
            watchdog: Mutex::new(None),
        };
        cluster.start_server()?;
        Ok(cluster)
    }

    /// The cluster shared by every test of this process, started on first use.
    pub fn shared() -> &'static PgCluster {
        static SHARED: OnceLock<PgCluster> = OnceLock::new();
        SHARED.get_or_init(|| PgCluster::start().expect("cannot start a test PostgreSQL"))
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for `database` through the server's UNIX socket: a session that a cut in
    /// the TCP link (test_support::net) does not reach, to watch `pg_stat_activity` and
    /// `pg_locks` while the service's connections are cut off.
    pub fn socket_url(&self, database: &str) -> String {
        format!(
            "postgres://postgres@localhost/{database}?host={}&port={}",
            self.dir.display(),
            self.port
        )
    }

    /// The postmaster's process id (the first line of `postmaster.pid`): the parent of
    /// every backend, so the server's CPU can be read from `/proc`.
    pub fn postmaster_pid(&self) -> anyhow::Result<u32> {
        let path = self.dir.join("data/postmaster.pid");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        text.lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("no process id in {}", path.display()))
    }

    /// What the server has logged so far (with `log_statement = 'all'` in a session, its
    /// statements as the server received them).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    /// A program of this server's installation (`pgbench`, `psql`, ...).
    pub fn bin(&self, program: &str) -> PathBuf {
        self.bindir.join(program)
    }

    /// A URL for `database` as the superuser.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Stops the server (fast shutdown: sessions are terminated, as in a restart;
    /// immediate shutdown would lose data with `synchronous_commit=off`);
    /// [`resume`](Self::resume) starts it again on the same port with the same data.
    pub fn stop(&self) -> anyhow::Result<()> {
        let mut guard = self.watchdog.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((mut child, stdin)) = guard.take() {
            drop(stdin); // the watchdog stops the server but keeps the folder: see script
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts a stopped server again.
    pub fn resume(&self) -> anyhow::Result<()> {
        self.start_server()
    }

    fn start_server(&self) -> anyhow::Result<()> {
        let data = self.dir.join("data");
        let pg_ctl = self.bindir.join("pg_ctl");
        let postgres = self.bindir.join("postgres");
        let run_as = if self.as_postgres {
            "runuser -u postgres --"
        } else {
            ""
        };
        // The server runs in the background; `read` blocks until our end of the pipe
        // closes (the test process exited or `stop` dropped it), then the server is
        // stopped. The folder is removed only when no `.keep` marker says a restart is
        // planned, which is true while this PgCluster value is alive (see Drop).
        let script = format!(
            "{run_as} {postgres} -D {data} -k {dir} -p {port} -c listen_addresses=127.0.0.1 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
             -c max_connections=400 -c shared_buffers=64MB >>{dir}/postgres.log 2>&1 &
             read _ignored
             {run_as} {pg_ctl} -D {data} stop -m fast >/dev/null 2>&1
             [ -e {dir}/.keep ] || rm -rf {dir}",
            postgres = postgres.display(),
            pg_ctl = pg_ctl.display(),
            data = data.display(),
            dir = self.dir.display(),
            port = self.port,
        );
        std::fs::write(self.dir.join(".keep"), b"")?;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start the PostgreSQL watchdog")?;
        let stdin = child.stdin.take().context("watchdog has no stdin")?;
        *self.watchdog.lock().unwrap_or_else(|e| e.into_inner()) = Some((child, stdin));
        self.wait_ready(Duration::from_secs(30))
    }

    fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < timeout {
            // Through the UNIX socket, so a restart behind a cut TCP link is seen.
            let ready = Command::new(self.bindir.join("pg_isready"))
                .arg("-h")
                .arg(&self.dir)
                .args(["-q", "-p", &self.port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        bail!("PostgreSQL did not become ready in {timeout:?}; log:\n{log}")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(".keep"));
        if let Some((mut child, stdin)) = self
            .watchdog
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            drop(stdin);
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A database of its own for one test.
pub struct TestDatabase {
    /// Its URL, for `DATABASE_URL` or a pool.
    pub url: String,
    /// Its name.
    pub name: String,
}

/// A fresh, empty database: in the server named by `DATABASE_URL` when it is set,
/// otherwise in this process's throwaway cluster.
pub async fn test_database() -> TestDatabase {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "test_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let admin_url = match std::env::var("DATABASE_URL") {
        Ok(url) => url,
        Err(_) => tokio::task::spawn_blocking(|| PgCluster::shared().url("postgres"))
            .await
            .expect("cluster start-up panicked"),
    };
    let url = create_database(&admin_url, &name)
        .await
        .expect("cannot create the test database");
    TestDatabase { url, name }
}

/// Creates database `name` (letters, digits and underscores only) on the server of
/// `admin_url` and returns its URL: each test, and each mode of the experiment, starts
/// on an empty database.
pub async fn create_database(admin_url: &str, name: &str) -> anyhow::Result<String> {
    anyhow::ensure!(
        name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "not a plain database name: {name}"
    );
    let mut admin = sqlx::PgConnection::connect(admin_url)
        .await
        .context("cannot connect to PostgreSQL")?;
    // The name was checked above, so formatting it in is safe.
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await?;
    match admin_url.rsplit_once('/') {
        Some((server, _)) => Ok(format!("{server}/{name}")),
        None => bail!("the URL has no database part: {admin_url}"),
    }
}

fn bindir() -> anyhow::Result<PathBuf> {
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    for version in ["17", "16", "15", "14"] {
        let dir = Path::new("/usr/lib/postgresql").join(version).join("bin");
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    bail!("no PostgreSQL server binaries found: install Debian's postgresql-15 package")
}

fn as_user(command: Command, as_postgres: bool) -> Command {
    if !as_postgres {
        return command;
    }
    let mut wrapped = Command::new("runuser");
    wrapped
        .args(["-u", "postgres", "--"])
        .arg(command.get_program())
        .args(command.get_args());
    wrapped
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let out = command.output()?;
    if !out.status.success() {
        let mut err = std::io::stderr();
        let _ = err.write_all(&out.stderr);
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
