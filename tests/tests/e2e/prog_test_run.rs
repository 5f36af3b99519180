//! The encap, decap, bridge and pod guard programs run on crafted packets
//! with BPF_PROG_TEST_RUN; outputs are compared byte for byte with frames
//! written out here by hand from RFC 7348 and flannel's settings.
use std::path::PathBuf;

use anyhow::{Context, Result};
use aya::{
    EbpfLoader, TestRun, TestRunOptions,
    maps::{Array, HashMap, LpmTrie, PerCpuArray, PerCpuHashMap, PerCpuValues, lpm_trie::Key},
    programs::SchedClassifier,
};
use edgevx::dataplane::kfunc::Conntrack;
use edgevx_common::{
    counters::{Counter, Slot},
    maps::{
        self as names, ACCEPT_ANY_INNER_SOURCE, DataplaneConfig, FLAG_BYPASS_NETFILTER, FLAG_ENCAP_NO_L2_ETH, LocalPod,
        Peer, PeerAccept, PeerStats,
    },
};
use edgevx_tests::{topo::Bpffs, unique};

use crate::features;

pub(crate) const OUR_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];
pub(crate) const PEER_MAC: [u8; 6] = [0x02, 0xbb, 0, 0, 0, 2];
pub(crate) const POD_MAC: [u8; 6] = [0x02, 0xcc, 0, 0, 0, 3];
pub(crate) const HOST_MAC: [u8; 6] = [0x02, 0xdd, 0, 0, 0, 4];
pub(crate) const OUR_IP: [u8; 4] = [198, 18, 0, 1];
pub(crate) const PEER_IP: [u8; 4] = [198, 18, 0, 2];
pub(crate) const STRANGER_IP: [u8; 4] = [198, 18, 0, 66];
/// A peer whose entry says it may carry any inner source (an F5 BIG-IP).
pub(crate) const EXEMPT_IP: [u8; 4] = [198, 18, 0, 3];
pub(crate) const TC_ACT_SHOT: u32 = 2;
pub(crate) const TC_ACT_REDIRECT: u32 = 7;
pub(crate) const NEXT: u32 = u32::MAX; // TC_ACT_UNSPEC / TCX_NEXT: "not mine, carry on"

pub(crate) struct Loaded {
    pub(crate) ebpf: edgevx::dataplane::loaded::Loaded,
    /// The encap variant this kernel takes (`features::encap`).
    pub(crate) encap: &'static str,
    _bpffs: Bpffs,
}

fn object() -> PathBuf {
    std::env::var_os("EDGEVX_EBPF_OBJECT").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ebpf/bpfel-unknown-none/release/edgevx")
    })
}

pub(crate) fn load(flags: u32) -> Result<Loaded> {
    let dir = std::env::temp_dir().join(unique("bpf"));
    let bpffs = Bpffs::mount(&dir)?;
    let bytes = std::fs::read(object())
        .with_context(|| format!("cannot read {} (cargo xtask build-ebpf)", object().display()))?;
    // as the agent loads it: kfunc calls resolved for this kernel (or
    // poisoned, fast path off), and where conntrack is a module the VTEP
    // guard loaded by hand (with fd_array); in a matrix guest the module is
    // loaded first, so the VTEP guard's tests run on that program there
    edgevx_tests::ct_kfuncs::like_a_node()?;
    let ct = Conntrack::probe();
    anyhow::ensure!(
        ct.reachable() || !edgevx_tests::ct_kfuncs::offered(),
        "the kernel offers the conntrack kfuncs, yet the probe says {ct:?}"
    );
    let mut loader = EbpfLoader::new();
    loader.default_map_pin_directory(&dir);
    let mut ebpf = edgevx::dataplane::kfunc::load(&mut loader, &bytes, &ct, &dir.join("by_hand"))?;
    let encap = features::encap();
    for p in [encap, "edgevx_decap", "edgevx_bridge", "edgevx_pod_guard", "edgevx_vtep_guard"] {
        if !ebpf.by_hand(p) {
            ebpf.classifier(p)?.load()?;
        }
    }
    edgevx::dataplane::drop_events::arm(&mut ebpf)?;
    let mut config: Array<_, DataplaneConfig> = Array::try_from(ebpf.map_mut(names::CONFIG).context("config")?)?;
    config.set(
        0,
        &DataplaneConfig {
            vni: 1,
            local_ip: OUR_IP,
            vtep_mac: OUR_MAC,
            port: 8472,
            flags,
            vtep_ifindex: 5,
            underlay_ifindex: 2,
            public_ip6: [0; 16],
        },
        0,
    )?;
    let mut subnets: LpmTrie<_, [u8; 4], Peer> =
        LpmTrie::try_from(ebpf.map_mut(names::PEER_SUBNETS).context("subnets")?)?;
    subnets.insert(
        &Key::new(24, [10, 244, 2, 0]),
        &Peer { public_ip: PEER_IP, vtep_mac: PEER_MAC, _pad: [0; 2] },
        0,
    )?;
    subnets.insert(
        &Key::new(24, [10, 244, 3, 0]),
        &Peer { public_ip: EXEMPT_IP, vtep_mac: PEER_MAC, _pad: [0; 2] },
        0,
    )?;
    let mut accept: HashMap<_, [u8; 4], PeerAccept> =
        HashMap::try_from(ebpf.map_mut(names::PEER_ACCEPT).context("accept")?)?;
    accept.insert(&PEER_IP, &PeerAccept { pod_subnet: [10, 244, 2, 0], prefix_len: 24, flags: 0, _pad: [0; 2] }, 0)?;
    let exempt =
        PeerAccept { pod_subnet: [10, 244, 3, 0], prefix_len: 24, flags: ACCEPT_ANY_INNER_SOURCE, _pad: [0; 2] };
    accept.insert(&EXEMPT_IP, &exempt, 0)?;
    let ncpu = aya::util::nr_cpus().map_err(|(_, e)| e)?.get() as usize;
    let mut stats: PerCpuHashMap<_, [u8; 4], PeerStats> =
        PerCpuHashMap::try_from(ebpf.map_mut(names::PEER_STATS).context("stats")?)?;
    stats.insert(&PEER_IP, PerCpuValues::try_from(vec![PeerStats::default(); ncpu])?, 0)?;
    let mut pods: HashMap<_, [u8; 4], LocalPod> = HashMap::try_from(ebpf.map_mut(names::LOCAL_PODS).context("pods")?)?;
    pods.insert(&[10, 244, 1, 2], &LocalPod { host_ifindex: 7, pod_mac: POD_MAC, host_mac: HOST_MAC }, 0)?;
    Ok(Loaded { ebpf, encap, _bpffs: bpffs })
}

