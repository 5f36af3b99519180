//! An `edgevx run` process inside a node namespace.
use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::{edgevx_bin, netns::Netns, topo::Host};

pub struct Agent {
    child: Option<Child>,
    pub log: PathBuf,
    pub state_dir: PathBuf,
    pub bpffs: PathBuf,
    /// The node's network namespace, where `edgevx status` looks at interfaces.
    pub netns: String,
    /// What `edgevx status` runs through inside the node (e.g. `nsenter
    /// -t PID -m --`, for a state dir mounted in a private mount namespace).
    pub status_via: Vec<String>,
}

impl Agent {
    /// Starts the agent for `host` with a nodes file and waits until its dataplane is up.
    pub fn start(host: &Host, nodes_file: &Path, extra: &[&str]) -> Result<Self> {
        let nodes = nodes_file.to_str().context("path")?;
        let mut args = vec!["--nodes-file", nodes];
        args.extend_from_slice(extra);
        Self::start_with(host, &args)
    }

    /// Starts the agent with `args` after the common ones; waits for "dataplane up".
    pub fn start_with(host: &Host, args: &[&str]) -> Result<Self> {
        let mut agent = Self::spawn(host, args)?;
        agent.wait_log("dataplane up", Duration::from_secs(20))?;
        Ok(agent)
    }

    /// Starts the agent without waiting for anything.
    pub fn spawn(host: &Host, args: &[&str]) -> Result<Self> {
        Self::spawn_via(host, &[], args)
    }

    /// Starts another build of edgevx, `bin` (the previous release), as
    /// [`Agent::start`] starts this one: a nodes file, `extra` flags, and a
    /// wait for "dataplane up".
    pub fn start_bin(bin: &Path, host: &Host, nodes_file: &Path, extra: &[&str]) -> Result<Self> {
        let mut args = vec!["--nodes-file", nodes_file.to_str().context("path")?];
        args.extend_from_slice(extra);
        let mut agent = Self::spawn_inner(bin, host, &[], &["--iface", "eth0"], &args)?;
        agent.wait_log("dataplane up", Duration::from_secs(20))?;
        Ok(agent)
    }

    /// Starts the agent through `wrapper` (e.g. `setpriv ...`) inside the node.
    pub fn spawn_via(host: &Host, wrapper: &[&str], args: &[&str]) -> Result<Self> {
        Self::spawn_inner(&edgevx_bin(), host, wrapper, &["--iface", "eth0"], args)
    }

    /// Starts the agent without the common `--iface eth0`, so that `args`
    /// (or nothing) choose the underlay; waits for nothing.
    pub fn spawn_choosing_iface(host: &Host, args: &[&str]) -> Result<Self> {
        Self::spawn_inner(&edgevx_bin(), host, &[], &[], args)
    }

    /// Starts the agent through `wrapper` with no `--iface`: `args` (or the
    /// default route) choose the underlay; waits for nothing.
    pub fn spawn_choosing_iface_via(host: &Host, wrapper: &[&str], args: &[&str]) -> Result<Self> {
        Self::spawn_inner(&edgevx_bin(), host, wrapper, &[], args)
    }

    fn spawn_inner(bin: &Path, host: &Host, wrapper: &[&str], iface: &[&str], args: &[&str]) -> Result<Self> {
        let log = host.dir.join(format!("{}.log", crate::unique("agent")));
        let bin = bin.to_str().context("bin path")?;
        let mut cmd = host.ns.cmd(wrapper.first().copied().unwrap_or(bin));
        if !wrapper.is_empty() {
            cmd.args(&wrapper[1..]).arg(bin);
        }
        cmd.args(["run", "--node-name", &host.name()])
            .args(iface)
            .arg("--state-dir")
            .arg(host.state_dir())
            .arg("--bpffs")
            .arg(host.bpffs_dir())
            .arg("--subnet-file")
            .arg(host.subnet_file())
            .args(args)
            .env("EDGEVX_LOG", std::env::var("EDGEVX_LOG").unwrap_or_else(|_| "info".into()))
            .stdout(Stdio::null())
            .stderr(File::create(&log)?);
        let child = cmd.spawn().context("cannot start edgevx")?;
        let agent = Agent {
            child: Some(child),
            log,
            state_dir: host.state_dir(),
            bpffs: host.bpffs_dir(),
            netns: host.ns.name.clone(),
            status_via: Vec::new(),
        };
        Ok(agent)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (counting from the start).
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let timeout = crate::patience(timeout);
        let deadline = Instant::now() + timeout;
        loop {
            if self.log_text().contains(needle) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("agent log has no {needle:?} after {timeout:?}:\n{}", self.log_text());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("agent exited ({status}) before logging {needle:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `edgevx status --json` for this agent's state.
    /// Run inside the node, where the interfaces are (the clsact fallback's
    /// filters can only be seen there; TCX pins are seen from anywhere).
    pub fn status(&self) -> Result<Value> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns])
            .args(&self.status_via)
            .arg(edgevx_bin())
            .args(["status", "--json", "--state-dir"])
            .arg(&self.state_dir)
            .arg("--bpffs")
            .arg(&self.bpffs)
            .output()?;
        status_document(&out)
    }

