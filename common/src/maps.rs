//! Map names, keys and values. The names are the ELF symbol names of the
//! maps in the eBPF object and the file names of their pins.

/// `Array<DataplaneConfig>` with one slot: what the agent told the programs.
pub const CONFIG: &str = "EDGEVX_CONFIG";
/// `LpmTrie<[u8; 4], Peer>`: remote pod subnet -> peer VTEP (the fdb+arp of flannel).
pub const PEER_SUBNETS: &str = "EDGEVX_PEER_SUBNETS";
/// `PerCpuHashMap<[u8; 4], PeerStats>`: per-peer counters, keyed by peer public IP.
pub const PEER_STATS: &str = "EDGEVX_PEER_STATS";
/// `HashMap<[u8; 4], PeerAccept>`: keyed by peer public IP. A key is present
/// exactly for the peers whose VXLAN we accept; the value binds the inner
/// source of what they send to their pod CIDR.
pub const PEER_ACCEPT: &str = "EDGEVX_PEER_ACCEPT";
/// `HashMap<[u8; 4], LocalPod>`: local pod IP -> its host-side veth and MACs.
pub const LOCAL_PODS: &str = "EDGEVX_LOCAL_PODS";
/// `PerCpuArray<u32>` with one slot: the next outer IP ID on this CPU.
pub const IP_ID: &str = "EDGEVX_IP_ID";
/// `PerCpuArray<u64>` indexed by [`crate::counters::Counter`].
pub const GLOBAL_STATS: &str = "EDGEVX_GLOBAL_STATS";

/// All pinned maps, for status and cleanup.
pub const ALL: [&str; 7] = [CONFIG, PEER_SUBNETS, PEER_STATS, PEER_ACCEPT, LOCAL_PODS, IP_ID, GLOBAL_STATS];

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

/// What the agent configured; read by both programs on every packet.
///
/// IPv4 addresses are in network byte order as bytes, the way they sit in
/// a packet; `vni` and `port` are host order.
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
    unsafe impl aya::Pod for super::LocalPod {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    /// Sizes equal the sum of the fields: no implicit padding reaches the kernel.
    #[test]
    fn layouts_have_no_padding() {
        assert_eq!(size_of::<DataplaneConfig>(), 4 + 4 + 6 + 2 + 4 + 4 + 4);
        assert_eq!(size_of::<Peer>(), 12);
        assert_eq!(size_of::<PeerStats>(), 40);
        assert_eq!(size_of::<LocalPod>(), 16);
        assert_eq!(size_of::<PeerAccept>(), 4 + 1 + 1 + 2);
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
}
