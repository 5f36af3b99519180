//! The nodes file drives the dataplane: edits reach the maps within 2 s,
//! bad nodes are skipped by name, a broken file keeps the last good state.
use std::time::{Duration, Instant};

use anyhow::Result;
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};
use serde_json::json;

use crate::KERNEL_MAC;

const EDIT_DEADLINE: Duration = Duration::from_secs(2);

#[test]
fn peers_follow_file_edits() -> Result<()> {
    let mut c = Cluster::new(3)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    for i in [2, 3] {
        c.host(i).kernel_vtep(KERNEL_MAC)?;
        c.host(i).kernel_add_peer(1, &mac)?;
    }
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 1, "0.2")?.1, 0, "no peer yet, no route");

    // add node2
    let t = Instant::now();
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    wait_status(&agent, EDIT_DEADLINE, "node2 added", |s| peers(s).len() == 1)?;
    assert!(t.elapsed() <= EDIT_DEADLINE);
    wait_reachable(&c.host(1).pod, pod_ip(2), 5)?;

    // add node3, then change node2's MAC (its flannel.1 is recreated with a new one)
    let new_mac = "02:00:00:00:02:99";
    c.host(2).ns.ip(&["link", "set", "flannel.1", "address", new_mac])?;
    // a MAC change flushes the device's neighbours; flanneld re-adds its peers
    c.host(2).kernel_add_peer(1, &mac)?;
    write(
        &nodes,
        &node_list(vec![flannel_node(1, None), flannel_node(2, Some(new_mac)), flannel_node(3, Some(KERNEL_MAC))]),
    )?;
    wait_status(&agent, EDIT_DEADLINE, "node2 changed and node3 added", |s| {
        let p = peers(s);
        p.len() == 2 && p.contains(&("node2".into(), new_mac.into()))
    })?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 5)?;
    wait_reachable(&c.host(1).pod, pod_ip(3), 5)?;

    // remove node2: its route goes, node3 is undisturbed
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(3, Some(KERNEL_MAC))]))?;
    wait_status(&agent, EDIT_DEADLINE, "node2 removed", |s| {
        peers(s) == vec![("node3".to_string(), KERNEL_MAC.to_string())]
    })?;
    assert!(!c.host(1).ns.ip(&["route"])?.contains("10.244.2.0/24"));
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 1, "0.2")?.1, 0);
    assert_eq!(ping(&c.host(1).pod, pod_ip(3), 5, "0.05")?, (5, 5));
    Ok(())
}

#[test]
fn malformed_nodes_are_skipped_and_broken_files_keep_the_last_good_state() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.yaml");
    let mut bad_mac = flannel_node(3, None);
    bad_mac["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-data"] = json!("{\"VtepMAC\":\"not-a-mac\"}");
    let mut garbage = flannel_node(4, None);
    garbage["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-data"] = json!("{{{");
    let mut bad_ip = flannel_node(5, Some("02:00:00:00:05:01"));
    bad_ip["metadata"]["annotations"]["flannel.alpha.coreos.com/public-ip"] = json!("198.18.0.999");
    let mut no_cidr = flannel_node(6, Some("02:00:00:00:06:01"));
    no_cidr["spec"] = json!({});
    let mut outside = flannel_node(7, Some("02:00:00:00:07:01"));
    outside["spec"] = json!({"podCIDR": "10.99.7.0/24"});
    let mut overlap_own = flannel_node(8, Some("02:00:00:00:08:01"));
    overlap_own["spec"] = json!({"podCIDR": "10.244.1.0/25"});
    let mut overlap_peer = flannel_node(9, Some("02:00:00:00:09:01"));
    // node2's CIDR again: it sorts first by name and in the list, but appeared later, so it loses
    // (a CIDR inside node2's, by contrast, would be taken: longest prefix wins, as routing does)
    overlap_peer["spec"] = json!({"podCIDR": "10.244.2.0/24"});
    overlap_peer["metadata"]["name"] = json!("a-newcomer");
    overlap_peer["metadata"]["creationTimestamp"] = json!("2026-02-01T00:00:00Z");
    let mut node2 = flannel_node(2, Some(KERNEL_MAC));
    node2["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let mut agent = Agent::start(c.host(1), &nodes, &[])?;
    let mac = agent.status()?["vtep_mac"].as_str().unwrap_or_default().to_string();
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 10)?;

    write(
        &nodes,
        &node_list(vec![
            overlap_peer,
            flannel_node(1, None),
            node2,
            bad_mac,
            garbage,
            bad_ip,
            no_cidr,
            outside,
            overlap_own,
        ]),
    )?;
    for (node, why) in [
        ("node3", "VtepMAC"),
        ("node4", "not JSON"),
        ("node5", "public-ip"),
        ("node6", "pod cidr not assigned"),
        ("node7", "outside the network"),
        ("node8", "overlaps our own"),
        ("a-newcomer", "pod CIDR 10.244.2.0/24 is also node node2's, whose entry appeared first"),
    ] {
        agent.wait_log(&format!("node={node}"), Duration::from_secs(3))?;
        let log = agent.log_text();
        let line = log.lines().find(|l| l.contains(&format!("node={node}"))).unwrap_or_default();
        assert!(line.contains(why), "log for {node} should say {why:?}: {line}");
    }
    assert_eq!(peers(&agent.status()?), vec![("node2".to_string(), KERNEL_MAC.to_string())]);
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 5, "0.05")?, (5, 5), "the good peer keeps working");

    // a truncated file and invalid YAML: last good state stays, agent stays up
    let good = std::fs::read_to_string(&nodes)?;
    std::fs::write(&nodes, &good[..good.len() / 2])?;
    agent.wait_log("keeping the last good node list", Duration::from_secs(3))?;
    std::fs::write(&nodes, "kind: NodeList\nitems: [\n  - {")?;
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(peers(&agent.status()?), vec![("node2".to_string(), KERNEL_MAC.to_string())]);
    assert_eq!(ping(&c.host(1).pod, pod_ip(2), 5, "0.05")?, (5, 5));
    assert_eq!(agent.status()?["agent_running"], true);
    Ok(())
}
