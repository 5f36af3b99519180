//! The Debian 11 host's disk: a bullseye root made by debootstrap from
//! Debian's own packages (its systemd as PID 1, its 5.10 kernel and
//! initramfs, its etcd, iproute2, iptables, the CNI plugins), written into
//! an ext4 disk image with `mkfs.ext4 -d`. Built once and cached under
//! `~/.cache/edgevx/hosts/debian11-<key>/`, the key a hash of the
//! [`Recipe`]: a change of packages or of a file written into the root
//! builds a new one. A run never writes it: QEMU boots a copy-on-write
//! layer over it (host/machine.rs).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::peer::{GUEST_IP, GUEST_NIC_MAC, PEER_IP};
use crate::{deps::toolchain, exec};

/// The guest's hostname, and the node's name in etcd.
pub const HOSTNAME: &str = "edge-d11";
/// The disk's filesystem label, the kernel's `root=`.
pub const ROOT_LABEL: &str = "edgevx-root";
/// The label of the run's second disk (host/machine.rs), mounted at [`WORK_DIR`].
pub const WORK_LABEL: &str = "edgevx-work";
pub const WORK_DIR: &str = "/mnt/work";
/// The guest's network config, which test 3 rewrites without its gateway.
pub const NETWORK_FILE: &str = "/etc/systemd/network/10-underlay.network";

/// What goes into the root; its hash names the cache.
struct Recipe {
    suite: &'static str,
    /// debootstrap's `--include` (minbase): enough to boot with systemd.
    base: &'static [&'static str],
    /// Installed next, with apt in a chroot (no recommends).
    packages: &'static [&'static str],
    files: Vec<(&'static str, String)>,
    /// `systemctl enable` / `mask` in the chroot.
    enable: &'static [&'static str],
    mask: &'static [&'static str],
    /// Raise it when the steps below change in a way the fields do not show.
    steps: u32,
}

fn recipe() -> Recipe {
    Recipe {
        suite: "bullseye",
        base: &["systemd", "systemd-sysv", "udev", "iproute2"],
        packages: &[
            "linux-image-amd64",
            "etcd-server",
            "etcd-client",
            "iptables",
            // the real bridge, host-local and flannel CNI plugins (0.9.0)
            "containernetworking-plugins",
            "iputils-ping",
            // how the host runs commands in the guest (host/qga.rs)
            "qemu-guest-agent",
        ],
        files: vec![
            ("/etc/hostname", format!("{HOSTNAME}\n")),
            ("/etc/hosts", format!("127.0.0.1 localhost\n127.0.1.1 {HOSTNAME}\n")),
            // the run's second disk; nofail: a boot without it still comes up
            (
                "/etc/fstab",
                format!("LABEL={WORK_LABEL} {WORK_DIR} ext4 defaults,nofail,x-systemd.device-timeout=30s 0 0\n"),
            ),
            (NETWORK_FILE, network_config(true)),
            // a persistent journal: `journalctl -b -1` reads the boot before a reboot
            ("/var/log/journal/.keep", String::new()),
        ],
        enable: &["systemd-networkd"],
        // nothing of the guest's own runs beside the tests
        mask: &["apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "fstrim.timer"],
        steps: 1,
    }
}

/// The guest's underlay, static (systemd-networkd, matched by the NIC's
/// MAC), with the peer as its gateway or without a gateway at all.
pub fn network_config(gateway: bool) -> String {
    let mut s = format!("[Match]\nMACAddress={GUEST_NIC_MAC}\n\n[Network]\nAddress={GUEST_IP}/24\n");
    if gateway {
        s += &format!("Gateway={PEER_IP}\n");
    }
    s
}

impl Recipe {
    fn text(&self) -> String {
        let mut s =
            format!("suite {}\nbase {}\npackages {}\n", self.suite, self.base.join(","), self.packages.join(","));
        s += &format!("enable {}\nmask {}\nsteps {}\n", self.enable.join(","), self.mask.join(","), self.steps);
        for (path, content) in &self.files {
            s += &format!("file {path} {}\n{content}", content.len());
        }
        s
    }
}

/// The cached disk and what boots it.
pub struct Image {
    pub disk: PathBuf,
    pub vmlinuz: PathBuf,
    pub initrd: PathBuf,
    /// The kernel's release (`5.10.0-32-amd64`).
    pub release: String,
}

/// The cached image, built first when missing.
pub fn ensure() -> Result<Image> {
    let recipe = recipe();
    let text = recipe.text();
    let hosts = toolchain::cache_root()?.with_file_name("hosts");
    fs::create_dir_all(&hosts).with_context(|| format!("cannot create {}", hosts.display()))?;
    let key = sha256(&text, &hosts)?;
    let dir = hosts.join(format!("debian11-{}", &key[..16]));
    if let Some(image) = cached(&dir)? {
        eprintln!("xtask: the Debian 11 root is cached: {}", dir.display());
        return Ok(image);
    }
    let partial = hosts.join(format!("debian11-{}.partial", &key[..16]));
    let _ = fs::remove_dir_all(&partial);
    fs::create_dir_all(&partial)?;
    eprintln!("xtask: building the Debian 11 root into {} (a few minutes, once)", dir.display());
    build(&recipe, &partial)?;
    fs::write(partial.join("recipe.txt"), &text)?;
    fs::rename(&partial, &dir).with_context(|| format!("cannot move {} into place", partial.display()))?;
    // roots of older recipes: each is a few hundred MB
    for e in fs::read_dir(&hosts)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("debian11-") && e.path() != dir {
            let _ = fs::remove_dir_all(e.path());
        }
    }
    cached(&dir)?.with_context(|| format!("{} holds no bootable image", dir.display()))
}

