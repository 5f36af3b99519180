//! `cargo xtask test --kernel <name>`: the e2e tests on another kernel, in
//! a QEMU guest that boots Debian's own kernel package.
//!
//! virtme-ng boots it: it shares this machine's root filesystem read-only
//! (with writable overlays on /etc, /tmp, /var, ...), links the guest's
//! `/lib/modules/<release>` to the unpacked package, and runs one script.
//! So the guest runs the very binaries, CNI plugins, iptables and etcd the
//! native tests run, and only the kernel differs. A runner of our own
//! (QEMU, `-kernel`, an initramfs that loads Debian's modules, an init
//! script) would have to rebuild exactly that; virtme-ng is maintained for
//! this job, installs from PyPI into a venv under the cache, and is what
//! the kernel's own BPF CI tooling grew from.
//!
//! The root is shared over virtio-fs, with the Rust virtiofsd built into
//! the tools cache ([`toolchain::ensure_virtiofsd`]), and not over
//! virtme-ng's fallback, 9p: virtme-ng mounts 9p without a page cache, so
//! under TCG every process start read its binary and its libraries across
//! again, while virtiofsd lets the guest keep them (`/bin/true` in the
//! 5.10 guest: 0.42 s a start over 9p, 0.18 s over virtio-fs, measured
//! side by side with a build running). The run says which it got.
//!
//! KVM is tried first where `/dev/kvm` exists; a guest that does not start
//! its script within a minute (nested KVM dies at once on some hosts, and
//! hangs in the boot on others) is stopped and booted again under TCG, and
//! the run says which it used.
use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};

use crate::{
    deps::{kernels, toolchain},
    exec,
};

const VIRTME_NG_VERSION: &str = "1.42";

/// Added to the guest kernel's command line. Under TCG the kernel's
/// check that the virtual CPUs' TSCs agree fails on emulation jitter
/// alone (every vCPU reads the one host clock), on 5.10 and 6.1 alike,
/// and it falls back to the HPET: then every `clock_gettime` is a system
/// call and an emulated device read (measured in the 5.10 guest: 20,000
/// reads took 1.9 s beyond a bare loop's time with the HPET, 0.14 s with
/// the TSC), and the tests' pings, timers and tokio read the clock all the
/// time. The clock source is no part of what the matrix tests.
const GUEST_KERNEL_ARGS: &str = "tsc=reliable";

/// How many times longer the test harness waits in a guest that has the
/// host's CPUs to itself: TCG runs the agent's iptables writes and program
/// loads several times slower than natively. Guests side by side wait
/// that again times how many of their virtual CPUs share each of the
/// host's ([`patience`]).
pub const GUEST_PATIENCE: u32 = 6;

/// The harness's patience for each of `guests` guests of `cpus` virtual
/// CPUs on this machine. Measured: three guests of two vCPUs on two cores
/// took one agent's bring-up on 5.10 past the lone guest's 120 s (its
/// iptables writes alone 70 s), while the test itself was right. Most
/// waits end when what they wait for happens; the few that end by timing
/// out (a UDP receiver's idle timeout) grow with it, and the CI figures in
/// `.ci/run` were measured with it.
pub fn patience(guests: usize, cpus: usize) -> u32 {
    let crowding = (guests * cpus).div_ceil(host_cpus().max(1)).max(1);
    GUEST_PATIENCE * u32::try_from(crowding).unwrap_or(u32::MAX / GUEST_PATIENCE)
}

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
    "prog_test_run_vtep_guard::",
    "prog_test_run_xdp::",
    "prog_test_run_monitor::",
    "prog_test_run_fast_send::",
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
    // the DaemonSet's capabilities (BPF, NET_ADMIN, PERFMON) and no more: the verifier's rules differ by kernel
    "privileges::",
    // a boot with no default route: the recorded underlay, or a wait
    "offline_boot::",
    "reconcile::",
    // the edge outage end to end: power lost while cut off, restore first
    "outage::",
    // conflicts by the network's rules, in the programs of every kernel
    "conflicts_judge::",
    "conflicts::",
    // a program ahead of decap: the VTEP guard, the order check (TCX and clsact)
    "ahead::",
    // long-lived flows through an upgrade, a downgrade and a switch of attach mode
    "upgrade::",
    // the conntrack-verified fast path where the kfuncs are in reach, and
    // the default path where they are not; the XDP judge on the underlay
    "fast_path::",
    "xdp_judge::",
    // `edgevx monitor`: drop events by tail call, in each kernel's programs
    "monitor::",
];

