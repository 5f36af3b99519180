//! What the kernel must offer before `edgevx run` changes anything on the
//! host: a release new enough for every helper and flag the programs use,
//! and the host's bpffs at `--bpffs`. A kernel that lacks a flag still loads
//! the programs (flags are runtime arguments the verifier does not check);
//! the helper then fails on every packet, so the version is checked here.
//!
//! Kernel BTF (`/sys/kernel/btf/vmlinux`) is not needed: the programs read
//! only `__sk_buff` and packet bytes, so there is no CO-RE relocation, and
//! aya loads them without it.
use aya::util::KernelVersion;

use crate::dataplane::bpffs::NotBpffs;

/// One thing the programs need from the kernel, and the release that
/// brought it (with the upstream change, for whoever checks a vendor kernel
/// that backports it).
#[derive(Debug)]
pub(super) struct Requirement {
    pub(super) what: &'static str,
    pub(super) since: KernelVersion,
    pub(super) upstream: &'static str,
}

const fn since(major: u8, minor: u8) -> KernelVersion {
    KernelVersion::new(major, minor, 0)
}

/// Every helper, flag, map type and hook the programs rely on. The README's
/// kernel table says the same; the newest entry is the minimum.
pub(super) const REQUIREMENTS: &[Requirement] = &[
    Requirement {
        what: "bpf_redirect_neigh (encap: out of the underlay, the kernel filling in the next hop's MAC)",
        since: since(5, 10),
        upstream: "commit b4ab31414970",
    },
    Requirement {
        what: "bpf_redirect_peer (decap with --bypass-netfilter: straight into the pod's namespace)",
        since: since(5, 10),
        upstream: "commit 9aa1206e8f48",
    },
    Requirement {
        what: "bpf_skb_adjust_room in BPF_ADJ_ROOM_MAC mode with BPF_F_ADJ_ROOM_FIXED_GSO and \
               BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | ENCAP_L4_UDP (adding and stripping the 50 bytes, GSO kept)",
        since: since(5, 2),
        upstream: "the BPF_ADJ_ROOM_MAC and encap-flags series, bpf-next 2019-03",
    },
    Requirement { what: "LPM trie maps (peer subnets)", since: since(4, 11), upstream: "commit b95a5c4db09b" },
    Requirement {
        what: "bpf_get_hash_recalc (the outer UDP source port from the flow hash)",
        since: since(4, 8),
        upstream: "commit 13c5c240f789",
    },
    Requirement {
        what: "per-CPU hash and array maps (counters)",
        since: since(4, 6),
        upstream: "commits 824bd0ce6c7c, a10423b87a7e",
    },
    Requirement {
        what: "the clsact qdisc (where the programs attach on kernels without TCX)",
        since: since(4, 5),
        upstream: "commit 1f211a1b929c",
    },
    Requirement {
        what: "bpf_redirect with BPF_F_INGRESS (decap: into flannel.<VNI>'s ingress)",
        since: since(4, 4),
        upstream: "commit 27b29f63058d",
    },
];

/// Before this release `bpf_skb_adjust_room` refuses the flag
/// `BPF_F_ADJ_ROOM_ENCAP_L2_ETH` (upstream commit d01b59c), which marks the
/// inner frame as Ethernet (`inner_protocol` ETH_P_TEB). Older kernels get
/// the encap without it (`FLAG_ENCAP_NO_L2_ETH`): the headers on the wire are
/// the same, software GSO cuts the packet right, but NIC drivers that check
/// for ETH_P_TEB do not offload the tunnel segmentation, so it costs CPU.
pub const L2_ETH_FLAG_SINCE: KernelVersion = since(5, 13);

/// Whether the encap must do without `BPF_F_ADJ_ROOM_ENCAP_L2_ETH` here
/// (an unreadable version is taken as a new kernel, as [`check`] does).
pub fn encap_without_l2_eth(version: Option<KernelVersion>) -> bool {
    version.is_some_and(|v| v < L2_ETH_FLAG_SINCE)
}

/// The oldest kernel that has everything in [`REQUIREMENTS`].
pub(super) fn minimum() -> KernelVersion {
    REQUIREMENTS.iter().map(|r| r.since).fold(since(0, 0), |a, b| if b > a { b } else { a })
}

