//! Global dataplane counters: indices into the per-CPU `GLOBAL_STATS` array,
//! and, from [`FIRST_ARRAY_LEN`] on, into `MORE_STATS`.
//!
//! The first array's size is part of pin layout v7: an upgraded agent adopts
//! the older agent's pinned maps, and a downgraded one ours, so that array
//! never grows. Counters added since live in the second array, which an older
//! agent does not know and leaves alone.

/// One slot of the global counter array. The discriminant is the index.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Frames encapsulated and sent to a peer.
    TxPackets = 0,
    TxBytes = 1,
    /// VXLAN frames from peers decapsulated and redirected straight into a
    /// pod, past the host's routing and netfilter (`--bypass-netfilter` only).
    RxFastPackets = 2,
    RxFastBytes = 3,
    /// VXLAN frames from peers accepted and left to the kernel's VXLAN receive path.
    RxHostPackets = 4,
    RxHostBytes = 5,
    /// Dropped: VXLAN for us from a source that is not a known peer.
    DropUnknownPeer = 6,
    /// Dropped: no peer subnet matched the inner destination.
    DropNoRoute = 7,
    /// Dropped: the kernel refused to grow or shrink the packet.
    DropAdjustRoom = 8,
    /// Dropped: a frame on the VTEP that is not IPv4.
    DropNotIpv4 = 9,
    /// Dropped: the agent has not configured the dataplane yet.
    DropNoConfig = 10,
    /// Passed untouched: VXLAN to our port with another VNI or inner MAC.
    PassNotOurs = 11,
    /// Dropped: a peer sent an inner source outside its pod CIDR (and its
    /// entry does not say it may carry any inner source).
    DropSpoofedSource = 12,
    /// VXLAN frames from peers for a local pod, decapsulated in TC and handed
    /// to the host stack as if they arrived on `flannel.<VNI>` (the default
    /// mode): routing, conntrack and netfilter all apply.
    RxStackPackets = 13,
    RxStackBytes = 14,
    /// Frames the pod bridge would forward to a learned pod, sent straight to
    /// that pod's port (so GSO packets are not cut in software on the bridge).
    BridgeToPort = 15,
    /// Dropped: a peer's inner IPv4 packet has TTL 0 or 1 (nothing may
    /// forward it further).
    DropInnerTtl = 16,
    /// Dropped: VXLAN for us whose outer IPv4 header checksum is wrong (the
    /// kernel's `ip_rcv` would drop it).
    DropBadChecksum = 17,
    /// Dropped: VXLAN flags other than exactly the I flag, or a non-zero
    /// reserved byte (the kernel's `vxlan_rcv` would drop it).
    DropBadVxlanFlags = 18,
    /// Dropped: a first fragment to our VXLAN port too short to hold the
    /// VXLAN, inner Ethernet and inner IPv4 headers, so it cannot be judged.
    DropShortFragment = 19,
    /// Dropped: a peer's inner frame is not a whole IPv4 header, so its
    /// source cannot be bound to the peer's pod CIDR.
    DropInnerNotIpv4 = 20,
    /// Not sent: a DF frame too big for the underlay once encapsulated; an
    /// ICMP "fragmentation needed" with the MTU that fits went back to the
    /// sender instead.
    DropFragNeeded = 21,
    /// Dropped: a frame too big for the underlay once encapsulated that may
    /// not be answered with ICMP (DF clear, a later fragment, an ICMP error).
    DropTooBig = 22,
    /// Dropped at socket lookup: a datagram to our VXLAN port from a source
    /// that is not an accepted peer, by a path decap does not see (another
    /// interface, a local pod, a reassembled datagram).
    DropUnknownPeerSocket = 23,
    /// Dropped on the pod bridge's ingress: a local pod sent UDP to the
    /// VXLAN port (of any node).
    DropPodVxlan = 24,
    /// Dropped at socket lookup: a peer's VXLAN that arrived on an
    /// interface other than the underlay. Only decap on the underlay judges
    /// a frame whole (inner source, TTL, flags); anywhere else the kernel
    /// would decapsulate it unjudged.
    DropVxlanOffUnderlay = 25,
    /// Dropped: a peer's VXLAN over the IPv6 underlay whose inner frame is
    /// not a whole IPv6 header (flannel carries only IPv6 pods over the
    /// IPv6 tunnel, never IPv4 or ARP), so its source cannot be bound to
    /// the peer's IPv6 pod CIDR.
    DropInnerNotIpv6 = 26,
    /// Dropped: a peer's IPv6 datagram with more extension headers than the
    /// judge walks (`MAX_EXT_HEADERS` in ebpf/src/judge6.rs), so whether it
    /// is VXLAN for us cannot be told. Peers send none; a stranger's goes on
    /// to the socket-lookup guard.
    DropLongExtChain = 27,
    /// Dropped: UDP to the VXLAN port behind VLAN tags (802.1Q or 802.1ad,
    /// any VIDs) in the packet bytes, on the underlay or from a local pod,
    /// or a frame with more tags than are walked (`MAX_TAGS` in
    /// ebpf/src/tagged.rs). The kernel strips such tags after TC and hands
    /// the datagram to the VXLAN socket; the judges read fixed offsets and
    /// never saw it.
    DropVxlanTagged = 28,
    /// Packets of established plain flows from a peer's pod delivered to a
    /// local pod past the host stack, after conntrack said so (ebpf/src/fastpath.rs).
    FastPathPackets = 29,
    FastPathBytes = 30,
    /// Left to the host stack by the fast path: a SYN, FIN or RST (or a
    /// segment without ACK), which conntrack's state machine must see.
    FastPathStackTcpFlags = 31,
    /// Left to the host stack: conntrack has no entry for the flow.
    FastPathStackNoEntry = 32,
    /// Left to the host stack: the entry is not yet confirmed, replied and
    /// assured, or the TCP connection is not ESTABLISHED.
    FastPathStackNotEstablished = 33,
    /// Left to the host stack: the entry has NAT, a helper, an expectation,
    /// sequence adjustment, a fixed timeout or a conntrack mark.
    FastPathStackNotPlain = 34,
    /// Left to the host stack: TCP whose window tracking is not yet liberal
    /// both ways (the agent is asked to make it so).
    FastPathStackNotLiberal = 35,
    /// Left to the host stack: no packet of the flow has passed the current
    /// ruleset yet (first packets, and the first after every ruleset change).
    FastPathStackNewRuleset = 36,
    /// Left to the host stack: not TCP or UDP, IP options, a fragment, or a
    /// destination that is not a learned local pod.
    FastPathStackOther = 37,
    /// Dropped by the XDP judge on the underlay, before any skb: UDP to the
    /// VXLAN port from a source that is not an accepted peer (IPv4 or IPv6).
    XdpDropUnknownPeer = 38,
    /// Dropped by the XDP judge: VXLAN flags other than exactly the I flag,
    /// or a non-zero reserved byte.
    XdpDropBadVxlanFlags = 39,
    /// Dropped by the XDP judge: UDP to the VXLAN port too short for the
    /// VXLAN and inner Ethernet headers (not a fragment).
    XdpDropShort = 40,
    /// Left to the host stack: the agent's keeper has not renewed the fast
    /// path's lease (the agent is stopped, or its ruleset watch ended).
    FastPathStackNoKeeper = 41,
    /// A local pod's packets of an established plain flow encapsulated on
    /// the pod bridge's ingress and sent to the peer, past the host's
    /// routing and netfilter (the fast path's send side); their bytes
    /// without the Ethernet header, as `FastPathBytes`.
    FastPathSentPackets = 42,
    FastPathSentBytes = 43,
}