impl Loaded {
    pub(crate) fn run(&self, prog: &str, input: &[u8]) -> Result<(u32, Vec<u8>)> {
        let p: &SchedClassifier = self.ebpf.classifier_ref(prog)?;
        let mut out = vec![0u8; input.len() + 256];
        let opts = TestRunOptions { data_in: Some(input), data_out: Some(&mut out), ..Default::default() };
        let r = p.test_run(opts)?;
        out.truncate(r.data_size_out as usize);
        Ok((r.return_value, out))
    }

    pub(crate) fn counter(&self, c: Counter) -> Result<u64> {
        let (name, i) = match c.slot() {
            Slot::First(i) => (names::GLOBAL_STATS, i),
            Slot::More(i) => (names::MORE_STATS, i),
        };
        let a: PerCpuArray<_, u64> = PerCpuArray::try_from(self.ebpf.map(name).context(name)?)?;
        Ok(a.get(&i, 0)?.iter().sum())
    }

    fn peer(&self) -> Result<PeerStats> {
        let m: PerCpuHashMap<_, [u8; 4], PeerStats> =
            PerCpuHashMap::try_from(self.ebpf.map(names::PEER_STATS).context("stats")?)?;
        Ok(m.get(&PEER_IP, 0)?.iter().fold(PeerStats::default(), |mut a, s| {
            a.tx_packets += s.tx_packets;
            a.rx_packets += s.rx_packets;
            a
        }))
    }
}

/// Independent RFC 1071 checksum (not the one under test).
pub(crate) fn checksum(b: &[u8]) -> [u8; 2] {
    let mut s: u64 = b.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u64).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    (!(s as u16)).to_be_bytes()
}

pub(crate) fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8], tos: u8) -> Vec<u8> {
    let len = (20 + payload.len()) as u16;
    let mut h = vec![0x45, tos];
    h.extend(len.to_be_bytes());
    h.extend([0x12, 0x34, 0x40, 0x00, 63, proto, 0, 0]);
    h.extend(src);
    h.extend(dst);
    let c = checksum(&h);
    h[10..12].copy_from_slice(&c);
    h.extend(payload);
    h
}

pub(crate) fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(dst);
    f.extend(src);
    f.extend(ethertype.to_be_bytes());
    f.extend(payload);
    f
}

/// An ICMP echo from pod 10.244.1.2 to `dst` as routed into flannel.1.
pub(crate) fn inner_icmp(dst: [u8; 4]) -> Vec<u8> {
    let mut icmp = vec![8, 0, 0, 0, 0, 1, 0, 1];
    icmp.extend([0x5a; 56]);
    ipv4([10, 244, 1, 2], dst, 1, &icmp, 0x02)
}

/// What a flannel peer puts on the wire for `inner`.
pub(crate) fn vxlan_frame(src: [u8; 4], vni: u32, inner_dst_mac: [u8; 6], inner: &[u8]) -> Vec<u8> {
    vxlan_frame_to(src, OUR_IP, vni, inner_dst_mac, inner)
}

/// The same to `dst`: a pod's VXLAN for a peer node, or ours to another address.
pub(crate) fn vxlan_frame_to(src: [u8; 4], dst: [u8; 4], vni: u32, inner_dst_mac: [u8; 6], inner: &[u8]) -> Vec<u8> {
    let inner_frame = eth(inner_dst_mac, PEER_MAC, 0x0800, inner);
    let mut udp = Vec::new();
    udp.extend(40000u16.to_be_bytes());
    udp.extend(8472u16.to_be_bytes());
    udp.extend(((8 + 8 + inner_frame.len()) as u16).to_be_bytes());
    udp.extend([0, 0]);
    udp.extend([0x08, 0, 0, 0]);
    udp.extend((vni << 8).to_be_bytes());
    udp.extend(inner_frame);
    eth([0x02, 0xee, 0, 0, 0, 1], [0x02, 0xee, 0, 0, 0, 2], 0x0800, &ipv4(src, dst, 17, &udp, 0))
}

