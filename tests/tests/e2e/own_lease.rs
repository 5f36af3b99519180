//! A node's own etcd lease is not decided by key order (issue 33, finding 3,
//! for the node's own lease). flanneld takes the first lease in etcd's list
//! that claims its PublicIP; a lease claiming node2's PublicIP with a key
//! that sorts first (`10.244.100.0-24` before `10.244.2.0-24`) would then be
//! node2's after every restart, moving its pods into a subnet of the
//! attacker's choosing. Here node2 keeps its own lease, whether it restarts
//! with subnet.env, with nothing recorded at all (the first lease to appear
//! decides), or offline from its cache; the peers keep reaching it. Two
//! claimants etcd cannot order (one transaction) are both refused by name.
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    agent::{Agent, peers, wait_status},
    etcd::{Etcd, PREFIX},
    topo::{Cluster, pod_ip},
    traffic::{ping, wait_reachable},
};

use crate::etcd::{CONFIG, etcd_args, lease, previous_subnet};

const HOSTILE_KEY: &str = "10.244.100.0-24";
const HOSTILE_MAC: &str = "02:aa:00:00:00:66";
const NODE2_IP: &str = "198.18.0.2";

fn subnets() -> String {
    format!("{PREFIX}/subnets/")
}

fn value_of(etcd: &Etcd, short: &str) -> Result<Option<String>> {
    let key = format!("{}{short}", subnets());
    Ok(etcd.get_prefix(&subnets())?.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v))
}

/// node2 runs on 10.244.2.0/24 with its own MAC, and node1 reaches its pod
/// through it (not through the hostile lease).
fn node2_kept_its_lease(c: &Cluster, etcd: &Etcd, a1: &Agent, a2: &Agent, mac2: &str) -> Result<()> {
    let s2 = a2.status()?;
    ensure!(s2["subnet"] == "10.244.2.0/24", "node2 took another subnet: {s2:#}");
    ensure!(s2["vtep_mac"] == mac2, "node2's VTEP MAC changed: {s2:#}");
    // the hostile lease is left as it was: node2 neither took nor rewrote it
    let hostile = value_of(etcd, HOSTILE_KEY)?.context("the hostile lease vanished")?;
    ensure!(hostile.contains(HOSTILE_MAC), "node2 rewrote the hostile lease: {hostile}");
    let own = value_of(etcd, "10.244.2.0-24")?.context("node2's lease is gone")?;
    ensure!(own.contains(mac2) && own.contains(NODE2_IP), "node2's lease: {own}");
    // node2 refuses the other claimant as a peer; node1 keeps node2's real
    // lease (a shared public IP keeps both entries there, as in flannel)
    ensure!(!peers(&s2).iter().any(|(n, _)| n == HOSTILE_KEY), "node2 has the hostile lease as a peer: {s2:#}");
    let want = ("10.244.2.0-24".to_string(), mac2.to_string());
    wait_status(a1, Duration::from_secs(10), "node2's own lease as node1's peer", |s| peers(s).contains(&want))?;
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;
    ensure!(ping(&c.host(2).pod, pod_ip(1), 5, "0.05")? == (5, 5), "node2's pod cannot reach node1's");
    Ok(())
}

