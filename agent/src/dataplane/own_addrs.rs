//! Every address this node owns, as the kernel says (`ip -o addr show`):
//! each interface's addresses, and for IPv4 the network and broadcast
//! addresses of their prefixes (`brd`). No peer may claim one of them as
//! its public IP: VXLAN "from" it would be accepted from anyone able to
//! spoof this node's own addresses, and VXLAN "to" it would loop back here.
use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr},
};

use anyhow::{Context, Result};
use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    Handle,
    packet_route::{address::AddressAttribute, link::LinkAttribute},
};

/// Address → what it is (`"on cni0"`, `"the broadcast address of eth0"`).
pub type OwnAddrs = BTreeMap<IpAddr, String>;

/// Reads the node's addresses in this network namespace.
pub async fn read(handle: &Handle) -> Result<OwnAddrs> {
    let mut names = HashMap::new();
    let mut links = handle.link().get().execute();
    while let Some(link) = links.try_next().await.context("cannot list the interfaces")? {
        let name = link.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        });
        names.insert(link.header.index, name.unwrap_or_else(|| format!("ifindex {}", link.header.index)));
    }
    let mut own = OwnAddrs::new();
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await.context("cannot list the node's addresses")? {
        let iface = names.get(&msg.header.index).cloned().unwrap_or_else(|| format!("ifindex {}", msg.header.index));
        for a in &msg.attributes {
            match a {
                AddressAttribute::Local(ip) | AddressAttribute::Address(ip) => {
                    own.entry(*ip).or_insert_with(|| format!("on {iface}"));
                    if let IpAddr::V4(v4) = ip {
                        for (special, what) in prefix_ends(*v4, msg.header.prefix_len) {
                            own.entry(IpAddr::V4(special)).or_insert_with(|| format!("the {what} address of {iface}"));
                        }
                    }
                }
                AddressAttribute::Broadcast(b) => {
                    own.entry(IpAddr::V4(*b)).or_insert_with(|| format!("the broadcast address of {iface}"));
                }
                _ => {}
            }
        }
    }
    Ok(own)
}

/// The network and broadcast addresses of `ip/len`, where the prefix has
/// them (not /31 and /32, RFC 3021).
fn prefix_ends(ip: Ipv4Addr, len: u8) -> Vec<(Ipv4Addr, &'static str)> {
    match Ipv4Net::new(ip, len) {
        Ok(net) if len < 31 => vec![(net.network(), "network"), (net.broadcast(), "broadcast")],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_has_its_network_and_broadcast_but_not_a_point_to_point_one() {
        let ip: Ipv4Addr = "192.168.7.9".parse().unwrap();
        let ends = prefix_ends(ip, 24);
        assert_eq!(
            ends,
            [("192.168.7.0".parse().unwrap(), "network"), ("192.168.7.255".parse().unwrap(), "broadcast")]
        );
        assert!(prefix_ends(ip, 31).is_empty());
        assert!(prefix_ends(ip, 32).is_empty());
    }
}