    /// Waits for the agent to exit on its own; its exit code (`None`: killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let timeout = crate::patience(timeout);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                self.child = None;
                return Ok(status.code());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("agent still running after {timeout:?}:\n{}", self.log_text())
    }

    /// SIGSTOP: the agent is frozen, the programs it attached keep running
    /// (the moments before it reacts to a change, made as long as a test needs).
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after `pause`.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }

    /// SIGKILL: no chance to clean anything up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let status = c.wait()?;
            if !status.success() {
                bail!("agent exited with {status}:\n{}", self.log_text());
            }
        }
        Ok(())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `edgevx cleanup` on `host`'s state dir and bpffs with `extra` flags,
/// waited for; the caller judges its output.
pub fn cleanup(host: &Host, extra: &[&str]) -> Result<Output> {
    let out = host
        .ns
        .cmd(&edgevx_bin().to_string_lossy())
        .args(["cleanup", "--state-dir"])
        .arg(host.state_dir())
        .arg("--bpffs")
        .arg(host.bpffs_dir())
        .args(extra)
        .output()?;
    Ok(out)
}

/// `edgevx status --json` inside the node `ns`, for a stopped agent (or
/// one not started through [`Agent`]): the clsact fallback's filters can
/// only be seen there, so outside it a kernel without TCX (6.1) would read
/// as not attached.
pub fn status(ns: &Netns, state_dir: &Path, bpffs: &Path) -> Result<Value> {
    let out = ns
        .cmd(&edgevx_bin().to_string_lossy())
        .args(["status", "--json", "--state-dir"])
        .arg(state_dir)
        .arg("--bpffs")
        .arg(bpffs)
        .output()?;
    status_document(&out)
}

/// `edgevx status --json`'s document. Its exit code is the node's state
/// (0 forwarding, 1 not forwarding, 3 programs running with no agent), and
/// must be the one its own `state` field names; no document (no state at
/// all, a usage error, a crash) fails with what it printed.
pub fn status_document(out: &std::process::Output) -> Result<Value> {
    let code = out.status.code();
    let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else {
        bail!("edgevx status failed ({:?}): {}", code, String::from_utf8_lossy(&out.stderr));
    };
    let want = match v["state"].as_str() {
        Some("forwarding") => 0,
        Some("not_forwarding") => 1,
        Some("unmanaged") => 3,
        other => bail!("edgevx status: no known state ({other:?}) in {v:#}"),
    };
    anyhow::ensure!(code == Some(want), "edgevx status exited {code:?} with state {}: {v:#}", v["state"]);
    Ok(v)
}

/// Polls `check` on the agent's status until it holds (or `timeout`).
pub fn wait_status(agent: &Agent, timeout: Duration, what: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    let timeout = crate::patience(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        let s = agent.status()?;
        if check(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("status never showed {what} within {timeout:?}: {s:#}\nlog:\n{}", agent.log_text());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The peers in a status document: (node, vtep_mac).
pub fn peers(status: &Value) -> Vec<(String, String)> {
    status["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| (p["node"].as_str().unwrap_or("").to_string(), p["vtep_mac"].as_str().unwrap_or("").to_string()))
        .collect()
}
