//! The previous release's agent, for the upgrade and downgrade tests
//! (tests/tests/e2e/upgrade.rs): built once from its commit and cached
//! under `target/previous/<commit>/`.
//!
//! Its tree is taken from this repository's history (`git archive`) into
//! `target/previous/<commit>/src` and built there with this workspace's
//! target directory: the crates from crates.io are the same builds as this
//! tree's wherever the two lock files agree, so only the previous tree's
//! own crates and its eBPF object are compiled. Cargo leaves that build's
//! agent at `target/release/edgevx`; [`ensure`] copies it out, and the
//! caller builds this tree's agent afterwards, which puts ours back there
//! ([`check_ours_is_back`] makes sure).
//!
//! Costs, measured on 2 cores shared with other builds (load about 9):
//! cached, nothing; cache removed but the target dir warm, about a second;
//! the previous tree's own crates (the agent, its common crate, its eBPF
//! object) about what this tree's agent takes to compile again (there 6
//! minutes, 2m40s of CPU). Build through `cargo xtask` only: ring's build
//! script records the caller's `CARGO_*` variables, so a plain `cargo
//! build` in between makes the next one compile ring and its dependents again.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{
    deps::toolchain::{self, Tools},
    exec,
};

/// The toolchain the previous release's build script builds its eBPF
/// object with: aya-build's default, `cargo +nightly`, with rust-src for
/// `-Z build-std=core`. A fresh machine's nightly has no rust-src.
const PREVIOUS_EBPF_TOOLCHAIN: &str = "nightly";

/// The previous release: the tree the upgrade tests upgrade from and
/// downgrade to. The one place it is named.
pub const COMMIT: &str = "84a3ed46b8ca84cea8d0b03af348514824197b86";

/// Where the e2e tests find the previous agent.
pub const BIN_ENV: &str = "EDGEVX_PREV_BIN";
/// Where the e2e tests find the eBPF object that agent embeds.
pub const EBPF_OBJECT_ENV: &str = "EDGEVX_PREV_EBPF_OBJECT";

/// The previous release's agent and the eBPF object embedded in it.
pub struct Previous {
    pub bin: PathBuf,
    pub ebpf_object: PathBuf,
}

impl Previous {
    /// The environment the e2e tests read.
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [(BIN_ENV, self.bin.clone()), (EBPF_OBJECT_ENV, self.ebpf_object.clone())]
    }
}

/// Whether a test filter selects the upgrade tests (none selects all).
pub fn selected(filter: Option<&str>) -> bool {
    filter.is_none_or(|f| f.split_whitespace().any(|f| "upgrade::".contains(f) || f.contains("upgrade")))
}

/// The previous agent, built unless cached. Build this tree's agent after
/// it (see the module's doc).
pub fn ensure(tools: &Tools) -> Result<Previous> {
    let root = exec::workspace_root();
    let dir = root.join("target/previous").join(COMMIT);
    let cached = Previous { bin: dir.join("edgevx"), ebpf_object: dir.join("edgevx.o") };
    if cached.bin.is_file() && cached.ebpf_object.is_file() {
        eprintln!("xtask: the previous release's agent ({}) is cached in {}", &COMMIT[..12], dir.display());
        return Ok(cached);
    }
    let started = Instant::now();
    let src = dir.join("src");
    unpack(&root, &src)?;
    let built = build(tools, &root, &src)?;
    fs::copy(&built.bin, &cached.bin)
        .with_context(|| format!("cannot copy {} to {}", built.bin.display(), cached.bin.display()))?;
    fs::copy(&built.ebpf_object, &cached.ebpf_object)
        .with_context(|| format!("cannot copy {} to {}", built.ebpf_object.display(), cached.ebpf_object.display()))?;
    // the binaries are what is kept; the tree is in git
    fs::remove_dir_all(&src).with_context(|| format!("cannot remove {}", src.display()))?;
    eprintln!(
        "xtask: built the previous release's agent ({}) in {:.0?}: {}",
        &COMMIT[..12],
        started.elapsed(),
        cached.bin.display()
    );
    Ok(cached)
}

