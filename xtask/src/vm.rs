//! `cargo xtask test --kernel <name>`: the e2e tests on another kernel, in
//! a QEMU guest that boots Debian's own kernel package.
//!
//! virtme-ng boots it: it shares this machine's root filesystem read-only
//! over 9p (with writable overlays on /etc, /tmp, /var, ...), links the
//! guest's `/lib/modules/<release>` to the unpacked package, and runs one
//! script. So the guest runs the very binaries, CNI plugins, iptables and
//! etcd the native tests run, and only the kernel differs. A runner of our
//! own (QEMU, `-kernel`, an initramfs that loads Debian's 9p modules, an
//! init script) would have to rebuild exactly that; virtme-ng is maintained
//! for this job, installs from PyPI into a venv under the cache, and is
//! what the kernel's own BPF CI tooling grew from.
//!
//! KVM is tried first where `/dev/kvm` exists; a guest that never starts
//! its script (nested KVM dies at once on some hosts) is booted again
//! under TCG, and the run says which it used.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{exec, kernels, toolchain};

const VIRTME_NG_VERSION: &str = "1.42";

/// How many times longer the test harness waits in a guest: TCG on two
/// shared cores runs the agent's iptables writes and program loads several
/// times slower than natively.
const GUEST_PATIENCE: u32 = 6;

/// Set in a guest's environment: the host has installed and built what the
/// job needs, so an xtask job run inside skips those steps.
pub const PREPARED_ENV: &str = "EDGEVX_XTASK_IN_VM";

/// The tests that matter most on an edge node's kernel, run by `--kernel`
/// when no filter is given, and by CI on every kernel of the matrix
/// (libtest filters: a test runs when its name contains one of them).
pub const EDGE_TESTS: &[&str] = &[
    // the programs' bytes, every variant the kernel accepts, and the verifier
    "prog_test_run::",
    "prog_test_run_v6::",
    "kernel::",
    // interop with a kernel flannel node both ways, TCP under GSO
    "interop::",
    // kube-proxy's rules (iptables and nftables), the real bridge and host-local plugins with --ip-masq
    "real_node::",
    // kill -9 and restart with no loss
    "restart::",
    // the injection paths
    "injection::",
    // dual-stack and IPv6-only
    "dual_stack::",
    "ipv6_only::",
    // DirectRouting
    "direct_routing::",
    // the MTU cases
    "mtu::",
    // a rollback to flanneld
    "rollback::",
    // `edgevx status` and `edgevx cleanup`
    "cli::",
    "reconcile::",
    // the edge outage end to end: power lost while cut off, restore first
    "outage::",
];

/// What CI runs on each kernel of the matrix besides every prog test
/// (exact test names): one test for each row of the the kernel table (docs/src/kernels.md)
/// and each part of the edge set, sized so that two kernels under TCG fit
/// CI's 90 minutes beside the full native suite. The whole edge set
/// ([`EDGE_TESTS`]) takes hours under TCG on two cores; `cargo xtask test
/// --kernel NAME` runs it.
pub const CI_TESTS: &[&str] = &[
    "kernel::the_dataplane_comes_up_and_forwards_without_kernel_btf",
    "kernel::the_agent_loads_the_encap_this_kernel_takes_and_says_why",
    "interop::default_mode_interoperates_with_kernel_flannel_both_ways",
    "real_node::clusterip_iptables::edgevx_ip_masq",
    "real_node::clusterip_nftables::edgevx_ip_masq",
    "restart::no_ping_is_lost_across_kill_9_and_restart",
    "injection::a_pod_cannot_send_vxlan_to_any_node",
    "dual_stack::dual_stack_interoperates_with_a_kernel_flannel_node_both_ways",
    "ipv6_only::ipv6_only_interoperates_with_a_kernel_ipv6_only_flannel_node",
    "direct_routing::direct_routing_routes_on_link_peers_plainly_and_encapsulates_the_rest",
    "mtu::before_the_agent_follows_df_frames_get_frag_needed_from_the_encap_program",
    "rollback::rolling_back_to_flanneld_keeps_the_node_forwarding",
    "cli::bad_input_exits_2_naming_the_culprit_and_changes_nothing",
];

/// One command to run in a guest booting a matrix kernel.
pub struct Run<'a> {
    pub kernel: &'a str,
    /// What the guest runs (a binary built on the host, and its arguments).
    pub command: Vec<String>,
    /// Environment for the command (the native run's).
    pub env: Vec<(String, PathBuf)>,
    pub path_env: std::ffi::OsString,
    /// What the job is, for the messages and the log's name (`tests`, `bench`).
    pub job: &'a str,
}

