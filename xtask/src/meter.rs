//! CPU time of a few processes, read at the ends of a measurement segment.
//!
//! Where it can, a [`Meter`] puts each process (PostgreSQL with all its backends) into a
//! cpuacct cgroup of its own and reads `cpuacct.usage`: nanoseconds, and a child that exits
//! keeps its share. Else (not root, no cgroup v1 cpuacct) it reads `/proc/PID/stat`: clock
//! ticks of each process, its reaped children and the living processes below it. Dropping
//! the meter removes the cgroups and puts the processes back.

use std::path::{Path, PathBuf};

/// The cgroup v1 hierarchy with the cpuacct controller.
const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

/// How a meter reads CPU time.
#[derive(Debug)]
pub enum Meter {
    /// One cpuacct cgroup per process tree.
    Cgroups(Vec<PathBuf>),
    /// `/proc`, in clock ticks per second `hz`, for these process trees' roots.
    Proc { roots: Vec<u32>, hz: f64 },
}

impl Meter {
    /// A meter of the process trees under `roots` (each counted apart).
    pub fn new(roots: &[u32]) -> Self {
        match cgroups(roots) {
            Ok(dirs) => Self::Cgroups(dirs),
            Err(err) => {
                eprintln!("  cpu: no cpuacct cgroup ({err}); reading /proc in clock ticks");
                Self::Proc {
                    roots: roots.to_vec(),
                    hz: ticks_per_second(),
                }
            }
        }
    }

    /// What the meter reads with: `cgroup` or `proc`.
    pub fn source(&self) -> &'static str {
        match self {
            Self::Cgroups(_) => "cgroup",
            Self::Proc { .. } => "proc",
        }
    }

    /// CPU time so far of each tree, in nanoseconds.
    pub fn read(&self) -> anyhow::Result<Vec<u64>> {
        match self {
            Self::Cgroups(dirs) => dirs
                .iter()
                .map(|dir| {
                    let usage = std::fs::read_to_string(dir.join("cpuacct.usage"))?;
                    Ok(usage.trim().parse()?)
                })
                .collect(),
            Self::Proc { roots, hz } => Ok(roots
                .iter()
                .map(|&root| (tree_ticks(root) as f64 * 1e9 / hz) as u64)
                .collect()),
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Self::Cgroups(dirs) = self {
            for dir in dirs.iter() {
                release(dir);
            }
        }
    }
}

/// A cgroup per tree, its living processes moved in (their children are born there).
fn cgroups(roots: &[u32]) -> anyhow::Result<Vec<PathBuf>> {
    let base = Path::new(CPUACCT);
    anyhow::ensure!(
        base.join("cgroup.procs").exists(),
        "{CPUACCT} is not mounted"
    );
    let mut dirs = Vec::new();
    for (i, &root) in roots.iter().enumerate() {
        let dir = base.join(format!("deadline-cpu-{}-{i}", std::process::id()));
        let moved = std::fs::create_dir(&dir).and_then(|()| {
            for pid in tree(root) {
                std::fs::write(dir.join("cgroup.procs"), pid.to_string())?;
            }
            Ok(())
        });
        dirs.push(dir);
        if let Err(err) = moved {
            for made in &dirs {
                release(made);
            }
            return Err(err.into());
        }
    }
    Ok(dirs)
}

/// Puts the cgroup's processes back in the root cgroup and removes it.
fn release(dir: &Path) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.lines() {
        let _ = std::fs::write(Path::new(CPUACCT).join("cgroup.procs"), pid);
    }
    let _ = std::fs::remove_dir(dir);
}

/// The numeric fields of `/proc/PID/stat` from field 4 of proc(5) on (the parent, at 0);
/// they follow the last `)` and the state, as the command may hold spaces and `)`.
fn stat(pid: u32) -> Option<Vec<Option<u64>>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
    Some(fields.map(|f| f.parse().ok()).collect())
}

/// CPU time of one process so far, in clock ticks: its own user and system time, and
/// its reaped children's (utime to cstime, fields 14 to 17 of proc(5)).
pub fn ticks(pid: u32) -> Option<u64> {
    stat(pid)?.get(10..14)?.iter().copied().sum()
}

/// The parent of `pid`.
fn parent(pid: u32) -> Option<u32> {
    stat(pid)?.first().copied().flatten()?.try_into().ok()
}

/// `root` and every living process below it.
fn tree(root: u32) -> Vec<u32> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = entries.filter_map(|e| e.file_name().to_str()?.parse().ok());
    let parents: Vec<(u32, u32)> = pids.filter_map(|pid| Some((pid, parent(pid)?))).collect();
    let mut tree = vec![root];
    let mut i = 0;
    while let Some(&pid) = tree.get(i) {
        for &(child, _) in parents.iter().filter(|(_, parent)| *parent == pid) {
            tree.push(child);
        }
        i += 1;
    }
    tree
}

/// CPU ticks of `root` and every living process below it (a server's backends).
fn tree_ticks(root: u32) -> u64 {
    tree(root).into_iter().filter_map(ticks).sum()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux as it is built).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins for a while on this thread.
    fn spin() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
    }

    #[test]
    fn a_process_stat_line_gives_its_ticks_and_its_childrens() {
        let me = std::process::id();
        let first = ticks(me).expect("this process has a stat line");
        spin();
        assert!(ticks(me).unwrap() >= first);
        assert_eq!(parent(me), Some(std::os::unix::process::parent_id()));
        assert!(tree_ticks(me) >= ticks(me).unwrap());
    }

    #[test]
    fn a_meter_sees_a_child_spin_and_puts_it_back() {
        // A child that spins a second, then sleeps: read either way, no cgroup left behind.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 30",
            ])
            .spawn()
            .unwrap();
        let meter = Meter::new(&[child.id()]);
        let before = meter.read().unwrap()[0];
        let mut after = before;
        for _ in 0..200 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            after = meter.read().unwrap()[0];
            if after > before + 50_000_000 {
                break;
            }
        }
        assert!(after > before + 50_000_000, "{} then {after} ns", before);
        let dirs = match &meter {
            Meter::Cgroups(dirs) => dirs.clone(),
            Meter::Proc { .. } => Vec::new(),
        };
        drop(meter);
        for dir in dirs {
            assert!(!dir.exists(), "{} was left behind", dir.display());
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
