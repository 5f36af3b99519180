//! flannel's net-conf.json (the `kube-flannel-cfg` ConfigMap's `net-conf.json`).
//! Go decodes JSON keys case-insensitively, so `VNI`, `vni` and `Vni` all work there,
//! and so they do here.
use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use ipnet::{Ipv4Net, Ipv6Net};
use serde_json::{Map, Value};

use edgevx_common::vxlan::{DEFAULT_PORT, DEFAULT_VNI};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetConf {
    /// `EnableIPv4` (flannel's default: on). Off makes an IPv6-only
    /// network: `network` is then unused, as flannel leaves it unread.
    #[serde(default = "on")]
    pub ipv4: bool,
    /// The cluster pod network (`Network`).
    pub network: Ipv4Net,
    pub vni: u32,
    pub port: u16,
    /// `Backend.MTU`: the MTU of the underlay to assume; device MTU is this - 50.
    pub mtu: Option<u32>,
    /// `Backend.DirectRouting`: peers on one of our directly connected
    /// underlay subnets get a plain route instead of VXLAN, as in flannel.
    #[serde(default)]
    pub direct_routing: bool,
    /// `EnableNFTables`: flanneld then writes its rules with nftables.
    /// edgevx writes them through the `iptables` binary, which must then be
    /// iptables-nft, so they land in nftables too (`netfilter::check_backend`).
    #[serde(default)]
    pub nftables: bool,
    /// `EnableIPv6` with `IPv6Network` (dual-stack); `None` when IPv6 is off.
    #[serde(default)]
    pub ipv6: Option<Ipv6Conf>,
}

/// The IPv6 half of a dual-stack network config. Only the etcd subnet
/// manager reads the subnet fields (flannel's `CheckNetworkConfig`, see
/// `source::subnet_range::ipv6_subnet_range`); the Kubernetes one takes the node's
/// IPv6 pod CIDR as it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ipv6Conf {
    /// `IPv6Network`, host bits dropped as Go's `net.ParseCIDR` drops them.
    pub network: Ipv6Net,
    /// `IPv6SubnetLen`; `None` for flannel's "unset" (0).
    #[serde(default)]
    pub subnet_len: Option<u8>,
    /// `IPv6SubnetMin`.
    #[serde(default)]
    pub subnet_min: Option<Ipv6Addr>,
    /// `IPv6SubnetMax`.
    #[serde(default)]
    pub subnet_max: Option<Ipv6Addr>,
}

impl Ipv6Conf {
    pub fn new(network: Ipv6Net) -> Self {
        Ipv6Conf { network, subnet_len: None, subnet_min: None, subnet_max: None }
    }
}

fn on() -> bool {
    true
}

/// What an IPv6-only network (`EnableIPv4: false`) is refused with in etcd
/// mode, as flannel's etcd subnet manager cannot run one either.
pub const IPV6_ONLY_ETCD: &str = "IPv6-only (EnableIPv4 false) works with the Kubernetes subnet manager only: \
    flannel's etcd subnet manager always takes an IPv4 lease (pkg/subnet/etcd), so flannel peers could not read \
    an IPv6-only one";
/// flannel's error when both families are off (pkg/ipmatch `GetIPFamily`).
pub const NO_STACK: &str = "none defined stack";

