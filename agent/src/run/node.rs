//! The dataplane of a running agent: brought up once, then kept equal to
//! the desired view (peers, local pods, own address).
use std::{borrow::Cow, collections::HashSet, net::Ipv4Addr, time::Instant};

use ipnet::Ipv4Net;

use anyhow::{Context, Result};
use aya::programs::TcAttachType;
use edgevx_common::maps::{
    DataplaneConfig, FLAG_BYPASS_NETFILTER, FLAG_ENCAP_NO_L2_ETH, FLAG_STRICT_INNER_SOURCE, LocalPod,
};
use rtnetlink::Handle;
use tracing::{error, info, warn};

use super::{check::Checked, warned::Warned};
use crate::{
    dataplane::{bpffs, device, features::Features, loader, local_pods, maps::Maps, own_addrs, peers},
    metrics::startup::{Milestone, Startup},
    netconf::NetConf,
    netfilter,
    peer::{ClusterView, OwnNode, Peer},
    reconcile::{self, CAPACITY_FILE, Dataplane, Fill, Nag, Say},
    source::{LocalVtep, LocalVtepV4},
    state::{AgentRecord, Record4, StateDir},
    subnet_env, vtep_mac,
};

/// The dataplane once it is up.
pub(super) struct Node {
    /// The loaded programs until they are attached: only after the maps
    /// hold every peer, so taking over from flanneld (or from an older
    /// edgevx) never sends a packet to an empty table.
    pub(super) pending: Option<aya::Ebpf>,
    /// The loaded programs once attached: the bridge program is attached
    /// later, whenever the pod bridge (re)appears.
    pub(super) loaded: Option<aya::Ebpf>,
    /// The pod bridge's ifindex while our program is attached to it.
    pub(super) bridge: Option<u32>,
    /// The IPv4 firewall chains (`None` in an IPv6-only network).
    pub(super) firewall: Option<netfilter::Firewall>,
    pub(super) forward_rules: bool,
    pub(super) pins: bpffs::PinDir,
    pub(super) handle: Handle,
    pub(super) maps: Maps,
    /// `flannel.<VNI>`'s ifindex (`None` in an IPv6-only network).
    pub(super) vtep_index: Option<u32>,
    pub(super) underlay_index: u32,
    pub(super) own: OwnNode,
    pub(super) record: AgentRecord,
    /// The peers the last pass chose (for the metrics and the peer list).
    pub(super) accepted: Vec<Peer>,
    /// What the last pass left in the kernel, when every write of it went
    /// through. A new view is diffed against it, so an edit costs no read
    /// back of 10,000 map entries; a resync, a route event or a failed write
    /// drops it, and the next pass reads the kernel again.
    pub(super) observed: Option<reconcile::Contents>,
    /// Which peers are on-link, read with `observed` and dropped with it
    /// (DirectRouting only).
    on_link: Option<reconcile::OnLink>,
    /// `drop_vxlan_off_underlay` when last looked at (`warn_off_underlay`).
    pub(super) off_underlay_seen: Option<u64>,
    /// `flannel-v6.<VNI>` when IPv6 is on.
    pub(super) v6: Option<super::node6::Side6>,
    /// The capacity and what the last pass left out, as last saved for
    /// `edgevx status` (`None` until the first pass saves it).
    fill: Option<Fill>,
    /// When a view beyond the capacity is logged again.
    nag: Nag,
    /// This node's addresses, read with the kernel's contents (no peer may claim one).
    own_addrs: own_addrs::OwnAddrs,
    /// When the first peer's entries went in (or a pass found them in already).
    pub(super) first_peer_at: Option<Instant>,
}

