//! Single programs taken from Debian packages that are unpacked into the
//! tools cache (`apt-get download`, `dpkg-deb -x`), never installed:
//!
//! - promtool, for the alert rules' tests (deploy/monitoring), from
//!   `prometheus`: installing it would add a Prometheus server and its
//!   service to the machine, and the tests need only the one binary;
//! - kubectl, whose built-in kustomize renders deploy/'s overlays in the
//!   tests, from `kubernetes-client`: installing it would clash with a
//!   `kubectl` some machines carry from another vendor (this one's Google
//!   Cloud SDK), and the test must render with the same kustomize on every
//!   machine, whatever else is on PATH.
use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{deps::toolchain, exec};

/// A program inside a Debian package.
pub struct Tool {
    /// The cache directory's name.
    name: &'static str,
    package: &'static str,
    /// The program's path inside the package.
    path: &'static str,
}

pub const PROMTOOL: Tool = Tool { name: "promtool", package: "prometheus", path: "usr/bin/promtool" };
pub const KUBECTL: Tool = Tool { name: "kubectl", package: "kubernetes-client", path: "usr/bin/kubectl" };

/// The cached program, fetched first if it is not there yet.
pub fn ensure(tool: &Tool) -> Result<PathBuf> {
    let Tool { name, package, path } = *tool;
    let root = toolchain::cache_root()?.join(name);
    let bin = root.join(path);
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("xtask: fetching {name} (Debian's {package} package, unpacked, not installed)");
    let debs = root.with_extension("debs");
    let _ = fs::remove_dir_all(&debs);
    fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
    let download = || exec::run(Command::new("apt-get").args(["download", "-qq", package]).current_dir(&debs));
    if download().is_err() {
        // a machine whose package lists were never fetched: fetch them, once
        exec::run(Command::new("apt-get").args(["update", "-qq"])).context("`apt-get update` failed")?;
        download().with_context(|| format!("cannot download Debian's {package} package"))?;
    }
    let deb = fs::read_dir(&debs)
        .with_context(|| format!("cannot list {}", debs.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", debs.display()))?;
    let partial = root.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    exec::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))
        .with_context(|| format!("cannot unpack {}", deb.display()))?;
    let _ = fs::remove_dir_all(&root);
    fs::rename(&partial, &root).with_context(|| format!("cannot move {} into place", partial.display()))?;
    let _ = fs::remove_dir_all(&debs);
    anyhow::ensure!(bin.is_file(), "Debian's {package} package has no {path}");
    Ok(bin)
}
