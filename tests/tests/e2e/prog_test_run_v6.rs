//! The IPv6 underlay's protection, run with BPF_PROG_TEST_RUN: decap's
//! judge of IPv6 VXLAN (which never changes a frame: the kernel's
//! `flannel-v6.<VNI>` decapsulates what it lets through) on frames written
//! out here by hand as a kernel flannel-v6 peer sends them, and the
//! socket-lookup guard on lookup contexts of both families.
use std::{
    net::Ipv6Addr,
    os::fd::{AsFd, AsRawFd},
};

use anyhow::{Context, Result, bail};
use aya::maps::{Array, HashMap};
use edgevx_common::{
    counters::Counter,
    maps::{self as names, ACCEPT_ANY_INNER_SOURCE, DataplaneConfig, PeerAccept6},
};

use crate::prog_test_run::{
    EXEMPT_IP, JUDGES, Loaded, NEXT, OUR_IP, PEER_IP, PEER_MAC, STRANGER_IP, TC_ACT_SHOT, assert_dropped_as_tagged,
    assert_untouched, checksum, eth, ipv4, load, tag_stacks, tagged,
};

pub(crate) fn v6(s: &str) -> [u8; 16] {
    s.parse::<Ipv6Addr>().map(|a| a.octets()).unwrap_or_else(|e| panic!("{s}: {e}"))
}

pub(crate) const OUR_IP6: &str = "fd00:198:18::1";
pub(crate) const PEER_IP6: &str = "fd00:198:18::2";
/// A peer whose entry says it may carry any inner source.
const EXEMPT_IP6: &str = "fd00:198:18::3";
pub(crate) const STRANGER_IP6: &str = "fd00:198:18::66";
/// flannel-v6's own MAC: the inner destination of what peers send us.
const OUR_MAC6: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 0x61];
pub(crate) const POD6: &str = "fd00:10:244:1::2";
/// Inside the peer's pod subnet (fd00:10:244:2::/64).
const PEER_POD6: &str = "fd00:10:244:2::2";

const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_DSTOPTS: u8 = 60;
/// Where the VXLAN header starts in an IPv6 VXLAN frame (14 + 40 + 8).
const VXLAN_AT: usize = 62;

/// The v4 fixture of prog_test_run.rs with IPv6 on: our public IPv6 in
/// the config, and two IPv6 peers accepted.
pub(crate) fn load6(flags: u32) -> Result<Loaded> {
    let mut l = load(flags)?;
    set_public_ip6(&mut l, v6(OUR_IP6))?;
    let mut accept: HashMap<_, [u8; 16], PeerAccept6> =
        HashMap::try_from(l.ebpf.map_mut(names::PEER_ACCEPT6).context("accept6")?)?;
    let entry = |subnet: &str, flags| PeerAccept6 { pod_subnet: v6(subnet), prefix_len: 64, flags, _pad: [0; 2] };
    accept.insert(&v6(PEER_IP6), &entry("fd00:10:244:2::", 0), 0)?;
    accept.insert(&v6(EXEMPT_IP6), &entry("fd00:10:244:3::", ACCEPT_ANY_INNER_SOURCE), 0)?;
    Ok(l)
}

fn edit_config(l: &mut Loaded, edit: impl FnOnce(&mut DataplaneConfig)) -> Result<()> {
    let mut config: Array<_, DataplaneConfig> = Array::try_from(l.ebpf.map_mut(names::CONFIG).context("config")?)?;
    let mut c = config.get(&0, 0)?;
    edit(&mut c);
    config.set(0, &c, 0)?;
    Ok(())
}

fn set_public_ip6(l: &mut Loaded, ip: [u8; 16]) -> Result<()> {
    edit_config(l, |c| c.public_ip6 = ip)
}

pub(crate) fn set_underlay(l: &mut Loaded, ifindex: u32) -> Result<()> {
    edit_config(l, |c| c.underlay_ifindex = ifindex)
}

/// An IPv6 packet with hop limit 64 and no extension headers unless
/// `payload` starts with them.
fn ipv6(src: [u8; 16], dst: [u8; 16], next_header: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0];
    p.extend((payload.len() as u16).to_be_bytes());
    p.extend([next_header, 64]);
    p.extend(src);
    p.extend(dst);
    p.extend(payload);
    p
}

