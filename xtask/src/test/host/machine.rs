//! The guest: QEMU booting the cached root's own kernel and initramfs with
//! systemd as PID 1, on a copy-on-write layer of its own over the cached
//! disk (so the guest's writes persist across its reboots within a run, and
//! every run starts from the image as built), a second small disk with the
//! run's files ([`WORK_LABEL`]), its NIC on the peer's tap, its serial
//! console in `console.log`, and the guest agent's port (host/qga.rs).
//!
//! QEMU runs without `-no-reboot`: `systemctl reboot` in the guest resets
//! the machine, which boots the same kernel from the same disk again.
//!
//! KVM is tried first where `/dev/kvm` can be opened; a guest that prints no
//! kernel line within [`KVM_FIRST_LINE`] or whose agent does not answer
//! within [`KVM_START`] (nested KVM dies at once on some hosts, and hangs
//! before the kernel's first line on others, this kind of machine included)
//! is stopped and booted again under TCG on a fresh layer. A TCG boot that
//! prints no kernel line within [`TCG_FIRST_LINE`] or does not reach the
//! agent within [`BOOT`] is tried once more on a fresh layer (CI saw one
//! such boot that never answered, where the next run came up in 51 s); the
//! error then carries the console's last lines, since CI's tree is gone
//! by the time anyone reads it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    peer::{GUEST_NIC_MAC, Peer, TAP},
    qga::{GuestAgent, Output},
    root::{Image, ROOT_LABEL, WORK_LABEL},
};
use crate::exec;

const KVM_START: Duration = Duration::from_secs(60);
/// Under KVM the kernel's first line is on the console within a second or
/// two; a nested KVM that hangs (this kind of machine) never prints it.
const KVM_FIRST_LINE: Duration = Duration::from_secs(15);
/// How long a boot (the first, or one after a reboot) may take to reach the
/// guest agent under TCG: about 30 s alone on two cores, several times that
/// beside other guests.
const BOOT: Duration = Duration::from_secs(600);
/// Under TCG the kernel's first line is on the console within seconds, even
/// beside other guests.
const TCG_FIRST_LINE: Duration = Duration::from_secs(90);
/// How many lines of the console a failed boot's error carries.
const CONSOLE_TAIL: usize = 40;
/// How long a command may run in the guest unless told otherwise.
pub const COMMAND: Duration = Duration::from_secs(300);
/// What the kernel prints first at every boot, counted in the console log.
const KERNEL_FIRST_LINE: &str = "Linux version ";

/// A running guest.
pub struct Machine {
    child: Child,
    agent: GuestAgent,
    pub console: PathBuf,
    pub accel: &'static str,
}