impl Default for NetConf {
    fn default() -> Self {
        NetConf {
            ipv4: true,
            network: Ipv4Net::new(Ipv4Addr::new(10, 244, 0, 0), 16).unwrap_or_default(),
            vni: DEFAULT_VNI,
            port: DEFAULT_PORT,
            mtu: None,
            direct_routing: false,
            nftables: false,
            ipv6: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetConfError {
    #[error("cannot read net-conf {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("net-conf {path} is not valid JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("net-conf {path}: {field} {problem}")]
    Field { path: String, field: &'static str, problem: String },
}

/// Every net-conf field edgevx reads, here and (the etcd subnet ranges)
/// in source/leases.rs, as flannel spells it. The book's net-conf
/// reference (docs/src/reference/net-conf.md) has one row for each, and a
/// unit test shows the parsers read each one.
pub const FIELDS: &[&str] = &[
    "Network",
    "EnableIPv4",
    "EnableIPv6",
    "IPv6Network",
    "IPv6SubnetLen",
    "IPv6SubnetMin",
    "IPv6SubnetMax",
    "EnableNFTables",
    "SubnetLen",
    "SubnetMin",
    "SubnetMax",
    "Backend.Type",
    "Backend.VNI",
    "Backend.Port",
    "Backend.MTU",
    "Backend.GBP",
    "Backend.Learning",
    "Backend.DirectRouting",
];

fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v)
}

impl NetConf {
    pub fn load(path: &Path) -> Result<Self, NetConfError> {
        let shown = path.display().to_string();
        let text =
            std::fs::read_to_string(path).map_err(|source| NetConfError::Read { path: shown.clone(), source })?;
        Self::parse(&text, &shown)
    }

    pub fn parse(text: &str, path: &str) -> Result<Self, NetConfError> {
        let field =
            |field: &'static str, problem: String| NetConfError::Field { path: path.to_string(), field, problem };
        let root: Value =
            serde_json::from_str(text).map_err(|source| NetConfError::Json { path: path.to_string(), source })?;
        let root = root.as_object().ok_or_else(|| field("top level", "must be a JSON object".into()))?;
        let mut conf = NetConf::default();
        if let Some(v) = get(root, "Network") {
            let s = v.as_str().ok_or_else(|| field("Network", format!("must be a string, got {v}")))?;
            conf.network = s.parse().map_err(|_| field("Network", format!("{s:?} is not an IPv4 CIDR")))?;
            if conf.network.prefix_len() > 28 {
                return Err(field("Network", format!("{s} is smaller than /28")));
            }
        }
        let flag = |key: &'static str, default: bool| -> Result<bool, NetConfError> {
            match get(root, key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_bool().ok_or_else(|| field(key, format!("must be true or false, got {v}"))),
            }
        };
        let (ipv4, ipv6) = (flag("EnableIPv4", true)?, flag("EnableIPv6", false)?);
        if !(ipv4 || ipv6) {
            return Err(field("EnableIPv4", format!("false with EnableIPv6 false: {NO_STACK}")));
        }
        conf.ipv4 = ipv4;
        if ipv6 {
            conf.ipv6 = Some(ipv6_conf(root, &field)?);
        }
        if let Some(v) = get(root, "EnableNFTables") {
            conf.nftables =
                v.as_bool().ok_or_else(|| field("EnableNFTables", format!("must be true or false, got {v}")))?;
        }
        let Some(backend) = get(root, "Backend") else {
            return Ok(conf);
        };
        let backend = backend.as_object().ok_or_else(|| field("Backend", "must be a JSON object".into()))?;
        if let Some(t) = get(backend, "Type")
            && t.as_str() != Some("vxlan")
        {
            return Err(field("Backend.Type", format!("is {t}; edgevx only implements \"vxlan\"")));
        }
        let number = |key: &'static str, max: u64| -> Result<Option<u64>, NetConfError> {
            match get(backend, key) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(n) if n <= max => Ok(Some(n)),
                    _ => Err(field(key, format!("must be an integer from 0 to {max}, got {v}"))),
                },
            }
        };
        if let Some(vni) = number("VNI", 0x00ff_ffff)? {
            if vni == 0 {
                return Err(field("Backend.VNI", "0 is not a usable VNI".into()));
            }
            conf.vni = vni as u32;
        }
        // flannel: Port 0 means the kernel default, 8472
        if let Some(port) = number("Port", u16::MAX as u64)? {
            conf.port = if port == 0 { DEFAULT_PORT } else { port as u16 };
        }
        if let Some(mtu) = number("MTU", 65535)? {
            if mtu != 0 && mtu < 576 {
                return Err(field("Backend.MTU", format!("{mtu} is below 576")));
            }
            conf.mtu = (mtu != 0).then_some(mtu as u32);
        }
        if let Some(v) = get(backend, "DirectRouting") {
            conf.direct_routing =
                v.as_bool().ok_or_else(|| field("Backend.DirectRouting", format!("must be true or false, got {v}")))?;
        }
        for unsupported in ["GBP", "Learning"] {
            if get(backend, unsupported).and_then(Value::as_bool) == Some(true) {
                return Err(field("Backend", format!("{unsupported}: true is not supported by edgevx")));
            }
        }
        Ok(conf)
    }
}

