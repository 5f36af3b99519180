//! Map names, keys and values. The names are the ELF symbol names of the
//! maps in the eBPF object and the file names of their pins.

/// `Array<DataplaneConfig>` with one slot: what the agent told the programs.
pub const CONFIG: &str = "EDGEVX_CONFIG";
/// `LpmTrie<[u8; 4], Peer>`: remote pod subnet -> peer VTEP (the fdb+arp of flannel).
pub const PEER_SUBNETS: &str = "EDGEVX_PEER_SUBNETS";
/// `LpmTrie<[u8; 16], [u8; 16]>`: remote IPv6 pod subnet -> the public IPv6
/// of the peer that owns it. The IPv6 VTEP's routes are the kernel's; this
/// map only tells the judge whose an inner IPv6 source is (the owner of the
/// longest prefix holding it), as `PEER_SUBNETS` does for IPv4.
pub const PEER_SUBNETS6: &str = "EDGEVX_PEER_SUBNETS6";
/// `PerCpuHashMap<[u8; 4], PeerStats>`: per-peer counters, keyed by peer public IP.
pub const PEER_STATS: &str = "EDGEVX_PEER_STATS";
/// `HashMap<[u8; 4], PeerAccept>`: keyed by peer public IP. A key is present
/// exactly for the peers whose VXLAN we accept; the value binds the inner
/// source of what they send to their pod CIDR.
pub const PEER_ACCEPT: &str = "EDGEVX_PEER_ACCEPT";
/// `HashMap<[u8; 16], PeerAccept6>`: keyed by peer public IPv6. The IPv6
/// twin of [`PEER_ACCEPT`], for the IPv6 underlay of a dual-stack node.
pub const PEER_ACCEPT6: &str = "EDGEVX_PEER_ACCEPT6";
/// `HashMap<[u8; 4], LocalPod>`: local pod IP -> its host-side veth and MACs.
pub const LOCAL_PODS: &str = "EDGEVX_LOCAL_PODS";
/// `PerCpuArray<u32>` with one slot: the next outer IP ID on this CPU.
pub const IP_ID: &str = "EDGEVX_IP_ID";
/// The full encap's outer IP ID counters, shared by all CPUs (see `IP_ID_BUCKETS`).
pub const IP_IDENTS: &str = "EDGEVX_IP_IDENTS";
/// `PerCpuArray<u64>` indexed by [`crate::counters::Counter`].
pub const GLOBAL_STATS: &str = "EDGEVX_GLOBAL_STATS";
/// `PerCpuArray<u64>`: the counters added after pin layout v7
/// ([`crate::counters::Slot::More`]).
pub const MORE_STATS: &str = "EDGEVX_MORE_STATS";

/// All pinned maps, for status and cleanup (a unit test of the agent checks
/// the eBPF object declares no other).
pub const ALL: [&str; 18] = [
    CONFIG,
    PEER_SUBNETS,
    PEER_SUBNETS6,
    PEER_STATS,
    PEER_ACCEPT,
    PEER_ACCEPT6,
    LOCAL_PODS,
    IP_ID,
    IP_IDENTS,
    GLOBAL_STATS,
    MORE_STATS,
    crate::fastpath::FP_CONFIG,
    crate::fastpath::FP_SEEN,
    crate::fastpath::FP_EVENTS,
    crate::monitor::MON_WATCH,
    crate::monitor::MON_BUDGET,
    crate::monitor::MON_EVENTS,
    crate::monitor::MON_PROGS,
];

/// Outer IP ID counters, one per destination bucket, as many as the
/// kernel's `ip_idents` has at its smallest (2,048): two destinations share
/// a counter only when they hash alike, which only spaces their IDs out more.
pub const IP_ID_BUCKETS: u32 = 2048;

pub const MAX_PEERS: u32 = 16384;
pub const MAX_LOCAL_PODS: u32 = 4096;

