//! `cargo xtask <job>`: everything a fresh machine needs, in one place.
//!
//! Where to look, by job (each job's entry point is its module's `run`,
//! `build` or `ensure`, called from `main` below):
//!
//! - `deps/`: what the jobs take from outside the workspace, fetched or
//!   installed on first use and cached: the Debian packages the machine
//!   needs (`packages`), the toolchain pieces (`toolchain`: rust-src,
//!   bpf-linker, cargo-fuzz, virtiofsd), and what is unpacked from Debian's
//!   archive without installing it (`apt` with its own configuration; from
//!   it the matrix's kernels `kernels`, the arm64 root `sysroot`, and single
//!   programs such as kubectl and promtool `unpacked`).
//! - `build/`: the eBPF object and the agent (`build`), the previous
//!   release's agent for the upgrade tests (`previous`), the fuzz targets
//!   (`fuzz`).
//! - `test/`: `cargo xtask test` (`test`): the unit and namespace tests on
//!   this kernel, the kernel matrix in QEMU guests (`vm`, `vm_arm64`), and a
//!   booted Debian 11 with its own systemd (`host`, `host/`).
//! - `ship/`: the container image (`image`) with its seccomp profile
//!   (`seccomp`), and the release an operator installs (`release`).
//! - `bench/`: `cargo xtask bench` and its variants (`scale`, `ipam`,
//!   `xdp`, `profile`).
//! - `demo.rs`, `docs.rs`: the laptop demo and the book; `exec.rs`: running
//!   a command and saying what failed.
mod bench;
mod build;
mod demo;
mod deps;
mod docs;
mod exec;
mod ship;
mod test;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::{
    build::{fuzz, previous},
    deps::{packages, toolchain, unpacked},
    ship::{image, release, seccomp},
    test::host,
};

#[derive(Parser)]
#[command(about = "edgevx build, test, demo and bench jobs")]
struct Cli {
    #[command(subcommand)]
    job: Job,
}