#[test]
fn encap_builds_flannel_compatible_outer_headers() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = inner_icmp([10, 244, 2, 2]);
    let input = eth(OUR_MAC, OUR_MAC, 0x0800, &inner);
    let (rc, out) = l.run(l.encap, &input)?;
    assert_eq!(rc, TC_ACT_REDIRECT);

    #[rustfmt::skip]
    let mut want: Vec<u8> = vec![
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x08, 0x00,          // outer eth: as routed (below); redirect_neigh rewrites it
        0x45, 0x02, 0x00, 134, 0x00, 0x00, 0x00, 0x00, 64, 17, 0, 0, // IPv4, ECN copied, no DF, TTL 64
        198, 18, 0, 1, 198, 18, 0, 2,
        0, 0, 0x21, 0x18, 0x00, 114, 0x00, 0x00,                 // UDP: sport checked below, 8472
        0x08, 0, 0, 0, 0x00, 0x00, 0x01, 0x00,                   // VXLAN: I flag, VNI 1
    ];
    want[..12].copy_from_slice(&input[..12]);
    want[18..20].copy_from_slice(&out[18..20]); // the IP ID: checked below
    let c = checksum(&want[14..34]);
    want[24..26].copy_from_slice(&c);
    want.extend(PEER_MAC);
    want.extend(OUR_MAC);
    want.extend([0x08, 0x00]);
    want.extend(&inner);
    let sport = u16::from_be_bytes([out[34], out[35]]);
    assert!((32768..61000).contains(&sport), "source port {sport}");
    let mut masked = out.clone();
    masked[34..36].copy_from_slice(&[0, 0]);
    assert_eq!(masked, want, "outer headers differ");

    // the same flow keeps its port; another flow gets its own
    assert_eq!(l.run(l.encap, &input)?.1[34..36], out[34..36]);
    let mut ports = std::collections::BTreeSet::new();
    let mut ids = std::collections::BTreeSet::from([[out[18], out[19]]]);
    for last in 2..40u8 {
        let o = l.run(l.encap, &eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 2, last])))?.1;
        ports.insert([o[34], o[35]]);
        ids.insert([o[18], o[19]]);
    }
    assert!(ports.len() > 20, "source ports do not spread: {ports:?}");
    // DF is clear, so an underlay hop may fragment: no two packets share an ID (RFC 6864)
    assert_eq!(ids.len(), 39, "outer IP IDs repeat: {ids:?}");
    assert_eq!(l.peer()?.tx_packets, 40);
    assert_eq!(l.counter(Counter::TxPackets)?, 40);
    Ok(())
}

/// Without `BPF_F_ADJ_ROOM_ENCAP_L2_ETH` (forced here; on kernels before
/// 5.13 the kernel refuses it and the program asks again without it) and
/// without `bpf_check_mtu` (the compat encap, before 5.12), the same bytes
/// go on the wire. Every variant this kernel takes is compared.
#[test]
fn every_encap_variant_puts_the_same_bytes_on_the_wire() -> Result<()> {
    let inputs = [
        eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 2, 2])),
        eth(
            OUR_MAC,
            OUR_MAC,
            0x0800,
            &ipv4([10, 244, 1, 2], [10, 244, 3, 9], 17, &[0x30, 0x39, 0, 53, 0, 12, 0, 0, 1, 2, 3, 4], 0x2e),
        ),
    ];
    let reference = load(0)?;
    // the compat encap loads everywhere; the full one where the kernel has
    // bpf_check_mtu and BPF atomics with fetch
    let mut variants = vec![(features::ENCAP_COMPAT, 0), (features::ENCAP_COMPAT, FLAG_ENCAP_NO_L2_ETH)];
    if features::full_encap() {
        variants.extend([(features::ENCAP, 0), (features::ENCAP, FLAG_ENCAP_NO_L2_ETH)]);
    } else {
        assert!(features::before(5, 12), "bpf_check_mtu is missing on a kernel that has it upstream");
    }
    for (variant, flags) in variants {
        let mut l = load(flags)?;
        if variant != l.encap {
            let p: &mut SchedClassifier = l.ebpf.program_mut(variant).context("program")?.try_into()?;
            p.load().with_context(|| format!("the verifier refused {variant}"))?;
        }
        for input in &inputs {
            let (rc, mut got) = l.run(variant, input)?;
            let (want_rc, mut want) = reference.run(reference.encap, input)?;
            // the IP IDs differ (each load starts at a random one); the rest is equal
            for f in [&mut got, &mut want] {
                f[18..20].copy_from_slice(&[0, 0]);
                f[24..26].copy_from_slice(&[0, 0]);
            }
            assert_eq!((rc, got), (want_rc, want), "{variant} with flags {flags:#x}");
        }
        assert_eq!(l.counter(Counter::DropAdjustRoom)?, 0, "{variant}");
    }
    Ok(())
}

/// The calling thread's CPU mask.
fn affinity() -> Result<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, filled by the kernel; 0 is this thread.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    anyhow::ensure!(rc == 0, "sched_getaffinity: {}", std::io::Error::last_os_error());
    Ok(set)
}

fn set_affinity(set: &libc::cpu_set_t) -> Result<()> {
    // SAFETY: sched_setaffinity reads the set we own; 0 is this thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) };
    anyhow::ensure!(rc == 0, "sched_setaffinity: {}", std::io::Error::last_os_error());
    Ok(())
}

/// Pins the calling thread to `cpu`.
pub(crate) fn run_on(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu, &mut set) };
    set_affinity(&set)
}

