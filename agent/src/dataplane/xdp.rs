//! The XDP judge on the underlay (ebpf/src/xdp_judge.rs): attached in
//! native (driver) mode only, never generic mode, which builds the skb
//! first and saves nothing (it is slower than TC). Its link is pinned next
//! to the TC links, adopted by the next agent (the program swapped in
//! place) and detached by `edgevx cleanup`. It is an early drop of what TC
//! drops anyway: when it cannot be attached the node works as before, so
//! nothing here stops the agent; the log and `edgevx status` say why.
use std::{io, path::Path};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::gone;
use crate::{
    dataplane::{
        bpffs::{PinDir, remove_pin},
        device, loader, order, refused,
    },
    state::StateDir,
};

/// The program, and the name its link and program are pinned under.
pub const XDP_JUDGE: &str = "edgevx_xdp_judge";
/// The record `edgevx status` reads: what the agent decided and why.
pub const XDP_FILE: &str = "xdp_judge.json";

/// `--xdp-judge`: whether to put the XDP judge on the underlay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum XdpChoice {
    /// On drivers with native XDP, but not on veth: native XDP on a veth
    /// takes GSO away from its peer (see docs/src/performance.md).
    #[default]
    Auto,
    /// On any driver with native XDP, veth included.
    On,
    /// Never; a judge an earlier run left is detached.
    Off,
}

/// What became of the XDP judge, for the log, status and metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XdpRecord {
    pub choice: XdpChoice,
    pub iface: String,
    /// `native` when attached; `null` when not.
    pub mode: Option<String>,
    /// Why it is not attached (`null` when it is).
    pub reason: Option<String>,
}

/// Whether to try attaching, given the choice and whether the underlay is
/// a veth: `Err` says why not.
pub fn wanted(choice: XdpChoice, veth: bool) -> Result<(), &'static str> {
    match (choice, veth) {
        (XdpChoice::Off, _) => Err("--xdp-judge=off"),
        (XdpChoice::Auto, true) => {
            Err("the underlay is a veth: native XDP there takes GSO off its peer and slows pod traffic \
             (--xdp-judge=on attaches it anyway)")
        }
        _ => Ok(()),
    }
}

/// The ifindex the XDP link pinned at `path` is attached to (0: its device
/// is gone); `None` without a pin. `bpf_link_info` holds an XDP link's
/// ifindex where it holds a TCX link's, so the TCX reader serves.
pub fn pinned_ifindex(path: &Path) -> io::Result<Option<u32>> {
    Ok(order::pinned_tcx(path)?.map(|l| l.ifindex))
}

/// Whether our XDP judge is attached to `iface` (in this netns), as the kernel says.
pub fn attached_to(pins: &PinDir, iface: &str) -> Result<bool> {
    let Some(index) = device::ifindex(iface).with_context(|| format!("cannot look up {iface}"))? else {
        return Ok(false);
    };
    let path = pins.link(XDP_JUDGE);
    let at = pinned_ifindex(&path).with_context(|| format!("cannot read the link pinned at {}", path.display()))?;
    Ok(at == Some(index))
}

/// Puts the judge on `iface` as `choice` says, or takes an earlier run's
/// off; returns what became of it. Errors are the kernel's refusals, said
/// in the record, never fatal.
pub fn apply(ebpf: &mut Ebpf, pins: &PinDir, iface: &str, choice: XdpChoice, veth: bool) -> XdpRecord {
    let record = |mode: Option<&str>, reason: Option<String>| XdpRecord {
        choice,
        iface: iface.to_string(),
        mode: mode.map(str::to_string),
        reason,
    };
    if let Err(why) = wanted(choice, veth) {
        match loader::detach_pinned(pins, XDP_JUDGE) {
            Ok(true) => info!(iface, "detached the XDP judge of an earlier run ({why})"),
            Ok(false) => {}
            Err(e) => warn!("cannot detach the XDP judge of an earlier run: {e:#}"),
        }
        let _ = remove_pin(&pins.prog(XDP_JUDGE));
        info!(iface, "XDP judge not attached: {why}; TC judges alone");
        return record(None, Some(why.to_string()));
    }
    match attach(ebpf, pins, iface) {
        Ok(()) => record(Some("native"), None),
        Err(e) => {
            let why = format!("{e:#}");
            warn!(iface, "XDP judge not attached, TC judges alone: {why}");
            record(None, Some(why))
        }
    }
}

