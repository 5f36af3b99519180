//! VXLAN hidden behind VLAN tags in the packet bytes: dropped wherever
//! edgevx judges, by decap on the underlay and by the pod guard on the pod
//! bridge (`drop_vxlan_tagged`).
//!
//! Why: the judges read the IP header at a fixed offset behind the
//! Ethernet header, and the kernel strips tags only partly before TC. At
//! the top of `__netif_receive_skb_core` it moves one tag into skb metadata
//! (`skb_vlan_untag`; a NIC with VLAN offload does the same), so TC sees
//! the ethertype behind it; a second tag stays in the bytes, and to the
//! judges such a frame is not IP at all. After TC the kernel strips the
//! rest, 802.1Q and 802.1ad alike and any number of them: a VID-0 tag with
//! no VLAN device is cleared and the next one untagged (`check_vlan_id`),
//! a VID with a VLAN device hands the frame to that device (`another_round`).
//! The datagram then reaches the VXLAN socket, where the socket-lookup
//! guard checks only its outer source, which a stranger forges as a peer's.
//!
//! What is dropped: UDP to the VXLAN port behind one or more tags in the
//! bytes, IPv4 or IPv6 (behind extension headers too, see `vxlan_port.rs`),
//! from anyone, whatever the VIDs (which ones the kernel delivers depends
//! on the VLAN devices the host has), with IPv6 on or off (one rule for
//! both families). So is any frame with more than [`MAX_TAGS`] tags: the
//! kernel strips any number, so they could hide anything. Other tagged
//! traffic passes untouched. (Tags on the inner frame need nothing here:
//! the judges want an untagged inner IPv4 or IPv6 header and drop the rest.)
//!
//! What is not affected, because the bytes the judges read are untagged:
//! - a single tag, which the kernel (or the NIC) moved into metadata before
//!   TC: judged as usual. BPF_PROG_TEST_RUN cannot put a tag there (it
//!   refuses a context with `vlan_*` set), so the prog tests show the
//!   program only the untagged bytes it would see;
//! - an underlay that is itself a VLAN device (`eth0.100`): its TC hook runs
//!   after the kernel untagged the frame for it, and judges it as usual.
//!
//! The cost: VXLAN that reaches the underlay with two or more tags is
//! dropped even from a peer, e.g. priority-tagged (VID 0, 802.1p) by a peer
//! and tagged again on the way, or an 802.1ad tag in front of an 802.1Q one
//! that no VLAN device of this host terminates.

use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use edgevx_common::{
    counters::Counter,
    headers::{VlanTag, is_vlan},
    monitor::Program,
    vxlan::{ETH_HLEN, VLAN_HLEN},
};

use crate::{monitor, stats, tunnel::NEXT, vxlan_port};

/// The most tags walked; a frame with more is dropped. Nothing legitimate
/// stacks more than two (802.1ad in front of 802.1Q).
pub(crate) const MAX_TAGS: usize = 8;

/// The verdict on a frame whose ethertype is a VLAN TPID: dropped and
/// counted if it hides VXLAN for `port`, else left alone. `program`: the
/// caller, for a monitor.
#[inline(always)]
pub(crate) fn judge(ctx: &TcContext, port: u16, program: Program) -> i32 {
    if !hides_vxlan(ctx, port) {
        return NEXT;
    }
    stats::add(Counter::DropVxlanTagged, 1);
    monitor::unpeered(ctx, Counter::DropVxlanTagged, program);
    TC_ACT_SHOT
}

/// Whether UDP to `port` lies behind the tags, or more tags than are walked.
/// The first tag's TPID is the Ethernet header's ethertype; each tag holds
/// the ethertype of what follows it.
#[inline(always)]
fn hides_vxlan(ctx: &TcContext, port: u16) -> bool {
    let mut at = ETH_HLEN;
    for _ in 0..MAX_TAGS {
        // a frame cut inside its tags: the kernel's untagging drops it
        let Ok(tag) = ctx.load::<[u8; VLAN_HLEN]>(at) else {
            return false;
        };
        let ethertype = VlanTag(&tag).encapsulated();
        at += VLAN_HLEN;
        if !is_vlan(ethertype) {
            return vxlan_port::is_udp_to(ctx, ethertype, at, port);
        }
    }
    true
}
