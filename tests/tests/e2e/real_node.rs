//! Flannel nodes made of real parts (`edgevx_tests::real_node`): pods wired
//! by the real CNI plugins from subnet.env, kube-proxy's rules in both
//! modes, flannel's masquerade and forward rules, a FORWARD policy of DROP,
//! and an outside world reached through the nodes' default routes.
//!
//! Every case runs on five setups (see [`on_every_setup`]): two kernel
//! flannel nodes, which proves the harness itself against the kernel's
//! VXLAN; two edgevx nodes in the default mode (the conntrack-verified fast
//! path on where the kernel gives the conntrack kfuncs, else the host
//! stack); two with `--ip-masq`; an `--ip-masq` edgevx node next to a
//! kernel flannel node; and two `--ip-masq` edgevx nodes with the fast path
//! off (`--fast-path=off`: every packet through the host stack).
use std::net::Ipv4Addr;

use anyhow::{Result, ensure};
use edgevx_tests::{
    kube_proxy::{Mode, Proto, Service},
    real_node::{Dialed, INTERNET_IP, NodeKind, RealCluster, TcpServer, at, tcp_dial, tcp_exchange, udp_exchange},
    topo::underlay_ip,
    traffic::ping,
};

use crate::{MIB, testpeer};

#[derive(Clone, Copy, Debug)]
enum Setup {
    KernelFlannel,
    EdgevxDefault,
    EdgevxIpMasq,
    EdgevxIpMasqWithKernelFlannel,
    EdgevxHostStack,
}

const IP_MASQ: NodeKind = NodeKind::Edgevx(&["--ip-masq"]);
const HOST_STACK: NodeKind = NodeKind::Edgevx(&["--ip-masq", "--fast-path=off"]);

impl Setup {
    fn kinds(self) -> [NodeKind; 2] {
        match self {
            Setup::KernelFlannel => [NodeKind::KernelFlannel; 2],
            Setup::EdgevxDefault => [NodeKind::Edgevx(&[]); 2],
            Setup::EdgevxIpMasq => [IP_MASQ; 2],
            Setup::EdgevxIpMasqWithKernelFlannel => [IP_MASQ, NodeKind::KernelFlannel],
            Setup::EdgevxHostStack => [HOST_STACK; 2],
        }
    }

    /// Two nodes with two pods each, every node's subnet.env as its kind
    /// writes it: FLANNEL_IPMASQ=true from flanneld --ip-masq and edgevx
    /// --ip-masq, false from edgevx's default.
    fn start(self) -> Result<RealCluster> {
        let rc = RealCluster::start(&self.kinds(), 2)?;
        for (i, kind) in (1u8..).zip(self.kinds()) {
            let want = match kind {
                NodeKind::KernelFlannel => true,
                NodeKind::Edgevx(flags) => flags.contains(&"--ip-masq"),
            };
            let env = rc.subnet_env(i)?;
            ensure!(env.ip_masq == want, "node{i} ({kind:?}) wrote FLANNEL_IPMASQ={}, want {want}", env.ip_masq);
            ensure!(env.network.to_string() == "10.244.0.0/16" && env.mtu == 1450, "node{i}: {env:?}");
        }
        Ok(rc)
    }
}

/// One test per setup for each case, named `<case>::<setup>`.
macro_rules! on_every_setup {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            use super::{Setup, $case as case};

            #[test]
            fn harness_kernel_flannel() -> anyhow::Result<()> {
                case(Setup::KernelFlannel)
            }
            #[test]
            fn edgevx_default() -> anyhow::Result<()> {
                case(Setup::EdgevxDefault)
            }
            #[test]
            fn edgevx_ip_masq() -> anyhow::Result<()> {
                case(Setup::EdgevxIpMasq)
            }
            #[test]
            fn edgevx_ip_masq_with_kernel_flannel() -> anyhow::Result<()> {
                case(Setup::EdgevxIpMasqWithKernelFlannel)
            }
            #[test]
            fn edgevx_host_stack() -> anyhow::Result<()> {
                case(Setup::EdgevxHostStack)
            }
        }
    )*};
}

on_every_setup!(
    clusterip_iptables,
    clusterip_nftables,
    nodeport_from_the_internet,
    pod_to_pod_under_kube_proxy_invalid_drop,
    pod_source_kept_and_masqueraded_to_the_internet,
    forward_policy_drop,
    nftables_reject_of_one_pod_port,
);

/// Node `n`'s other node.
fn other(n: u8) -> u8 {
    3 - n
}

fn clusterip_iptables(setup: Setup) -> Result<()> {
    clusterip(setup, Mode::Iptables)
}

fn clusterip_nftables(setup: Setup) -> Result<()> {
    clusterip(setup, Mode::Nftables)
}

