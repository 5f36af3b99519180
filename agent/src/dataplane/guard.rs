//! The socket-lookup guard (`ebpf/src/guard.rs`): attached to the node's
//! network namespace, so VXLAN from anyone but a programmed peer is refused
//! whatever path it takes to the kernel's VXLAN socket: another interface,
//! another local address, a pod of this node, fragments the kernel
//! reassembles. It reads the same accept map as decap.
//!
//! Why a socket-level hook rather than TC on every interface or a netfilter
//! set of peer addresses: it sees every datagram after reassembly, on every
//! interface, including ones that appear later, and it needs no second copy
//! of the peer list to keep in step with the maps. What it does not see:
//! broadcast and multicast datagrams (the kernel delivers those without a
//! lookup; decap judges them on the underlay) and VXLAN that local pods
//! send to other nodes (forwarded, never looked up here).
//!
//! The link is pinned like the TC links, so it outlives the agent; a new
//! agent attaches its own first, then unpins the old one, so the namespace
//! is never unguarded.
use std::fs::File;

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    programs::{
        SkLookup,
        links::{FdLink, PinnedLink},
    },
};
use tracing::{debug, info, warn};

use crate::dataplane::{
    bpffs::{PinDir, remove_pin},
    refused,
};
use crate::gone;

/// The guard's name in the eBPF object, and of its link and program pins
/// whichever variant is loaded.
pub const GUARD: &str = "edgevx_guard";
/// The guard without the ingress-interface check: `bpf_sk_lookup`'s
/// `ingress_ifindex` came with Linux 5.17, and older verifiers refuse it.
pub const GUARD_COMPAT: &str = "edgevx_guard_compat";

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SkLookup> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} is missing from the eBPF object"))?
        .try_into()
        .with_context(|| format!("program {name} is not an sk_lookup program"))
}

/// Loads the guard into the kernel (the verifier runs here). A kernel
/// whose verifier refuses the ingress-interface check (before 5.17) gets
/// the compat guard, with a warning: there a rule in `EDGEVX-INPUT`
/// refuses VXLAN arriving on another interface instead.
pub fn load(ebpf: &mut Ebpf) -> Result<()> {
    let Err(e) = program(ebpf, GUARD)?.load() else { return Ok(()) };
    // expected before 5.17: one line, once per process (a bring-up that
    // fails later is retried from the top), the verifier's log only at debug
    let e = refused::expected(GUARD, e);
    if e.downcast_ref::<refused::Refused>().is_none_or(refused::Refused::is_new) {
        warn!(
            "{e:#}; loading {GUARD_COMPAT}, without the check that a peer's VXLAN arrives on the underlay \
             (bpf_sk_lookup.ingress_ifindex needs Linux 5.17); a firewall rule refuses VXLAN arriving on another \
             interface instead"
        );
    } else {
        debug!("{e:#}; loading {GUARD_COMPAT} again");
    }
    program(ebpf, GUARD_COMPAT)?.load().map_err(|e| refused::refused(GUARD_COMPAT, e))
}

/// Whether the guard `load` loaded refuses a peer's VXLAN off the
/// underlay itself (the full guard); without it the firewall does
/// (`netfilter::Settings::vxlan_only_on`).
pub fn checks_iface(ebpf: &mut Ebpf) -> Result<bool> {
    Ok(program(ebpf, GUARD)?.fd().is_ok())
}

/// The variant `load` loaded.
fn loaded(ebpf: &mut Ebpf) -> Result<&mut SkLookup> {
    let name = if checks_iface(ebpf)? { GUARD } else { GUARD_COMPAT };
    program(ebpf, name)
}

/// Attaches the guard to this network namespace, replacing the link an
/// earlier run pinned (new first, old second).
pub fn attach(ebpf: &mut Ebpf, pins: &PinDir) -> Result<()> {
    let netns = File::open("/proc/self/ns/net").context("cannot open this network namespace")?;
    let prog = loaded(ebpf)?;
    let id = prog.attach(&netns).context("cannot attach the socket-lookup guard to this network namespace")?;
    let link: FdLink = prog.take_link(id).context("cannot take the guard link")?.into();
    let link_pin = pins.link(GUARD);
    let old = gone::absent(PinnedLink::from_pin(&link_pin))
        .with_context(|| format!("cannot open pinned link {}", link_pin.display()))?;
    if let Some(old) = old {
        drop(old.unpin().with_context(|| format!("cannot unpin {}", link_pin.display()))?);
    }
    remove_pin(&link_pin)?;
    link.pin(&link_pin).with_context(|| format!("cannot pin link at {}", link_pin.display()))?;
    let prog_pin = pins.prog(GUARD);
    remove_pin(&prog_pin)?;
    prog.pin(&prog_pin).with_context(|| format!("cannot pin program at {}", prog_pin.display()))?;
    info!(program = GUARD, "attached to the network namespace");
    Ok(())
}