/// What was found on the host.
pub(super) struct KernelFacts {
    /// The running kernel; `None` when its release string cannot be read.
    pub(super) version: Option<KernelVersion>,
    /// Whether `--bpffs` lies on a bpffs.
    pub(super) bpffs: Result<(), NotBpffs>,
}

impl KernelFacts {
    /// Reads the facts from this host.
    pub(super) fn of_this_host(bpffs: &std::path::Path) -> Self {
        KernelFacts { version: KernelVersion::current().ok(), bpffs: crate::dataplane::bpffs::on_bpffs(bpffs) }
    }
}

/// Something the host lacks; each reads as a complete message.
#[derive(Debug, thiserror::Error)]
pub(super) enum Missing {
    #[error("kernel {have} is too old: edgevx needs {} or later for {}", minimum(),
        .lacking.iter().map(|r| format!("{} (since {}, {})", r.what, r.since, r.upstream)).collect::<Vec<_>>().join("; "))]
    Kernel { have: KernelVersion, lacking: Vec<&'static Requirement> },
    #[error(transparent)]
    Bpffs(NotBpffs),
}

/// Everything the host lacks (nothing: it may run). An unreadable kernel
/// version is not held against it: the caller warns instead.
pub(super) fn check(facts: &KernelFacts) -> Vec<Missing> {
    let mut missing = Vec::new();
    if let Some(have) = facts.version {
        let lacking: Vec<&'static Requirement> = REQUIREMENTS.iter().filter(|r| have < r.since).collect();
        if !lacking.is_empty() {
            missing.push(Missing::Kernel { have, lacking });
        }
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

    fn facts(major: u8, minor: u8, patch: u16) -> KernelFacts {
        KernelFacts { version: Some(KernelVersion::new(major, minor, patch)), bpffs: Ok(()) }
    }

    fn message(f: &KernelFacts) -> String {
        check(f).iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
    }

    #[test]
    fn the_minimum_is_5_10_for_the_redirect_helpers() {
        assert_eq!(minimum(), KernelVersion::new(5, 10, 0));
        // the table is kept newest first, as the README shows it
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
        assert!(m.contains("kernel 5.9.16 is too old") && m.contains("5.10.0 or later"), "{m}");
        assert!(m.contains("bpf_redirect_neigh") && m.contains("b4ab31414970"), "{m}");
        // 4.19 lacks the redirect helpers and the MAC-mode encap flags too
        let m = message(&facts(4, 19, 0));
        for what in ["bpf_redirect_neigh", "bpf_redirect_peer", "BPF_ADJ_ROOM_MAC"] {
            assert!(m.contains(what), "{what}: {m}");
        }
        assert!(!m.contains("LPM"), "{m}");
    }

    #[test]
    fn kernels_before_5_13_encap_without_the_l2_flag() {
        // 5.10: Debian 11, Jetson L4T 35; 5.12 is the last release without the flag
        for (minor, patch) in [(10, 120), (12, 19)] {
            assert!(encap_without_l2_eth(Some(KernelVersion::new(5, minor, patch))));
        }
        for (major, minor) in [(5, 13), (5, 15), (6, 18)] {
            assert!(!encap_without_l2_eth(Some(KernelVersion::new(major, minor, 0))));
        }
        assert!(!encap_without_l2_eth(None));
    }

    #[test]
    fn a_missing_bpffs_is_named() {
        let path = PathBuf::from("/sys/fs/bpf/edgevx");
        let f = KernelFacts {
            version: Some(KernelVersion::new(6, 18, 0)),
            bpffs: Err(NotBpffs { path: path.clone(), found: PathBuf::from("/sys/fs/bpf") }),
        };
        let m = message(&f);
        assert!(m.contains("--bpffs /sys/fs/bpf/edgevx") && m.contains("/sys/fs/bpf is not a bpffs"), "{m}");
        // both at once: one message each
        let f = KernelFacts { version: Some(KernelVersion::new(5, 4, 0)), ..f };
        assert_eq!(check(&f).len(), 2);
    }

    #[test]
    fn an_unreadable_version_is_not_held_against_the_host() {
        assert!(check(&KernelFacts { version: None, bpffs: Ok(()) }).is_empty());
    }
}
