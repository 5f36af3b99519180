//! What the jobs take from outside the workspace (see `main.rs`'s map).
pub mod apt;
pub mod kernels;
pub mod packages;
pub mod sysroot;
pub mod toolchain;
pub mod unpacked;
