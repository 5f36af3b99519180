//! Debian packages the build, tests, demo and bench need: installed when missing.
//!
//! Each need is probed by what the build or a test really uses (a command on
//! PATH, or a file), never by asking dpkg, so a package that is installed but
//! broken, or a file that only a hand-installed package provides, is noticed.
use std::{path::Path, process::Command};

use anyhow::{Context, Result, bail};

use crate::exec;

/// What proves a need is met.
#[derive(Clone, Copy)]
enum Probe {
    /// A command on PATH.
    Command(&'static str),
    /// A file at this absolute path.
    File(&'static str),
}

impl Probe {
    fn met(self) -> bool {
        match self {
            Probe::Command(cmd) => {
                Command::new("sh").args(["-c", &format!("command -v {cmd}")]).output().is_ok_and(|o| o.status.success())
            }
            Probe::File(path) => Path::new(path).is_file(),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Probe::Command(c) | Probe::File(c) => c,
        }
    }
}

/// What building needs. etcd-client compiles etcd's protobufs with protoc,
/// and those import protobuf's well-known types, which Debian ships in
/// libprotobuf-dev, not in protobuf-compiler.
const BUILD: &[(Probe, &str)] = &[
    (Probe::Command("protoc"), "protobuf-compiler"),
    (Probe::File("/usr/include/google/protobuf/descriptor.proto"), "libprotobuf-dev"),
    (Probe::File("/usr/include/google/protobuf/struct.proto"), "libprotobuf-dev"),
];

/// What the tests, demo and bench run, beyond the build.
const RUN: &[(Probe, &str)] = &[
    (Probe::Command("ip"), "iproute2"),
    (Probe::Command("bridge"), "iproute2"),
    (Probe::Command("ping"), "iputils-ping"),
    (Probe::Command("iperf3"), "iperf3"),
    // bench: TCP request/response latency (ping-pong)
    (Probe::Command("sockperf"), "sockperf"),
    // bench --xdp: GRO on the underlay veth, for NAPI
    (Probe::Command("ethtool"), "ethtool"),
    (Probe::Command("etcd"), "etcd-server"),
    (Probe::Command("etcdctl"), "etcd-client"),
    (Probe::Command("nft"), "nftables"),
    (Probe::Command("iptables"), "iptables"),
    // kube-proxy's `conntrack -F`/`-D`, and the fast path's flush test
    (Probe::Command("conntrack"), "conntrack"),
    // the uninstall test asks the kernel what is still attached (`bpftool net show`)
    (Probe::Command("bpftool"), "bpftool"),
    // the real CNI plugins that the real-node tests wire pods with
    (Probe::File("/usr/lib/cni/bridge"), "containernetworking-plugins"),
    (Probe::File("/usr/lib/cni/host-local"), "containernetworking-plugins"),
    (Probe::File("/usr/lib/cni/loopback"), "containernetworking-plugins"),
];

/// What `cargo xtask image` and the image test need, beyond the build.
const IMAGE: &[(Probe, &str)] = &[
    // builds the image FROM scratch (vfs storage, chroot isolation)
    (Probe::Command("buildah"), "buildah"),
    // ring's C code for the static (musl) edgevx
    (Probe::Command("musl-gcc"), "musl-tools"),
    // the iptables and nft the image carries are the host's, with their
    // libraries (iptables pulls in netbase, whose /etc/protocols goes along)
    (Probe::File("/usr/sbin/xtables-nft-multi"), "iptables"),
    (Probe::File("/usr/sbin/nft"), "nftables"),
    // runs the image in the test, as the kubelet would
    (Probe::Command("podman"), "podman"),
    (Probe::Command("runc"), "runc"),
    (Probe::Command("conmon"), "conmon"),
    // the runtime's default seccomp profile, which deploy/seccomp/edgevx.json extends
    (Probe::File("/usr/share/containers/seccomp.json"), "golang-github-containers-common"),
];

/// What an image of another architecture (arm64 on x86_64) needs beyond
/// the image's own needs: the cross C compiler and linker for the static
/// build, and qemu-user to run that architecture's programs here (the
/// arm64 tests, and the image's check before it is written).
const CROSS: &[(Probe, &str)] = &[
    (Probe::Command("aarch64-linux-gnu-gcc"), "gcc-aarch64-linux-gnu"),
    // the C library headers ring's C code includes for arm64; only a
    // recommendation of the compiler's package, which is installed without
    // them (found on a machine that never had them installed by hand)
    (Probe::File("/usr/aarch64-linux-gnu/include/bits/libc-header-start.h"), "libc6-dev-arm64-cross"),
    (Probe::Command("qemu-aarch64-static"), "qemu-user-static"),
    // boots Debian's arm64 kernel for the programs' tests (vm_arm64.rs)
    (Probe::Command("qemu-system-aarch64"), "qemu-system-arm"),
];

/// What `cargo xtask fuzz` needs beyond the build: libfuzzer-sys compiles
/// libFuzzer's C++ sources.
const FUZZ: &[(Probe, &str)] = &[(Probe::Command("c++"), "g++")];

/// What the kernel matrix (`cargo xtask test --kernel`) needs: QEMU, and
/// for virtme-ng's initramfs a static busybox, and depmod for the kernel's modules
/// (dpkg-deb, which unpacks them, is part of every Debian system); the C
/// libraries virtiofsd links, to build it (`toolchain::ensure_virtiofsd`).
const VM: &[(Probe, &str)] = &[
    (Probe::Command("qemu-system-x86_64"), "qemu-system-x86"),
    (Probe::Command("busybox"), "busybox-static"),
    (Probe::Command("depmod"), "kmod"),
    (Probe::File("/usr/include/seccomp.h"), "libseccomp-dev"),
    (Probe::File("/usr/include/cap-ng.h"), "libcap-ng-dev"),
];

/// What `cargo xtask test --host` needs: debootstrap builds the host's root
/// from Debian's packages, qemu-img the run's copy-on-write disk over it,
/// QEMU boots it; the release tarball's static build needs musl-gcc, and
/// the peer's pod pings. (mkfs.ext4 is e2fsprogs', part of every Debian
/// system, which apt refuses to purge: test/host.rs checks for it.)
const HOST: &[(Probe, &str)] = &[
    (Probe::Command("debootstrap"), "debootstrap"),
    (Probe::Command("qemu-img"), "qemu-utils"),
    (Probe::Command("qemu-system-x86_64"), "qemu-system-x86"),
    (Probe::Command("musl-gcc"), "musl-tools"),
    (Probe::Command("ping"), "iputils-ping"),
];

/// What `cargo xtask bench --profile` needs beyond the bench's: perf.
const PROFILE: &[(Probe, &str)] = &[(Probe::Command("perf"), "linux-perf")];

/// Everything the tests, demo and bench need.
pub fn ensure() -> Result<()> {
    install(&[BUILD, RUN].concat())
}

/// What `cargo xtask image` needs (the build's needs too).
pub fn ensure_image() -> Result<()> {
    install(&[BUILD, IMAGE].concat())
}

/// What an image of another architecture needs.
pub fn ensure_cross() -> Result<()> {
    install(CROSS)
}

/// What `cargo xtask fuzz` needs (the build's needs too).
pub fn ensure_fuzz() -> Result<()> {
    install(&[BUILD, FUZZ].concat())
}

/// What `cargo xtask bench --profile` needs (the bench's needs too).
pub fn ensure_profile() -> Result<()> {
    install(&[BUILD, RUN, PROFILE].concat())
}

/// What `cargo xtask test --kernel` needs.
pub fn ensure_vm() -> Result<()> {
    install(VM)
}

/// What `cargo xtask test --host` needs.
pub fn ensure_host() -> Result<()> {
    install(HOST)
}

/// What `cargo xtask build` needs.
pub fn ensure_build() -> Result<()> {
    install(BUILD)
}

/// The Debian packages behind every need, for `.ci/run` and fresh-machine checks.
pub fn all() -> Vec<&'static str> {
    let mut pkgs: Vec<&str> = BUILD
        .iter()
        .chain(RUN)
        .chain(PROFILE)
        .chain(IMAGE)
        .chain(CROSS)
        .chain(FUZZ)
        .chain(VM)
        .chain(HOST)
        .map(|(_, p)| *p)
        .collect();
    pkgs.sort_unstable();
    pkgs.dedup();
    pkgs
}

fn install(needed: &[(Probe, &str)]) -> Result<()> {
    let mut missing: Vec<&str> = needed.iter().filter(|(probe, _)| !probe.met()).map(|(_, p)| *p).collect();
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
    // the install must have met every need, or the build fails later with a worse message
    let still: Vec<String> = needed
        .iter()
        .filter(|(probe, _)| !probe.met())
        .map(|(probe, pkg)| format!("{} (from {pkg})", probe.name()))
        .collect();
    if !still.is_empty() {
        bail!("installed the packages, but still missing: {}", still.join(", "));
    }
    Ok(())
}
