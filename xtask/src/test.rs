//! `cargo xtask test`: unit tests, then the privileged tests one at a time.
use std::process::Command;

use anyhow::{Result, bail};

use crate::{build, exec, image, packages, seccomp, toolchain};

/// Where the e2e tests find the image archive (tests/tests/e2e/image.rs).
pub const IMAGE_ARCHIVE_ENV: &str = "EDGEVX_IMAGE_ARCHIVE";

pub fn run(filter: Option<&str>) -> Result<()> {
    packages::ensure()?;
    packages::ensure_image()?;
    let tools = toolchain::ensure()?;
    build::ebpf(&tools)?;
    build::agent(&tools)?;
    let ipam = build::ipam()?;
    let root = exec::workspace_root();
    let mut unit = Command::new("cargo");
    unit.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "edgevx-common",
        "-p",
        "edgevx",
        "-p",
        "edgevx-ipam",
        "-p",
        "xtask",
    ])
    .current_dir(&root)
    .env("PATH", tools.path_env());
    if let Some(f) = filter {
        unit.arg("--").arg(f);
    }
    exec::run(&mut unit)?;

    if !is_root() {
        bail!("the namespace and BPF tests need root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)");
    }
    // the profile the DaemonSet states is the runtime's default plus our bpf() commands
    seccomp::check()?;
    let mut e2e = Command::new("cargo");
    // The image tests run what `cargo xtask image` builds (a musl build: minutes
    // the first time), so it is built only when they are selected.
    if filter.is_none_or(|f| f.contains("image")) {
        e2e.env(IMAGE_ARCHIVE_ENV, image::build(image::Arch::host()?)?);
    }
    e2e.args(["test", "--release", "--locked", "-p", "edgevx-tests"])
        .current_dir(&root)
        .env("PATH", tools.path_env())
        .env("EDGEVX_BIN", root.join("target/release/edgevx"))
        .env("EDGEVX_IPAM_BIN", ipam)
        .env("EDGEVX_EBPF_OBJECT", root.join("target/bpfel-unknown-none/release/edgevx"))
        .arg("--")
        .arg("--test-threads=1");
    if let Some(f) = filter {
        e2e.arg(f);
    }
    exec::run(&mut e2e)
}

fn is_root() -> bool {
    exec::output(Command::new("id").arg("-u")).is_ok_and(|s| s.trim() == "0")
}