/// What CI runs on each amd64 kernel of the matrix besides every prog test
/// (exact test names): one test for each row of the kernel table
/// (docs/src/kernels.md) and each part of the edge set, sized so that the
/// amd64 kernels under TCG fit CI's 90 minutes beside the full native suite
/// (`.ci/run` says what each costs). The whole edge set ([`EDGE_TESTS`])
/// took 20 to 52 minutes of tests a kernel under TCG on two cores;
/// `cargo xtask test --kernel NAME` runs it. VXLAN through a
/// second interface is here for the kernels before 5.17, where the compat
/// socket-lookup guard leaves it to a firewall rule; on the others it
/// meets the full guard, as natively.
pub const CI_TESTS: &[&str] = &[
    "kernel::the_dataplane_comes_up_and_forwards_without_kernel_btf",
    "kernel::the_agent_loads_the_encap_this_kernel_takes_and_says_why",
    "interop::default_mode_interoperates_with_kernel_flannel_both_ways",
    "real_node::clusterip_iptables::edgevx_ip_masq",
    "real_node::clusterip_nftables::edgevx_ip_masq",
    "restart::no_ping_is_lost_across_kill_9_and_restart",
    "injection::a_pod_cannot_send_vxlan_to_any_node",
    "injection::vxlan_through_a_second_interface_is_refused_whoever_sends_it",
    "dual_stack::dual_stack_interoperates_with_a_kernel_flannel_node_both_ways",
    "ipv6_only::ipv6_only_interoperates_with_a_kernel_ipv6_only_flannel_node",
    "direct_routing::direct_routing_routes_on_link_peers_plainly_and_encapsulates_the_rest",
    "mtu::before_the_agent_follows_df_frames_get_frag_needed_from_the_encap_program",
    "rollback::rolling_back_to_flanneld_keeps_the_node_forwarding",
    "cli::bad_input_exits_2_naming_the_culprit_and_changes_nothing",
    "privileges::agent_runs_with_only_cap_bpf_cap_net_admin_and_cap_perfmon",
    "conflicts_judge::an_inner_ipv4_source_belongs_to_the_longest_prefixs_owner",
    "ahead::a_clsact_filter_ahead_of_decap_lets_no_forged_inner_source_in_and_is_reported",
    "fast_path::tcp_under_kube_proxys_invalid_drop_takes_the_fast_path_and_nothing_turns_invalid",
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
    /// How many times longer the harness waits ([`patience`]).
    pub patience: u32,
    /// Files of the workspace the command starts or reads again and again
    /// (the agent, the IPAM plugin), staged in the guest with the
    /// [`HOT_TOOLS`]. Empty: nothing is staged (the benches, whose
    /// published guest figures were measured without it).
    pub hot: Vec<PathBuf>,
    /// `Some((i, n))`: this guest runs part `i` of `n` of one kernel's job,
    /// beside the others, with its results in `target/vm/<kernel>.<i>of<n>/`.
    pub part: Option<(usize, usize)>,
}

/// What the tests start most in a guest: tools by name (found on the
/// guest's PATH), and by path the CNI plugins they run and the loader's
/// cache. Counted with `strace -f -e execve` over the CI share natively:
/// iptables and ip alone are about 90% of the process starts.
///
/// Over 9p without a page cache (before the root came over virtio-fs)
/// every start read its binary and its libraries across again:
/// `/bin/true` took 0.64 s on 5.10, and 0.13 s with itself and its
/// libraries in a tmpfs; the agent's binary 2.9 s against 0.25. The guest stages these, their
/// libraries and [`Run::hot`] in a tmpfs once ([`stage_hot_files`]), so
/// every path stays the one the native run uses: on 5.10,
/// `kernel::the_agent_loads_the_encap...` took 123 s after 16 s of
/// staging, against 178 s without. Large binaries started once or twice (etcd,
/// the test binary) stay out: copying one whole costs more than its starts.
const HOT_TOOLS: &[&str] = &[
    "ip",
    "bridge",
    "tc",
    "iptables",
    "ip6tables",
    "iptables-save",
    "iptables-restore",
    "ip6tables-save",
    "ip6tables-restore",
    "nft",
    "ping",
    "sysctl",
    "mount",
    "umount",
    "sh",
    "bash",
    "sleep",
    "/usr/lib/cni/bridge",
    "/usr/lib/cni/host-local",
    "/usr/lib/cni/loopback",
    // read by the loader at every start of a dynamic binary
    "/etc/ld.so.cache",
];