#[test]
fn a_lease_claiming_our_public_ip_with_a_key_sorting_first_is_not_taken_as_ours() -> Result<()> {
    let mut c = Cluster::new(2)?;
    let mut etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    for i in [1, 2] {
        c.host_mut(i).mount_bpffs()?;
        previous_subnet(c.host(i))?;
    }
    let a1 = Agent::start_with(c.host(1), &etcd_args(&[]))?;
    let mut a2 = Agent::start_with(c.host(2), &etcd_args(&[]))?;
    ensure!(a2.status()?["subnet"] == "10.244.2.0/24", "node2 did not get its previous subnet");
    let mac2 = a2.status()?["vtep_mac"].as_str().context("no vtep_mac")?.to_string();
    wait_reachable(&c.host(1).pod, pod_ip(2), 20)?;

    // the attack: a TTL-less lease with node2's PublicIP, written after
    // node2's, whose key sorts before node2's in etcd's list
    etcd.put(&format!("{}{HOSTILE_KEY}", subnets()), &lease(NODE2_IP, HOSTILE_MAC))?;
    let revs = etcd.create_revisions(&subnets())?;
    let rev = |short: &str| revs.iter().find(|(k, _)| k.ends_with(short)).map(|(_, r)| *r);
    ensure!(rev("10.244.2.0-24") < rev(HOSTILE_KEY), "the hostile lease is not the newer: {revs:?}");
    let keys = etcd.get_prefix(&subnets())?.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    let first_of_node2 = keys.iter().find(|k| k.ends_with(HOSTILE_KEY) || k.ends_with("10.244.2.0-24"));
    ensure!(first_of_node2.is_some_and(|k| k.ends_with(HOSTILE_KEY)), "the hostile key does not sort first: {keys:?}");
    // the running cluster is unmoved
    node2_kept_its_lease(&c, &etcd, &a1, &a2, &mac2)?;

    // 1. a restart with subnet.env, as after `systemctl restart`
    a2.stop()?;
    let mut a2 = Agent::start_with(c.host(2), &etcd_args(&[]))?;
    a2.wait_log("reusing our lease", Duration::from_secs(10))?;
    ensure!(a2.log_text().contains("other leases claim this node's PublicIP"), "{}", a2.log_text());
    node2_kept_its_lease(&c, &etcd, &a1, &a2, &mac2).context("after a restart with subnet.env")?;

    // 2. nothing recorded (subnet.env gone with /run, no cached view): the
    //    lease that appeared first is ours
    a2.stop()?;
    std::fs::remove_file(c.host(2).subnet_file())?;
    std::fs::remove_file(c.host(2).state_dir().join("last-view.json"))?;
    let mut a2 = Agent::start_with(c.host(2), &etcd_args(&[]))?;
    a2.wait_log("reusing our lease", Duration::from_secs(10))?;
    node2_kept_its_lease(&c, &etcd, &a1, &a2, &mac2).context("after a restart with nothing recorded")?;

    // 3. offline: etcd is down, node2 restarts without subnet.env and
    //    restores from its cache, then etcd returns: the same subnet throughout
    a2.stop()?;
    std::fs::remove_file(c.host(2).subnet_file())?;
    etcd.stop();
    let mut a2 = Agent::start_with(c.host(2), &etcd_args(&[]))?;
    ensure!(a2.log_text().contains("restoring the dataplane from the cached view first"), "{}", a2.log_text());
    ensure!(a2.status()?["subnet"] == "10.244.2.0/24", "node2 restored another subnet: {}", a2.status()?);
    ensure!(ping(&c.host(1).pod, pod_ip(2), 5, "0.05")? == (5, 5), "node2 unreachable while etcd is down");
    etcd.resume()?;
    a2.wait_log("reusing our lease", Duration::from_secs(30))?;
    node2_kept_its_lease(&c, &etcd, &a1, &a2, &mac2).context("after an offline restore and etcd's return")?;
    Ok(())
}

#[test]
fn two_claimants_etcd_cannot_order_are_both_refused_by_name() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let etcd = Etcd::start(&c)?;
    etcd.put(&format!("{PREFIX}/config"), CONFIG)?;
    // node1 has no record of its own (no subnet.env, no cache); two leases
    // claiming its PublicIP appear in one transaction: one create revision
    let (a, b) = ("10.244.100.0-24", "10.244.7.0-24");
    let (va, vb) = (lease("198.18.0.1", "02:aa:00:00:00:0a"), lease("198.18.0.1", "02:aa:00:00:00:0b"));
    etcd.put_in_one_txn(&[(&format!("{}{a}", subnets()), &va), (&format!("{}{b}", subnets()), &vb)])?;
    let revs = etcd.create_revisions(&subnets())?;
    ensure!(revs.len() == 2 && revs[0].1 == revs[1].1, "not one create revision: {revs:?}");

    let mut agent = Agent::spawn(c.host(1), &etcd_args(&[]))?;
    agent.wait_log("both claim this node's PublicIP 198.18.0.1", Duration::from_secs(15))?;
    let log = agent.log_text();
    let line = log.lines().find(|l| l.contains("both claim")).context("no refusal")?;
    ensure!(line.contains(a) && line.contains(b), "the refusal does not name both leases: {line}");
    // neither was taken nor rewritten, and no third lease was acquired
    std::thread::sleep(Duration::from_secs(2));
    let all = etcd.get_prefix(&subnets())?;
    ensure!(all.len() == 2, "a lease was acquired or deleted: {all:?}");
    ensure!(value_of(&etcd, a)?.as_deref() == Some(va.as_str()), "{a} was rewritten: {all:?}");
    ensure!(value_of(&etcd, b)?.as_deref() == Some(vb.as_str()), "{b} was rewritten: {all:?}");
    ensure!(!c.host(1).subnet_file().exists(), "subnet.env was written");

    // the operator deletes the one that is not node1's: node1 takes the other
    etcd.ctl(&["del", &format!("{}{a}", subnets())])?;
    // (both were written without a TTL: reservations, kept TTL-less)
    agent.wait_log("using our reserved subnet", Duration::from_secs(30))?;
    agent.wait_log("dataplane up", Duration::from_secs(20))?;
    ensure!(agent.status()?["subnet"] == "10.244.7.0/24", "{}", agent.status()?);
    Ok(())
}
