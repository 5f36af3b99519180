//! The reconciler: desired peers in, the smallest set of dataplane changes
//! out. It owns the record of what is programmed, so each source only ever
//! says what it wants.
use std::collections::BTreeMap;

use ipnet::Ipv4Net;
use tracing::{info, warn};

use crate::peer::{Peer, Rejection};

/// Where peers are programmed (BPF maps and routes in production).
#[allow(async_fn_in_trait)]
pub trait PeerTable {
    /// Programs `new`, replacing `old` (the same node's previous entry).
    async fn put(&mut self, old: Option<&Peer>, new: &Peer) -> anyhow::Result<()>;
    /// Removes everything `peer` put in place.
    async fn delete(&mut self, peer: &Peer) -> anyhow::Result<()>;
}

/// Chooses which candidates become peers. A peer that is already programmed
/// keeps its place; a newcomer whose subnet overlaps ours, or a programmed
/// peer's, or whose public IP is taken, is rejected with the reason.
pub fn select(own: Ipv4Net, programmed: &BTreeMap<String, Peer>, candidates: &[Peer]) -> (Vec<Peer>, Vec<Rejection>) {
    let established = |p: &Peer| programmed.get(&p.node).is_some_and(|q| q.subnet == p.subnet);
    let mut ordered: Vec<&Peer> = candidates.iter().filter(|p| established(p)).collect();
    ordered.extend(candidates.iter().filter(|p| !established(p)));

    let mut accepted: Vec<Peer> = Vec::new();
    let mut rejected = Vec::new();
    for p in ordered {
        let reject = |reason: String| Rejection { node: p.node.clone(), reason };
        if accepted.iter().any(|a| a.node == p.node) {
            rejected.push(reject("the node is listed twice".into()));
        } else if own.contains(&p.subnet.network()) || p.subnet.contains(&own.network()) {
            rejected.push(reject(format!("pod CIDR {} overlaps our own {own}", p.subnet)));
        } else if let Some(a) =
            accepted.iter().find(|a| a.subnet.contains(&p.subnet.network()) || p.subnet.contains(&a.subnet.network()))
        {
            rejected.push(reject(format!("pod CIDR {} overlaps {} of node {}", p.subnet, a.subnet, a.node)));
        } else if let Some(a) = accepted.iter().find(|a| a.public_ip == p.public_ip) {
            rejected.push(reject(format!("public IP {} is already node {}'s", p.public_ip, a.node)));
        } else {
            accepted.push(p.clone());
        }
    }
    (accepted, rejected)
}

/// The record of what is programmed, and the loop that brings it in line.
#[derive(Default)]
pub struct Reconciler {
    programmed: BTreeMap<String, Peer>,
    /// Set for adopted records: after a reboot the record outlives the
    /// kernel state it describes, so the first pass re-puts every peer
    /// (idempotent: same entries, same routes) instead of trusting it.
    unverified: bool,
}

impl Reconciler {
    /// Starts from what an earlier run programmed (adopted state).
    pub fn adopt(programmed: impl IntoIterator<Item = Peer>) -> Self {
        Reconciler { programmed: programmed.into_iter().map(|p| (p.node.clone(), p)).collect(), unverified: true }
    }

    /// Forgets that anything is known to be programmed (the kernel state
    /// went away underneath): the next pass re-puts every peer.
    pub fn distrust(&mut self) {
        self.unverified = true;
    }

    pub fn programmed(&self) -> impl Iterator<Item = &Peer> {
        self.programmed.values()
    }

