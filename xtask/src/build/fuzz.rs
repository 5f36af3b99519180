//! `cargo xtask fuzz --seconds N`: builds the cargo-fuzz targets in fuzz/
//! (the pinned toolchain with RUSTC_BOOTSTRAP=1, AddressSanitizer) and runs each for N seconds, starting from
//! its seeds in fuzz/seeds/<target>. What libFuzzer finds new goes to
//! fuzz/corpus/<target> (ignored by git), so later runs start from there;
//! a crash stops the job and leaves its input in fuzz/artifacts/<target>.
use std::{fs, process::Command};

use anyhow::{Context, Result};

use crate::{
    deps::{packages, toolchain},
    exec,
};

/// Every target in fuzz/Cargo.toml.
pub const TARGETS: [&str; 5] = ["nodes_file", "annotations", "net_conf", "etcd_lease", "ipam_config"];

pub fn run(seconds: u32) -> Result<()> {
    packages::ensure_fuzz()?;
    // the agent's build script builds the eBPF object: bpf-linker and rust-src
    let tools = toolchain::ensure()?;
    let fuzz_bin = toolchain::ensure_cargo_fuzz()?;
    let mut path = vec![fuzz_bin];
    path.extend(std::env::split_paths(&tools.path_env()));
    let path = std::env::join_paths(path).context("PATH")?;
    let root = exec::workspace_root();
    let fuzz_dir = root.join("fuzz");
    // the pinned stable toolchain with RUSTC_BOOTSTRAP=1 takes the
    // sanitizer's -Z flags; its asan runtime ships with the std component
    let cargo_fuzz = |args: &[&str]| {
        let mut c = Command::new("cargo");
        c.arg("fuzz").args(args).current_dir(&root).env("PATH", &path).env("RUSTC_BOOTSTRAP", "1");
        c
    };
    exec::run(&mut cargo_fuzz(&["build", "--fuzz-dir", "fuzz"]))?;
    for target in TARGETS {
        let corpus = fuzz_dir.join("corpus").join(target);
        fs::create_dir_all(&corpus).with_context(|| format!("cannot create {}", corpus.display()))?;
        let seeds = fuzz_dir.join("seeds").join(target);
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        let mut c = cargo_fuzz(&["run", "--fuzz-dir", "fuzz", target]);
        // the first corpus dir receives what is new; the seeds stay as committed
        c.arg(&corpus).arg(&seeds).arg("--").arg(format!("-max_total_time={seconds}")).arg("-rss_limit_mb=2048");
        exec::run(&mut c)
            .with_context(|| format!("fuzz target {target} failed; its input is in fuzz/artifacts/{target}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_in_fuzz_cargo_toml_is_run_and_has_seeds() {
        let fuzz = exec::workspace_root().join("fuzz");
        let manifest = fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
        let mut bins: Vec<&str> = manifest
            .split("[[bin]]")
            .skip(1)
            .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("name = \"")?.strip_suffix('"')))
            .collect();
        bins.sort_unstable();
        let mut run = TARGETS.to_vec();
        run.sort_unstable();
        assert_eq!(bins, run);
        for t in TARGETS {
            let seeds = fs::read_dir(fuzz.join("seeds").join(t)).map(|d| d.count()).unwrap_or(0);
            assert!(seeds > 0, "fuzz/seeds/{t} is empty");
        }
    }
}