pub const COUNT: u32 = 44;

/// How many counters the first array (`GLOBAL_STATS`) holds, fixed by pin
/// layout v7; the rest are in `MORE_STATS`.
pub const FIRST_ARRAY_LEN: u32 = 29;
/// How many counters the second array (`MORE_STATS`) holds.
pub const MORE_ARRAY_LEN: u32 = COUNT - FIRST_ARRAY_LEN;

/// Where a counter lives: which array, and its index there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    First(u32),
    More(u32),
}

impl Counter {
    pub const ALL: [Counter; COUNT as usize] = [
        Counter::TxPackets,
        Counter::TxBytes,
        Counter::RxFastPackets,
        Counter::RxFastBytes,
        Counter::RxHostPackets,
        Counter::RxHostBytes,
        Counter::DropUnknownPeer,
        Counter::DropNoRoute,
        Counter::DropAdjustRoom,
        Counter::DropNotIpv4,
        Counter::DropNoConfig,
        Counter::PassNotOurs,
        Counter::DropSpoofedSource,
        Counter::RxStackPackets,
        Counter::RxStackBytes,
        Counter::BridgeToPort,
        Counter::DropInnerTtl,
        Counter::DropBadChecksum,
        Counter::DropBadVxlanFlags,
        Counter::DropShortFragment,
        Counter::DropInnerNotIpv4,
        Counter::DropFragNeeded,
        Counter::DropTooBig,
        Counter::DropUnknownPeerSocket,
        Counter::DropPodVxlan,
        Counter::DropVxlanOffUnderlay,
        Counter::DropInnerNotIpv6,
        Counter::DropLongExtChain,
        Counter::DropVxlanTagged,
        Counter::FastPathPackets,
        Counter::FastPathBytes,
        Counter::FastPathStackTcpFlags,
        Counter::FastPathStackNoEntry,
        Counter::FastPathStackNotEstablished,
        Counter::FastPathStackNotPlain,
        Counter::FastPathStackNotLiberal,
        Counter::FastPathStackNewRuleset,
        Counter::FastPathStackOther,
        Counter::XdpDropUnknownPeer,
        Counter::XdpDropBadVxlanFlags,
        Counter::XdpDropShort,
        Counter::FastPathStackNoKeeper,
        Counter::FastPathSentPackets,
        Counter::FastPathSentBytes,
    ];

