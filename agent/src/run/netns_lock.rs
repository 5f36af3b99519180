//! One agent per node, whatever its flags: a lock on the file
//! `/run/edgevx/netns/<inode>.lock`, named after the network namespace the
//! process runs in (the inode of `/proc/self/ns/net`), held for the life of
//! the process.
//!
//! Why this, and not a name every process can reach: what an agent owns
//! belongs to its network namespace (`flannel.<VNI>` and its MAC, the
//! underlay's hooks, the VXLAN port), so the lock is keyed on it, and no
//! choice of `--state-dir` or `--bpffs` avoids it. Until 0.2 it was the
//! abstract unix socket `@edgevx/agent`; but abstract names have no
//! permissions, so any process in the namespace (`nobody` included) could
//! bind it first, or win it in the gap of a restart, and keep every agent
//! out. A file in a directory only root can write (created 0700, and
//! refused if it or its parent is owned by anyone else or writable by
//! them) can only be locked by a process that may open it: root, the
//! agent's own uid. The lock never depends on that name any more; the
//! holder still binds it when it can (best effort, [`OLD_NAME`]), only so
//! that a 0.1 agent started beside it (a downgrade gone wrong) refuses to
//! run, as 0.1 checks nothing else. A squatter there costs nothing.
//!
//! The lock is a POSIX record lock (`fcntl(F_SETLK)`) on the whole file, so
//! the kernel itself says who holds it: `F_GETLK` answers with the holder's
//! pid, translated into the asker's pid namespace (0 when the holder runs
//! in a pid namespace the asker cannot see). The kernel drops it when the
//! process ends, however it ends; it is not inherited by the programs the
//! agent runs. `edgevx status` asks the kernel the same way, so "running"
//! is what the kernel says, never a recorded pid. The holder writes one
//! JSON line into the file (its pid, role, state dir and phase) for
//! `status`; a refusal never prints it, only the pid the kernel gives.
//!
//! `/run` is shared by every mount namespace of the host that does not
//! hide it: `ip netns exec` and the systemd unit's sandbox keep it; a
//! container must mount `/run/edgevx/netns` from the host (the DaemonSet
//! does), or it would lock a directory of its own. The state dir's own
//! `flock` stays: it guards the files. `edgevx cleanup` takes this lock
//! too, so it never runs beside an agent.
use std::{
    fs::{self, File, OpenOptions},
    io::Read,
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tracing::{debug, info};

use crate::UsageError;
use crate::gone::Gone;

/// Where the locks live: one file per network namespace.
pub const DIR: &str = "/run/edgevx/netns";

/// What the holder is doing with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Run,
    Cleanup,
}

/// The line the holder keeps in the lock file, for `edgevx status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// In the holder's own pid namespace.
    pub pid: u32,
    pub role: Role,
    pub state_dir: PathBuf,
    /// What it is doing: starting, waiting for the host, bringing up,
    /// forwarding, stopping.
    pub phase: String,
    /// The holder's release (`CARGO_PKG_VERSION`); empty in the records
    /// of agents older than this field.
    #[serde(default)]
    pub version: String,
    /// Where its view comes from and how fresh it is; `None` before the
    /// loop runs, and in the records of older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceState>,
}

/// The control plane as the agent last saw it, for `edgevx status`.
/// Times are Unix seconds, so a reader in another process can age them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceState {
    /// As the logs name it: `kube`, `etcd`, `nodes file`.
    pub name: String,
    /// Whether the view in use came from the source (not the cache).
    pub connected: bool,
    /// Whether the source is in touch with its control plane now (read in
    /// full, its watch open: `edgevx_source_watching`).
    #[serde(default)]
    pub watching: bool,
    /// When `watching` last took its present value.
    pub since: u64,
    /// When the view in use arrived (a cached view: when it was cached).
    pub view_at: Option<u64>,
}

/// The abstract unix socket 0.1 agents take as their lock (without its
/// leading NUL).
pub const OLD_NAME: &str = "edgevx/agent";

/// Held while it lives; the file is removed when it is dropped.
pub struct NetnsLock {
    file: File,
    path: PathBuf,
    record: std::sync::Mutex<Record>,
    /// `@edgevx/agent` when it could be bound: keeps a 0.1 agent out.
    old_name: Option<std::os::unix::net::UnixDatagram>,
}

