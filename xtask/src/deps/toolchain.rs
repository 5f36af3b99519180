//! What building the eBPF crate needs beyond a Rust install, installed on
//! first use and cached: rust-src for `-Z build-std=core`, and bpf-linker
//! linked against the LLVM of the toolchain that compiles the eBPF crate
//! (a mismatch of LLVM majors makes the link fail).
use std::{
    env,
    ffi::OsString,
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::exec;

/// The toolchain rust-toolchain.toml pins; the eBPF crate is built with it
/// too (RUSTC_BOOTSTRAP=1 for `-Z build-std=core`), as agent/build.rs does.
pub fn ebpf_toolchain() -> Result<String> {
    let file = exec::workspace_root().join("rust-toolchain.toml");
    let text = fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    pinned_channel(&text).with_context(|| format!("no `channel = \"...\"` in {}", file.display()))
}

/// The `channel` of a rust-toolchain.toml.
fn pinned_channel(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let value = l.trim().strip_prefix("channel")?.trim_start().strip_prefix('=')?.trim();
        Some(value.trim_matches('"').to_string()).filter(|v| !v.is_empty())
    })
}
const BPF_LINKER_VERSION: &str = "0.13.0";
const CARGO_FUZZ_VERSION: &str = "0.13.2";
const VIRTIOFSD_VERSION: &str = "1.14.0";

/// Where the tools are, for the children that need them.
pub struct Tools {
    pub bpf_linker_dir: PathBuf,
}

impl Tools {
    /// PATH with bpf-linker's directory in front.
    pub fn path_env(&self) -> OsString {
        let mut paths = vec![self.bpf_linker_dir.clone()];
        if let Some(p) = env::var_os("PATH") {
            paths.extend(env::split_paths(&p));
        }
        env::join_paths(paths).unwrap_or_default()
    }
}

pub fn ensure() -> Result<Tools> {
    ensure_rust_src(&ebpf_toolchain()?)?;
    let bpf_linker_dir = ensure_bpf_linker()?;
    Ok(Tools { bpf_linker_dir })
}

/// rust-src for toolchain `tc` (`-Z build-std=core` builds core from it),
/// installed if it is missing.
pub fn ensure_rust_src(tc: &str) -> Result<()> {
    let installed = exec::output(Command::new("rustup").args(["component", "list", "--installed", "--toolchain", tc]))
        .with_context(|| format!("missing: the Rust toolchain `{tc}` (rustup toolchain install {tc})"))?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!("xtask: installing rust-src for {tc}");
    exec::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", tc]))
        .context("missing: rust-src, and `rustup component add rust-src` could not install it")
}

/// The toolchain's own libLLVM shared library and its major version.
fn toolchain_llvm() -> Result<(PathBuf, String)> {
    let sysroot =
        exec::output(Command::new("rustc").arg(format!("+{}", ebpf_toolchain()?)).args(["--print", "sysroot"]))?;
    let lib = Path::new(sysroot.trim()).join("lib");
    let entries = fs::read_dir(&lib).with_context(|| format!("cannot list {}", lib.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        // libLLVM.so.23.1-rust-1.99.1-stable
        let major = name
            .strip_prefix("libLLVM.so.")
            .and_then(|rest| rest.split('.').next())
            .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_digit()));
        if let Some(major) = major {
            return Ok((entry.path(), major.to_string()));
        }
    }
    bail!(
        "missing: a shared libLLVM (libLLVM.so.<major>...) in {}; bpf-linker cannot be built against this toolchain",
        lib.display()
    )
}

pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = env::var_os("EDGEVX_TOOLS_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let base = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("missing: HOME (or XDG_CACHE_HOME / EDGEVX_TOOLS_DIR) to cache tools in")?;
    Ok(base.join("edgevx").join("tools"))
}

