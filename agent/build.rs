//! Builds the eBPF crate for bpfel-unknown-none and leaves the object in
//! OUT_DIR, where `src/dataplane/loader.rs` embeds it. `cargo xtask build-ebpf`
//! provides bpf-linker and rust-src first; without them this fails with
//! cargo's own message.
use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../ebpf");
    let pkg = aya_build::Package {
        name: "edgevx-ebpf",
        root_dir: root.to_str().expect("workspace path is UTF-8"),
        ..Default::default()
    };
    if let Err(e) = aya_build::build_ebpf([pkg], aya_build::Toolchain::default()) {
        panic!("building the eBPF programs failed: {e:#}\nrun `cargo xtask build-ebpf` first");
    }
}
