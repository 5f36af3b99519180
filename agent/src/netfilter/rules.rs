//! What the rules are: a pure function of the network, our subnet and the
//! options, so the same input always gives the same rules in the same order.
use crate::family::Family;

/// kube-proxy's masquerade mark (`--masquerade-bit` 14): traffic it marks is
/// masqueraded by kube-proxy itself, so flannel's chain lets it pass.
pub const KUBE_PROXY_MARK: &str = "0x4000/0x4000";

/// One chain edgevx owns, its rules in order, and how it is hooked in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    pub table: &'static str,
    pub name: &'static str,
    /// The built-in chain that jumps here.
    pub parent: &'static str,
    /// Whether the jump goes first in the parent (else last).
    pub jump_first: bool,
    /// Rule specifications, as `iptables -A <name>` takes them.
    pub rules: Vec<String>,
}

impl Chain {
    /// The rule in `parent` that jumps here.
    pub fn jump(&self) -> String {
        jump_rule(self.name)
    }
}

/// The rule that jumps to our chain `name` from its built-in parent.
pub fn jump_rule(name: &str) -> String {
    format!("-m comment --comment \"edgevx {}\" -j {name}", name.to_lowercase())
}

pub const MASQ_CHAIN: &str = "EDGEVX-POSTRTG";
pub const FWD_CHAIN: &str = "EDGEVX-FWD";
pub const INPUT_CHAIN: &str = "EDGEVX-INPUT";

/// Every chain edgevx may own, for cleanup.
pub const ALL: [(&str, &str, &str); 3] =
    [("filter", "INPUT", INPUT_CHAIN), ("nat", "POSTROUTING", MASQ_CHAIN), ("filter", "FORWARD", FWD_CHAIN)];

/// The chains wanted on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    pub chains: Vec<Chain>,
}

/// What the rules depend on besides the family's networks: the flags, the
/// VXLAN port and what the kernel's socket-lookup guard can do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub vxlan_port: u16,
    /// flannel's `--ip-masq` chain.
    pub ip_masq: bool,
    /// flannel's `--iptables-forward-rules` chain.
    pub forward: bool,
    /// The underlay, when the socket-lookup guard cannot refuse a peer's
    /// VXLAN that arrives on another interface (`edgevx_guard_compat`,
    /// before Linux 5.17): a rule refuses it instead ([`vxlan_guard`]).
    pub vxlan_only_on: Option<String>,
}

/// The rules for `network` (the cluster's pod Network) and `subnet` (this
/// node's pod subnet): the VXLAN guard always, flannel's masquerade and
/// forward rules when asked. For IPv6, for `ip6tables`, the same
/// (flannel's `MasqIP6Rules` and its IPv6 forward rules): IPv6 has no
/// broadcast, and its multicast is ff00::/8.
pub fn plan<N: Family>(network: N, subnet: N, settings: &Settings) -> RuleSet {
    let Settings { vxlan_port, ip_masq, forward, vxlan_only_on } = settings;
    let mut chains = vec![vxlan_guard(*vxlan_port, N::IPV6, vxlan_only_on.as_deref())];
    let (n, s, m) = (network.to_string(), subnet.to_string(), N::MULTICAST);
    if *ip_masq {
        chains.push(Chain {
            table: "nat",
            name: MASQ_CHAIN,
            parent: "POSTROUTING",
            jump_first: true,
            rules: vec![
                // kube-proxy masquerades what it marked; doing it twice breaks
                // checksums on older kernels (flannel#1279, kubernetes#88986)
                format!("-m mark --mark {KUBE_PROXY_MARK} -j RETURN"),
                // pod to pod keeps its source, on this node and across nodes
                format!("-s {n} -d {n} -j RETURN"),
                // traffic from outside to our pods arrives as it was sent
                format!("! -s {n} -d {s} -j RETURN"),
                // pods to anywhere outside the Network, except multicast
                format!("-s {n} ! -d {m} -j MASQUERADE --random-fully"),
                // the host (or a NodePort client) towards remote pods
                format!("! -s {n} -d {n} -j MASQUERADE --random-fully"),
            ],
        });
    }
    if *forward {
        chains.push(Chain {
            table: "filter",
            name: FWD_CHAIN,
            parent: "FORWARD",
            jump_first: false,
            rules: vec![format!("-s {n} -j ACCEPT"), format!("-d {n} -j ACCEPT")],
        });
    }
    RuleSet { chains }
}

