//! Debian packages the build, tests, demo and bench need: installed when missing.
use std::process::Command;

use anyhow::{Context, Result};

use crate::exec;

/// What building needs: etcd-client compiles etcd's protobufs with protoc.
const BUILD: &[(&str, &str)] = &[("protoc", "protobuf-compiler")];

/// (command that proves it is there, Debian package that provides it)
const NEEDED: &[(&str, &str)] = &[
    ("protoc", "protobuf-compiler"),
    ("ip", "iproute2"),
    ("bridge", "iproute2"),
    ("ping", "iputils-ping"),
    ("iperf3", "iperf3"),
    ("etcd", "etcd-server"),
    ("etcdctl", "etcd-client"),
    ("nft", "nftables"),
];

fn have(cmd: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {cmd}")]).output().is_ok_and(|o| o.status.success())
}

/// Everything the tests, demo and bench need.
pub fn ensure() -> Result<()> {
    install(NEEDED)
}

/// What `cargo xtask build` needs.
pub fn ensure_build() -> Result<()> {
    install(BUILD)
}

fn install(needed: &[(&str, &str)]) -> Result<()> {
    let mut missing: Vec<&str> = needed.iter().filter(|(c, _)| !have(c)).map(|(_, p)| *p).collect();
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    exec::run(Command::new("apt-get").arg("update").arg("-qq"))
        .context("missing packages and `apt-get update` failed")?;
    exec::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .with_context(|| format!("missing: {} (apt-get install failed)", missing.join(" ")))?;
    // the etcd-server package may start a system etcd; the tests run their own
    let _ = Command::new("sh")
        .args([
            "-c",
            "command -v systemctl >/dev/null && systemctl stop etcd 2>/dev/null; pkill -x etcd 2>/dev/null; true",
        ])
        .status();
    Ok(())
}
