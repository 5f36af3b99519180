//! flannel's net-conf.json, as a ConfigMap or etcd's `<prefix>/config`
//! holds it: never a panic; what is accepted is a usable VXLAN config, and
//! the subnet range derived from it lies inside its network.
#![no_main]
use edgevx::{netconf::NetConf, source::leases};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(conf) = NetConf::parse(text, "fuzz.json") else { return };
    assert!(conf.vni > 0 && conf.vni < 1 << 24, "VNI {}", conf.vni);
    assert!(conf.port > 0);
    let Ok(range) = leases::subnet_range(text, &conf) else { return };
    assert!((1..=30).contains(&range.len) && range.len >= conf.network.prefix_len(), "{range:?}");
    assert!(conf.network.contains(&range.min) && conf.network.contains(&range.max) && range.min <= range.max);
    if let Some(n) = leases::allocate(range, &[], None, u64::from(conf.vni)) {
        assert!(conf.network.contains(&n) && n.prefix_len() == range.len, "{n}");
    }
});