/// UDP over IPv6 with its checksum, as a kernel vxlan device in flannel's
/// `noudp6zerocsumtx` mode sends it (RFC 8200 8.1 pseudo-header).
fn udp6(src: [u8; 16], dst: [u8; 16], dport: u16, payload: &[u8]) -> Vec<u8> {
    let len = (8 + payload.len()) as u16;
    let mut udp = Vec::new();
    udp.extend(40000u16.to_be_bytes());
    udp.extend(dport.to_be_bytes());
    udp.extend(len.to_be_bytes());
    udp.extend([0, 0]);
    udp.extend(payload);
    let mut pseudo = Vec::new();
    pseudo.extend(src);
    pseudo.extend(dst);
    pseudo.extend((len as u32).to_be_bytes());
    pseudo.extend([0, 0, 0, IPPROTO_UDP]);
    pseudo.extend(&udp);
    let c = match checksum(&pseudo) {
        [0, 0] => [0xff, 0xff],
        c => c,
    };
    udp[6..8].copy_from_slice(&c);
    udp
}

/// An ICMPv6 echo request from `src` to `dst` (the judge reads no further
/// than the inner source).
pub(crate) fn inner_echo6(src: &str, dst: &str) -> Vec<u8> {
    let mut icmp = vec![128, 0, 0, 0, 0, 1, 0, 1];
    icmp.extend([0x5a; 24]);
    ipv6(v6(src), v6(dst), IPPROTO_ICMPV6, &icmp)
}

/// The VXLAN header: I flag and `vni`.
fn vxlan_header(vni: u32) -> [u8; 8] {
    let v = (vni << 8).to_be_bytes();
    [0x08, 0, 0, 0, v[0], v[1], v[2], v[3]]
}

/// What a flannel-v6 peer at `src` puts on the wire to `dst` port `dport`
/// for the inner frame `inner_ethertype` + `inner`.
fn frame6(src: &str, dst: &str, dport: u16, vxlan: [u8; 8], inner_ethertype: u16, inner: &[u8]) -> Vec<u8> {
    let mut payload = vxlan.to_vec();
    payload.extend(eth(OUR_MAC6, PEER_MAC, inner_ethertype, inner));
    let udp = udp6(v6(src), v6(dst), dport, &payload);
    eth([0x02, 0xee, 0, 0, 0, 1], [0x02, 0xee, 0, 0, 0, 2], ETH_P_IPV6, &ipv6(v6(src), v6(dst), IPPROTO_UDP, &udp))
}

/// The usual case: inner IPv6 `inner` from `src` to our public IPv6, VNI `vni`.
pub(crate) fn vxlan6(src: &str, vni: u32, inner: &[u8]) -> Vec<u8> {
    frame6(src, OUR_IP6, 8472, vxlan_header(vni), ETH_P_IPV6, inner)
}

/// `frame` with byte `at` set to `value` (a VXLAN header byte: the judge
/// does not verify the UDP checksum, nor does anything before the socket).
fn with_byte(frame: &[u8], at: usize, value: u8) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[at] = value;
    f
}

/// Runs decap and checks the frame came back unchanged, returning the verdict.
fn judge(l: &Loaded, what: &str, frame: &[u8]) -> Result<u32> {
    let (rc, out) = l.run("edgevx_decap", frame).with_context(|| what.to_string())?;
    assert_eq!(out, frame, "{what}: the frame was modified");
    Ok(rc)
}

/// The counters the judge moves, to show what did not move.
const JUDGE_COUNTERS: [Counter; 9] = [
    Counter::DropUnknownPeer,
    Counter::DropShortFragment,
    Counter::DropLongExtChain,
    Counter::DropInnerNotIpv6,
    Counter::DropBadVxlanFlags,
    Counter::DropSpoofedSource,
    Counter::PassNotOurs,
    Counter::RxHostPackets,
    Counter::DropInnerNotIpv4,
];

fn counters(l: &Loaded) -> Result<Vec<u64>> {
    JUDGE_COUNTERS.iter().map(|c| l.counter(*c)).collect()
}

#[test]
fn judge6_passes_a_peers_vxlan_to_the_kernel_unmodified() -> Result<()> {
    let l = load6(0)?;
    let frame = vxlan6(PEER_IP6, 1, &inner_echo6(PEER_POD6, POD6));
    assert_eq!(judge(&l, "a peer's echo", &frame)?, NEXT);
    assert_eq!(l.counter(Counter::RxHostPackets)?, 1);
    // UDP + VXLAN headers are not counted as inner bytes
    assert_eq!(l.counter(Counter::RxHostBytes)?, (frame.len() - 14 - 40 - 16) as u64);
    // the exempt peer forwards a client's source
    let client = vxlan6(EXEMPT_IP6, 1, &inner_echo6("2001:db8::7", POD6));
    assert_eq!(judge(&l, "the exempt peer's client", &client)?, NEXT);
    assert_eq!(l.counter(Counter::RxHostPackets)?, 2);
    assert_eq!(l.counter(Counter::DropSpoofedSource)?, 0);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 0);
    Ok(())
}