    /// Applies `accepted` (from [`select`]). A peer that fails to program is
    /// logged and left for the next pass; the others still go through.
    /// Returns whether anything changed.
    pub async fn apply<T: PeerTable>(&mut self, table: &mut T, accepted: &[Peer]) -> bool {
        let mut changed = false;
        let mut all_ok = true;
        let wanted: BTreeMap<&str, &Peer> = accepted.iter().map(|p| (p.node.as_str(), p)).collect();
        let gone: Vec<Peer> =
            self.programmed.values().filter(|p| !wanted.contains_key(p.node.as_str())).cloned().collect();
        for p in gone {
            match table.delete(&p).await {
                Ok(()) => {
                    info!(node = %p.node, subnet = %p.subnet, "peer removed");
                    self.programmed.remove(&p.node);
                    changed = true;
                }
                Err(e) => {
                    all_ok = false;
                    warn!(node = %p.node, "removing peer failed, will retry: {e:#}");
                }
            }
        }
        for p in accepted {
            let old = self.programmed.get(&p.node).cloned();
            if old.as_ref() == Some(p) && !self.unverified {
                continue;
            }
            match table.put(old.as_ref(), p).await {
                Ok(()) => {
                    let what = match &old {
                        None => "peer added",
                        Some(o) if o == p => "peer re-programmed",
                        Some(_) => "peer changed",
                    };
                    info!(node = %p.node, subnet = %p.subnet, public_ip = %p.public_ip, vtep_mac = %p.vtep_mac, "{what}");
                    self.programmed.insert(p.node.clone(), p.clone());
                    changed = true;
                }
                Err(e) => {
                    all_ok = false;
                    warn!(node = %p.node, "programming peer failed, will retry: {e:#}");
                }
            }
        }
        if all_ok {
            self.unverified = false;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(node: &str, subnet: &str, ip: &str) -> Peer {
        Peer {
            node: node.into(),
            subnet: subnet.parse().unwrap(),
            public_ip: ip.parse().unwrap(),
            vtep_mac: "02:00:00:00:00:01".parse().unwrap(),
            any_inner_source: false,
        }
    }
    fn own() -> Ipv4Net {
        "10.244.1.0/24".parse().unwrap()
    }

    #[test]
    fn overlap_with_own_subnet_is_rejected() {
        let (ok, bad) = select(
            own(),
            &BTreeMap::new(),
            &[peer("x", "10.244.1.0/25", "198.18.0.9"), peer("y", "10.244.0.0/16", "198.18.0.8")],
        );
        assert!(ok.is_empty());
        assert_eq!(bad.len(), 2);
        assert!(bad[0].reason.contains("overlaps our own"));
    }

    #[test]
    fn established_peer_keeps_its_subnet_against_a_newcomer() {
        let old = peer("old", "10.244.2.0/24", "198.18.0.2");
        let programmed = BTreeMap::from([(old.node.clone(), old.clone())]);
        // the newcomer is listed first, but the established one wins
        let (ok, bad) = select(own(), &programmed, &[peer("new", "10.244.2.0/25", "198.18.0.3"), old.clone()]);
        assert_eq!(ok, vec![old]);
        assert_eq!(bad[0].node, "new");
        assert!(bad[0].reason.contains("of node old"), "{}", bad[0].reason);
    }

    #[test]
    fn duplicate_public_ip_and_name_are_rejected() {
        let (ok, bad) = select(
            own(),
            &BTreeMap::new(),
            &[
                peer("a", "10.244.2.0/24", "198.18.0.2"),
                peer("b", "10.244.3.0/24", "198.18.0.2"),
                peer("a", "10.244.4.0/24", "198.18.0.4"),
            ],
        );
        assert_eq!(ok.len(), 1);
        assert!(bad.iter().any(|r| r.node == "b" && r.reason.contains("public IP")));
        assert!(bad.iter().any(|r| r.node == "a" && r.reason.contains("twice")));
    }

    #[derive(Default)]
    struct FakeTable {
        log: Vec<String>,
        fail: Option<String>,
    }
    impl PeerTable for FakeTable {
        async fn put(&mut self, old: Option<&Peer>, new: &Peer) -> anyhow::Result<()> {
            if self.fail.as_deref() == Some(new.node.as_str()) {
                anyhow::bail!("injected failure");
            }
            self.log.push(format!("put {} {}", new.node, old.map(|o| o.subnet.to_string()).unwrap_or_default()));
            Ok(())
        }
        async fn delete(&mut self, p: &Peer) -> anyhow::Result<()> {
            self.log.push(format!("delete {}", p.node));
            Ok(())
        }
    }

    #[tokio::test]
    async fn applies_only_the_difference_and_retries_failures() {
        let mut t = FakeTable::default();
        let mut r = Reconciler::adopt([
            peer("keep", "10.244.2.0/24", "198.18.0.2"),
            peer("drop", "10.244.3.0/24", "198.18.0.3"),
            peer("move", "10.244.4.0/24", "198.18.0.4"),
        ]);
        t.fail = Some("new".into());
        let want = [
            peer("keep", "10.244.2.0/24", "198.18.0.2"),
            peer("move", "10.244.5.0/24", "198.18.0.4"),
            peer("new", "10.244.6.0/24", "198.18.0.6"),
        ];
        assert!(r.apply(&mut t, &want).await);
        // adopted records are re-put once (they may predate a reboot)
        assert_eq!(t.log, vec!["delete drop", "put keep 10.244.2.0/24", "put move 10.244.4.0/24"]);
        assert_eq!(r.programmed().count(), 2, "the failed peer is not recorded");
        t.fail = None;
        t.log.clear();
        assert!(r.apply(&mut t, &want).await);
        assert_eq!(
            t.log,
            vec!["put keep 10.244.2.0/24", "put move 10.244.5.0/24", "put new "],
            "still unverified after a failure"
        );
        t.log.clear();
        assert!(!r.apply(&mut t, &want).await);
        assert!(t.log.is_empty());
    }
}