/// A TCP and a UDP ClusterIP per node, each backed by a pod on the other
/// node, dialled from this node's pods: the DNAT happens on the client's
/// node and its reverse NAT must see the reply.
fn clusterip(setup: Setup, mode: Mode) -> Result<()> {
    let rc = setup.start()?;
    let tcp_ip = |n: u8| Ipv4Addr::new(10, 96, 0, 20 + n);
    let dns_ip = |n: u8| Ipv4Addr::new(10, 96, 0, 10 + n);
    let mut services = Vec::new();
    for n in [1, 2] {
        let backend = other(n);
        services.push(Service {
            cluster_ip: tcp_ip(n),
            port: 80,
            proto: Proto::Tcp,
            node_port: None,
            backend: (rc.pod(backend, 0).ip, 8080),
        });
        services.push(Service {
            cluster_ip: dns_ip(n),
            port: 53,
            proto: Proto::Udp,
            node_port: None,
            backend: (rc.pod(backend, 1).ip, 5353),
        });
    }
    rc.kube_proxy(mode, &services)?;
    rc.check(|rc| {
        for n in [1, 2] {
            let (client, server) = (rc.pod(n, 0), rc.pod(other(n), 0));
            let seen = tcp_exchange(&client.netns, at(tcp_ip(n), 80), &server.netns, 8080, MIB)?;
            ensure!(seen.ip() == &rc.source_seen_by_remote_pods(n, client)?, "TCP backend saw {seen}");

            let (client, server) = (rc.pod(n, 1), rc.pod(other(n), 1));
            let dns = udp_exchange(&client.netns, at(dns_ip(n), 53), &server.netns, 5353, 5)?;
            ensure!(dns.answered == 5, "{mode:?}: {} of 5 answers from {} came back: {dns:?}", dns.answered, dns_ip(n));
            let source = rc.source_seen_by_remote_pods(n, client)?;
            ensure!(dns.seen.iter().all(|s| s.ip() == &source), "UDP backend saw {:?}, want {source}", dns.seen);
        }
        Ok(())
    })
}

/// A NodePort on one node whose backend lives on the other, dialled from
/// outside: kube-proxy DNATs and marks it, then masquerades it into the
/// overlay, so the backend sees the first node's `flannel.1` address.
fn nodeport_from_the_internet(setup: Setup) -> Result<()> {
    let rc = setup.start()?;
    let mut services = Vec::new();
    for n in [1u8, 2] {
        let backend = other(n);
        let tcp = (rc.pod(backend, 0).ip, 8080);
        let udp = (rc.pod(backend, 1).ip, 5353);
        let cluster_ip = Ipv4Addr::new(10, 96, 1, n);
        services.push(Service {
            cluster_ip,
            port: 80,
            proto: Proto::Tcp,
            node_port: Some(30080 + u16::from(n)),
            backend: tcp,
        });
        services.push(Service {
            cluster_ip,
            port: 53,
            proto: Proto::Udp,
            node_port: Some(30050 + u16::from(n)),
            backend: udp,
        });
    }
    rc.kube_proxy(Mode::Iptables, &services)?;
    rc.check(|rc| {
        for n in [1u8, 2] {
            let node = underlay_ip(n);
            let server = &rc.pod(other(n), 0).netns;
            let seen = tcp_exchange(&rc.internet, at(node, 30080 + u16::from(n)), server, 8080, MIB)?;
            ensure!(seen.ip() == &rc.vtep_ip(n)?, "NodePort {node}: backend saw {seen}, want node{n}'s flannel.1");

            let server = &rc.pod(other(n), 1).netns;
            let dns = udp_exchange(&rc.internet, at(node, 30050 + u16::from(n)), server, 5353, 5)?;
            ensure!(dns.answered == 5, "UDP NodePort on {node}: {} of 5 answers: {dns:?}", dns.answered);
        }
        Ok(())
    })
}

/// ICMP, a TCP transfer by digest and UDP datagrams between pods on the two
/// nodes, both ways, with kube-proxy's `--ctstate INVALID -j DROP` on both.
fn pod_to_pod_under_kube_proxy_invalid_drop(setup: Setup) -> Result<()> {
    let rc = setup.start()?;
    rc.kube_proxy(Mode::Iptables, &[])?;
    rc.check(|rc| {
        for n in [1, 2] {
            pod_to_pod_across_nodes(rc, n)?;
        }
        Ok(())
    })
}

