//! The IPv6 table's plan and its write order, against a fake writer.
use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::reconcile::Hop;

fn peer(node: &str, subnet: &str, ip: &str, mac: &str) -> Peer {
    let mut p = crate::reconcile::test_peer(node, "10.244.9.0/24", "198.18.0.9");
    p.v6 =
        Some(Half { subnet: subnet.parse().unwrap(), public_ip: ip.parse().unwrap(), vtep_mac: mac.parse().unwrap() });
    p
}

#[test]
fn each_peer_gets_flannels_three_entries() {
    let a = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    let mut v4_only = peer("old", "fd00:10:244:3::/64", "fd00:198:18::3", "02:66:00:00:00:03");
    v4_only.v6 = None;
    let (t, skipped) = plan(&[a, v4_only], OWN, &OnLink::default());
    assert!(skipped.is_empty());
    let base: Ipv6Addr = "fd00:10:244:2::".parse().unwrap();
    let mac: VtepMac = "02:66:00:00:00:02".parse().unwrap();
    assert_eq!(t.neigh, BTreeMap::from([(base, mac)]));
    assert_eq!(t.fdb, BTreeSet::from([(mac, "fd00:198:18::2".parse().unwrap())]));
    assert_eq!(t.routes, BTreeMap::from([("fd00:10:244:2::/64".parse().unwrap(), base)]));
}

/// Our own public IPv6 in these tests.
const OWN: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x198, 0x18, 0, 0, 0, 0, 1);

#[test]
fn a_peer_claiming_our_public_ipv6_is_skipped() {
    let me = peer("me-again", "fd00:10:244:2::/64", "fd00:198:18::1", "02:66:00:00:00:02");
    let (t, skipped) = plan(&[me], OWN, &OnLink::default());
    assert_eq!(t, Ipv6Entries::default());
    assert!(skipped[0].reason.contains("this node's"), "{:?}", skipped);
}

#[test]
fn a_shared_v6_mac_goes_to_the_entry_that_appeared_first_whatever_the_order() {
    let mut a = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    let mut b = peer("aaa", "fd00:10:244:3::/64", "fd00:198:18::3", "02:66:00:00:00:02");
    a.appeared = Some(100);
    b.appeared = Some(200);
    for order in [[a.clone(), b.clone()], [b.clone(), a.clone()]] {
        let (t, skipped) = plan(&order, OWN, &OnLink::default());
        assert_eq!(t.fdb.iter().map(|(_, ip)| ip.to_string()).collect::<Vec<_>>(), ["fd00:198:18::2"]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].node, "aaa");
        assert!(skipped[0].reason.contains("also a's, whose entry appeared first"), "{}", skipped[0].reason);
    }
    // neither known to be first: neither is programmed
    let (a, b) = (Peer { appeared: None, ..a }, Peer { appeared: None, ..b });
    let (t, skipped) = plan(&[a.clone(), b], OWN, &OnLink::default());
    assert!(t.fdb.is_empty() && t.routes.is_empty());
    assert_eq!(skipped.len(), 2);
    // one MAC at one address for two subnets (one VTEP): both stay
    let c = peer("c", "fd00:10:244:4::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    let (t, skipped) = plan(&[a, c], OWN, &OnLink::default());
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!((t.fdb.len(), t.routes.len()), (1, 2));
}

/// fd00:198:18::/64 is our segment; the rest is behind a router.
fn segment() -> OnLink<Ipv6Net> {
    let hop = |dst: &str, direct| Hop { dst: dst.parse().unwrap(), direct };
    OnLink::new(vec![hop("fd00:198:18::/64", true), hop("::/0", false)], "fd00:10:244::/56".parse().unwrap())
}