/// Flag in [`DataplaneConfig::flags`] (`--bypass-netfilter`): decapsulated
/// traffic for a known local pod is redirected straight into the pod, past
/// the host's routing, conntrack and netfilter. Without it, decapsulated
/// traffic always goes through the host stack.
pub const FLAG_BYPASS_NETFILTER: u32 = 1;

/// Formerly `--strict-inner-source`. Binding the inner source to the
/// sending peer's pod CIDR is now always on (see [`PeerAccept`]); the
/// programs ignore this bit.
pub const FLAG_STRICT_INNER_SOURCE: u32 = 2;

/// Flag in [`DataplaneConfig::flags`]: encapsulate without
/// `BPF_F_ADJ_ROOM_ENCAP_L2_ETH`, which kernels before 5.13 refuse. The
/// bytes on the wire are the same.
pub const FLAG_ENCAP_NO_L2_ETH: u32 = 4;

/// Flag in [`DataplaneConfig::flags`]: the VTEP guard (ebpf/src/vtep_guard.rs)
/// drops every frame on `flannel.<VNI>`'s or `flannel-v6.<VNI>`'s ingress
/// that decap did not mark [`MARK_JUDGED`]. Only an agent whose decap marks
/// sets it: an older agent rewrites the config without it, so a guard left
/// attached after a downgrade lets the older decap's traffic through.
pub const FLAG_REQUIRE_JUDGED: u32 = 8;

/// The `skb->mark` bit decap sets on a frame it judged and accepted that
/// goes on to our VTEP (redirected to `flannel.<VNI>`'s ingress, or left to
/// the kernel's VXLAN receive); the VTEP guard clears it again, before
/// routing and netfilter see the inner packet. The mark survives both
/// paths: a redirect and `vxlan_rcv` within one network namespace call
/// `skb_scrub_packet(skb, xnet = false)`, which keeps it, and IPv4 and IPv6
/// reassembly give the whole datagram the first fragment's (judged) mark.
/// A bit no neighbour uses: kube-proxy has 0x4000 and 0x8000, Cilium
/// 0x0f00, Istio 0x539, Calico the upper 16 bits, Weave 0x20000 and 0x40000.
pub const MARK_JUDGED: u32 = 0x1000;

/// The `skb->mark` bit the fast path's send side sets on a local pod's
/// packet it hands straight to `flannel.<VNI>`'s egress (past routing and
/// netfilter); the encap there clears it and does not record the flow as
/// carried by the stack (only the stack's own packets prove that). Free in
/// the same neighbours' schemes as [`MARK_JUDGED`].
pub const MARK_FAST_SENT: u32 = 0x2000;

/// What the agent configured; read by both programs on every packet.
///
/// Addresses are in network byte order as bytes, the way they sit in a
/// packet; `vni` and `port` are host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DataplaneConfig {
    pub vni: u32,
    pub local_ip: [u8; 4],
    pub vtep_mac: [u8; 6],
    pub port: u16,
    pub flags: u32,
    pub vtep_ifindex: u32,
    pub underlay_ifindex: u32,
    /// Our public IPv6 (the local address of `flannel-v6.<VNI>`); all zero
    /// when IPv6 is off, and then IPv6 VXLAN is not judged at all: the node
    /// behaves exactly as a v4-only one.
    pub public_ip6: [u8; 16],
}

impl DataplaneConfig {
    /// Whether the IPv6 underlay is on (we have a public IPv6).
    #[inline(always)]
    pub fn ipv6_on(&self) -> bool {
        let (hi, lo) = halves(&self.public_ip6);
        hi | lo != 0
    }
}

/// A remote VTEP: where to send frames for one pod subnet.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Peer {
    pub public_ip: [u8; 4],
    pub vtep_mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// [`PeerAccept::flags`]: the peer may send any inner source (an external
/// VTEP that forwards client traffic without SNAT, e.g. an F5 BIG-IP).
pub const ACCEPT_ANY_INNER_SOURCE: u8 = 1;

/// A peer we accept VXLAN from, and the pod CIDR its inner sources must lie in.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PeerAccept {
    /// Network address of the peer's pod subnet, network byte order.
    pub pod_subnet: [u8; 4],
    pub prefix_len: u8,
    /// [`ACCEPT_ANY_INNER_SOURCE`] or 0.
    pub flags: u8,
    pub _pad: [u8; 2],
}

