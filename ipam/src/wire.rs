//! The CNI wire: spec versions, the IPAM result, the error object and its
//! well-known codes (containernetworking/cni SPEC.md, spec 1.1.0, "Error"
//! and "Well-known Error Codes"; STATUS's 50 from its own section).
//!
//! No maintained Rust CNI crate covers 1.1 (GC, STATUS) with the older
//! result formats, so the few types live here.
use std::{fmt, net::IpAddr};

use serde::Serialize;

/// The spec versions this plugin speaks. 0.1.0/0.2.0 had another result
/// shape (`ip4`/`ip6` objects) that no runtime of today sends.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// What a plugin answers when the config names no version.
pub const LATEST: &str = "1.1.0";

/// The error codes this plugin returns. 0-99 are the spec's; 100+ ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// 1: the config's `cniVersion` is not one we speak.
    IncompatibleVersion,
    /// 3: CHECK found no reservation for the attachment.
    UnknownContainer,
    /// 4: a CNI_* variable is missing or malformed.
    InvalidEnv,
    /// 5: reading or writing the store failed.
    Io,
    /// 6: stdin is not the JSON we expect.
    Decode,
    /// 7: the JSON is well formed but the network config is not valid.
    InvalidConfig,
    /// 50 (STATUS): cannot serve ADD, e.g. a range set is exhausted.
    NotAvailable,
    /// 100: a file in the store is not in a format either plugin writes.
    CorruptStore,
    /// 101: ADD found no free or retained address in a range set.
    NoAddress,
}

impl Code {
    pub fn number(self) -> u32 {
        match self {
            Code::IncompatibleVersion => 1,
            Code::UnknownContainer => 3,
            Code::InvalidEnv => 4,
            Code::Io => 5,
            Code::Decode => 6,
            Code::InvalidConfig => 7,
            Code::NotAvailable => 50,
            Code::CorruptStore => 100,
            Code::NoAddress => 101,
        }
    }
}

/// A failure as the runtime sees it: the code, a short message, and the
/// details that name the culprit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: Code,
    pub msg: String,
    pub details: String,
}

impl CniError {
    pub fn new(code: Code, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError { code, msg: msg.into(), details: details.into() }
    }

    /// The JSON object printed on stdout (SPEC.md "Error").
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code.number(),
            "msg": self.msg,
            "details": self.details,
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {}): {}", self.msg, self.code.number(), self.details)
    }
}

impl std::error::Error for CniError {}

/// One address given to the attachment, with its prefix and gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    pub address: IpAddr,
    pub prefix: u8,
    pub gateway: Option<IpAddr>,
}

/// A route from `ipam.routes`, passed through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Route {
    pub dst: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// The `dns` object, from `ipam.resolvConf`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Dns {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    pub fn is_empty(&self) -> bool {
        *self == Dns::default()
    }
}

/// The abbreviated success object of a delegated (IPAM) plugin: no
/// `interfaces`, no `ips[].interface` (SPEC.md section 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamResult {
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

#[derive(Serialize)]
struct IpJson {
    /// Only before 1.0.0: "4" or "6".
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<&'static str>,
    address: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResultJson<'a> {
    cni_version: &'a str,
    ips: Vec<IpJson>,
    #[serde(skip_serializing_if = "<[Route]>::is_empty")]
    routes: &'a [Route],
    #[serde(skip_serializing_if = "Dns::is_empty")]
    dns: &'a Dns,
}

impl IpamResult {
    /// The result in the format of `cni_version` (one of
    /// [`SUPPORTED_VERSIONS`]): 0.3.x and 0.4.0 carry `ips[].version`.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let versioned = cni_version.starts_with("0.");
        let ips = self
            .ips
            .iter()
            .map(|ip| IpJson {
                version: versioned.then_some(if ip.address.is_ipv4() { "4" } else { "6" }),
                address: format!("{}/{}", ip.address, ip.prefix),
                gateway: ip.gateway.map(|g| g.to_string()),
            })
            .collect();
        let out = ResultJson { cni_version, ips, routes: &self.routes, dns: &self.dns };
        serde_json::to_value(out).unwrap_or_default()
    }
}

/// The VERSION answer.
pub fn version_json(cni_version: &str) -> serde_json::Value {
    serde_json::json!({ "cniVersion": cni_version, "supportedVersions": SUPPORTED_VERSIONS })
}

/// Whether the config's version allows GC and STATUS (added in 1.1.0).
pub fn has_gc_and_status(cni_version: &str) -> bool {
    cni_version == "1.1.0"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result() -> IpamResult {
        IpamResult {
            ips: vec![
                IpConfig {
                    address: "10.244.1.5".parse().unwrap(),
                    prefix: 24,
                    gateway: Some("10.244.1.1".parse().unwrap()),
                },
                IpConfig { address: "fd00::5".parse().unwrap(), prefix: 64, gateway: None },
            ],
            routes: vec![Route { dst: "10.244.0.0/16".into(), gw: None }],
            dns: Dns::default(),
        }
    }

    #[test]
    fn result_1_x_has_no_ip_version() {
        let j = result().to_json("1.1.0");
        assert_eq!(
            j,
            serde_json::json!({
                "cniVersion": "1.1.0",
                "ips": [{"address": "10.244.1.5/24", "gateway": "10.244.1.1"}, {"address": "fd00::5/64"}],
                "routes": [{"dst": "10.244.0.0/16"}],
            })
        );
    }

    #[test]
    fn result_0_3_1_names_the_family() {
        let j = result().to_json("0.3.1");
        assert_eq!(j["ips"][0]["version"], "4");
        assert_eq!(j["ips"][1]["version"], "6");
        assert!(j.get("dns").is_none());
    }

    #[test]
    fn error_object_has_the_spec_fields() {
        let e = CniError::new(Code::IncompatibleVersion, "incompatible CNI version", "9.9.9");
        assert_eq!(
            e.to_json("1.1.0"),
            serde_json::json!({"cniVersion": "1.1.0", "code": 1, "msg": "incompatible CNI version", "details": "9.9.9"})
        );
        assert_eq!(Code::NotAvailable.number(), 50);
        assert_eq!(Code::Decode.number(), 6);
        assert_eq!(Code::InvalidConfig.number(), 7);
        assert_eq!(Code::InvalidEnv.number(), 4);
        assert!(Code::NoAddress.number() >= 100 && Code::CorruptStore.number() >= 100);
    }

    #[test]
    fn version_lists_what_we_speak() {
        let j = version_json("0.3.1");
        assert_eq!(j["supportedVersions"].as_array().unwrap().len(), SUPPORTED_VERSIONS.len());
        assert!(has_gc_and_status("1.1.0") && !has_gc_and_status("1.0.0"));
    }
}