fn ensure_bpf_linker() -> Result<PathBuf> {
    let (llvm_lib, major) = toolchain_llvm()?;
    let soname = llvm_lib.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // keyed by the exact library, so a toolchain update builds a new linker
    let root = cache_root()?.join(format!("bpf-linker-{BPF_LINKER_VERSION}-{soname}"));
    let bin_dir = root.join("bin");
    let bin = bin_dir.join("bpf-linker");
    if bin.exists() && Command::new(&bin).arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(bin_dir);
    }
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against {} (about a minute)", llvm_lib.display());
    let prefix = root.join("llvm");
    let prefix_lib = prefix.join("lib");
    fs::create_dir_all(&prefix_lib).with_context(|| format!("cannot create {}", prefix_lib.display()))?;
    for link in ["libLLVM.so".to_string(), soname] {
        let at = prefix_lib.join(link);
        let _ = fs::remove_file(&at);
        symlink(&llvm_lib, &at).with_context(|| format!("cannot link {}", at.display()))?;
    }
    exec::run(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--locked", "--version", BPF_LINKER_VERSION])
            .args(["--no-default-features", "--features", &format!("llvm-{major}")])
            .arg("--root")
            .arg(&root)
            .env("LLVM_PREFIX", &prefix),
    )
    .with_context(|| format!("missing: bpf-linker, and building it against LLVM {major} failed (needs crates.io)"))?;
    Ok(bin_dir)
}

/// cargo-fuzz, built from crates.io into the tools cache like bpf-linker
/// (nothing is installed into ~/.cargo/bin); returns the directory of the
/// `cargo-fuzz` binary, to put on PATH for `cargo fuzz`.
pub fn ensure_cargo_fuzz() -> Result<PathBuf> {
    ensure_crate_bin("cargo-fuzz", CARGO_FUZZ_VERSION, "about a minute")
}

/// The Rust virtiofsd, built from crates.io into the tools cache, for the
/// kernel matrix's guests (`test/vm.rs`: virtme-ng shares the root over
/// virtio-fs with it, over 9p without it); returns its directory, to put
/// on virtme-ng's PATH. Debian 12 packages no Rust virtiofsd, and QEMU
/// 7.2's C one takes other flags, so virtme-ng passes it over.
pub fn ensure_virtiofsd() -> Result<PathBuf> {
    ensure_crate_bin("virtiofsd", VIRTIOFSD_VERSION, "about a minute and a half")
}

/// `krate` at `version` built from crates.io with its own lock file into
/// the tools cache (nothing is installed into ~/.cargo/bin), unless its
/// binary of the same name is there already and runs; returns the
/// binary's directory.
fn ensure_crate_bin(krate: &str, version: &str, how_long: &str) -> Result<PathBuf> {
    let root = cache_root()?.join(format!("{krate}-{version}"));
    let bin_dir = root.join("bin");
    let path = bin_dir.join(krate);
    if path.exists() && Command::new(&path).arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Ok(bin_dir);
    }
    eprintln!("xtask: building {krate} {version} ({how_long})");
    exec::run(
        Command::new("cargo").args(["install", krate, "--locked", "--version", version]).arg("--root").arg(&root),
    )
    .with_context(|| format!("missing: {krate}, and `cargo install {krate}` failed (needs crates.io)"))?;
    Ok(bin_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_is_read_from_rust_toolchain_toml() {
        let text = "# comment\n[toolchain]\nchannel = \"1.99.1\"\ncomponents = [\"rust-src\"]\n";
        assert_eq!(pinned_channel(text).as_deref(), Some("1.99.1"));
        assert_eq!(
            pinned_channel("[toolchain]\nchannel=\"nightly-2026-11-01\"").as_deref(),
            Some("nightly-2026-11-01")
        );
        assert_eq!(pinned_channel("[toolchain]\nprofile = \"minimal\"\n"), None);
        assert_eq!(pinned_channel("channel = \"\""), None);
    }

    #[test]
    fn the_repository_pins_a_channel() {
        assert!(ebpf_toolchain().is_ok_and(|c| !c.is_empty()));
    }
}
