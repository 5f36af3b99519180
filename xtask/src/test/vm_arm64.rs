//! `cargo xtask test --kernel 6.1-arm64`: the packet programs' tests on
//! Debian 12's arm64 kernel, in `qemu-system-aarch64` (TCG: this machine
//! is x86_64).
//!
//! virtme-ng shares the host's root, which is x86_64, so it cannot boot an
//! arm64 guest. This runner boots the kernel with an initramfs that holds
//! only what the programs' tests need: Debian's static arm64 busybox as
//! init, the e2e test binary built for `aarch64-unknown-linux-musl` (static),
//! and the eBPF object. The tests load every program through the arm64
//! kernel's verifier and JIT, and check the bytes they produce
//! (BPF_PROG_TEST_RUN), exactly as on x86_64. What needs more of a node (veth,
//! vxlan, iptables) is not run on arm64: docs/src/kernels.md says so.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{
    build,
    deps::{kernels, packages, sysroot},
    exec,
    ship::image::Arch,
};

/// The tests the arm64 guest runs by default: every prog test.
pub const TESTS: &[&str] = &["prog_test_run::", "prog_test_run_v6::"];

/// How long the guest may take, boot included, before it is stopped.
const LIMIT: Duration = Duration::from_secs(40 * 60);

const STATUS: &str = "EDGEVX-STATUS";

/// An arm64 guest ready to boot: its kernel fetched, its initramfs written.
pub struct Prepared {
    name: &'static str,
    vmlinuz: PathBuf,
    description: String,
    initrd: PathBuf,
    out: PathBuf,
}

/// Fetches `kernel` (an arm64 entry of the matrix), builds the test binary
/// and the initramfs that runs the tests matching `filters` (libtest
/// filters); results go to `target/vm/<kernel>/`.
pub fn prepare(kernel: &str, filters: &[&str]) -> Result<Prepared> {
    let spec = kernels::spec(kernel)?;
    packages::ensure_cross()?;
    packages::ensure_vm()?;
    let fetched = kernels::fetch(spec)?;
    let root = exec::workspace_root();
    let out = root.join("target/vm").join(spec.name);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;

    // static (musl): the initramfs has no loader; built with the image's cross C compiler
    let env: Vec<(&str, std::ffi::OsString)> =
        Arch::Arm64.musl_env()?.into_iter().map(|(k, v)| (k, v.into())).collect();
    let tests = build::e2e_binary(Some("aarch64-unknown-linux-musl"), &env)?;
    let busybox = sysroot::ensure(Arch::Arm64.oci())?.join("bin/busybox");
    let object = build::ebpf_object();
    let initrd = initramfs(&out, &busybox, &tests, &object, filters)?;
    let description = format!("{} ({})", fetched.release, fetched.package);
    Ok(Prepared { name: spec.name, vmlinuz: fetched.vmlinuz, description, initrd, out })
}

impl Prepared {
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Boots the guest with `cpus` virtual CPUs and waits for its tests.
    pub fn boot(self, cpus: usize) -> Result<()> {
        let Prepared { vmlinuz, description, initrd, out, .. } = self;
        eprintln!("xtask: booting {description} under qemu-system-aarch64 (TCG, {cpus} CPUs)");
        let console = out.join("console.log");
        let started = Instant::now();
        let mut child = Command::new("qemu-system-aarch64")
            .args(["-M", "virt", "-cpu", "max", "-smp", &cpus.to_string(), "-m", "2G", "-nographic", "-no-reboot"])
            .arg("-kernel")
            .arg(&vmlinuz)
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", "console=ttyAMA0 rdinit=/init panic=-1 quiet"])
            .stdin(Stdio::null())
            .stdout(fs::File::create(&console)?)
            .stderr(fs::File::create(out.join("qemu-stderr.log"))?)
            .spawn()
            .context("cannot start qemu-system-aarch64")?;
        let exit = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if started.elapsed() > LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the arm64 guest did not finish in {} minutes: {}", LIMIT.as_secs() / 60, console.display());
            }
            std::thread::sleep(Duration::from_secs(2));
        };
        let text = String::from_utf8_lossy(&fs::read(&console)?).into_owned();
        fs::write(out.join("tests.log"), &text)?;
        eprintln!("xtask: the arm64 guest ran for {:.0} s ({exit})", started.elapsed().as_secs_f64());
        match status_of(&text) {
            Some(0) => Ok(()),
            Some(code) => {
                bail!("the tests failed in the arm64 guest (status {code}): {}", out.join("tests.log").display())
            }
            None => bail!("the arm64 guest ended without a test status: {}", console.display()),
        }
    }
}

/// The initramfs (an uncompressed newc cpio, written by the host's busybox):
/// `/init`, busybox, the test binary and the object.
fn initramfs(out: &Path, busybox: &Path, tests: &Path, object: &Path, filters: &[&str]) -> Result<PathBuf> {
    let dir = out.join("initramfs");
    for d in ["bin", "proc", "sys", "dev", "tmp"] {
        fs::create_dir_all(dir.join(d))?;
    }
    for (from, to) in [(busybox, "bin/busybox"), (tests, "e2e"), (object, "edgevx.o")] {
        fs::copy(from, dir.join(to)).with_context(|| format!("missing: {}", from.display()))?;
    }
    let filters: Vec<String> = filters.iter().map(|f| format!("'{}'", f.replace('\'', r"'\''"))).collect();
    let init = format!(
        "#!/bin/busybox sh\n\
         /bin/busybox --install -s /bin\n\
         mount -t proc proc /proc\nmount -t sysfs sys /sys\nmount -t devtmpfs dev /dev\n\
         echo \"edgevx guest: $(uname -r) $(uname -m), $(nproc) CPUs\"\n\
         EDGEVX_EBPF_OBJECT=/edgevx.o TMPDIR=/tmp /e2e --test-threads=1 {}\n\
         echo \"{STATUS} $?\"\n\
         poweroff -f\n",
        filters.join(" ")
    );
    let init_path = dir.join("init");
    fs::write(&init_path, init)?;
    exec::run(Command::new("chmod").args(["0755"]).arg(&init_path).arg(dir.join("e2e")))?;
    let cpio = out.join("initramfs.cpio");
    let list = exec::output(Command::new("find").arg(".").current_dir(&dir))?;
    let mut child = Command::new("busybox")
        .args(["cpio", "-o", "-H", "newc"])
        .current_dir(&dir)
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&cpio)?)
        .stderr(Stdio::null())
        .spawn()
        .context("cannot run busybox cpio")?;
    std::io::Write::write_all(&mut child.stdin.take().context("no stdin")?, list.as_bytes())?;
    if !child.wait()?.success() {
        bail!("busybox cpio could not write {}", cpio.display());
    }
    let _ = fs::remove_dir_all(&dir);
    Ok(cpio)
}

/// The status the guest's init printed after the tests.
fn status_of(console: &str) -> Option<i32> {
    console.lines().rev().find_map(|l| l.trim().strip_prefix(STATUS)).and_then(|s| s.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_the_last_one_init_printed() {
        assert_eq!(status_of("boot\nEDGEVX-STATUS 0\r\nreboot: Power down\n"), Some(0));
        assert_eq!(status_of("test x ... FAILED\nEDGEVX-STATUS 101\n"), Some(101));
        assert_eq!(status_of("Kernel panic\n"), None);
    }
}