    /// The array and index this counter is kept at.
    pub const fn slot(self) -> Slot {
        let i = self as u32;
        if i < FIRST_ARRAY_LEN { Slot::First(i) } else { Slot::More(i - FIRST_ARRAY_LEN) }
    }

    /// Name used in `edgevx status` and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::TxPackets => "tx_packets",
            Counter::TxBytes => "tx_bytes",
            Counter::RxFastPackets => "rx_fast_packets",
            Counter::RxFastBytes => "rx_fast_bytes",
            Counter::RxHostPackets => "rx_host_packets",
            Counter::RxHostBytes => "rx_host_bytes",
            Counter::DropUnknownPeer => "drop_unknown_peer",
            Counter::DropNoRoute => "drop_no_route",
            Counter::DropAdjustRoom => "drop_adjust_room",
            Counter::DropNotIpv4 => "drop_not_ipv4",
            Counter::DropNoConfig => "drop_no_config",
            Counter::PassNotOurs => "pass_not_ours",
            Counter::DropSpoofedSource => "drop_spoofed_source",
            Counter::RxStackPackets => "rx_stack_packets",
            Counter::RxStackBytes => "rx_stack_bytes",
            Counter::BridgeToPort => "bridge_to_port",
            Counter::DropInnerTtl => "drop_inner_ttl",
            Counter::DropBadChecksum => "drop_bad_checksum",
            Counter::DropBadVxlanFlags => "drop_bad_vxlan_flags",
            Counter::DropShortFragment => "drop_short_fragment",
            Counter::DropInnerNotIpv4 => "drop_inner_not_ipv4",
            Counter::DropFragNeeded => "drop_frag_needed",
            Counter::DropTooBig => "drop_too_big",
            Counter::DropUnknownPeerSocket => "drop_unknown_peer_socket",
            Counter::DropPodVxlan => "drop_pod_vxlan",
            Counter::DropVxlanOffUnderlay => "drop_vxlan_off_underlay",
            Counter::DropInnerNotIpv6 => "drop_inner_not_ipv6",
            Counter::DropLongExtChain => "drop_long_ext_chain",
            Counter::DropVxlanTagged => "drop_vxlan_tagged",
            Counter::FastPathPackets => "fast_path_packets",
            Counter::FastPathBytes => "fast_path_bytes",
            Counter::FastPathStackTcpFlags => "fast_path_stack_tcp_flags",
            Counter::FastPathStackNoEntry => "fast_path_stack_no_entry",
            Counter::FastPathStackNotEstablished => "fast_path_stack_not_established",
            Counter::FastPathStackNotPlain => "fast_path_stack_not_plain",
            Counter::FastPathStackNotLiberal => "fast_path_stack_not_liberal",
            Counter::FastPathStackNewRuleset => "fast_path_stack_new_ruleset",
            Counter::FastPathStackOther => "fast_path_stack_other",
            Counter::XdpDropUnknownPeer => "xdp_drop_unknown_peer",
            Counter::XdpDropBadVxlanFlags => "xdp_drop_bad_vxlan_flags",
            Counter::XdpDropShort => "xdp_drop_short",
            Counter::FastPathStackNoKeeper => "fast_path_stack_no_keeper",
            Counter::FastPathSentPackets => "fast_path_sent_packets",
            Counter::FastPathSentBytes => "fast_path_sent_bytes",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_dense() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }

    /// Layout v7's first array ends with `DropVxlanTagged`: a counter added
    /// there would change a pinned map's size under the same schema.
    #[test]
    fn the_first_array_keeps_layout_v7() {
        assert_eq!(Counter::DropVxlanTagged.slot(), Slot::First(FIRST_ARRAY_LEN - 1));
        assert_eq!(Counter::ALL[FIRST_ARRAY_LEN as usize].slot(), Slot::More(0));
        assert_eq!(Counter::ALL[COUNT as usize - 1].slot(), Slot::More(MORE_ARRAY_LEN - 1));
    }
}
