//! bpf-linker is an undeclared dependency of this crate: rerun when it changes.
fn main() {
    if let Ok(path) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
