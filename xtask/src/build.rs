//! Building the eBPF object and the agent that embeds it.
use std::process::Command;

use anyhow::Result;

use crate::{exec, toolchain::Tools};

/// Builds the eBPF crate on its own, so its errors are shown plainly.
pub fn ebpf(tools: &Tools) -> Result<()> {
    let root = exec::workspace_root();
    exec::run(
        Command::new("rustup")
            .args(["run", crate::toolchain::EBPF_TOOLCHAIN, "cargo", "build", "--release"])
            .args(["--package", "edgevx-ebpf", "--bins", "--target", "bpfel-unknown-none"])
            .args(["-Z", "build-std=core"])
            .current_dir(&root)
            .env("PATH", tools.path_env())
            .env("CARGO_ENCODED_RUSTFLAGS", "--cfg=bpf_target_arch=\"x86_64\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf")
            .env_remove("RUSTC")
            .env_remove("RUSTC_WORKSPACE_WRAPPER"),
    )
}

/// `target/release/edgevx`, eBPF object embedded (agent/build.rs builds it).
pub fn agent(tools: &Tools) -> Result<()> {
    let root = exec::workspace_root();
    exec::run(
        Command::new("cargo")
            .args(["build", "--release", "--locked", "--package", "edgevx"])
            .current_dir(&root)
            .env("PATH", tools.path_env()),
    )?;
    eprintln!("xtask: built {}", root.join("target/release/edgevx").display());
    Ok(())
}

/// The traffic endpoint the demo, bench and tests run inside pods.
pub fn testpeer() -> Result<()> {
    exec::run(
        Command::new("cargo")
            .args(["build", "--release", "--locked", "--package", "edgevx-tests", "--bin", "edgevx-testpeer"])
            .current_dir(exec::workspace_root()),
    )
}
