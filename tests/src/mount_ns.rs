//! A mount namespace of a test's own, kept by a sleeping process: mounts
//! made in it (a small or read-only tmpfs standing for a full or failing
//! disk) are seen by what runs through [`MountNs::via`] and by nothing
//! else, and go when the process does.
use std::{
    fs,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

pub struct MountNs {
    holder: Child,
    pid: String,
}

impl MountNs {
    /// Starts the holder with `unshare`, a command made by the caller: a
    /// plain one, or one inside a node's network namespace (`ip netns
    /// exec` then unshare: both exec, so the pid is sleep's).
    pub fn new(mut unshare: Command) -> Result<Self> {
        let holder = unshare
            .args(["--mount", "--propagation", "private", "sleep", "infinity"])
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start the mount namespace's holder")?;
        let pid = holder.id().to_string();
        let deadline = Instant::now() + Duration::from_secs(10);
        while fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim() != "sleep" {
            ensure!(Instant::now() < deadline, "the holder never became sleep");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(MountNs { holder, pid })
    }

    /// The wrapper that runs a command in this mount namespace.
    pub fn via(&self) -> Vec<String> {
        ["/usr/bin/nsenter", "-t", &self.pid, "-m", "--"].iter().map(|s| s.to_string()).collect()
    }

    /// `sh -c script` in this mount namespace through `nsenter`, a command
    /// made by the caller (plain, or inside a node); its output.
    pub fn sh(&self, mut nsenter: Command, script: &str) -> Result<String> {
        let out = nsenter.args(["-t", &self.pid, "-m", "--", "sh", "-c", script]).output()?;
        if !out.status.success() {
            bail!(
                "{script:?} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for MountNs {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