/// Outer IP IDs at least as unique as the kernel's (issue 18): DF is clear,
/// so an underlay hop may fragment, and fragments are put together by
/// (source, destination, ID). The kernel's `ip_idents` counter is shared by
/// every CPU, so one destination sees no ID twice within 65,536 packets.
/// The full encap's counter is too: 65,536 packets to one peer, sent from
/// two CPUs in turns (256 each), carry 65,536 different IDs. (The per-CPU
/// counters the compat encap keeps, for kernels without BPF atomics' fetch,
/// repeat here almost surely: docs/src/limits.md.)
#[test]
fn outer_ip_ids_do_not_repeat_within_65536_packets_whichever_cpu_sends() -> Result<()> {
    if !features::full_encap() {
        eprintln!("this kernel takes the compat encap, whose IP IDs are counted per CPU: not held to this");
        return Ok(());
    }
    let was = affinity()?;
    // SAFETY: CPU_ISSET reads within the set.
    let cpus: Vec<usize> =
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &was) }).take(2).collect();
    anyhow::ensure!(cpus.len() == 2, "this test needs two CPUs to send from, this thread may use {cpus:?}");
    let l = load(0)?;
    let input = eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 2, 2]));
    let mut seen = vec![false; 1 << 16];
    let mut repeats = Vec::new();
    // the whole test on these two CPUs, whatever the test harness's thread had
    let result = (|| -> Result<()> {
        for turn in 0..256 {
            run_on(cpus[turn % 2])?;
            for _ in 0..256 {
                let (rc, out) = l.run(l.encap, &input)?;
                anyhow::ensure!(rc == TC_ACT_REDIRECT, "encap returned {rc}");
                let id = usize::from(u16::from_be_bytes([out[18], out[19]]));
                if std::mem::replace(&mut seen[id], true) && repeats.len() < 10 {
                    repeats.push((turn, id));
                }
            }
        }
        Ok(())
    })();
    // back to the CPUs the harness gave this thread, for the tests after this one
    set_affinity(&was)?;
    result?;
    assert!(repeats.is_empty(), "outer IP IDs repeated within 65,536 packets to one peer (turn, id): {repeats:?}");
    assert_eq!(seen.iter().filter(|s| **s).count(), 1 << 16);
    Ok(())
}

#[test]
fn encap_drops_and_counts_what_it_cannot_route() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let (rc, _) = l.run(l.encap, &eth(OUR_MAC, OUR_MAC, 0x0800, &inner_icmp([10, 244, 9, 9])))?;
    assert_eq!(rc, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropNoRoute)?, 1);
    let arp = eth([0xff; 6], OUR_MAC, 0x0806, &[0u8; 28]);
    assert_eq!(l.run(l.encap, &arp)?.0, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropNotIpv4)?, 1);
    Ok(())
}

#[test]
fn decap_delivers_to_a_known_local_pod_byte_exact() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0, 0, 0, 0, 0, 1, 0, 1], 0);
    let (rc, out) = l.run("edgevx_decap", &vxlan_frame(PEER_IP, 1, OUR_MAC, &inner))?;
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(out, eth(POD_MAC, HOST_MAC, 0x0800, &inner));
    assert_eq!(l.counter(Counter::RxFastPackets)?, 1);
    assert_eq!(l.peer()?.rx_packets, 1);
    Ok(())
}

#[test]
fn decap_leaves_other_traffic_untouched() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0);
    let mut tcp = vec![0x1f, 0x90, 0x00, 0x16];
    tcp.extend([0u8; 16]);
    let mut dns = vec![0x9c, 0x40, 0x00, 0x35, 0x00, 0x10, 0, 0];
    dns.extend([1u8; 8]);
    let mut to_port_4789 = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner);
    to_port_4789[36..38].copy_from_slice(&4789u16.to_be_bytes());
    let mut to_other_host = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner);
    to_other_host[30..34].copy_from_slice(&[198, 18, 0, 7]);
    let cases = [
        ("ssh over TCP", eth([2; 6], [4; 6], 0x0800, &ipv4(PEER_IP, OUR_IP, 6, &tcp, 0))),
        ("DNS over UDP", eth([2; 6], [4; 6], 0x0800, &ipv4(PEER_IP, OUR_IP, 17, &dns, 0))),
        ("ARP", eth([0xff; 6], [4; 6], 0x0806, &[0u8; 28])),
        ("IPv6", eth([2; 6], [4; 6], 0x86dd, &[0x60u8; 60])),
        ("VXLAN to another port", to_port_4789),
        ("VXLAN to another address", fix_outer_checksum(to_other_host)),
        ("wrong VNI", vxlan_frame(PEER_IP, 2, OUR_MAC, &inner)),
        ("wrong inner MAC", vxlan_frame(PEER_IP, 1, [0x02, 0x99, 0, 0, 0, 9], &inner)),
        (
            "known peer, host-bound inner",
            vxlan_frame(PEER_IP, 1, OUR_MAC, &ipv4([10, 244, 2, 2], [10, 244, 1, 0], 1, &[0; 8], 0)),
        ),
    ];
    for (what, frame) in cases {
        let (rc, out) = l.run("edgevx_decap", &frame)?;
        assert_eq!(rc, NEXT, "{what}: verdict");
        assert_eq!(out, frame, "{what}: the frame was modified");
    }
    assert_eq!(l.counter(Counter::PassNotOurs)?, 2, "wrong VNI, wrong inner MAC");
    assert_eq!(l.counter(Counter::RxHostPackets)?, 2, "another address and the host-bound frame: the kernel path");
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 0);
    Ok(())
}

#[test]
fn decap_drops_vxlan_from_unknown_sources() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0);
    assert_eq!(l.run("edgevx_decap", &vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner))?.0, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 1);
    assert_eq!(l.counter(Counter::RxFastPackets)?, 0);
    Ok(())
}

/// The same frame with a 4-byte IP option block (NOP NOP NOP EOL).
pub(crate) fn with_ip_options(frame: &[u8]) -> Vec<u8> {
    let mut f = frame[..34].to_vec();
    f[14] = 0x46;
    let len = u16::from_be_bytes([f[16], f[17]]) + 4;
    f[16..18].copy_from_slice(&len.to_be_bytes());
    f.extend([1, 1, 1, 0]);
    f.extend(&frame[34..]);
    f
}

