//! Whether this kernel offers the conntrack kfuncs the fast path calls,
//! read here without the agent's code, so a test can tell the agent's
//! "unavailable" from a fast path that should have been on.
//!
//! They are in vmlinux's BTF where conntrack is built in, else in the
//! `nf_conntrack` module's once it is loaded (Debian's 6.1 and 6.12). On a
//! node kube-proxy's conntrack rules load the module before the agent
//! starts; the matrix guests have no kube-proxy running, so [`like_a_node`]
//! loads it there (only there, where xtask sets `EDGEVX_TEST_GUEST`: the
//! guest is thrown away, the host is not ours to change).
use std::process::Command;

use anyhow::{Context, Result, ensure};

const KFUNC: &[u8] = b"\0bpf_skb_ct_lookup\0";

/// Whether the kernel's BTF (vmlinux's, or conntrack's module's if loaded)
/// names `bpf_skb_ct_lookup`.
pub fn offered() -> bool {
    ["/sys/kernel/btf/vmlinux", "/sys/kernel/btf/nf_conntrack"]
        .iter()
        .filter_map(|p| std::fs::read(p).ok())
        .any(|btf| btf.windows(KFUNC.len()).any(|w| w == KFUNC))
}

/// In a matrix guest, loads conntrack's module as kube-proxy would on a
/// node; elsewhere does nothing.
pub fn like_a_node() -> Result<()> {
    if std::env::var_os("EDGEVX_TEST_GUEST").is_none() || std::path::Path::new("/sys/module/nf_conntrack").exists() {
        return Ok(());
    }
    let status = Command::new("modprobe").arg("nf_conntrack").status().context("cannot run modprobe")?;
    ensure!(status.success(), "modprobe nf_conntrack failed ({status})");
    Ok(())
}