/// The workspace's files the tests start or read again and again: the
/// agent, the IPAM plugin, the test peer, and the eBPF object each agent
/// start reads.
pub fn workspace_binaries() -> Vec<PathBuf> {
    let root = exec::workspace_root();
    let mut files: Vec<PathBuf> =
        ["target/release/edgevx", "target/release/edgevx-ipam", "target/release/edgevx-testpeer"]
            .iter()
            .map(|p| root.join(p))
            .collect();
    files.push(crate::build::ebpf_object());
    files
}

/// Boots the kernel with every CPU of this machine, runs the command in it,
/// brings its output, status and the kernel log back to
/// `target/vm/<kernel>/`, and fails when the command failed.
pub fn run(run: &Run) -> Result<()> {
    prepare(run)?.boot(host_cpus())
}

/// The CPUs this machine gives its guests.
pub fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A guest ready to boot: its kernel fetched, its script written.
pub struct Prepared {
    /// The kernel's name, and the part's (`6.1`, `6.1.1of2`).
    name: String,
    distro: &'static str,
    kernel: kernels::Fetched,
    vng: PathBuf,
    /// The directory of the virtiofsd virtme-ng shares the root with.
    virtiofsd: PathBuf,
    out: PathBuf,
    script: PathBuf,
    job: String,
}

/// Fetches the kernel, virtme-ng and virtiofsd, and writes the guest's script into
/// an emptied `target/vm/<kernel>/`.
pub fn prepare(run: &Run) -> Result<Prepared> {
    let spec = kernels::spec(run.kernel)?;
    let kernel = kernels::fetch(spec)?;
    let vng = ensure_virtme_ng()?;
    let virtiofsd = toolchain::ensure_virtiofsd()?;
    let name = match run.part {
        Some((i, n)) => format!("{}.{i}of{n}", spec.name),
        None => spec.name.to_string(),
    };
    let out = exec::workspace_root().join("target/vm").join(&name);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let script = out.join("guest.sh");
    fs::write(&script, guest_script(run, &out, &hot_files(&run.hot, &run.path_env)))
        .with_context(|| format!("cannot write {}", script.display()))?;
    eprintln!("xtask: kernel {} ({}, {}), results in {}", kernel.release, spec.distro, kernel.package, out.display());
    Ok(Prepared { name, distro: spec.distro, kernel, vng, virtiofsd, out, script, job: run.job.to_string() })
}

