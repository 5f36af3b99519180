//! Writing a [`Changes`] into a dataplane: map entries no peer wants go
//! first, then every add, then the routes no peer wants.
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tracing::{info, warn};

use super::plan::{Accept, Changes, Tunnel};

/// Where IPv4 peers are written, key by key: BPF maps and routes in
/// production, a fake in the tests. Every write is idempotent (a put overwrites, a delete of
/// something already gone succeeds).
#[allow(async_fn_in_trait)]
pub trait Dataplane {
    async fn put_accept(&mut self, ip: Ipv4Addr, accept: Accept<Ipv4Net>) -> anyhow::Result<()>;
    async fn put_subnet(&mut self, subnet: Ipv4Net, tunnel: Tunnel) -> anyhow::Result<()>;
    async fn put_route(&mut self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> anyhow::Result<()>;
    async fn del_route(&mut self, dst: Ipv4Net, gateway: Option<Ipv4Addr>) -> anyhow::Result<()>;
    async fn put_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> anyhow::Result<()>;
    async fn del_direct(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr) -> anyhow::Result<()>;
    async fn del_subnet(&mut self, subnet: Ipv4Net) -> anyhow::Result<()>;
    async fn del_accept(&mut self, ip: Ipv4Addr) -> anyhow::Result<()>;
}

/// What one [`apply`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub written: usize,
    pub failed: usize,
    /// Route deletes held back because a route add failed (they run on the
    /// next pass).
    pub deferred: usize,
    /// When the first write went through (`None`: nothing written).
    pub first_at: Option<std::time::Instant>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.deferred == 0
    }
}

/// The writes of one pass and the first that failed: a pass logs one line
/// about its failures, however many there are (a full map would otherwise
/// log one per peer, every retry).
#[derive(Default)]
struct Tally {
    out: Outcome,
    first_error: Option<String>,
}

impl Tally {
    fn note(&mut self, what: &str, key: &dyn std::fmt::Display, r: anyhow::Result<()>) {
        match r {
            Ok(()) => {
                self.out.written += 1;
                self.out.first_at.get_or_insert_with(std::time::Instant::now);
            }
            Err(e) => {
                self.out.failed += 1;
                self.first_error.get_or_insert_with(|| format!("{what} {key}: {e:#}"));
            }
        }
    }
}

