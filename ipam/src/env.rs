//! The CNI_* environment (SPEC.md section 2, "Parameters"), checked.
//!
//! ```sh
//! CNI_COMMAND=ADD CNI_CONTAINERID=ID CNI_NETNS=/run/netns/POD CNI_IFNAME=eth0 \
//!   CNI_ARGS='IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0' \
//!   CNI_PATH=/opt/cni/bin edgevx-ipam < net.json
//! ```
use thiserror::Error;

use crate::{
    identity::PodRef,
    wire::{CniError, Code},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum EnvError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("CNI_COMMAND={0:?} is not one of ADD, DEL, CHECK, GC, STATUS, VERSION")]
    Command(String),
    #[error("CNI_CONTAINERID={0:?}: must be alphanumeric, then alphanumerics, '_', '.', '-'")]
    ContainerId(String),
    #[error("CNI_IFNAME={0:?} is not an interface name")]
    Ifname(String),
    #[error("CNI_ARGS: {0:?} is not KEY=VALUE")]
    ArgsPair(String),
    #[error("CNI_ARGS lacks {0}: this plugin keeps addresses per pod and needs the pod's namespace and name")]
    ArgsMissing(&'static str),
    #[error("CNI_ARGS {key}={value:?} is not a Kubernetes {what}")]
    ArgsName { key: &'static str, value: String, what: &'static str },
}

impl From<EnvError> for CniError {
    fn from(e: EnvError) -> Self {
        CniError::new(Code::InvalidEnv, "invalid CNI environment", e.to_string())
    }
}

/// What the runtime said about the attachment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

fn var(get: &impl Fn(&str) -> Option<String>, name: &'static str) -> Result<String, EnvError> {
    get(name).filter(|v| !v.is_empty()).ok_or(EnvError::Missing(name))
}

pub fn command(get: &impl Fn(&str) -> Option<String>) -> Result<Command, EnvError> {
    Ok(match var(get, "CNI_COMMAND")?.as_str() {
        "ADD" => Command::Add,
        "DEL" => Command::Del,
        "CHECK" => Command::Check,
        "GC" => Command::Gc,
        "STATUS" => Command::Status,
        "VERSION" => Command::Version,
        other => return Err(EnvError::Command(other.to_string())),
    })
}

/// CNI_CONTAINERID and CNI_IFNAME; ADD and CHECK also need CNI_NETNS.
pub fn attachment(get: &impl Fn(&str) -> Option<String>, needs_netns: bool) -> Result<Attachment, EnvError> {
    let container_id = var(get, "CNI_CONTAINERID")?;
    let mut chars = container_id.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if !valid {
        return Err(EnvError::ContainerId(container_id));
    }
    if needs_netns {
        var(get, "CNI_NETNS")?;
    }
    let ifname = var(get, "CNI_IFNAME")?;
    // the kernel's rules for a device name (and Go skel's ValidateInterfaceName)
    let valid = ifname.len() < 16
        && ifname != "."
        && ifname != ".."
        && !ifname.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if !valid {
        return Err(EnvError::Ifname(ifname));
    }
    Ok(Attachment { container_id, ifname })
}

/// A DNS label (namespaces, at most 63) or subdomain (pod names, at most 253).
fn k8s_name(s: &str, max: usize, dots: bool) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

/// The pod from CNI_ARGS (`K=V;K=V`; every pair must have one '=', as in
/// libcni's `LoadArgs`; unknown keys are ignored, as with IgnoreUnknown).
pub fn pod(get: &impl Fn(&str) -> Option<String>) -> Result<PodRef, EnvError> {
    let args = var(get, "CNI_ARGS")?;
    let (mut namespace, mut name) = (None, None);
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| EnvError::ArgsPair(pair.to_string()))?;
        if v.contains('=') {
            return Err(EnvError::ArgsPair(pair.to_string()));
        }
        match k {
            "K8S_POD_NAMESPACE" => namespace = Some(v.to_string()),
            "K8S_POD_NAME" => name = Some(v.to_string()),
            _ => {}
        }
    }
    let namespace = namespace.ok_or(EnvError::ArgsMissing("K8S_POD_NAMESPACE"))?;
    let name = name.ok_or(EnvError::ArgsMissing("K8S_POD_NAME"))?;
    if !k8s_name(&namespace, 63, false) {
        return Err(EnvError::ArgsName { key: "K8S_POD_NAMESPACE", value: namespace, what: "namespace" });
    }
    if !k8s_name(&name, 253, true) {
        return Err(EnvError::ArgsName { key: "K8S_POD_NAME", value: name, what: "pod name" });
    }
    Ok(PodRef { namespace, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let v: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| v.iter().find(|(kk, _)| kk == k).map(|(_, vv)| vv.clone())
    }

    #[test]
    fn pod_comes_from_cni_args() {
        let e = env(&[(
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-x.y;K8S_POD_UID=u",
        )]);
        assert_eq!(pod(&e).unwrap(), PodRef { namespace: "kube-system".into(), name: "coredns-x.y".into() });
    }

    #[test]
    fn long_names_are_kubernetes_names() {
        let (ns, name) = ("n".repeat(63), "p".repeat(253));
        let args = format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}");
        assert!(pod(&env(&[("CNI_ARGS", &args)])).is_ok());
        let args = format!("K8S_POD_NAMESPACE={ns}x;K8S_POD_NAME={name}");
        assert!(matches!(pod(&env(&[("CNI_ARGS", &args)])), Err(EnvError::ArgsName { .. })));
    }

    #[test]
    fn bad_args_are_named() {
        assert_eq!(pod(&env(&[])), Err(EnvError::Missing("CNI_ARGS")));
        assert_eq!(pod(&env(&[("CNI_ARGS", "K8S_POD_NAME=a")])), Err(EnvError::ArgsMissing("K8S_POD_NAMESPACE")));
        assert_eq!(pod(&env(&[("CNI_ARGS", "junk")])), Err(EnvError::ArgsPair("junk".into())));
        let under = pod(&env(&[("CNI_ARGS", "K8S_POD_NAMESPACE=a_b;K8S_POD_NAME=c")]));
        assert!(matches!(under, Err(EnvError::ArgsName { key: "K8S_POD_NAMESPACE", .. })));
    }

    #[test]
    fn attachments_are_checked() {
        let ok = env(&[("CNI_CONTAINERID", "abc-1.2_3"), ("CNI_IFNAME", "eth0"), ("CNI_NETNS", "/run/netns/x")]);
        assert_eq!(attachment(&ok, true).unwrap().container_id, "abc-1.2_3");
        let injected = env(&[("CNI_CONTAINERID", "abc\r\neth0"), ("CNI_IFNAME", "eth0")]);
        assert!(matches!(attachment(&injected, false), Err(EnvError::ContainerId(_))));
        let slash = env(&[("CNI_CONTAINERID", "abc"), ("CNI_IFNAME", "../x")]);
        assert!(matches!(attachment(&slash, false), Err(EnvError::Ifname(_))));
        let no_netns = env(&[("CNI_CONTAINERID", "abc"), ("CNI_IFNAME", "eth0")]);
        assert_eq!(attachment(&no_netns, true), Err(EnvError::Missing("CNI_NETNS")));
        assert!(attachment(&no_netns, false).is_ok());
        assert!(matches!(command(&env(&[("CNI_COMMAND", "FOO")])), Err(EnvError::Command(_))));
    }
}