/// Attaches the judge to `iface` in native mode, adopting a pinned link on
/// this interface (the program replaced in place) if there is one.
fn attach(ebpf: &mut Ebpf, pins: &PinDir, iface: &str) -> Result<()> {
    let link_pin = pins.link(XDP_JUDGE);
    let prog: &mut Xdp = ebpf
        .program_mut(XDP_JUDGE)
        .with_context(|| format!("program {XDP_JUDGE} is missing from the eBPF object"))?
        .try_into()
        .with_context(|| format!("program {XDP_JUDGE} is not an XDP program"))?;
    if prog.fd().is_err() {
        prog.load().map_err(|e| refused::refused(XDP_JUDGE, e))?;
    }
    let pinned = gone::absent(PinnedLink::from_pin(&link_pin))
        .with_context(|| format!("cannot open pinned link {}", link_pin.display()))?;
    let adopted = match pinned {
        Some(pinned) => {
            let here = device::ifindex(iface)?.is_some_and(|i| pinned_ifindex(&link_pin).ok().flatten() == Some(i));
            if here {
                let link = XdpLink::try_from(FdLink::from(pinned)).context("pinned link is not an XDP link")?;
                let id = prog
                    .attach_to_link(link)
                    .with_context(|| format!("cannot replace the program in {}", link_pin.display()))?;
                // back to its pin: dropping our handle must not detach it
                drop(prog.take_link(id).context("cannot take the replaced link")?);
                info!(program = XDP_JUDGE, iface, "adopted pinned XDP link, program replaced in place");
                true
            } else {
                warn!(program = XDP_JUDGE, iface, "pinned XDP link is not on this interface any more; attaching anew");
                remove_pin(&link_pin)?;
                false
            }
        }
        None => false,
    };
    if !adopted {
        // driver mode only: EOPNOTSUPP is a driver without native XDP
        let id = prog.attach(&device::c_name(iface)?, XdpMode::Driver).map_err(|e| {
            let unsupported = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<io::Error>())
                .is_some_and(|io| io.raw_os_error() == Some(libc::EOPNOTSUPP));
            anyhow::Error::new(e).context(if unsupported {
                format!("the driver of {iface} has no native XDP (generic mode is never used)")
            } else {
                format!("cannot attach {XDP_JUDGE} to {iface} in native mode")
            })
        })?;
        // a link (bpf_link, Linux 5.9) is what can be pinned and adopted
        let link: FdLink = prog
            .take_link(id)
            .context("cannot take the new link")?
            .try_into()
            .context("the kernel attached XDP without a link (netlink); it could not be pinned")?;
        link.pin(&link_pin).with_context(|| format!("cannot pin link at {}", link_pin.display()))?;
        info!(program = XDP_JUDGE, iface, mode = "native", "attached");
    }
    let prog_pin = pins.prog(XDP_JUDGE);
    remove_pin(&prog_pin)?;
    prog.pin(&prog_pin).with_context(|| format!("cannot pin program at {}", prog_pin.display()))?;
    Ok(())
}

/// What `edgevx status` says of the judge: attached or not (the kernel's
/// word: our pinned link on the underlay), in which mode, and, when not,
/// why (the agent's record of its last decision).
pub fn status_json(state: &StateDir, pins: &PinDir, iface: &str, choice: XdpChoice) -> serde_json::Value {
    let attached = attached_to(pins, iface).ok();
    let rec: Option<XdpRecord> = state.load_record(XDP_FILE).ok().flatten();
    let reason = match attached {
        Some(true) => None,
        _ => rec.and_then(|r| r.reason),
    };
    serde_json::json!({
        "choice": choice,
        // null when the kernel could not be asked
        "attached": attached,
        // the judge is only ever attached in native (driver) mode
        "mode": (attached == Some(true)).then_some("native"),
        "reason": reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_stays_off_veth_and_on_wants_any_native_driver() {
        assert!(wanted(XdpChoice::Auto, false).is_ok());
        assert!(wanted(XdpChoice::Auto, true).unwrap_err().contains("veth"));
        assert!(wanted(XdpChoice::On, true).is_ok());
        assert!(wanted(XdpChoice::On, false).is_ok());
        assert_eq!(wanted(XdpChoice::Off, false), Err("--xdp-judge=off"));
        assert_eq!(wanted(XdpChoice::Off, true), Err("--xdp-judge=off"));
    }
}