/// Binds [`OLD_NAME`] if no one has: never required, never a refusal.
fn bind_old_name() -> Option<std::os::unix::net::UnixDatagram> {
    use std::os::{linux::net::SocketAddrExt, unix::net::SocketAddr};
    let addr = SocketAddr::from_abstract_name(OLD_NAME).ok()?;
    match std::os::unix::net::UnixDatagram::bind_addr(&addr) {
        Ok(socket) => Some(socket),
        Err(e) => {
            debug!("cannot bind @{OLD_NAME} (kept only to keep 0.1 agents out): {e}");
            None
        }
    }
}

/// Who holds the lock of this network namespace, as the kernel says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// `None` when it runs in a pid namespace this process cannot see.
    pub pid: Option<u32>,
    /// What it wrote, if it could be read.
    pub record: Option<Record>,
}

/// Takes the lock of this process's network namespace, or fails with exit
/// 2 naming the holder's pid (`who`: what the caller is, for the message).
pub fn acquire(who: &str, role: Role, state_dir: &Path) -> Result<NetnsLock> {
    let mut lock = lock_in(Path::new(DIR), netns_key()?, who, role, state_dir)?;
    lock.old_name = bind_old_name();
    Ok(lock)
}

/// Who holds the lock of this process's network namespace; `None` if no one.
pub fn holder() -> Result<Option<Holder>> {
    holder_in(Path::new(DIR), netns_key()?)
}

/// The inode of this process's network namespace: unique among the
/// namespaces alive (a process holding the lock keeps its namespace alive).
fn netns_key() -> Result<u64> {
    let ns = fs::metadata("/proc/self/ns/net").context("cannot read this process's network namespace")?;
    Ok(ns.ino())
}

fn lock_path(dir: &Path, key: u64) -> PathBuf {
    dir.join(format!("{key}.lock"))
}

impl NetnsLock {
    /// Says what the holder does now, for `edgevx status`. Best effort: a
    /// write that fails costs only the phase in `status`.
    pub fn phase(&self, phase: &str) {
        let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
        if record.phase == phase {
            return;
        }
        record.phase = phase.to_string();
        if let Err(e) = write_record(&self.file, &record) {
            debug!("cannot record the phase in {}: {e}", self.path.display());
        }
    }

    /// Says how the source stands, for `edgevx status`; written only when
    /// it changed, best effort like the phase.
    pub fn source(&self, source: SourceState) {
        let mut record = self.record.lock().unwrap_or_else(|p| p.into_inner());
        if record.source.as_ref() == Some(&source) {
            return;
        }
        record.source = Some(source);
        if let Err(e) = write_record(&self.file, &record) {
            debug!("cannot record the source's state in {}: {e}", self.path.display());
        }
    }
}

impl Drop for NetnsLock {
    fn drop(&mut self) {
        // removed while held: whoever opened it before sees another inode
        // at the path once it locks, and opens again (see `lock_in`)
        let _ = fs::remove_file(&self.path);
    }
}

/// The whole file, for writing (`F_WRLCK`) or for asking (`F_GETLK`).
fn whole_file(kind: libc::c_int) -> libc::flock {
    // SAFETY: a plain C struct, all zeroes is valid (and the whole file).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl
}

/// `Ok(false)` when another process holds it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    let fl = whole_file(libc::F_WRLCK);
    // SAFETY: fcntl on a descriptor we own, with a valid struct flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &fl) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(e),
    }
}

/// The holder's pid in this pid namespace (0: not visible from it), or
/// `None` when no other process holds the lock.
fn lock_holder(file: &File) -> std::io::Result<Option<i32>> {
    let mut fl = whole_file(libc::F_WRLCK);
    // SAFETY: fcntl on a descriptor we own, with a valid struct flock.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short).then_some(fl.l_pid))
}

fn write_record(file: &File, record: &Record) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    // a reader takes the first line: the tail a shorter line leaves for a
    // moment is never read
    file.write_all_at(&line, 0)?;
    file.set_len(line.len() as u64)
}

