//! Bringing the dataplane up, once: each family's VTEP planned, subnet.env
//! first (restore first), the programs loaded, each family's side brought
//! up around the config map, and the record `edgevx status` and the next
//! start read.
use std::time::Instant;

use anyhow::{Context, Result};
use edgevx_common::maps::{
    DataplaneConfig, FLAG_BYPASS_NETFILTER, FLAG_ENCAP_NO_L2_ETH, FLAG_REQUIRE_JUDGED, FLAG_STRICT_INNER_SOURCE,
};
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use tracing::{info, warn};

use super::{
    Node,
    side::{Side, SideFamily, Sides},
};
use crate::{
    dataplane::{bpffs, device, fast_path, features::Features, guard, loaded::Loaded, loader, maps::Maps, vtep},
    metrics::startup::{Milestone, Startup},
    netconf::NetConf,
    netfilter,
    peer::OwnNode,
    reconcile::Nag,
    run::{
        check::Checked,
        vtep_plan::{self, Plan},
    },
    state::{AgentRecord, Record4, Record6, StateDir},
    subnet_env,
};

/// What each family's VTEP will be (`None`: the family is off).
struct Plans {
    v4: Option<Plan<Ipv4Net>>,
    v6: Option<Plan<Ipv6Net>>,
}

impl Plans {
    /// The pods' MTU: the IPv4 VTEP's; IPv6-only, the IPv6 VTEP's.
    fn mtu(&self, conf: &NetConf, underlay_mtu: u32) -> u32 {
        match (&self.v4, &self.v6) {
            (Some(p4), _) => p4.spec.mtu,
            (None, Some(p6)) => p6.spec.mtu,
            (None, None) => crate::run::config::vtep_mtu::<Ipv4Net>(conf, underlay_mtu),
        }
    }
}

/// What the bring-up passes on to the node: the shared parts.
struct Shared {
    pins: bpffs::PinDir,
    ebpf: Loaded,
    features: Features,
    rules: netfilter::Settings,
}

pub(in crate::run) async fn bring_up(
    c: &Checked,
    conf: &NetConf,
    own: OwnNode,
    others: &crate::vtep_mac::OthersMacs,
    state: &StateDir,
    handle: &Handle,
    startup: &Startup,
) -> Result<Node> {
    // the underlay now: its MTU (or IPv6 address) may have changed since the start-up checks
    let underlay = device::underlay(handle, &c.iface).await.unwrap_or_else(|_| c.underlay.clone());
    let plans = Plans {
        v4: vtep_plan::prepare::<Ipv4Net>(c, conf, &own, state, others, &underlay)?,
        v6: vtep_plan::prepare::<Ipv6Net>(c, conf, &own, state, others, &underlay)?,
    };
    if let Some(p4) = &plans.v4 {
        super::mtu::warn_if_capped(conf, underlay.mtu, p4.spec.mtu);
    }
    let mtu = plans.mtu(conf, underlay.mtu);
    // restore first: subnet.env before anything else, so the CNI adds pods at
    // once (after a reboot /run is empty); it says only what is decided by now
    write_subnet_env(c, &plans, mtu)?;
    startup.reached(Milestone::SubnetEnv, Instant::now());
    let Shared { pins, ebpf, features, rules } = load(c, conf)?;
    // the IPv4 VTEP before the config map, which names it
    let index4 = match &plans.v4 {
        Some(p) => Some(vtep_up(p, handle, startup).await?),
        None => {
            vtep_plan::remove_leftovers::<Ipv4Net>(handle, conf.vni).await?;
            None
        }
    };
    let mut maps = Maps::open(&pins)?;
    // the pods learned by an earlier run may sit on a bridge our program is
    // not attached to yet; they come back at the first learning pass
    maps.sync_local_pods(&Default::default())?;
    if plans.v6.is_none() {
        // before the config map says IPv6 is off: no socket of an old flannel-v6 left to take IPv6 VXLAN
        vtep_plan::remove_leftovers::<Ipv6Net>(handle, conf.vni).await?;
    }
    maps.set_config(&config(c, conf, &plans, index4))?;
    let (fast_path, fast_path_tasks) = start_fast_path(c, &features, &pins, plans.v4.is_some());
    // only now that the programs judge IPv6 VXLAN: the device's socket
    let v6 = match &plans.v6 {
        Some(p) => Some(Side::new(vtep_up(p, handle, startup).await?, p, &rules)?),
        None => None,
    };
    // each family's firewall chains once its VTEP is up, the IPv4 ones last as ever
    let v4 = match (index4, &plans.v4) {
        (Some(index), Some(p)) => Some(Side::new(index, p, &rules)?),
        _ => None,
    };
    let record = agent_record(c, conf, &plans, mtu, &fast_path, &features);
    // best effort (records.rs): a full or read-only state dir never stops the bring-up
    state.save_agent(&record);
    Ok(Node {
        handle: handle.clone(),
        sides: Sides { v4, v6 },
        underlay_index: c.underlay.index,
        own,
        record,
        pending: Some(ebpf),
        _fast_path: fast_path_tasks,
        loaded: None,
        bridge: None,
        rules,
        pins,
        accepted: Vec::new(),
        peers_saved: false,
        off_underlay_seen: maps.counter(edgevx_common::counters::Counter::DropVxlanOffUnderlay).ok().flatten(),
        maps,
        fill: None,
        nag: Nag::default(),
        own_addrs: Default::default(),
        first_peer_at: None,
    })
}

