//! kube-proxy's rules, reproduced small, in a node namespace: ClusterIP and
//! NodePort services with one backend each, the masquerade mark, and the
//! FORWARD drop of conntrack-INVALID packets. Both proxy modes write the
//! shapes upstream writes, so a dataplane that hides half a flow from
//! conntrack, or skips the reverse NAT, fails here as it would on a node.
//!
//! - iptables mode follows kubernetes `pkg/proxy/iptables/proxier.go`:
//!   `PREROUTING`/`OUTPUT` → `KUBE-SERVICES` → `KUBE-SVC-*` → `KUBE-SEP-*`
//!   (DNAT), `KUBE-NODEPORTS` behind `-m addrtype --dst-type LOCAL` (the last
//!   rule of `KUBE-SERVICES`) → `KUBE-EXT-*`, `KUBE-MARK-MASQ` (`--or-mark
//!   0x4000`), `KUBE-POSTROUTING` (MASQUERADE what carries the mark), and
//!   `KUBE-FORWARD` (`--ctstate INVALID -j DROP`, then ACCEPT marked and
//!   RELATED,ESTABLISHED). Applied with `iptables-restore --noflush`
//!   (iptables-nft is Debian's default).
//! - nftables mode follows `pkg/proxy/nftables/proxier.go`: table
//!   `ip kube-proxy`, base chains `filter-forward` (`ct state invalid drop`,
//!   as kube-proxy adds unless conntrack is TCP-liberal), `nat-prerouting` and
//!   `nat-output` (jump `services`), `nat-postrouting` (jump `masquerading`);
//!   the `service-ips` and `service-nodeports` verdict maps; per service a
//!   `service-*` chain, an `endpoint-*` chain with the `dnat`, and an
//!   `external-*` chain for the NodePort. Applied with `nft -f -`.
//!
//! Left out: load-balancing across several endpoints, session affinity,
//! health-check node ports, the no-endpoint REJECT rules, and IPv6.
use std::{fmt::Write as _, io::Write, net::Ipv4Addr, process::Stdio};

use anyhow::{Context, Result, bail};

use crate::netns::Netns;

/// kube-proxy's `--cluster-cidr`: traffic from outside it to a ClusterIP is
/// marked for masquerade (its "local traffic detector").
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";

/// kube-proxy's default masquerade bit (`--iptables-masquerade-bit=14`).
pub const MASQ_MARK: &str = "0x4000";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// One service port with one ready endpoint.
#[derive(Clone, Debug)]
pub struct Service {
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    pub proto: Proto,
    pub node_port: Option<u16>,
    /// The endpoint: pod IP and target port.
    pub backend: (Ipv4Addr, u16),
}

impl Service {
    /// A stable chain suffix, in place of upstream's hash of the port name.
    fn id(&self) -> String {
        format!("{:08X}{:04X}{}", u32::from(self.cluster_ip), self.port, self.proto.name()[..1].to_uppercase())
    }
}

/// The rules kube-proxy would hold for `services`, installed in a node.
pub struct KubeProxy {
    pub mode: Mode,
    /// What was fed to `iptables-restore` or `nft`, for failure messages.
    pub rules: String,
}

impl KubeProxy {
    /// Installs the rules in `node` (they go when its namespace goes).
    pub fn install(node: &Netns, mode: Mode, services: &[Service]) -> Result<Self> {
        let rules = match mode {
            Mode::Iptables => iptables_rules(services),
            Mode::Nftables => nft_rules(services),
        };
        match mode {
            Mode::Iptables => feed(node, &["iptables-restore", "--noflush"], &rules)?,
            Mode::Nftables => feed(node, &["nft", "-f", "-"], &rules)?,
        }
        Ok(KubeProxy { mode, rules })
    }
}

