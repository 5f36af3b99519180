//! `cargo xtask test --host debian11 [filter]`: the systemd path on a real
//! host, booted, not on this machine's userland: a Debian 11 root built
//! from Debian's packages ([`root`]) boots its own kernel with its own
//! systemd as PID 1 in QEMU ([`machine`]), its NIC on a kernel flannel
//! peer in a network namespace of this machine ([`peer`]); edgevx is
//! installed from the release tarball by README.md's own lines
//! ([`install`]), and the tests ([`debian11`]) drive the guest through the
//! QEMU guest agent ([`qga`]).
//!
//! The tests live here and not in a libtest binary: they share one guest,
//! in order, across its reboots (a reboot is a test's subject, not a
//! fixture), and what they need is what the xtask already owns: QEMU, the
//! packages, the cache, the release tarball.
//!
//! Results, the console logs and the guest's whole journal go to
//! `target/host/debian11/`.
mod debian11;
mod install;
mod machine;
mod peer;
mod qga;
mod readme;
mod root;

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::{deps::packages, exec};

/// The hosts `--host` knows.
const HOSTS: &[&str] = &["debian11"];

/// How one test ended.
struct Outcome {
    name: &'static str,
    took: Duration,
    failure: Option<String>,
}

pub fn run(host: &str, filter: Option<&str>) -> Result<()> {
    let chosen = select(host, filter)?;
    ensure_tools()?;
    let started = Instant::now();
    let out = exec::workspace_root().join("target/host").join(host);
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    // README.md first: a wrong VERSION= fails before minutes of building
    let blocks = install::blocks()?;
    let tarball = install::stage(&out.join("work"), &blocks)?;
    eprintln!("xtask: the release tarball in {} s", started.elapsed().as_secs());
    let building = Instant::now();
    let image = root::ensure()?;
    let root_secs = building.elapsed().as_secs();
    eprintln!("xtask: the Debian 11 root in {root_secs} s");
    machine::work_disk(&out.join("work"), &out.join("work.img"))?;
    let peer = peer::Peer::create()?;
    let booting = Instant::now();
    let mut m = machine::Machine::boot(&image, &out.join("work.img"), &peer, &out)?;
    let state = m.wait_for_startup()?;
    eprintln!("xtask: Debian 11 up under {} in {} s (systemd: {state})", m.accel, booting.elapsed().as_secs());
    let installing = Instant::now();
    let node = match install::install(&mut m, &peer, &tarball) {
        Ok(node) => node,
        Err(e) => {
            save_journal(&mut m, &out);
            m.poweroff();
            return Err(e.context("the install as README.md says failed; no test ran"));
        }
    };
    eprintln!("xtask: installed as README.md says and active in {} s", installing.elapsed().as_secs());
    let installed = installing.elapsed();
    let mut bed = debian11::Bed { m, peer, node };
    let mut outcomes = run_tests(&mut bed, &chosen);
    let mut count = chosen.len();
    // the ready test fails on a workaround; without it, the install does
    let ready_ran = chosen.iter().any(|(name, _)| name.starts_with("ready::"));
    if let Some(why) = bed.node.workaround.as_ref().filter(|_| !ready_ran) {
        let failure = Some(format!("the unit as shipped never became active:\n{why}"));
        outcomes.insert(0, Outcome { name: "install::the_readme_blocks_as_they_are", took: installed, failure });
        count += 1;
    }
    save_journal(&mut bed.m, &out);
    bed.m.poweroff();
    report(&outcomes, count, &out, started.elapsed(), root_secs)
}

