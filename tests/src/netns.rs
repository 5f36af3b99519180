//! A network namespace that is deleted when dropped.
use std::{
    fs::File,
    io::{self, Write},
    os::fd::AsRawFd,
    path::Path,
    process::{Command, Output, Stdio},
    thread::{self, JoinHandle},
};

use anyhow::{Context, Result, anyhow, bail};

use crate::sh;

pub struct Netns {
    pub name: String,
}

impl Netns {
    /// A new namespace with `lo` up.
    pub fn new(name: &str) -> Result<Self> {
        let ns = Self::bare(name)?;
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A new namespace with `lo` still down, for a caller whose first
    /// [`Netns::batch`] brings it up: under TCG every process start costs
    /// most of a second, so the topology is built with as few as it can.
    pub fn bare(name: &str) -> Result<Self> {
        // a namespace left over from a killed run of the same name
        if std::path::Path::new("/run/netns").join(name).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
        sh(&["ip", "netns", "add", name])?;
        Ok(Netns { name: name.to_string() })
    }

    /// `ip -n NAME -batch -`: one `ip` for many commands, each line one
    /// (`link set lo up`, ...). ip names the line that failed.
    pub fn batch(&self, lines: &[String]) -> Result<()> {
        let mut child = Command::new("ip")
            .args(["-n", &self.name, "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run ip -batch in {}", self.name))?;
        let script = lines.join("\n") + "\n";
        child.stdin.take().context("ip -batch has no stdin")?.write_all(script.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("ip -batch in {} failed: {}\n{script}", self.name, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    /// `ip -n NAME ARGS...`
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["ip", "-n", &self.name];
        all.extend_from_slice(args);
        sh(&all)
    }

    /// A command run inside the namespace (`ip netns exec`).
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    /// Runs a command inside; fails with its stderr if it fails.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        if !out.status.success() {
            bail!(
                "{args:?} in {} failed: {}{}",
                self.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn output(&self, args: &[&str]) -> Result<Output> {
        self.cmd(args[0]).args(&args[1..]).output().with_context(|| format!("cannot run {args:?} in {}", self.name))
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.run(&["sysctl", "-qw", &format!("{key}={value}")]).map(|_| ())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "pids", &self.name]).output().map(|o| {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        });
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Moves the calling thread into the named network namespace (`ip netns`):
/// setns(2) with CLONE_NEWNET moves only the calling thread.
pub fn enter(name: &str) -> Result<()> {
    let path = Path::new("/run/netns").join(name);
    let file = File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    // SAFETY: plain setns(2) on a namespace fd that stays open for the call.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {}: {}", path.display(), io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a new thread that has entered `ns`; the caller stays put.
pub fn spawn_in<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> JoinHandle<Result<T>> {
    let name = ns.name.clone();
    thread::spawn(move || {
        enter(&name)?;
        f()
    })
}

/// Runs `f` on a thread that entered `ns` and returns its result (a socket
/// made there stays in `ns`, whichever thread uses it).
pub fn in_netns<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    spawn_in(ns, f).join().map_err(|_| anyhow!("the thread in {} panicked", ns.name))?
}
