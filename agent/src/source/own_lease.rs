//! Which lease is this node's own, when more than one claims its PublicIP.
//!
//! flanneld takes the first lease in etcd's list whose PublicIP is its own
//! (`findLeaseByIP`, pkg/subnet/etcd/local_manager.go): key order. A lease
//! written by anyone else with our PublicIP and a key that sorts first
//! (`10.244.100.0-24` before `10.244.2.0-24`) would then be taken as ours
//! on every restart, moving the node's pods to the attacker's subnet. Here
//! the order of keys decides nothing:
//! 1. the lease at a subnet this node recorded as its own (subnet.env's
//!    `FLANNEL_SUBNET`, which flanneld falls back on too, or the cached
//!    view's own subnet) is ours;
//! 2. else the lease that appeared first (lowest etcd create revision), as
//!    peers decide between two leases claiming one public IP;
//! 3. else (two claimants created in one transaction, or a revision not
//!    known) neither: an error naming both keys.
use ipnet::Ipv4Net;

/// One lease claiming our PublicIP (and of a shape we could use).
#[derive(Clone, Debug)]
pub struct Claimant<'a> {
    pub key: &'a str,
    pub subnet: Ipv4Net,
    /// etcd's create revision; 0 when not known.
    pub created: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "leases {first:?} and {second:?} both claim this node's PublicIP {public_ip}, neither is at a subnet this node \
     recorded as its own (subnet.env, the cached view), and etcd does not say which appeared first (create \
     revisions {first_created} and {second_created}); taking neither. Delete the one that is not this node's"
)]
pub struct Undecided {
    pub public_ip: std::net::Ipv4Addr,
    pub first: String,
    pub second: String,
    pub first_created: i64,
    pub second_created: i64,
}

/// The index in `claimants` of our own lease; `None` when there is none.
pub fn choose(
    claimants: &[Claimant<'_>],
    recorded: &[Ipv4Net],
    public_ip: std::net::Ipv4Addr,
) -> Result<Option<usize>, Undecided> {
    // 1. a subnet we recorded; the first record that names a claimant wins
    //    (subnet.env before the cache: both are written from one choice)
    for r in recorded {
        if let Some(i) = claimants.iter().position(|c| c.subnet == *r) {
            return Ok(Some(i));
        }
    }
    // 2. the claimant that appeared first
    let mut by_age: Vec<usize> = (0..claimants.len()).collect();
    by_age.sort_by_key(|&i| claimants[i].created);
    match by_age.as_slice() {
        [] => Ok(None),
        [only] => Ok(Some(*only)),
        [a, b, ..] => {
            let (ca, cb) = (&claimants[*a], &claimants[*b]);
            if ca.created > 0 && ca.created < cb.created {
                Ok(Some(*a))
            } else {
                Err(Undecided {
                    public_ip,
                    first: ca.key.to_string(),
                    second: cb.key.to_string(),
                    first_created: ca.created,
                    second_created: cb.created,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    fn c(key: &'static str, created: i64) -> Claimant<'static> {
        let subnet = crate::source::leases::parse_subnet_key(key).unwrap();
        Claimant { key, subnet, created }
    }

    #[test]
    fn the_key_that_sorts_first_is_not_ours_because_it_sorts_first() {
        // ours appeared at revision 5; a later one sorts before it
        let claimants = [c("10.244.100.0-24", 9), c("10.244.2.0-24", 5)];
        assert_eq!(choose(&claimants, &[], IP), Ok(Some(1)));
        // and in the other list order too
        let claimants = [c("10.244.2.0-24", 5), c("10.244.100.0-24", 9)];
        assert_eq!(choose(&claimants, &[], IP), Ok(Some(0)));
    }

    #[test]
    fn a_recorded_subnet_decides_before_age() {
        // our lease expired and was written again (a newer revision) while
        // the other stayed: what we recorded still names ours
        let claimants = [c("10.244.100.0-24", 5), c("10.244.2.0-24", 9)];
        let recorded = ["10.244.2.0/24".parse().unwrap()];
        assert_eq!(choose(&claimants, &recorded, IP), Ok(Some(1)));
        // a record naming no claimant falls back on age
        let recorded = ["10.244.7.0/24".parse().unwrap()];
        assert_eq!(choose(&claimants, &recorded, IP), Ok(Some(0)));
    }

    #[test]
    fn one_transaction_or_an_unknown_revision_takes_neither_and_names_both() {
        let claimants = [c("10.244.100.0-24", 7), c("10.244.2.0-24", 7)];
        let e = choose(&claimants, &[], IP).unwrap_err();
        assert_eq!((e.first.as_str(), e.second.as_str()), ("10.244.100.0-24", "10.244.2.0-24"));
        let text = e.to_string();
        assert!(text.contains("10.244.100.0-24") && text.contains("10.244.2.0-24") && text.contains("198.18.0.2"));
        let claimants = [c("10.244.100.0-24", 0), c("10.244.2.0-24", 4)];
        assert!(choose(&claimants, &[], IP).is_err());
    }

    #[test]
    fn none_or_one_claimant() {
        assert_eq!(choose(&[], &[], IP), Ok(None));
        assert_eq!(choose(&[c("10.244.2.0-24", 3)], &[], IP), Ok(Some(0)));
        // a single claimant needs no revision to be ours
        assert_eq!(choose(&[c("10.244.2.0-24", 0)], &[], IP), Ok(Some(0)));
    }
}
