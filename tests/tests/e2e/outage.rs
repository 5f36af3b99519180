//! The edge outage, end to end (issue 19), as an operator lives through it
//! (OpenYurt #2809): two edgevx nodes in Kubernetes mode, each talking to
//! its node-local API endpoint (yurthub's place), and one unmodified
//! flannel node. Pods come from the real `bridge` plugin with `edgevx-ipam`
//! (host-local on the flannel node), and kube-proxy's rules hold a
//! ClusterIP whose only endpoint is a pod on node 1.
//!
//! Node 1 loses the API, then power: its namespaces, links, pins, pods,
//! rules and subnet.env (/run) go; its disk (the state dir, the IPAM store)
//! stays. It comes back still cut off, the agent restores from its cache,
//! and the kubelet recreates the pods under new sandbox IDs. They get their
//! old addresses, the flannel node reaches them through its unchanged fdb,
//! and the ClusterIP works through the old endpoint from both other nodes.
//! When the API returns, nothing changes. The figures (how soon) are the
//! bench's and `edgevx status`'s business; this test makes no timed claim.
use std::{collections::BTreeMap, net::Ipv4Addr, time::Duration};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    ipam_pod::{IpamPod, add_node_pods, flannel_delegate_with_ipam},
    kube_proxy::{Mode, Proto, Service},
    kubeapi::KubeApi,
    nodes::flannel_node,
    real_node::{NodeKind, RealCluster, at, tcp_exchange, vtep_mac},
    traffic::{BackgroundPing, wait_reachable},
};
use serde_json::{Value, json};

use crate::MIB;

const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 80);

/// The flannel conflist's delegate on node `i`: edgevx-ipam on the edgevx
/// nodes, host-local (the `ipam` block without a type) on the flannel one.
fn delegate(rc: &RealCluster, i: u8) -> Result<Value> {
    let data_dir = rc.node(i).dir.join("cni-networks");
    let ipam = match i {
        3 => json!({"dataDir": data_dir}),
        _ => json!({"type": "edgevx-ipam", "dataDir": data_dir}),
    };
    Ok(flannel_delegate_with_ipam(&rc.subnet_env(i)?, &ipam))
}

/// Node 1's pods ([`NODE_PODS`](edgevx_tests::ipam_pod::NODE_PODS)); the first is the Service's endpoint.
fn node1_pods(rc: &RealCluster, generation: u32) -> Result<Vec<IpamPod>> {
    add_node_pods(&rc.node(1).ns, &delegate(rc, 1)?, generation)
}

/// Node `i`'s local API endpoint, knowing every Node as flanneld and
/// edgevx annotated them, and the agent started against it.
fn kube_agent(rc: &RealCluster, i: u8) -> Result<(KubeApi, Agent)> {
    let api = KubeApi::start_in(&rc.node(i).ns.name)?;
    for n in 1..=3 {
        api.put_node(flannel_node(n, Some(&vtep_mac(n))));
    }
    let kc = rc.node(i).dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    let agent = Agent::start_with(rc.node(i), &["--kube", "--kubeconfig", kc.to_str().context("path")?])?;
    Ok((api, agent))
}

