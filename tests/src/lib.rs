//! Test hosts in network namespaces: nodes joined by a veth underlay in
//! 198.18.0.0/15, pods behind a `cni0` bridge as the flannel CNI plugin
//! builds them, and either an edgevx agent or a kernel VXLAN device set up
//! exactly as flanneld sets it up. Everything made here is removed on drop,
//! also when a test fails.
pub mod agent;
pub mod cni;
pub mod ct_kfuncs;
pub mod dual;
pub mod etcd;
pub mod flows;
pub mod ipam;
pub mod ipam_pod;
pub mod kube_proxy;
pub mod kubeapi;
pub mod mount_ns;
pub mod netns;
pub mod nodes;
pub mod operator;
pub mod pki;
pub mod real_node;
pub mod router;
pub mod scenario;
pub mod topo;
pub mod traffic;
pub mod xdpgen;

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, bail};

/// How much longer than natively the harness waits for things to happen:
/// `EDGEVX_TEST_PATIENCE` (a factor, default 1). The kernel matrix runs the
/// tests in an emulated guest (QEMU's TCG), where everything takes several
/// times longer; a wait is a bound on "never happened", not a timed
/// assertion, so stretching it changes what a test proves nowhere.
pub fn patience(wait: Duration) -> Duration {
    let factor = std::env::var("EDGEVX_TEST_PATIENCE").ok().and_then(|f| f.parse::<u32>().ok()).unwrap_or(1).max(1);
    wait * factor
}

/// Runs a command, failing with its stderr if it fails.
pub fn sh(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0]).args(&args[1..]).output().with_context(|| format!("cannot run {args:?}"))?;
    if !out.status.success() {
        bail!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The edgevx binary under test (`EDGEVX_BIN`, else target/release/edgevx).
pub fn edgevx_bin() -> PathBuf {
    std::env::var_os("EDGEVX_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/edgevx"))
}

/// A short name unique to this process and call, for namespaces and dirs.
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("evx{}{}{}", std::process::id() % 100000, tag, N.fetch_add(1, Ordering::Relaxed))
}