#[test]
fn judge6_drops_a_strangers_vxlan_to_any_address_of_ours() -> Result<()> {
    let l = load6(0)?;
    let inner = inner_echo6(PEER_POD6, POD6);
    // our public IPv6, another address the node holds, its link-local, all nodes
    for dst in [OUR_IP6, "fd00:10:244:1::", "fe80::1", "ff02::1"] {
        let frame = frame6(STRANGER_IP6, dst, 8472, vxlan_header(1), ETH_P_IPV6, &inner);
        assert_eq!(judge(&l, &format!("to {dst}"), &frame)?, TC_ACT_SHOT, "to {dst}");
    }
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 4);
    // a v4 peer's address in its IPv6 form is no IPv6 peer
    let mapped = frame6("::ffff:198.18.0.2", OUR_IP6, 8472, vxlan_header(1), ETH_P_IPV6, &inner);
    assert_eq!(judge(&l, "a v4-mapped peer address", &mapped)?, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropUnknownPeer)?, 5);
    assert_eq!(l.counter(Counter::RxHostPackets)?, 0);
    Ok(())
}

#[test]
fn judge6_binds_the_inner_source_to_the_peers_ipv6_pod_cidr() -> Result<()> {
    let l = load6(0)?;
    let forged = [
        ("a client", "2001:db8::7"),
        ("our own pod", POD6),
        ("another peer's pod", "fd00:10:244:3::9"),
        ("a link-local address", "fe80::1"),
    ];
    for (what, src) in forged {
        let frame = vxlan6(PEER_IP6, 1, &inner_echo6(src, POD6));
        assert_eq!(judge(&l, what, &frame)?, TC_ACT_SHOT, "{what}");
    }
    assert_eq!(l.counter(Counter::DropSpoofedSource)?, 4);
    // judged before the VNI: another VNI does not carry a forged source past it
    let other_vni = vxlan6(PEER_IP6, 7, &inner_echo6("2001:db8::7", POD6));
    assert_eq!(judge(&l, "a forged source on another VNI", &other_vni)?, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropSpoofedSource)?, 5);
    assert_eq!(l.counter(Counter::PassNotOurs)?, 0);
    assert_eq!(l.counter(Counter::RxHostPackets)?, 0);
    Ok(())
}

#[test]
fn judge6_refuses_what_flannel_never_sends_over_the_ipv6_tunnel() -> Result<()> {
    let l = load6(0)?;
    let v4_inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 40], 0);
    let cases = [
        // flannel's IPv4 pods go over flannel.<VNI>, never over flannel-v6
        ("inner IPv4", frame6(PEER_IP6, OUR_IP6, 8472, vxlan_header(1), 0x0800, &v4_inner)),
        ("inner ARP", frame6(PEER_IP6, OUR_IP6, 8472, vxlan_header(1), 0x0806, &[0u8; 40])),
        ("an IPv4 header marked IPv6", frame6(PEER_IP6, OUR_IP6, 8472, vxlan_header(1), ETH_P_IPV6, &v4_inner)),
        ("a truncated inner header", vxlan6(PEER_IP6, 1, &inner_echo6(PEER_POD6, POD6)[..24])),
        ("the VXLAN header alone", frame6(PEER_IP6, OUR_IP6, 8472, vxlan_header(1), ETH_P_IPV6, &[])[..70].to_vec()),
    ];
    for (what, frame) in cases {
        let before = l.counter(Counter::DropInnerNotIpv6)?;
        assert_eq!(judge(&l, what, &frame)?, TC_ACT_SHOT, "{what}");
        assert_eq!(l.counter(Counter::DropInnerNotIpv6)?, before + 1, "{what}");
    }
    // an inner IPv4 frame from the exempt peer is no less IPv4
    let exempt = frame6(EXEMPT_IP6, OUR_IP6, 8472, vxlan_header(1), 0x0800, &v4_inner);
    assert_eq!(judge(&l, "inner IPv4 from the exempt peer", &exempt)?, TC_ACT_SHOT);
    assert_eq!(l.counter(Counter::DropInnerNotIpv6)?, 6);
    assert_eq!(l.counter(Counter::DropInnerNotIpv4)?, 0, "the v4 counter is decap's v4 path's");
    Ok(())
}

