//! `cargo xtask test`: unit tests, then the privileged tests one at a time.
use std::process::Command;

use anyhow::{Result, bail};

use crate::{build, exec, image, kernels, packages, seccomp, toolchain, unpacked, vm, vm_arm64};

/// Where the e2e tests find the image archive (tests/tests/e2e/image.rs).
pub const IMAGE_ARCHIVE_ENV: &str = "EDGEVX_IMAGE_ARCHIVE";

pub fn run(filter: Option<&str>, kernel: Option<&str>, ci: bool) -> Result<()> {
    if let Some(kernel) = kernel {
        return in_vm(filter, kernel, ci);
    }
    packages::ensure_image()?;
    let (tools, ipam) = prepare()?;
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
    // The arm64 tests run the arm64 build under qemu-user, and read the
    // multi-arch index (which builds the arm64 image, and the native one again
    // from the same binaries).
    if filter.is_none_or(|f| f.contains("arm64") || f.contains("index")) {
        let index = image::build_index()?;
        let (agent, ipam) = image::binaries(image::Arch::Arm64)?;
        e2e.env("EDGEVX_IMAGE_INDEX", index)
            .env("EDGEVX_ARM64_BIN", agent)
            .env("EDGEVX_ARM64_IPAM_BIN", ipam)
            .env("EDGEVX_ARM64_SYSROOT", crate::sysroot::ensure(image::Arch::Arm64.oci())?);
    }
    e2e.args(["test", "--release", "--locked", "-p", "edgevx-tests"])
        .current_dir(&root)
        .env("PATH", tools.path_env())
        .env("EDGEVX_BIN", root.join("target/release/edgevx"))
        .env("EDGEVX_IPAM_BIN", ipam)
        .env("EDGEVX_EBPF_OBJECT", root.join("target/bpfel-unknown-none/release/edgevx"))
        // the alert rules' tests (deploy/monitoring)
        .env("EDGEVX_PROMTOOL", unpacked::ensure(&unpacked::PROMTOOL)?)
        // deploy/'s kustomize overlays, rendered as a cluster would
        .env("EDGEVX_KUBECTL", unpacked::ensure(&unpacked::KUBECTL)?)
        .arg("--")
        .arg("--test-threads=1");
    if let Some(f) = filter {
        e2e.arg(f);
    }
    exec::run(&mut e2e)
}

/// What every test run needs: the packages, the tools, the eBPF object, the
/// agent and edgevx-ipam (returned).
fn prepare() -> Result<(toolchain::Tools, std::path::PathBuf)> {
    packages::ensure()?;
    let tools = toolchain::ensure()?;
    build::ebpf(&tools)?;
    build::agent(&tools)?;
    let ipam = build::ipam()?;
    Ok((tools, ipam))
}

/// The e2e tests inside a VM booting `kernel` (see `vm.rs`); with no
/// filter, the edge set [`vm::EDGE_TESTS`], with `ci` CI's share of it:
/// every prog test and [`vm::CI_TESTS`]. Unit tests and the image tests
/// stay with the native run: neither depends on the kernel.
fn in_vm(filter: Option<&str>, kernel: &str, ci: bool) -> Result<()> {
    packages::ensure_vm()?;
    let (tools, ipam) = prepare()?;
    if kernels::spec(kernel)?.arch == "arm64" {
        // every prog test, with --ci too: the arm64 guest runs nothing else
        return vm_arm64::run(kernel, &filter.map_or_else(|| vm_arm64::TESTS.to_vec(), |f| vec![f]));
    }
    if !is_root() {
        bail!("the kernel matrix boots VMs and runs the namespace tests in them: it needs root");
    }
    let root = exec::workspace_root();
    let test_binary = build::e2e_binary(None, &[("PATH", tools.path_env())])?;
    let binary = test_binary.display().to_string();
    let mut command = vec!["sh".to_string(), "-c".to_string()];
    let prog_tests = format!("{binary} --test-threads=1 prog_test_run");
    command.push(match (filter, ci) {
        (Some(f), _) => format!("{binary} --test-threads=1 {}", quote(f)),
        (None, true) => format!("{prog_tests} && {binary} --test-threads=1 --exact {}", vm::CI_TESTS.join(" ")),
        (None, false) => format!("{binary} --test-threads=1 {}", vm::EDGE_TESTS.join(" ")),
    });
    vm::run(&vm::Run {
        kernel,
        command,
        env: vec![
            ("EDGEVX_BIN".into(), root.join("target/release/edgevx")),
            ("EDGEVX_IPAM_BIN".into(), ipam),
            ("EDGEVX_EBPF_OBJECT".into(), root.join("target/bpfel-unknown-none/release/edgevx")),
        ],
        path_env: tools.path_env(),
        job: "tests",
    })
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn is_root() -> bool {
    exec::output(Command::new("id").arg("-u")).is_ok_and(|s| s.trim() == "0")
}
