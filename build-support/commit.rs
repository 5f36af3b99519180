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
    // `--git-path` says where git keeps each file: in a linked worktree the
    // branch refs live in the common dir, not beside HEAD, and a packed ref
    // has no file of its own (cargo runs a script again every build when a
    // path it watches does not exist)
    let path = |file: &str| git(&["rev-parse", "--path-format=absolute", "--git-path", file]);
    if let Some(head) = path("HEAD") {
        println!("cargo:rerun-if-changed={head}");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            match path(&r).filter(|p| std::path::Path::new(p).exists()) {
                Some(loose) => println!("cargo:rerun-if-changed={loose}"),
                None => {
                    if let Some(packed) = path("packed-refs") {
                        println!("cargo:rerun-if-changed={packed}");
                    }
                }
            }
        }
    }
    let commit = std::env::var("EDGEVX_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    println!("cargo:rustc-env=EDGEVX_COMMIT={}", commit.as_deref().unwrap_or("unknown"));
}