#[derive(Subcommand)]
enum Job {
    /// Install every Debian package and tool the jobs need (what `.ci/run` calls first).
    Setup,
    /// Print the Debian packages the project installs for itself, one line.
    Packages,
    /// Install rust-src and bpf-linker if missing (cached), then build the eBPF object.
    BuildEbpf,
    /// Build target/release/edgevx with the eBPF object embedded, and target/release/edgevx-ipam.
    Build,
    /// Build the previous release's agent (the upgrade tests' starting point) once, into
    /// target/previous/<commit>/; `cargo xtask test` does this when the upgrade tests are selected.
    BuildPrevious,
    /// Run every test: unit tests, BPF_PROG_TEST_RUN, and namespace tests (root).
    Test {
        /// Only run tests whose name contains this; several, separated by spaces, run each test whose
        /// name contains one of them, as libtest takes them.
        filter: Option<String>,
        /// Run the e2e tests inside a VM booting this Debian kernel (5.10, 6.1, 6.12, 6.1-arm64) instead;
        /// without a filter, the edge set (interop, real node, restart, injection, IPv6, MTU, ...).
        /// A comma-separated list boots them side by side, the CPUs shared out among them.
        #[arg(long, value_name = "NAME")]
        kernel: Option<String>,
        /// With --kernel and no filter: CI's share of the edge set (every prog test and one test per part).
        #[arg(long, requires = "kernel")]
        ci: bool,
        /// Instead: boot this host (debian11) in QEMU, install the release tarball as README.md says,
        /// and test the systemd unit there (readiness, reboots, an offline reboot, a bad flag).
        #[arg(long, value_name = "NAME", conflicts_with_all = ["kernel", "ci"])]
        host: Option<String>,
    },
    /// Build the OCI image archive target/image/edgevx-<version>-<arch>.oci.tar (FROM scratch, buildah);
    /// with --arch all, both and one multi-arch index, target/image/edgevx-<version>.oci.tar.
    Image {
        /// The image's CPU architecture, or `all` (default: this machine's).
        #[arg(long, value_enum)]
        arch: Option<image::Platforms>,
    },
    /// Write target/dist/edgevx-<version>/: static binaries (amd64, arm64) with the systemd unit in
    /// tarballs, the multi-arch image archive, each overlay rendered with the image pinned by that
    /// archive's digest, and SHA256SUMS; then verify it.
    Release,
    /// Build the book (docs/) into target/book: the flag reference written from the binary,
    /// then every link and path checked.
    Docs {
        /// Do not rewrite the flag reference (CI: the unit tests check it).
        #[arg(long)]
        check: bool,
    },
    /// Run every cargo-fuzz target (fuzz/) for N seconds each, from its seed corpus in fuzz/seeds.
    Fuzz {
        /// Seconds of fuzzing per target (the build comes on top).
        #[arg(long, default_value_t = 60)]
        seconds: u32,
    },
    /// Write deploy/seccomp/edgevx.json: the runtime's default seccomp profile plus edgevx's bpf() commands.
    Seccomp,
    /// Two namespaced nodes, edgevx and kernel flannel, with pod traffic between them.
    Demo,
    /// Throughput, packet rate and latency: edgevx vs kernel VXLAN vs plain routing.
    Bench {
        /// Seconds per iperf3 measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u32,
        /// Rounds over all setups; each figure is the median.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Instead: N peers from a nodes file (programming time, RSS, kernel state vs flannel's).
        #[arg(long, value_name = "N", conflicts_with = "ipam")]
        scale: Option<u32>,
        /// With --scale: a dual-stack network, every peer with an IPv6 half too.
        #[arg(long, requires = "scale")]
        dual_stack: bool,
        /// Instead: 1,000 ADD/DEL cycles of edgevx-ipam against the real host-local.
        #[arg(long)]
        ipam: bool,
        /// Instead: perf profiles of one TCP stream and of a 64-byte UDP flood per setup (host stack, fast path, kernel VXLAN, plain),
        /// summed by kernel area, to say where the gap to plain routing goes.
        #[arg(long, conflicts_with_all = ["ipam", "scale", "kernel", "xdp"])]
        profile: bool,
        /// Instead: the XDP judge vs TC alone under a spoofed-VXLAN flood (drop rate, pod goodput).
        #[arg(long, conflicts_with_all = ["ipam", "scale", "kernel"])]
        xdp: bool,
        /// Run the bench inside a VM booting this Debian kernel (5.10, 6.1, 6.12); only its ratios count.
        /// With --scale: the agent's own figures only (no flanneld reference, no big file).
        #[arg(long, value_name = "NAME", conflicts_with = "ipam")]
        kernel: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.job {
        Job::Setup => packages::ensure()
            .and_then(|_| packages::ensure_image())
            .and_then(|_| packages::ensure_fuzz())
            .and_then(|_| packages::ensure_vm())
            .and_then(|_| packages::ensure_cross())
            .and_then(|_| packages::ensure_host())
            .and_then(|_| packages::ensure_profile())
            .and_then(|_| toolchain::ensure())
            .and_then(|_| toolchain::ensure_cargo_fuzz())
            .and_then(|_| unpacked::ensure(&unpacked::PROMTOOL))
            .and_then(|_| unpacked::ensure(&unpacked::KUBECTL))
            .map(|_| ()),
        Job::Packages => {
            println!("{}", packages::all().join(" "));
            Ok(())
        }
        Job::BuildEbpf => packages::ensure_build().and_then(|_| toolchain::ensure()).and_then(|t| build::ebpf(&t)),
        Job::Build => packages::ensure_build()
            .and_then(|_| toolchain::ensure())
            .and_then(|t| build::agent(&t))
            .and_then(|_| build::ipam().map(|_| ())),
        // ours is built again after it: the previous tree's build leaves its agent in target/release
        Job::BuildPrevious => packages::ensure_build().and_then(|_| toolchain::ensure()).and_then(|t| {
            let prev = previous::ensure(&t)?;
            build::agent(&t)?;
            previous::check_ours_is_back(&prev, &exec::workspace_root().join("target/release/edgevx"))
        }),
        Job::Test { filter, host: Some(host), .. } => host::run(&host, filter.as_deref()),
        Job::Test { filter, kernel, ci, host: None } => test::run(filter.as_deref(), kernel.as_deref(), ci),
        Job::Image { arch: Some(platforms) } => image::build_for(platforms).map(|_| ()),
        Job::Image { arch: None } => image::Arch::host().and_then(image::build).map(|_| ()),
        Job::Release => release::build().map(|_| ()),
        Job::Docs { check } => packages::ensure_build().and_then(|_| docs::build(check)).map(|_| ()),
        Job::Fuzz { seconds } => fuzz::run(seconds),
        Job::Seccomp => seccomp::write(),
        Job::Demo => demo::run(),
        Job::Bench { scale: Some(n), dual_stack, kernel, .. } => bench::scale::run(n, dual_stack, kernel.as_deref()),
        Job::Bench { ipam: true, .. } => bench::ipam::run(),
        Job::Bench { xdp: true, seconds, .. } => bench::xdp::run(seconds),
        Job::Bench { profile: true, seconds, .. } => bench::profile::run(seconds),
        Job::Bench { seconds, rounds, kernel, .. } => bench::run(seconds, rounds, kernel.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
