//! `/run/flannel/subnet.env`, as flanneld writes it, so the standard flannel
//! CNI plugin works unchanged. Written like a state file (see `state.rs`):
//! atomically, never through a symlink, in a directory nobody else may
//! write; a missing directory is created 0755 (the CNI plugin reads it).
use std::path::Path;

use anyhow::Result;
use ipnet::Ipv4Net;

use crate::state::{ensure_dir, write_atomic};

/// The file's text. FLANNEL_SUBNET is the subnet's first host address with
/// the subnet's length (the bridge gateway), e.g. `10.244.1.1/24`.
pub fn render(network: Ipv4Net, subnet: Ipv4Net, mtu: u32, ip_masq: bool) -> String {
    let gateway = u32::from(subnet.network()).wrapping_add(1);
    format!(
        "FLANNEL_NETWORK={network}\nFLANNEL_SUBNET={}/{}\nFLANNEL_MTU={mtu}\nFLANNEL_IPMASQ={ip_masq}\n",
        std::net::Ipv4Addr::from(gateway),
        subnet.prefix_len()
    )
}

pub fn write(path: &Path, network: Ipv4Net, subnet: Ipv4Net, mtu: u32, ip_masq: bool) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ensure_dir(dir, 0o755)?;
    }
    Ok(write_atomic(path, render(network, subnet, mtu, ip_masq).as_bytes(), 0o644)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_flannel_sample() {
        let s = render("10.1.0.0/16".parse().unwrap(), "10.1.74.0/24".parse().unwrap(), 1472, false);
        assert_eq!(
            s,
            "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n"
        );
    }
}