impl PeerAccept {
    /// Whether the peer may send any inner source (`--any-inner-source`).
    #[inline(always)]
    pub fn exempt(&self) -> bool {
        self.flags & ACCEPT_ANY_INNER_SOURCE != 0
    }

    /// Whether `inner_src` may be sent by this peer.
    #[inline(always)]
    pub fn allows_inner_source(&self, inner_src: [u8; 4]) -> bool {
        if self.flags & ACCEPT_ANY_INNER_SOURCE != 0 {
            return true;
        }
        let bits = self.prefix_len.min(32) as u32;
        // a shift by 32 is undefined: /0 masks nothing
        let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
        u32::from_be_bytes(inner_src) & mask == u32::from_be_bytes(self.pod_subnet) & mask
    }
}

/// A peer we accept IPv6 VXLAN from, and the IPv6 pod CIDR its inner
/// sources must lie in.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PeerAccept6 {
    /// Network address of the peer's IPv6 pod subnet, network byte order.
    pub pod_subnet: [u8; 16],
    pub prefix_len: u8,
    /// [`ACCEPT_ANY_INNER_SOURCE`] or 0.
    pub flags: u8,
    pub _pad: [u8; 2],
}

impl PeerAccept6 {
    /// Whether the peer may send any inner source (`--any-inner-source`).
    #[inline(always)]
    pub fn exempt(&self) -> bool {
        self.flags & ACCEPT_ANY_INNER_SOURCE != 0
    }

    /// Whether `inner_src` may be sent by this peer. Compared as two 64-bit
    /// halves: 128-bit shifts would need compiler intrinsics the eBPF
    /// target does not have.
    #[inline(always)]
    pub fn allows_inner_source(&self, inner_src: &[u8; 16]) -> bool {
        if self.flags & ACCEPT_ANY_INNER_SOURCE != 0 {
            return true;
        }
        let bits = self.prefix_len.min(128) as u32;
        let (hi_mask, lo_mask) = (prefix_mask(bits.min(64)), prefix_mask(bits.saturating_sub(64)));
        let (src_hi, src_lo) = halves(inner_src);
        let (net_hi, net_lo) = halves(&self.pod_subnet);
        src_hi & hi_mask == net_hi & hi_mask && src_lo & lo_mask == net_lo & lo_mask
    }
}

/// The top `bits` (0 to 64) of a u64 set.
#[inline(always)]
fn prefix_mask(bits: u32) -> u64 {
    // a shift by 64 is undefined: /0 masks nothing
    if bits == 0 { 0 } else { u64::MAX << (64 - bits) }
}

/// An IPv6 address in network order as its high and low 64 bits.
#[inline(always)]
fn halves(a: &[u8; 16]) -> (u64, u64) {
    let hi = u64::from_be_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]);
    let lo = u64::from_be_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]);
    (hi, lo)
}

/// Per-peer counters (per CPU; readers sum them).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PeerStats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    /// Frames for this peer that could not be encapsulated.
    pub tx_errors: u64,
}