#[test]
fn judge6_gives_bad_vxlan_headers_and_other_vnis_the_v4_verdicts() -> Result<()> {
    let l = load6(0)?;
    let good = vxlan6(PEER_IP6, 1, &inner_echo6(PEER_POD6, POD6));
    let bad_flags = [
        ("flags 0x8c", with_byte(&good, VXLAN_AT, 0x8c)),
        ("no I flag", with_byte(&good, VXLAN_AT, 0)),
        ("reserved byte after the VNI", with_byte(&good, VXLAN_AT + 7, 0x5a)),
        ("reserved bits in the flags word", with_byte(&good, VXLAN_AT + 3, 1)),
    ];
    for (what, frame) in bad_flags {
        assert_eq!(judge(&l, what, &frame)?, TC_ACT_SHOT, "{what}");
    }
    assert_eq!(l.counter(Counter::DropBadVxlanFlags)?, 4);
    // another VNI is judged, then left to whichever device owns it, as decap does for v4
    let other_vni = vxlan6(PEER_IP6, 2, &inner_echo6(PEER_POD6, POD6));
    assert_eq!(judge(&l, "VNI 2", &other_vni)?, NEXT);
    assert_eq!(l.counter(Counter::PassNotOurs)?, 1);
    assert_eq!(l.counter(Counter::RxHostPackets)?, 0);
    assert_eq!(judge(&l, "the frame itself", &good)?, NEXT);
    assert_eq!(l.counter(Counter::RxHostPackets)?, 1);
    Ok(())
}

/// The UDP datagram a flannel-v6 peer at `src` sends us for `inner`
/// (inner IPv6) with the VXLAN header `vxlan`, to `dport`.
fn vxlan_udp(src: &str, dport: u16, vxlan: [u8; 8], inner: &[u8]) -> Vec<u8> {
    let mut payload = vxlan.to_vec();
    payload.extend(eth(OUR_MAC6, PEER_MAC, ETH_P_IPV6, inner));
    udp6(v6(src), v6(OUR_IP6), dport, &payload)
}

/// An IPv6 frame from `src` to us whose payload is `chain` (extension
/// headers, each `(kind, bytes)`, the first byte of each naming the next)
/// and then `upper` of protocol `upper_proto`.
fn with_chain(src: &str, chain: &[(u8, Vec<u8>)], upper_proto: u8, upper: &[u8]) -> Vec<u8> {
    let mut payload = Vec::new();
    for (i, (_, bytes)) in chain.iter().enumerate() {
        let mut h = bytes.clone();
        h[0] = chain.get(i + 1).map_or(upper_proto, |(kind, _)| *kind);
        payload.extend(h);
    }
    payload.extend(upper);
    let first = chain.first().map_or(upper_proto, |(kind, _)| *kind);
    eth([2; 6], [4; 6], ETH_P_IPV6, &ipv6(v6(src), v6(OUR_IP6), first, &payload))
}

/// Hop-by-hop or destination options holding one PadN option (8 bytes).
fn options(kind: u8) -> (u8, Vec<u8>) {
    (kind, vec![0, 0, 1, 4, 0, 0, 0, 0])
}

/// Destination options of 24 bytes (length field 2).
fn long_options() -> (u8, Vec<u8>) {
    let mut h = vec![0, 2, 1, 20];
    h.extend([0u8; 20]);
    (IPPROTO_DSTOPTS, h)
}

/// A fragment header: offset in 8-byte units, more fragments or not.
fn fragment(offset: u16, more: bool) -> (u8, Vec<u8>) {
    let word = (offset << 3) | more as u16;
    let w = word.to_be_bytes();
    (IPPROTO_FRAGMENT, vec![0, 0, w[0], w[1], 0, 0, 0x42, 0x42])
}

/// An empty type-4 routing header (segments left 0).
fn routing() -> (u8, Vec<u8>) {
    (IPPROTO_ROUTING, vec![0, 0, 4, 0, 0, 0, 0, 0])
}