impl Machine {
    /// Boots the guest from `image` with `work` (an ext4 image) as its
    /// second disk, its NIC on `peer`'s tap; files of the run go to `dir`.
    /// Returns once the guest agent answers.
    pub fn boot(image: &Image, work: &Path, peer: &Peer, dir: &Path) -> Result<Self> {
        let kvm = fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
        let attempts = if kvm { &["kvm", "tcg", "tcg"][..] } else { &["tcg", "tcg"][..] };
        for (n, &accel) in attempts.iter().enumerate() {
            let last = n + 1 == attempts.len();
            let layer = dir.join("disk.qcow2");
            let _ = fs::remove_file(&layer);
            exec::run(
                Command::new("qemu-img")
                    .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                    .arg(&image.disk)
                    .arg(&layer),
            )?;
            let console = dir.join(format!("console-{accel}-{n}.log"));
            let socket = dir.join("qga.sock");
            let _ = fs::remove_file(&socket);
            eprintln!("xtask: booting Debian 11 ({}) under {accel}; console: {}", image.release, console.display());
            let mut qemu = peer.exec_in("qemu-system-x86_64");
            qemu.args(["-accel", accel, "-m", "2048", "-smp", "2"]);
            if accel == "kvm" {
                qemu.args(["-cpu", "host"]);
            }
            qemu.args(["-display", "none", "-monitor", "none", "-serial"])
                .arg(format!("file:{}", console.display()))
                .arg("-kernel")
                .arg(&image.vmlinuz)
                .arg("-initrd")
                .arg(&image.initrd)
                // tsc=reliable: under TCG the TSC check fails on emulation
                // jitter alone, and the HPET makes every clock read slow (vm.rs)
                .args(["-append", &format!("root=LABEL={ROOT_LABEL} rw console=ttyS0 tsc=reliable")])
                .arg("-drive")
                .arg(format!("file={},format=qcow2,if=virtio", layer.display()))
                .arg("-drive")
                .arg(format!("file={},format=raw,if=virtio", work.display()))
                .args(["-netdev", &format!("tap,id=n0,ifname={TAP},script=no,downscript=no")])
                .args(["-device", &format!("virtio-net-pci,netdev=n0,mac={GUEST_NIC_MAC}")])
                .args(["-device", "virtio-serial", "-chardev"])
                .arg(format!("socket,id=qga,path={},server=on,wait=off", socket.display()))
                .args(["-device", "virtserialport,chardev=qga,name=org.qemu.guest_agent.0"])
                .stdin(Stdio::null())
                .stdout(fs::File::create(dir.join(format!("qemu-{accel}-{n}.log")))?)
                .stderr(fs::File::create(dir.join(format!("qemu-{accel}-{n}.err")))?);
            let mut child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
            let limits = match accel {
                "kvm" => Limits { agent: KVM_START, first_line: Some(KVM_FIRST_LINE) },
                _ => Limits { agent: BOOT, first_line: Some(TCG_FIRST_LINE) },
            };
            match first_contact(&mut child, &socket, &console, limits) {
                Ok(agent) => return Ok(Machine { child, agent, console, accel }),
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if last {
                        return Err(e.context(format!(
                            "the guest never came up; the end of {}:\n{}",
                            console.display(),
                            console_tail(&console)
                        )));
                    }
                    eprintln!(
                        "xtask: the guest did not come up under {accel} ({e:#}); booting it again under TCG; \
                         the end of its console:\n{}",
                        console_tail(&console)
                    );
                }
            }
        }
        bail!("no accelerator left to boot the guest with")
    }

    /// Runs `script` (`/bin/sh -c`) in the guest, at most `timeout`.
    pub fn exec(&mut self, script: &str, timeout: Duration) -> Result<Output> {
        self.alive()?;
        self.agent.exec(script, None, timeout)
    }

    /// Runs `script` and returns its stdout; fails, with what it printed,
    /// when it exits non-zero.
    pub fn sh(&mut self, script: &str) -> Result<String> {
        let out = self.exec(script, COMMAND)?;
        if out.code != 0 {
            bail!("`{script}` exited {} in the guest:\n{}", out.code, out.both());
        }
        Ok(out.stdout)
    }

    /// Writes `content` to `path` in the guest (its directory made first).
    pub fn write(&mut self, path: &str, content: &str) -> Result<()> {
        self.alive()?;
        let script = format!("mkdir -p \"$(dirname '{path}')\" && cat > '{path}'");
        let out = self.agent.exec(&script, Some(content.as_bytes()), COMMAND)?;
        if out.code != 0 {
            bail!("cannot write {path} in the guest:\n{}", out.both());
        }
        Ok(())
    }

    /// The guest's boot id: another after every boot.
    pub fn boot_id(&mut self) -> Result<String> {
        Ok(self.sh("cat /proc/sys/kernel/random/boot_id")?.trim().to_string())
    }

    /// How many times a kernel has started in this QEMU, by its console.
    pub fn kernel_starts(&self) -> usize {
        fs::read(&self.console).map_or(0, |b| String::from_utf8_lossy(&b).matches(KERNEL_FIRST_LINE).count())
    }

    /// Waits until systemd has finished starting the system (`running`, or
    /// `degraded` when a unit failed: the tests then say which).
    pub fn wait_for_startup(&mut self) -> Result<String> {
        let out = self.exec("systemctl is-system-running --wait", BOOT)?;
        Ok(out.stdout.trim().to_string())
    }

    /// `systemctl reboot` in the guest, then waits for the next boot: a new
    /// kernel start on the console, a new boot id, and systemd's startup
    /// finished. Returns the state systemd reached.
    pub fn reboot(&mut self) -> Result<String> {
        let (before, starts) = (self.boot_id()?, self.kernel_starts());
        self.agent.spawn("systemctl reboot", None)?;
        let since = Instant::now();
        loop {
            self.alive()?;
            if self.kernel_starts() > starts && self.agent.try_sync()? {
                let now = self.boot_id()?;
                if now != before {
                    break;
                }
            }
            if since.elapsed() > BOOT {
                bail!("the guest did not come back from `systemctl reboot` within {} s", BOOT.as_secs());
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        self.wait_for_startup()
    }

    /// Powers the guest off and waits for QEMU to exit (killing it after a minute).
    pub fn poweroff(mut self) {
        let _ = self.agent.spawn("systemctl poweroff", None);
        let since = Instant::now();
        while since.elapsed() < Duration::from_secs(60) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!("xtask: the guest did not power off within a minute; stopping QEMU");
    }

    fn alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("QEMU exited ({status}); see {}", self.console.display());
        }
        Ok(())
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// How long a boot may take to reach the guest agent, and to print the
/// kernel's first line on the console.
#[derive(Clone, Copy)]
struct Limits {
    agent: Duration,
    first_line: Option<Duration>,
}

/// Connects to the guest agent and waits until it answers, or QEMU exits,
/// or a limit passes.
fn first_contact(child: &mut Child, socket: &Path, console: &Path, limits: Limits) -> Result<GuestAgent> {
    let since = Instant::now();
    let mut agent = GuestAgent::connect(socket, Duration::from_secs(30))?;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("QEMU exited ({status})");
        }
        if agent.try_sync()? {
            return Ok(agent);
        }
        if since.elapsed() > limits.agent {
            bail!("no answer from the guest agent within {} s", limits.agent.as_secs());
        }
        if let Some(limit) = limits.first_line.filter(|l| since.elapsed() > *l) {
            let printed = fs::read(console).is_ok_and(|b| String::from_utf8_lossy(&b).contains(KERNEL_FIRST_LINE));
            if !printed {
                bail!("no kernel line on the console within {} s", limit.as_secs());
            }
        }
    }
}

/// The last [`CONSOLE_TAIL`] lines of a console log, for an error.
fn console_tail(console: &Path) -> String {
    let text = fs::read(console).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    match lines.len() {
        0 => "(nothing on the console)".to_string(),
        n => lines[n.saturating_sub(CONSOLE_TAIL)..].join("\n"),
    }
}

/// Makes the run's second disk: an ext4 image of `dir`'s files, labelled
/// [`WORK_LABEL`] (the guest's fstab mounts it).
pub fn work_disk(dir: &Path, image: &Path) -> Result<()> {
    let bytes: u64 = fs::read_dir(dir)?.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum();
    let mib = (bytes / (1 << 20)) * 2 + 32;
    let _ = fs::remove_file(image);
    exec::run(
        Command::new("mkfs.ext4").args(["-q", "-F", "-L", WORK_LABEL, "-d"]).arg(dir).arg(image).arg(format!("{mib}M")),
    )
    .context("cannot make the run's disk")
}