/// A pod on this node that can take decapsulated frames directly.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct LocalPod {
    /// ifindex of the host-side veth (the redirect_peer target).
    pub host_ifindex: u32,
    pub pod_mac: [u8; 6],
    pub host_mac: [u8; 6],
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::DataplaneConfig {}
    unsafe impl aya::Pod for super::Peer {}
    unsafe impl aya::Pod for super::PeerStats {}
    unsafe impl aya::Pod for super::PeerAccept {}
    unsafe impl aya::Pod for super::PeerAccept6 {}
    unsafe impl aya::Pod for super::LocalPod {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    /// Sizes equal the sum of the fields: no implicit padding reaches the kernel.
    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<DataplaneConfig>(), 4 + 4 + 6 + 2 + 4 + 4 + 4 + 16);
        assert_eq!(size_of::<Peer>(), 12);
        assert_eq!(size_of::<PeerStats>(), 40);
        assert_eq!(size_of::<LocalPod>(), 16);
        assert_eq!(size_of::<PeerAccept>(), 4 + 1 + 1 + 2);
        assert_eq!(size_of::<PeerAccept6>(), 16 + 1 + 1 + 2);
    }

    fn accept(subnet: [u8; 4], prefix_len: u8, flags: u8) -> PeerAccept {
        PeerAccept { pod_subnet: subnet, prefix_len, flags, _pad: [0; 2] }
    }

    #[test]
    fn inner_source_is_bound_to_the_pod_cidr() {
        let a = accept([10, 244, 2, 0], 24, 0);
        assert!(a.allows_inner_source([10, 244, 2, 0]));
        assert!(a.allows_inner_source([10, 244, 2, 255]));
        assert!(!a.allows_inner_source([10, 244, 3, 1]));
        assert!(!a.allows_inner_source([203, 0, 113, 7]));
        let host = accept([10, 244, 2, 7], 32, 0);
        assert!(host.allows_inner_source([10, 244, 2, 7]));
        assert!(!host.allows_inner_source([10, 244, 2, 8]));
        assert!(accept([0, 0, 0, 0], 0, 0).allows_inner_source([203, 0, 113, 7]));
    }

    #[test]
    fn the_exemption_allows_any_inner_source() {
        assert!(accept([10, 244, 2, 0], 24, ACCEPT_ANY_INNER_SOURCE).allows_inner_source([203, 0, 113, 7]));
    }

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<core::net::Ipv6Addr>().map(|a| a.octets()).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn accept6(subnet: &str, prefix_len: u8, flags: u8) -> PeerAccept6 {
        PeerAccept6 { pod_subnet: v6(subnet), prefix_len, flags, _pad: [0; 2] }
    }

    #[test]
    fn inner_ipv6_source_is_bound_to_the_pod_cidr() {
        let a = accept6("fd00:10:244:2::", 64, 0);
        assert!(a.allows_inner_source(&v6("fd00:10:244:2::")));
        assert!(a.allows_inner_source(&v6("fd00:10:244:2:ffff:ffff:ffff:ffff")));
        assert!(!a.allows_inner_source(&v6("fd00:10:244:3::1")));
        assert!(!a.allows_inner_source(&v6("fe80::1")));
        assert!(!a.allows_inner_source(&v6("2001:db8::7")));
        // prefixes that end inside either half, and the extremes
        let p56 = accept6("fd00:10:244:200::", 56, 0);
        assert!(p56.allows_inner_source(&v6("fd00:10:244:2ff::1")));
        assert!(!p56.allows_inner_source(&v6("fd00:10:244:300::1")));
        let p120 = accept6("fd00:10:244:2::100", 120, 0);
        assert!(p120.allows_inner_source(&v6("fd00:10:244:2::1ff")));
        assert!(!p120.allows_inner_source(&v6("fd00:10:244:2::200")));
        let host = accept6("fd00:10:244:2::7", 128, 0);
        assert!(host.allows_inner_source(&v6("fd00:10:244:2::7")));
        assert!(!host.allows_inner_source(&v6("fd00:10:244:2::8")));
        assert!(accept6("::", 0, 0).allows_inner_source(&v6("2001:db8::7")));
        // host bits in the entry are masked like the source's
        assert!(accept6("fd00:10:244:2::ff", 64, 0).allows_inner_source(&v6("fd00:10:244:2::1")));
    }

    #[test]
    fn the_exemption_allows_any_inner_ipv6_source() {
        assert!(accept6("fd00:10:244:2::", 64, ACCEPT_ANY_INNER_SOURCE).allows_inner_source(&v6("2001:db8::7")));
    }

    #[test]
    fn ipv6_is_off_while_the_public_ipv6_is_all_zero() {
        let mut c = DataplaneConfig::default();
        assert!(!c.ipv6_on());
        c.public_ip6 = v6("fd00:198:18::1");
        assert!(c.ipv6_on());
    }
}