#[test]
fn judge6_leaves_a_strangers_extension_headers_and_what_is_not_vxlan_untouched() -> Result<()> {
    let l = load6(0)?;
    let udp = vxlan_udp(STRANGER_IP6, 8472, vxlan_header(1), &inner_echo6("2001:db8::7", POD6));
    let mut tcp = vec![0x9c, 0x40, 0x21, 0x18];
    tcp.extend([0u8; 16]);
    let plain = |next, payload: &[u8]| with_chain(STRANGER_IP6, &[], next, payload);
    let cases = [
        // the socket-lookup guard refuses these after the kernel walked the headers
        (
            "a stranger's hop-by-hop options header",
            with_chain(STRANGER_IP6, &[options(IPPROTO_HOPOPTS)], IPPROTO_UDP, &udp),
        ),
        ("a stranger's atomic fragment", with_chain(STRANGER_IP6, &[fragment(0, false)], IPPROTO_UDP, &udp)),
        ("a stranger's first fragment", with_chain(STRANGER_IP6, &[fragment(0, true)], IPPROTO_UDP, &udp[..16])),
        ("TCP to the VXLAN port", plain(IPPROTO_TCP, &tcp)),
        ("ICMPv6", plain(IPPROTO_ICMPV6, &[128, 0, 0, 0, 0, 1, 0, 1])),
        ("VXLAN to another port", frame6(STRANGER_IP6, OUR_IP6, 4789, vxlan_header(1), ETH_P_IPV6, &[0u8; 40])),
        (
            "a version-4 header in an IPv6 frame",
            eth([2; 6], [4; 6], ETH_P_IPV6, &ipv4(STRANGER_IP, OUR_IP, 17, &udp, 0)),
        ),
        // (a frame shorter than an IPv6 header is refused by BPF_PROG_TEST_RUN itself)
        ("a truncated UDP header", plain(IPPROTO_UDP, &udp[..2])),
        // from a peer: walked, and found not to be VXLAN for us
        ("a peer's TCP behind options", with_chain(PEER_IP6, &[options(IPPROTO_DSTOPTS)], IPPROTO_TCP, &tcp)),
        (
            "a peer's UDP to another port behind options",
            with_chain(
                PEER_IP6,
                &[options(IPPROTO_HOPOPTS)],
                IPPROTO_UDP,
                &vxlan_udp(PEER_IP6, 4789, vxlan_header(1), &[0; 40]),
            ),
        ),
        ("a peer's later fragment", with_chain(PEER_IP6, &[fragment(3, false)], IPPROTO_UDP, &udp)),
        (
            "a peer's middle fragment",
            with_chain(PEER_IP6, &[options(IPPROTO_HOPOPTS), fragment(3, true)], IPPROTO_UDP, &udp),
        ),
    ];
    for (what, frame) in cases {
        assert_eq!(judge(&l, what, &frame)?, NEXT, "{what}");
    }
    assert_eq!(counters(&l)?, vec![0; JUDGE_COUNTERS.len()], "nothing was judged");
    Ok(())
}

#[test]
fn judge6_walks_a_peers_extension_headers_and_judges_what_follows() -> Result<()> {
    let l = load6(0)?;
    let good = vxlan_udp(PEER_IP6, 8472, vxlan_header(1), &inner_echo6(PEER_POD6, POD6));
    let forged = vxlan_udp(PEER_IP6, 8472, vxlan_header(1), &inner_echo6("2001:db8::7", POD6));
    let four = [options(IPPROTO_HOPOPTS), long_options(), routing(), fragment(0, false)];
    let passed = [
        ("hop-by-hop options", vec![options(IPPROTO_HOPOPTS)]),
        ("an atomic fragment", vec![fragment(0, false)]),
        ("a first fragment that holds the headers", vec![fragment(0, true)]),
        ("four extension headers", four.to_vec()),
    ];
    for (what, chain) in &passed {
        assert_eq!(judge(&l, what, &with_chain(PEER_IP6, chain, IPPROTO_UDP, &good))?, NEXT, "{what}");
    }
    assert_eq!(l.counter(Counter::RxHostPackets)?, passed.len() as u64);
    let refused = [
        (
            "a forged source behind hop-by-hop options",
            vec![options(IPPROTO_HOPOPTS)],
            &forged,
            Counter::DropSpoofedSource,
        ),
        ("a forged source behind 24 bytes of options", vec![long_options()], &forged, Counter::DropSpoofedSource),
        ("a forged source in an atomic fragment", vec![fragment(0, false)], &forged, Counter::DropSpoofedSource),
        ("a forged source in a first fragment", vec![fragment(0, true)], &forged, Counter::DropSpoofedSource),
        ("a forged source behind four headers", four.to_vec(), &forged, Counter::DropSpoofedSource),
        (
            "bad VXLAN flags behind a routing header",
            vec![routing()],
            &with_byte(&good, 8, 0x8c),
            Counter::DropBadVxlanFlags,
        ),
        (
            "a first fragment holding 16 bytes of UDP",
            vec![fragment(0, true)],
            &good[..16].to_vec(),
            Counter::DropShortFragment,
        ),
        (
            "five extension headers",
            vec![options(IPPROTO_HOPOPTS), options(IPPROTO_DSTOPTS), routing(), long_options(), fragment(0, false)],
            &good,
            Counter::DropLongExtChain,
        ),
    ];
    for (what, chain, udp, counter) in refused {
        let before = l.counter(counter)?;
        assert_eq!(judge(&l, what, &with_chain(PEER_IP6, &chain, IPPROTO_UDP, udp))?, TC_ACT_SHOT, "{what}");
        assert_eq!(l.counter(counter)?, before + 1, "{what}: {counter:?}");
    }
    assert_eq!(l.counter(Counter::RxHostPackets)?, passed.len() as u64, "nothing refused was passed");
    Ok(())
}