#[test]
fn an_on_link_peer_gets_a_direct_route_and_nothing_on_the_device() {
    let near = peer("near", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    let far = peer("far", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03");
    let (t, skipped) = plan(&[near.clone(), far], OWN, &segment());
    assert!(skipped.is_empty());
    let direct: Vec<_> = t.direct.iter().map(|(n, ip)| format!("{n} via {ip}")).collect();
    assert_eq!(direct, ["fd00:10:244:2::/64 via fd00:198:18::2"]);
    // the far peer alone has flannel's three entries
    let far_base: Ipv6Addr = "fd00:10:244:3::".parse().unwrap();
    assert_eq!(t.neigh.keys().collect::<Vec<_>>(), [&far_base]);
    assert_eq!(t.fdb.iter().map(|(_, ip)| ip.to_string()).collect::<Vec<_>>(), ["fd00:198:18:1::3"]);
    assert_eq!(t.routes, BTreeMap::from([("fd00:10:244:3::/64".parse().unwrap(), far_base)]));
    // DirectRouting off: the three entries, no direct route
    let (off, _) = plan(&[near], OWN, &OnLink::default());
    assert!(off.direct.is_empty());
    assert_eq!((off.neigh.len(), off.fdb.len(), off.routes.len()), (1, 1, 1));
}

#[test]
fn the_decision_is_per_family() {
    // on-link over IPv6, behind the router over IPv4: the IPv6 plan alone goes direct
    let mut p = peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    p.v4.as_mut().unwrap().public_ip = "198.18.1.2".parse().unwrap();
    assert_eq!(plan(std::slice::from_ref(&p), OWN, &segment()).0.direct.len(), 1);
    // the reverse: VXLAN over IPv6
    let far = peer("b", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03");
    let (t, _) = plan(&[far], OWN, &segment());
    assert!(t.direct.is_empty());
    assert_eq!(t.routes.len(), 1);
}

#[test]
fn a_direct_peer_takes_no_vtep_mac() {
    // a direct peer has no fdb entry, so a VXLAN peer with the same MAC is not a clash
    let near = peer("near", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    let far = peer("far", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:02");
    let (t, skipped) = plan(&[near, far], OWN, &segment());
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!((t.direct.len(), t.routes.len()), (1, 1));
}

#[test]
fn both_maps_hold_every_peer_but_one_claiming_our_address() {
    // the direct peer and the one losing its MAC are judged all the same: they may send VXLAN
    let near = peer("near", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02");
    let mut a = peer("a", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03");
    let mut b = peer("b", "fd00:10:244:4::/64", "fd00:198:18:1::4", "02:66:00:00:00:03");
    let me = peer("me", "fd00:10:244:5::/64", "fd00:198:18::1", "02:66:00:00:00:05");
    (a.appeared, b.appeared) = (Some(1), Some(2));
    let (t, skipped) = plan(&[near, a, b, me], OWN, &segment());
    assert_eq!(skipped.iter().map(|s| s.node.as_str()).collect::<Vec<_>>(), ["b", "me"]);
    let owners: Vec<String> = t.owners.iter().map(|(n, ip)| format!("{n} {ip}")).collect();
    assert_eq!(
        owners,
        [
            "fd00:10:244:2::/64 fd00:198:18::2",
            "fd00:10:244:3::/64 fd00:198:18:1::3",
            "fd00:10:244:4::/64 fd00:198:18:1::4"
        ]
    );
    assert_eq!(t.accept.len(), 3);
    assert!(!t.accept.contains_key(&OWN));
}

#[test]
fn a_peer_is_held_by_its_public_ipv6_in_the_accept_map() {
    let a = peer("a", "fd00:10:244:2::/64", "fd00:198:18:1::2", "02:66:00:00:00:02");
    let (have, _) = plan(std::slice::from_ref(&a), OWN, &OnLink::default());
    assert!(holds(&have, &a));
    let elsewhere = peer("a", "fd00:10:244:2::/64", "fd00:198:18:1::9", "02:66:00:00:00:02");
    assert!(!holds(&have, &elsewhere));
    let v4_only = Peer { v6: None, ..a };
    assert!(!holds(&have, &v4_only));
}

/// A writer in memory that logs each write and can fail one.
#[derive(Default)]
struct Fake {
    have: Ipv6Entries,
    log: Vec<String>,
    fail: Option<&'static str>,
}

impl Fake {
    fn write(&mut self, line: String) -> anyhow::Result<()> {
        if self.fail.is_some_and(|f| line.starts_with(f)) {
            anyhow::bail!("injected");
        }
        self.log.push(line);
        Ok(())
    }
}

impl Ipv6EntryWriter for Fake {
    async fn put_owner(&mut self, net: Ipv6Net, ip: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("+owner {net}"))?;
        self.have.owners.insert(net, ip);
        Ok(())
    }
    async fn del_owner(&mut self, net: Ipv6Net) -> anyhow::Result<()> {
        self.write(format!("-owner {net}"))?;
        self.have.owners.remove(&net);
        Ok(())
    }
    async fn put_accept(&mut self, ip: Ipv6Addr, a: Accept<Ipv6Net>) -> anyhow::Result<()> {
        self.write(format!("+accept {ip}"))?;
        self.have.accept.insert(ip, a);
        Ok(())
    }
    async fn del_accept(&mut self, ip: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("-accept {ip}"))?;
        self.have.accept.remove(&ip);
        Ok(())
    }
    async fn put_neigh(&mut self, ip: Ipv6Addr, mac: VtepMac) -> anyhow::Result<()> {
        self.write(format!("+neigh {ip}"))?;
        self.have.neigh.insert(ip, mac);
        Ok(())
    }
    async fn del_neigh(&mut self, ip: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("-neigh {ip}"))?;
        self.have.neigh.remove(&ip);
        Ok(())
    }
    async fn put_fdb(&mut self, mac: VtepMac, ip: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("+fdb {ip}"))?;
        self.have.fdb.insert((mac, ip));
        Ok(())
    }
    async fn del_fdb(&mut self, mac: VtepMac, ip: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("-fdb {ip}"))?;
        self.have.fdb.remove(&(mac, ip));
        Ok(())
    }
    async fn put_route(&mut self, net: Ipv6Net, gw: Ipv6Addr) -> anyhow::Result<()> {
        // the kernel's refusal: an onlink gateway a route through the underlay reaches
        if self.have.direct.keys().any(|d| d.contains(&gw)) {
            anyhow::bail!("Nexthop has invalid gateway or device mismatch");
        }
        self.write(format!("+route {net}"))?;
        self.have.routes.insert(net, gw);
        Ok(())
    }
    async fn del_route(&mut self, net: Ipv6Net, _: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("-route {net}"))?;
        self.have.routes.remove(&net);
        Ok(())
    }
    async fn put_direct(&mut self, net: Ipv6Net, ip: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("+direct {net}"))?;
        // the kernel replaces the route of the same destination in place, whatever its device
        self.have.routes.remove(&net);
        self.have.direct.insert(net, ip);
        Ok(())
    }
    async fn del_direct(&mut self, net: Ipv6Net, _: Ipv6Addr) -> anyhow::Result<()> {
        self.write(format!("-direct {net}"))?;
        self.have.direct.remove(&net);
        Ok(())
    }
}

