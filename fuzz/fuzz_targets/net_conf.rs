//! flannel's net-conf.json, as a ConfigMap or etcd's `<prefix>/config`
//! holds it: never a panic; what is accepted is a usable VXLAN config, and
//! the subnet range derived from it lies inside its network.
#![no_main]
use edgevx::{netconf::NetConf, source::subnet_range};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(conf) = NetConf::parse(text, "fuzz.json") else { return };
    assert!(conf.vni > 0 && conf.vni < 1 << 24, "VNI {}", conf.vni);
    assert!(conf.port > 0);
    // flannel's GetIPFamily: at least one stack, and IPv6-only only with an IPv6Network
    assert!(conf.ipv4 || conf.ipv6.is_some(), "neither family: {text}");
    let Ok(range) = subnet_range::subnet_range(text, &conf) else { return };
    assert!((1..=30).contains(&range.len) && range.len >= conf.network.prefix_len(), "{range:?}");
    assert!(conf.network.contains(&range.min) && conf.network.contains(&range.max) && range.min <= range.max);
    if let Some(n) = subnet_range::allocate(range, &[], None, u64::from(conf.vni)) {
        assert!(conf.network.contains(&n) && n.prefix_len() == range.len, "{n}");
    }
    if let Some(v6) = &conf.ipv6 {
        assert_eq!(v6.network.trunc(), v6.network, "host bits are dropped");
        let Ok(r6) = subnet_range::ipv6_subnet_range(v6) else { return };
        assert!(r6.len <= 126 && r6.len >= v6.network.prefix_len() + 2, "{r6:?}");
        assert!(v6.network.contains(&r6.min) && v6.network.contains(&r6.max), "{r6:?}");
        if let Some(n6) = subnet_range::allocate(r6, &[], None, u64::from(conf.vni)) {
            assert!(r6.fits(n6) && v6.network.contains(&n6), "{n6}");
        }
    }
});
