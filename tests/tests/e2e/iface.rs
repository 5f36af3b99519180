//! Interface selection as flanneld does it, one test per rule, on a node
//! with two underlays: `eth0` (198.18.0.1/24, the default route's) and
//! `eth1` (198.19.0.1/24 and 198.19.0.11/24), both on the switch.
use std::time::Duration;

use anyhow::Result;
use edgevx_tests::{
    agent::Agent,
    nodes::{flannel_node, node_list, write},
    sh,
    topo::Cluster,
};

/// One node with a second underlay and a nodes file naming it.
struct TwoUnderlays {
    c: Cluster,
    nodes: String,
}

impl TwoUnderlays {
    fn new() -> Result<Self> {
        Self::with_node(flannel_node(1, None))
    }

    fn with_node(node: serde_json::Value) -> Result<Self> {
        let mut c = Cluster::new(1)?;
        c.host_mut(1).mount_bpffs()?;
        let (ns, sw) = (c.host(1).ns.name.clone(), c.switch.name.clone());
        sh(&["ip", "link", "add", "eth1", "netns", &ns, "type", "veth", "peer", "name", "sw1b", "netns", &sw])?;
        c.switch.ip(&["link", "set", "sw1b", "master", "br0", "up"])?;
        let n = &c.host(1).ns;
        n.ip(&["addr", "add", "198.19.0.1/24", "dev", "eth1"])?;
        n.ip(&["addr", "add", "198.19.0.11/24", "dev", "eth1"])?;
        n.ip(&["link", "set", "eth1", "up"])?;
        n.ip(&["route", "add", "default", "via", "198.18.0.254", "dev", "eth0"])?;
        let path = c.dir.join("nodes.json");
        write(&path, &node_list(vec![node]))?;
        let nodes = path.to_string_lossy().into_owned();
        Ok(TwoUnderlays { c, nodes })
    }

    /// Runs the agent with `args` and returns (underlay, VTEP source address),
    /// as the status reports them and as the kernel's flannel.1 holds them.
    fn chosen(&self, args: &[&str]) -> Result<(String, String)> {
        let h = self.c.host(1);
        let mut all = vec!["--nodes-file", self.nodes.as_str()];
        all.extend_from_slice(args);
        let mut agent = Agent::spawn_choosing_iface(h, &all)?;
        agent.wait_log("dataplane up", Duration::from_secs(20))?;
        let s = agent.status()?;
        let (iface, ip) =
            (s["iface"].as_str().unwrap_or("").to_string(), s["public_ip"].as_str().unwrap_or("").to_string());
        let vtep = h.ns.ip(&["-d", "link", "show", "flannel.1"])?;
        assert!(vtep.contains(&format!("local {ip} dev {iface} ")), "flannel.1 is not on {iface} from {ip}:\n{vtep}");
        agent.stop()?;
        Ok((iface, ip))
    }

    /// Runs the agent with `args`, which no interface matches yet: it waits
    /// (an interface may still appear), saying so; returns its log.
    fn waits(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--nodes-file", self.nodes.as_str()];
        all.extend_from_slice(args);
        let mut agent = Agent::spawn_choosing_iface(self.c.host(1), &all)?;
        agent.wait_log("not ready to bring up the dataplane", Duration::from_secs(20))?;
        agent.stop()?;
        let log = agent.log_text();
        // (an earlier run in the same node may have left flannel.1: the log tells this run's)
        assert!(!log.contains("dataplane up"), "brought up while nothing matched:\n{log}");
        Ok(log)
    }

    fn refused(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--nodes-file", self.nodes.as_str()];
        all.extend_from_slice(args);
        let mut agent = Agent::spawn_choosing_iface(self.c.host(1), &all)?;
        assert_eq!(agent.wait_exit(Duration::from_secs(20))?, Some(2), "{}", agent.log_text());
        Ok(agent.log_text())
    }
}

fn pair(iface: &str, ip: &str) -> (String, String) {
    (iface.to_string(), ip.to_string())
}

#[test]
fn iface_by_name_takes_that_interface_and_its_address() -> Result<()> {
    let n = TwoUnderlays::new()?;
    assert_eq!(n.chosen(&["--iface", "eth1"])?, pair("eth1", "198.19.0.1"));
    Ok(())
}

