//! `edgevx cleanup`: undo everything `edgevx run` did on this host, or,
//! with `--keep-vtep`, hand the node back to flanneld without a gap: the
//! kernel gets flanneld's per-peer entries first, then the programs go,
//! and `flannel.<VNI>` stays for flanneld to adopt with the same MAC.
use std::{fs, path::Path};

use anyhow::{Context, Result};
use aya::programs::TcAttachType::{self, Egress, Ingress};
use rtnetlink::Handle;
use tracing::info;

use crate::{
    UsageError,
    cli::CleanupArgs,
    dataplane::{
        bpffs::{self, PinDir},
        clsact, device, loader,
    },
    gone,
    state::{AGENT_FILE, AgentRecord, MAC_FILE, PEERS_FILE, StateDir},
};

mod direct_routes;
mod hand_over;

use direct_routes::{ends, remove_direct_routes};
use hand_over::hand_over;

pub async fn run(args: CleanupArgs) -> Result<()> {
    // an agent here would rebuild what cleanup removes: the locks it holds,
    // on this network namespace and on its state dir, say whether one runs
    let _netns =
        crate::run::netns_lock::acquire("cleanup", crate::run::netns_lock::Role::Cleanup, &args.paths.state_dir)?;
    let _lock = crate::run::lock::acquire_existing(&args.paths.state_dir)?;
    let state = StateDir(args.paths.state_dir.clone());
    let rec = state.load_agent().unwrap_or(None);
    let pins = PinDir::new(&args.paths.bpffs);
    // a newer release's dataplane is that release's to remove (exit 2, naming it)
    bpffs::no_newer_version(&args.paths.bpffs).map_err(|e| UsageError(e.to_string()))?;
    let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
    tokio::spawn(conn);
    // before anything is detached: from here on the kernel could forward alone
    let kept_vtep = hand_over_if_asked(&handle, rec.as_ref(), &state, args.keep_vtep).await?;
    detach_programs(&pins)?;
    // the clsact filters of the fallback, on the interfaces the last run used
    if let Some(rec) = &rec {
        let ifaces = FallbackIfaces::of(rec);
        remove_clsact_filters(&handle, &ifaces).await?;
        remove_clsact_qdiscs(&handle, &ifaces, kept_vtep.is_some()).await?;
    }
    remove_map_pins(&pins)?;
    match (&rec, kept_vtep) {
        (Some(rec), Some(_)) => say_kept(rec),
        (Some(_), None) if args.keep_vtep => {}
        (Some(rec), None) => {
            delete_vteps(&handle, rec).await?;
            remove_peer_routes(&handle, rec, &state).await?;
            remove_subnet_file(rec)?;
        }
        (None, _) => {}
    }
    remove_firewall()?;
    remove_state_files(&state, args.purge_mac);
    nothing_pinned(&pins, &args.paths.bpffs)
}

/// With `--keep-vtep`, hands the node over to flanneld ([`hand_over`]) and
/// returns the VTEP's index, if it exists; without an agent record there is
/// nothing to hand over, and that is a usage error (exit 2) before anything
/// changes. Without `--keep-vtep`, `None`.
async fn hand_over_if_asked(
    handle: &Handle,
    rec: Option<&AgentRecord>,
    state: &StateDir,
    keep_vtep: bool,
) -> Result<Option<u32>> {
    match (rec, keep_vtep) {
        (Some(rec), true) => hand_over(handle, rec, state).await,
        (None, true) => {
            // detaching without handing over could leave the kernel nothing to forward with
            Err(UsageError(format!(
                "--keep-vtep: --state-dir {} holds no agent record ({AGENT_FILE}), so there is nothing to hand \
                 over; nothing was changed",
                state.0.display()
            ))
            .into())
        }
        (_, false) => Ok(None),
    }
}

/// Detaches every pinned program (`bpftool link detach`) and removes its pin.
fn detach_programs(pins: &PinDir) -> Result<()> {
    // the IPv6 VTEP's guard first too, before decap stops marking; the XDP
    // judge with the TC programs (it only drops early what decap drops)
    let xdp = crate::dataplane::xdp::XDP_JUDGE;
    for name in [loader::VTEP_GUARD6].into_iter().chain(loader::PROGRAMS).chain([crate::dataplane::guard::GUARD, xdp]) {
        if loader::detach_pinned(pins, name)? {
            info!(program = name, "detached");
        }
        bpffs::remove_pin(&pins.prog(name))?;
    }
    Ok(())
}

