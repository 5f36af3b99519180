//! The commit edgevx-ipam is built from, for `edgevx-ipam --version`.
include!("../build-support/commit.rs");

fn main() {
    emit_commit();
}
