//! What the running kernel offers, probed as the agent probes it
//! (`agent/src/dataplane/features.rs`), for the tests whose expectation
//! depends on the kernel: the same test then holds on every kernel of the
//! matrix, and says which behaviour it checked.
use anyhow::{Context, Result, ensure};
use aya::{
    Ebpf,
    programs::{ProgramType, SkLookup},
    sys::{BpfHelper, is_helper_supported},
    util::KernelVersion,
};

pub(crate) const ENCAP: &str = "edgevx_encap";
pub(crate) const ENCAP_COMPAT: &str = "edgevx_encap_compat";
pub(crate) const GUARD: &str = "edgevx_guard";
pub(crate) const GUARD_COMPAT: &str = "edgevx_guard_compat";

/// `bpf_check_mtu` (Linux 5.12): the encap judges the underlay MTU.
pub(crate) fn check_mtu() -> bool {
    is_helper_supported(ProgramType::SchedClassifier, BpfHelper::BPF_FUNC_check_mtu).unwrap_or(false)
}

/// Whether the agent loads the full encap here: `bpf_check_mtu` (probed,
/// as the agent does) and BPF atomics with fetch, which upstream has from
/// 5.12 (the agent probes them with a verifier run; expecting upstream's
/// numbering here checks the two against each other).
pub(crate) fn full_encap() -> bool {
    check_mtu() && !before(5, 12)
}

/// The encap variant the agent loads here.
pub(crate) fn encap() -> &'static str {
    if full_encap() { ENCAP } else { ENCAP_COMPAT }
}

/// Whether the running release is older than `major.minor` (upstream's
/// numbering: a refusal is only accepted where upstream lacks the feature,
/// so a regression on a new kernel is not mistaken for an old one).
pub(crate) fn before(major: u8, minor: u8) -> bool {
    KernelVersion::current().is_ok_and(|v| v < KernelVersion::new(major, minor, 0))
}

/// The attach mode the agent picks with `--tc-attach auto` on this kernel:
/// TCX from Linux 6.6 on, a clsact filter before (the agent probes; the test
/// expects what upstream has, so the two are checked against each other).
pub(crate) fn default_attach() -> &'static str {
    if before(6, 6) { "clsact" } else { "tcx" }
}

/// Every attach mode this kernel offers.
pub(crate) fn attach_modes() -> Vec<&'static str> {
    if before(6, 6) { vec!["clsact"] } else { vec!["tcx", "clsact"] }
}

/// What the agent logs when a restart takes the running dataplane over in
/// place, by attach mode.
pub(crate) fn adopted_in_place(attach: &str) -> &'static str {
    if attach == "tcx" { "adopted pinned link" } else { "replaced the clsact filter in place" }
}

/// Whether the agent loads the full socket-lookup guard here, which
/// refuses a peer's VXLAN off the underlay itself: from Linux 5.17
/// (`bpf_sk_lookup.ingress_ifindex`; the agent tries it, the test expects
/// upstream's numbering, so the two are checked against each other).
/// Without it a firewall rule in `EDGEVX-INPUT` refuses VXLAN arriving on
/// any other interface.
pub(crate) fn full_guard() -> bool {
    !before(5, 17)
}

/// Loads the socket-lookup guards this verifier accepts and returns their
/// names: the compat guard everywhere, the full one from Linux 5.17 on
/// (`bpf_sk_lookup.ingress_ifindex`), as the agent's fallback expects.
pub(crate) fn load_guards(ebpf: &mut Ebpf) -> Result<Vec<&'static str>> {
    let mut loaded = Vec::new();
    for name in [GUARD, GUARD_COMPAT] {
        let prog: &mut SkLookup = ebpf.program_mut(name).with_context(|| format!("no program {name}"))?.try_into()?;
        match prog.load() {
            Ok(()) => loaded.push(name),
            Err(e) => ensure!(
                name == GUARD && before(5, 17),
                "the verifier refused {name} on a kernel that should take it: {e}"
            ),
        }
    }
    ensure!(loaded.contains(&GUARD_COMPAT), "the compat guard did not load");
    Ok(loaded)
}
