//! The iptables chains edgevx owns (docs/src/concepts/security.md, "Firewall rules edgevx
//! installs"): flannel's meaning, restarts that change nothing, a flushed
//! chain put back, a flag turned off taken back, and `edgevx cleanup`.
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use edgevx_tests::{
    agent::{self, Agent},
    kube_proxy::{KubeProxy, Mode, Proto, Service},
    netns::Netns,
    nodes::{flannel_node, node_list, write},
    scenario::{KERNEL_MAC, edgevx_and_flannel},
    topo::{Cluster, pod_ip},
};

/// `iptables-save` without its timestamped comment lines and counters.
fn rules(ns: &Netns) -> Result<String> {
    let text = ns.run(&["iptables-save"])?;
    Ok(text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| if l.starts_with(':') { l.split(' ').take(2).collect::<Vec<_>>().join(" ") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n"))
}

fn chain(ns: &Netns, table: &str, name: &str) -> Result<Vec<String>> {
    Ok(ns.run(&["iptables", "-t", table, "-S", name])?.lines().map(str::to_string).collect())
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        if Instant::now() > deadline {
            bail!("{what} did not happen within 10 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[test]
fn ip_masq_and_forward_rules_are_flannels_restart_unchanged_and_go_with_cleanup() -> Result<()> {
    let mut s = edgevx_and_flannel(&["--ip-masq"])?;
    let host = s.cluster.host(1);
    let n1 = &host.ns;
    assert_eq!(
        chain(n1, "nat", "EDGEVX-POSTRTG")?,
        [
            "-N EDGEVX-POSTRTG",
            "-A EDGEVX-POSTRTG -m mark --mark 0x4000/0x4000 -j RETURN",
            "-A EDGEVX-POSTRTG -s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN",
            "-A EDGEVX-POSTRTG ! -s 10.244.0.0/16 -d 10.244.1.0/24 -j RETURN",
            "-A EDGEVX-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -j MASQUERADE --random-fully",
            "-A EDGEVX-POSTRTG ! -s 10.244.0.0/16 -d 10.244.0.0/16 -j MASQUERADE --random-fully",
        ]
    );
    assert_eq!(
        chain(n1, "filter", "EDGEVX-FWD")?,
        ["-N EDGEVX-FWD", "-A EDGEVX-FWD -s 10.244.0.0/16 -j ACCEPT", "-A EDGEVX-FWD -d 10.244.0.0/16 -j ACCEPT"]
    );
    // the masquerade chain comes first in POSTROUTING; the accept chain last in FORWARD
    let post = chain(n1, "nat", "POSTROUTING")?;
    assert!(post.get(1).is_some_and(|l| l.ends_with("-j EDGEVX-POSTRTG")), "{post:?}");
    let fwd = chain(n1, "filter", "FORWARD")?;
    assert!(fwd.last().is_some_and(|l| l.ends_with("-j EDGEVX-FWD")), "{fwd:?}");
    assert!(std::fs::read_to_string(host.subnet_file())?.contains("FLANNEL_IPMASQ=true"));

    // a restart finds everything as planned and changes nothing
    let before = rules(n1)?;
    s.agent.stop()?;
    let agent = Agent::start(host, &s.nodes_file, &["--ip-masq"])?;
    assert_eq!(rules(n1)?, before, "a restart changed the rules");
    assert!(!agent.log_text().contains("firewall chain written"), "{}", agent.log_text());

    // someone flushes our chain: the next reconcile pass (here, a nodes file edit) puts it back
    n1.run(&["iptables", "-F", "EDGEVX-FWD"])?;
    let mut node2 = flannel_node(2, Some(KERNEL_MAC));
    node2["metadata"]["labels"] = serde_json::json!({"edited": "yes"});
    write(&s.nodes_file, &node_list(vec![flannel_node(1, Some(&s.mac)), node2]))?;
    wait_until("EDGEVX-FWD restored", || chain(n1, "filter", "EDGEVX-FWD").is_ok_and(|c| c.len() == 3))?;
    drop(agent);

    // without --ip-masq: no NAT chain any more, FLANNEL_IPMASQ=false, forward rules stay
    let mut agent = Agent::start(host, &s.nodes_file, &[])?;
    assert!(chain(n1, "nat", "EDGEVX-POSTRTG").is_err(), "the masquerade chain outlived --ip-masq");
    assert!(!chain(n1, "nat", "POSTROUTING")?.iter().any(|l| l.contains("EDGEVX")));
    assert_eq!(chain(n1, "filter", "EDGEVX-FWD")?.len(), 3);
    assert!(std::fs::read_to_string(host.subnet_file())?.contains("FLANNEL_IPMASQ=false"));
    agent.stop()?;

    // cleanup takes the chains and their jumps
    let out = agent::cleanup(host, &[])?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left = rules(n1)?;
    assert!(!left.contains("EDGEVX"), "cleanup left rules behind:\n{left}");
    Ok(())
}

#[test]
fn forward_rules_off_installs_only_the_vxlan_guard() -> Result<()> {
    let s = edgevx_and_flannel(&["--iptables-forward-rules=false"])?;
    let n1 = &s.cluster.host(1).ns;
    let left = rules(n1)?;
    assert!(!left.contains("EDGEVX-FWD") && !left.contains("EDGEVX-POSTRTG"), "{left}");
    // broadcast and multicast VXLAN is dropped whatever the flags, jumped to first from INPUT
    assert_eq!(
        chain(n1, "filter", "EDGEVX-INPUT")?,
        [
            "-N EDGEVX-INPUT",
            "-A EDGEVX-INPUT -p udp -m udp --dport 8472 -m addrtype --dst-type BROADCAST -j DROP",
            "-A EDGEVX-INPUT -p udp -m udp --dport 8472 -m addrtype --dst-type MULTICAST -j DROP",
        ]
    );
    let input = chain(n1, "filter", "INPUT")?;
    assert!(input.get(1).is_some_and(|l| l.ends_with("-j EDGEVX-INPUT")), "{input:?}");
    Ok(())
}

#[test]
fn bypass_netfilter_warns_when_kube_proxy_rules_are_present() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let warning = "--bypass-netfilter is on, but kube-proxy's packet rules are on this node";
    let quiet = Agent::start(c.host(1), &nodes, &["--bypass-netfilter"])?;
    assert!(!quiet.log_text().contains(warning), "warned without kube-proxy rules:\n{}", quiet.log_text());
    drop(quiet);
    for mode in [Mode::Iptables, Mode::Nftables] {
        let svc = Service {
            cluster_ip: "10.96.0.10".parse()?,
            port: 53,
            proto: Proto::Udp,
            node_port: None,
            backend: (pod_ip(1), 53),
        };
        let ns = &c.host(1).ns;
        KubeProxy::install(ns, mode, &[svc])?;
        let agent = Agent::start(c.host(1), &nodes, &["--bypass-netfilter"])?;
        assert!(agent.log_text().contains(warning), "{mode:?}: no warning:\n{}", agent.log_text());
        drop(agent);
        // take kube-proxy's rules away again for the next mode
        ns.run(&["iptables", "-t", "nat", "-F"])?;
        ns.run(&["iptables", "-t", "nat", "-X"])?;
        let _ = ns.run(&["nft", "delete", "table", "ip", "kube-proxy"]);
    }
    Ok(())
}