#[test]
fn ip_options_and_fragments_do_not_bypass_the_source_check() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0);
    assert_eq!(l.run("edgevx_decap", &with_ip_options(&vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner)))?.0, TC_ACT_SHOT);
    let mut first_fragment = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner);
    first_fragment[20] = 0x20; // MF, offset 0
    assert_eq!(l.run("edgevx_decap", &first_fragment)?.0, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 2);
    // from a peer: accepted, but left to the kernel (options, or reassembly needed)
    for frame in [with_ip_options(&vxlan_frame(PEER_IP, 1, OUR_MAC, &inner)), {
        let mut f = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner);
        f[20] = 0x20;
        fix_outer_checksum(f)
    }] {
        let (rc, out) = l.run("edgevx_decap", &frame)?;
        assert_eq!((rc, out), (NEXT, frame));
    }
    assert_eq!(l.counter(Counter::RxHostPackets)?, 2);
    Ok(())
}

#[test]
fn default_mode_hands_a_local_pods_frame_to_the_vtep_ingress_byte_exact() -> Result<()> {
    let l = load(0)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0, 0, 0, 0, 0, 1, 0, 1], 0);
    let frame = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner);
    let (rc, out) = l.run("edgevx_decap", &frame)?;
    // exactly what the kernel's VXLAN receive puts on flannel.1: the inner frame
    assert_eq!(rc, TC_ACT_REDIRECT);
    assert_eq!(out, eth(OUR_MAC, PEER_MAC, 0x0800, &inner));
    assert_eq!(l.counter(Counter::RxStackPackets)?, 1);
    assert_eq!(l.counter(Counter::RxFastPackets)?, 0, "never straight into the pod by default");
    assert_eq!(l.peer()?.rx_packets, 1);
    // not a learned pod (the host itself): the kernel's VXLAN receive takes it, untouched
    let host_bound = vxlan_frame(PEER_IP, 1, OUR_MAC, &ipv4([10, 244, 2, 2], [10, 244, 1, 0], 1, &[0; 8], 0));
    assert_eq!(l.run("edgevx_decap", &host_bound)?, (NEXT, host_bound));
    assert_eq!(l.counter(Counter::RxHostPackets)?, 1);
    assert_eq!(
        l.run("edgevx_decap", &vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner))?.0,
        TC_ACT_SHOT,
        "filtering still applies"
    );
    Ok(())
}

#[test]
fn bridge_sends_a_routed_frame_for_a_learned_pod_to_its_port_unchanged() -> Result<()> {
    let l = load(0)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 6, &[0u8; 20], 0);
    let frame = eth(POD_MAC, HOST_MAC, 0x0800, &inner);
    assert_eq!(l.run("edgevx_bridge", &frame).context("a frame for the learned pod")?, (TC_ACT_REDIRECT, frame));
    assert_eq!(l.counter(Counter::BridgeToPort)?, 1);
    let cases = [
        ("another MAC than the learned pod's", eth([0x02, 0x99, 0, 0, 0, 9], HOST_MAC, 0x0800, &inner)),
        ("a pod not learned", eth(POD_MAC, HOST_MAC, 0x0800, &ipv4([10, 244, 2, 2], [10, 244, 1, 9], 6, &[0; 20], 0))),
        ("ARP", eth([0xff; 6], HOST_MAC, 0x0806, &[0u8; 28])),
        ("IPv6", eth(POD_MAC, HOST_MAC, 0x86dd, &[0x60u8; 60])),
    ];
    for (what, frame) in cases {
        assert_eq!(l.run("edgevx_bridge", &frame).context(what)?, (NEXT, frame), "{what}: the bridge forwards it");
    }
    assert_eq!(l.counter(Counter::BridgeToPort)?, 1);
    Ok(())
}

#[test]
fn inner_source_is_bound_to_the_peers_pod_cidr_unless_its_entry_exempts_it() -> Result<()> {
    let from_its_subnet = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0);
    let spoofed = ipv4([203, 0, 113, 7], [10, 244, 1, 2], 1, &[0; 8], 0);
    let our_gateway = ipv4([10, 244, 1, 0], [10, 244, 1, 2], 1, &[0; 8], 0);
    let another_peers = ipv4([10, 244, 3, 9], [10, 244, 1, 2], 1, &[0; 8], 0);
    let l = load(FLAG_BYPASS_NETFILTER)?;
    assert_eq!(l.run("edgevx_decap", &vxlan_frame(PEER_IP, 1, OUR_MAC, &from_its_subnet))?.0, TC_ACT_REDIRECT);
    for (what, inner) in [("client", &spoofed), ("our gateway", &our_gateway), ("another peer's pod", &another_peers)] {
        let frame = vxlan_frame(PEER_IP, 1, OUR_MAC, inner);
        assert_eq!(l.run("edgevx_decap", &frame)?.0, TC_ACT_SHOT, "{what}");
    }
    assert_eq!(l.counter(Counter::DropSpoofedSource)?, 3);
    // judged before the inner MAC and the VNI: a broadcast MAC or another
    // VNI does not carry a forged source past the check to the host
    for frame in [vxlan_frame(PEER_IP, 1, [0xff; 6], &spoofed), vxlan_frame(PEER_IP, 7, OUR_MAC, &spoofed)] {
        assert_eq!(l.run("edgevx_decap", &frame)?.0, TC_ACT_SHOT);
    }
    assert_eq!(l.counter(Counter::DropSpoofedSource)?, 5);
    assert_eq!(l.counter(Counter::PassNotOurs)?, 0);
    // the exempt peer forwards client sources
    let (rc, out) = l.run("edgevx_decap", &vxlan_frame(EXEMPT_IP, 1, OUR_MAC, &spoofed))?;
    assert_eq!((rc, out), (TC_ACT_REDIRECT, eth(POD_MAC, HOST_MAC, 0x0800, &spoofed)));
    assert_eq!(l.counter(Counter::DropSpoofedSource)?, 5);
    Ok(())
}

