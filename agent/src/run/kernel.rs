//! What the kernel must offer before `edgevx run` changes anything on the
//! host: every helper, map type and program type the programs use, and the
//! host's bpffs at `--bpffs`.
//!
//! Each is **probed**, by loading a tiny program or creating a tiny map as
//! libbpf's probes do (`aya::sys::is_*_supported`), not judged by the
//! release number: distribution kernels backport features, and a verifier
//! is a different program on every kernel. The release each came with is
//! kept for the message and the kernel table in docs/src/kernels.md. Only what no verifier sees
//! is judged by release: `bpf_skb_adjust_room`'s encap-mode flags are
//! run-time arguments, and they came (5.2) before the redirect helpers
//! (5.10) that are probed, so a kernel that passes the probes has them too.
//!
//! What has a fallback is not here (`dataplane::features`): `bpf_check_mtu`
//! (5.12; the encap without it), TCX (6.6; clsact),
//! `bpf_sk_lookup.ingress_ifindex` (5.17; the compat guard) and
//! `BPF_F_ADJ_ROOM_ENCAP_L2_ETH` (5.13; the encap retries without it).
//!
//! Kernel BTF (`/sys/kernel/btf/vmlinux`) is not needed: the programs read
//! only `__sk_buff` and packet bytes, so there is no CO-RE relocation, and
//! aya loads them without it.
use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
    util::KernelVersion,
};

use crate::dataplane::bpffs::NotBpffs;

/// How a requirement is found on the running kernel.
#[derive(Clone, Copy, Debug)]
pub(super) enum Probe {
    /// A helper the TC programs call (the verifier knows it or not).
    Helper(BpfHelper),
    Map(MapType),
    Program(ProgramType),
    /// A run-time argument no verifier checks: the release decides.
    Release,
}

impl Probe {
    /// Whether the kernel has it; `None` when the probe itself failed
    /// (then the release decides, and loading says the rest).
    fn run(self) -> Option<bool> {
        match self {
            Probe::Helper(h) => is_helper_supported(ProgramType::SchedClassifier, h).ok(),
            Probe::Map(m) => is_map_supported(m).ok(),
            Probe::Program(p) => is_program_supported(p).ok(),
            Probe::Release => None,
        }
    }
}

/// One thing the programs need from the kernel, and the release that
/// brought it (with the upstream change, for whoever checks a vendor kernel
/// that backports it).
#[derive(Debug)]
pub(super) struct Requirement {
    pub(super) what: &'static str,
    pub(super) probe: Probe,
    pub(super) since: KernelVersion,
    pub(super) upstream: &'static str,
}

const fn since(major: u8, minor: u8) -> KernelVersion {
    KernelVersion::new(major, minor, 0)
}

/// Every helper, flag, map type and hook the programs rely on. The kernel table
/// in docs/src/kernels.md says the same; the newest entry is the minimum.
pub(super) const REQUIREMENTS: &[Requirement] = &[
    Requirement {
        what: "bpf_redirect_neigh (encap: out of the underlay, the kernel filling in the next hop's MAC)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_redirect_neigh),
        since: since(5, 10),
        upstream: "commit b4ab31414970",
    },
    Requirement {
        what: "bpf_redirect_peer (decap with --bypass-netfilter: straight into the pod's namespace)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_redirect_peer),
        since: since(5, 10),
        upstream: "commit 9aa1206e8f48",
    },
    Requirement {
        what: "sk_lookup programs (the socket-lookup guard: VXLAN from non-peers refused on every path)",
        probe: Probe::Program(ProgramType::SkLookup),
        since: since(5, 9),
        upstream: "commit e9ddbb7707ff",
    },
    Requirement {
        what: "bpf_skb_adjust_room in BPF_ADJ_ROOM_MAC mode with BPF_F_ADJ_ROOM_FIXED_GSO and \
               BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | ENCAP_L4_UDP (adding and stripping the 50 bytes, GSO kept)",
        probe: Probe::Release,
        since: since(5, 2),
        upstream: "the BPF_ADJ_ROOM_MAC and encap-flags series, bpf-next 2019-03",
    },
    Requirement {
        what: "LPM trie maps (peer subnets)",
        probe: Probe::Map(MapType::LpmTrie),
        since: since(4, 11),
        upstream: "commit b95a5c4db09b",
    },
    Requirement {
        what: "bpf_skb_change_tail (encap: the ICMP \"fragmentation needed\" answer built in place)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_skb_change_tail),
        since: since(4, 9),
        upstream: "commit 5293efe62df8",
    },
    Requirement {
        what: "bpf_get_hash_recalc (the outer UDP source port from the flow hash)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_get_hash_recalc),
        since: since(4, 8),
        upstream: "commit 13c5c240f789",
    },
    Requirement {
        what: "per-CPU hash and array maps (counters)",
        probe: Probe::Map(MapType::PerCpuHash),
        since: since(4, 6),
        upstream: "commits 824bd0ce6c7c, a10423b87a7e",
    },
    Requirement {
        what: "the clsact qdisc (where the programs attach on kernels without TCX)",
        probe: Probe::Release,
        since: since(4, 5),
        upstream: "commit 1f211a1b929c",
    },
    Requirement {
        what: "bpf_redirect with BPF_F_INGRESS (decap: into flannel.<VNI>'s ingress)",
        probe: Probe::Helper(BpfHelper::BPF_FUNC_redirect),
        since: since(4, 4),
        upstream: "commit 27b29f63058d",
    },
];