/// The interfaces the last run's clsact fallback used, from its record; an
/// empty name where that run had none.
struct FallbackIfaces<'a> {
    vtep: &'a str,
    vtep6: &'a str,
    underlay: &'a str,
    pod_bridge: &'a str,
}

impl<'a> FallbackIfaces<'a> {
    /// The interfaces of the run that wrote `rec`.
    fn of(rec: &'a AgentRecord) -> Self {
        FallbackIfaces {
            vtep: rec.v4.as_ref().map_or("", |v4| v4.vtep_device.as_str()),
            vtep6: rec.v6.as_ref().map_or("", |v6| v6.device.as_str()),
            underlay: rec.iface.as_str(),
            pod_bridge: rec.pod_bridge.as_str(),
        }
    }
}

/// Removes the fallback's clsact filters (`tc filter del`), each program
/// from the interface and direction it was attached to.
async fn remove_clsact_filters(handle: &Handle, ifaces: &FallbackIfaces<'_>) -> Result<()> {
    for (name, iface, kind) in [
        // first, as in PROGRAMS: before decap stops marking what it judged
        (loader::VTEP_GUARD, ifaces.vtep, Ingress),
        (loader::VTEP_GUARD, ifaces.vtep6, Ingress),
        (loader::ENCAP, ifaces.vtep, Egress),
        (loader::DECAP, ifaces.underlay, Ingress),
        (loader::BRIDGE, ifaces.pod_bridge, Egress),
        (loader::POD_GUARD, ifaces.pod_bridge, Ingress),
    ] {
        if !iface.is_empty() {
            remove_clsact_filter(handle, name, iface, kind).await?;
        }
    }
    Ok(())
}

/// Removes `name`'s clsact filter from `iface`, then reads the hook back
/// and fails, naming the `tc` command that removes it, if it is still there.
async fn remove_clsact_filter(handle: &Handle, name: &str, iface: &str, kind: TcAttachType) -> Result<()> {
    if clsact::detach(name, iface, kind)? {
        info!(program = name, iface, "removed the clsact filter");
    }
    // the proof, read back from the kernel: a filter left at our
    // priority and handle would go on running (the VTEP guard would
    // drop every frame once decap no longer marks them)
    if clsact::place(handle, iface, kind).await? != crate::dataplane::order::Place::Absent {
        let dir = if matches!(kind, Ingress) { "ingress" } else { "egress" };
        let (pref, handle) = (clsact::PRIORITY, u32::from(clsact::HANDLE));
        anyhow::bail!(
            "cleanup could not remove {name}'s clsact filter from {iface} ({kind:?}): `tc filter show dev \
             {iface} {dir}` shows it at pref {pref} handle {handle:#x}; remove it with `tc filter del dev \
             {iface} {dir} pref {pref}`"
        );
    }
    Ok(())
}

/// Removes the clsact qdiscs the fallback added, once nothing else uses
/// them (`tc qdisc del dev IFACE clsact`); after a hand-over, keeps them.
async fn remove_clsact_qdiscs(handle: &Handle, ifaces: &FallbackIfaces<'_>, handed_over: bool) -> Result<()> {
    // not on a hand-over: deleting a qdisc of a device that is up stops its
    // transmit queues for a moment (the kernel's qdisc_graft runs
    // dev_deactivate, for a clsact qdisc too), and what the kernel sends
    // then is dropped, where the hand-over must lose nothing. An empty
    // clsact qdisc does nothing.
    let mut all = vec![ifaces.vtep, ifaces.vtep6, ifaces.underlay, ifaces.pod_bridge];
    all.dedup();
    for iface in all.into_iter().filter(|i| !i.is_empty()) {
        if handed_over {
            if clsact::present(handle, iface).await? {
                info!(
                    iface,
                    "kept the clsact qdisc, our filters gone: deleting it now would drop packets; `tc qdisc del dev {iface} clsact` removes it"
                );
            }
        } else if clsact::remove_if_empty(handle, iface).await? {
            info!(iface, "removed the clsact qdisc");
        }
    }
    Ok(())
}

/// Removes the maps' pins, the directories left empty, and an older
/// release's pins.
fn remove_map_pins(pins: &PinDir) -> Result<()> {
    for name in edgevx_common::maps::ALL {
        bpffs::remove_pin(&pins.map(name))?;
    }
    pins.remove_empty_dirs();
    // an older release's pins, left by an upgrade that did not get to retire them
    for old in pins.other_versions() {
        loader::retire(&old)?;
    }
    Ok(())
}