impl Prepared {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Boots the guest with `cpus` virtual CPUs, waits for its command, and
    /// fails when the command failed.
    pub fn boot(self, cpus: usize) -> Result<()> {
        let Prepared { name, distro, kernel, vng, virtiofsd, out, script, job } = self;
        let root = exec::workspace_root();
        let started = Instant::now();
        // EDGEVX_VM_ACCEL=tcg boots under TCG from the start: what CI does when
        // KVM does not start in time, reproduced on purpose
        let forced_tcg = std::env::var("EDGEVX_VM_ACCEL").is_ok_and(|a| a == "tcg");
        let mut accel = if Path::new("/dev/kvm").exists() && !forced_tcg { Accel::Kvm } else { Accel::Tcg };
        // a guest that dies under its job (no exit status) is booted once more
        let mut deaths = 0;
        let code = loop {
            eprintln!("xtask: booting {} under {} ({cpus} CPUs)", kernel.release, accel.name());
            // what an earlier attempt's guest wrote must not pass for this one's
            for file in ["started", "status", "rootfs"] {
                let _ = fs::remove_file(out.join(file));
            }
            let console = out.join(format!("console-{}.log", accel.name()));
            let mut cmd = Command::new(&vng);
            // vng runs its helpers (virtme-run) from PATH, and finds virtiofsd there
            cmd.env("PATH", prepend_path(&[vng.parent().unwrap_or(Path::new(".")), &virtiofsd]))
                .arg("--run")
                .arg(&kernel.vmlinuz)
                .args(["--cpus", &cpus.to_string(), "--memory", "4G", "--verbose"])
                .args(["--append", GUEST_KERNEL_ARGS])
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
            // under KVM, its own process group: a hung guest is stopped with
            // QEMU and virtiofsd. Under TCG it stays in ours, so a Ctrl-C or a
            // CI job's end stops the guest with the run.
            if accel == Accel::Kvm {
                cmd.process_group(0);
            }
            let mut child = cmd.spawn().with_context(|| format!("cannot start {}", vng.display()))?;
            let started = out.join("started");
            let attempt = match accel {
                Accel::Kvm => wait_for_start(&mut child, &started, KVM_START_TIMEOUT)?,
                Accel::Tcg => Attempt::Exited(child.wait().context("cannot wait for virtme-ng")?),
            };
            match attempt {
                Attempt::Exited(_) if started.exists() => {}
                _ if accel == Accel::Kvm => {
                    eprintln!("xtask: the {name} guest did not start under KVM ({attempt}); booting it under TCG");
                    accel = Accel::Tcg;
                    continue;
                }
                _ => bail!(
                    "the {} guest never started its script ({attempt}); see {}",
                    kernel.release,
                    console.display()
                ),
            }
            if let Some(code) = fs::read_to_string(out.join("status")).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
                break code;
            }
            // the guest ended before its script did (a panic, a reset, QEMU
            // killed): its console's and the job's last lines say how, and CI
            // keeps only what is printed
            for (what, file) in [("job", out.join(format!("{job}.log"))), ("console", out.join("vng-stderr.log"))] {
                let text = fs::read_to_string(&file).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("xtask: [{name}] the guest wrote no exit status; the last lines of its {what} log:");
                for line in &lines[lines.len().saturating_sub(25)..] {
                    eprintln!("xtask: [{name}]   {line}");
                }
            }
            deaths += 1;
            ensure!(
                deaths < 2,
                "the {name} guest died twice before its job ended (no exit status); see {}",
                out.display()
            );
            // once: seen in CI, a 6.12 guest under TCG beside three others
            // ended with no status and no log kept; a second death fails
            eprintln!("xtask: [{name}] WARNING: the guest died before its job ended; booting it once more");
        };
        let log = out.join(format!("{job}.log"));
        match fs::read_to_string(out.join("rootfs")).map(|f| f.trim().to_string()) {
            Ok(f) if f == "virtiofs" => eprintln!("xtask: [{name}] the root came over virtiofs"),
            f => eprintln!(
                "xtask: [{name}] warning: the root came over {} and not virtiofs: every process start read its \
                 binary again, and the run was slower (virtme-ng falls back to 9p when virtiofsd has not written \
                 its pid file within 3 s; virtiofsd logs to syslog)",
                f.unwrap_or_else(|e| format!("an unknown filesystem ({e})"))
            ),
        }
        let summary = fs::read_to_string(&log).unwrap_or_default();
        let shown = |l: &&str| l.starts_with("test result:") || l.contains("FAILED") || l.starts_with("bench:");
        for line in summary.lines().filter(shown) {
            eprintln!("xtask: [{name}] {line}");
        }
        eprintln!(
            "xtask: kernel {} under {}: {job} exited {code} after {:.0} s ({job}.log, dmesg.log in {})",
            kernel.release,
            accel.name(),
            started.elapsed().as_secs_f64(),
            out.display()
        );
        if code != 0 {
            bail!("{job} failed on kernel {} ({distro})", kernel.release);
        }
        Ok(())
    }
}

/// How long a guest under KVM has to start its script before it is taken
/// for hung and booted again under TCG. A KVM boot takes seconds; a nested
/// KVM that cannot run the guest either dies at once or hangs early in the
/// boot (seen here: at "Probing EDD", QEMU spinning a CPU, with the root
/// over virtio-fs, where virtme-ng also picks QEMU's microvm machine).
const KVM_START_TIMEOUT: Duration = Duration::from_secs(60);

/// How one boot attempt ended.
enum Attempt {
    /// virtme-ng exited: the guest ran its script to the end, or never
    /// started it (`started` tells).
    Exited(std::process::ExitStatus),
    /// Neither started nor exited in time; stopped with its process group.
    Hung(Duration),
}

