//! Issue 33, finding 3, in the decap program itself (BPF_PROG_TEST_RUN on
//! the fixture of prog_test_run.rs): with overlapping peer subnets, an
//! inner source belongs to the owner of the longest prefix holding it, in
//! both families. The holder of 10.244.2.0/23 beside a peer's
//! 10.244.2.0/24 cannot send as the /24's pods; it may send as the rest of
//! its /23. Two subnets behind one public IP may both send.
use anyhow::{Context, Result};
use aya::maps::{HashMap, LpmTrie, lpm_trie::Key};
use edgevx_common::{
    counters::Counter,
    maps::{self as names, FLAG_BYPASS_NETFILTER, Peer, PeerAccept, PeerAccept6},
};

use crate::{
    prog_test_run::{Loaded, NEXT, OUR_MAC, PEER_IP, PEER_MAC, TC_ACT_REDIRECT, TC_ACT_SHOT, ipv4, load, vxlan_frame},
    prog_test_run_v6::{PEER_IP6, POD6, inner_echo6, load6, v6, vxlan6},
};

/// The holder of the wider prefix.
const WIDE_IP: [u8; 4] = [198, 18, 0, 9];
const WIDE_IP6: &str = "fd00:198:18::9";

/// Programs `subnet` (`len`) as the peer at `public_ip`'s.
fn put_subnet(l: &mut Loaded, subnet: [u8; 4], len: u32, public_ip: [u8; 4]) -> Result<()> {
    let mut subnets: LpmTrie<_, [u8; 4], Peer> =
        LpmTrie::try_from(l.ebpf.map_mut(names::PEER_SUBNETS).context("subnets")?)?;
    subnets.insert(&Key::new(len, subnet), &Peer { public_ip, vtep_mac: PEER_MAC, _pad: [0; 2] }, 0)?;
    Ok(())
}

fn spoofed(l: &Loaded) -> Result<u64> {
    l.counter(Counter::DropSpoofedSource)
}

/// UDP from `src` to our pod 10.244.1.2, inside VXLAN from `from`: decap's verdict.
fn verdict(l: &Loaded, from: [u8; 4], src: [u8; 4]) -> Result<u32> {
    let inner = ipv4(src, [10, 244, 1, 2], 17, &[0; 8], 0);
    Ok(l.run("edgevx_decap", &vxlan_frame(from, 1, OUR_MAC, &inner))?.0)
}

#[test]
fn an_inner_ipv4_source_belongs_to_the_longest_prefixs_owner() -> Result<()> {
    let mut l = load(FLAG_BYPASS_NETFILTER)?;
    // the fixture: PEER_IP owns 10.244.2.0/24, the exempt peer 10.244.3.0/24; the
    // /23's holder comes beside them, and the exempt peer's /24 goes (its half is free)
    put_subnet(&mut l, [10, 244, 2, 0], 23, WIDE_IP)?;
    {
        let mut subnets: LpmTrie<_, [u8; 4], Peer> =
            LpmTrie::try_from(l.ebpf.map_mut(names::PEER_SUBNETS).context("subnets")?)?;
        subnets.remove(&Key::new(24, [10, 244, 3, 0]))?;
        let mut accept: HashMap<_, [u8; 4], PeerAccept> =
            HashMap::try_from(l.ebpf.map_mut(names::PEER_ACCEPT).context("accept")?)?;
        accept.insert(
            &WIDE_IP,
            &PeerAccept { pod_subnet: [10, 244, 2, 0], prefix_len: 23, flags: 0, _pad: [0; 2] },
            0,
        )?;
    }
    // the victim sends as its pods, and the /23's holder cannot, though its accept entry covers them
    assert_eq!(verdict(&l, PEER_IP, [10, 244, 2, 2])?, TC_ACT_REDIRECT, "the /24's owner");
    assert_eq!(verdict(&l, WIDE_IP, [10, 244, 2, 2])?, TC_ACT_SHOT, "the /23's holder as the /24's pod");
    assert_eq!(verdict(&l, WIDE_IP, [10, 244, 2, 255])?, TC_ACT_SHOT, "the /23's holder as the /24's last address");
    assert_eq!(spoofed(&l)?, 2);
    // the rest of its /23 is its own
    assert_eq!(verdict(&l, WIDE_IP, [10, 244, 3, 9])?, TC_ACT_REDIRECT, "the /23's holder as its own half");
    // nor can the /24's owner send as the /23's other half
    assert_eq!(verdict(&l, PEER_IP, [10, 244, 3, 9])?, TC_ACT_SHOT, "the /24's owner as the /23's half");
    assert_eq!(spoofed(&l)?, 3);
    // a second subnet behind PEER_IP (a shared public IP): both may send, whichever the accept entry binds
    put_subnet(&mut l, [10, 244, 5, 0], 24, PEER_IP)?;
    assert_eq!(verdict(&l, PEER_IP, [10, 244, 5, 5])?, TC_ACT_REDIRECT, "the second subnet behind the public IP");
    assert_eq!(verdict(&l, PEER_IP, [10, 244, 2, 7])?, TC_ACT_REDIRECT, "the first subnet behind the public IP");
    assert_eq!(verdict(&l, WIDE_IP, [10, 244, 5, 5])?, TC_ACT_SHOT, "another peer's second subnet");
    assert_eq!(spoofed(&l)?, 4);
    Ok(())
}