#[test]
fn iface_by_address_takes_the_interface_owning_it() -> Result<()> {
    let n = TwoUnderlays::new()?;
    assert_eq!(n.chosen(&["--iface", "198.19.0.11"])?, pair("eth1", "198.19.0.11"));
    Ok(())
}

#[test]
fn repeated_iface_the_first_that_exists_wins() -> Result<()> {
    let n = TwoUnderlays::new()?;
    let args = ["--iface", "nosuch0", "--iface", "198.19.7.7", "--iface", "eth1", "--iface", "eth0"];
    assert_eq!(n.chosen(&args)?, pair("eth1", "198.19.0.1"));
    let log = n.waits(&["--iface", "nosuch0", "--iface", "198.19.7.7"])?;
    assert!(log.contains("--iface nosuch0, --iface 198.19.7.7") && log.contains("eth1:"), "{log}");
    Ok(())
}

#[test]
fn iface_regex_matches_addresses_then_names_each_regex_in_turn() -> Result<()> {
    let n = TwoUnderlays::new()?;
    // "eth0" would match a name, but an address of eth1 matches first
    assert_eq!(
        n.chosen(&["--iface-regex", "^wlan", "--iface-regex", r"eth0|^198\.19\.0\.11$"])?,
        pair("eth1", "198.19.0.11")
    );
    assert_eq!(n.chosen(&["--iface-regex", "^wlan", "--iface-regex", "^eth1$"])?, pair("eth1", "198.19.0.1"));
    // as in flannel, the first name that matches is taken even without an
    // address (the pod's veth1 comes before eth1), and then waited on (an
    // address may still come)
    let log = n.waits(&["--iface-regex", "th1$"])?;
    assert!(log.contains("--iface-regex th1$"), "{log}");
    // --iface comes first, then the regexes
    assert_eq!(n.chosen(&["--iface", "eth0", "--iface-regex", "eth1"])?, pair("eth0", "198.18.0.1"));
    let log = n.refused(&["--iface-regex", "("])?;
    assert!(log.contains("--iface-regex \"(\""), "{log}");
    Ok(())
}

#[test]
fn iface_can_reach_takes_the_route_to_that_address() -> Result<()> {
    let n = TwoUnderlays::new()?;
    n.c.host(1).ns.ip(&[
        "route",
        "add",
        "198.19.9.0/24",
        "via",
        "198.19.0.254",
        "dev",
        "eth1",
        "src",
        "198.19.0.11",
    ])?;
    assert_eq!(n.chosen(&["--iface-can-reach", "198.19.9.9"])?, pair("eth1", "198.19.0.11"));
    assert_eq!(n.chosen(&["--iface-can-reach", "198.18.5.5"])?, pair("eth0", "198.18.0.1"));
    Ok(())
}

#[test]
fn public_ip_picks_the_interface_that_owns_it_else_the_default_route() -> Result<()> {
    let n = TwoUnderlays::new()?;
    assert_eq!(n.chosen(&[])?, pair("eth0", "198.18.0.1"), "no flag: the default route's interface");
    assert_eq!(n.chosen(&["--public-ip", "198.19.0.11"])?, pair("eth1", "198.19.0.11"));
    // owned by no interface (NATed in front of the node): the default route's interface
    assert_eq!(n.chosen(&["--public-ip", "198.19.200.1"])?, pair("eth0", "198.19.200.1"));
    // an explicit --iface wins over the owner of --public-ip, which stays the VTEP address
    assert_eq!(n.chosen(&["--iface", "eth0", "--public-ip", "198.19.0.1"])?, pair("eth0", "198.19.0.1"));
    Ok(())
}

#[test]
fn node_public_ip_beats_the_flag_and_picks_its_interface() -> Result<()> {
    let mut node = flannel_node(1, None);
    node["metadata"]["annotations"]["flannel.alpha.coreos.com/node-public-ip"] = "198.19.0.11".into();
    let n = TwoUnderlays::with_node(node)?;
    assert_eq!(n.chosen(&["--public-ip", "198.18.0.1"])?, pair("eth1", "198.19.0.11"));
    assert_eq!(n.chosen(&[])?, pair("eth1", "198.19.0.11"));
    Ok(())
}