/// One pass: plan `peers`, write the difference from what the fake holds.
async fn pass(w: &mut Fake, peers: &[Peer], on_link: &OnLink<Ipv6Net>) -> Outcome {
    w.log.clear();
    let (want, _) = plan(peers, OWN, on_link);
    let changes = diff(&want, &w.have.clone());
    apply(w, &changes).await
}

#[tokio::test]
async fn a_new_peer_is_judged_first_and_routed_last_and_a_gone_one_the_other_way_round() {
    let mut w = Fake::default();
    let a = peer("a", "fd00:10:244:2::/64", "fd00:198:18:1::2", "02:66:00:00:00:02");
    assert!(pass(&mut w, std::slice::from_ref(&a), &OnLink::default()).await.ok());
    assert_eq!(
        w.log,
        [
            "+owner fd00:10:244:2::/64",
            "+accept fd00:198:18:1::2",
            "+neigh fd00:10:244:2::",
            "+fdb fd00:198:18:1::2",
            "+route fd00:10:244:2::/64"
        ]
    );
    assert!(pass(&mut w, std::slice::from_ref(&a), &OnLink::default()).await == Outcome::default(), "{:?}", w.log);
    // a goes as b comes: the map entries a leaves go first, its route before its neighbour last
    let b = peer("b", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03");
    assert!(pass(&mut w, &[b], &OnLink::default()).await.ok());
    assert_eq!(
        w.log,
        [
            "-owner fd00:10:244:2::/64",
            "-accept fd00:198:18:1::2",
            "+owner fd00:10:244:3::/64",
            "+accept fd00:198:18:1::3",
            "+neigh fd00:10:244:3::",
            "+fdb fd00:198:18:1::3",
            "+route fd00:10:244:3::/64",
            "-route fd00:10:244:2::/64",
            "-fdb fd00:198:18:1::2",
            "-neigh fd00:10:244:2::"
        ]
    );
}

#[tokio::test]
async fn a_peer_turning_direct_and_back_keeps_a_route_the_kernel_takes() {
    let mut w = Fake::default();
    let a = [peer("a", "fd00:10:244:2::/64", "fd00:198:18::2", "02:66:00:00:00:02")];
    assert!(pass(&mut w, &a, &OnLink::default()).await.ok());
    // DirectRouting reaches it: the direct route replaces the device's, whose entries go after
    assert!(pass(&mut w, &a, &segment()).await.ok());
    // (the route's delete finds it replaced: the kernel's answer, ESRCH, is "already gone")
    assert_eq!(
        w.log,
        ["+direct fd00:10:244:2::/64", "-route fd00:10:244:2::/64", "-fdb fd00:198:18::2", "-neigh fd00:10:244:2::"]
    );
    // and back: the direct route goes just before the route through the device is written
    let out = pass(&mut w, &a, &OnLink::default()).await;
    assert!(out.ok(), "{out:?} {:?}", w.log);
    assert_eq!(
        w.log,
        ["+neigh fd00:10:244:2::", "+fdb fd00:198:18::2", "-direct fd00:10:244:2::/64", "+route fd00:10:244:2::/64"]
    );
    assert!(w.have.direct.is_empty() && w.have.routes.len() == 1);
}

#[tokio::test]
async fn a_failed_write_leaves_the_others_and_is_retried() {
    let mut w = Fake { fail: Some("+fdb"), ..Fake::default() };
    let peers = [
        peer("a", "fd00:10:244:2::/64", "fd00:198:18:1::2", "02:66:00:00:00:02"),
        peer("b", "fd00:10:244:3::/64", "fd00:198:18:1::3", "02:66:00:00:00:03"),
    ];
    let out = pass(&mut w, &peers, &OnLink::default()).await;
    assert_eq!((out.failed, out.written), (2, 8), "{:?}", w.log);
    assert!(!out.ok());
    w.fail = None;
    assert!(pass(&mut w, &peers, &OnLink::default()).await.ok());
    assert_eq!(w.log, ["+fdb fd00:198:18:1::2", "+fdb fd00:198:18:1::3"]);
}