/// `IPv6Network` (required with `EnableIPv6`) and the optional subnet keys.
fn ipv6_conf(
    root: &Map<String, Value>,
    field: &dyn Fn(&'static str, String) -> NetConfError,
) -> Result<Ipv6Conf, NetConfError> {
    let text = |key: &'static str| -> Result<Option<&str>, NetConfError> {
        match get(root, key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| field(key, format!("must be a string, got {v}"))),
        }
    };
    let s = text("IPv6Network")?.ok_or_else(|| {
        field("IPv6Network", "is required with EnableIPv6 (an IPv6 CIDR like fd00:10:244::/56)".into())
    })?;
    let network: Ipv6Net = s.parse().map_err(|_| field("IPv6Network", format!("{s:?} is not an IPv6 CIDR")))?;
    let mut v6 = Ipv6Conf::new(network.trunc());
    if let Some(v) = get(root, "IPv6SubnetLen").filter(|v| !v.is_null()) {
        let len = v
            .as_u64()
            .filter(|l| *l <= 128)
            .ok_or_else(|| field("IPv6SubnetLen", format!("must be an integer from 0 to 128, got {v}")))?;
        // 0 is flannel's "unset" (a Go uint's zero value)
        v6.subnet_len = (len != 0).then_some(len as u8);
    }
    let addr = |key: &'static str| -> Result<Option<Ipv6Addr>, NetConfError> {
        match text(key)? {
            None => Ok(None),
            // `::` is flannel's "unset" too (`ip.IsEmpty` in CheckNetworkConfig)
            Some(a) => a
                .parse::<Ipv6Addr>()
                .map(|a| Some(a).filter(|a| !a.is_unspecified()))
                .map_err(|_| field(key, format!("{a:?} is not an IPv6 address"))),
        }
    };
    v6.subnet_min = addr("IPv6SubnetMin")?;
    v6.subnet_max = addr("IPv6SubnetMax")?;
    Ok(v6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_flannel() {
        let c = NetConf::parse(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#, "x").unwrap();
        assert_eq!(c, NetConf::default());
        assert_eq!((c.vni, c.port, c.mtu), (1, 8472, None));
    }

    #[test]
    fn reads_backend_keys_case_insensitively() {
        let c = NetConf::parse(
            r#"{"network":"10.10.0.0/16","backend":{"type":"vxlan","vni":4096,"port":4789,"mtu":9000}}"#,
            "x",
        )
        .unwrap();
        assert_eq!(c.network.to_string(), "10.10.0.0/16");
        assert_eq!((c.vni, c.port, c.mtu), (4096, 4789, Some(9000)));
        let c = NetConf::parse(r#"{"Network":"10.10.0.0/16","Backend":{"Type":"vxlan","Port":0}}"#, "x").unwrap();
        assert_eq!(c.port, 8472);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{"Network":"10.244.0.0/33"}"#, "Network"),
            (r#"{"Network":"banana"}"#, "Network"),
            (r#"{"Backend":{"Type":"host-gw"}}"#, "Backend.Type"),
            (r#"{"Backend":{"VNI":0}}"#, "Backend.VNI"),
            (r#"{"Backend":{"VNI":16777216}}"#, "VNI"),
            (r#"{"Backend":{"Port":70000}}"#, "Port"),
            (r#"{"Backend":{"MTU":100}}"#, "Backend.MTU"),
            (r#"{"Backend":{"DirectRouting":"yes"}}"#, "Backend.DirectRouting"),
            (r#"{"Backend":{"GBP":true}}"#, "GBP"),
            (r#"{"Backend":{"Learning":true}}"#, "Learning"),
            (r#"{"enableipv6":true}"#, "IPv6Network"),
            (r#"{"EnableIPv6":"yes"}"#, "EnableIPv6"),
            (r#"{"EnableIPv6":true,"IPv6Network":"10.0.0.0/8"}"#, "IPv6Network"),
            (r#"{"EnableIPv6":true,"IPv6Network":7}"#, "IPv6Network"),
            (r#"{"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetLen":129}"#, "IPv6SubnetLen"),
            (r#"{"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMin":"fc00::x"}"#, "IPv6SubnetMin"),
            (r#"{"EnableIPv6":true,"IPv6Network":"fc00::/48","IPv6SubnetMax":"10.0.0.1"}"#, "IPv6SubnetMax"),
            (r#"[1]"#, "top level"),
        ];
        for (text, culprit) in cases {
            let e = NetConf::parse(text, "net-conf.json").unwrap_err().to_string();
            assert!(e.contains(culprit) && e.contains("net-conf.json"), "{text}: {e}");
        }
        assert!(matches!(NetConf::parse("{", "x"), Err(NetConfError::Json { .. })));
    }

    #[test]
    fn enable_nftables_is_read() {
        assert!(NetConf::parse(r#"{"EnableNFTables":true}"#, "x").unwrap().nftables);
        assert!(!NetConf::parse(r#"{"enablenftables":false}"#, "x").unwrap().nftables);
        let err = NetConf::parse(r#"{"EnableNFTables":"yes"}"#, "x").unwrap_err().to_string();
        assert!(err.contains("EnableNFTables"), "{err}");
    }

    #[test]
    fn direct_routing_is_read() {
        let c = NetConf::parse(r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true}}"#, "x");
        assert!(c.unwrap().direct_routing);
        let c = NetConf::parse(r#"{"backend":{"directrouting":false}}"#, "x").unwrap();
        assert_eq!(c, NetConf::default());
        // a view cached by an older edgevx has no such field
        let old: NetConf =
            serde_json::from_str(r#"{"network":"10.244.0.0/16","vni":1,"port":8472,"mtu":null}"#).unwrap();
        assert!(!old.direct_routing);
    }

    #[test]
    fn ipv6_switched_off_is_accepted() {
        // kube-flannel's ConfigMap may spell the default out
        let c = NetConf::parse(r#"{"Network":"10.244.0.0/16","EnableIPv6":false,"Backend":{"Type":"vxlan"}}"#, "x");
        assert_eq!(c.unwrap(), NetConf::default());
    }

    #[test]
    fn dual_stack_is_read_case_insensitively() {
        let c = NetConf::parse(
            r#"{"Network":"10.244.0.0/16","enableipv6":true,"ipv6network":"fd00:10:244::/56","ipv6subnetlen":64,
                "IPv6SubnetMin":"fd00:10:244:1::","IPv6SubnetMax":"fd00:10:244:ff::","Backend":{"Type":"vxlan"}}"#,
            "x",
        )
        .unwrap();
        let v6 = c.ipv6.unwrap();
        assert_eq!(v6.network.to_string(), "fd00:10:244::/56");
        assert_eq!(v6.subnet_len, Some(64));
        assert_eq!(v6.subnet_min, Some("fd00:10:244:1::".parse().unwrap()));
        assert_eq!(v6.subnet_max, Some("fd00:10:244:ff::".parse().unwrap()));
        let c = NetConf::parse(
            r#"{"EnableIPv6":true,"IPv6Network":"fd00::/56","IPv6SubnetMin":"::","IPv6SubnetMax":"::"}"#,
            "x",
        )
        .unwrap();
        let v6 = c.ipv6.unwrap();
        assert_eq!((v6.subnet_min, v6.subnet_max), (None, None), "\"::\" is flannel's unset");
    }

    #[test]
    fn ipv6_network_host_bits_are_dropped_like_go_parse_cidr() {
        let c = NetConf::parse(r#"{"EnableIPv6":true,"IPv6Network":"fd00:10:244::1/56","IPv6SubnetLen":0}"#, "x");
        let v6 = c.unwrap().ipv6.unwrap();
        assert_eq!((v6.network.to_string().as_str(), v6.subnet_len), ("fd00:10:244::/56", None));
    }

    #[test]
    fn ipv6_only_is_read_and_no_stack_is_refused() {
        let c = NetConf::parse(r#"{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48"}"#, "x").unwrap();
        assert!(!c.ipv4);
        assert_eq!(c.ipv6.unwrap().network.to_string(), "fc00::/48");
        let e = NetConf::parse(r#"{"EnableIPv4":false,"EnableIPv6":true}"#, "x").unwrap_err().to_string();
        assert!(e.contains("IPv6Network"), "{e}");
        assert!(NetConf::parse(r#"{"EnableIPv4":true}"#, "x").unwrap().ipv4);
        for text in [r#"{"EnableIPv4":false}"#, r#"{"enableipv4":false,"EnableIPv6":false}"#] {
            let e = NetConf::parse(text, "x").unwrap_err().to_string();
            assert!(e.ends_with(NO_STACK), "{e}");
        }
    }

    #[test]
    fn views_cached_before_dual_stack_still_load() {
        let old: NetConf = serde_json::from_str(
            r#"{"network":"10.244.0.0/16","vni":1,"port":8472,"mtu":null,"direct_routing":false,"nftables":false}"#,
        )
        .unwrap();
        assert_eq!(old, NetConf::default());
        // a view with the first dual-stack shape (the network alone)
        let c: NetConf = serde_json::from_str(
            r#"{"network":"10.244.0.0/16","vni":1,"port":8472,"mtu":null,"ipv6":{"network":"fd00::/56"}}"#,
        )
        .unwrap();
        assert_eq!(c.ipv6, Some(Ipv6Conf::new("fd00::/56".parse().unwrap())));
    }

    /// The fields in the first column of the book's net-conf table.
    fn documented() -> std::collections::BTreeSet<String> {
        let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference/net-conf.md");
        let text = std::fs::read_to_string(&page).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_string()))
            .collect()
    }

    #[test]
    fn the_books_net_conf_reference_lists_exactly_the_fields_edgevx_reads() {
        let read: std::collections::BTreeSet<String> = FIELDS.iter().map(|f| f.to_string()).collect();
        let documented = documented();
        let missing: Vec<_> = read.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&read).collect();
        assert!(missing.is_empty(), "read but not in docs/src/reference/net-conf.md: {missing:?}");
        assert!(extra.is_empty(), "in docs/src/reference/net-conf.md but never read: {extra:?}");
    }

    #[test]
    fn every_field_listed_is_read_a_bad_value_is_refused_naming_it() {
        for field in FIELDS {
            // a value of the wrong kind for every field; the two refused features need `true`
            let bad = if matches!(*field, "Backend.GBP" | "Backend.Learning") { "true" } else { "\"banana\"" };
            let (top, backend) = match field.strip_prefix("Backend.") {
                Some(b) => (String::new(), format!(r#","{b}":{bad}"#)),
                None => (format!(r#","{field}":{bad}"#), String::new()),
            };
            let conf = format!(
                r#"{{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"{top},"Backend":{{"Type":"vxlan"{backend}}}}}"#
            );
            let err = match NetConf::parse(&conf, "x") {
                Err(e) => e.to_string(),
                // the etcd subnet ranges are read where leases are taken
                Ok(parsed) => crate::source::subnet_range::subnet_range(&conf, &parsed)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default(),
            };
            let name = field.trim_start_matches("Backend.");
            assert!(err.contains(name), "{field}: {bad} was not refused naming it: {err:?}");
        }
    }
}
