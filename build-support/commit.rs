// The commit a binary is built from, for `--version` and
// `edgevx_build_info{commit}`: included by agent/build.rs and ipam/build.rs
// (one file, two build scripts). EDGEVX_COMMIT wins (a build from a source
// tarball has no .git); else `git rev-parse`; else "unknown". Changes not
// yet committed are not marked: cargo would not run this script again for
// them, so a mark could be stale either way.

/// Tells cargo the commit (as the `EDGEVX_COMMIT` compile-time variable),
/// and to run the build script again when HEAD moves.
fn emit_commit() {
    println!("cargo:rerun-if-env-changed=EDGEVX_COMMIT");
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        Some(String::from_utf8(out.stdout).ok()?.trim().to_string()).filter(|s| !s.is_empty())
    };
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{r}");
        }
    }
    let commit = std::env::var("EDGEVX_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    println!("cargo:rustc-env=EDGEVX_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}