#[test]
fn with_ipv6_off_every_ipv6_frame_passes_untouched() -> Result<()> {
    let l = load(0)?; // the v4 fixture: public_ip6 all zero
    let v4_inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0; 40], 0);
    let cases = [
        ("a stranger", vxlan6(STRANGER_IP6, 1, &inner_echo6(PEER_POD6, POD6))),
        ("a forged inner source", vxlan6(PEER_IP6, 1, &inner_echo6("2001:db8::7", POD6))),
        ("inner IPv4", frame6(PEER_IP6, OUR_IP6, 8472, vxlan_header(1), 0x0800, &v4_inner)),
        ("bad flags", with_byte(&vxlan6(STRANGER_IP6, 1, &inner_echo6(PEER_POD6, POD6)), VXLAN_AT, 0)),
    ];
    for (what, frame) in cases {
        assert_eq!(judge(&l, what, &frame)?, NEXT, "{what}");
    }
    assert_eq!(counters(&l)?, vec![0; JUDGE_COUNTERS.len()], "nothing was judged");
    Ok(())
}

#[test]
fn ipv4_decap_is_the_same_with_ipv6_on() -> Result<()> {
    use crate::prog_test_run::{OUR_MAC, TC_ACT_REDIRECT, vxlan_frame};
    let inner = ipv4([10, 244, 2, 2], [10, 244, 1, 2], 1, &[0, 0, 0, 0, 0, 1, 0, 1], 0);
    let frames = [
        vxlan_frame(PEER_IP, 1, OUR_MAC, &inner),
        vxlan_frame(STRANGER_IP, 1, OUR_MAC, &inner),
        vxlan_frame(EXEMPT_IP, 1, OUR_MAC, &ipv4([203, 0, 113, 7], [10, 244, 1, 2], 1, &[0; 8], 0)),
        vxlan_frame(PEER_IP, 1, OUR_MAC, &ipv4([203, 0, 113, 7], [10, 244, 1, 2], 1, &[0; 8], 0)),
    ];
    let (off, on) = (load(0)?, load6(0)?);
    for frame in &frames {
        assert_eq!(off.run("edgevx_decap", frame)?, on.run("edgevx_decap", frame)?);
    }
    assert_eq!(on.run("edgevx_decap", &frames[0])?.0, TC_ACT_REDIRECT);
    Ok(())
}

// --- VLAN tags in the packet bytes -----------------------------------------

