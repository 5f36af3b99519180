//! Bringing the dataplane up, once: subnet.env first (restore first), the
//! programs loaded, the VTEP devices, the config map, the firewall, and the
//! record `edgevx status` and the next start read.
use std::time::Instant;

use anyhow::{Context, Result};
use edgevx_common::maps::{
    DataplaneConfig, FLAG_BYPASS_NETFILTER, FLAG_ENCAP_NO_L2_ETH, FLAG_REQUIRE_JUDGED, FLAG_STRICT_INNER_SOURCE,
};
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use tracing::{info, warn};

use super::Node;
use crate::{
    dataplane::{bpffs, device, fast_path, features::Features, guard, loader, maps::Maps, vtep},
    metrics::startup::{Milestone, Startup},
    netconf::NetConf,
    netfilter,
    peer::OwnNode,
    reconcile::Nag,
    run::{check::Checked, vtep_plan},
    state::{AgentRecord, Record4, StateDir},
    subnet_env,
};

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
    let underlay_mtu = underlay.mtu;
    let plan4 = vtep_plan::prepare::<Ipv4Net>(c, conf, &own, state, others, &underlay)?;
    let plan6 = vtep_plan::prepare::<Ipv6Net>(c, conf, &own, state, others, &underlay)?;
    if let Some(p4) = &plan4 {
        super::mtu::warn_if_capped(conf, underlay_mtu, p4.spec.mtu);
    }
    // the pods' MTU is the IPv4 VTEP's; IPv6-only, the IPv6 VTEP's
    let mtu = match (&plan4, &plan6) {
        (Some(p4), _) => p4.spec.mtu,
        (None, Some(p6)) => p6.spec.mtu,
        (None, None) => crate::run::config::vtep_mtu::<Ipv4Net>(conf, underlay_mtu),
    };
    // restore first: subnet.env before anything else, so the CNI adds pods at
    // once (after a reboot /run is empty); it says only what is decided by now
    subnet_env::write(
        &c.args.subnet_file,
        plan4.as_ref().map(|p| (p.network, p.subnet)),
        plan6.as_ref().map(|p| (p.network, p.subnet)),
        mtu,
        c.args.ip_masq,
    )
    .with_context(|| format!("cannot write {}", c.args.subnet_file.display()))?;
    startup.reached(Milestone::SubnetEnv, Instant::now());
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
    // the firewall's settings, for both families: where the guard cannot
    // refuse a peer's VXLAN off the underlay, a rule does
    let rules = netfilter::Settings {
        vxlan_port: conf.port,
        ip_masq: c.args.ip_masq,
        forward: c.args.iptables_forward_rules,
        vxlan_only_on: (!guard::checks_iface(&mut ebpf)?).then(|| c.iface.clone()),
    };

    let vtep_index = match &plan4 {
        Some(p) => {
            let index = vtep::ensure_vtep(handle, &p.spec).await?;
            vtep::ensure_address(handle, index, p.subnet, p.network).await?;
            startup.reached(Milestone::VtepUp, Instant::now());
            Some(index)
        }
        None => {
            vtep_plan::remove_leftovers::<Ipv4Net>(handle, conf.vni).await?;
            None
        }
    };

    let mut maps = Maps::open(&pins)?;
    let bypass = c.args.bypass_netfilter;
    // a kernel without the flag (before 5.13) is asked again without it, per packet
    let legacy_encap = c.args.legacy_encap;
    if legacy_encap && plan4.is_some() {
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
    // the pods learned by an earlier run may sit on a bridge our program is
    // not attached to yet; they come back at the first learning pass
    maps.sync_local_pods(&Default::default())?;
    if plan6.is_none() {
        vtep_plan::remove_leftovers::<Ipv6Net>(handle, conf.vni).await?;
    }
    maps.set_config(&DataplaneConfig {
        vni: conf.vni,
        // all zero in an IPv6-only network: no IPv4 VXLAN is ours, decap refuses every one
        local_ip: plan4.as_ref().map_or([0; 4], |p| p.spec.local.octets()),
        vtep_mac: plan4.as_ref().map_or([0; 6], |p| p.spec.mac.0),
        port: conf.port,
        flags: if bypass { FLAG_BYPASS_NETFILTER } else { 0 }
            | if c.args.strict_inner_source { FLAG_STRICT_INNER_SOURCE } else { 0 }
            | if legacy_encap { FLAG_ENCAP_NO_L2_ETH } else { 0 }
            // this decap marks what it judged: the VTEP guard may drop the rest
            | FLAG_REQUIRE_JUDGED,
        vtep_ifindex: vtep_index.unwrap_or(0),
        underlay_ifindex: c.underlay.index,
        // all zero: IPv6 off, IPv6 VXLAN is not judged
        public_ip6: plan6.as_ref().map_or([0; 16], |p| p.spec.local.octets()),
    })?;
    // the fast path is optional: whatever fails there leaves it off and says why
    let (fast_path, fast_path_tasks) = match fast_path::state(c.args.fast_path, &features.conntrack) {
        Ok(()) if plan4.is_none() => (Err("off: no IPv4 overlay".to_string()), None),
        state => crate::run::fast_path::start(&pins, state, c.args.fast_path_test_ignore_liberal),
    };
    match &fast_path {
        Ok(()) => info!("fast path on: established plain flows from peers' pods skip the host stack"),
        Err(why) => info!(state = %why, "fast path off"),
    }
    // only now that the programs judge IPv6 VXLAN: the device's socket
    let v6 = match plan6 {
        Some(p) => {
            let v6 = crate::run::node6::bring_up6(p, &rules, handle).await?;
            // IPv6-only: this is the VTEP (dual-stack: flannel.<VNI> was first)
            startup.reached(Milestone::VtepUp, Instant::now());
            Some(v6)
        }
        None => None,
    };

    let firewall = match &plan4 {
        Some(p) => {
            // always: the broadcast and multicast VXLAN guard is in the rule set whatever the flags
            let firewall = netfilter::Firewall::new::<Ipv4Net>()?;
            firewall
                .apply(&netfilter::plan(conf.network, p.subnet, &rules))
                .context("cannot install the firewall rules")?;
            Some(firewall)
        }
        None => None,
    };

    let v4 = plan4.map(|p| Record4 {
        vtep_device: p.spec.name,
        vtep_mac: p.spec.mac,
        public_ip: p.spec.local,
        subnet: p.subnet,
        network: conf.network,
    });
    let record = AgentRecord {
        node: c.node.clone(),
        iface: c.iface.clone(),
        v4,
        vni: conf.vni,
        port: conf.port,
        mtu,
        bypass_netfilter: bypass,
        fast_path: match &fast_path {
            Ok(()) => "on".to_string(),
            Err(why) => why.clone(),
        },
        ip_masq: c.args.ip_masq,
        attach: match c.args.tc_attach.as_str() {
            "tcx" => loader::AttachMode::Tcx,
            "clsact" => loader::AttachMode::Clsact,
            _ => loader::AttachMode::for_kernel(&features),
        },
        pod_bridge: c.args.pod_bridge.clone(),
        subnet_file: c.args.subnet_file.clone(),
        pid: std::process::id(),
        v6: v6.as_ref().map(|s| s.record.clone()),
        xdp_judge: c.args.xdp_judge,
    };
    // best effort (records.rs): a full or read-only state dir never stops the bring-up
    state.save_agent(&record);
    if let Some(r) = &record.v4 {
        info!(device = %r.vtep_device, mac = %r.vtep_mac, public_ip = %r.public_ip, subnet = %r.subnet, mtu,
            bypass_netfilter = bypass, ip_masq = c.args.ip_masq, "VTEP ready");
    }
    Ok(Node {
        handle: handle.clone(),
        vtep_index,
        underlay_index: c.underlay.index,
        own,
        record,
        pending: Some(ebpf),
        _fast_path: fast_path_tasks,
        loaded: None,
        bridge: None,
        firewall,
        rules,
        pins,
        accepted: Vec::new(),
        peers_saved: false,
        known: Default::default(),
        off_underlay_seen: maps.counter(edgevx_common::counters::Counter::DropVxlanOffUnderlay).ok().flatten(),
        maps,
        v6,
        fill: None,
        nag: Nag::default(),
        own_addrs: Default::default(),
        first_peer_at: None,
    })
}
