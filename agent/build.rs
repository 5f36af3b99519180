//! Builds the eBPF crate for bpfel-unknown-none and leaves the object in
//! OUT_DIR, where the loader embeds it. `cargo xtask build-ebpf` installs
//! bpf-linker and rust-src first; a plain `cargo build` afterwards finds the
//! cached bpf-linker by itself. The eBPF crate is built with the toolchain
//! rust-toolchain.toml pins (RUSTC_BOOTSTRAP=1 for `-Z build-std=core`),
//! and with the bpf-linker built against that toolchain's LLVM.
use std::{env, fs, path::PathBuf};

/// The `channel` rust-toolchain.toml pins.
fn pinned_toolchain() -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", file.display());
    let text = fs::read_to_string(&file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    text.lines()
        .find_map(|l| {
            let value = l.trim().strip_prefix("channel")?.trim_start().strip_prefix('=')?.trim();
            Some(value.trim_matches('"').to_string()).filter(|v| !v.is_empty())
        })
        .unwrap_or_else(|| panic!("no `channel = \"...\"` in {}", file.display()))
}

/// Cached bpf-linkers (xtask/src/deps/toolchain.rs names each directory after
/// the libLLVM it was built against), those for `toolchain` first.
fn cached_bpf_linker_dirs(toolchain: &str) -> Vec<PathBuf> {
    let base = env::var_os("EDGEVX_TOOLS_DIR").map(PathBuf::from).or_else(|| {
        env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("edgevx/tools"))
    });
    let Some(base) = base else { return Vec::new() };
    let Ok(entries) = fs::read_dir(base) else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> =
        entries.flatten().map(|e| e.path().join("bin")).filter(|b| b.join("bpf-linker").exists()).collect();
    let suffix = format!("-rust-{toolchain}");
    dirs.sort_by_key(|d| !d.parent().is_some_and(|p| p.to_string_lossy().contains(&suffix)));
    dirs
}

include!("../build-support/commit.rs");

fn main() {
    emit_commit();
    let toolchain = pinned_toolchain();
    let mut paths: Vec<PathBuf> = env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
    if !paths.iter().any(|p| p.join("bpf-linker").exists()) {
        paths.extend(cached_bpf_linker_dirs(&toolchain));
        if let Ok(joined) = env::join_paths(paths) {
            // SAFETY: build scripts are single-threaded.
            unsafe { env::set_var("PATH", joined) };
        }
    }
    // -Z build-std=core on the pinned stable toolchain (aya-build passes it
    // when RUSTC_BOOTSTRAP is 1; cargo and rustc both need it)
    // SAFETY: build scripts are single-threaded.
    unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    println!("cargo:rerun-if-env-changed=EDGEVX_TOOLS_DIR");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ebpf");
    let root = root.to_string_lossy().into_owned();
    let pkg = aya_build::Package { name: "edgevx-ebpf", root_dir: &root, ..Default::default() };
    if let Err(e) = aya_build::build_ebpf([pkg], aya_build::Toolchain::Custom(&toolchain)) {
        panic!("building the eBPF programs failed: {e:#}\nrun `cargo xtask build-ebpf` first");
    }
}
