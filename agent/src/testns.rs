//! For unit tests that need the real kernel (they run as root): a named
//! network namespace, deleted when dropped, and a way to run code inside
//! it on a thread of its own (sockets opened there stay in it). Nothing
//! here touches the namespace the tests run in.
use std::{
    fs::File,
    os::fd::AsRawFd,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context, Result, bail};

pub struct TestNs {
    pub name: String,
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl TestNs {
    /// A new namespace with `lo` up; `tag` shows in its name.
    pub fn new(tag: &str) -> Result<Self> {
        let name = format!("evx-{tag}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        run(&["ip", "netns", "add", &name])?;
        let ns = TestNs { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["ip", "-n", &self.name];
        all.extend_from_slice(args);
        run(&all)
    }

    /// A command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["ip", "netns", "exec", &self.name];
        all.extend_from_slice(args);
        run(&all)
    }

    /// Runs `f` on a new thread that entered this namespace.
    pub fn enter<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        match self.spawn_in(f)?.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        }
    }

    /// Starts `f` on a new thread that entered this namespace.
    pub fn spawn_in<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<std::thread::JoinHandle<Result<T>>> {
        let path = format!("/run/netns/{}", self.name);
        let ns = File::open(&path).with_context(|| format!("cannot open {path}"))?;
        Ok(std::thread::spawn(move || {
            // SAFETY: setns on an fd we hold, for this thread only.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error()).context("cannot enter the test namespace");
            }
            Ok(f())
        }))
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

pub fn run(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("cannot run {args:?}"))?;
    if !out.status.success() {
        bail!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Joins `a` and `b` with a veth pair, `a_if` with `a_addr` (CIDR) in `a`.
pub fn link(a: &TestNs, a_if: &str, a_addr: &str, b: &TestNs, b_if: &str, b_addr: &str) -> Result<()> {
    a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name])?;
    a.ip(&["addr", "add", a_addr, "dev", a_if])?;
    b.ip(&["addr", "add", b_addr, "dev", b_if])?;
    // `dev` spelled out: ip takes a bare "ma" for "master"
    a.ip(&["link", "set", "dev", a_if, "up"])?;
    b.ip(&["link", "set", "dev", b_if, "up"])?;
    Ok(())
}