/// Runs `changes` against `dp`:
/// 1. map entries no peer wants go first, always. They cannot be something
///    the view still holds (an entry whose value changed is overwritten in
///    place, never deleted), and a full map needs their room before
///    anything new fits: a peer removed from the source is never left
///    programmed and accepted because an add failed.
/// 2. Every add and overwrite runs, a subnet before its peer is accepted
///    (replies have somewhere to go). A failed one is retried on the next
///    pass; the others still run.
/// 3. Routes no peer wants go last, unless a route add failed: the route
///    about to go may be what traffic follows until the new one is in
///    (flanneld's per-peer routes on a takeover, a direct route before the
///    VTEP's route).
pub async fn apply<D: Dataplane>(dp: &mut D, changes: &Changes) -> Outcome {
    let mut t = Tally::default();
    for net in &changes.del_subnets {
        t.note("removing subnet", net, dp.del_subnet(*net).await);
    }
    for ip in &changes.del_accept {
        t.note("no longer accepting VXLAN from", ip, dp.del_accept(*ip).await);
    }
    for (net, tunnel) in &changes.put_subnets {
        t.note("programming subnet", net, dp.put_subnet(*net, *tunnel).await);
    }
    for (ip, a) in &changes.put_accept {
        t.note("accepting VXLAN from", ip, dp.put_accept(*ip, *a).await);
    }
    let before_routes = t.out.failed;
    for (net, gw) in &changes.put_routes {
        t.note("adding the route to", net, dp.put_route(*net, *gw).await);
    }
    for (net, ip) in &changes.put_direct {
        t.note("adding the direct route to", net, dp.put_direct(*net, *ip).await);
    }
    if t.out.failed > before_routes {
        t.out.deferred = changes.del_direct.len() + changes.del_routes.len();
    } else {
        for (net, ip) in &changes.del_direct {
            t.note("deleting the direct route to", net, dp.del_direct(*net, *ip).await);
        }
        for (net, gw) in &changes.del_routes {
            t.note("deleting the route to", net, dp.del_route(*net, *gw).await);
        }
    }
    let out = t.out;
    if let Some(first) = &t.first_error {
        warn!(
            failed = out.failed,
            deferred = out.deferred,
            "{} peer writes failed, will retry; the first: {first}",
            out.failed
        );
    }
    if out.written > 0 {
        info!(
            accept = changes.put_accept.len(),
            subnets = changes.put_subnets.len(),
            routes = changes.put_routes.len(),
            direct_routes = changes.put_direct.len(),
            removed_direct_routes = changes.del_direct.len(),
            removed_routes = changes.del_routes.len(),
            removed_subnets = changes.del_subnets.len(),
            removed_accept = changes.del_accept.len(),
            failed = out.failed,
            "peer entries written"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::test_peer as peer;
    use crate::reconcile::{Contents, OnLink};
    use crate::{
        peer::Peer,
        reconcile::{Hop, diff, fit, plan, select},
    };

    /// A dataplane in memory that logs each write and can fail one key. Its
    /// maps refuse a new key when they hold `capacity` (as the kernel's do,
    /// with E2BIG), when one is set.
    #[derive(Default)]
    struct Fake {
        have: Contents,
        log: Vec<String>,
        fail_subnet: Option<Ipv4Net>,
        fail_route: bool,
        on_link: OnLink,
        capacity: Option<usize>,
    }

    impl Fake {
        fn full<K: Ord, V>(&self, map: &std::collections::BTreeMap<K, V>, key: &K) -> bool {
            self.capacity.is_some_and(|c| map.len() >= c && !map.contains_key(key))
        }
    }

    impl Dataplane for Fake {
        async fn put_direct(&mut self, net: Ipv4Net, ip: Ipv4Addr) -> anyhow::Result<()> {
            self.log.push(format!("+direct {net} via {ip}"));
            self.have.direct.insert(net, ip);
            Ok(())
        }
        async fn del_direct(&mut self, net: Ipv4Net, ip: Ipv4Addr) -> anyhow::Result<()> {
            self.log.push(format!("-direct {net} via {ip}"));
            self.have.direct.remove(&net);
            Ok(())
        }
        async fn put_accept(&mut self, ip: Ipv4Addr, a: Accept<Ipv4Net>) -> anyhow::Result<()> {
            if self.full(&self.have.accept, &ip) {
                anyhow::bail!("map full");
            }
            self.log.push(format!("+accept {ip}"));
            self.have.accept.insert(ip, a);
            Ok(())
        }
        async fn put_subnet(&mut self, net: Ipv4Net, t: Tunnel) -> anyhow::Result<()> {
            if self.fail_subnet == Some(net) || self.full(&self.have.subnets, &net) {
                anyhow::bail!("injected");
            }
            self.log.push(format!("+subnet {net}"));
            self.have.subnets.insert(net, t);
            Ok(())
        }
        async fn put_route(&mut self, net: Ipv4Net, gw: Option<Ipv4Addr>) -> anyhow::Result<()> {
            if self.fail_route {
                anyhow::bail!("injected");
            }
            self.log.push(format!("+route {net}"));
            self.have.routes.insert(net, gw);
            Ok(())
        }
        async fn del_route(&mut self, net: Ipv4Net, _: Option<Ipv4Addr>) -> anyhow::Result<()> {
            self.log.push(format!("-route {net}"));
            self.have.routes.remove(&net);
            Ok(())
        }
        async fn del_subnet(&mut self, net: Ipv4Net) -> anyhow::Result<()> {
            self.log.push(format!("-subnet {net}"));
            self.have.subnets.remove(&net);
            Ok(())
        }
        async fn del_accept(&mut self, ip: Ipv4Addr) -> anyhow::Result<()> {
            self.log.push(format!("-accept {ip}"));
            self.have.accept.remove(&ip);
            Ok(())
        }
    }

    async fn pass(dp: &mut Fake, peers: &[Peer]) -> Outcome {
        let (have, on_link) = (dp.have.clone(), dp.on_link.clone());
        apply(dp, &diff(&plan(peers, "10.244.0.0/16".parse().unwrap(), &on_link), &have)).await
    }

    #[tokio::test]
    async fn unwanted_map_entries_go_first_and_a_failed_add_holds_none_back() {
        let mut dp = Fake::default();
        pass(&mut dp, &[peer("a", "10.244.2.0/24", "198.18.0.2")]).await;
        dp.log.clear();
        dp.fail_subnet = Some("10.244.3.0/24".parse().unwrap());
        let b = [peer("b", "10.244.3.0/24", "198.18.0.3")];
        let out = pass(&mut dp, &b).await;
        assert_eq!((out.failed, out.deferred), (1, 0));
        // a left the view: it is neither programmed nor accepted, whatever b's add did
        assert_eq!(dp.log, ["-subnet 10.244.2.0/24", "-accept 198.18.0.2", "+accept 198.18.0.3"]);
        dp.fail_subnet = None;
        dp.log.clear();
        assert!(pass(&mut dp, &b).await.ok());
        assert_eq!(dp.log, ["+subnet 10.244.3.0/24"]);
        dp.log.clear();
        assert_eq!(pass(&mut dp, &b).await, Outcome::default(), "nothing to do is nothing done");
        assert!(dp.log.is_empty());
    }

    #[tokio::test]
    async fn a_full_map_makes_room_by_deleting_first() {
        let mut dp = Fake { capacity: Some(2), ..Fake::default() };
        let (a, b, c) = (
            peer("a", "10.244.2.0/24", "198.18.0.2"),
            peer("b", "10.244.3.0/24", "198.18.0.3"),
            peer("c", "10.244.4.0/24", "198.18.0.4"),
        );
        assert!(pass(&mut dp, &[a, b.clone()]).await.ok());
        // a goes and c comes in one edit: the map is full until a's entries are gone
        let out = pass(&mut dp, &[b, c]).await;
        assert!(out.ok(), "{out:?} {:?}", dp.log);
        let nets: Vec<String> = dp.have.subnets.keys().map(|n| n.to_string()).collect();
        assert_eq!(nets, ["10.244.3.0/24", "10.244.4.0/24"]);
        assert!(!dp.have.accept.contains_key(&"198.18.0.2".parse().unwrap()));
    }

    /// A view beyond the limit, as the agent's pass makes it (select, fit,
    /// plan, apply): every pass writes what fits and nothing fails; a peer
    /// removed from the source is removed from the maps at once, and the
    /// first peer left out takes its place.
    #[tokio::test]
    async fn over_capacity_nothing_fails_and_a_removed_peer_goes() {
        let capacity = 4;
        let mut dp = Fake { capacity: Some(capacity), ..Fake::default() };
        let node = |i: u8| peer(&format!("n{i}"), &format!("10.244.{}.0/24", 10 + i), &format!("198.18.0.{}", 10 + i));
        let agent_pass = async |dp: &mut Fake, view: &[Peer]| {
            let have = dp.have.clone();
            let (ok, _) = select(Some("10.244.1.0/24".parse().unwrap()), None, &have, view);
            let established = |p: &Peer| p.v4.is_some_and(|v4| have.subnets.contains_key(&v4.subnet));
            let (kept, left_out) = fit(ok, capacity, established);
            let out = apply(dp, &diff(&plan(&kept, "10.244.0.0/16".parse().unwrap(), &OnLink::default()), &have)).await;
            (out, left_out.into_iter().map(|p| p.node).collect::<Vec<_>>())
        };
        let view: Vec<Peer> = (0..6).map(node).collect();
        let (out, left_out) = agent_pass(&mut dp, &view).await;
        assert!(out.ok(), "{out:?}");
        assert_eq!(left_out, ["n4", "n5"]);
        assert_eq!(dp.have.subnets.len(), capacity);
        // again: nothing to do, nothing failed
        assert_eq!(agent_pass(&mut dp, &view).await.0, Outcome::default());
        // n1 removed from the source
        let view: Vec<Peer> = view.into_iter().filter(|p| p.node != "n1").collect();
        let (out, left_out) = agent_pass(&mut dp, &view).await;
        assert!(out.ok(), "{out:?}");
        assert_eq!(left_out, ["n5"]);
        assert!(!dp.have.subnets.contains_key(&"10.244.11.0/24".parse().unwrap()), "n1 still programmed");
        assert!(!dp.have.accept.contains_key(&"198.18.0.11".parse().unwrap()), "n1 still accepted");
        assert!(dp.have.subnets.contains_key(&"10.244.14.0/24".parse().unwrap()), "n4 took the place");
    }

    #[tokio::test]
    async fn a_peer_leaving_the_segment_gets_the_vtep_before_its_direct_route_goes() {
        let segment = |direct| {
            OnLink::new(vec![Hop { dst: "198.18.0.0/24".parse().unwrap(), direct }], "10.244.0.0/16".parse().unwrap())
        };
        let mut dp = Fake { on_link: segment(true), ..Fake::default() };
        let a = [peer("a", "10.244.2.0/24", "198.18.0.2")];
        assert!(pass(&mut dp, &a).await.ok());
        assert!(dp.log.contains(&"+direct 10.244.2.0/24 via 198.18.0.2".to_string()), "{:?}", dp.log);
        assert!(dp.log.contains(&"+route 10.244.0.0/16".to_string()), "{:?}", dp.log);
        dp.log.clear();
        // the segment's route now has a gateway (renumbered underlay): encapsulate
        dp.on_link = segment(false);
        assert!(pass(&mut dp, &a).await.ok());
        assert_eq!(dp.log, ["-direct 10.244.2.0/24 via 198.18.0.2"], "the Network route through the VTEP is there");
        // the Network route is gone too and cannot be put back: the direct route stays
        dp.on_link = segment(true);
        pass(&mut dp, &a).await;
        dp.have.routes.clear();
        dp.fail_route = true;
        dp.on_link = segment(false);
        let out = pass(&mut dp, &a).await;
        assert_eq!((out.failed, out.deferred), (1, 1));
        assert_eq!(dp.have.direct.len(), 1);
        dp.fail_route = false;
        assert!(pass(&mut dp, &a).await.ok());
        assert!(dp.have.direct.is_empty() && dp.have.routes.len() == 1);
    }
}
