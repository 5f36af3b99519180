//! Builds the eBPF crate for bpfel-unknown-none and leaves the object in
//! OUT_DIR, where the loader embeds it. `cargo xtask build-ebpf` installs
//! bpf-linker and rust-src first; a plain `cargo build` afterwards finds the
//! cached bpf-linker by itself.
use std::{env, fs, path::PathBuf};

fn cached_bpf_linker_dirs() -> Vec<PathBuf> {
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
    entries.flatten().map(|e| e.path().join("bin")).filter(|b| b.join("bpf-linker").exists()).collect()
}

include!("../build-support/commit.rs");

fn main() {
    emit_commit();
    let mut paths: Vec<PathBuf> = env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
    if !paths.iter().any(|p| p.join("bpf-linker").exists()) {
        paths.extend(cached_bpf_linker_dirs());
        if let Ok(joined) = env::join_paths(paths) {
            // SAFETY: build scripts are single-threaded.
            unsafe { env::set_var("PATH", joined) };
        }
    }
    println!("cargo:rerun-if-env-changed=EDGEVX_TOOLS_DIR");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ebpf");
    let root = root.to_string_lossy().into_owned();
    let pkg = aya_build::Package { name: "edgevx-ebpf", root_dir: &root, ..Default::default() };
    if let Err(e) = aya_build::build_ebpf([pkg], aya_build::Toolchain::default()) {
        panic!("building the eBPF programs failed: {e:#}\nrun `cargo xtask build-ebpf` first");
    }
}
