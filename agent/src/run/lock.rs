//! One agent per node: an exclusive `flock` on `<state dir>/agent.lock`,
//! held for the life of the process. A second `edgevx run` on the same
//! state dir exits 2 at once, naming the first one's pid, before it
//! changes anything.
//!
//! A full or read-only state filesystem never stops the agent: an existing
//! lock file is opened read-only when it cannot be opened for writing
//! (`flock` needs no write access), the holder's pid is written only where
//! it can be (the refusal reads the holder from `/proc/locks` first), and
//! a lock file that cannot be created is taken under /run instead
//! (`records::runtime_dir`), where every agent on this state dir looks too.
use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use tracing::warn;

use crate::{UsageError, records::runtime_dir};

pub const LOCK_FILE: &str = "agent.lock";

/// Held while the agent runs; the kernel drops the lock when the process
/// ends, however it ends.
pub struct AgentLock {
    _file: File,
}

/// Where the lock may be: the state dir's, then its twin under /run.
fn places(state_dir: &Path) -> [PathBuf; 2] {
    [state_dir.join(LOCK_FILE), runtime_dir(state_dir).join(LOCK_FILE)]
}

/// Takes the lock if its file is already there (an agent ran on this state
/// dir before), without creating anything: a second agent is refused before
/// it so much as binds its metrics port. `None` when there is no lock file.
pub fn acquire_existing(state_dir: &Path) -> Result<Option<AgentLock>> {
    match places(state_dir).into_iter().find(|p| p.exists()) {
        Some(path) => lock(state_dir, &path, false).map(Some),
        None => Ok(None),
    }
}

/// Takes the lock, creating the state dir (mode 0700 from the start: it
/// holds the VTEP MAC and the cached view) and the lock file if need be;
/// under /run when the state dir's filesystem cannot take them.
pub fn acquire(state_dir: &Path) -> Result<AgentLock> {
    let [in_state, in_run] = places(state_dir);
    match create_dir(state_dir).and_then(|()| lock(state_dir, &in_state, true)) {
        Ok(l) => Ok(l),
        Err(e) if e.is::<UsageError>() => Err(e),
        Err(e) => {
            warn!(lock = %in_run.display(),
                "cannot take the agent lock in the state dir ({e:#}); taking it under /run instead");
            if let Some(dir) = in_run.parent() {
                create_dir(dir)?;
            }
            lock(state_dir, &in_run, true)
        }
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            Err(e).with_context(|| format!("cannot create the state dir {}", dir.display()))
        }
        _ => Ok(()),
    }
}

fn open(path: &Path, create: bool) -> std::io::Result<(File, bool)> {
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let rw = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(flags)
        .open(path);
    match rw {
        Ok(f) => Ok((f, true)),
        // a read-only filesystem (or one we may not write): flock needs only a descriptor
        Err(e) if matches!(e.raw_os_error(), Some(libc::EROFS | libc::EACCES | libc::EPERM)) => {
            OpenOptions::new().read(true).custom_flags(flags).open(path).map(|f| (f, false)).map_err(|_| e)
        }
        Err(e) => Err(e),
    }
}

fn lock(state_dir: &Path, path: &Path, create: bool) -> Result<AgentLock> {
    let (mut file, writable) =
        open(path, create).with_context(|| format!("cannot open the agent lock {}", path.display()))?;
    // std's file lock is flock(2) on Linux (LOCK_EX | LOCK_NB here): the
    // same lock as every earlier agent took with libc, without the unsafe
    if let Err(e) = file.try_lock() {
        if let std::fs::TryLockError::Error(err) = e {
            return Err(err).with_context(|| format!("cannot lock {}", path.display()));
        }
        let who = match holder(&mut file) {
            Some(pid) => format!("edgevx pid {pid}"),
            None => "another edgevx".to_string(),
        };
        return Err(UsageError(format!(
            "{who} already runs on state dir {} (it holds {}); one agent per node: stop it first",
            state_dir.display(),
            path.display()
        ))
        .into());
    }
    // the pid is for the refusal above, which asks /proc/locks first: best effort
    let written = writable
        && file.set_len(0).and_then(|()| file.rewind()).and_then(|()| writeln!(file, "{}", std::process::id())).is_ok();
    if !written {
        warn!(lock = %path.display(), "cannot write this agent's pid into its lock file (a full or read-only filesystem); the lock holds all the same");
    }
    Ok(AgentLock { _file: file })
}

/// The pid holding `file`'s flock: from `/proc/locks` (the kernel's word;
/// `0` there is a holder in another pid namespace), else the pid written
/// in the file. Only digits are ever returned, never the file's text.
fn holder(file: &mut File) -> Option<u32> {
    let m = file.metadata().ok()?;
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    let me = format!("{major:02x}:{minor:02x}:{}", m.ino());
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let from_kernel = locks.lines().find_map(|l| {
        // 1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&me.as_str())).then(|| f.get(4)?.parse::<u32>().ok()).flatten()
    });
    from_kernel.filter(|&p| p != 0).or_else(|| {
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        text.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let dir = std::env::temp_dir().join(format!("edgevx-lock-{}", std::process::id()));
        let _first = acquire(&dir).unwrap();
        // flock locks belong to the open file description: a second open
        // in the same process conflicts just as another process would
        let e = acquire_existing(&dir).err().unwrap().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(e.contains("already runs"), "{e}");
        drop(_first);
        assert!(acquire(&dir).is_ok(), "free again once the first is gone");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fresh_state_dir_is_made_0700_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("edgevx-lock-mode-{}", std::process::id())).join("state");
        let _lock = acquire(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700, "{mode:o}");
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn the_holder_is_read_from_the_kernel_even_when_the_file_says_nothing() {
        let dir = std::env::temp_dir().join(format!("edgevx-lock-kernel-{}", std::process::id()));
        let _first = acquire(&dir).unwrap();
        std::fs::write(dir.join(LOCK_FILE), "not a pid\n").unwrap();
        let e = acquire_existing(&dir).err().unwrap().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(!e.contains("not a pid"), "{e}");
        drop(_first);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
