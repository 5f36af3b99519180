//! One agent per node: an exclusive `flock` on `<state dir>/agent.lock`,
//! held for the life of the process. A second `edgevx run` on the same
//! state dir exits 2 at once, naming the first one's pid, before it
//! changes anything.
use std::{
    fs::{File, OpenOptions},
    io::{Read, Seek, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt, OpenOptionsExt},
    },
    path::Path,
};

use anyhow::{Context, Result};

use crate::UsageError;

pub const LOCK_FILE: &str = "agent.lock";

/// Held while the agent runs; the kernel drops the lock when the process
/// ends, however it ends.
pub struct AgentLock {
    _file: File,
}

/// Takes the lock if its file is already there (an agent ran on this state
/// dir before), without creating anything: a second agent is refused before
/// it so much as binds its metrics port. `None` when there is no lock file.
pub fn acquire_existing(state_dir: &Path) -> Result<Option<AgentLock>> {
    if !state_dir.join(LOCK_FILE).exists() {
        return Ok(None);
    }
    lock(state_dir, false).map(Some)
}

/// Takes the lock, creating the state dir (mode 0700 from the start: it
/// holds the VTEP MAC and the cached view) and the lock file if need be.
pub fn acquire(state_dir: &Path) -> Result<AgentLock> {
    if let Some(parent) = state_dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(state_dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(e).with_context(|| format!("cannot create the state dir {}", state_dir.display()));
        }
        _ => {}
    }
    lock(state_dir, true)
}

fn lock(state_dir: &Path, create: bool) -> Result<AgentLock> {
    let path = state_dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("cannot open the agent lock {}", path.display()))?;
    // SAFETY: flock on a file descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err).with_context(|| format!("cannot lock {}", path.display()));
        }
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() { "another edgevx".to_string() } else { format!("edgevx pid {holder}") };
        return Err(UsageError(format!(
            "{who} already runs on state dir {} (it holds {}); one agent per node: stop it first",
            state_dir.display(),
            path.display()
        ))
        .into());
    }
    file.set_len(0).and_then(|()| file.rewind()).with_context(|| format!("cannot write {}", path.display()))?;
    writeln!(file, "{}", std::process::id()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(AgentLock { _file: file })
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
}
