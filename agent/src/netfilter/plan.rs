//! What the rules are: a pure function of the network, our subnet and the
//! options, so the same input always gives the same rules in the same order.
use ipnet::Ipv4Net;

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

/// Every chain edgevx may own, for cleanup.
pub const ALL: [(&str, &str, &str); 2] = [("nat", "POSTROUTING", MASQ_CHAIN), ("filter", "FORWARD", FWD_CHAIN)];

/// The chains wanted on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSet {
    pub chains: Vec<Chain>,
}

/// flannel's rules for `network` (the cluster's pod Network) and `subnet`
/// (this node's pod subnet).
pub fn plan(network: Ipv4Net, subnet: Ipv4Net, ip_masq: bool, forward: bool) -> RuleSet {
    let mut chains = Vec::new();
    if ip_masq {
        let (n, s) = (network.to_string(), subnet.to_string());
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
                format!("-s {n} ! -d 224.0.0.0/4 -j MASQUERADE --random-fully"),
                // the host (or a NodePort client) towards remote pods
                format!("! -s {n} -d {n} -j MASQUERADE --random-fully"),
            ],
        });
    }
    if forward {
        chains.push(Chain {
            table: "filter",
            name: FWD_CHAIN,
            parent: "FORWARD",
            jump_first: false,
            rules: vec![format!("-s {network} -j ACCEPT"), format!("-d {network} -j ACCEPT")],
        });
    }
    RuleSet { chains }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn masquerade_rules_follow_flannel_in_order() {
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), true, false);
        assert_eq!(set.chains.len(), 1);
        let c = &set.chains[0];
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
        let set = plan(net("10.244.0.0/16"), net("10.244.1.0/24"), false, true);
        let c = &set.chains[0];
        assert_eq!((c.table, c.name, c.parent, c.jump_first), ("filter", FWD_CHAIN, "FORWARD", false));
        assert_eq!(c.rules, ["-s 10.244.0.0/16 -j ACCEPT", "-d 10.244.0.0/16 -j ACCEPT"]);
    }

    #[test]
    fn nothing_asked_nothing_planned() {
        assert!(plan(net("10.244.0.0/16"), net("10.244.1.0/24"), false, false).chains.is_empty());
    }
}