/// ICMP (10 of 10), a 4 MiB TCP transfer by digest and 300 UDP datagrams from
/// node `n`'s first pod to the other node's.
fn pod_to_pod_across_nodes(rc: &RealCluster, n: u8) -> Result<()> {
    let (a, b) = (rc.pod(n, 0), rc.pod(other(n), 0));
    ensure!(ping(&a.netns, b.ip, 10, "0.05")? == (10, 10), "ICMP {} -> {}", a.ip, b.ip);
    let peer = testpeer();
    peer.tcp_transfer(&a.netns, &b.netns, b.ip, 4 * MIB)?;
    let got = peer.udp_datagrams(&a.netns, &b.netns, b.ip, 300, 1400)?;
    ensure!(got == 300, "UDP {} -> {}: {got} of 300 datagrams", a.ip, b.ip);
    Ok(())
}

/// Pod to pod, the server sees the client pod's own address (with
/// FLANNEL_IPMASQ=false the CNI bridge's masquerade shows the node's
/// `flannel.1` address instead, as on flannel without `--ip-masq`); pod to
/// the internet, it sees the node's underlay address.
fn pod_source_kept_and_masqueraded_to_the_internet(setup: Setup) -> Result<()> {
    let rc = setup.start()?;
    rc.check(|rc| {
        for n in [1, 2] {
            let (client, server) = (rc.pod(n, 0), rc.pod(other(n), 0));
            let want = rc.source_seen_by_remote_pods(n, client)?;
            let seen = tcp_exchange(&client.netns, at(server.ip, 8080), &server.netns, 8080, 64 * 1024)?;
            ensure!(seen.ip() == &want, "pod {} -> pod {}: server saw {seen}, want {want}", client.ip, server.ip);
            let udp = udp_exchange(&client.netns, at(server.ip, 5353), &server.netns, 5353, 5)?;
            ensure!(udp.answered == 5, "UDP pod to pod: {udp:?}");
            ensure!(udp.seen.iter().all(|s| s.ip() == &want), "UDP server saw {:?}, want {want}", udp.seen);

            let node = underlay_ip(n);
            let seen = tcp_exchange(&client.netns, at(INTERNET_IP, 8080), &rc.internet, 8080, 64 * 1024)?;
            ensure!(seen.ip() == &node, "pod {} -> internet: seen as {seen}, want node{n} {node}", client.ip);
            let udp = udp_exchange(&rc.pod(n, 1).netns, at(INTERNET_IP, 53), &rc.internet, 53, 5)?;
            ensure!(udp.answered == 5 && udp.seen.iter().all(|s| s.ip() == &node), "UDP to the internet: {udp:?}");
        }
        Ok(())
    })
}

/// `iptables -P FORWARD DROP` on every node: pods still reach each other
/// (across nodes, and on one node through the bridge, which br_netfilter
/// hands to FORWARD) and the internet, by the forward rules the network
/// daemon installs (flanneld's FLANNEL-FWD, or edgevx's).
fn forward_policy_drop(setup: Setup) -> Result<()> {
    let rc = setup.start()?;
    rc.forward_policy_drop()?;
    rc.check(|rc| {
        for n in [1, 2] {
            pod_to_pod_across_nodes(rc, n)?;
            let a = rc.pod(n, 0);
            let neighbour = rc.pod(n, 1);
            ensure!(ping(&a.netns, neighbour.ip, 5, "0.05")? == (5, 5), "same node {} -> {}", a.ip, neighbour.ip);
            tcp_exchange(&a.netns, at(INTERNET_IP, 8080), &rc.internet, 8080, 64 * 1024)?;
        }
        Ok(())
    })
}

/// A policy rule in its own nftables table on node 1 rejects new
/// connections to one port of pod A; another port of pod A still works.
fn nftables_reject_of_one_pod_port(setup: Setup) -> Result<()> {
    let rc = setup.start()?;
    let pod_a = rc.pod(1, 0);
    let rules = format!(
        "table inet netpol {{\n\tchain forward {{\n\t\ttype filter hook forward priority filter; policy accept;\n\t\ttcp dport 7001 ct state new ip daddr {} counter reject\n\t}}\n}}\n",
        pod_a.ip
    );
    edgevx_tests::kube_proxy::feed(&rc.node(1).ns, &["nft", "-f", "-"], &rules)?;
    rc.check(|rc| {
        let client = &rc.pod(2, 0).netns;
        // first the open port, so the pod is known to every part of the node
        tcp_exchange(client, at(pod_a.ip, 7002), &pod_a.netns, 7002, 64 * 1024)?;
        // a listener on 7001 too, so a refusal can only come from the rule
        let blocked = TcpServer::start(&pod_a.netns, 7001)?;
        let dialed = tcp_dial(client, at(pod_a.ip, 7001));
        let reached = blocked.finish()?;
        let dialed = dialed?;
        ensure!(dialed == Dialed::Refused, "port 7001 of {} was not refused: {dialed:?}", pod_a.ip);
        ensure!(reached.is_none(), "a connection reached the rejected port: {reached:?}");
        Ok(())
    })
}
