//! The etcd source's network config (`<prefix>/config`): read as flannel
//! reads it, refusing what etcd mode would ignore, and the subnet ranges
//! our lease may take from it.
use std::net::Ipv6Addr;

use anyhow::{Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};

use super::subnet_range;
use crate::netconf::NetConf;

/// Our public IPv6 when etcd's config turns IPv6 on and none was known at
/// start: the underlay `iface`'s now. An address still in duplicate address
/// detection (a boot, SLAAC) is waited for (the error is retried); no
/// global IPv6 address at all refuses the config, as flanneld fails.
pub(super) async fn public_ipv6_now(iface: &str, config_key: &str) -> Result<Ipv6Addr> {
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    let conn = tokio::spawn(conn);
    let underlay = crate::dataplane::device::underlay(&handle, iface).await;
    conn.abort();
    let underlay = underlay?;
    match underlay.ipv6 {
        Some(ip) => Ok(ip),
        None if underlay.ipv6_tentative => anyhow::bail!(
            "{config_key}: EnableIPv6 is set and {iface}'s global IPv6 address is still tentative (duplicate address \
             detection); waiting for it"
        ),
        None => Err(RefusedConfig(format!(
            "{config_key}: EnableIPv6 is set, but this node has no public IPv6 address (none on the underlay \
             interface {iface}; give --public-ipv6)"
        ))
        .into()),
    }
}

/// A network config at `<prefix>/config` that edgevx will not run with.
/// Unlike an unreachable etcd, waiting does not help: [`super::etcd::run`]
/// exits 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct RefusedConfig(String);

/// flannel's network config as read from `key`, refusing what edgevx would
/// otherwise ignore. It is known only once etcd answers, so this check runs
/// then, not with the flags.
pub(super) fn read_config(text: &str, key: &str) -> Result<(NetConf, Ranges), RefusedConfig> {
    // Backend.MTU is applied: the run loop sizes the VTEP from this config
    let conf = NetConf::parse(text, key).map_err(|e| RefusedConfig(e.to_string()))?;
    if !conf.ipv4 {
        return Err(RefusedConfig(format!("{key}: EnableIPv4: {}", crate::netconf::IPV6_ONLY_ETCD)));
    }
    crate::netfilter::check_backend(conf.nftables).map_err(|e| RefusedConfig(format!("{key}: {e:#}")))?;
    let v4 = subnet_range::subnet_range(text, &conf).map_err(|e| RefusedConfig(format!("{key}: {e}")))?;
    let v6 = match &conf.ipv6 {
        None => None,
        Some(v6) => Some(subnet_range::ipv6_subnet_range(v6).map_err(|e| RefusedConfig(format!("{key}: {e}")))?),
    };
    Ok((conf, Ranges { v4, v6 }))
}

/// Where our subnets may be: IPv4, and IPv6 in dual-stack.
#[derive(Clone, Copy, Debug)]
pub(super) struct Ranges {
    pub(super) v4: subnet_range::SubnetRange<Ipv4Net>,
    pub(super) v6: Option<subnet_range::SubnetRange<Ipv6Net>>,
}

impl Ranges {
    /// flannel's `isIPv6SubnetConfigCompat`: a lease of ours is reused only
    /// with an IPv6 subnet in range in dual-stack, and without one otherwise.
    pub(super) fn ipv6_compatible(&self, subnet6: Option<Ipv6Net>) -> bool {
        match (self.v6, subnet6) {
            (None, None) => true,
            (Some(r), Some(n6)) => r.fits(n6),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "/coreos.com/network/config";

    #[test]
    fn config_refuses_what_etcd_mode_would_ignore() {
        let refused = |text: &str| read_config(text, KEY).err().map(|e| e.to_string()).unwrap_or_default();
        let e = refused(r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"Backend":{"Type":"vxlan"}}"#);
        assert!(e.contains("IPv6Network") && e.contains("EnableIPv6") && e.contains(KEY), "{e}");
        let e = refused(r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/125"}"#);
        assert_eq!(e, format!("{KEY}: IPv6Network is too small. Minimum useful network prefix is /124"));
        let e = refused(r#"{"Network":"10.244.0.0/16","SubnetLen":12}"#);
        assert!(e.contains("SubnetLen") && e.contains(KEY), "{e}");
        let e = refused(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::/56"}"#);
        assert!(e.contains("EnableIPv4") && e.contains(crate::netconf::IPV6_ONLY_ETCD) && e.contains(KEY), "{e}");
    }

    #[test]
    fn config_accepts_flannels_defaults() {
        // MTU 0 is flannel's "unset"
        let (conf, ranges) =
            read_config(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","MTU":0}}"#, KEY).unwrap();
        assert_eq!((conf.mtu, ranges.v4.len, ranges.v6), (None, 24, None));
        let (conf, _) =
            read_config(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","MTU":1400}}"#, KEY).unwrap();
        assert_eq!(conf.mtu, Some(1400), "Backend.MTU is applied");
    }

    #[test]
    fn dual_stack_config_gets_flannels_ipv6_defaults() {
        let (conf, ranges) = read_config(
            r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#,
            KEY,
        )
        .unwrap();
        assert_eq!(conf.ipv6.unwrap().network.to_string(), "fd00:10:244::/56");
        let r6 = ranges.v6.unwrap();
        assert_eq!(
            (r6.len, r6.min.to_string(), r6.max.to_string()),
            (64, "fd00:10:244:1::".into(), "fd00:10:244:ff::".into())
        );
        assert!(ranges.ipv6_compatible(Some("fd00:10:244:7::/64".parse().unwrap())));
        assert!(!ranges.ipv6_compatible(None), "a lease of ours without IPv6 is replaced");
        assert!(!ranges.ipv6_compatible(Some("fd00:10:244::/64".parse().unwrap())), "below IPv6SubnetMin");
        assert!(!ranges.ipv6_compatible(Some("fd00:10:244:7::/80".parse().unwrap())), "another length");
        let (_, v4_only) = read_config(r#"{"Network":"10.244.0.0/16"}"#, KEY).unwrap();
        assert!(v4_only.ipv6_compatible(None));
        assert!(!v4_only.ipv6_compatible(Some("fd00:10:244:7::/64".parse().unwrap())), "IPv6 switched off");
    }
}