/// `frame` with byte `at` set to `value` (the outer checksum left as it was).
fn with_byte(frame: &[u8], at: usize, value: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[at] = value;
    f
}

/// `frame`'s outer IPv4 header with its checksum made right again.
pub(crate) fn fix_outer_checksum(mut f: Vec<u8>) -> Vec<u8> {
    f[24..26].copy_from_slice(&[0, 0]);
    let c = checksum(&f[14..34]);
    f[24..26].copy_from_slice(&c);
    f
}

#[test]
fn what_the_kernels_vxlan_receive_drops_is_dropped_and_counted() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0);
    let good = vxlan_frame(PEER_IP, 1, OUR_MAC, &inner);
    let cases: [(&str, Vec<u8>, Counter); 8] = [
        ("bad outer checksum", with_byte(&good, 25, good[25] ^ 0xff), Counter::DropBadChecksum),
        ("flags 0x8c", with_byte(&good, 42, 0x8c), Counter::DropBadVxlanFlags),
        ("no I flag", with_byte(&good, 42, 0), Counter::DropBadVxlanFlags),
        ("reserved byte after the VNI", with_byte(&good, 49, 0x5a), Counter::DropBadVxlanFlags),
        ("reserved bits in the flags word", with_byte(&good, 45, 1), Counter::DropBadVxlanFlags),
        ("inner TTL 0", vxlan_frame(PEER_IP, 1, OUR_MAC, &fix_inner_ttl(&inner, 0)), Counter::DropInnerTtl),
        ("inner TTL 1", vxlan_frame(PEER_IP, 1, OUR_MAC, &fix_inner_ttl(&inner, 1)), Counter::DropInnerTtl),
        (
            "inner ARP",
            {
                let mut f = good.clone();
                f[62..64].copy_from_slice(&0x0806u16.to_be_bytes());
                f
            },
            Counter::DropInnerNotIpv4,
        ),
    ];
    for (what, frame, counter) in cases {
        let before = l.counter(counter)?;
        assert_eq!(l.run("edgevx_decap", &frame)?.0, TC_ACT_SHOT, "{what}");
        assert_eq!(l.counter(counter)?, before + 1, "{what}: {counter:?}");
    }
    assert_eq!(l.counter(Counter::RxFastPackets)?, 0);
    assert_eq!(l.peer()?.rx_packets, 0, "nothing was accepted");
    assert_eq!(l.run("edgevx_decap", &good)?.0, TC_ACT_REDIRECT, "the frame itself is fine");
    Ok(())
}

/// An inner IPv4 packet with another TTL (checksum fixed).
fn fix_inner_ttl(inner: &[u8], ttl: u8) -> Vec<u8> {
    let mut p = inner.to_vec();
    p[8] = ttl;
    p[10..12].copy_from_slice(&[0, 0]);
    let c = checksum(&p[..20]);
    p[10..12].copy_from_slice(&c);
    p
}

#[test]
fn any_local_destination_is_judged_and_tiny_first_fragments_are_dropped() -> Result<()> {
    let l = load(FLAG_BYPASS_NETFILTER)?;
    let inner = ipv4([203, 0, 113, 7], [10, 244, 1, 2], 1, &[0; 8], 0);
    let stranger = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner);
    // another address the node owns, and the underlay broadcast
    for dst in [[10, 244, 1, 1], [10, 244, 1, 0], [198, 18, 0, 255], [255, 255, 255, 255]] {
        let mut f = stranger.clone();
        f[30..34].copy_from_slice(&dst);
        assert_eq!(l.run("edgevx_decap", &fix_outer_checksum(f))?.0, TC_ACT_SHOT, "to {dst:?}");
    }
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 4);
    // a first fragment with 8 or 16 bytes of UDP: the VXLAN header is in the next one
    let good = vxlan_frame(PEER_IP, 1, OUR_MAC, &ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0));
    for udp_bytes in [8, 16] {
        let mut f = good[..34 + udp_bytes].to_vec();
        f[16..18].copy_from_slice(&((20 + udp_bytes) as u16).to_be_bytes());
        f[20] = 0x20; // MF, offset 0
        assert_eq!(l.run("edgevx_decap", &fix_outer_checksum(f))?.0, TC_ACT_SHOT, "{udp_bytes} bytes of UDP");
    }
    assert_eq!(l.counter(Counter::DropShortFragment)?, 2);
    // a later fragment has no UDP header: the kernel cannot use it without the first
    let mut later = good.clone();
    later[20] = 0x00;
    later[21] = 0x03;
    let later = fix_outer_checksum(later);
    assert_eq!(l.run("edgevx_decap", &later)?, (NEXT, later));
    Ok(())
}

/// The socket-lookup guards this kernel's verifier should take do pass
/// it: the compat one everywhere, the full one from Linux 5.17 on (on an
/// older kernel the agent falls back to the compat one, as here).
#[test]
fn the_socket_lookup_guards_pass_the_verifier_where_they_should() -> Result<()> {
    let mut l = load(0)?;
    let loaded = features::load_guards(&mut l.ebpf)?;
    assert_eq!(loaded.contains(&features::GUARD), !features::before(5, 17), "{loaded:?}");
    Ok(())
}

// --- VLAN tags in the packet bytes ----------------------------------------