#[test]
fn an_inner_ipv6_source_belongs_to_the_longest_prefixs_owner() -> Result<()> {
    let mut l = load6(0)?;
    let peer_pod6 = "fd00:10:244:2::2";
    let before = spoofed(&l)?;
    // without owners programmed, each accept entry's CIDR binds, as before
    assert_eq!(l.run("edgevx_decap", &vxlan6(PEER_IP6, 1, &inner_echo6(peer_pod6, POD6)))?.0, NEXT);
    {
        let mut owners: LpmTrie<_, [u8; 16], [u8; 16]> =
            LpmTrie::try_from(l.ebpf.map_mut(names::PEER_SUBNETS6).context("subnets6")?)?;
        owners.insert(&Key::new(64, v6("fd00:10:244:2::")), &v6(PEER_IP6), 0)?;
        owners.insert(&Key::new(63, v6("fd00:10:244:2::")), &v6(WIDE_IP6), 0)?;
        owners.insert(&Key::new(64, v6("fd00:10:244:5::")), &v6(PEER_IP6), 0)?;
        let mut accept: HashMap<_, [u8; 16], PeerAccept6> =
            HashMap::try_from(l.ebpf.map_mut(names::PEER_ACCEPT6).context("accept6")?)?;
        let wide = PeerAccept6 { pod_subnet: v6("fd00:10:244:2::"), prefix_len: 63, flags: 0, _pad: [0; 2] };
        accept.insert(&v6(WIDE_IP6), &wide, 0)?;
    }
    let run = |from: &str, src: &str| -> Result<u32> {
        Ok(l.run("edgevx_decap", &vxlan6(from, 1, &inner_echo6(src, POD6)))?.0)
    };
    assert_eq!(run(PEER_IP6, peer_pod6)?, NEXT, "the /64's owner");
    assert_eq!(run(WIDE_IP6, peer_pod6)?, TC_ACT_SHOT, "the /63's holder as the /64's pod");
    assert_eq!(run(WIDE_IP6, "fd00:10:244:3::9")?, NEXT, "the /63's holder as its own half");
    assert_eq!(run(PEER_IP6, "fd00:10:244:3::9")?, TC_ACT_SHOT, "the /64's owner as the /63's half");
    assert_eq!(run(PEER_IP6, "fd00:10:244:5::5")?, NEXT, "a second subnet behind the public IPv6");
    assert_eq!(spoofed(&l)?, before + 2);
    Ok(())
}
