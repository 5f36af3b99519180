//! The kernel matrix's kernels: Debian's own generic builds, fetched from
//! Debian's archive and cached, so a test on "5.10" runs on exactly the
//! kernel a Debian 11 edge node boots.
//!
//! apt fetches them with a configuration of its own ([`crate::apt`]), so
//! the machine's own apt configuration is never changed.
//!
//! The *generic* flavour (`-amd64-unsigned`) is taken, not `-cloud-amd64`:
//! virtme-ng shares the root filesystem over virtio-fs, or over 9p where
//! virtiofsd does not start, and the cloud flavour builds no 9p (the
//! generic 5.10 and 6.1 build both as modules).
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{
    apt::{self, Apt},
    exec, toolchain,
};

/// One kernel of the matrix.
pub struct Spec {
    /// The name `--kernel` takes.
    pub name: &'static str,
    /// Where a fleet meets it.
    pub distro: &'static str,
    /// Source lines for apt, `{debian}` and `{security}` standing for the
    /// machine's archive URIs.
    sources: &'static [&'static str],
    /// The package name before the ABI number (`linux-image-5.10.0-46-amd64-unsigned`).
    prefix: &'static str,
    /// The package name after it.
    suffix: &'static str,
    /// The Debian architecture (`amd64` boots under virtme-ng, `arm64` in
    /// qemu-system-aarch64 with an initramfs: vm_arm64.rs).
    pub arch: &'static str,
}

pub const MATRIX: &[Spec] = &[
    Spec {
        name: "5.10",
        distro: "Debian 11 (bullseye)",
        sources: &["{debian} bullseye main", "{security} bullseye-security main"],
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64-unsigned",
        arch: "amd64",
    },
    Spec {
        name: "6.1",
        distro: "Debian 12 (bookworm)",
        sources: &["{debian} bookworm main", "{security} bookworm-security main"],
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64-unsigned",
        arch: "amd64",
    },
    Spec {
        name: "6.12",
        distro: "Debian 12 backports (bookworm-backports), Debian 13",
        sources: &["{debian} bookworm-backports main"],
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64-unsigned",
        arch: "amd64",
    },
    Spec {
        name: "6.1-arm64",
        distro: "Debian 12 (bookworm), arm64",
        sources: &["{debian} bookworm main", "{security} bookworm-security main"],
        prefix: "linux-image-6.1.0-",
        suffix: "-arm64-unsigned",
        arch: "arm64",
    },
];

pub fn spec(name: &str) -> Result<&'static Spec> {
    MATRIX.iter().find(|s| s.name == name).with_context(|| {
        format!(
            "unknown kernel {name:?}: the matrix has {}",
            MATRIX.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
        )
    })
}

/// A fetched kernel: its image and its modules' tree (virtme-ng links the
/// guest's `/lib/modules/<release>` to it).
pub struct Fetched {
    pub package: String,
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// The newest package of `spec` in Debian's archive, downloaded and
/// unpacked once into the cache; later runs reuse it.
pub fn fetch(spec: &Spec) -> Result<Fetched> {
    let root = toolchain::cache_root()?.join("kernels");
    let apt = Apt::new(&root.join(format!("apt-{}", spec.name)), spec.sources, Some(spec.arch), spec.distro)?;
    let package = newest(&apt, spec)?;
    let unpacked = root.join(&package);
    if let Some(found) = unpacked_kernel(&unpacked, &package)? {
        return Ok(found);
    }
    eprintln!("xtask: fetching {package} ({})", spec.distro);
    let debs = root.join("debs");
    fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
    let deb = apt.download(&package, &debs)?;
    let partial = root.join(format!("{package}.partial"));
    let _ = fs::remove_dir_all(&partial);
    apt::unpack(&deb, &partial)?;
    let release = release_of(&partial)?;
    // modules.dep for the guest's modprobe (the package's postinst would run this)
    exec::run(Command::new("depmod").arg("-b").arg(&partial).arg(&release))
        .with_context(|| format!("depmod failed for {release}"))?;
    fs::rename(&partial, &unpacked).with_context(|| format!("cannot move {} into place", partial.display()))?;
    let _ = fs::remove_file(&deb);
    unpacked_kernel(&unpacked, &package)?.with_context(|| format!("{} holds no kernel image", unpacked.display()))
}

fn unpacked_kernel(dir: &Path, package: &str) -> Result<Option<Fetched>> {
    if !dir.join("lib/modules").is_dir() {
        return Ok(None);
    }
    let release = release_of(dir)?;
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    Ok(vmlinuz.is_file().then(|| Fetched { package: package.to_string(), release, vmlinuz }))
}

/// The one release under `<dir>/lib/modules`.
fn release_of(dir: &Path) -> Result<String> {
    let modules = dir.join("lib/modules");
    let mut releases: Vec<String> = fs::read_dir(&modules)
        .with_context(|| format!("cannot list {}", modules.display()))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    match releases.len() {
        1 => Ok(releases.remove(0)),
        n => bail!("{} holds {n} kernel releases, expected one", modules.display()),
    }
}

/// The package of `spec` with the highest ABI number.
fn newest(apt: &Apt, spec: &Spec) -> Result<String> {
    let pattern = format!("^{}[0-9.]+{}$", regex_escape(spec.prefix), regex_escape(spec.suffix));
    let found = apt.cache(&["search", "--names-only", &pattern])?;
    found
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| name.strip_prefix(spec.prefix).and_then(|r| r.strip_suffix(spec.suffix)).is_some())
        .max_by_key(|name| abi(name, spec))
        .map(str::to_string)
        .with_context(|| format!("Debian's archive lists no {}<abi>{} for {}", spec.prefix, spec.suffix, spec.distro))
}

/// The numbers between the prefix and the suffix, for ordering.
fn abi(name: &str, spec: &Spec) -> Vec<u32> {
    let middle = name.strip_prefix(spec.prefix).and_then(|r| r.strip_suffix(spec.suffix)).unwrap_or("");
    middle.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

fn regex_escape(s: &str) -> String {
    s.chars().flat_map(|c| if ".+*?^$[](){}|\\".contains(c) { vec!['\\', c] } else { vec![c] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_abi_wins() {
        let s = spec("5.10").unwrap();
        assert!(abi("linux-image-5.10.0-46-amd64-unsigned", s) > abi("linux-image-5.10.0-9-amd64-unsigned", s));
        let s = spec("6.12").unwrap();
        assert_eq!(abi("linux-image-6.12.95+deb12-amd64-unsigned", s), vec![95]);
    }

    #[test]
    fn unknown_kernel_names_the_matrix() {
        let e = spec("4.19").err().unwrap().to_string();
        assert!(e.contains("5.10, 6.1, 6.12, 6.1-arm64"), "{e}");
    }
}