pub(crate) const ETH_P_8021Q: u16 = 0x8100;
pub(crate) const ETH_P_8021AD: u16 = 0x88a8;
/// The most tags the programs walk (`MAX_TAGS` in ebpf/src/tagged.rs).
pub(crate) const MAX_TAGS: usize = 8;

/// `frame` with VLAN tags between its MAC addresses and its ethertype,
/// outermost first, each a TPID and a VID (priority 5 for VID 0, as an
/// 802.1p switch tags). These are the tags TC sees in the bytes: the
/// kernel (or the NIC) moved the wire's first tag into skb metadata before
/// TC, which BPF_PROG_TEST_RUN cannot express (it refuses a context with
/// `vlan_*` set); to the program such a frame is the untagged one the
/// other tests run.
pub(crate) fn tagged(frame: &[u8], tags: &[(u16, u16)]) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    for &(tpid, vid) in tags {
        let tci = if vid == 0 { 5 << 13 } else { vid };
        f.extend(tpid.to_be_bytes());
        f.extend(tci.to_be_bytes());
    }
    f.extend(&frame[12..]);
    f
}

/// The tag stacks the kernel strips after TC, as TC sees them: both TPIDs
/// in every order, VID 0 and others, up to [`MAX_TAGS`].
pub(crate) fn tag_stacks() -> Vec<Vec<(u16, u16)>> {
    let (q, ad) = (ETH_P_8021Q, ETH_P_8021AD);
    let mut stacks = vec![
        vec![(q, 0)],
        vec![(ad, 0)],
        vec![(q, 0), (q, 0)],
        vec![(ad, 0), (q, 0)],
        vec![(q, 0), (ad, 0)],
        vec![(ad, 0), (ad, 0)],
        vec![(q, 100)],
        vec![(ad, 100), (q, 4095)],
        vec![(q, 0), (ad, 0), (q, 0)],
    ];
    stacks.push((0..MAX_TAGS).map(|i| if i % 3 == 1 { (ad, i as u16) } else { (q, 0) }).collect());
    stacks
}

/// What one run of a program did.
pub(crate) struct Outcome {
    pub(crate) verdict: u32,
    pub(crate) out: Vec<u8>,
    /// The global counters that moved, and by how much.
    pub(crate) moved: Vec<(Counter, u64)>,
}

/// Runs `prog` on `input` and reports what it did.
pub(crate) fn run_counted(l: &Loaded, prog: &str, input: &[u8]) -> Result<Outcome> {
    let all = |l: &Loaded| Counter::ALL.iter().map(|c| l.counter(*c)).collect::<Result<Vec<_>>>();
    let before = all(l)?;
    let (verdict, out) = l.run(prog, input)?;
    let after = all(l)?;
    let moved = Counter::ALL.iter().zip(after.iter().zip(before)).filter(|(_, (a, b))| **a != *b);
    Ok(Outcome { verdict, out, moved: moved.map(|(c, (a, b))| (*c, a - b)).collect() })
}

/// Asserts that `prog` drops `frame` and counts it as tagged VXLAN, and nothing else.
pub(crate) fn assert_dropped_as_tagged(l: &Loaded, prog: &str, what: &str, frame: &[u8]) -> Result<()> {
    let o = run_counted(l, prog, frame).with_context(|| format!("{prog}: {what}"))?;
    assert_eq!((o.verdict, o.moved), (TC_ACT_SHOT, vec![(Counter::DropVxlanTagged, 1)]), "{prog}: {what}");
    Ok(())
}

/// Asserts that `prog` leaves `frame` alone: not changed, nothing counted.
pub(crate) fn assert_untouched(l: &Loaded, prog: &str, what: &str, frame: &[u8]) -> Result<()> {
    let o = run_counted(l, prog, frame).with_context(|| format!("{prog}: {what}"))?;
    assert_eq!((o.verdict, o.moved), (NEXT, vec![]), "{prog}: {what}");
    assert_eq!(o.out, frame, "{prog}: {what}: the frame was modified");
    Ok(())
}

/// The programs that judge what reaches a VXLAN socket: decap on the
/// underlay, the pod guard on the pod bridge.
pub(crate) const JUDGES: [&str; 2] = ["edgevx_decap", "edgevx_pod_guard"];

/// Pod 10.244.1.2's VXLAN to a peer node, as it reaches the pod bridge.
fn pod_vxlan(inner: &[u8]) -> Vec<u8> {
    vxlan_frame_to([10, 244, 1, 2], PEER_IP, 1, PEER_MAC, inner)
}

#[test]
fn vxlan_behind_vlan_tags_is_dropped_by_decap_and_the_pod_guard() -> Result<()> {
    let l = load(0)?;
    let from_peer = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 8], 0);
    let forged = ipv4([203, 0, 113, 7], [10, 244, 1, 2], 1, &[0; 8], 0);
    let mut first_fragment = vxlan_frame(PEER_IP, 1, OUR_MAC, &forged);
    first_fragment[20] = 0x20; // MF, offset 0
    let frames = [
        ("a stranger", vxlan_frame(STRANGER_IP, 1, OUR_MAC, &from_peer)),
        ("a spoofed peer with a forged inner source", vxlan_frame(PEER_IP, 1, OUR_MAC, &forged)),
        ("a forged inner source to the broadcast", vxlan_frame_to(PEER_IP, [198, 18, 0, 255], 7, [0xff; 6], &forged)),
        ("a forged inner source behind IP options", with_ip_options(&vxlan_frame(PEER_IP, 1, OUR_MAC, &forged))),
        ("a first fragment with a forged inner source", fix_outer_checksum(first_fragment)),
        // the cost of the rule: a peer's own tagged VXLAN goes too
        ("the exempt peer", vxlan_frame(EXEMPT_IP, 1, OUR_MAC, &forged)),
        ("a peer's own frame", vxlan_frame(PEER_IP, 1, OUR_MAC, &from_peer)),
        ("a pod's, to a peer node", pod_vxlan(&forged)),
        (
            "UDP to the VXLAN port that is not VXLAN",
            eth([2; 6], [4; 6], 0x0800, &ipv4(STRANGER_IP, OUR_IP, 17, &[0x9c, 0x40, 0x21, 0x18, 0, 8, 0, 0], 0)),
        ),
    ];
    for prog in JUDGES {
        for (what, frame) in &frames {
            for stack in tag_stacks() {
                assert_dropped_as_tagged(&l, prog, &format!("{what} behind {stack:x?}"), &tagged(frame, &stack))?;
            }
        }
    }
    Ok(())
}