/// IPv6 VXLAN behind tags TC sees in the bytes (see `tagged` in
/// prog_test_run.rs): dropped by decap and the pod guard, whoever sends
/// it, with IPv6 on or off, behind extension headers too.
#[test]
fn ipv6_vxlan_behind_vlan_tags_is_dropped_by_decap_and_the_pod_guard() -> Result<()> {
    let stranger = vxlan_udp(STRANGER_IP6, 8472, vxlan_header(1), &inner_echo6(PEER_POD6, POD6));
    let forged = vxlan_udp(PEER_IP6, 8472, vxlan_header(1), &inner_echo6("2001:db8::7", POD6));
    let five = [options(IPPROTO_HOPOPTS), options(IPPROTO_DSTOPTS), routing(), long_options(), fragment(0, false)];
    let frames = [
        ("a stranger", vxlan6(STRANGER_IP6, 1, &inner_echo6(PEER_POD6, POD6))),
        ("a spoofed peer with a forged inner source", vxlan6(PEER_IP6, 1, &inner_echo6("2001:db8::7", POD6))),
        (
            "a forged inner source to all nodes",
            frame6(PEER_IP6, "ff02::1", 8472, vxlan_header(7), ETH_P_IPV6, &[0; 40]),
        ),
        (
            "a stranger behind hop-by-hop options",
            with_chain(STRANGER_IP6, &[options(IPPROTO_HOPOPTS)], IPPROTO_UDP, &stranger),
        ),
        ("a forged source in a first fragment", with_chain(PEER_IP6, &[fragment(0, true)], IPPROTO_UDP, &forged)),
        ("a forged source behind five extension headers", with_chain(PEER_IP6, &five, IPPROTO_UDP, &forged)),
        ("a stranger's five extension headers, then TCP", with_chain(STRANGER_IP6, &five, IPPROTO_TCP, &[0; 20])),
        // the cost of the rule: a peer's own tagged VXLAN goes too
        ("the exempt peer", vxlan6(EXEMPT_IP6, 1, &inner_echo6("2001:db8::7", POD6))),
        (
            "a pod's, to a peer node",
            frame6(POD6, PEER_IP6, 8472, vxlan_header(1), ETH_P_IPV6, &inner_echo6(POD6, PEER_POD6)),
        ),
    ];
    for (ipv6, l) in [("IPv6 on", load6(0)?), ("IPv6 off", load(0)?)] {
        for prog in JUDGES {
            for (what, frame) in &frames {
                for stack in tag_stacks() {
                    let what = format!("{ipv6}: {what} behind {stack:x?}");
                    assert_dropped_as_tagged(&l, prog, &what, &tagged(frame, &stack))?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn tagged_ipv6_that_is_not_vxlan_passes_untouched() -> Result<()> {
    let l = load6(0)?;
    let udp = vxlan_udp(STRANGER_IP6, 8472, vxlan_header(1), &inner_echo6("2001:db8::7", POD6));
    let mut tcp = vec![0x9c, 0x40, 0x21, 0x18];
    tcp.extend([0u8; 16]);
    let plain = |next, payload: &[u8]| with_chain(STRANGER_IP6, &[], next, payload);
    let cases = [
        ("TCP to the VXLAN port", plain(IPPROTO_TCP, &tcp)),
        ("ICMPv6", plain(IPPROTO_ICMPV6, &[128, 0, 0, 0, 0, 1, 0, 1])),
        ("VXLAN to another port", frame6(STRANGER_IP6, OUR_IP6, 4789, vxlan_header(1), ETH_P_IPV6, &[0u8; 40])),
        (
            "TCP behind four extension headers",
            with_chain(
                STRANGER_IP6,
                &[options(IPPROTO_HOPOPTS), long_options(), routing(), fragment(0, false)],
                IPPROTO_TCP,
                &tcp,
            ),
        ),
        // no UDP header in it: useless without the first fragment
        ("a later fragment", with_chain(STRANGER_IP6, &[fragment(3, false)], IPPROTO_UDP, &udp)),
        ("a truncated UDP header", plain(IPPROTO_UDP, &udp[..2])),
        (
            "a version-4 header in an IPv6 frame",
            eth([2; 6], [4; 6], ETH_P_IPV6, &ipv4(STRANGER_IP, OUR_IP, 17, &udp, 0)),
        ),
    ];
    for prog in JUDGES {
        for (what, frame) in &cases {
            for stack in tag_stacks() {
                assert_untouched(&l, prog, &format!("{what} behind {stack:x?}"), &tagged(frame, &stack))?;
            }
        }
    }
    Ok(())
}

// --- the socket-lookup guard ---------------------------------------------

const SK_DROP: u32 = 0;
const SK_PASS: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// A `struct bpf_sk_lookup` as BPF_PROG_TEST_RUN takes it (uapi bpf.h):
/// cookie u64, family, protocol, remote_ip4, remote_ip6[4], remote_port
/// (be16 + 2 bytes of zero padding), local_ip4, local_ip6[4], local_port,
/// ingress_ifindex; 72 bytes. The kernel wants `ingress_ifindex` zero here
/// (everything after `local_port`), so a test lookup always comes from
/// "interface 0".
fn lookup_ctx(family: u32, protocol: u32, remote: &[u8], local_port: u16) -> [u8; 72] {
    let mut c = [0u8; 72];
    c[8..12].copy_from_slice(&family.to_ne_bytes());
    c[12..16].copy_from_slice(&protocol.to_ne_bytes());
    match remote.len() {
        4 => c[16..20].copy_from_slice(remote),
        _ => c[20..36].copy_from_slice(remote),
    }
    c[36..38].copy_from_slice(&40000u16.to_be_bytes());
    if family == AF_INET {
        c[40..44].copy_from_slice(&OUR_IP);
    } else {
        c[44..60].copy_from_slice(&v6(OUR_IP6));
    }
    c[60..64].copy_from_slice(&(local_port as u32).to_ne_bytes());
    c
}

/// Runs the sk_lookup program `prog` on `ctx` (aya 0.14 has no test run
/// for sk_lookup programs: the bpf(2) call is made here).
fn run_guard(l: &Loaded, prog: &str, ctx: &[u8; 72]) -> Result<u32> {
    let p: &aya::programs::SkLookup = l.ebpf.program(prog).context("program")?.try_into()?;
    let fd = p.fd()?.as_fd().as_raw_fd();
    // union bpf_attr, `test` member: prog_fd, retval, data sizes and
    // pointers (unused), repeat, duration, ctx_size_in/out, ctx_in, ctx_out
    let mut attr = [0u64; 10];
    attr[0] = fd as u32 as u64;
    attr[5] = ctx.len() as u64; // ctx_size_in (low half), ctx_size_out 0
    attr[6] = ctx.as_ptr() as u64;
    // SAFETY: the kernel reads `ctx` (72 bytes we own) and writes retval into `attr`.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_TEST_RUN, attr.as_mut_ptr(), size_of_val(&attr)) };
    if rc != 0 {
        bail!("BPF_PROG_TEST_RUN of {prog}: {}", std::io::Error::last_os_error());
    }
    Ok((attr[0] >> 32) as u32)
}

const UDP: u32 = IPPROTO_UDP as u32;

#[test]
fn the_guard_refuses_ipv6_vxlan_from_strangers_and_off_the_underlay() -> Result<()> {
    let mut l = load6(0)?;
    let (peer, stranger) = (v6(PEER_IP6), v6(STRANGER_IP6));
    let guards = crate::features::load_guards(&mut l.ebpf)?;
    // a test lookup comes from interface 0; the fixture's underlay is 2
    let verdicts = [("edgevx_guard", SK_DROP), ("edgevx_guard_compat", SK_PASS)];
    for (prog, peer_verdict) in verdicts.into_iter().filter(|(p, _)| guards.contains(p)) {
        let unknown = l.counter(Counter::DropUnknownPeerSocket)?;
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET6, UDP, &stranger, 8472))?, SK_DROP, "{prog}: stranger");
        assert_eq!(l.counter(Counter::DropUnknownPeerSocket)?, unknown + 1, "{prog}");
        let mapped = v6("::ffff:198.18.0.2");
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET6, UDP, &mapped, 8472))?, SK_DROP, "{prog}: v4-mapped");
        let off = l.counter(Counter::DropVxlanOffUnderlay)?;
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET6, UDP, &peer, 8472))?, peer_verdict, "{prog}: peer");
        let counted = if peer_verdict == SK_DROP { 1 } else { 0 };
        assert_eq!(l.counter(Counter::DropVxlanOffUnderlay)?, off + counted, "{prog}");
        // not VXLAN: another port, or TCP to the port
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET6, UDP, &stranger, 53))?, SK_PASS, "{prog}: port 53");
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET6, 6, &stranger, 8472))?, SK_PASS, "{prog}: TCP");
        // the v4 guard is as it was
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET, UDP, &STRANGER_IP, 8472))?, SK_DROP, "{prog}: v4");
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET, UDP, &PEER_IP, 8472))?, peer_verdict, "{prog}: v4");
    }
    assert_eq!(l.counter(Counter::DropUnknownPeerSocket)?, 3 * guards.len() as u64);
    // with the underlay as interface 0, the full guard lets the peers in
    if guards.contains(&"edgevx_guard") {
        set_underlay(&mut l, 0)?;
        assert_eq!(run_guard(&l, "edgevx_guard", &lookup_ctx(AF_INET6, UDP, &peer, 8472))?, SK_PASS);
        assert_eq!(run_guard(&l, "edgevx_guard", &lookup_ctx(AF_INET, UDP, &PEER_IP, 8472))?, SK_PASS);
        assert_eq!(run_guard(&l, "edgevx_guard", &lookup_ctx(AF_INET6, UDP, &stranger, 8472))?, SK_DROP);
    }
    // IPv6 off: v6 lookups pass as before, v4 is still guarded
    set_public_ip6(&mut l, [0; 16])?;
    let before = l.counter(Counter::DropUnknownPeerSocket)?;
    for prog in &guards {
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET6, UDP, &stranger, 8472))?, SK_PASS, "{prog}: v6 off");
        assert_eq!(run_guard(&l, prog, &lookup_ctx(AF_INET, UDP, &STRANGER_IP, 8472))?, SK_DROP, "{prog}: v4");
    }
    assert_eq!(l.counter(Counter::DropUnknownPeerSocket)?, before + guards.len() as u64);
    Ok(())
}
