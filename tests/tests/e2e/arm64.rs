//! The arm64 build, on this x86_64 machine (`cargo xtask image --arch
//! all` builds it; `cargo xtask test` passes the paths in):
//!
//! - the static arm64 edgevx runs its command line under qemu-user
//!   (Debian's qemu-user-static) and refuses bad input naming the culprit;
//! - the arm64 edgevx-ipam and Debian's own arm64 host-local share one
//!   store both ways, as the native pair does (ipam.rs);
//! - every binary is the architecture it claims, and the eBPF object is
//!   little-endian BPF, which both architectures load;
//! - one OCI index serves both images under one tag.
//!
//! qemu-user passes neither bpf() (ENOSYS) nor netfilter netlink through,
//! so loading the programs and running the image's iptables on arm64 need
//! an arm64 kernel: docs/src/kernels.md says what was run where.
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::{
    ipam::Plugin,
    nodes::{flannel_node, node_list, write},
};
use serde_json::Value;

use crate::ipam::{host_local_takes_over_an_ipam_store_of, takes_over_a_host_local_store};

/// The static arm64 agent.
const BIN_ENV: &str = "EDGEVX_ARM64_BIN";
/// The multi-arch OCI archive (`cargo xtask image --arch all`).
const INDEX_ENV: &str = "EDGEVX_IMAGE_INDEX";

fn from_env(var: &str) -> Result<PathBuf> {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .with_context(|| format!("{var} is not set: run the arm64 tests through `cargo xtask test`"))?;
    ensure!(path.exists(), "{var}={} does not exist", path.display());
    Ok(path)
}

fn qemu(bin: &Path) -> Command {
    let mut c = Command::new("qemu-aarch64-static");
    c.arg(bin);
    c
}

#[test]
fn arm64_edgevx_runs_its_command_line_and_refuses_bad_input_naming_the_culprit() -> Result<()> {
    let bin = from_env(BIN_ENV)?;
    let out = qemu(&bin).arg("--version").output()?;
    let version = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success() && version.starts_with("edgevx "), "--version: {version:?}");
    let dir = std::env::temp_dir().join(edgevx_tests::unique("arm64"));
    fs::create_dir_all(&dir)?;
    let _gone = Removed(dir.clone());
    let conf = dir.join("net-conf.json");
    fs::write(&conf, r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":0}}"#)?;
    let no_stack = dir.join("no-stack.json");
    fs::write(&no_stack, r#"{"Network":"10.244.0.0/16","EnableIPv4":false,"Backend":{"Type":"vxlan"}}"#)?;
    let nodes = dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let (conf, no_stack, nodes) = (s(&conf), s(&no_stack), s(&nodes));
    let state = dir.join("state").to_string_lossy().into_owned();
    // (arguments after `run --state-dir D`, culprit)
    let cases: &[(&[&str], &str)] = &[
        (&["--node-name", "node1", "--nodes-file", &nodes, "--net-conf", &conf], "Backend.VNI"),
        (&["--node-name", "node1", "--nodes-file", &nodes, "--net-conf", &no_stack], "none defined stack"),
        (&["--node-name", "node1", "--nodes-file", &nodes, "--public-ip", "300.1.1.1"], "300.1.1.1"),
        (&["--node-name", "node1", "--nodes-file", &nodes, "--kube-annotation-prefix", "a/b/c"], "a/b/c"),
        (&["--node-name", "node1", "--nodes-file", &nodes, "--kube"], "exactly one source"),
        (&["--node-name", "node1", "--nodes-file", &nodes, "--bypass-netfilter", "--host-routing"], "contradict"),
    ];
    for (args, culprit) in cases {
        let out = qemu(&bin).args(["run", "--state-dir", &state]).args(*args).env_remove("NODE_NAME").output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(out.status.code() == Some(2), "{args:?}: exit {:?}, want 2: {err}", out.status.code());
        ensure!(err.contains(culprit), "{args:?}: the error should name {culprit}: {err}");
    }
    ensure!(!Path::new(&state).join("vtep-mac").exists(), "a refused start wrote state");
    Ok(())
}

struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn arm64_edgevx_ipam_and_debians_arm64_host_local_take_over_each_others_store() -> Result<()> {
    takes_over_a_host_local_store(Plugin::EdgevxIpamArm64, Plugin::HostLocalArm64)?;
    host_local_takes_over_an_ipam_store_of(Plugin::EdgevxIpamArm64, Plugin::HostLocalArm64)
}

/// ELF's e_machine values.
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;
const EM_BPF: u16 = 247;

/// (64-bit, little-endian, e_machine, has an interpreter) of an ELF file.
fn elf(path: &Path) -> Result<(bool, bool, u16, bool)> {
    let b = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    ensure!(b.len() > 64 && b[..4] == *b"\x7fELF", "{} is not ELF", path.display());
    let (class64, little) = (b[4] == 2, b[5] == 1);
    ensure!(class64 && little, "{}: class {} data {}: want 64-bit little-endian", path.display(), b[4], b[5]);
    let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let machine = u16_at(18);
    let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54) as usize, u16_at(56) as usize);
    let interp = (0..phnum).any(|i| {
        let at = phoff + i * phentsize;
        b.get(at..at + 4).is_some_and(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]) == 3)
    });
    Ok((class64, little, machine, interp))
}

