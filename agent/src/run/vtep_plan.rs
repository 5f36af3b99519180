//! What a family's VTEP will be, decided before anything is created, one
//! path for both families: the programs must know our public addresses
//! (and so what VXLAN to judge) before a device's socket exists. And what
//! an earlier run left of a family the network config now has off.
use anyhow::{Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use tracing::{info, warn};

use super::{check::Checked, config};
use crate::{
    cli::RunArgs,
    dataplane::{
        device::{self, Underlay},
        vtep::{VtepFamily, VtepSpec, vtep_name},
    },
    mac::VtepMac,
    netconf::NetConf,
    netfilter,
    peer::OwnNode,
    state::StateDir,
    vtep_mac,
};

/// Where a family's settings are in the network config, the view of our
/// own node and the flags.
pub(super) trait StackFamily: VtepFamily {
    /// The family's pod network, when the network config has it on
    /// (`EnableIPv4` with `Network`, `EnableIPv6` with `IPv6Network`).
    fn network(conf: &NetConf) -> Option<Self>;
    /// What the cluster says of our half: our pod CIDR, the VtepMAC we
    /// publish (`backend-data` / `backend-v6-data`) and `node-public-ip`
    /// (or `-ipv6`).
    fn own(own: &OwnNode) -> (Option<Self>, Option<VtepMac>, Option<Self::Addr>);
    /// `--public-ip` / `--public-ipv6`.
    fn flag(args: &RunArgs) -> Option<Self::Addr>;
}

impl StackFamily for Ipv4Net {
    fn network(conf: &NetConf) -> Option<Self> {
        conf.ipv4.then_some(conf.network)
    }
    fn own(own: &OwnNode) -> (Option<Self>, Option<VtepMac>, Option<Self::Addr>) {
        (own.subnet, own.published_mac, own.node_public_ip)
    }
    fn flag(args: &RunArgs) -> Option<Self::Addr> {
        args.public_ip
    }
}

impl StackFamily for Ipv6Net {
    fn network(conf: &NetConf) -> Option<Self> {
        conf.ipv6.as_ref().map(|v6| v6.network)
    }
    fn own(own: &OwnNode) -> (Option<Self>, Option<VtepMac>, Option<Self::Addr>) {
        (own.subnet6, own.published_mac6, own.node_public_ipv6)
    }
    fn flag(args: &RunArgs) -> Option<Self::Addr> {
        args.public_ipv6
    }
}

/// What a family's VTEP will be.
pub(super) struct Plan<N: VtepFamily> {
    pub(super) spec: VtepSpec<N>,
    pub(super) subnet: N,
    pub(super) network: N,
}

/// The family's VTEP as the network config and our node say (`None` when
/// the family is off); `underlay` as it is now (its MTU may have changed
/// since the start, and a global IPv6 address may have come with SLAAC or
/// DAD). Chooses and saves the VTEP's MAC, never one of `others`.
pub(super) fn prepare<N: StackFamily>(
    c: &Checked,
    conf: &NetConf,
    own: &OwnNode,
    state: &StateDir,
    others: &vtep_mac::OthersMacs,
    underlay: &Underlay,
) -> Result<Option<Plan<N>>> {
    let Some(network) = N::network(conf) else { return Ok(None) };
    let name = N::NAME;
    let (subnet, published_mac, node_public_ip) = N::own(own);
    let subnet = subnet.with_context(|| {
        format!("{name} is on (Enable{name}), but this node has no {name} pod CIDR (spec.podCIDRs, or the etcd lease)")
    })?;
    let (mac, _) = vtep_mac::choose::<N>(published_mac, state, others)?;
    let public_ip = config::public_ip::<N>(N::flag(&c.args), node_public_ip, underlay).with_context(|| {
        let (kind, suffix) = if N::IPV6 { ("global IPv6", "v6") } else { ("IPv4", "") };
        format!(
            "{name} is on (Enable{name}), but {} has no usable {kind} address: add one, or give \
             --public-ip{suffix} (or the node-public-ip{suffix} annotation)",
            c.iface
        )
    })?;
    let spec = VtepSpec {
        name: vtep_name::<N>(conf.vni),
        vni: conf.vni,
        port: conf.port,
        local: public_ip,
        underlay_index: c.underlay.index,
        mac,
        mtu: config::vtep_mtu::<N>(conf, underlay.mtu),
    };
    Ok(Some(Plan { spec, subnet, network }))
}

/// With a family off in the network config: its VTEP left by an earlier
/// run (ours or flanneld's) goes, and our chains for it with it. An IPv4
/// one would take IPv4 VXLAN and route a pod network nothing programs; an
/// IPv6 one would take IPv6 VXLAN that nothing judges.
pub(super) async fn remove_leftovers<N: StackFamily>(handle: &Handle, vni: u32) -> Result<()> {
    let (family, device) = (N::NAME, vtep_name::<N>(vni));
    if device::delete_link(handle, &device).await? {
        warn!(device, "{family} is off in the network config: deleted the {family} VTEP an earlier run left");
    }
    if let Ok(fw) = netfilter::Firewall::new::<N>()
        && fw.remove_all().with_context(|| format!("cannot remove the {family} firewall rules"))?
    {
        info!("{family} is off: removed edgevx's {} chains", N::IPTABLES);
    }
    Ok(())
}
