//! flannel's node annotation names, derived from `--kube-annotation-prefix`
//! exactly as flannel derives them (pkg/subnet/kube/annotations.go).

pub const DEFAULT_PREFIX: &str = "flannel.alpha.coreos.com";

/// edgevx's own Node annotation (not under flannel's prefix): with the value
/// `"true"`, the node's VXLAN may carry any inner source, not only its pod
/// CIDR's. For the pseudo-Node of an external VTEP that forwards client
/// traffic without SNAT (an F5 BIG-IP); any other value is the default.
pub const ANY_INNER_SOURCE: &str = "edgevx.io/any-inner-source";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnotationNames {
    pub subnet_manager: String,
    pub backend_type: String,
    pub backend_data: String,
    pub public_ip: String,
    pub public_ip_overwrite: String,
    pub node_public_ip: String,
    /// Dual-stack: `{"VNI":<vni>,"VtepMAC":"<flannel-v6 MAC>"}`.
    pub backend_v6_data: String,
    pub public_ipv6: String,
    pub public_ipv6_overwrite: String,
    pub node_public_ipv6: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "annotation prefix {0:?} is invalid: want a DNS-style prefix like \"flannel.alpha.coreos.com\" or \"example.com/flannel-\""
)]
pub struct PrefixError(String);

fn valid_label_chars(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

impl AnnotationNames {
    pub fn new(prefix: &str) -> Result<Self, PrefixError> {
        let err = || PrefixError(prefix.to_string());
        let mut p = prefix.to_string();
        match p.matches('/').count() {
            0 => p.push('/'),
            1 if !(p.ends_with('/') || p.ends_with('-')) => p.push('-'),
            1 => {}
            _ => return Err(err()),
        }
        // (?:[a-z0-9_-]+\.)+[a-z0-9_-]+/(?:[a-z0-9_-]+-)?$
        let (domain, tail) = p.split_once('/').ok_or_else(err)?;
        let labels: Vec<&str> = domain.split('.').collect();
        if labels.len() < 2 || !labels.iter().all(|l| valid_label_chars(l)) {
            return Err(err());
        }
        if !(tail.is_empty() || tail.ends_with('-') && valid_label_chars(tail)) {
            return Err(err());
        }
        let name = |n: &str| format!("{p}{n}");
        Ok(AnnotationNames {
            subnet_manager: name("kube-subnet-manager"),
            backend_type: name("backend-type"),
            backend_data: name("backend-data"),
            public_ip: name("public-ip"),
            public_ip_overwrite: name("public-ip-overwrite"),
            node_public_ip: name("node-public-ip"),
            backend_v6_data: name("backend-v6-data"),
            public_ipv6: name("public-ipv6"),
            public_ipv6_overwrite: name("public-ipv6-overwrite"),
            node_public_ipv6: name("node-public-ipv6"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_prefix_gives_flannel_names() {
        let n = AnnotationNames::new(DEFAULT_PREFIX).unwrap();
        assert_eq!(n.backend_data, "flannel.alpha.coreos.com/backend-data");
        assert_eq!(n.subnet_manager, "flannel.alpha.coreos.com/kube-subnet-manager");
        assert_eq!(n.public_ip_overwrite, "flannel.alpha.coreos.com/public-ip-overwrite");
        assert_eq!(n.backend_v6_data, "flannel.alpha.coreos.com/backend-v6-data");
        assert_eq!(n.public_ipv6, "flannel.alpha.coreos.com/public-ipv6");
        assert_eq!(n.public_ipv6_overwrite, "flannel.alpha.coreos.com/public-ipv6-overwrite");
        assert_eq!(n.node_public_ipv6, "flannel.alpha.coreos.com/node-public-ipv6");
    }

    #[test]
    fn prefix_with_slash_gets_a_dash() {
        let n = AnnotationNames::new("example.com/flannel").unwrap();
        assert_eq!(n.public_ip, "example.com/flannel-public-ip");
        assert_eq!(n.backend_v6_data, "example.com/flannel-backend-v6-data");
        let n = AnnotationNames::new("example.com/flannel-").unwrap();
        assert_eq!(n.public_ip, "example.com/flannel-public-ip");
        assert_eq!(n.node_public_ipv6, "example.com/flannel-node-public-ipv6");
    }

    #[test]
    fn bad_prefixes_are_rejected() {
        for bad in ["", "nodots", "a/b/c", "Upper.case", "example.com/x y", "a..b"] {
            assert!(AnnotationNames::new(bad).is_err(), "{bad}");
        }
    }
}