#[test]
fn each_binary_is_the_architecture_it_claims_and_the_ebpf_object_is_little_endian_bpf() -> Result<()> {
    let arm64 = from_env(BIN_ENV)?;
    let ipam = from_env(edgevx_tests::ipam::ARM64_IPAM_ENV)?;
    for (path, machine) in [(arm64, EM_AARCH64), (ipam, EM_AARCH64), (edgevx_tests::edgevx_bin(), EM_X86_64)] {
        let (_, _, m, interp) = elf(&path)?;
        ensure!(m == machine, "{}: e_machine {m}, want {machine}", path.display());
        if machine == EM_AARCH64 {
            ensure!(!interp, "{} asks for a dynamic loader: the image has none for it", path.display());
        }
    }
    // the object both agents embed: bpfel, which x86_64 and arm64 (little-endian) kernels load
    let object = from_env("EDGEVX_EBPF_OBJECT")?;
    let (_, little, m, _) = elf(&object)?;
    ensure!(m == EM_BPF && little, "{}: e_machine {m}: want little-endian BPF", object.display());
    Ok(())
}

#[test]
fn one_oci_index_serves_amd64_and_arm64_under_one_tag() -> Result<()> {
    let archive = from_env(INDEX_ENV)?;
    let dir = std::env::temp_dir().join(edgevx_tests::unique("index"));
    fs::create_dir_all(&dir)?;
    let _gone = Removed(dir.clone());
    let out = Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&dir).output()?;
    ensure!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    let blob = |digest: &str| -> Result<Value> {
        let hex = digest.strip_prefix("sha256:").with_context(|| format!("digest {digest}"))?;
        Ok(serde_json::from_slice(&fs::read(dir.join("blobs/sha256").join(hex))?)?)
    };
    let top: Value = serde_json::from_slice(&fs::read(dir.join("index.json"))?)?;
    let [entry] = top["manifests"].as_array().map(Vec::as_slice).unwrap_or_default() else {
        bail!("want one entry in index.json: {top}");
    };
    let tag = entry["annotations"]["org.opencontainers.image.ref.name"].as_str().unwrap_or_default();
    ensure!(tag.starts_with("ghcr.io/edgevx/edgevx:") && !tag.ends_with(":latest"), "tag {tag}");
    ensure!(entry["mediaType"] == "application/vnd.oci.image.index.v1+json", "not an index: {entry}");
    let index = blob(entry["digest"].as_str().unwrap_or_default())?;
    let mut arches = Vec::new();
    for m in index["manifests"].as_array().into_iter().flatten() {
        let arch = m["platform"]["architecture"].as_str().unwrap_or_default().to_string();
        ensure!(m["platform"]["os"] == "linux", "{m}");
        // the image's own config says the same architecture
        let manifest = blob(m["digest"].as_str().unwrap_or_default())?;
        let config = blob(manifest["config"]["digest"].as_str().unwrap_or_default())?;
        ensure!(config["architecture"] == arch.as_str(), "{arch}: its config says {}", config["architecture"]);
        arches.push(arch);
    }
    arches.sort();
    ensure!(arches == ["amd64", "arm64"], "the index serves {arches:?}");
    Ok(())
}