/// Says what a hand-over left for flanneld: the VTEPs and subnet.env.
fn say_kept(rec: &AgentRecord) {
    let devices = rec.v4.iter().map(|v4| v4.vtep_device.as_str()).chain(rec.v6.iter().map(|v6| v6.device.as_str()));
    info!(devices = ?devices.collect::<Vec<_>>(), subnet_file = %rec.subnet_file.display(),
        "kept, with its MAC, address, routes and subnet.env, for flanneld to adopt");
}

/// Deletes the VTEP devices (`ip link del flannel.1`); their routes go with them.
async fn delete_vteps(handle: &Handle, rec: &AgentRecord) -> Result<()> {
    for name in rec.v4.iter().map(|v4| &v4.vtep_device).chain(rec.v6.as_ref().map(|v6| &v6.device)) {
        if device::delete_link(handle, name).await? {
            info!(device = %name, "deleted (its routes went with it)");
        }
    }
    Ok(())
}

/// Removes our DirectRouting routes of both families, for the peers the
/// agent programmed.
async fn remove_peer_routes(handle: &Handle, rec: &AgentRecord, state: &StateDir) -> Result<()> {
    let peers = state.load_peers().with_context(|| {
        format!("cannot read the peers the agent programmed (in {}); their direct routes stay", state.0.display())
    })?;
    let mut removed = 0;
    if let Some(v4) = &rec.v4 {
        removed += remove_direct_routes(handle, &rec.iface, v4.network, &ends(&peers)).await?;
    }
    if let Some(v6) = &rec.v6 {
        removed += remove_direct_routes(handle, &rec.iface, v6.network, &ends(&peers)).await?;
    }
    if removed > 0 {
        info!(routes = removed, iface = %rec.iface, "removed the DirectRouting routes");
    }
    Ok(())
}

/// Removes the subnet.env the agent wrote, if it is still there.
fn remove_subnet_file(rec: &AgentRecord) -> Result<()> {
    let removed = gone::absent(fs::remove_file(&rec.subnet_file))
        .with_context(|| format!("cannot remove {}", rec.subnet_file.display()))?;
    if removed.is_some() {
        info!(path = %rec.subnet_file.display(), "removed");
    }
    Ok(())
}

/// Removes our iptables and ip6tables chains, whatever flags the last run
/// had; a host without one of them has no rules of it to remove.
fn remove_firewall() -> Result<()> {
    match crate::netfilter::Firewall::new::<ipnet::Ipv4Net>() {
        Ok(fw) => {
            if fw.remove_all().context("cannot remove the firewall rules")? {
                info!("removed edgevx's iptables chains");
            }
        }
        Err(e) => info!("no iptables here, so no firewall rules to remove: {e:#}"),
    }
    // whatever the record says (a dual-stack run may have left them without one)
    match crate::netfilter::Firewall::new::<ipnet::Ipv6Net>() {
        Ok(fw) => {
            if fw.remove_all().context("cannot remove the IPv6 firewall rules")? {
                info!("removed edgevx's ip6tables chains");
            }
        }
        Err(e) => info!("no ip6tables here, so no IPv6 firewall rules to remove: {e:#}"),
    }
    Ok(())
}

/// Removes the agent's files from the state dir; the VTEP MACs only with
/// `--purge-mac`.
fn remove_state_files(state: &StateDir, purge_mac: bool) {
    let mut files = vec![AGENT_FILE, PEERS_FILE, crate::cache::VIEW_FILE];
    if purge_mac {
        files.extend([MAC_FILE, crate::state::MAC6_FILE]);
    }
    for f in files {
        let _ = fs::remove_file(state.path(f));
    }
    if !purge_mac && state.path(MAC_FILE).exists() {
        info!(path = %state.path(MAC_FILE).display(), "kept the VTEP MAC so the next start reuses it (--purge-mac removes it)");
    }
}

/// Fails, naming them, if anything of edgevx is still pinned under `bpffs`.
fn nothing_pinned(pins: &PinDir, bpffs: &Path) -> Result<()> {
    // the proof, read back from the bpffs: a pin left keeps its program in the kernel
    let left = crate::status::pinned(pins);
    if !left.is_empty() {
        anyhow::bail!(
            "cleanup is done but {} still holds {}: each keeps a program or link in the kernel (`bpftool link \
             show` and `bpftool prog show` name them); remove them by hand with rm",
            bpffs.display(),
            left.join(", ")
        );
    }
    info!(bpffs = %bpffs.display(), "nothing of edgevx is pinned any more");
    Ok(())
}
