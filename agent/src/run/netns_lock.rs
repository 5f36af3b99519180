//! One agent per node, whatever its flags: an abstract unix socket,
//! `@edgevx/agent`, bound for the life of the process.
//!
//! Abstract socket names belong to the network namespace, so the lock is
//! keyed on what an agent owns: `flannel.<VNI>` with its MAC, the
//! underlay's hooks and the VXLAN port, all in this namespace. No choice
//! of `--state-dir` or `--bpffs` avoids it, and the kernel releases it when
//! the process ends, however it ends. (The state dir's own `flock` stays:
//! it guards the files.) `edgevx cleanup` takes it too, so it never runs
//! beside an agent.
use std::{
    fs,
    os::{
        linux::net::SocketAddrExt,
        unix::net::{SocketAddr, UnixDatagram},
    },
};

use anyhow::{Context, Result};

use crate::UsageError;

/// The abstract name, without its leading NUL.
pub const NAME: &str = "edgevx/agent";

/// Held while it lives; nothing is ever read from or sent on it.
pub struct NetnsLock {
    _socket: UnixDatagram,
}

/// Takes the lock, or fails with exit 2 naming the holder (`who`: what
/// the caller is, for the message).
pub fn acquire(who: &str) -> Result<NetnsLock> {
    lock_on(NAME, who)
}

fn lock_on(name: &str, who: &str) -> Result<NetnsLock> {
    let addr = SocketAddr::from_abstract_name(name).context("cannot name the agent's abstract socket")?;
    match UnixDatagram::bind_addr(&addr) {
        Ok(socket) => Ok(NetnsLock { _socket: socket }),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            let holder = match holder(name) {
                Some((pid, cmd)) => format!("edgevx pid {pid} ({cmd})"),
                None => "another edgevx (its process is not visible from here)".to_string(),
            };
            Err(UsageError(format!(
                "{holder} is still running in this network namespace (it holds the abstract socket @{name}), \
                 so {who} would fight it over flannel.<VNI>, its MAC and the programs: one agent per node, \
                 whatever its --state-dir and --bpffs; stop it first (Kubernetes: remove the node's \
                 edgevx.io/dataplane label; systemd: systemctl stop edgevx)"
            ))
            .into())
        }
        Err(e) => Err(e).with_context(|| format!("cannot bind the abstract socket @{name}")),
    }
}

/// The pid and command line of the process holding `@<name>`:
/// its inode from `/proc/net/unix` (this namespace's sockets), then the
/// process with a descriptor on that inode.
fn holder(name: &str) -> Option<(u32, String)> {
    let table = fs::read_to_string("/proc/net/unix").ok()?;
    let inode = table.lines().find_map(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        (fields.last() == Some(&format!("@{name}").as_str())).then(|| fields.get(6).map(|i| i.to_string()))?
    })?;
    let target = format!("socket:[{inode}]");
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let Ok(fds) = fs::read_dir(entry.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == target.as_str())) {
            let cmd = fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ").trim().to_string();
            return Some((pid, cmd));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first() {
        // a name of this test's own, so an agent running here is not disturbed
        let name = format!("edgevx-test/{}", std::process::id());
        let first = lock_on(&name, "a test").unwrap();
        let e = lock_on(&name, "the second").err().unwrap().to_string();
        assert!(e.contains(&format!("edgevx pid {}", std::process::id())), "{e}");
        assert!(e.contains("one agent per node") && e.contains("the second would fight it"), "{e}");
        drop(first);
        assert!(lock_on(&name, "a test").is_ok(), "free again once the first is gone");
    }
}