impl std::fmt::Display for Attempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attempt::Exited(status) => write!(f, "{status}"),
            Attempt::Hung(limit) => write!(f, "no start within {} s, stopped", limit.as_secs()),
        }
    }
}

/// Waits for `child` (virtme-ng, the leader of its own process group) to
/// exit, or to have started its script (`started` exists) and then exit,
/// however long that takes: a started guest runs the whole job. One that
/// has done neither within `limit` is stopped with its group.
fn wait_for_start(child: &mut std::process::Child, started: &Path, limit: Duration) -> Result<Attempt> {
    let since = Instant::now();
    loop {
        if let Some(status) = child.try_wait().context("cannot wait for virtme-ng")? {
            return Ok(Attempt::Exited(status));
        }
        if started.exists() {
            return Ok(Attempt::Exited(child.wait().context("cannot wait for virtme-ng")?));
        }
        if since.elapsed() >= limit {
            stop_group(child);
            return Ok(Attempt::Hung(limit));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Stops `child` and its process group (QEMU, virtiofsd): SIGTERM first,
/// so virtme-ng's exit handlers remove virtiofsd's sockets, then SIGKILL
/// for what is left after 5 s. Where `kill` cannot be run, the child alone
/// is killed, so the wait after it still ends.
fn stop_group(child: &mut std::process::Child) {
    // the group's id is its leader's (`process_group(0)`)
    let group = format!("-{}", child.id());
    let signal = |sig: &str| Command::new("kill").args([sig, "--", &group]).status().is_ok_and(|s| s.success());
    if !signal("-TERM") {
        let _ = child.kill();
    }
    for _ in 0..10 {
        if child.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    if !signal("-KILL") {
        let _ = child.kill();
    }
    let _ = child.wait();
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

fn prepend_path(dirs: &[&Path]) -> std::ffi::OsString {
    let mut paths: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
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
fn guest_script(run: &Run, out: &Path, hot: &[PathBuf]) -> String {
    let o = quote(&out.display().to_string());
    let mut s = String::from("#!/bin/bash\nset -u\n");
    s += &format!("touch {o}/started\n");
    s += &format!("export PATH={}\n", quote(&run.path_env.to_string_lossy()));
    // the harness waits this many times longer for things to happen: under
    // TCG everything is several times slower (tests/src/lib.rs, `patience`)
    // EDGEVX_TEST_GUEST: the machine is a throwaway guest, whose kernel a
    // test may change (load conntrack's module as a node's kube-proxy would)
    s += &format!("export RUST_BACKTRACE=1 EDGEVX_TEST_GUEST=1 EDGEVX_TEST_PATIENCE={}\n", run.patience);
    s += &stage_hot_files(hot);
    for (k, v) in &run.env {
        s += &format!("export {k}={}\n", quote(&v.display().to_string()));
    }
    // what the tests may need to load is in the package's modules (virtme-ng
    // linked them); the guest's hostname and uname are the kernel's
    s += &format!("uname -a > {o}/uname\n");
    // which filesystem the root came over (virtiofs, or 9p when virtme-ng
    // could not start virtiofsd): said by the host after the run
    s += &format!("findmnt -n -o FSTYPE / > {o}/rootfs 2>&1\n");
    let command: Vec<String> = run.command.iter().map(|a| quote(a)).collect();
    s += &format!("{} > {o}/{}.log 2>&1\necho $? > {o}/status\n", command.join(" "), run.job);
    s += &format!("dmesg > {o}/dmesg.log 2>&1\n");
    s
}

/// The directories virtme-ng gives the guest as overlays with a tmpfs on
/// top (`virtme_rw_overlay*` on its kernel command line).
const GUEST_OVERLAYS: &[&str] = &["/etc", "/lib", "/home", "/opt", "/srv", "/usr", "/var", "/tmp"];

/// The files to stage in a guest, resolved here (the guest shares this
/// machine's root): the [`HOT_TOOLS`] found on `path_env`, `hot`, and
/// every library `ldd` names for them, each as its canonical path, once.
fn hot_files(hot: &[PathBuf], path_env: &std::ffi::OsStr) -> Vec<PathBuf> {
    if hot.is_empty() {
        return Vec::new();
    }
    let mut bins: Vec<PathBuf> = HOT_TOOLS.iter().filter_map(|t| on_path(t, path_env)).collect();
    bins.extend(hot.iter().filter(|p| p.is_file()).cloned());
    // `ldd` prints each library as `name => /path (0x..)` or `/path (0x..)`;
    // a static binary or a non-ELF file has none
    let libs = Command::new("ldd").args(&bins).output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    let libs = libs.unwrap_or_default();
    let lib_paths = libs.split_whitespace().filter(|w| w.starts_with('/')).map(PathBuf::from);
    let mut files: Vec<PathBuf> =
        bins.into_iter().chain(lib_paths).filter_map(|p| fs::canonicalize(p).ok()).filter(|p| p.is_file()).collect();
    files.sort();
    files.dedup();
    files
}

/// Where `name` is: itself when it is a path, else the first file of that
/// name on `path_env`, as a shell finds it.
fn on_path(name: &str, path_env: &std::ffi::OsStr) -> Option<PathBuf> {
    if name.starts_with('/') {
        return Some(PathBuf::from(name)).filter(|p| p.is_file());
    }
    std::env::split_paths(path_env).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The script's lines that stage `files` in the guest's tmpfs. A file in
/// one of the [`GUEST_OVERLAYS`] is copied up into the overlay's tmpfs by
/// touching its access time (one `touch` for all: a process start is what
/// costs); any other (the workspace's binaries) is copied into `/run` and
/// bind-mounted over its original. Either way every path stays the one the
/// native run uses, and a file that cannot be staged is left where it is:
/// the run is then slower, never different.
fn stage_hot_files(files: &[PathBuf]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let overlaid = |p: &&PathBuf| GUEST_OVERLAYS.iter().any(|d| p.starts_with(d));
    let (up, bind): (Vec<&PathBuf>, Vec<&PathBuf>) = files.iter().partition(overlaid);
    let q = |p: &PathBuf| quote(&p.display().to_string());
    let mut s = String::new();
    if !up.is_empty() {
        s += &format!("touch -a -c -- {}\n", up.iter().map(|p| q(p)).collect::<Vec<_>>().join(" "));
    }
    if !bind.is_empty() {
        s += "warm=/run/edgevx-warm\nmkdir -p \"$warm\"\n";
        s += &format!(
            "cp --parents -t \"$warm\" -- {} 2>/dev/null\n",
            bind.iter().map(|p| q(p)).collect::<Vec<_>>().join(" ")
        );
        for p in bind {
            s += &format!("[ -f \"$warm\"{0} ] && mount --bind \"$warm\"{0} {0}\n", q(p));
        }
    }
    s += &format!("echo \"staged {} files in ${{SECONDS}} s\"\n", files.len());
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

    /// libtest's `--exact` runs nothing for a name that matches no test,
    /// silently: each name must be a test in the e2e sources.
    #[test]
    fn every_ci_test_names_an_e2e_test_of_the_edge_set() {
        let e2e = exec::workspace_root().join("tests/tests/e2e");
        for name in CI_TESTS {
            let mut parts = name.split("::");
            let module = parts.next().unwrap_or_default();
            // a module is a file, or a directory with its mod.rs
            let source = fs::read_to_string(e2e.join(format!("{module}.rs")))
                .or_else(|_| fs::read_to_string(e2e.join(module).join("mod.rs")))
                .unwrap_or_default();
            for part in parts {
                assert!(source.contains(part), "{name}: no {part} in tests/tests/e2e/{module}.rs");
            }
            assert!(EDGE_TESTS.iter().any(|f| name.contains(f)), "{name} is outside the edge set");
        }
    }

    #[test]
    fn a_guest_that_never_starts_is_stopped_with_its_group_and_a_started_one_is_waited_for() {
        let dir = std::env::temp_dir().join(format!("xtask-vm-start-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let started = dir.join("started");
        // hung: a child of the group that outlives its leader is stopped too
        let pid_file = dir.join("grandchild");
        let mut hung = Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 300 & echo $! > {}.new; mv {0}.new {0}; wait", pid_file.display()))
            .process_group(0)
            .spawn()
            .unwrap();
        let grandchild = (0..300)
            .find_map(|_| {
                fs::read_to_string(&pid_file).ok().or_else(|| {
                    std::thread::sleep(Duration::from_millis(100));
                    None
                })
            })
            .expect("the hung guest's sleep started");
        let attempt = wait_for_start(&mut hung, &started, Duration::from_secs(1)).unwrap();
        assert!(matches!(attempt, Attempt::Hung(_)), "{attempt}");
        // gone, or a zombie left for init to reap
        let stat = Path::new("/proc").join(grandchild.trim()).join("stat");
        let running = || fs::read_to_string(&stat).is_ok_and(|s| !s.contains(") Z "));
        for _ in 0..50 {
            if !running() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(!running(), "the group's sleep {} survived", grandchild.trim());
        // started (before the first look), then longer than the limit:
        // waited for to the end, its exit status kept
        fs::write(&started, "").unwrap();
        let mut slow = Command::new("sh").args(["-c", "sleep 2; exit 7"]).process_group(0).spawn().unwrap();
        match wait_for_start(&mut slow, &started, Duration::from_millis(100)).unwrap() {
            Attempt::Exited(status) => assert_eq!(status.code(), Some(7)),
            hung => panic!("a started guest was stopped: {hung}"),
        }
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn guests_sharing_the_cpus_wait_as_many_times_longer() {
        let host = host_cpus();
        assert_eq!(patience(1, host), GUEST_PATIENCE, "a lone guest with every CPU");
        assert_eq!(patience(3, host), 3 * GUEST_PATIENCE, "three guests, each as many vCPUs as the host has");
        assert_eq!(patience(1, 1), GUEST_PATIENCE, "never less patient than a lone guest");
    }

    #[test]
    fn script_quotes_and_collects() {
        let run = Run {
            kernel: "5.10",
            command: vec!["/w/target/release/deps/e2e-1".into(), "interop::".into(), "it's".into()],
            env: vec![("EDGEVX_BIN".into(), PathBuf::from("/w/target/release/edgevx"))],
            path_env: "/usr/bin:/bin".into(),
            job: "tests",
            patience: 18,
            hot: vec![PathBuf::from("/w/target/release/edgevx")],
            part: None,
        };
        let hot = [PathBuf::from("/usr/sbin/ip"), PathBuf::from("/w/target/release/edgevx")];
        let s = guest_script(&run, Path::new("/w/target/vm/5.10"), &hot);
        assert!(s.contains("export EDGEVX_BIN='/w/target/release/edgevx'"), "{s}");
        assert!(s.contains("EDGEVX_TEST_PATIENCE=18\n"), "{s}");
        assert!(
            s.contains("'/w/target/release/deps/e2e-1' 'interop::' 'it'\\''s' > '/w/target/vm/5.10'/tests.log"),
            "{s}"
        );
        assert!(s.contains("echo $? > '/w/target/vm/5.10'/status"), "{s}");
        // the root's filesystem, for the host to say after the run
        assert!(s.contains("findmnt -n -o FSTYPE / > '/w/target/vm/5.10'/rootfs"), "{s}");
        // staged before the command runs: a file in an overlay copied up,
        // a workspace file bind-mounted over itself from /run
        let command = s.find("tests.log").unwrap_or(0);
        let up = s.find("touch -a -c -- '/usr/sbin/ip'\n").expect("ip is copied up");
        let bind = s
            .find("mount --bind \"$warm\"'/w/target/release/edgevx' '/w/target/release/edgevx'")
            .expect("the agent is bind-mounted");
        assert!(up < command && bind < command, "{s}");
    }

    #[test]
    fn the_staged_files_are_the_tools_their_libraries_and_the_hot_files_once_each() {
        let me = std::env::current_exe().expect("the test binary");
        let path = std::env::var_os("PATH").unwrap_or_default();
        let files = hot_files(&[me.clone(), me.clone()], &path);
        let ip = on_path("ip", &path).and_then(|p| fs::canonicalize(p).ok()).expect("iproute2's ip is on PATH");
        assert!(files.contains(&ip), "{files:?}");
        assert!(files.iter().any(|f| f.to_string_lossy().contains("libc.so")), "{files:?}");
        assert!(files.contains(&fs::canonicalize(&me).expect("canonical")), "{files:?}");
        let mut once = files.clone();
        once.dedup();
        assert_eq!(once, files, "sorted, each once");
        assert!(hot_files(&[], &path).is_empty(), "nothing staged without hot files (the benches)");
    }
}