/// The directory, made if need be, and only root's (or this user's): a
/// directory anyone else could write would let them take the lock.
fn prepare(dir: &Path) -> Result<()> {
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("cannot create the lock directory {}", dir.display()));
        }
        _ => {}
    }
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    for (d, is_dir) in parent.map(|p| (p, false)).into_iter().chain([(dir, true)]) {
        let m = fs::symlink_metadata(d).with_context(|| format!("cannot read {}", d.display()))?;
        if !m.file_type().is_dir() {
            return Err(
                UsageError(format!("{} must be a directory (it is not, or it is a symlink)", d.display())).into()
            );
        }
        if m.uid() != 0 && m.uid() != me {
            return Err(UsageError(format!(
                "{} is owned by uid {}: the agent's lock must live where only root can write; remove it (it is \
                 made again, owned by root)",
                d.display(),
                m.uid()
            ))
            .into());
        }
        let loose = if is_dir { 0o077 } else { 0o022 };
        if m.mode() & loose != 0 {
            if !is_dir {
                return Err(UsageError(format!(
                    "{} is writable by others (mode {:o}): the agent's lock must live where only root can write",
                    d.display(),
                    m.mode() & 0o7777
                ))
                .into());
            }
            // e.g. made 0755 by the kubelet (hostPath DirectoryOrCreate)
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot make {} 0700", d.display()))?;
            info!(dir = %d.display(), "made the lock directory 0700");
        }
    }
    Ok(())
}

fn lock_in(dir: &Path, key: u64, who: &str, role: Role, state_dir: &Path) -> Result<NetnsLock> {
    prepare(dir)?;
    let path = lock_path(dir, key);
    // a holder removes the file when it ends: what we opened may be gone
    // from the path by the time we lock it, so the path is checked after
    for _ in 0..16 {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .with_context(|| format!("cannot open the agent lock {}", path.display()))?;
        if !try_lock(&file).with_context(|| format!("cannot lock {}", path.display()))? {
            match lock_holder(&file).with_context(|| format!("cannot ask who holds {}", path.display()))? {
                // released meanwhile
                None => continue,
                Some(pid) => return Err(refusal(pid, &path, who)),
            }
        }
        let opened = file.metadata().with_context(|| format!("cannot read {}", path.display()))?;
        let still = fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == opened.ino() && m.dev() == opened.dev());
        if !still {
            continue;
        }
        let record = Record {
            pid: std::process::id(),
            role,
            state_dir: state_dir.to_path_buf(),
            phase: "starting".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            source: None,
        };
        if let Err(e) = write_record(&file, &record) {
            debug!("cannot record the holder in {}: {e}", path.display());
        }
        return Ok(NetnsLock { file, path, record: std::sync::Mutex::new(record), old_name: None });
    }
    Err(anyhow::anyhow!("cannot take the agent lock {}: it keeps being replaced", path.display()))
}

/// Exit 2 naming the holder by the pid the kernel gives: nothing another
/// process wrote is repeated.
fn refusal(pid: i32, path: &Path, who: &str) -> anyhow::Error {
    let holder = if pid > 0 {
        format!("edgevx pid {pid}")
    } else {
        "an edgevx in another pid namespace (a container?)".to_string()
    };
    UsageError(format!(
        "{holder} is still running in this network namespace (it holds {}), so {who} would fight it over \
         flannel.<VNI>, its MAC and the programs: one agent per node, whatever its --state-dir and --bpffs; stop \
         it first (Kubernetes: remove the node's edgevx.io/dataplane label; systemd: systemctl stop edgevx)",
        path.display()
    ))
    .into()
}

fn holder_in(dir: &Path, key: u64) -> Result<Option<Holder>> {
    let path = lock_path(dir, key);
    let mut file = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path) {
        Ok(f) => f,
        Err(e) if e.is_gone() => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot open the agent lock {}", path.display())),
    };
    let Some(pid) = lock_holder(&file).with_context(|| format!("cannot ask who holds {}", path.display()))? else {
        return Ok(None);
    };
    let mut text = String::new();
    // at most one line of a few hundred bytes; anything else is no record
    let record = (&mut file)
        .take(64 * 1024)
        .read_to_string(&mut text)
        .ok()
        .and_then(|_| text.lines().next().and_then(|l| serde_json::from_str(l).ok()));
    Ok(Some(Holder { pid: u32::try_from(pid).ok().filter(|p| *p > 0), record }))
}

