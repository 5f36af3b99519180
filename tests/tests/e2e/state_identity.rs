//! A state dir belongs to one node (issue 33, finding 4). One copied from
//! another node (a golden image, a cloned VM, a moved disk) is moved
//! aside, whole, and not used: not its subnet while the API is down, not
//! its VTEP MAC once the API answers. A VTEP MAC another node publishes is
//! never taken, wherever it comes from.
use std::{fs, path::Path, time::Duration};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    kubeapi::KubeApi,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host, node_name, pod_ip, subnet},
    traffic::{ping, wait_reachable},
};
use serde_json::{Value, json};

use crate::KERNEL_MAC;

/// A node as kubelet registers it, before any network agent annotates it.
fn bare_node(i: u8) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(i), "annotations": {}},
        "spec": {"podCIDR": subnet(i), "podCIDRs": [subnet(i)]},
    })
}

/// The stand-in API inside node `i`'s namespace knowing `nodes`, and the
/// kubeconfig that reaches it.
fn api_in(c: &Cluster, i: u8, nodes: Vec<Value>) -> Result<(KubeApi, String)> {
    let api = KubeApi::start_in(&c.host(i).ns.name)?;
    for n in nodes {
        api.put_node(n);
    }
    let kc = c.host(i).dir.join("kubeconfig");
    api.kubeconfig(&kc)?;
    Ok((api, kc.to_string_lossy().into_owned()))
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for e in fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            fs::copy(e.path(), &target).with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// The subdirectories a foreign state dir was moved into.
fn set_aside(host: &Host) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in fs::read_dir(host.state_dir())? {
        let e = e?;
        if e.file_name().to_string_lossy().starts_with("other-node.") {
            out.push(e.path());
        }
    }
    Ok(out)
}

fn mac_in(dir: &Path) -> Result<String> {
    Ok(fs::read_to_string(dir.join("vtep-mac"))
        .with_context(|| format!("no vtep-mac in {}", dir.display()))?
        .trim()
        .into())
}

#[test]
fn a_state_dir_copied_from_another_node_is_moved_aside_and_not_used() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    c.host_mut(2).mount_bpffs()?;
    // node1 runs once with its API: its state dir holds its MAC and a cached view with its subnet
    let (api1, kc1) = api_in(&c, 1, vec![bare_node(1)])?;
    let mut agent1 = Agent::start_with(c.host(1), &["--kube", "--kubeconfig", &kc1])?;
    let mac1 = agent1.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    wait_status(&agent1, Duration::from_secs(10), "the view cached", |_| {
        c.host(1).state_dir().join("last-view.json").exists()
    })?;
    agent1.stop()?;
    drop(api1);

    // node2 boots from an image of node1's disk, its API unreachable
    copy_dir(&c.host(1).state_dir(), &c.host(2).state_dir())?;
    let (api2, kc2) = api_in(&c, 2, vec![bare_node(2), flannel_node(1, Some(&mac1))])?;
    api2.set_down(true);
    let mut agent2 = Agent::spawn(c.host(2), &["--kube", "--kubeconfig", &kc2])?;
    agent2.wait_log("the state dir belongs to another node", Duration::from_secs(20))?;
    let log = agent2.log_text();
    ensure!(log.contains("node \"node1\"") && log.contains("node \"node2\""), "both identities named:\n{log}");
    agent2.wait_log("no cached view; waiting for the control plane", Duration::from_secs(10))?;
    // long enough for a restore from a cache to have written subnet.env (it takes well under a second)
    std::thread::sleep(Duration::from_secs(3));
    ensure!(!c.host(2).subnet_file().exists(), "node1's subnet went into node2's subnet.env:\n{}", agent2.log_text());
    ensure!(c.host(2).ns.ip(&["link", "show", "flannel.1"]).is_err(), "a VTEP came up from node1's state");
    // nothing lost: node1's files, moved aside untouched
    let aside = set_aside(c.host(2))?;
    ensure!(aside.len() == 1, "{aside:?}");
    ensure!(mac_in(&aside[0])? == mac1, "node1's MAC was not kept aside");
    ensure!(aside[0].join("last-view.json").exists() && aside[0].join("owner.json").exists());
    let owner: Value = serde_json::from_slice(&fs::read(c.host(2).state_dir().join("owner.json"))?)?;
    ensure!(owner["node"] == "node2", "not stamped for node2: {owner}");

    // the API answers: node2 comes up as itself
    api2.set_down(false);
    agent2.wait_log("dataplane up", Duration::from_secs(20))?;
    let s = agent2.status()?;
    let mac2 = s["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    ensure!(mac2 != mac1, "node2 took node1's MAC {mac1}");
    ensure!(s["subnet"] == subnet(2), "{s}");
    let env = fs::read_to_string(c.host(2).subnet_file())?;
    ensure!(env.contains("FLANNEL_SUBNET=10.244.2.1/24"), "{env}");
    let patches = api2.wait_patches(Duration::from_secs(10), |p| !p.is_empty())?;
    let published = patches[0].body["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-data"].to_string();
    ensure!(published.contains(&mac2) && !published.contains(&mac1), "published {published}");
    Ok(())
}

