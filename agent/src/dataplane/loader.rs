//! Loads the embedded eBPF object and attaches its programs with TCX links
//! pinned in bpffs. A restarted or upgraded agent finds the pinned links
//! and swaps its programs in atomically (`bpf_link_update`), so traffic
//! never runs without a program; maps are pinned by name and reused.
use std::{fs, path::Path};

use anyhow::{Context, Result, bail};
use aya::{
    EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        links::{FdLink, PinnedLink},
        tc::{SchedClassifierLink, TcAttach},
    },
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use edgevx_common::SCHEMA_VERSION;

use crate::dataplane::{
    bpffs::{PinDir, remove_pin},
    clsact, device, drop_events,
    features::Features,
    guard, kfunc,
    loaded::Loaded,
    order::{self, Place},
    refused,
};
use crate::gone;

/// How the programs sit on their interfaces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// TCX links pinned in bpffs (kernel 6.6 and later).
    #[default]
    Tcx,
    /// `bpf` filters on a `clsact` qdisc (older kernels; see `clsact.rs`).
    Clsact,
}

impl AttachMode {
    /// The mode this kernel supports best: TCX where it has it (probed).
    pub fn for_kernel(features: &Features) -> Self {
        if features.tcx { AttachMode::Tcx } else { AttachMode::Clsact }
    }

    pub fn name(self) -> &'static str {
        match self {
            AttachMode::Tcx => "tcx",
            AttachMode::Clsact => "clsact",
        }
    }
}

pub const ENCAP: &str = "edgevx_encap";
/// The encap without `bpf_check_mtu`, for kernels before 5.12; attached and
/// pinned under [`ENCAP`]'s name, so status and cleanup find either.
pub const ENCAP_COMPAT: &str = "edgevx_encap_compat";
pub const DECAP: &str = "edgevx_decap";
/// On the pod bridge's egress (see ebpf/src/bridge.rs); attached once the bridge exists.
pub const BRIDGE: &str = "edgevx_bridge";
/// On the pod bridge's ingress (see ebpf/src/pod_guard.rs): VXLAN from local
/// pods is dropped where it starts; attached with the bridge program.
pub const POD_GUARD: &str = "edgevx_pod_guard";
/// On `flannel.<VNI>`'s ingress (see ebpf/src/vtep_guard.rs): drops what
/// decap did not judge; attached after decap, which marks what it judged.
pub const VTEP_GUARD: &str = "edgevx_vtep_guard";
/// The VTEP guard on `flannel-v6.<VNI>`'s ingress. Twin of [`VTEP_GUARD`]
/// because a program attached to two devices needs two link pins: the
/// same program, its link pinned under a name of its own (see
/// [`program_of`]).
pub const VTEP_GUARD6: &str = "edgevx_vtep_guard6";
/// Every TC program, for loading, status and cleanup. The VTEP guard first:
/// cleanup detaches in this order, and it must go before decap stops marking.
pub const PROGRAMS: [&str; 5] = [VTEP_GUARD, ENCAP, DECAP, BRIDGE, POD_GUARD];

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/edgevx"));

/// The embedded eBPF object, as built (before its kfunc calls are resolved).
#[cfg(test)]
pub fn object() -> &'static [u8] {
    OBJECT
}

/// Loads the programs, each in the variant `features` allow; creates the
/// maps or reuses their pins. A program the verifier refuses is a
/// [`Refused`](refused::Refused) in the error's chain: one line, with
/// [`retry_after`](refused::Refused::retry_after) for the next try.
pub fn load(pins: &PinDir, features: &Features) -> Result<Loaded> {
    pins.create()?;
    // the monitor's program array is made anew at every load, never
    // reused from a pin: the kernel ties a program array to the kind of
    // program first loaded against it for its whole life, and what a drop
    // point hands the event program is this build's contract only. The old
    // array's slot empties with its pin, so the old programs, until
    // replaced, drop without an event.
    remove_pin(&pins.map(edgevx_common::monitor::MON_PROGS))?;
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(pins.maps());
    // no dot in the name: bpffs refuses names with one (EPERM)
    let scratch = pins.prog("loading_by_hand");
    let mut ebpf = kfunc::load(&mut loader, OBJECT, &features.conntrack, &scratch)?;
    for name in PROGRAMS {
        let variant = variant(features, name);
        if ebpf.by_hand(variant) {
            info!(program = variant, "loaded beside aya: it calls conntrack's kfuncs in their module's BTF");
            continue;
        }
        if variant != name {
            info!(
                program = name,
                variant,
                check_mtu = features.check_mtu,
                atomic_fetch = features.atomic_fetch,
                "this kernel lacks bpf_check_mtu or BPF atomics with fetch (Linux 5.12): loading the encap \
                 without them (no MTU judgement in the program, outer IP IDs counted per CPU)"
            );
        }
        // a refusal is one line here; its whole log is logged once (refused.rs)
        ebpf.classifier(variant)?.load().map_err(|e| refused::refused(variant, e))?;
    }
    guard::load(&mut ebpf)?;
    // diagnostics only: without the event program a drop is still a drop
    if let Err(e) = drop_events::arm(&mut ebpf) {
        warn!("{e:#}; edgevx monitor will show no drops until the next load");
    }
    Ok(ebpf)
}