/// The oldest kernel that has everything in [`REQUIREMENTS`].
pub(super) fn minimum() -> KernelVersion {
    REQUIREMENTS.iter().map(|r| r.since).fold(since(0, 0), |a, b| if b > a { b } else { a })
}

/// What was found on the host.
pub(super) struct KernelFacts {
    /// The running kernel; `None` when its release string cannot be read.
    pub(super) version: Option<KernelVersion>,
    /// What each requirement's probe found, in [`REQUIREMENTS`]' order
    /// (`None`: not probed, or the probe failed).
    pub(super) probed: Vec<Option<bool>>,
    /// Whether `--bpffs` lies on a bpffs.
    pub(super) bpffs: Result<(), NotBpffs>,
}

impl KernelFacts {
    /// Reads the facts from this host (the probes load no program that
    /// stays, and touch nothing else).
    pub(super) fn of_this_host(bpffs: &std::path::Path) -> Self {
        KernelFacts {
            version: KernelVersion::current().ok(),
            probed: REQUIREMENTS.iter().map(|r| r.probe.run()).collect(),
            bpffs: crate::dataplane::bpffs::on_bpffs(bpffs),
        }
    }
}

/// Something the host lacks; each reads as a complete message.
#[derive(Debug, thiserror::Error)]
pub(super) enum Missing {
    #[error("kernel {} lacks what edgevx needs ({} or later has it all): {}",
        .have.map_or("(release unreadable)".to_string(), |v| v.to_string()), minimum(),
        .lacking.iter().map(|r| format!("{} (since {}, {})", r.what, r.since, r.upstream)).collect::<Vec<_>>().join("; "))]
    Kernel { have: Option<KernelVersion>, lacking: Vec<&'static Requirement> },
    #[error(transparent)]
    Bpffs(NotBpffs),
}

impl Missing {
    /// A bpffs the host has not mounted yet fixes itself (a unit or an init
    /// container mounts it): waited for. A kernel that lacks a feature does
    /// not: exit 2.
    pub(super) fn fixes_itself(&self) -> bool {
        matches!(self, Missing::Bpffs(_))
    }
}