/// Runs the command that follows in a private mount namespace whose
/// `/etc/machine-id` reads as `$EVX_MACHINE_ID` (set with `env`).
fn with_machine_id(file: &Path) -> Vec<String> {
    vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!("mount --bind {} /etc/machine-id && exec \"$@\"", file.display()),
        "sh".into(),
    ]
}

#[test]
fn the_same_node_name_on_another_machine_does_not_take_the_state_dir() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let nodes = nodes.to_string_lossy().into_owned();
    let (id_a, id_b) = (c.dir.join("machine-id-a"), c.dir.join("machine-id-b"));
    fs::write(&id_a, "0123456789abcdef0123456789abcdef\n")?;
    fs::write(&id_b, "fedcba9876543210fedcba9876543210\n")?;
    let run = |id: &Path| -> Result<Agent> {
        let wrapper = with_machine_id(id);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let mut a = Agent::spawn_via(c.host(1), &wrapper, &["--nodes-file", &nodes])?;
        a.wait_log("dataplane up", Duration::from_secs(20))?;
        Ok(a)
    };
    // the fake works, or this test proves nothing
    let mut probe: Vec<String> = with_machine_id(&id_b);
    probe.extend(["cat".into(), "/etc/machine-id".into()]);
    let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
    ensure!(c.host(1).ns.run(&probe)?.starts_with("fedcba98"), "the machine-id is not faked");

    let mut first = run(&id_a)?;
    let mac_a = first.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    first.stop()?;
    // the same machine again: its own state dir, its MAC
    let mut again = run(&id_a)?;
    ensure!(again.status()?["vtep_mac"] == mac_a.as_str(), "{}", again.log_text());
    ensure!(!again.log_text().contains("belongs to another node") && set_aside(c.host(1))?.is_empty());
    again.stop()?;

    // the disk moved to another machine that is also called node1
    let moved = run(&id_b)?;
    let log = moved.log_text();
    ensure!(
        log.contains("the state dir belongs to another node")
            && log.contains("machine-id 0123456789abcdef0123456789abcdef")
            && log.contains("machine-id fedcba9876543210fedcba9876543210"),
        "{log}"
    );
    let mac_b = moved.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    ensure!(mac_b != mac_a, "the other machine's MAC was used");
    let aside = set_aside(c.host(1))?;
    ensure!(aside.len() == 1 && mac_in(&aside[0])? == mac_a, "{aside:?}");
    // and it forwards
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac_b)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20).with_context(|| moved.log_text())?;
    Ok(())
}

#[test]
fn a_vtep_mac_another_node_publishes_is_replaced() -> Result<()> {
    let mut c = Cluster::new(2)?;
    c.host_mut(1).mount_bpffs()?;
    // node1's state dir, from an older release (no owner record), holds the MAC node2 publishes
    fs::create_dir_all(c.host(1).state_dir())?;
    fs::write(c.host(1).state_dir().join("vtep-mac"), format!("{KERNEL_MAC}\n"))?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None), flannel_node(2, Some(KERNEL_MAC))]))?;
    let agent = Agent::start(c.host(1), &nodes, &[])?;
    let log = agent.log_text();
    ensure!(log.contains("adopting it as this node's"), "the unstamped state dir was not said to be adopted:\n{log}");
    ensure!(log.contains("the one node \"node2\" publishes"), "the conflict was not named:\n{log}");
    let mac = agent.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    ensure!(mac != KERNEL_MAC, "node1 uses node2's MAC");
    ensure!(mac_in(&c.host(1).state_dir())? == mac, "the new MAC is not the saved one");
    wait_status(&agent, Duration::from_secs(10), "node2 a peer", |s| peers(s).len() == 1)?;
    c.host(2).kernel_vtep(KERNEL_MAC)?;
    c.host(2).kernel_add_peer(1, &mac)?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    ensure!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")? == (5, 5), "node2 -> node1:\n{}", agent.log_text());
    Ok(())
}