/// The program attached under the pin name `name`: its own, but for
/// [`VTEP_GUARD6`], the IPv6 VTEP's link of [`VTEP_GUARD`].
pub fn program_of(name: &str) -> &str {
    if name == VTEP_GUARD6 { VTEP_GUARD } else { name }
}

/// The variant of program `name` to load on a kernel with `features`.
pub fn variant(features: &Features, name: &'static str) -> &'static str {
    match name {
        ENCAP if !(features.check_mtu && features.atomic_fetch) => ENCAP_COMPAT,
        _ => name,
    }
}

/// The other variants of program `name`, which may be loaded in its place.
pub fn other_variants(name: &str) -> &'static [&'static str] {
    match name {
        ENCAP => &[ENCAP_COMPAT],
        _ => &[],
    }
}

/// Program `name` as it was loaded: its variant, if that is what `load` loaded.
fn loaded<'a>(ebpf: &'a mut Loaded, name: &str) -> Result<&'a mut SchedClassifier> {
    let name = program_of(name);
    let compat = (name == ENCAP && ebpf.classifier(ENCAP)?.fd().is_err()).then_some(ENCAP_COMPAT);
    ebpf.classifier(compat.unwrap_or(name))
}

/// Whether the link pinned at `path` is attached to `iface` (in this netns)
/// for `kind`. `false` is the kernel's answer (no such interface, no pin,
/// a link elsewhere); an error means it could not be asked (out of
/// descriptors or memory), which says nothing about the dataplane.
pub fn attached_here(path: &Path, iface: &str, kind: TcAttachType) -> Result<bool> {
    let Some(index) = device::ifindex(iface).with_context(|| format!("cannot look up {iface}"))? else {
        return Ok(false);
    };
    let link = order::pinned_tcx(path).with_context(|| format!("cannot read the link pinned at {}", path.display()))?;
    Ok(link.is_some_and(|l| (l.ifindex, l.attach_type) == (index, order::tcx_attach_type(kind))))
}

