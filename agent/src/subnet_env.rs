//! `/run/flannel/subnet.env`, as flanneld writes it, so the standard flannel
//! CNI plugin works unchanged. Written like a state file (see `state.rs`):
//! atomically, never through a symlink, in a directory nobody else may
//! write; a missing directory is created 0755 (the CNI plugin reads it).
use std::{fmt::Write as _, net::Ipv6Addr, path::Path};

use anyhow::Result;
use ipnet::{Ipv4Net, Ipv6Net};

use crate::state::{ensure_dir, write_atomic};

/// The file's text, in flanneld's order (pkg/subnet `WriteSubnetFile`).
/// FLANNEL_SUBNET is the subnet's first host address with the subnet's
/// length (the bridge gateway), e.g. `10.244.1.1/24` (`v4` = the network
/// and our subnet); with IPv6 on (`v6` = the IPv6 network and our IPv6
/// subnet) FLANNEL_IPV6_SUBNET is the same for IPv6, e.g.
/// `fd00:10:244:1::1/64`. An IPv6-only network has only the IPv6 lines,
/// as flannel writes them.
pub fn render(v4: Option<(Ipv4Net, Ipv4Net)>, v6: Option<(Ipv6Net, Ipv6Net)>, mtu: u32, ip_masq: bool) -> String {
    let mut text = String::new();
    if let Some((network, subnet)) = v4 {
        let gateway = std::net::Ipv4Addr::from(u32::from(subnet.network()).wrapping_add(1));
        // writing to a String cannot fail
        let _ = write!(text, "FLANNEL_NETWORK={network}\nFLANNEL_SUBNET={gateway}/{}\n", subnet.prefix_len());
    }
    if let Some((network6, subnet6)) = v6 {
        let gateway6 = Ipv6Addr::from(u128::from(subnet6.network()).wrapping_add(1));
        let _ =
            write!(text, "FLANNEL_IPV6_NETWORK={network6}\nFLANNEL_IPV6_SUBNET={gateway6}/{}\n", subnet6.prefix_len());
    }
    let _ = write!(text, "FLANNEL_MTU={mtu}\nFLANNEL_IPMASQ={ip_masq}\n");
    text
}

pub fn write(
    path: &Path,
    v4: Option<(Ipv4Net, Ipv4Net)>,
    v6: Option<(Ipv6Net, Ipv6Net)>,
    mtu: u32,
    ip_masq: bool,
) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        ensure_dir(dir, 0o755)?;
    }
    Ok(write_atomic(path, render(v4, v6, mtu, ip_masq).as_bytes(), 0o644)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_flannel_sample() {
        let s = render(Some(("10.1.0.0/16".parse().unwrap(), "10.1.74.0/24".parse().unwrap())), None, 1472, false);
        assert_eq!(
            s,
            "FLANNEL_NETWORK=10.1.0.0/16\nFLANNEL_SUBNET=10.1.74.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n"
        );
    }

    #[test]
    fn dual_stack_matches_flannels_order() {
        let v6 = Some(("fd00:10:244::/56".parse().unwrap(), "fd00:10:244:1::/64".parse().unwrap()));
        let s = render(Some(("10.244.0.0/16".parse().unwrap(), "10.244.1.0/24".parse().unwrap())), v6, 1450, true);
        assert_eq!(
            s,
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n\
             FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\n\
             FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
        );
    }

    #[test]
    fn ipv6_only_has_only_the_ipv6_lines() {
        let v6 = Some(("fd00:10:244::/56".parse().unwrap(), "fd00:10:244:1::/64".parse().unwrap()));
        assert_eq!(
            render(None, v6, 1430, false),
            "FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\n\
             FLANNEL_MTU=1430\nFLANNEL_IPMASQ=false\n"
        );
    }
}
