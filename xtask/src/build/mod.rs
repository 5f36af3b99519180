//! Building the eBPF object and the agent that embeds it.
pub mod fuzz;
pub mod previous;
use std::{path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{deps::toolchain::Tools, exec};

/// Where [`ebpf`] builds, under the workspace root.
pub const EBPF_TARGET_DIR: &str = "target/ebpf";

/// The eBPF object [`ebpf`] builds (the prog tests and every guest load it).
pub fn ebpf_object() -> PathBuf {
    exec::workspace_root().join(EBPF_TARGET_DIR).join("bpfel-unknown-none/release/edgevx")
}

/// Builds the eBPF crate on its own, so its errors are shown plainly. The
/// object is for this machine's kernel (the BPF_PROG_TEST_RUN tests load it),
/// so `bpf_target_arch` is this machine's architecture; the object embedded
/// in an agent built for another target gets that target's from aya-build.
///
/// It builds in a target directory of its own ([`EBPF_TARGET_DIR`]): its
/// host-side build dependencies (proc-macro2 and the macros) see
/// RUSTC_BOOTSTRAP=1, which proc-macro2's build script watches, so sharing
/// `target/release` with the agent rebuilt those and everything above them
/// (tokio, kube, ...) at every other build.
pub fn ebpf(tools: &Tools) -> Result<()> {
    let root = exec::workspace_root();
    let flags = format!("--cfg=bpf_target_arch=\"{}\"\x1f-Cdebuginfo=2\x1f-Clink-arg=--btf", std::env::consts::ARCH);
    exec::run(
        Command::new("rustup")
            .args(["run", &crate::deps::toolchain::ebpf_toolchain()?, "cargo", "build", "--release"])
            .args(["--package", "edgevx-ebpf", "--bins", "--target", "bpfel-unknown-none"])
            .arg("--target-dir")
            .arg(root.join(EBPF_TARGET_DIR))
            .args(["-Z", "build-std=core"])
            .current_dir(&root)
            .env("PATH", tools.path_env())
            .env("CARGO_ENCODED_RUSTFLAGS", flags)
            .env("RUSTC_BOOTSTRAP", "1")
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

/// `target/release/edgevx-ipam`, the CNI IPAM plugin (no eBPF inside).
pub fn ipam() -> Result<PathBuf> {
    let root = exec::workspace_root();
    exec::run(
        Command::new("cargo").args(["build", "--release", "--locked", "--package", "edgevx-ipam"]).current_dir(&root),
    )?;
    let bin = root.join("target/release/edgevx-ipam");
    eprintln!("xtask: built {}", bin.display());
    Ok(bin)
}

/// A statically linked edgevx-ipam for `target` (a musl target), for the
/// image; `env` as for [`agent_static`].
pub fn ipam_static(target: &str, env: &[(&str, &str)]) -> Result<PathBuf> {
    let root = exec::workspace_root();
    exec::run(
        Command::new("cargo")
            .args(["build", "--release", "--locked", "--package", "edgevx-ipam", "--target", target])
            .current_dir(&root)
            .envs(env.iter().copied()),
    )?;
    let bin = root.join("target").join(target).join("release/edgevx-ipam");
    eprintln!("xtask: built {}", bin.display());
    Ok(bin)
}

/// A statically linked edgevx for `target` (a musl target), eBPF object
/// embedded: aya-build takes `bpf_target_arch` from that target. `env` names
/// the C compiler for ring and psm (`CC_<target>`) and, across
/// architectures, the linker.
pub fn agent_static(tools: &Tools, target: &str, env: &[(&str, &str)]) -> Result<PathBuf> {
    let root = exec::workspace_root();
    exec::run(
        Command::new("cargo")
            .args(["build", "--release", "--locked", "--package", "edgevx", "--target", target])
            .current_dir(&root)
            .env("PATH", tools.path_env())
            .envs(env.iter().copied()),
    )?;
    let bin = root.join("target").join(target).join("release/edgevx");
    eprintln!("xtask: built {}", bin.display());
    Ok(bin)
}

/// The traffic endpoint the demo, bench and tests run inside pods.
pub fn testpeer() -> Result<()> {
    exec::run(
        Command::new("cargo")
            .args(["build", "--release", "--locked", "--package", "edgevx-tests", "--bin", "edgevx-testpeer"])
            .current_dir(exec::workspace_root()),
    )
}

/// Builds the e2e test binary (for `target`, the host's when `None`) and
/// returns its path: cargo names it with a hash, so it is read from cargo's
/// JSON messages.
pub fn e2e_binary(target: Option<&str>, env: &[(&str, std::ffi::OsString)]) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--release", "--locked", "-p", "edgevx-tests", "--test", "e2e", "--no-run"])
        .args(["--message-format", "json"])
        .current_dir(exec::workspace_root())
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(target) = target {
        cmd.args(["--target", target]);
    }
    let out = exec::output(&mut cmd)?;
    out.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "e2e")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .with_context(|| format!("cargo built no e2e test binary for {}", target.unwrap_or("this machine")))
}