/// Attaches program `name` to `iface`, adopting a pinned link if there is
/// one on this interface; the link stays pinned at `<pins>/links/<name>`.
pub fn attach(ebpf: &mut Loaded, pins: &PinDir, name: &str, iface: &str, kind: TcAttachType) -> Result<()> {
    let link_pin = pins.link(name);
    let prog = loaded(ebpf, name)?;
    let pinned = gone::absent(PinnedLink::from_pin(&link_pin))
        .with_context(|| format!("cannot open pinned link {}", link_pin.display()))?;
    let adopted = match pinned {
        Some(pinned) => {
            let fd = FdLink::from(pinned);
            if attached_here(&link_pin, iface, kind)? {
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
        None => false,
    };
    if !adopted {
        let id = prog
            .attach(&device::c_name(iface)?, TcAttach::Tcx { attach_type: kind, order: LinkOrder::first() })
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

/// Attaches program `name` to `iface` in `mode`. What the other mode left
/// of the same program goes first, so it never runs twice on a packet
/// (encapsulating twice, say) after a node switched modes.
pub fn attach_as(
    mode: AttachMode,
    ebpf: &mut Loaded,
    pins: &PinDir,
    name: &str,
    iface: &str,
    kind: TcAttachType,
) -> Result<()> {
    attach_tc(mode, ebpf, pins, name, iface, kind)?;
    // the guard goes in with decap: both judge VXLAN by the same accept
    // map, which is programmed by the time decap is attached
    if name == DECAP {
        guard::attach(ebpf, pins)?;
    }
    // VXLAN from local pods is judged where the bridge program sits
    if name == BRIDGE {
        attach_tc(mode, ebpf, pins, POD_GUARD, iface, TcAttachType::Ingress)?;
    }
    Ok(())
}

fn attach_tc(
    mode: AttachMode,
    ebpf: &mut Loaded,
    pins: &PinDir,
    name: &str,
    iface: &str,
    kind: TcAttachType,
) -> Result<()> {
    match mode {
        AttachMode::Tcx => {
            if clsact::detach(program_of(name), iface, kind)? {
                info!(program = name, iface, "removed the clsact filter of an earlier run");
            }
            attach(ebpf, pins, name, iface, kind)
        }
        AttachMode::Clsact => {
            if detach_pinned(pins, name)? {
                info!(program = name, "detached the TCX link of an earlier run");
            }
            clsact::attach(loaded(ebpf, name)?, program_of(name), iface, kind)
        }
    }
}

/// Whether program `name` is attached to `iface` in `mode`, as the kernel says.
pub async fn attached_as(
    mode: AttachMode,
    handle: &rtnetlink::Handle,
    pins: &PinDir,
    name: &str,
    iface: &str,
    kind: TcAttachType,
) -> Result<bool> {
    match mode {
        AttachMode::Tcx => attached_here(&pins.link(name), iface, kind),
        AttachMode::Clsact => clsact::attached(handle, iface, kind).await,
    }
}

/// Where program `name` sits on `iface` for `kind` in `mode`, among the
/// programs the kernel runs there.
pub async fn place_as(
    mode: AttachMode,
    handle: &rtnetlink::Handle,
    pins: &PinDir,
    name: &str,
    iface: &str,
    kind: TcAttachType,
) -> Result<Place> {
    match mode {
        AttachMode::Tcx => tcx_place(pins, name, iface, kind),
        AttachMode::Clsact => clsact::place(handle, iface, kind).await,
    }
}

/// [`place_as`] for TCX, which needs no runtime (`edgevx status`).
pub fn tcx_place(pins: &PinDir, name: &str, iface: &str, kind: TcAttachType) -> Result<Place> {
    let Some(index) = device::ifindex(iface).with_context(|| format!("cannot look up {iface}"))? else {
        return Ok(Place::Absent);
    };
    let path = pins.link(name);
    let link =
        order::pinned_tcx(&path).with_context(|| format!("cannot read the link pinned at {}", path.display()))?;
    order::tcx_place(link, index, kind).with_context(|| format!("cannot list the TCX programs of {iface} ({kind:?})"))
}

/// Puts program `name` back first on `iface`: attached anew in front of
/// whatever got ahead of it. The kernel moves no attachment, so ours goes
/// and comes back (TCX refuses a program twice on one hook; a clsact filter
/// joins its priority at the head). Meanwhile the VTEP guard drops what
/// nobody judged.
pub fn put_first(
    mode: AttachMode,
    ebpf: &mut Loaded,
    pins: &PinDir,
    name: &str,
    iface: &str,
    kind: TcAttachType,
) -> Result<()> {
    match mode {
        AttachMode::Tcx => {
            detach_pinned(pins, name)?;
            attach(ebpf, pins, name, iface, kind)
        }
        AttachMode::Clsact => {
            clsact::detach(program_of(name), iface, kind)?;
            clsact::attach(loaded(ebpf, name)?, program_of(name), iface, kind)
        }
    }
}

/// After an upgrade that changed the map layout: detaches the links an
/// older version pinned (our new ones are attached by then, first in line)
/// and removes its programs and maps. Only ever an older version: a newer
/// one's pins are refused here, whoever asks (see [`NewerVersion`](crate::dataplane::bpffs::NewerVersion)).
pub fn retire(old: &Path) -> Result<()> {
    let version = old.file_name().and_then(|n| n.to_str()?.strip_prefix('v')?.parse::<u32>().ok());
    match version {
        Some(v) if v < SCHEMA_VERSION => {}
        _ => {
            bail!("refusing to retire {}: not the pins of an older edgevx (ours are v{SCHEMA_VERSION})", old.display())
        }
    }
    let pins = PinDir::at(old);
    for entry in fs::read_dir(pins.links()).into_iter().flatten().flatten() {
        let path = entry.path();
        if let Ok(pinned) = PinnedLink::from_pin(&path) {
            drop(pinned.unpin().with_context(|| format!("cannot unpin {}", path.display()))?);
        }
        remove_pin(&path)?;
    }
    for dir in [pins.progs(), pins.maps()] {
        for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
            remove_pin(&entry.path())?;
        }
    }
    pins.remove_empty_dirs();
    info!(dir = %old.display(), "retired the pins of another edgevx version");
    Ok(())
}

/// Detaches by unpinning: a TCX link with no pin and no fd goes away.
pub fn detach_pinned(pins: &PinDir, name: &str) -> Result<bool> {
    let path = pins.link(name);
    let Some(pinned) = gone::absent(PinnedLink::from_pin(&path))
        .with_context(|| format!("cannot open pinned link {}", path.display()))?
    else {
        return Ok(false);
    };
    drop(pinned.unpin().with_context(|| format!("cannot unpin {}", path.display()))?);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};

    /// No program calls a BPF-to-BPF subprogram (a compiler's memset for an
    /// odd-sized zeroing, say): the drop points tail-call the monitor's
    /// event program, and a JIT without support for mixing the two (arm64
    /// before it gained it) refuses such a program outright. The only
    /// calls the object's relocations name are the conntrack kfuncs.
    #[test]
    fn no_program_calls_a_subprogram() {
        let file = object::File::parse(super::object()).expect("the embedded object parses");
        let mut found = Vec::new();
        for section in file.sections() {
            let name = section.name().unwrap_or("");
            if !["classifier", "xdp", "sk_lookup"].iter().any(|p| name.starts_with(p)) {
                continue;
            }
            let code = section.data().expect("program bytes");
            let kfunc_at: Vec<u64> = section
                .relocations()
                .filter_map(|(at, r)| match r.target() {
                    RelocationTarget::Symbol(i) => file
                        .symbol_by_index(i)
                        .ok()
                        .and_then(|s| s.name().ok())
                        .filter(|n| crate::dataplane::kfunc::KFUNCS.contains(n))
                        .map(|_| at),
                    _ => None,
                })
                .collect();
            for (i, insn) in code.as_chunks::<8>().0.iter().enumerate() {
                // BPF_JMP | BPF_CALL with src_reg BPF_PSEUDO_CALL (1)
                let at = (i * 8) as u64;
                if insn[0] == 0x85 && insn[1] >> 4 == 1 && !kfunc_at.contains(&at) {
                    found.push(format!("{name}+{at:#x}"));
                }
            }
        }
        assert!(found.is_empty(), "BPF-to-BPF calls at {found:?}");
    }

    /// 5.10's verifier refuses a program that holds an atomic with
    /// `BPF_FETCH` (any `BPF_STX` with a non-zero immediate) anywhere in it,
    /// walked or not ("BPF_STX uses reserved fields", checked on every
    /// instruction before the walk): only the full encap, which the agent
    /// loads where the kernel takes it, may hold one.
    #[test]
    fn only_the_full_encap_holds_an_atomic_fetch() {
        let file = object::File::parse(super::object()).expect("the embedded object parses");
        let mut holders = Vec::new();
        for sym in file.symbols().filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0) {
            let Some(section) = sym.section_index().and_then(|i| file.section_by_index(i).ok()) else { continue };
            let code = section.data().expect("program bytes");
            let start = (sym.address() - section.address()) as usize;
            let body = &code[start..start + sym.size() as usize];
            // BPF_STX (3) | BPF_ATOMIC (0xc0), imm != 0
            let fetch =
                body.as_chunks::<8>().0.iter().any(|i| i[0] & 0x07 == 0x03 && i[0] & 0xe0 == 0xc0 && i[4..] != [0; 4]);
            if fetch {
                holders.push(sym.name().unwrap_or("?").to_string());
            }
        }
        assert_eq!(holders, [super::ENCAP], "programs holding an atomic fetch");
    }

    /// Cleanup and status know the pinned maps by [`edgevx_common::maps::ALL`]:
    /// a map the programs declare and the list lacks is a pin left behind.
    #[test]
    fn every_map_the_programs_declare_is_one_cleanup_removes() {
        let file = object::File::parse(super::object()).expect("the embedded object parses");
        let maps = file.section_by_name("maps").expect("a maps section").index();
        let mut declared: Vec<&str> =
            file.symbols().filter(|s| s.section_index() == Some(maps)).filter_map(|s| s.name().ok()).collect();
        declared.sort_unstable();
        let mut listed = edgevx_common::maps::ALL.to_vec();
        listed.sort_unstable();
        assert_eq!(declared, listed);
    }
}