/// subnet.env with what is decided before anything is created.
fn write_subnet_env(c: &Checked, plans: &Plans, mtu: u32) -> Result<()> {
    subnet_env::write(
        &c.args.subnet_file,
        plans.v4.as_ref().map(|p| (p.network, p.subnet)),
        plans.v6.as_ref().map(|p| (p.network, p.subnet)),
        mtu,
        c.args.ip_masq,
    )
    .with_context(|| format!("cannot write {}", c.args.subnet_file.display()))
}

/// The fast path, on where the kernel and the flags allow it (only with an
/// IPv4 overlay): whatever fails there leaves it off and says why.
fn start_fast_path(
    c: &Checked,
    features: &Features,
    pins: &bpffs::PinDir,
    ipv4: bool,
) -> (Result<(), String>, Option<crate::run::fast_path::FastPathTasks>) {
    let (state, tasks) = match fast_path::state(c.args.fast_path, &features.conntrack) {
        Ok(()) if !ipv4 => (Err("off: no IPv4 overlay".to_string()), None),
        state => crate::run::fast_path::start(pins, state, c.args.fast_path_test_ignore_liberal),
    };
    match &state {
        Ok(()) => info!("fast path on: established plain flows from peers' pods skip the host stack"),
        Err(why) => info!(state = %why, "fast path off"),
    }
    (state, tasks)
}

/// The family's VTEP device as `plan` says, with its address; returns its
/// ifindex.
async fn vtep_up<N: SideFamily>(plan: &Plan<N>, handle: &Handle, startup: &Startup) -> Result<u32> {
    let index = vtep::ensure_vtep(handle, &plan.spec).await?;
    vtep::ensure_address(handle, index, plan.subnet, plan.network).await?;
    let spec = &plan.spec;
    info!(family = N::NAME, device = %spec.name, mac = %spec.mac, public_ip = %spec.local, subnet = %plan.subnet,
        mtu = spec.mtu, "VTEP ready");
    // the first family's (dual-stack: flannel.<VNI>; IPv6-only, flannel-v6.<VNI>)
    startup.reached(Milestone::VtepUp, Instant::now());
    Ok(index)
}

/// The pin dir, the kernel's features, the programs loaded (not
/// attached) and the firewall's settings for both families.
fn load(c: &Checked, conf: &NetConf) -> Result<Shared> {
    bpffs::ensure_dir_on_bpffs(&c.args.paths.bpffs)?;
    let pins = bpffs::PinDir::new(&c.args.paths.bpffs);
    let features = Features::probe(c.args.fast_path);
    info!(
        check_mtu = features.check_mtu,
        atomic_fetch = features.atomic_fetch,
        tcx = features.tcx,
        "kernel features probed"
    );
    let mut ebpf = loader::load(&pins, &features)?;
    // where the guard cannot refuse a peer's VXLAN off the underlay, a rule does
    let rules = netfilter::Settings {
        vxlan_port: conf.port,
        ip_masq: c.args.ip_masq,
        forward: c.args.iptables_forward_rules,
        vxlan_only_on: (!guard::checks_iface(&mut ebpf)?).then(|| c.iface.clone()),
    };
    Ok(Shared { pins, ebpf, features, rules })
}

