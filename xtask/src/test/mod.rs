//! `cargo xtask test`: unit tests, then the privileged tests one at a time.
pub mod host;
pub mod vm;
pub mod vm_arm64;
use std::process::Command;

use anyhow::{Result, bail};

use crate::{
    build::{self, previous},
    deps::{kernels, packages, toolchain, unpacked},
    exec,
    ship::{image, seccomp},
};

/// Where the e2e tests find the image archive (tests/tests/e2e/image.rs).
pub const IMAGE_ARCHIVE_ENV: &str = "EDGEVX_IMAGE_ARCHIVE";

pub fn run(filter: Option<&str>, kernel: Option<&str>, ci: bool) -> Result<()> {
    if let Some(f) = filter.filter(|f| f.split_whitespace().next().is_none()) {
        bail!("the filter {f:?} names no test: give one or more, separated by spaces, or none for all");
    }
    if let Some(kernel) = kernel {
        return in_vms(filter, kernel, ci);
    }
    packages::ensure_image()?;
    let (tools, ipam, prev) = prepare(filter)?;
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
    // several filters, separated by spaces, as libtest takes them
    if let Some(f) = filter {
        unit.arg("--").args(f.split_whitespace());
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
            .env("EDGEVX_ARM64_SYSROOT", crate::deps::sysroot::ensure(image::Arch::Arm64.oci())?);
    }
    e2e.args(["test", "--release", "--locked", "-p", "edgevx-tests"])
        .current_dir(&root)
        .env("PATH", tools.path_env())
        .env("EDGEVX_BIN", root.join("target/release/edgevx"))
        .env("EDGEVX_IPAM_BIN", ipam)
        .env("EDGEVX_EBPF_OBJECT", crate::build::ebpf_object())
        // the alert rules' tests (deploy/monitoring)
        .env("EDGEVX_PROMTOOL", unpacked::ensure(&unpacked::PROMTOOL)?)
        // deploy/'s kustomize overlays, rendered as a cluster would
        .env("EDGEVX_KUBECTL", unpacked::ensure(&unpacked::KUBECTL)?)
        .envs(prev.iter().flat_map(previous::Previous::env))
        .arg("--")
        .arg("--test-threads=1");
    if let Some(f) = filter {
        e2e.args(f.split_whitespace());
    }
    exec::run(&mut e2e)
}

/// What every test run needs: the packages, the tools, the eBPF object, the
/// agent and edgevx-ipam (returned); and when `filter` selects the upgrade
/// tests, the previous release's agent, built before ours (its build
/// leaves it where ours goes, see [`previous`]).
fn prepare(filter: Option<&str>) -> Result<(toolchain::Tools, std::path::PathBuf, Option<previous::Previous>)> {
    packages::ensure()?;
    let tools = toolchain::ensure()?;
    let prev = match previous::selected(filter) {
        true => Some(previous::ensure(&tools)?),
        false => None,
    };
    build::ebpf(&tools)?;
    build::agent(&tools)?;
    if let Some(prev) = &prev {
        previous::check_ours_is_back(prev, &exec::workspace_root().join("target/release/edgevx"))?;
    }
    let ipam = build::ipam()?;
    Ok((tools, ipam, prev))
}

