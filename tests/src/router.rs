//! A second underlay segment behind a router: a router namespace with one
//! leg on the cluster's switch (198.18.0.254/24) and one on a far segment
//! 198.18.1.0/24, where a node moved off the switch lives. For
//! DirectRouting: the nodes on the switch are on-link to each other, the
//! far node is reachable only through the router.
use std::net::Ipv4Addr;

use anyhow::Result;

use crate::{
    netns::Netns,
    sh,
    topo::{Cluster, Host, subnet},
};

/// The router's address on the switch.
pub const ROUTER_NEAR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 254);
/// The router's address on the far segment.
pub const ROUTER_FAR: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 254);
/// The far segment.
pub const FAR_SEGMENT: &str = "198.18.1.0/24";

/// Node `i`'s underlay address once it sits on the far segment.
pub fn far_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, i)
}

/// The router namespace; deleted (with its links) on drop.
pub struct Router {
    pub ns: Netns,
}

impl Router {
    /// Plugs a router into `cluster`'s switch and moves node `i` off the
    /// switch, onto the far segment behind it: node `i`'s `eth0` becomes a
    /// veth to the router's `eth1`, address [`far_ip`]`(i)/24`, default
    /// route via [`ROUTER_FAR`]. Its pod and `cni0` stay as they were.
    pub fn behind(cluster: &Cluster, i: u8) -> Result<Self> {
        let ns = Netns::new(&format!("{}rt", cluster.tag))?;
        cluster.plug(&ns, "swrt")?;
        ns.ip(&["addr", "add", &format!("{ROUTER_NEAR}/24"), "dev", "eth0"])?;
        ns.ip(&["link", "set", "eth0", "up"])?;
        ns.sysctl("net.ipv4.ip_forward", "1")?;
        // deleting the switch port deletes its veth peer, node i's eth0
        cluster.switch.ip(&["link", "del", &format!("sw{i}")])?;
        let node = &cluster.host(i).ns;
        sh(&[
            "ip", "link", "add", "eth1", "netns", &ns.name, "type", "veth", "peer", "name", "eth0", "netns", &node.name,
        ])?;
        ns.ip(&["addr", "add", &format!("{ROUTER_FAR}/24"), "dev", "eth1"])?;
        ns.ip(&["link", "set", "eth1", "up"])?;
        node.ip(&["addr", "add", &format!("{}/24", far_ip(i)), "dev", "eth0"])?;
        node.ip(&["link", "set", "eth0", "up"])?;
        node.ip(&["route", "add", "default", "via", &ROUTER_FAR.to_string()])?;
        Ok(Router { ns })
    }

    /// A node on the switch reaches the far segment through the router:
    /// `ip route add 198.18.1.0/24 via 198.18.0.254`.
    pub fn route_far_segment(&self, host: &Host) -> Result<()> {
        host.ns.ip(&["route", "add", FAR_SEGMENT, "via", &ROUTER_NEAR.to_string()]).map(|_| ())
    }
}

/// What flanneld installs for a lease it encapsulates to (arp, fdb, route,
/// in its order), for subnet 10.244.<subnet_of>.0/24 at `public_ip`.
pub fn kernel_add_lease_at(host: &Host, subnet_of: u8, public_ip: Ipv4Addr, mac: &str) -> Result<()> {
    let gw = format!("10.244.{subnet_of}.0");
    host.ns.ip(&["neigh", "replace", &gw, "lladdr", mac, "dev", "flannel.1", "nud", "permanent"])?;
    let dst = public_ip.to_string();
    host.ns.run(&["bridge", "fdb", "replace", mac, "dev", "flannel.1", "dst", &dst, "self", "permanent"])?;
    host.ns.ip(&["route", "replace", &subnet(subnet_of), "via", &gw, "dev", "flannel.1", "onlink"])?;
    Ok(())
}

/// Counts frames crossing the switch with nftables' bridge family (the
/// `forward` hook sees every frame the switch passes between ports): a
/// neutral observer of what is on the wire, outside every node.
pub struct WireCounters<'a> {
    switch: &'a Netns,
}

impl<'a> WireCounters<'a> {
    pub fn new(cluster: &'a Cluster) -> Result<Self> {
        let sw = &cluster.switch;
        sw.run(&["nft", "add", "table", "bridge", "evxwire"])?;
        sw.run(&["nft", "add", "chain", "bridge", "evxwire", "wire", "{ type filter hook forward priority 0; }"])?;
        Ok(WireCounters { switch: sw })
    }

    /// A named counter of the frames matching `rule` (nft syntax, e.g.
    /// `ip saddr 198.18.0.1 udp dport 8472`).
    pub fn count(&self, name: &str, rule: &str) -> Result<()> {
        self.switch.run(&["nft", "add", "counter", "bridge", "evxwire", name])?;
        let mut args = vec!["nft", "add", "rule", "bridge", "evxwire", "wire"];
        args.extend(rule.split_whitespace());
        args.extend(["counter", "name", name]);
        self.switch.run(&args).map(|_| ())
    }

    /// The packets counted so far under `name`.
    pub fn packets(&self, name: &str) -> Result<u64> {
        let out = self.switch.run(&["nft", "-j", "list", "counter", "bridge", "evxwire", name])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        v["nftables"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|e| e["counter"]["packets"].as_u64())
            .ok_or_else(|| anyhow::anyhow!("no counter {name} in {out}"))
    }
}