/// The config map: what the programs know of this node.
fn config(c: &Checked, conf: &NetConf, plans: &Plans, vtep_index: Option<u32>) -> DataplaneConfig {
    let bypass = c.args.bypass_netfilter;
    // a kernel without the flag (before 5.13) is asked again without it, per packet
    let legacy_encap = c.args.legacy_encap;
    if legacy_encap && plans.v4.is_some() {
        info!("encapsulating without BPF_F_ADJ_ROOM_ENCAP_L2_ETH (--legacy-encap)");
    }
    if bypass && let Some(found) = netfilter::kube_proxy_present() {
        warn!(
            %found,
            "--bypass-netfilter is on, but kube-proxy's packet rules are on this node: replies to Service \
             traffic from other nodes lose their reverse NAT, and conntrack sees only one direction of pod \
             flows (kube-proxy's ctstate INVALID drop then drops them). Turn it off unless pod traffic has \
             no packet-level NAT or policy"
        );
    }
    DataplaneConfig {
        vni: conf.vni,
        // all zero in an IPv6-only network: no IPv4 VXLAN is ours, decap refuses every one
        local_ip: plans.v4.as_ref().map_or([0; 4], |p| p.spec.local.octets()),
        vtep_mac: plans.v4.as_ref().map_or([0; 6], |p| p.spec.mac.0),
        port: conf.port,
        flags: if bypass { FLAG_BYPASS_NETFILTER } else { 0 }
            | if c.args.strict_inner_source { FLAG_STRICT_INNER_SOURCE } else { 0 }
            | if legacy_encap { FLAG_ENCAP_NO_L2_ETH } else { 0 }
            // this decap marks what it judged: the VTEP guard may drop the rest
            | FLAG_REQUIRE_JUDGED,
        vtep_ifindex: vtep_index.unwrap_or(0),
        underlay_ifindex: c.underlay.index,
        // all zero: IPv6 off, IPv6 VXLAN is not judged
        public_ip6: plans.v6.as_ref().map_or([0; 16], |p| p.spec.local.octets()),
    }
}

/// What this node was set up with, for `edgevx status` and the next start.
fn agent_record(
    c: &Checked,
    conf: &NetConf,
    plans: &Plans,
    mtu: u32,
    fast_path: &Result<(), String>,
    features: &Features,
) -> AgentRecord {
    AgentRecord {
        node: c.node.clone(),
        iface: c.iface.clone(),
        v4: plans.v4.as_ref().map(|p| Record4 {
            vtep_device: p.spec.name.clone(),
            vtep_mac: p.spec.mac,
            public_ip: p.spec.local,
            subnet: p.subnet,
            network: conf.network,
        }),
        vni: conf.vni,
        port: conf.port,
        mtu,
        bypass_netfilter: c.args.bypass_netfilter,
        fast_path: match fast_path {
            Ok(()) => "on".to_string(),
            Err(why) => why.clone(),
        },
        ip_masq: c.args.ip_masq,
        attach: match c.args.tc_attach.as_str() {
            "tcx" => loader::AttachMode::Tcx,
            "clsact" => loader::AttachMode::Clsact,
            _ => loader::AttachMode::for_kernel(features),
        },
        pod_bridge: c.args.pod_bridge.clone(),
        subnet_file: c.args.subnet_file.clone(),
        pid: std::process::id(),
        v6: plans.v6.as_ref().map(|p| Record6 {
            device: p.spec.name.clone(),
            mac: p.spec.mac,
            public_ip: p.spec.local,
            subnet: p.subnet,
            network: p.network,
            mtu: p.spec.mtu,
        }),
        xdp_judge: c.args.xdp_judge,
    }
}