/// The e2e tests inside VMs booting `kernels` (a comma-separated list; see
/// `vm.rs`); with no filter, the edge set [`vm::EDGE_TESTS`], with `ci`
/// CI's share of it: every prog test and [`vm::CI_TESTS`]. Unit tests and
/// the image tests stay with the native run: neither depends on the kernel.
///
/// Everything is built and fetched first, one kernel after the other; then
/// the guests boot at once, the machine's CPUs shared out among them, but
/// never fewer than [`GUEST_CPUS`] each. Under TCG a guest's tests are
/// mostly a chain of process starts, one after the other, so two kernels
/// side by side on two cores take about as long as the slower one alone.
/// For the same reason one amd64 kernel's tests (without `ci`) are dealt
/// out among [`parts`] guests of that kernel, each with its own results
/// (`target/vm/<kernel>.<i>of<n>/`).
fn in_vms(filter: Option<&str>, kernels: &str, ci: bool) -> Result<()> {
    let names: Vec<&str> = kernels.split(',').map(str::trim).filter(|k| !k.is_empty()).collect();
    if names.is_empty() {
        bail!("--kernel {kernels:?} names no kernel");
    }
    let mut specs: Vec<&kernels::Spec> = Vec::new();
    for name in &names {
        let spec = kernels::spec(name)?;
        if specs.iter().any(|s| s.name == spec.name) {
            bail!("--kernel {kernels:?} names {name} twice");
        }
        specs.push(spec);
    }
    packages::ensure_vm()?;
    let (tools, ipam, prev) = prepare(filter)?;
    // the amd64 guests all run the one e2e binary built here
    let native = match specs.iter().any(|s| s.arch != "arm64") {
        true => Some(native_binary(&tools)?),
        false => None,
    };
    // what each guest runs: one amd64 kernel's tests are shared out among
    // guests side by side; with several kernels, each is one guest
    let mut jobs: Vec<GuestJob> = Vec::new();
    for spec in &specs {
        match &native {
            Some(binary) if spec.arch != "arm64" => {
                let parts = if specs.len() == 1 && !ci { parts() } else { 1 };
                match parts {
                    1 => jobs.push(GuestJob { spec, command: Some(guest_command(binary, filter, ci)), part: None }),
                    n => {
                        let shares = shared_out(&listed(binary, filter)?, n);
                        let n = shares.len();
                        for (i, names) in shares.into_iter().enumerate() {
                            let command = format!("{binary} --test-threads=1 --exact {}", names.join(" "));
                            let part = (n > 1).then_some((i + 1, n));
                            jobs.push(GuestJob { spec, command: Some(command), part });
                        }
                    }
                }
            }
            _ => jobs.push(GuestJob { spec, command: None, part: None }),
        }
    }
    let cpus = (vm::host_cpus() / jobs.len()).max(GUEST_CPUS);
    let patience = vm::patience(jobs.len(), cpus);
    let mut guests = Vec::new();
    for GuestJob { spec, command, part } in jobs {
        guests.push(match command {
            Some(command) => {
                Guest::Native(vm::prepare(&native_run(spec, command, part, &tools, &ipam, prev.as_ref(), patience))?)
            }
            None => {
                // every prog test, with --ci too: the arm64 guest runs nothing else
                let filters = filter.map_or_else(|| vm_arm64::TESTS.to_vec(), |f| f.split_whitespace().collect());
                Guest::Arm64(vm_arm64::prepare(spec.name, &filters)?)
            }
        });
    }
    let guests_count = guests.len();
    let failed: Vec<String> = std::thread::scope(|s| {
        let running: Vec<_> =
            guests.into_iter().map(|g| (g.name().to_string(), s.spawn(move || g.boot(cpus)))).collect();
        running
            .into_iter()
            .filter_map(|(name, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("{name}: {e:#}")),
                Err(_) => Some(format!("{name}: its runner panicked")),
            })
            .collect()
    });
    if !failed.is_empty() {
        bail!("the kernel matrix failed in {} of {guests_count} guests:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(())
}

/// What one guest runs: the amd64 e2e `command` (`None`: the arm64
/// guest's prog tests), as `part` of its kernel's tests or all of them.
struct GuestJob {
    spec: &'static kernels::Spec,
    command: Option<String>,
    part: Option<(usize, usize)>,
}

/// The fewest virtual CPUs a guest gets: the prog tests send from two CPUs
/// (the outer IP ID counter shared by every CPU), and a guest with one would
/// fail them.
const GUEST_CPUS: usize = 2;

/// A guest of the matrix, ready to boot.
enum Guest {
    /// An amd64 kernel under virtme-ng, with this machine's root.
    Native(vm::Prepared),
    /// An arm64 kernel in qemu-system-aarch64, with an initramfs.
    Arm64(vm_arm64::Prepared),
}

impl Guest {
    fn name(&self) -> &str {
        match self {
            Guest::Native(g) => g.name(),
            Guest::Arm64(g) => g.name(),
        }
    }

    fn boot(self, cpus: usize) -> Result<()> {
        match self {
            Guest::Native(g) => g.boot(cpus),
            Guest::Arm64(g) => g.boot(cpus),
        }
    }
}

/// The e2e binary the amd64 guests run, built here; they run namespace
/// tests, which need root.
fn native_binary(tools: &toolchain::Tools) -> Result<String> {
    if !is_root() {
        bail!("the kernel matrix boots VMs and runs the namespace tests in them: it needs root");
    }
    Ok(build::e2e_binary(None, &[("PATH", tools.path_env())])?.display().to_string())
}

/// How many guests share one kernel's tests: two on two cores (under TCG
/// a guest's tests are mostly a chain of process starts, one after the
/// other, so a second guest uses what the first leaves idle), one per two
/// cores beyond, and at most four (each takes 4 GiB).
fn parts() -> usize {
    vm::host_cpus().div_ceil(GUEST_CPUS).clamp(2, 4)
}

/// The e2e tests the amd64 guests run: `filter`'s, with none the edge set
/// [`vm::EDGE_TESTS`], listed by the binary itself.
fn listed(binary: &str, filter: Option<&str>) -> Result<Vec<String>> {
    let filters: Vec<&str> = filter.map_or_else(|| vm::EDGE_TESTS.to_vec(), |f| f.split_whitespace().collect());
    let out = exec::output(Command::new(binary).arg("--list").args(&filters))?;
    let names: Vec<String> = out.lines().filter_map(|l| l.strip_suffix(": test")).map(str::to_string).collect();
    if names.is_empty() {
        bail!("no e2e test matches {filters:?}");
    }
    Ok(names)
}

/// `names` dealt out among `n` guests in turn, so the long tests of one
/// file do not all land in one share; no share is empty.
fn shared_out(names: &[String], n: usize) -> Vec<Vec<String>> {
    let mut shares = vec![Vec::new(); n.min(names.len()).max(1)];
    let count = shares.len();
    for (i, name) in names.iter().enumerate() {
        shares[i % count].push(name.clone());
    }
    shares
}

/// What an amd64 guest runs when it is its kernel's only one:
/// `filter`'s tests, or CI's share, or the edge set.
fn guest_command(binary: &str, filter: Option<&str>, ci: bool) -> String {
    let prog_tests = format!("{binary} --test-threads=1 prog_test_run");
    match (filter, ci) {
        (Some(f), _) => {
            let filters: Vec<String> = f.split_whitespace().map(quote).collect();
            format!("{binary} --test-threads=1 {}", filters.join(" "))
        }
        (None, true) => {
            format!("{prog_tests} && {binary} --test-threads=1 --exact {}", vm::CI_TESTS.join(" "))
        }
        (None, false) => format!("{binary} --test-threads=1 {}", vm::EDGE_TESTS.join(" ")),
    }
}

/// What an amd64 guest runs: `command` (the e2e binary), with the native
/// run's environment.
fn native_run(
    spec: &'static kernels::Spec,
    command: String,
    part: Option<(usize, usize)>,
    tools: &toolchain::Tools,
    ipam: &std::path::Path,
    prev: Option<&previous::Previous>,
    patience: u32,
) -> vm::Run<'static> {
    let root = exec::workspace_root();
    let mut env: Vec<(String, std::path::PathBuf)> = vec![
        ("EDGEVX_BIN".into(), root.join("target/release/edgevx")),
        ("EDGEVX_IPAM_BIN".into(), ipam.to_path_buf()),
        ("EDGEVX_EBPF_OBJECT".into(), crate::build::ebpf_object()),
    ];
    env.extend(prev.iter().flat_map(|p| p.env()).map(|(k, v)| (k.to_string(), v)));
    vm::Run {
        kernel: spec.name,
        command: vec!["sh".to_string(), "-c".to_string(), command],
        env,
        path_env: tools.path_env(),
        job: "tests",
        patience,
        hot: [vec![ipam.to_path_buf()], vm::workspace_binaries()].concat(),
        part,
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn is_root() -> bool {
    exec::output(Command::new("id").arg("-u")).is_ok_and(|s| s.trim() == "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tests_are_dealt_out_in_turn_and_no_share_is_empty() {
        let names: Vec<String> = ["a::1", "a::2", "a::3", "b::1", "b::2"].iter().map(|s| s.to_string()).collect();
        assert_eq!(shared_out(&names, 2), vec![vec!["a::1", "a::3", "b::2"], vec!["a::2", "b::1"]]);
        assert_eq!(shared_out(&names[..1], 3), vec![vec!["a::1"]], "one test: one guest");
        assert_eq!(shared_out(&names, 1).concat(), names);
    }
}