fn cached(dir: &Path) -> Result<Option<Image>> {
    let (disk, vmlinuz, initrd) = (dir.join("root.img"), dir.join("vmlinuz"), dir.join("initrd.img"));
    if !(disk.is_file() && vmlinuz.is_file() && initrd.is_file()) {
        return Ok(None);
    }
    let release = fs::read_to_string(dir.join("release"))?.trim().to_string();
    Ok(Some(Image { disk, vmlinuz, initrd, release }))
}

fn build(recipe: &Recipe, out: &Path) -> Result<()> {
    let root = out.join("root");
    let mirror = debian_archive()?;
    let log = out.join("debootstrap.log");
    let status = Command::new("debootstrap")
        .args(["--variant=minbase", &format!("--include={}", recipe.base.join(",")), recipe.suite])
        .arg(&root)
        .arg(&mirror)
        .stdout(fs::File::create(&log)?)
        .stderr(fs::File::create(out.join("debootstrap.err"))?)
        .status()
        .context("cannot start debootstrap")?;
    if !status.success() {
        bail!("debootstrap {} from {mirror} failed ({status}); see {}", recipe.suite, log.display());
    }
    // no service of a package starts in the chroot (etcd's would)
    let policy = root.join("usr/sbin/policy-rc.d");
    fs::write(&policy, "#!/bin/sh\nexit 101\n")?;
    exec::run(Command::new("chmod").arg("0755").arg(&policy))?;
    let apt = format!(
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends {} >/dev/null",
        recipe.packages.join(" ")
    );
    in_chroot(&root, &apt).context("cannot install the Debian 11 root's packages")?;
    fs::remove_file(&policy)?;
    for (path, content) in &recipe.files {
        let at = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(at.parent().context("a file in /")?)?;
        fs::write(&at, content).with_context(|| format!("cannot write {}", at.display()))?;
    }
    fs::create_dir_all(root.join(WORK_DIR.trim_start_matches('/')))?;
    let mut units = format!("systemctl enable --quiet {}", recipe.enable.join(" "));
    units += &format!(" && systemctl mask --quiet {}", recipe.mask.join(" "));
    // the lists and the packages' archives: 200 MB the guest never reads
    units += " && apt-get clean && rm -rf /var/lib/apt/lists/*";
    in_chroot(&root, &units)?;
    // the kernel and initramfs the guest boots: the root's own
    let boot = root.join("boot");
    let release = one(&boot, "vmlinuz-")?;
    fs::copy(boot.join(format!("vmlinuz-{release}")), out.join("vmlinuz"))?;
    fs::copy(boot.join(format!("initrd.img-{release}")), out.join("initrd.img"))
        .with_context(|| format!("the root has no initramfs for {release}"))?;
    fs::write(out.join("release"), &release)?;
    // sparse: the guest's writes go to its run's own layer
    exec::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", ROOT_LABEL, "-d"])
            .arg(&root)
            .arg(out.join("root.img"))
            .arg("3G"),
    )
    .context("mkfs.ext4 -d could not make the disk image")?;
    fs::remove_dir_all(&root)?;
    Ok(())
}

/// Runs `script` chrooted into `root`, with /proc, /sys and /dev mounted in
/// a mount namespace of its own: nothing is left mounted when it ends.
fn in_chroot(root: &Path, script: &str) -> Result<()> {
    let r = root.display();
    let mounts = format!(
        "mount -t proc proc {r}/proc && mount -t sysfs sysfs {r}/sys && mount --bind /dev {r}/dev \
         && mount --bind /dev/pts {r}/dev/pts"
    );
    exec::run(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!("{mounts} && exec chroot {r} sh -c '{}'", script.replace('\'', r"'\''"))),
    )
}

/// The one `<prefix><release>` in `dir`: the release.
fn one(dir: &Path, prefix: &str) -> Result<String> {
    let found: Vec<String> = fs::read_dir(dir)?
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix(prefix)).map(str::to_string))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!("{} holds {} {prefix}* files, one expected", dir.display(), found.len()),
    }
}

fn sha256(text: &str, scratch: &Path) -> Result<String> {
    let file = scratch.join(format!(".recipe-{}", std::process::id()));
    fs::write(&file, text)?;
    let out = exec::output(Command::new("sha256sum").arg(&file));
    let _ = fs::remove_file(&file);
    Ok(out?.split_whitespace().next().context("sha256sum printed nothing")?.to_string())
}

/// The Debian archive this machine's apt uses (its `/debian` URI), so the
/// root comes from wherever the machine's packages come from.
fn debian_archive() -> Result<String> {
    crate::deps::apt::source_uris()
        .into_iter()
        .find(|u| u.trim_end_matches('/').ends_with("/debian"))
        .context("cannot find Debian's archive (a .../debian URI) in this machine's apt sources")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_covers_every_file_written_into_the_root() {
        let a = recipe();
        let mut b = recipe();
        b.files[0].1.push('x');
        assert_ne!(a.text(), b.text());
        assert!(a.text().contains("Gateway=198.18.0.2"), "{}", a.text());
        assert!(!network_config(false).contains("Gateway"));
    }
}
