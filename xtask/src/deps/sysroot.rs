//! A Debian root of another architecture's packages, unpacked (never
//! installed) into the cache: where the arm64 image takes its iptables,
//! nft and their libraries, the arm64 tests Debian's arm64 CNI plugins, and
//! the arm64 test guest its busybox.
//!
//! Debian bookworm's own arm64 builds, fetched by apt with an architecture
//! and state of its own ([`crate::deps::apt`]): the machine's dpkg gets no foreign
//! architecture. Each package and everything it depends on is unpacked
//! with `dpkg-deb -x` into one directory, so the programs' loader, their
//! libraries and the plugins sit at the paths they have on a Debian node.
use std::{fs, path::PathBuf};

use anyhow::{Context, Result};

use crate::deps::{apt::Apt, toolchain};

/// What a root holds: the packages named, with their dependencies.
pub const PACKAGES: &[&str] = &[
    // the image's iptables (iptables-nft, xtables-nft-multi) and its plugins
    "iptables",
    // the image's nft
    "nftables",
    // host-local, for edgevx-ipam's test on arm64
    "containernetworking-plugins",
    // init of the arm64 kernel's test guest (vm_arm64.rs)
    "busybox-static",
];

/// The unpacked root for Debian architecture `arch` (`arm64`), made once.
pub fn ensure(arch: &str) -> Result<PathBuf> {
    let cache = toolchain::cache_root()?.join(format!("sysroot-{arch}"));
    let root = cache.join("root");
    let done = cache.join("packages");
    let wanted = PACKAGES.join("\n") + "\n";
    if fs::read_to_string(&done).is_ok_and(|d| d.starts_with(&wanted)) && root.is_dir() {
        return Ok(root);
    }
    eprintln!("xtask: fetching Debian's {arch} builds of {} and their dependencies", PACKAGES.join(", "));
    let apt = Apt::new(
        &cache.join("apt"),
        &["{debian} bookworm main", "{security} bookworm-security main"],
        Some(arch),
        &format!("Debian 12 (bookworm) {arch}"),
    )?;
    let closure = apt.closure(PACKAGES)?;
    let debs = cache.join("debs");
    let _ = fs::remove_dir_all(&debs);
    let partial = cache.join("root.partial");
    let _ = fs::remove_dir_all(&partial);
    for package in &closure {
        let deb = apt.download(package, &debs)?;
        crate::deps::apt::unpack(&deb, &partial)?;
    }
    let _ = fs::remove_dir_all(&root);
    fs::rename(&partial, &root).with_context(|| format!("cannot move {} into place", partial.display()))?;
    let _ = fs::remove_dir_all(&debs);
    fs::write(&done, wanted + "\n" + &closure.join("\n") + "\n")
        .with_context(|| format!("cannot write {}", done.display()))?;
    eprintln!("xtask: {} ({} packages)", root.display(), closure.len());
    Ok(root)
}
