//! Writing a [`Changes`] into a dataplane: adds first, deletes last.
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use tracing::{info, warn};

use super::{
    on_link::OnLink,
    plan::{Accept, Changes, Contents, Tunnel},
};

/// Where peers are programmed: BPF maps and routes in production, a fake in
/// the tests. Every write is idempotent (a put overwrites, a delete of
/// something already gone succeeds).
#[allow(async_fn_in_trait)]
pub trait Dataplane {
    /// Reads back what is really there.
    async fn observe(&mut self) -> anyhow::Result<Contents>;
    /// Reads the routes that say which peers are on-link (DirectRouting).
    async fn on_link(&mut self) -> anyhow::Result<OnLink>;
    async fn put_accept(&mut self, ip: Ipv4Addr, accept: Accept) -> anyhow::Result<()>;
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
    /// Deletes held back because an add failed (they run on the next pass).
    pub deferred: usize,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.deferred == 0
    }
}

fn note(out: &mut Outcome, what: &str, key: &dyn std::fmt::Display, r: anyhow::Result<()>) {
    match r {
        Ok(()) => out.written += 1,
        Err(e) => {
            out.failed += 1;
            warn!("{what} {key} failed, will retry: {e:#}");
        }
    }
}

/// Runs `changes` against `dp`. A failed write is logged and the rest still
/// run, except that no delete runs after a failed add: the thing about to be
/// deleted may be what traffic still depends on until the add succeeds.
pub async fn apply<D: Dataplane>(dp: &mut D, changes: &Changes) -> Outcome {
    let mut out = Outcome::default();
    // a subnet before its peer is accepted: replies have somewhere to go
    for (net, t) in &changes.put_subnets {
        note(&mut out, "programming subnet", net, dp.put_subnet(*net, *t).await);
    }
    for (ip, a) in &changes.put_accept {
        note(&mut out, "accepting VXLAN from", ip, dp.put_accept(*ip, *a).await);
    }
    for (net, gw) in &changes.put_routes {
        note(&mut out, "adding the route to", net, dp.put_route(*net, *gw).await);
    }
    for (net, ip) in &changes.put_direct {
        note(&mut out, "adding the direct route to", net, dp.put_direct(*net, *ip).await);
    }
    if out.failed > 0 {
        out.deferred =
            changes.del_direct.len() + changes.del_routes.len() + changes.del_subnets.len() + changes.del_accept.len();
        return out;
    }
    for (net, ip) in &changes.del_direct {
        note(&mut out, "deleting the direct route to", net, dp.del_direct(*net, *ip).await);
    }
    for (net, gw) in &changes.del_routes {
        note(&mut out, "deleting the route to", net, dp.del_route(*net, *gw).await);
    }
    for net in &changes.del_subnets {
        note(&mut out, "removing subnet", net, dp.del_subnet(*net).await);
    }
    for ip in &changes.del_accept {
        note(&mut out, "no longer accepting VXLAN from", ip, dp.del_accept(*ip).await);
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
    use crate::{
        peer::Peer,
        reconcile::{Hop, diff, plan},
    };

    /// A dataplane in memory that logs each write and can fail one key.
    #[derive(Default)]
    struct Fake {
        have: Contents,
        log: Vec<String>,
        fail_subnet: Option<Ipv4Net>,
        on_link: OnLink,
    }

    impl Dataplane for Fake {
        async fn observe(&mut self) -> anyhow::Result<Contents> {
            Ok(self.have.clone())
        }
        async fn on_link(&mut self) -> anyhow::Result<OnLink> {
            Ok(self.on_link.clone())
        }
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
        async fn put_accept(&mut self, ip: Ipv4Addr, a: Accept) -> anyhow::Result<()> {
            self.log.push(format!("+accept {ip}"));
            self.have.accept.insert(ip, a);
            Ok(())
        }
        async fn put_subnet(&mut self, net: Ipv4Net, t: Tunnel) -> anyhow::Result<()> {
            if self.fail_subnet == Some(net) {
                anyhow::bail!("injected");
            }
            self.log.push(format!("+subnet {net}"));
            self.have.subnets.insert(net, t);
            Ok(())
        }
        async fn put_route(&mut self, net: Ipv4Net, gw: Option<Ipv4Addr>) -> anyhow::Result<()> {
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
        let have = dp.observe().await.unwrap();
        let on_link = dp.on_link().await.unwrap();
        apply(dp, &diff(&plan(peers, "10.244.0.0/16".parse().unwrap(), &on_link), &have)).await
    }

    #[tokio::test]
    async fn adds_run_before_deletes_and_a_failed_add_holds_deletes_back() {
        let mut dp = Fake::default();
        pass(&mut dp, &[peer("a", "10.244.2.0/24", "198.18.0.2")]).await;
        dp.log.clear();
        dp.fail_subnet = Some("10.244.3.0/24".parse().unwrap());
        let b = [peer("b", "10.244.3.0/24", "198.18.0.3")];
        let out = pass(&mut dp, &b).await;
        assert_eq!(out.failed, 1);
        assert_eq!(out.deferred, 2);
        assert_eq!(dp.log, ["+accept 198.18.0.3"], "a's entries stay until b's are in");
        dp.fail_subnet = None;
        dp.log.clear();
        assert!(pass(&mut dp, &b).await.ok());
        assert_eq!(dp.log, ["+subnet 10.244.3.0/24", "-subnet 10.244.2.0/24", "-accept 198.18.0.2"]);
        dp.log.clear();
        assert_eq!(pass(&mut dp, &b).await, Outcome::default(), "nothing to do is nothing done");
        assert!(dp.log.is_empty());
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
        // a failed add holds the direct route's delete back
        dp.on_link = segment(true);
        pass(&mut dp, &a).await;
        dp.on_link = OnLink::default();
        dp.fail_subnet = Some("10.244.3.0/24".parse().unwrap());
        let out = pass(&mut dp, &[peer("b", "10.244.3.0/24", "198.18.0.3")]).await;
        assert_eq!(out.deferred, 3);
        assert_eq!(dp.have.direct.len(), 1);
    }
}
