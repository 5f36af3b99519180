//! Which pods on this node can take decapsulated frames directly.
//!
//! Learned from the kernel, not from the CNI: a pod the host has talked to
//! has a neighbour entry (pod IP -> pod MAC) on its bridge or veth; the
//! bridge's fdb says which veth port that MAC sits behind. Until a pod is
//! learned, its traffic takes the kernel path, so nothing is lost while
//! learning; it just is not fast yet.
use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
};

use anyhow::{Context, Result};
use edgevx_common::maps::LocalPod;
use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    Handle,
    packet_route::{
        AddressFamily,
        link::{InfoKind, LinkAttribute, LinkInfo},
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState},
    },
};

struct LinkFacts {
    kind: Option<InfoKind>,
    mac: Option<[u8; 6]>,
    controller: Option<u32>,
}

/// A link-layer address as an Ethernet MAC (its 6 bytes): `None` for one
/// of another length, as a tunnel device has (no pod's or bridge's).
fn ethernet_mac(bytes: &[u8]) -> Option<[u8; 6]> {
    bytes.try_into().ok()
}

async fn links(handle: &Handle) -> Result<HashMap<u32, LinkFacts>> {
    let mut out = HashMap::new();
    let mut stream = handle.link().get().execute();
    while let Some(link) = stream.try_next().await.context("cannot list links")? {
        let mut facts = LinkFacts { kind: None, mac: None, controller: None };
        for a in &link.attributes {
            match a {
                LinkAttribute::Address(m) => facts.mac = ethernet_mac(m),
                LinkAttribute::Controller(c) => facts.controller = Some(*c),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let LinkInfo::Kind(k) = i {
                            facts.kind = Some(k.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        out.insert(link.header.index, facts);
    }
    Ok(out)
}

/// (bridge ifindex, MAC) -> the port the bridge learned it on.
async fn bridge_fdb(handle: &Handle, links: &HashMap<u32, LinkFacts>) -> Result<HashMap<(u32, [u8; 6]), u32>> {
    let mut out = HashMap::new();
    let mut stream = handle.neighbours().get().set_address_family(AddressFamily::Bridge).execute();
    while let Some(n) = stream.try_next().await.context("cannot list the bridge fdb")? {
        let port = n.header.ifindex;
        let Some(bridge) = links.get(&port).and_then(|l| l.controller) else {
            continue;
        };
        for a in &n.attributes {
            if let NeighbourAttribute::LinkLayerAddress(m) = a
                && let Some(mac) = ethernet_mac(m)
            {
                out.insert((bridge, mac), port);
            }
        }
    }
    Ok(out)
}

/// A local pod, and the bridge its port hangs off (`None`: a routed veth).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Learned {
    pub pod: LocalPod,
    pub bridge: Option<u32>,
}

/// The local pods of `subnet` the kernel currently knows about.
pub async fn discover(handle: &Handle, subnet: Ipv4Net) -> Result<BTreeMap<[u8; 4], Learned>> {
    let links = links(handle).await?;
    let fdb = bridge_fdb(handle, &links).await?;
    let mut out = BTreeMap::new();
    let mut stream = handle.neighbours().get().set_address_family(AddressFamily::Inet).execute();
    while let Some(n) = stream.try_next().await.context("cannot list neighbours")? {
        if matches!(n.header.state, NeighbourState::Incomplete | NeighbourState::Failed | NeighbourState::None) {
            continue;
        }
        let mut ip: Option<Ipv4Addr> = None;
        let mut mac = None;
        for a in &n.attributes {
            match a {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => ip = Some(*v),
                NeighbourAttribute::LinkLayerAddress(m) => mac = ethernet_mac(m),
                _ => {}
            }
        }
        let (Some(ip), Some(pod_mac)) = (ip, mac) else {
            continue;
        };
        // the subnet's network and gateway addresses are the host's own
        if !subnet.contains(&ip) || ip == subnet.network() || ip == subnet.broadcast() {
            continue;
        }
        let dev = n.header.ifindex;
        let Some(facts) = links.get(&dev) else {
            continue;
        };
        let port = match facts.kind {
            Some(InfoKind::Veth) => Some(dev),
            Some(InfoKind::Bridge) => fdb.get(&(dev, pod_mac)).copied(),
            _ => None,
        };
        let Some(port) = port.filter(|p| matches!(links.get(p).and_then(|l| l.kind.clone()), Some(InfoKind::Veth)))
        else {
            continue;
        };
        let Some(host_mac) = facts.mac else { continue };
        let bridge = matches!(facts.kind, Some(InfoKind::Bridge)).then_some(dev);
        out.insert(ip.octets(), Learned { pod: LocalPod { host_ifindex: port, pod_mac, host_mac }, bridge });
    }
    Ok(out)
}
