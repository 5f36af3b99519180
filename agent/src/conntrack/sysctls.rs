//! The conntrack sysctls the fast path follows (fast-path.md §B.4 step 6):
//! per network namespace, read from the calling thread's.
use std::path::Path;

use anyhow::{Context, Result};

const DIR: &str = "/proc/sys/net/netfilter";

/// The values, timeouts in seconds as the sysctls hold them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtSysctls {
    /// `nf_conntrack_tcp_be_liberal`: every TCP entry is tracked liberally.
    pub tcp_be_liberal: bool,
    pub tcp_timeout_established: u32,
    pub tcp_timeout_unacknowledged: u32,
    pub udp_timeout_stream: u32,
}

fn read(name: &str) -> Result<u32> {
    let path = Path::new(DIR).join(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    text.trim().parse().with_context(|| format!("{} holds {:?}, not a number", path.display(), text.trim()))
}

/// Reads them now (an error if conntrack is not in this kernel).
pub fn read_ct_sysctls() -> Result<CtSysctls> {
    Ok(CtSysctls {
        tcp_be_liberal: read("nf_conntrack_tcp_be_liberal")? != 0,
        tcp_timeout_established: read("nf_conntrack_tcp_timeout_established")?,
        tcp_timeout_unacknowledged: read("nf_conntrack_tcp_timeout_unacknowledged")?,
        udp_timeout_stream: read("nf_conntrack_udp_timeout_stream")?,
    })
}
