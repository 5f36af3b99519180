//! ADD and DEL as `main` runs them (lock, ledger, command, commit) on a
//! store in a temporary directory: identity per interface, and store
//! entries that cannot be read.
use std::{fs, net::IpAddr, path::PathBuf, time::Duration};

use crate::{
    add,
    env::Attachment,
    identity::DAMAGED_DIR,
    identity::PodRef,
    ledger::Ledger,
    range::{Range, RangeSet},
    release,
    store::{PODS_DIR, Store},
};

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("edgevx-ipam-ledger-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        Dir(d)
    }

    fn add(&self, pod: &str, container_id: &str, ifname: &str) -> IpAddr {
        let sets = [RangeSet::new(vec![Range::new("10.99.5.0/24", None, None, None).unwrap()]).unwrap()];
        let store = Store::open_locked(&self.0).unwrap();
        let mut ledger = Ledger::load(&store, Duration::from_secs(3600)).unwrap();
        let pod = PodRef { namespace: "default".into(), name: pod.into() };
        let ips = add::add(&mut ledger, &sets, &pod, &att(container_id, ifname)).unwrap();
        store.commit().unwrap();
        ips[0].address
    }

    fn del(&self, container_id: &str, ifname: &str) -> Vec<IpAddr> {
        let store = Store::open_locked(&self.0).unwrap();
        let mut ledger = Ledger::for_release(&store, container_id, ifname).unwrap();
        let released = release::del(&mut ledger, &att(container_id, ifname)).unwrap();
        store.commit().unwrap();
        released
    }

    fn holder(&self, ip: IpAddr) -> Option<String> {
        fs::read_to_string(self.0.join(ip.to_string())).ok()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn att(container_id: &str, ifname: &str) -> Attachment {
    Attachment { container_id: container_id.into(), ifname: ifname.into() }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn each_interface_of_a_container_has_its_own_address() {
    let d = Dir::new("ifaces");
    let eth0 = d.add("multi", "cA", "eth0");
    let net1 = d.add("multi", "cA", "net1");
    assert_ne!(eth0, net1, "net1 was given eth0's address");
    assert_eq!(d.holder(eth0).as_deref(), Some("cA\r\neth0"));
    assert_eq!(d.holder(net1).as_deref(), Some("cA\r\nnet1"));
    assert_eq!(d.add("multi", "cA", "net1"), net1, "a retried ADD gets the same address");
    assert_eq!(d.del("cA", "net1"), [net1]);
    assert_eq!(d.holder(eth0).as_deref(), Some("cA\r\neth0"), "DEL of net1 released eth0's");
    // the node reboots: the pod's new sandbox gets each interface's address back, in either order
    assert_eq!(d.add("multi", "cB", "net1"), net1);
    assert_eq!(d.add("multi", "cB", "eth0"), eth0);
    assert_eq!(d.holder(eth0).as_deref(), Some("cB\r\neth0"));
    assert_eq!(d.holder(net1).as_deref(), Some("cB\r\nnet1"));
}

#[test]
fn a_bare_id_is_eth0s_to_add_and_released_by_any_interface() {
    let d = Dir::new("bare");
    fs::create_dir_all(&d.0).unwrap();
    fs::write(d.0.join("10.99.5.2"), "cOld").unwrap();
    let net1 = d.add("old", "cOld", "net1");
    assert_ne!(net1, ip("10.99.5.2"), "net1 took the legacy (eth0) address as its own");
    assert_eq!(d.add("old", "cOld", "eth0"), ip("10.99.5.2"), "eth0's retried ADD finds its legacy address");
    // host-local's ReleaseByID: a bare ID is any interface's
    let mut released = d.del("cOld", "net1");
    released.sort();
    assert_eq!(released, [ip("10.99.5.2"), net1]);
}

#[test]
fn unreadable_entries_cost_their_address_only_and_damaged_records_are_released() {
    let d = Dir::new("unreadable");
    let a = d.add("a", "cA", "eth0");
    let pods = d.0.join(PODS_DIR);
    // a's record cut short before its pod, a stray file, a directory named by an address,
    // an empty record of a free address, a garbled hint
    fs::write(pods.join(a.to_string()), r#"{"pod":{"namespace":"def"#).unwrap();
    fs::write(pods.join("README"), "notes").unwrap();
    fs::create_dir(d.0.join("10.99.5.3")).unwrap();
    fs::write(pods.join("10.99.5.4"), "").unwrap();
    fs::write(d.0.join("last_reserved_ip.0"), "garbage").unwrap();
    let b = d.add("b", "cB", "eth0");
    // the empty record's address is free again: the walk (its hint garbled) finds it first
    assert_eq!(b, ip("10.99.5.4"));
    // nothing says whose they were: released, their bytes kept aside, never deleted
    assert!(!pods.join(a.to_string()).exists());
    let kept: Vec<Vec<u8>> =
        fs::read_dir(d.0.join(DAMAGED_DIR)).unwrap().map(|e| fs::read(e.unwrap().path()).unwrap()).collect();
    assert!(kept.contains(&br#"{"pod":{"namespace":"def"#.to_vec()) && kept.contains(&Vec::new()), "{kept:?}");
    // a keeps its reservation until its DEL, as host-local's would
    assert_eq!(d.holder(a).as_deref(), Some("cA\r\neth0"));
    assert_eq!(d.del("cA", "eth0"), [a]);
    let mut got = Vec::new();
    for k in 0..4 {
        got.push(d.add(&format!("c{k}"), &format!("cC{k}"), "eth0"));
    }
    assert!(!got.contains(&ip("10.99.5.3")) && !got.contains(&b), "{got:?}");
    assert!(pods.join("README").is_file() && d.0.join("10.99.5.3").is_dir());
}

#[test]
fn a_record_cut_short_after_its_pod_is_repaired_and_the_pod_keeps_its_address() {
    let d = Dir::new("repair");
    let a = d.add("web-0", "cA", "eth0");
    let other = d.add("web-1", "cO", "eth0");
    let pods = d.0.join(PODS_DIR);
    let whole = fs::read_to_string(pods.join(a.to_string())).unwrap();
    let cut = whole.find("\"containerID\"").unwrap() + 10;
    fs::write(pods.join(a.to_string()), &whole[..cut]).unwrap();
    // the node reboots, no DEL: web-0's new sandbox gets its address back
    d.add("web-2", "cX", "eth0");
    let record: serde_json::Value = serde_json::from_slice(&fs::read(pods.join(a.to_string())).unwrap()).unwrap();
    assert_eq!(
        (record["pod"]["name"].as_str(), record["containerID"].as_str()),
        (Some("web-0"), Some("cA")),
        "{record}"
    );
    assert_eq!(d.add("web-0", "cB", "eth0"), a);
    assert_eq!(d.holder(a).as_deref(), Some("cB\r\neth0"));
    assert_eq!(d.holder(other).as_deref(), Some("cO\r\neth0"));
}