/// Everything the host lacks (nothing: it may run). A probe's answer
/// decides; where there is none (a run-time flag, or a probe that failed),
/// the release does; an unreadable release is not held against the host:
/// the caller warns instead.
pub(super) fn check(facts: &KernelFacts) -> Vec<Missing> {
    let mut missing = Vec::new();
    let lacking: Vec<&'static Requirement> = REQUIREMENTS
        .iter()
        .enumerate()
        .filter(|(i, r)| match facts.probed.get(*i).copied().flatten() {
            Some(present) => !present,
            None => facts.version.is_some_and(|have| have < r.since),
        })
        .map(|(_, r)| r)
        .collect();
    if !lacking.is_empty() {
        missing.push(Missing::Kernel { have: facts.version, lacking });
    }
    if let Err(e) = &facts.bpffs {
        missing.push(Missing::Bpffs(e.clone()));
    }
    missing
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    /// A kernel of this release whose probes answer as the release would.
    fn facts(major: u8, minor: u8, patch: u16) -> KernelFacts {
        let version = KernelVersion::new(major, minor, patch);
        let probed =
            REQUIREMENTS.iter().map(|r| (!matches!(r.probe, Probe::Release)).then_some(version >= r.since)).collect();
        KernelFacts { version: Some(version), probed, bpffs: Ok(()) }
    }

    fn message(f: &KernelFacts) -> String {
        check(f).iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    }

    fn index(what: &str) -> usize {
        REQUIREMENTS.iter().position(|r| r.what.starts_with(what)).expect("a requirement")
    }

    #[test]
    fn the_minimum_is_5_10_for_the_redirect_helpers() {
        assert_eq!(minimum(), KernelVersion::new(5, 10, 0));
        // the table is kept newest first, as docs/src/kernels.md shows it
        assert!(REQUIREMENTS.windows(2).all(|w| w[0].since >= w[1].since));
    }

    #[test]
    fn kernels_from_the_minimum_on_pass() {
        for (major, minor, patch) in [(5, 10, 0), (5, 12, 19), (5, 13, 0), (5, 15, 0), (6, 1, 0), (6, 6, 0), (6, 18, 0)]
        {
            assert!(check(&facts(major, minor, patch)).is_empty(), "{major}.{minor}.{patch}");
        }
    }

    #[test]
    fn an_old_kernel_is_refused_naming_what_it_lacks() {
        // 5.9: one release short of both redirect helpers
        let m = message(&facts(5, 9, 16));
        assert!(m.contains("kernel 5.9.16 lacks") && m.contains("5.10.0 or later"), "{m}");
        assert!(m.contains("bpf_redirect_neigh") && m.contains("b4ab31414970"), "{m}");
        // 4.19 lacks the redirect helpers, sk_lookup and the MAC-mode encap flags too
        let m = message(&facts(4, 19, 0));
        for what in ["bpf_redirect_neigh", "bpf_redirect_peer", "sk_lookup", "BPF_ADJ_ROOM_MAC"] {
            assert!(m.contains(what), "{what}: {m}");
        }
        assert!(!m.contains("LPM"), "{m}");
    }

    #[test]
    fn the_probe_decides_not_the_release() {
        // a vendor 5.4 with the redirect helpers and sk_lookup backported runs
        let mut f = facts(5, 4, 0);
        for what in ["bpf_redirect_neigh", "bpf_redirect_peer", "sk_lookup"] {
            f.probed[index(what)] = Some(true);
        }
        assert!(check(&f).is_empty(), "{}", message(&f));
        // a 6.1 built without one of them is refused, naming it alone
        let mut f = facts(6, 1, 0);
        f.probed[index("bpf_redirect_peer")] = Some(false);
        let m = message(&f);
        assert!(m.contains("bpf_redirect_peer") && !m.contains("bpf_redirect_neigh"), "{m}");
        // a probe that failed leaves it to the release
        let mut f = facts(5, 9, 0);
        f.probed = vec![None; REQUIREMENTS.len()];
        assert!(message(&f).contains("bpf_redirect_neigh"));
    }

    #[test]
    fn a_missing_bpffs_is_named() {
        let path = PathBuf::from("/sys/fs/bpf/edgevx");
        let f = KernelFacts {
            bpffs: Err(NotBpffs { path: path.clone(), found: PathBuf::from("/sys/fs/bpf") }),
            ..facts(6, 18, 0)
        };
        let m = message(&f);
        assert!(m.contains("--bpffs /sys/fs/bpf/edgevx") && m.contains("/sys/fs/bpf is not a bpffs"), "{m}");
        // both at once: one message each
        let f = KernelFacts { bpffs: f.bpffs, ..facts(5, 4, 0) };
        assert_eq!(check(&f).len(), 2);
    }

    #[test]
    fn an_unreadable_version_is_not_held_against_the_host() {
        let f = KernelFacts { version: None, probed: vec![None; REQUIREMENTS.len()], bpffs: Ok(()) };
        assert!(check(&f).is_empty());
        // but a probe that says no still refuses it
        let mut f = f;
        f.probed[index("LPM")] = Some(false);
        assert!(message(&f).contains("kernel (release unreadable) lacks"), "{}", message(&f));
    }
}