fn wait_file(path: &std::path::Path, what: &str) -> Result<()> {
    let deadline = std::time::Instant::now() + edgevx_tests::patience(Duration::from_secs(10));
    while !path.exists() {
        ensure!(std::time::Instant::now() < deadline, "{what}: {} did not appear", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The Service from both other nodes' clients, answered by `server`.
fn service_works(clients: &[&IpamPod], server: &IpamPod) -> Result<()> {
    let server = server.netns.as_ref().context("server sandbox")?;
    for c in clients {
        let client = c.netns.as_ref().context("client sandbox")?;
        tcp_exchange(client, at(CLUSTER_IP, 80), server, 8080, MIB)
            .with_context(|| format!("ClusterIP {CLUSTER_IP}:80 from {}", c.name))?;
    }
    Ok(())
}

#[test]
fn a_node_that_loses_power_while_cut_off_comes_back_with_its_pods_addresses_and_services() -> Result<()> {
    let mut rc = RealCluster::start(&[NodeKind::Edgevx(&[]), NodeKind::Edgevx(&[]), NodeKind::KernelFlannel], 0)?;
    // the edgevx nodes in Kubernetes mode (RealCluster starts them on a nodes file)
    let mut apis = Vec::new();
    for i in [1u8, 2] {
        rc.agents[usize::from(i) - 1] = None;
        let (api, agent) = kube_agent(&rc, i)?;
        rc.agents[usize::from(i) - 1] = Some(agent);
        apis.push(api);
    }
    let agent1 = rc.agents[0].as_ref().context("node 1's agent")?;
    // the view is cached once the source has delivered it
    wait_file(&rc.node(1).state_dir().join("last-view.json"), "node 1's cached view")?;
    let mac = agent1.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    ensure!(mac == vtep_mac(1), "node 1's VTEP MAC is {mac}, not its annotation's {}", vtep_mac(1));

    let clients = [
        IpamPod::add(
            &rc.node(2).ns,
            &format!("{}cl", rc.node(2).ns.name),
            "client-2",
            "default",
            "c2",
            &delegate(&rc, 2)?,
        )?,
        IpamPod::add(
            &rc.node(3).ns,
            &format!("{}cl", rc.node(3).ns.name),
            "client-3",
            "default",
            "c3",
            &delegate(&rc, 3)?,
        )?,
    ];
    let before = node1_pods(&rc, 1)?;
    let old: BTreeMap<String, Ipv4Addr> =
        before.iter().map(|p| (format!("{}/{}", p.namespace, p.name), p.ip)).collect();
    let service =
        Service { cluster_ip: CLUSTER_IP, port: 80, proto: Proto::Tcp, node_port: None, backend: (before[0].ip, 8080) };
    rc.kube_proxy(Mode::Iptables, std::slice::from_ref(&service))?;
    for c in &clients {
        for ip in old.values() {
            wait_reachable(c.netns.as_ref().context("client")?, *ip, 20)?;
        }
    }
    rc.check(|_| service_works(&[&clients[0], &clients[1]], &before[0]))?;

    // the API goes first (the uplink), then the power: no DEL, nothing cleaned up
    apis[0].set_down(true);
    std::thread::sleep(Duration::from_millis(500));
    before.into_iter().for_each(IpamPod::vanish);
    rc.power_loss(1)?;
    // /run is a tmpfs: subnet.env is gone with the power
    std::fs::remove_file(rc.node(1).subnet_file()).context("subnet.env")?;
    // kube-proxy puts back the rules of the EndpointSlices yurthub still serves: the old ones
    edgevx_tests::kube_proxy::KubeProxy::install(&rc.node(1).ns, Mode::Iptables, std::slice::from_ref(&service))?;

    // it boots still cut off: the node-local endpoint is there, the cloud is not
    let api1 = KubeApi::start_in(&rc.node(1).ns.name)?; // the old listener died with the namespace
    api1.set_down(true);
    for n in 1..=3 {
        api1.put_node(flannel_node(n, Some(&vtep_mac(n))));
    }
    let kc = rc.node(1).dir.join("kubeconfig");
    api1.kubeconfig(&kc)?;
    rc.agents[0] = Some(Agent::start_with(rc.node(1), &["--kube", "--kubeconfig", kc.to_str().context("path")?])?);
    let agent1 = rc.agents[0].as_ref().context("node 1's agent")?;
    let log = agent1.log_text();
    ensure!(log.contains("restoring the dataplane from the cached view first"), "not restored from the cache:\n{log}");
    ensure!(agent1.status()?["vtep_mac"] == json!(mac), "the VTEP MAC changed across the reboot");
    // the CNI can add pods once subnet.env is back
    wait_file(&rc.node(1).subnet_file(), "subnet.env after the reboot")?;

    // the kubelet recreates the same pods under new sandbox IDs: the old addresses
    let after = node1_pods(&rc, 2)?;
    for p in &after {
        let key = format!("{}/{}", p.namespace, p.name);
        ensure!(
            old.get(&key) == Some(&p.ip),
            "{key} came back as {} (sandbox {}), was {:?}",
            p.ip,
            p.container_id,
            old.get(&key)
        );
    }
    // the flannel node's fdb and arp entries were never touched: they still work
    let fdb = rc.node(3).ns.run(&["bridge", "fdb", "show", "dev", "flannel.1"])?;
    ensure!(fdb.contains(&mac), "node 3's fdb lost node 1's MAC {mac}:\n{fdb}");
    for c in &clients {
        for ip in old.values() {
            wait_reachable(c.netns.as_ref().context("client")?, *ip, 20)?;
        }
    }
    rc.check(|_| service_works(&[&clients[0], &clients[1]], &after[0]))?;

    // the API returns: nothing changes, and traffic does not notice
    let programmed = peers(&agent1.status()?);
    let pings = BackgroundPing::start(clients[1].netns.as_ref().context("client")?, after[0].ip, 100, "0.05")?;
    let patched = api1.patches().len();
    api1.set_down(false);
    std::thread::sleep(Duration::from_secs(3));
    pings.expect_no_loss().context("flannel node -> web-0 while the API came back")?;
    for p in &api1.patches()[patched..] {
        let ann = &p.body["metadata"]["annotations"];
        if let Some(data) = ann.get("flannel.alpha.coreos.com/backend-data") {
            ensure!(data.as_str().is_some_and(|d| d.contains(&mac)), "the MAC published changed: {data}");
        }
    }
    let agent1 = rc.agents[0].as_ref().context("node 1's agent")?;
    wait_status(agent1, Duration::from_secs(5), "the same peers", |s| peers(s) == programmed)?;
    ensure!(agent1.status()?["vtep_mac"] == json!(mac), "the VTEP MAC changed when the API returned");
    rc.check(|_| service_works(&[&clients[0], &clients[1]], &after[0]))
}