/// Boots the kernel, runs the command in it, brings its output, status and
/// the kernel log back to `target/vm/<kernel>/`, and fails when the command
/// failed.
pub fn run(run: &Run) -> Result<()> {
    let spec = kernels::spec(run.kernel)?;
    let kernel = kernels::fetch(spec)?;
    let vng = ensure_virtme_ng()?;
    let root = exec::workspace_root();
    let out = root.join("target/vm").join(spec.name);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let script = out.join("guest.sh");
    fs::write(&script, guest_script(run, &out)).with_context(|| format!("cannot write {}", script.display()))?;
    eprintln!("xtask: kernel {} ({}, {}), results in {}", kernel.release, spec.distro, kernel.package, out.display());

    let started = Instant::now();
    let mut accel = if Path::new("/dev/kvm").exists() { Accel::Kvm } else { Accel::Tcg };
    loop {
        eprintln!("xtask: booting {} under {}", kernel.release, accel.name());
        let console = out.join(format!("console-{}.log", accel.name()));
        let mut cmd = Command::new(&vng);
        // vng runs its helpers (virtme-run) from PATH
        cmd.env("PATH", prepend_path(vng.parent().unwrap_or(Path::new("."))))
            .arg("--run")
            .arg(&kernel.vmlinuz)
            .args(["--cpus", "2", "--memory", "4G", "--verbose"])
            .arg("--rwdir")
            .arg(&out)
            .arg("--cwd")
            .arg(&root);
        if accel == Accel::Tcg {
            cmd.arg("--disable-kvm");
        }
        // the script is a file: a long command line panics the guest at boot
        cmd.arg("--").arg(format!("bash {}", script.display()));
        cmd.stdout(fs::File::create(&console)?).stderr(fs::File::create(out.join("vng-stderr.log"))?);
        let status = cmd.status().with_context(|| format!("cannot start {}", vng.display()))?;
        if out.join("started").exists() {
            break;
        }
        if accel == Accel::Kvm {
            eprintln!("xtask: the guest did not start under KVM ({status}); booting it under TCG");
            accel = Accel::Tcg;
            continue;
        }
        bail!("the {} guest never started its script ({status}); see {}", kernel.release, console.display());
    }
    let log = out.join(format!("{}.log", run.job));
    let code = fs::read_to_string(out.join("status"))
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .with_context(|| format!("the guest wrote no exit status; see {}", log.display()))?;
    let summary = fs::read_to_string(&log).unwrap_or_default();
    let shown = |l: &&str| l.starts_with("test result:") || l.contains("FAILED") || l.starts_with("bench:");
    for line in summary.lines().filter(shown) {
        eprintln!("xtask: [{}] {line}", spec.name);
    }
    eprintln!(
        "xtask: kernel {} under {}: {} exited {code} after {:.0} s ({}.log, dmesg.log in {})",
        kernel.release,
        accel.name(),
        run.job,
        started.elapsed().as_secs_f64(),
        run.job,
        out.display()
    );
    if code != 0 {
        bail!("{} failed on kernel {} ({})", run.job, kernel.release, spec.distro);
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

fn prepend_path(dir: &Path) -> std::ffi::OsString {
    let mut paths = vec![dir.to_path_buf()];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).unwrap_or_default()
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The script the guest runs: the command with the native run's
/// environment, its output, status and the kernel log into `out`.
fn guest_script(run: &Run, out: &Path) -> String {
    let o = quote(&out.display().to_string());
    let mut s = String::from("#!/bin/bash\nset -u\n");
    s += &format!("touch {o}/started\n");
    s += &format!("export PATH={}\n", quote(&run.path_env.to_string_lossy()));
    // the harness waits this many times longer for things to happen: under
    // TCG everything is several times slower (tests/src/lib.rs, `patience`)
    s += &format!("export RUST_BACKTRACE=1 EDGEVX_TEST_PATIENCE={GUEST_PATIENCE}\n");
    for (k, v) in &run.env {
        s += &format!("export {k}={}\n", quote(&v.display().to_string()));
    }
    // what the tests may need to load is in the package's modules (virtme-ng
    // linked them); the guest's hostname and uname are the kernel's
    s += &format!("uname -a > {o}/uname\n");
    let command: Vec<String> = run.command.iter().map(|a| quote(a)).collect();
    s += &format!("{} > {o}/{}.log 2>&1\necho $? > {o}/status\n", command.join(" "), run.job);
    s += &format!("dmesg > {o}/dmesg.log 2>&1\n");
    s
}

/// virtme-ng in a venv of its own under the tools cache.
fn ensure_virtme_ng() -> Result<PathBuf> {
    let venv = toolchain::cache_root()?.join(format!("virtme-ng-{VIRTME_NG_VERSION}"));
    let vng = venv.join("bin/vng");
    if vng.exists() && Command::new(&vng).arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(vng);
    }
    eprintln!("xtask: installing virtme-ng {VIRTME_NG_VERSION} from PyPI into {}", venv.display());
    exec::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("missing: python3's venv module (for virtme-ng)")?;
    exec::run(Command::new(venv.join("bin/pip")).args(["install", "-q", &format!("virtme-ng=={VIRTME_NG_VERSION}")]))
        .context("missing: virtme-ng, and pip could not install it (needs PyPI)")?;
    Ok(vng)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_quotes_and_collects() {
        let run = Run {
            kernel: "5.10",
            command: vec!["/w/target/release/deps/e2e-1".into(), "interop::".into(), "it's".into()],
            env: vec![("EDGEVX_BIN".into(), PathBuf::from("/w/target/release/edgevx"))],
            path_env: "/usr/bin:/bin".into(),
            job: "tests",
        };
        let s = guest_script(&run, Path::new("/w/target/vm/5.10"));
        assert!(s.contains("export EDGEVX_BIN='/w/target/release/edgevx'"), "{s}");
        assert!(
            s.contains("'/w/target/release/deps/e2e-1' 'interop::' 'it'\\''s' > '/w/target/vm/5.10'/tests.log"),
            "{s}"
        );
        assert!(s.contains("echo $? > '/w/target/vm/5.10'/status"), "{s}");
    }
}
