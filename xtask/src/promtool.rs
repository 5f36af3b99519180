//! promtool, for the alert rules' tests (deploy/monitoring): taken from
//! Debian's `prometheus` package, unpacked into the tools cache with
//! `apt-get download` and `dpkg-deb -x`. The package is never installed:
//! installing it would add a Prometheus server and its service to the
//! machine, and the tests need only the one binary.
use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{exec, toolchain};

const PACKAGE: &str = "prometheus";

/// The cached promtool, fetched first if it is not there yet.
pub fn ensure() -> Result<PathBuf> {
    let root = toolchain::cache_root()?.join("promtool");
    let bin = root.join("usr/bin/promtool");
    if bin.is_file() {
        return Ok(bin);
    }
    eprintln!("xtask: fetching promtool (Debian's {PACKAGE} package, unpacked, not installed)");
    let debs = root.with_extension("debs");
    let _ = fs::remove_dir_all(&debs);
    fs::create_dir_all(&debs).with_context(|| format!("cannot create {}", debs.display()))?;
    let download = || exec::run(Command::new("apt-get").args(["download", "-qq", PACKAGE]).current_dir(&debs));
    if download().is_err() {
        // a machine whose package lists were never fetched: fetch them, once
        exec::run(Command::new("apt-get").args(["update", "-qq"])).context("`apt-get update` failed")?;
        download().with_context(|| format!("cannot download Debian's {PACKAGE} package"))?;
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
    anyhow::ensure!(bin.is_file(), "Debian's {PACKAGE} package has no usr/bin/promtool");
    Ok(bin)
}
