//! The kernel matrix's kernels: Debian's own generic builds, fetched from
//! Debian's archive and cached, so a test on "5.10" runs on exactly the
//! kernel a Debian 11 edge node boots.
//!
//! apt fetches them with a configuration of its own ([`crate::deps::apt`]), so
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
    deps::{
        apt::{self, Apt},
        toolchain,
    },
    exec,
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
    /// Which of the builds the sources hold.
    build: Build,
}

/// Which build of a kernel line the matrix boots, of those the archive holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Build {
    /// The highest ABI number: a node kept up to date.
    Newest,
    /// The lowest: a node installed from the point release and never
    /// upgraded. Its verifier is an older program than the newest build's
    /// (a line's stable updates change the verifier too: 5.10.222 let
    /// privileged programs read stack slots never written), so a program
    /// one build takes the other may refuse.
    Oldest,
}

pub const MATRIX: &[Spec] = &[
    Spec {
        name: "5.10",
        distro: "Debian 11 (bullseye)",
        sources: &["{debian} bullseye main", "{security} bullseye-security main"],
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64-unsigned",
        arch: "amd64",
        build: Build::Newest,
    },
    // the point release's own kernel, which a Debian 11 node installed from
    // it and never upgraded still boots: the lowest ABI bullseye main holds
    // (5.10.0-30 in November 2026), chosen from what the archive lists
    Spec {
        name: "5.10-oldest",
        distro: "Debian 11 (bullseye), its point release's kernel",
        sources: &["{debian} bullseye main"],
        prefix: "linux-image-5.10.0-",
        suffix: "-amd64-unsigned",
        arch: "amd64",
        build: Build::Oldest,
    },
    Spec {
        name: "6.1",
        distro: "Debian 12 (bookworm)",
        sources: &["{debian} bookworm main", "{security} bookworm-security main"],
        prefix: "linux-image-6.1.0-",
        suffix: "-amd64-unsigned",
        arch: "amd64",
        build: Build::Newest,
    },
    Spec {
        name: "6.12",
        distro: "Debian 12 backports (bookworm-backports), Debian 13",
        sources: &["{debian} bookworm-backports main"],
        prefix: "linux-image-6.12.",
        suffix: "+deb12-amd64-unsigned",
        arch: "amd64",
        build: Build::Newest,
    },
    Spec {
        name: "6.1-arm64",
        distro: "Debian 12 (bookworm), arm64",
        sources: &["{debian} bookworm main", "{security} bookworm-security main"],
        prefix: "linux-image-6.1.0-",
        suffix: "-arm64-unsigned",
        arch: "arm64",
        build: Build::Newest,
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

/// The package of `spec` in Debian's archive (its newest build, or its
/// oldest: [`Build`]), downloaded and unpacked once into the cache; later
/// runs reuse it.
pub fn fetch(spec: &Spec) -> Result<Fetched> {
    let root = toolchain::cache_root()?.join("kernels");
    let apt = Apt::new(&root.join(format!("apt-{}", spec.name)), spec.sources, Some(spec.arch), spec.distro)?;
    let package = chosen(&apt, spec)?;
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

/// The package of `spec` with the highest ABI number, or the lowest
/// ([`Build`]), of those apt lists from its sources.
fn chosen(apt: &Apt, spec: &Spec) -> Result<String> {
    let pattern = format!("^{}[0-9.]+{}$", regex_escape(spec.prefix), regex_escape(spec.suffix));
    let found = apt.cache(&["search", "--names-only", &pattern])?;
    pick(&found, spec)
        .with_context(|| format!("Debian's archive lists no {}<abi>{} for {}", spec.prefix, spec.suffix, spec.distro))
}

/// `spec`'s build among the packages `apt-cache search` printed (`name - description` lines).
fn pick(search: &str, spec: &Spec) -> Option<String> {
    let names = search.lines().filter_map(|l| l.split_whitespace().next()).filter(|name| {
        middle(name, spec).is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit() || c == '.'))
    });
    match spec.build {
        Build::Newest => names.max_by_key(|name| abi(name, spec)),
        Build::Oldest => names.min_by_key(|name| abi(name, spec)),
    }
    .map(str::to_string)
}

/// What lies between the prefix and the suffix: the ABI number.
fn middle<'a>(name: &'a str, spec: &Spec) -> Option<&'a str> {
    name.strip_prefix(spec.prefix).and_then(|r| r.strip_suffix(spec.suffix))
}

/// The numbers between the prefix and the suffix, for ordering.
fn abi(name: &str, spec: &Spec) -> Vec<u32> {
    middle(name, spec).unwrap_or("").split('.').map(|n| n.parse().unwrap_or(0)).collect()
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
    fn the_oldest_build_is_the_lowest_abi_and_the_newest_the_highest() {
        let search = "linux-image-5.10.0-30-amd64-unsigned - Linux 5.10 for 64-bit PCs\n\
                      linux-image-5.10.0-9-amd64-unsigned - Linux 5.10 for 64-bit PCs\n\
                      linux-image-5.10.0-46-amd64-unsigned - Linux 5.10 for 64-bit PCs\n\
                      linux-image-5.10.0-46-cloud-amd64-unsigned - Linux 5.10 for x86-64 cloud\n";
        assert_eq!(pick(search, spec("5.10").unwrap()).as_deref(), Some("linux-image-5.10.0-46-amd64-unsigned"));
        assert_eq!(pick(search, spec("5.10-oldest").unwrap()).as_deref(), Some("linux-image-5.10.0-9-amd64-unsigned"));
        assert_eq!(pick("", spec("5.10-oldest").unwrap()), None);
    }

    #[test]
    fn unknown_kernel_names_the_matrix() {
        let e = spec("4.19").err().unwrap().to_string();
        assert!(e.contains("5.10, 5.10-oldest, 6.1, 6.12, 6.1-arm64"), "{e}");
    }
}