/// Runs `args` in `node` with `input` on stdin (`iptables-restore`, `nft -f -`).
pub fn feed(node: &Netns, args: &[&str], input: &str) -> Result<()> {
    let mut child = node
        .cmd(args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {args:?} in {}", node.name))?;
    child.stdin.take().context("no stdin")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{args:?} in {} failed: {}\ninput:\n{input}", node.name, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// `iptables-restore --noflush` input. The jumps from the built-in chains are
/// inserted first in line, as kube-proxy's `EnsureRule(Prepend, ...)` does.
pub fn iptables_rules(services: &[Service]) -> String {
    let mut nat = String::from("*nat\n");
    let mut chains = vec!["KUBE-SERVICES".to_string(), "KUBE-NODEPORTS".into(), "KUBE-POSTROUTING".into()];
    chains.push("KUBE-MARK-MASQ".into());
    for s in services {
        chains.push(format!("KUBE-SVC-{}", s.id()));
        chains.push(format!("KUBE-SEP-{}", s.id()));
        if s.node_port.is_some() {
            chains.push(format!("KUBE-EXT-{}", s.id()));
        }
    }
    for c in &chains {
        let _ = writeln!(nat, ":{c} - [0:0]");
    }
    let m = MASQ_MARK;
    let _ = writeln!(nat, "-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    let _ = writeln!(nat, "-I OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES");
    let _ = writeln!(nat, "-I POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING");
    let _ = writeln!(nat, "-A KUBE-POSTROUTING -m mark ! --mark {m}/{m} -j RETURN");
    let _ = writeln!(nat, "-A KUBE-POSTROUTING -j MARK --xor-mark {m}");
    let _ = writeln!(
        nat,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    let _ = writeln!(nat, "-A KUBE-MARK-MASQ -j MARK --or-mark {m}");
    for s in services {
        let (id, p) = (s.id(), s.proto.name());
        let (cip, port, (bip, bport)) = (s.cluster_ip, s.port, s.backend);
        let _ = writeln!(nat, "-A KUBE-SERVICES -d {cip}/32 -p {p} -m {p} --dport {port} -j KUBE-SVC-{id}");
        let _ = writeln!(
            nat,
            "-A KUBE-SVC-{id} ! -s {CLUSTER_CIDR} -d {cip}/32 -p {p} -m {p} --dport {port} -j KUBE-MARK-MASQ"
        );
        let _ = writeln!(nat, "-A KUBE-SVC-{id} -j KUBE-SEP-{id}");
        // hairpin: a pod reaching itself through its own service
        let _ = writeln!(nat, "-A KUBE-SEP-{id} -s {bip}/32 -j KUBE-MARK-MASQ");
        let _ = writeln!(nat, "-A KUBE-SEP-{id} -p {p} -m {p} -j DNAT --to-destination {bip}:{bport}");
        if let Some(np) = s.node_port {
            let _ = writeln!(nat, "-A KUBE-NODEPORTS -p {p} -m {p} --dport {np} -j KUBE-EXT-{id}");
            // externalTrafficPolicy: Cluster
            let _ = writeln!(nat, "-A KUBE-EXT-{id} -j KUBE-MARK-MASQ");
            let _ = writeln!(nat, "-A KUBE-EXT-{id} -j KUBE-SVC-{id}");
        }
    }
    let _ = writeln!(
        nat,
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    );
    nat.push_str("COMMIT\n");

    let mut filter = String::from("*filter\n:KUBE-FORWARD - [0:0]\n");
    let _ = writeln!(filter, "-I FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD");
    let _ = writeln!(filter, "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP");
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {m}/{m} -j ACCEPT"
    );
    let _ = writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
    );
    filter.push_str("COMMIT\n");
    nat + &filter
}

/// `nft -f -` input: the `ip kube-proxy` table. Chains are declared before
/// the maps whose verdicts name them. Priorities are numbers: upstream's
/// `dstnat - 10` (filter chains), `dstnat` and `srcnat`, which Debian's nft
/// 1.0.6 accepts by name only on some hooks.
pub fn nft_rules(services: &[Service]) -> String {
    let m = MASQ_MARK;
    let mut t = String::from("table ip kube-proxy {\n\tcomment \"rules for kube-proxy\"\n");
    let _ = writeln!(t, "\tchain mark-for-masquerade {{\n\t\tmark set mark or {m}\n\t}}");
    let _ = writeln!(
        t,
        "\tchain masquerading {{\n\t\tmark and {m} == 0 return\n\t\tmark set mark xor {m}\n\t\tmasquerade fully-random\n\t}}"
    );
    let _ = writeln!(
        t,
        "\tchain filter-forward {{\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tct state invalid drop\n\t}}"
    );
    for (name, hook, prio, target) in [
        ("nat-prerouting", "prerouting", "-100", "services"),
        ("nat-output", "output", "-100", "services"),
        ("nat-postrouting", "postrouting", "100", "masquerading"),
    ] {
        let _ = writeln!(
            t,
            "\tchain {name} {{\n\t\ttype nat hook {hook} priority {prio}; policy accept;\n\t\tjump {target}\n\t}}"
        );
    }
    let (mut service_ips, mut node_ports) = (Vec::new(), Vec::new());
    for s in services {
        let (id, p) = (s.id(), s.proto.name());
        let (cip, port, (bip, bport)) = (s.cluster_ip, s.port, s.backend);
        let _ = writeln!(
            t,
            "\tchain endpoint-{id} {{\n\t\tip saddr {bip} jump mark-for-masquerade\n\t\tmeta l4proto {p} dnat to {bip}:{bport}\n\t}}"
        );
        let _ = writeln!(
            t,
            "\tchain service-{id} {{\n\t\tip daddr {cip} {p} dport {port} ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade\n\t\tnumgen random mod 1 vmap {{ 0 : goto endpoint-{id} }}\n\t}}"
        );
        service_ips.push(format!("{cip} . {p} . {port} : goto service-{id}"));
        if let Some(np) = s.node_port {
            let _ = writeln!(t, "\tchain external-{id} {{\n\t\tjump mark-for-masquerade\n\t\tgoto service-{id}\n\t}}");
            node_ports.push(format!("{p} . {np} : goto external-{id}"));
        }
    }
    for (name, key, elements) in [
        ("service-ips", "ipv4_addr . inet_proto . inet_service", service_ips),
        ("service-nodeports", "inet_proto . inet_service", node_ports),
    ] {
        let _ = write!(t, "\tmap {name} {{\n\t\ttype {key} : verdict\n");
        if !elements.is_empty() {
            let _ = writeln!(t, "\t\telements = {{ {} }}", elements.join(", "));
        }
        t.push_str("\t}\n");
    }
    let _ = writeln!(
        t,
        "\tchain services {{\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports\n\t}}"
    );
    t.push_str("}\n");
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns() -> Service {
        Service {
            cluster_ip: Ipv4Addr::new(10, 96, 0, 10),
            port: 53,
            proto: Proto::Udp,
            node_port: Some(30053),
            backend: (Ipv4Addr::new(10, 244, 2, 3), 5353),
        }
    }

    #[test]
    fn iptables_mode_has_upstreams_chains() {
        let r = iptables_rules(&[dns()]);
        let id = dns().id();
        for line in [
            format!("-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-{id}"),
            format!("-A KUBE-SEP-{id} -p udp -m udp -j DNAT --to-destination 10.244.2.3:5353"),
            format!("-A KUBE-NODEPORTS -p udp -m udp --dport 30053 -j KUBE-EXT-{id}"),
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000".into(),
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN".into(),
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP".into(),
        ] {
            assert!(r.lines().any(|l| l == line), "missing {line:?} in\n{r}");
        }
        // the NodePort jump must stay the last rule of KUBE-SERVICES
        let last = r.lines().rfind(|l| l.starts_with("-A KUBE-SERVICES")).unwrap();
        assert!(last.ends_with("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"), "{last}");
        assert!(id.len() <= 28 - "KUBE-SVC-".len());
    }

    #[test]
    fn nftables_mode_has_upstreams_chains() {
        let r = nft_rules(&[dns()]);
        let id = dns().id();
        for needle in [
            "table ip kube-proxy".to_string(),
            "ct state invalid drop".into(),
            format!("10.96.0.10 . udp . 53 : goto service-{id}"),
            format!("udp . 30053 : goto external-{id}"),
            "meta l4proto udp dnat to 10.244.2.3:5353".into(),
            "masquerade fully-random".into(),
        ] {
            assert!(r.contains(&needle), "missing {needle:?} in\n{r}");
        }
        assert!(!nft_rules(&[]).contains("elements"), "an empty map has no elements line");
    }
}