/// `filter/EDGEVX-INPUT`, jumped to first from INPUT: VXLAN sent to a
/// broadcast or multicast address, on any interface, is dropped.
///
/// The kernel hands such datagrams to every socket bound to the port
/// (`__udp4_lib_rcv` → `__udp4_lib_mcast_deliver`) without the socket
/// lookup the sk_lookup guard judges; a socket bound to 0.0.0.0 keeps
/// `IP_MULTICAST_ALL`, so it gets every group the interface has joined
/// (224.0.0.1 always). Decap judges them on the underlay, but nothing does
/// on another interface. No peer needs them: flannel sends VXLAN unicast to
/// each peer's public IP only. INPUT sees a datagram after reassembly
/// (`ip_local_deliver`), so fragments cannot slip past the port match.
/// The rules are written as `iptables -S` prints them back.
/// For IPv6 (`v6`) only multicast: there is no broadcast, and the kernel
/// delivers IPv6 multicast to every bound socket the same way
/// (`__udp6_lib_mcast_deliver`, `IPV6_MULTICAST_ALL` on by default).
///
/// With `only_on` (the underlay, on a kernel whose guard cannot read
/// `ingress_ifindex`), VXLAN arriving on any other interface is dropped
/// too: the full guard refuses a peer's there (decap, on the underlay
/// only, would not judge its inner source) and a stranger's anyway. INPUT
/// runs before the socket lookup, so on such a kernel this rule counts
/// what the full guard would.
fn vxlan_guard(port: u16, v6: bool, only_on: Option<&str>) -> Chain {
    let rule = |kind: &str| format!("-p udp -m udp --dport {port} -m addrtype --dst-type {kind} -j DROP");
    let kinds: &[&str] = if v6 { &["MULTICAST"] } else { &["BROADCAST", "MULTICAST"] };
    let mut rules: Vec<String> = kinds.iter().map(|k| rule(k)).collect();
    rules.extend(only_on.map(|iface| format!("! -i {iface} -p udp -m udp --dport {port} -j DROP")));
    Chain { table: "filter", name: INPUT_CHAIN, parent: "INPUT", jump_first: true, rules }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::{Ipv4Net, Ipv6Net};

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn settings(vxlan_port: u16, ip_masq: bool, forward: bool) -> Settings {
        Settings { vxlan_port, ip_masq, forward, vxlan_only_on: None }
    }

    /// The chains of `set` other than the broadcast and multicast guard.
    fn flannels(set: &RuleSet) -> Vec<&Chain> {
        set.chains.iter().filter(|c| c.name != INPUT_CHAIN).collect()
    }

    #[test]
    fn masquerade_rules_follow_flannel_in_order() {
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &settings(8472, true, false));
        let chains = flannels(&set);
        assert_eq!(chains.len(), 1);
        let c = chains[0];
        assert_eq!((c.table, c.name, c.parent, c.jump_first), ("nat", MASQ_CHAIN, "POSTROUTING", true));
        assert_eq!(
            c.rules,
            [
                "-m mark --mark 0x4000/0x4000 -j RETURN",
                "-s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN",
                "! -s 10.244.0.0/16 -d 10.244.1.0/24 -j RETURN",
                "-s 10.244.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully",
                "! -s 10.244.0.0/16 -d 10.244.0.0/16 -j MASQUERADE --random-fully",
            ]
        );
    }

    #[test]
    fn forward_rules_accept_the_network_both_ways_after_kube_proxy() {
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &settings(8472, false, true));
        let c = flannels(&set)[0];
        assert_eq!((c.table, c.name, c.parent, c.jump_first), ("filter", FWD_CHAIN, "FORWARD", false));
        assert_eq!(c.rules, ["-s 10.244.0.0/16 -j ACCEPT", "-d 10.244.0.0/16 -j ACCEPT"]);
    }

    #[test]
    fn nothing_asked_only_the_guard_planned() {
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &settings(8472, false, false));
        assert_eq!(set.chains.iter().map(|c| c.name).collect::<Vec<_>>(), [INPUT_CHAIN]);
    }

    #[test]
    fn broadcast_and_multicast_vxlan_is_dropped_first_in_input_whatever_the_flags() {
        for (ip_masq, forward) in [(false, false), (true, false), (false, true), (true, true)] {
            let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &settings(8472, ip_masq, forward));
            let c = &set.chains[0];
            assert_eq!((c.table, c.name, c.parent, c.jump_first), ("filter", INPUT_CHAIN, "INPUT", true));
            assert_eq!(
                c.rules,
                [
                    "-p udp -m udp --dport 8472 -m addrtype --dst-type BROADCAST -j DROP",
                    "-p udp -m udp --dport 8472 -m addrtype --dst-type MULTICAST -j DROP",
                ]
            );
        }
    }

    #[test]
    fn the_guard_follows_the_configured_port() {
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &settings(4789, false, false));
        assert!(set.chains[0].rules.iter().all(|r| r.contains("--dport 4789 ")), "{:?}", set.chains[0].rules);
    }

    #[test]
    fn the_ipv6_twins_spell_ipv6_networks_and_have_no_broadcast() {
        let net6 = |s: &str| -> Ipv6Net { s.parse().unwrap() };
        let set = plan(net6("fd00:10:244::/56"), net6("fd00:10:244:1::/64"), &settings(8472, true, true));
        assert_eq!(set.chains[0].rules, ["-p udp -m udp --dport 8472 -m addrtype --dst-type MULTICAST -j DROP"]);
        let masq = set.chains.iter().find(|c| c.name == MASQ_CHAIN).unwrap();
        assert_eq!(
            masq.rules,
            [
                "-m mark --mark 0x4000/0x4000 -j RETURN",
                "-s fd00:10:244::/56 -d fd00:10:244::/56 -j RETURN",
                "! -s fd00:10:244::/56 -d fd00:10:244:1::/64 -j RETURN",
                "-s fd00:10:244::/56 ! -d ff00::/8 -j MASQUERADE --random-fully",
                "! -s fd00:10:244::/56 -d fd00:10:244::/56 -j MASQUERADE --random-fully",
            ]
        );
        let fwd = set.chains.iter().find(|c| c.name == FWD_CHAIN).unwrap();
        assert_eq!(fwd.rules, ["-s fd00:10:244::/56 -j ACCEPT", "-d fd00:10:244::/56 -j ACCEPT"]);
    }

    #[test]
    fn cleanup_knows_every_chain_planned() {
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &settings(8472, true, true));
        for c in &set.chains {
            assert!(ALL.contains(&(c.table, c.parent, c.name)), "{} is not in ALL", c.name);
        }
    }

    #[test]
    fn where_the_guard_cannot_see_the_interface_vxlan_off_the_underlay_is_dropped_after_broadcast() {
        let s = Settings { vxlan_only_on: Some("eth0".into()), ..settings(8472, true, true) };
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), &s);
        assert_eq!(
            set.chains[0].rules,
            [
                "-p udp -m udp --dport 8472 -m addrtype --dst-type BROADCAST -j DROP",
                "-p udp -m udp --dport 8472 -m addrtype --dst-type MULTICAST -j DROP",
                // as `iptables -S` prints it back
                "! -i eth0 -p udp -m udp --dport 8472 -j DROP",
            ]
        );
        let set6 = plan::<Ipv6Net>("fd00:10:244::/56".parse().unwrap(), "fd00:10:244:1::/64".parse().unwrap(), &s);
        assert_eq!(set6.chains[0].rules[1], "! -i eth0 -p udp -m udp --dport 8472 -j DROP");
    }
}