pub(super) async fn bring_up(
    c: &Checked,
    conf: &NetConf,
    own: OwnNode,
    state: &StateDir,
    handle: &Handle,
    startup: &Startup,
) -> Result<Node> {
    // the underlay now: its MTU (or IPv6 address) may have changed since the start-up checks
    let underlay = device::underlay(handle, &c.iface).await.unwrap_or_else(|_| c.underlay.clone());
    let underlay_mtu = underlay.mtu;
    let plan4 = prepare4(c, conf, &own, state, underlay_mtu)?;
    let plan6 = super::node6::prepare6(c, conf, &own, state, &underlay)?;
    let mtu = super::config::vtep_mtu(conf, underlay_mtu);
    if plan4.is_some() {
        super::mtu::warn_if_capped(conf, underlay_mtu, mtu);
    }
    // IPv6-only: the pods' MTU is the IPv6 VTEP's
    let mtu = match (&plan4, &plan6) {
        (None, Some(p6)) => p6.mtu(),
        _ => mtu,
    };
    // restore first: subnet.env before anything else, so the CNI adds pods at
    // once (after a reboot /run is empty); it says only what is decided by now
    subnet_env::write(
        &c.args.subnet_file,
        plan4.as_ref().map(|p| (conf.network, p.subnet)),
        plan6.as_ref().map(|p| p.subnet_env()),
        mtu,
        c.args.ip_masq,
    )
    .with_context(|| format!("cannot write {}", c.args.subnet_file.display()))?;
    startup.reached(Milestone::SubnetEnv, Instant::now());
    bpffs::ensure_dir_on_bpffs(&c.args.paths.bpffs)?;
    let pins = bpffs::PinDir::new(&c.args.paths.bpffs);
    let features = Features::probe();
    info!(
        check_mtu = features.check_mtu,
        atomic_fetch = features.atomic_fetch,
        tcx = features.tcx,
        "kernel features probed"
    );
    let ebpf = loader::load(&pins, &features)?;

    let vtep_index = match &plan4 {
        Some(p) => {
            let index = device::ensure_vtep(handle, &p.spec).await?;
            device::ensure_address(handle, index, p.subnet, conf.network).await?;
            startup.reached(Milestone::VtepUp, Instant::now());
            Some(index)
        }
        None => {
            remove_leftovers4(handle, conf.vni).await?;
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
    if bypass {
        if let Some(found) = netfilter::kube_proxy_present() {
            warn!(
                %found,
                "--bypass-netfilter is on, but kube-proxy's packet rules are on this node: replies to Service \
                 traffic from other nodes lose their reverse NAT, and conntrack sees only one direction of pod \
                 flows (kube-proxy's ctstate INVALID drop then drops them). Turn it off unless pod traffic has \
                 no packet-level NAT or policy"
            );
        }
    }
    // the pods learned by an earlier run may sit on a bridge our program is
    // not attached to yet; they come back at the first learning pass
    maps.sync_local_pods(&Default::default())?;
    if plan6.is_none() {
        super::node6::remove_leftovers(handle, conf.vni).await?;
    }
    maps.set_config(&DataplaneConfig {
        vni: conf.vni,
        // all zero in an IPv6-only network: no IPv4 VXLAN is ours, decap refuses every one
        local_ip: plan4.as_ref().map_or([0; 4], |p| p.spec.local.octets()),
        vtep_mac: plan4.as_ref().map_or([0; 6], |p| p.spec.mac.0),
        port: conf.port,
        flags: if bypass { FLAG_BYPASS_NETFILTER } else { 0 }
            | if c.args.strict_inner_source { FLAG_STRICT_INNER_SOURCE } else { 0 }
            | if legacy_encap { FLAG_ENCAP_NO_L2_ETH } else { 0 },
        vtep_ifindex: vtep_index.unwrap_or(0),
        underlay_ifindex: c.underlay.index,
        // all zero: IPv6 off, IPv6 VXLAN is not judged
        public_ip6: plan6.as_ref().map_or([0; 16], |p| p.public_ip().octets()),
    })?;
    // only now that the programs judge IPv6 VXLAN: the device's socket
    let v6 = match plan6 {
        Some(p) => {
            let v6 = super::node6::bring_up6(c, conf, p, handle).await?;
            // IPv6-only: this is the VTEP (dual-stack: flannel.<VNI> was first)
            startup.reached(Milestone::VtepUp, Instant::now());
            Some(v6)
        }
        None => None,
    };

    let forward_rules = c.args.iptables_forward_rules;
    let firewall = match &plan4 {
        Some(p) => {
            // always: the broadcast and multicast VXLAN guard is in the rule set whatever the flags
            let firewall = netfilter::Firewall::new::<Ipv4Net>()?;
            firewall
                .apply(&netfilter::plan(conf.network, p.subnet, conf.port, c.args.ip_masq, forward_rules))
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
    };
    state.save_agent(&record)?;
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
        loaded: None,
        bridge: None,
        firewall,
        forward_rules,
        pins,
        accepted: Vec::new(),
        observed: None,
        on_link: None,
        off_underlay_seen: maps.counter(edgevx_common::counters::Counter::DropVxlanOffUnderlay).ok(),
        maps,
        v6,
        fill: None,
        nag: Nag::default(),
        own_addrs: Default::default(),
        first_peer_at: None,
    })
}

/// `selected` cut to `capacity` (see [`reconcile::fit`]), and the figures.
fn fit(selected: Vec<Peer>, capacity: usize, established: impl Fn(&Peer) -> bool) -> (Vec<Peer>, Fill) {
    let wanted = selected.len();
    let (kept, left_out) = reconcile::fit(selected, capacity, established);
    (kept, Fill { capacity, wanted, not_programmed: left_out.len() })
}

/// subnet.env as `r` says: both families' lines, or one family's.
pub(super) fn write_subnet_env(r: &AgentRecord) -> Result<()> {
    let v4 = r.v4.as_ref().map(|v4| (v4.network, v4.subnet));
    let v6 = r.v6.as_ref().map(|v6| (v6.network, v6.subnet));
    subnet_env::write(&r.subnet_file, v4, v6, r.mtu, r.ip_masq)
        .with_context(|| format!("cannot write {}", r.subnet_file.display()))
}

/// What `flannel.<VNI>` will be (`None` in an IPv6-only network). Chooses
/// and saves its MAC.
struct Plan4 {
    spec: device::VtepSpec,
    subnet: Ipv4Net,
}

fn prepare4(c: &Checked, conf: &NetConf, own: &OwnNode, state: &StateDir, underlay_mtu: u32) -> Result<Option<Plan4>> {
    if !conf.ipv4 {
        return Ok(None);
    }
    let subnet = own.subnet.context("this node has no IPv4 pod CIDR (spec.podCIDRs, or the etcd lease)")?;
    let (mac, _) = vtep_mac::choose(own.published_mac, state)?;
    let public_ip: Ipv4Addr =
        super::config::public_ip(c.args.public_ip, own.node_public_ip, &c.underlay).context("no public IP")?;
    let spec = device::VtepSpec {
        name: device::vtep_name(conf.vni),
        vni: conf.vni,
        port: conf.port,
        local: public_ip,
        underlay_index: c.underlay.index,
        mac,
        mtu: super::config::vtep_mtu(conf, underlay_mtu),
    };
    Ok(Some(Plan4 { spec, subnet }))
}

/// In an IPv6-only network: a `flannel.<VNI>` left by an earlier run (ours
/// or flanneld's) would take IPv4 VXLAN and route the IPv4 pod network
/// that nothing programs, so it goes, and our iptables chains with it.
async fn remove_leftovers4(handle: &Handle, vni: u32) -> Result<()> {
    super::node6::remove_family(
        handle,
        &device::vtep_name(vni),
        netfilter::Firewall::new::<Ipv4Net>(),
        "IPv4",
        "iptables",
    )
    .await
}

impl Node {
    /// Attaches (or swaps in) the programs, then drops what flanneld left on
    /// the VTEP: per-peer arp and fdb entries, now unused.
    pub(super) async fn attach(&mut self) -> Result<()> {
        let Some(mut ebpf) = self.pending.take() else { return Ok(()) };
        let (mode, pins, r) = (self.record.attach, &self.pins, &self.record);
        if let Some(v4) = &r.v4 {
            loader::attach_as(mode, &mut ebpf, pins, loader::ENCAP, &v4.vtep_device, TcAttachType::Egress)?;
        }
        // IPv6-only too: it judges the IPv6 VXLAN flannel-v6.<VNI> takes in
        loader::attach_as(mode, &mut ebpf, pins, loader::DECAP, &r.iface, TcAttachType::Ingress)?;
        self.loaded = Some(ebpf); // the pinned links (or filters) keep the programs; the pinned maps keep their state
        for old in self.pins.other_versions() {
            loader::retire(&old)?;
        }
        if let Some(index) = self.vtep_index {
            device::set_noarp(&self.handle, index).await?;
            match device::flush_static_neighbours(&self.handle, index).await? {
                0 => {}
                n => info!(entries = n, "removed arp/fdb entries left on the VTEP (adopted from flanneld)"),
            }
        }
        let r = &self.record;
        match &r.v4 {
            Some(v4) => {
                info!(device = %v4.vtep_device, iface = %r.iface, mac = %v4.vtep_mac, public_ip = %v4.public_ip,
                subnet = %v4.subnet, bypass_netfilter = r.bypass_netfilter, attach = r.attach.name(), "dataplane up")
            }
            None => info!(device = r.v6.as_ref().map(|v6| v6.device.as_str()), iface = %r.iface,
                attach = r.attach.name(), "dataplane up (IPv6-only)"),
        }
        Ok(())
    }

    /// Chooses the peers of `view` and brings the IPv4 dataplane in line
    /// with them, starting from what the kernel really holds (the IPv6 half
    /// is [`reconcile6`](Self::reconcile6)'s). Returns whether every write
    /// succeeded (failures are logged and retried on the next pass).
    pub(super) async fn reconcile(
        &mut self,
        view: &ClusterView,
        direct_routing: bool,
        state: &StateDir,
        warned: &mut Warned,
    ) -> bool {
        let t = std::time::Instant::now();
        let fresh = self.observed.is_none();
        if let Some(v6) = self.v6.as_mut().filter(|_| fresh) {
            v6.observed = None; // a resync or a route event reads both back
        }
        // no peer may claim an address of this node (read again with the kernel's contents)
        if fresh || self.own_addrs.is_empty() {
            match own_addrs::read(&self.handle).await {
                Ok(addrs) => self.own_addrs = addrs,
                Err(e) => warn!("cannot read this node's addresses; judging peers by the last read: {e:#}"),
            }
        }
        let claims = reconcile::claiming_ours(&view.peers, &self.own_addrs);
        warned.conflicts(&claims);
        let candidates: Cow<'_, [Peer]> = match claims.is_empty() {
            true => Cow::Borrowed(&view.peers),
            false => {
                let out: HashSet<&str> = claims.iter().map(|r| r.node.as_str()).collect();
                Cow::Owned(view.peers.iter().filter(|p| !out.contains(p.node.as_str())).cloned().collect())
            }
        };
        let chosen = match (self.vtep_index, self.record.v4.as_ref().map(|v4| v4.network)) {
            (Some(vtep_index), Some(network)) => {
                self.reconcile4(&candidates, direct_routing, vtep_index, network, warned).await
            }
            _ => {
                // IPv6-only: the peers are their IPv6 halves
                let (selected, rejected) = reconcile::select(None, self.own.subnet6, &Default::default(), &candidates);
                warned.conflicts(&rejected);
                self.observed = Some(Default::default());
                Some((self.fit6(selected), true))
            }
        };
        let Some(((accepted, fill), mut ok)) = chosen else { return false };
        tracing::debug!(
            peers = accepted.len(),
            not_programmed = fill.not_programmed,
            total_ms = t.elapsed().as_millis() as u64,
            "reconcile pass"
        );
        if accepted != self.accepted {
            // names for `edgevx status` and the hand-over to flanneld; not a
            // record of what is programmed (the maps are)
            if let Err(e) = state.save_peers(accepted.iter()) {
                ok = false;
                error!("cannot save the peer list: {e:#}");
            }
            self.accepted = accepted;
        }
        // after the peer list: a status that shows the new figures shows the new list
        self.report_fill(fill, state);
        ok
    }

    /// The IPv6 half of the pass, for the peers [`reconcile`](Self::reconcile)
    /// chose: `flannel-v6.<VNI>`'s kernel entries and the IPv6 accept map.
    /// Run after the programs are attached, so IPv4 forwarding never waits
    /// for tens of thousands of IPv6 kernel entries. `true` without IPv6.
    pub(super) async fn reconcile6(&mut self, direct_routing: bool) -> bool {
        match &mut self.v6 {
            Some(v6) => {
                let ok = v6
                    .reconcile(&self.handle, &mut self.maps, &self.accepted, direct_routing, self.underlay_index)
                    .await;
                if self.vtep_index.is_none() && !self.accepted.is_empty() {
                    // IPv6-only: the peers are programmed here
                    self.first_peer_at.get_or_insert_with(Instant::now);
                }
                ok
            }
            None => true,
        }
    }

    /// The IPv4 pass: chooses the peers and programs their IPv4 halves;
    /// returns the chosen peers, how they fit in the maps, and whether every
    /// write went through, or `None` when the dataplane could not be read.
    async fn reconcile4(
        &mut self,
        candidates: &[Peer],
        direct_routing: bool,
        vtep_index: u32,
        network: Ipv4Net,
        warned: &mut Warned,
    ) -> Option<((Vec<Peer>, Fill), bool)> {
        let t = std::time::Instant::now();
        let capacity = self.maps.peer_capacity() as usize;
        let mut dp = peers::Programmed {
            maps: &mut self.maps,
            handle: &self.handle,
            vtep_index,
            underlay_index: self.underlay_index,
            network,
        };
        let cached = self.observed.take();
        let fresh = cached.is_none();
        let observed = match cached {
            Some(o) => o,
            None => match dp.observe().await {
                Ok(o) => o,
                Err(e) => {
                    warn!("cannot read back the dataplane: {e:#}");
                    return None;
                }
            },
        };
        let on_link = match (direct_routing, self.on_link.take()) {
            (false, _) => reconcile::OnLink::default(),
            (true, Some(l)) if !fresh => l,
            (true, _) => match dp.on_link().await {
                Ok(l) => l,
                Err(e) => {
                    warn!("cannot read which peers are on-link (DirectRouting): {e:#}");
                    return None;
                }
            },
        };
        let (selected, rejected) = reconcile::select(self.own.subnet, self.own.subnet6, &observed, candidates);
        warned.conflicts(&rejected);
        // beyond the capacity: the peers already in the LPM map stay (as in `select`)
        let established = |p: &Peer| {
            p.v4.is_some_and(|v4| observed.subnets.get(&v4.subnet).is_some_and(|t| t.public_ip == v4.public_ip))
        };
        let (accepted, fill) = fit(selected, capacity, established);
        let want = reconcile::plan(&accepted, network, &on_link);
        let mut changes = reconcile::diff(&want, &observed);
        let held_back = self.pending.is_some() && !(changes.del_routes.is_empty() && changes.del_direct.is_empty());
        if held_back {
            // not attached yet: the routes we would delete (flanneld's, on a
            // takeover) still carry traffic through the kernel's fdb; they go
            // at the first pass after the programs are on
            changes.del_routes.clear();
            changes.del_direct.clear();
        }
        let planned = t.elapsed();
        let outcome = reconcile::apply(&mut dp, &changes).await;
        // every write went through: the kernel now holds `want`, until the
        // next event or resync says otherwise
        self.observed = (outcome.ok() && !held_back).then_some(want);
        self.on_link = direct_routing.then_some(on_link);
        tracing::debug!(
            changes = changes.len(),
            observe_and_plan_ms = planned.as_millis() as u64,
            "IPv4 reconcile pass"
        );
        if !accepted.is_empty() {
            // the first write of the first pass that had peers; none written: they were in already
            self.first_peer_at.get_or_insert(outcome.first_at.unwrap_or_else(Instant::now));
        }
        Some(((accepted, fill), outcome.ok()))
    }

    /// IPv6-only: the chosen peers cut to what the maps hold, those the
    /// IPv6 accept map already has first.
    fn fit6(&self, selected: Vec<Peer>) -> (Vec<Peer>, Fill) {
        let capacity = self.maps.peer_capacity() as usize;
        let held = match selected.len() > capacity {
            // only read when it decides something; unreadable, the name alone decides
            true => self.maps.accept6_entries().unwrap_or_default(),
            false => Default::default(),
        };
        fit(selected, capacity, |p| p.v6.is_some_and(|v6| held.contains_key(&v6.public_ip)))
    }

    /// Logs a view beyond the capacity (one line, repeated with backoff,
    /// and one when it ends) and saves the figures for `edgevx status`
    /// when they change.
    fn report_fill(&mut self, fill: Fill, state: &StateDir) {
        let Fill { capacity, wanted, not_programmed } = fill;
        match self.nag.pass(std::time::Instant::now(), fill.over()) {
            Say::Over => error!(
                capacity,
                peers = wanted,
                not_programmed,
                "{not_programmed} of the {wanted} peers in the view are not programmed: the BPF maps hold \
                 {capacity} peers (edgevx's limit). The peers already programmed stay, then the first by node \
                 name; the others get no tunnel and their VXLAN is dropped. Fix: fewer nodes in this flannel \
                 network (the limit is fixed when edgevx is built). Repeated with backoff while it lasts"
            ),
            Say::Cleared => info!(capacity, peers = wanted, "every peer in the view fits in the maps again"),
            Say::Nothing => {}
        }
        if self.fill != Some(fill) {
            match state.save_json(CAPACITY_FILE, &fill) {
                Ok(()) => self.fill = Some(fill),
                Err(e) => warn!("cannot save {CAPACITY_FILE} (for edgevx status), retrying at the next pass: {e:#}"),
            }
        }
    }

    /// What this node publishes about itself (annotations, etcd lease).
    pub(super) fn local_vtep(&self) -> LocalVtep {
        let r = &self.record;
        LocalVtep {
            vni: r.vni,
            v4: r.v4.as_ref().map(|v4| LocalVtepV4 { mac: v4.vtep_mac, public_ip: v4.public_ip, subnet: v4.subnet }),
            v6: self.v6.as_ref().map(|s| s.local()),
        }
    }

    /// Whether the VTEP devices and the attached programs are still there:
    /// `Ok(false)` when the kernel says one is gone. An error means the
    /// kernel could not be asked (the agent out of descriptors or memory):
    /// that says nothing about the dataplane, which stays as it is.
    pub(super) async fn intact(&self) -> Result<bool> {
        if self.pending.is_some() {
            return Ok(true); // not attached yet
        }
        let (mode, pins, r) = (self.record.attach, &self.pins, &self.record);
        if let (Some(v4), Some(index)) = (&r.v4, self.vtep_index) {
            let vtep = device::link_by_name(&self.handle, &v4.vtep_device).await?;
            if vtep.is_none_or(|l| l.header.index != index)
                || !loader::attached_as(mode, &self.handle, pins, loader::ENCAP, &v4.vtep_device, TcAttachType::Egress)
                    .await?
            {
                return Ok(false);
            }
        }
        if let Some(v6) = &self.v6 {
            if !v6.intact(&self.handle).await? {
                return Ok(false);
            }
        }
        loader::attached_as(mode, &self.handle, pins, loader::DECAP, &r.iface, TcAttachType::Ingress).await
    }

    /// Attaches the bridge program to the pod bridge if it is there and not
    /// attached yet; returns the bridge's ifindex while it is attached.
    async fn ensure_bridge_program(&mut self) -> Option<u32> {
        let index = match device::ifindex(&self.record.pod_bridge) {
            Ok(Some(index)) => index,
            Ok(None) => {
                self.bridge = None;
                return None;
            }
            // cannot be asked (out of descriptors): what was attached stays attached
            Err(e) => {
                warn!(bridge = %self.record.pod_bridge, "cannot look up the pod bridge, keeping what is attached: {e}");
                return self.bridge;
            }
        };
        let mode = self.record.attach;
        let on = |attached: Result<bool>| match attached {
            Ok(on) => on,
            Err(e) => {
                warn!(bridge = %self.record.pod_bridge, "cannot tell whether the bridge program is attached, keeping it: {e:#}");
                true
            }
        };
        if self.bridge == Some(index)
            && on(loader::attached_as(
                mode,
                &self.handle,
                &self.pins,
                loader::BRIDGE,
                &self.record.pod_bridge,
                TcAttachType::Egress,
            )
            .await)
        {
            return Some(index);
        }
        let ebpf = self.loaded.as_mut()?;
        match loader::attach_as(mode, ebpf, &self.pins, loader::BRIDGE, &self.record.pod_bridge, TcAttachType::Egress) {
            Ok(()) => {
                self.bridge = Some(index);
                Some(index)
            }
            Err(e) => {
                warn!(bridge = %self.record.pod_bridge, "cannot attach to the pod bridge: {e:#}");
                self.bridge = None;
                None
            }
        }
    }

    /// Learns the local pods from the kernel and puts in the map those the
    /// programs may deliver to. In the default mode that is a pod behind a
    /// bridge our program is attached to (so the decapsulated GSO packets
    /// reach its port whole), or a pod on a routed veth of its own.
    /// IPv6-only: nothing, the kernel delivers IPv6.
    pub(super) async fn learn_pods(&mut self) {
        let Some(subnet) = self.own.subnet.filter(|_| self.pending.is_none() && self.vtep_index.is_some()) else {
            return; // not attached yet, or no IPv4
        };
        let bridge = self.ensure_bridge_program().await;
        let bypass = self.record.bypass_netfilter;
        match local_pods::discover(&self.handle, subnet).await {
            Ok(learned) => {
                let pods: std::collections::BTreeMap<[u8; 4], LocalPod> = learned
                    .into_iter()
                    .filter(|(_, l)| bypass || l.bridge.is_none() || l.bridge == bridge)
                    .map(|(ip, l)| (ip, l.pod))
                    .collect();
                if let Err(e) = self.maps.sync_local_pods(&pods) {
                    warn!("cannot update local pods: {e:#}");
                }
            }
            Err(e) => warn!("cannot learn local pods: {e:#}"),
        }
    }

    /// Re-asserts our firewall chains (someone may have flushed them).
    pub(super) fn enforce_rules(&self) {
        let r = &self.record;
        if let (Some(fw), Some(v4)) = (&self.firewall, &r.v4) {
            let rules = netfilter::plan(v4.network, v4.subnet, r.port, r.ip_masq, self.forward_rules);
            if let Err(e) = fw.apply(&rules) {
                warn!("cannot restore the firewall rules: {e:#}");
            }
        }
        if let Some(v6) = &self.v6 {
            v6.enforce_rules(r.port, r.ip_masq, self.forward_rules);
        }
    }
}

pub(super) async fn readdress(n: &mut Node, own: &OwnNode, state: &StateDir) -> Result<()> {
    if let (Some(index), Some(v4), Some(subnet)) = (n.vtep_index, n.record.v4.as_mut(), own.subnet) {
        device::ensure_address(&n.handle, index, subnet, v4.network).await?;
        if let Some(fw) = &n.firewall {
            let rules = netfilter::plan(v4.network, subnet, n.record.port, n.record.ip_masq, n.forward_rules);
            fw.apply(&rules).context("cannot update the firewall rules")?;
        }
        v4.subnet = subnet;
    }
    if let (Some(v6), Some(subnet6)) = (&mut n.v6, own.subnet6) {
        if v6.record.subnet != subnet6 {
            crate::dataplane::vtep6::ensure_address6(&n.handle, v6.index, subnet6).await?;
            v6.record.subnet = subnet6;
            n.record.v6 = Some(v6.record.clone());
        }
    }
    write_subnet_env(&n.record)?;
    n.own = own.clone();
    state.save_agent(&n.record)
}