/// The tests of `host` whose names contain one of `filter`'s words (all
/// without a filter).
fn select(host: &str, filter: Option<&str>) -> Result<Vec<&'static (&'static str, debian11::TestFn)>> {
    if !HOSTS.contains(&host) {
        bail!("unknown host {host:?}: the hosts are {}", HOSTS.join(", "));
    }
    let words: Vec<&str> = filter.map(|f| f.split_whitespace().collect()).unwrap_or_default();
    if filter.is_some() && words.is_empty() {
        bail!("the filter {filter:?} names no test: give one or more, separated by spaces, or none for all");
    }
    let chosen: Vec<_> =
        debian11::TESTS.iter().filter(|(name, _)| words.is_empty() || words.iter().any(|w| name.contains(w))).collect();
    if chosen.is_empty() {
        let names: Vec<&str> = debian11::TESTS.iter().map(|(n, _)| *n).collect();
        bail!("no test of --host {host} matches {words:?}; they are:\n  {}", names.join("\n  "));
    }
    Ok(chosen)
}

/// Root, and what the job runs on this machine.
fn ensure_tools() -> Result<()> {
    if exec::output(std::process::Command::new("id").arg("-u")).map(|u| u.trim() != "0").unwrap_or(true) {
        bail!("--host boots QEMU in a network namespace of its own and builds a root with debootstrap: it needs root");
    }
    packages::ensure_build()?;
    packages::ensure_host()?;
    // mkfs.ext4 comes with e2fsprogs, part of every Debian system (and not
    // purgeable, so it is not in the package list .ci/run removes)
    exec::run(std::process::Command::new("sh").args(["-c", "command -v mkfs.ext4 >/dev/null"]))
        .context("missing: mkfs.ext4 (apt-get install e2fsprogs)")
}

/// Runs `chosen` in order on the one guest; a test's failure does not stop
/// the next, a guest that no longer answers does.
fn run_tests(bed: &mut debian11::Bed, chosen: &[&(&'static str, debian11::TestFn)]) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for (name, test) in chosen {
        eprintln!("xtask: test {name} ...");
        let since = Instant::now();
        let failure = test(bed).err().map(|e| format!("{e:#}"));
        let took = since.elapsed();
        eprintln!("xtask: test {name} ... {} ({} s)", if failure.is_some() { "FAILED" } else { "ok" }, took.as_secs());
        if let Some(e) = &failure {
            eprintln!("{e}");
        }
        outcomes.push(Outcome { name, took, failure });
        if bed.m.boot_id().is_err() {
            eprintln!("xtask: the guest no longer answers; the tests after this one are not run");
            break;
        }
    }
    outcomes
}

/// The last `n` lines of `text`, for a failure's message.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The guest's whole journal (every boot: it is persistent) into `out`.
fn save_journal(m: &mut machine::Machine, out: &Path) {
    if let Ok(o) = m.exec("journalctl -o short-monotonic --no-pager", Duration::from_secs(300)) {
        let _ = fs::write(out.join("journal.log"), o.stdout);
    }
}

fn report(outcomes: &[Outcome], chosen: usize, out: &Path, total: Duration, root_secs: u64) -> Result<()> {
    let failed: Vec<&str> = outcomes.iter().filter(|o| o.failure.is_some()).map(|o| o.name).collect();
    let mut text = String::new();
    for o in outcomes {
        text += &format!("{} {} ({} s)\n", if o.failure.is_some() { "FAILED" } else { "ok" }, o.name, o.took.as_secs());
        if let Some(e) = &o.failure {
            text += &format!("    {}\n", e.replace('\n', "\n    "));
        }
    }
    let not_run = chosen - outcomes.len();
    text += &format!(
        "{} passed, {} failed, {not_run} not run, in {} s (the root: {root_secs} s)\n",
        outcomes.len() - failed.len(),
        failed.len(),
        total.as_secs()
    );
    let _ = fs::write(out.join("results.txt"), &text);
    eprint!("{text}");
    eprintln!("xtask: logs in {}", out.display());
    if !failed.is_empty() || not_run > 0 {
        bail!(
            "--host debian11: {} of {chosen} tests failed or did not run: {}",
            failed.len() + not_run,
            failed.join(", ")
        );
    }
    Ok(())
}
