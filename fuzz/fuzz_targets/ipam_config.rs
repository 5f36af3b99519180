//! edgevx-ipam's network config on stdin (host-local's `ranges`, `subnet`,
//! `routes`, `dataDir`, `resolvConf`, the flannel delegate's form): never a
//! panic; what is accepted is canonical (every range's start, end and
//! gateway in its subnet, start before end, one family per range set, no
//! two sets overlapping), its store directory stays under `dataDir`, the
//! walk hands out only addresses of the set and never a gateway, and the
//! same input always parses the same.
#![no_main]
use std::net::IpAddr;

use edgevx_ipam::{
    config::NetConf,
    range::{Range, RangeSet},
    wire::CniError,
};
use libfuzzer_sys::fuzz_target;

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
        IpAddr::V6(v6) => (u128::from(v6), 128),
    }
}

/// Whether `ip` lies in `r`'s subnet (`network/prefix`), same family.
fn in_subnet(r: &Range, ip: IpAddr) -> bool {
    let ((net, width), (n, w)) = (bits(r.network), bits(ip));
    let host = u32::from(width - r.prefix);
    let mask = if host >= 128 { 0 } else { !((1u128 << host) - 1) };
    width == w && n & mask == net
}

fn check_set(i: usize, set: &RangeSet) {
    assert!(!set.0.is_empty(), "range set {i} is empty");
    let v4 = set.0[0].network.is_ipv4();
    for r in &set.0 {
        assert_eq!(r.network.is_ipv4(), v4, "range set {i} mixes families: {set}");
        assert!(r.prefix <= if v4 { 30 } else { 126 }, "{r:?}: too small to allocate from");
        for (what, ip) in [("start", r.start), ("end", r.end), ("gateway", r.gateway)] {
            assert!(in_subnet(r, ip), "{what} outside the subnet: {r:?}");
        }
        assert!(bits(r.start).0 <= bits(r.end).0, "{r:?}");
    }
    // a few addresses of the walk, from the start and from the gateway
    for last in [None, Some(set.0[0].gateway)] {
        for ip in set.walk(last).take(4) {
            assert!(set.contains(ip), "walked {ip} outside {set}");
            assert!(set.range_of(ip).is_some_and(|r| r.gateway != ip), "walked to {ip}, its range's gateway");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let conf = match NetConf::parse(data) {
        Ok(conf) => conf,
        Err(e) => {
            // the error object the plugin prints must build too
            let _ = CniError::from(e).to_json("1.1.0");
            return;
        }
    };
    let again = NetConf::parse(data).map(|c| format!("{c:?}"));
    assert_eq!(again.ok(), Some(format!("{conf:?}")), "parsing is not deterministic");
    assert!(!conf.range_sets.is_empty());
    for (i, set) in conf.range_sets.iter().enumerate() {
        check_set(i, set);
        for (j, other) in conf.range_sets.iter().enumerate().skip(i + 1) {
            assert!(!set.overlaps(other), "range sets {i} and {j} overlap");
        }
    }
    let dir = conf.store_dir();
    assert_eq!(dir.parent(), Some(conf.data_dir.as_path()), "store dir {} escapes dataDir", dir.display());
    assert!(!conf.name.contains('/') && conf.name != ".." && conf.name != ".", "name {:?}", conf.name);
});
