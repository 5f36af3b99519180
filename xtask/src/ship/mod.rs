//! The container image and the release (see `main.rs`'s map).
pub mod image;
pub mod release;
pub mod seccomp;