#[test]
fn more_tags_than_are_walked_are_dropped_whatever_they_carry() -> Result<()> {
    let l = load(0)?;
    let nine: Vec<_> = (0..=MAX_TAGS).map(|i| (if i % 2 == 0 { ETH_P_8021Q } else { ETH_P_8021AD }, 0)).collect();
    let carried = [
        ("ARP", eth([0xff; 6], [4; 6], 0x0806, &[0u8; 28])),
        ("VXLAN from a stranger", vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner_icmp([10, 244, 1, 2]))),
    ];
    for prog in JUDGES {
        for (what, frame) in &carried {
            assert_dropped_as_tagged(&l, prog, &format!("{what} behind nine tags"), &tagged(frame, &nine))?;
        }
    }
    Ok(())
}

#[test]
fn tagged_frames_that_are_not_vxlan_pass_untouched() -> Result<()> {
    let l = load(0)?;
    let inner = ipv4([203, 0, 113, 7], [10, 244, 1, 2], 1, &[0; 8], 0);
    let mut tcp = vec![0x9c, 0x40, 0x21, 0x18];
    tcp.extend([0u8; 16]);
    let mut dns = vec![0x9c, 0x40, 0x00, 0x35, 0x00, 0x10, 0, 0];
    dns.extend([1u8; 8]);
    let mut to_port_4789 = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner);
    to_port_4789[36..38].copy_from_slice(&4789u16.to_be_bytes());
    let mut later_fragment = vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner);
    later_fragment[21] = 0x03;
    let cases = [
        ("ARP", eth([0xff; 6], [4; 6], 0x0806, &[0u8; 28])),
        ("TCP to the VXLAN port", eth([2; 6], [4; 6], 0x0800, &ipv4(STRANGER_IP, OUR_IP, 6, &tcp, 0))),
        ("DNS over UDP", eth([2; 6], [4; 6], 0x0800, &ipv4(PEER_IP, OUR_IP, 17, &dns, 0))),
        ("VXLAN to another port", fix_outer_checksum(to_port_4789)),
        // no UDP header in it: useless without the first fragment
        ("a later fragment", fix_outer_checksum(later_fragment)),
        ("a pod's ping", eth(HOST_MAC, POD_MAC, 0x0800, &inner_icmp([10, 244, 2, 2]))),
    ];
    for prog in JUDGES {
        for (what, frame) in &cases {
            for stack in tag_stacks() {
                assert_untouched(&l, prog, &format!("{what} behind {stack:x?}"), &tagged(frame, &stack))?;
            }
        }
        // cut inside its tags: the kernel's untagging drops it
        let cut = tagged(&eth([2; 6], [4; 6], 0x0800, &[0x45; 40]), &[(ETH_P_8021Q, 0); 16]);
        assert_untouched(&l, prog, "a frame cut inside its tags", &cut[..40])?;
        // the next tag's TPID is one the kernel does not strip
        let other_tpid = tagged(&vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner), &[(ETH_P_8021Q, 0), (0x9100, 0)]);
        assert_untouched(&l, prog, "VXLAN behind a 0x9100 tag", &other_tpid)?;
    }
    Ok(())
}

/// The pod guard on untagged frames: a pod's VXLAN to any node dropped,
/// everything else left to the bridge.
#[test]
fn the_pod_guard_drops_a_pods_vxlan_and_nothing_else() -> Result<()> {
    let l = load(0)?;
    let inner = inner_icmp([10, 244, 2, 2]);
    let dropped = [
        ("to a peer node", pod_vxlan(&inner)),
        ("to its own node", vxlan_frame_to([10, 244, 1, 2], OUR_IP, 1, OUR_MAC, &inner)),
        ("with IP options", with_ip_options(&pod_vxlan(&inner))),
    ];
    for (what, frame) in dropped {
        let o = run_counted(&l, "edgevx_pod_guard", &frame)?;
        assert_eq!((o.verdict, o.moved), (TC_ACT_SHOT, vec![(Counter::DropPodVxlan, 1)]), "{what}");
    }
    let mut later_fragment = pod_vxlan(&inner);
    later_fragment[21] = 0x03;
    let mut to_port_4789 = pod_vxlan(&inner);
    to_port_4789[36..38].copy_from_slice(&4789u16.to_be_bytes());
    let passed = [
        ("a ping", eth(HOST_MAC, POD_MAC, 0x0800, &inner)),
        ("ARP", eth([0xff; 6], POD_MAC, 0x0806, &[0u8; 28])),
        ("VXLAN to another port", fix_outer_checksum(to_port_4789)),
        ("a later fragment", fix_outer_checksum(later_fragment)),
    ];
    for (what, frame) in passed {
        assert_untouched(&l, "edgevx_pod_guard", what, &frame)?;
    }
    Ok(())
}
