//! A network namespace that is deleted when dropped.
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};

use crate::sh;

pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: &str) -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh(&["ip", "netns", "add", name])?;
        let ns = Netns { name: name.to_string() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
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