/// Fails if `ours` (target/release/edgevx, built after [`ensure`]) is
/// still the previous release's binary: the e2e tests would then run the
/// old agent as this one, and every upgrade would be none.
pub fn check_ours_is_back(prev: &Previous, ours: &Path) -> Result<()> {
    let read = |p: &Path| fs::read(p).with_context(|| format!("cannot read {}", p.display()));
    if read(&prev.bin)? == read(ours)? {
        bail!(
            "{} is the previous release's agent ({}), not this tree's: build it again (cargo build --release -p edgevx)",
            ours.display(),
            &COMMIT[..12]
        );
    }
    Ok(())
}

/// `git archive COMMIT | tar -x -C src`, into an empty `src`.
fn unpack(root: &Path, src: &Path) -> Result<()> {
    if src.exists() {
        fs::remove_dir_all(src).with_context(|| format!("cannot remove {}", src.display()))?;
    }
    fs::create_dir_all(src).with_context(|| format!("cannot create {}", src.display()))?;
    let mut archive = Command::new("git")
        .args(["archive", "--format=tar", COMMIT])
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start git archive")?;
    let tar = archive.stdout.take().context("git archive has no stdout")?;
    let untar = Command::new("tar").arg("-x").arg("-C").arg(src).stdin(tar).status().context("cannot start tar")?;
    let archived = archive.wait().context("git archive")?;
    if !archived.success() {
        bail!(
            "git archive {COMMIT} failed ({archived}): the previous release's tree must be in this clone's history \
             (a shallow clone lacks it: git fetch --unshallow)"
        );
    }
    if !untar.success() {
        bail!("tar -x into {} failed: {untar}", src.display());
    }
    Ok(())
}

/// Builds the agent in `src` with the workspace's target directory; the
/// agent and the eBPF object its build script embedded, where cargo left them.
fn build(tools: &Tools, root: &Path, src: &Path) -> Result<Previous> {
    toolchain::ensure_rust_src(PREVIOUS_EBPF_TOOLCHAIN)
        .context("the previous release's eBPF object is built with the nightly toolchain")?;
    let out = exec::output(
        Command::new("cargo")
            .args(["build", "--release", "--locked", "--package", "edgevx", "--message-format", "json"])
            .current_dir(src)
            .env("CARGO_TARGET_DIR", root.join("target"))
            .env("PATH", tools.path_env())
            .stderr(Stdio::inherit()),
    )?;
    let messages: Vec<serde_json::Value> = out.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let ours = |m: &serde_json::Value| m["package_id"].as_str().is_some_and(|id| id.contains("/agent#edgevx@"));
    let bin = messages
        .iter()
        .filter(|m| m["reason"] == "compiler-artifact" && ours(m) && m["target"]["name"] == "edgevx")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo built no edgevx binary from the previous release's tree")?;
    let ebpf_object = messages
        .iter()
        .filter(|m| m["reason"] == "build-script-executed" && ours(m))
        .find_map(|m| m["out_dir"].as_str().map(|d| PathBuf::from(d).join("edgevx")))
        .filter(|p| p.is_file())
        .context("the previous release's build script left no eBPF object in its OUT_DIR")?;
    Ok(Previous { bin, ebpf_object })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upgrade_tests_are_selected_by_their_name_or_by_no_filter() {
        assert!(selected(None));
        assert!(selected(Some("upgrade")));
        assert!(selected(Some("upgrade::")));
        assert!(selected(Some("upgrade::the_flows_survive")));
        assert!(selected(Some("restart upgrade")));
        assert!(!selected(Some("restart")));
        assert!(!selected(Some("interop::")));
    }

    #[test]
    fn the_commit_is_a_full_id() {
        assert_eq!(COMMIT.len(), 40);
        assert!(COMMIT.chars().all(|c| c.is_ascii_hexdigit()));
    }
}