#[cfg(test)]
mod tests {
    use std::{ffi::CString, os::unix::ffi::OsStrExt};

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("edgevx-netns-lock-{name}-{}", std::process::id())).join("netns")
    }

    /// A child process holding the lock on `path` until `release` is
    /// closed: POSIX locks are per process, so a second holder must be one.
    /// Only async-signal-safe calls after fork.
    fn hold_in_child(path: &Path) -> (libc::pid_t, libc::c_int) {
        let c = CString::new(path.as_os_str().as_bytes()).unwrap();
        let (mut ready, mut release) = ([0; 2], [0; 2]);
        unsafe {
            assert_eq!(libc::pipe(ready.as_mut_ptr()), 0);
            assert_eq!(libc::pipe(release.as_mut_ptr()), 0);
            let fl = whole_file(libc::F_WRLCK);
            let pid = libc::fork();
            if pid == 0 {
                let fd = libc::open(c.as_ptr(), libc::O_RDWR);
                let ok = fd >= 0 && libc::fcntl(fd, libc::F_SETLK, &fl) == 0;
                libc::write(ready[1], [ok as u8].as_ptr().cast(), 1);
                libc::close(release[1]);
                let mut b = 0u8;
                libc::read(release[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
            libc::close(release[0]);
            let mut ok = 0u8;
            assert_eq!(libc::read(ready[0], (&mut ok as *mut u8).cast(), 1), 1);
            assert_eq!(ok, 1, "the child could not lock");
            (pid, release[1])
        }
    }

    fn end_child((pid, release): (libc::pid_t, libc::c_int)) {
        unsafe {
            libc::close(release);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
    }

    #[test]
    fn a_second_holder_is_refused_by_the_pid_the_kernel_gives() {
        let dir = scratch("second");
        let path = lock_path(&dir, 7);
        let first = lock_in(&dir, 7, "a test", Role::Run, Path::new("/var/lib/x")).unwrap();
        let record = holder_in(&dir, 7).unwrap();
        // the holder's own process does not conflict with its own lock
        assert_eq!(record, None);
        drop(first);
        assert!(!path.exists(), "the holder removes the file");

        std::fs::write(&path, "{\"pid\":1,\"role\":\"run\",\"state_dir\":\"/x\",\"phase\":\"fake\nlog line\"}\n")
            .unwrap();
        let child = hold_in_child(&path);
        let e = lock_in(&dir, 7, "the second", Role::Run, Path::new("/y")).err().unwrap();
        let text = e.to_string();
        assert!(e.downcast_ref::<UsageError>().is_some(), "{e:#}");
        assert!(text.contains(&format!("edgevx pid {} is still running", child.0)), "{text}");
        assert!(text.contains("the second would fight it") && text.contains("stop it first"), "{text}");
        assert!(!text.contains("fake") && !text.contains('\n'), "it repeated the file: {text}");
        let h = holder_in(&dir, 7).unwrap().unwrap();
        assert_eq!(h.pid, Some(child.0 as u32));
        end_child(child);
        assert_eq!(holder_in(&dir, 7).unwrap(), None, "free once the child is gone");
        let l = lock_in(&dir, 7, "a test", Role::Cleanup, Path::new("/z")).unwrap();
        l.phase("forwarding");
        let text = std::fs::read_to_string(&path).unwrap();
        let r: Record = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!((r.role, r.phase.as_str(), r.state_dir.as_path()), (Role::Cleanup, "forwarding", Path::new("/z")));
        drop(l);
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn the_directory_is_root_only() {
        let dir = scratch("mode");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let l = lock_in(&dir, 1, "a test", Role::Run, Path::new("/s")).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o7777, 0o700, "tightened");
        drop(l);
        // a parent anyone may write is refused
        std::fs::set_permissions(dir.parent().unwrap(), fs::Permissions::from_mode(0o777)).unwrap();
        let e = lock_in(&dir, 1, "a test", Role::Run, Path::new("/s")).err().unwrap();
        assert!(e.to_string().contains("writable by others"), "{e:#}");
        // a symlink is not a directory
        let link = dir.with_file_name("link");
        std::fs::set_permissions(dir.parent().unwrap(), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let e = lock_in(&link, 1, "a test", Role::Run, Path::new("/s")).err().unwrap();
        assert!(e.to_string().contains("must be a directory"), "{e:#}");
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }
}
