//! Loads the embedded eBPF object and attaches its programs with TCX links
//! pinned in bpffs. A restarted or upgraded agent finds the pinned links
//! and swaps its programs in atomically (`bpf_link_update`), so traffic
//! never runs without a program; maps are pinned by name and reused.
use std::{fs, io, path::Path};

use anyhow::{Context, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::{FdLink, LinkError, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
    },
    sys::SyscallError,
};
use tracing::{info, warn};

use crate::dataplane::bpffs::PinDir;

pub const ENCAP: &str = "edgevx_encap";
pub const DECAP: &str = "edgevx_decap";

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/edgevx"));

/// Loads the programs; creates the maps or reuses their pins.
pub fn load(pins: &PinDir) -> Result<Ebpf> {
    pins.create()?;
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(pins.maps())
        .load(OBJECT)
        .context("cannot load the eBPF object (maps or BTF rejected by the kernel)")?;
    for name in [ENCAP, DECAP] {
        classifier(&mut ebpf, name)?.load().with_context(|| format!("the verifier rejected {name}"))?;
    }
    Ok(ebpf)
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .with_context(|| format!("program {name} is missing from the eBPF object"))?
        .try_into()
        .with_context(|| format!("program {name} is not a classifier"))
}

/// Whether the pinned link's program is attached to `iface` in this netns.
fn attached_here(link: &FdLink, iface: &str, kind: TcAttachType) -> bool {
    let Ok(info) = link.info() else { return false };
    match SchedClassifier::query_tcx(iface, kind) {
        Ok((_, progs)) => progs.iter().any(|p| p.id() == info.program_id()),
        Err(_) => false,
    }
}

/// Attaches program `name` to `iface`, adopting a pinned link if there is
/// one on this interface; the link stays pinned at `<pins>/links/<name>`.
pub fn attach(ebpf: &mut Ebpf, pins: &PinDir, name: &str, iface: &str, kind: TcAttachType) -> Result<()> {
    let link_pin = pins.link(name);
    let prog = classifier(ebpf, name)?;
    let adopted = match PinnedLink::from_pin(&link_pin) {
        Ok(pinned) => {
            let fd = FdLink::from(pinned);
            if attached_here(&fd, iface, kind) {
                let link = SchedClassifierLink::try_from(fd).context("pinned link is not a TC link")?;
                let id = prog
                    .attach_to_link(link)
                    .with_context(|| format!("cannot replace the program in {}", link_pin.display()))?;
                // hand the link back to its pin: dropping our handle must not detach it
                drop(prog.take_link(id).context("cannot take the replaced link")?);
                info!(program = name, iface, "adopted pinned link, program replaced in place");
                true
            } else {
                warn!(program = name, iface, "pinned link is not attached to this interface any more; attaching anew");
                remove_pin(&link_pin)?;
                false
            }
        }
        Err(LinkError::SyscallError(SyscallError { io_error, .. })) if io_error.kind() == io::ErrorKind::NotFound => {
            false
        }
        Err(e) => {
            return Err(e).with_context(|| format!("cannot open pinned link {}", link_pin.display()));
        }
    };
    if !adopted {
        let id = prog
            .attach_with_options(iface, kind, TcAttachOptions::TcxOrder(LinkOrder::first()))
            .with_context(|| format!("cannot attach {name} to {iface} ({kind:?})"))?;
        let link: FdLink =
            prog.take_link(id).context("cannot take the new link")?.try_into().context("TCX link has no fd")?;
        link.pin(&link_pin).with_context(|| format!("cannot pin link at {}", link_pin.display()))?;
        info!(program = name, iface, "attached");
    }
    let prog_pin = pins.prog(name);
    remove_pin(&prog_pin)?;
    prog.pin(&prog_pin).with_context(|| format!("cannot pin program at {}", prog_pin.display()))?;
    Ok(())
}

pub fn remove_pin(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove pin {}", path.display())),
    }
}

/// Detaches by unpinning: a TCX link with no pin and no fd goes away.
pub fn detach_pinned(pins: &PinDir, name: &str) -> Result<bool> {
    let path = pins.link(name);
    match PinnedLink::from_pin(&path) {
        Ok(pinned) => {
            drop(pinned.unpin().with_context(|| format!("cannot unpin {}", path.display()))?);
            Ok(true)
        }
        Err(LinkError::SyscallError(SyscallError { io_error, .. })) if io_error.kind() == io::ErrorKind::NotFound => {
            Ok(false)
        }
        Err(e) => Err(e).with_context(|| format!("cannot open pinned link {}", path.display())),
    }
}
