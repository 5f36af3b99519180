//! The maps, named as `edgevx_common::maps` names them (the static's name is
//! the map name). All are pinned by name so they outlive the agent.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, PerCpuHashMap, ProgramArray, RingBuf},
};
use edgevx_common::{
    counters,
    fastpath::{FP_EVENTS_BYTES, FP_SEEN_ENTRIES, FastPathConfig, FlowKey, Seen},
    maps::{
        DataplaneConfig, IP_ID_BUCKETS, LocalPod, MAX_LOCAL_PODS, MAX_PEERS, Peer, PeerAccept, PeerAccept6, PeerStats,
    },
    monitor::{MON_EVENTS_BYTES, MonitorBudget, MonitorWatch},
};

#[map]
pub static EDGEVX_CONFIG: Array<DataplaneConfig> = Array::pinned(1, 0);

#[map]
pub static EDGEVX_PEER_SUBNETS: LpmTrie<[u8; 4], Peer> = LpmTrie::pinned(MAX_PEERS, 0);

#[map]
pub static EDGEVX_PEER_SUBNETS6: LpmTrie<[u8; 16], [u8; 16]> = LpmTrie::pinned(MAX_PEERS, 0);

#[map]
pub static EDGEVX_PEER_STATS: PerCpuHashMap<[u8; 4], PeerStats> = PerCpuHashMap::pinned(MAX_PEERS, 0);

#[map]
pub static EDGEVX_PEER_ACCEPT: HashMap<[u8; 4], PeerAccept> = HashMap::pinned(MAX_PEERS, 0);

#[map]
pub static EDGEVX_PEER_ACCEPT6: HashMap<[u8; 16], PeerAccept6> = HashMap::pinned(MAX_PEERS, 0);

#[map]
pub static EDGEVX_LOCAL_PODS: HashMap<[u8; 4], LocalPod> = HashMap::pinned(MAX_LOCAL_PODS, 0);

#[map]
pub static EDGEVX_IP_ID: PerCpuArray<u32> = PerCpuArray::pinned(1, 0);

/// The outer IP ID counters of the full encap, shared by every CPU: one
/// per destination bucket, as the kernel's `ip_idents`; the last slot
/// holds the bucket salt.
#[map]
pub static EDGEVX_IP_IDENTS: Array<u64> = Array::pinned(IP_ID_BUCKETS + 1, 0);

#[map]
pub static EDGEVX_GLOBAL_STATS: PerCpuArray<u64> = PerCpuArray::pinned(counters::FIRST_ARRAY_LEN, 0);

#[map]
pub static EDGEVX_MORE_STATS: PerCpuArray<u64> = PerCpuArray::pinned(counters::MORE_ARRAY_LEN, 0);

#[map]
pub static EDGEVX_FP_CONFIG: Array<FastPathConfig> = Array::pinned(1, 0);

#[map]
pub static EDGEVX_FP_SEEN: LruHashMap<FlowKey, Seen> = LruHashMap::pinned(FP_SEEN_ENTRIES, 0);

#[map]
pub static EDGEVX_FP_EVENTS: RingBuf = RingBuf::pinned(FP_EVENTS_BYTES, 0);

#[map]
pub static EDGEVX_MON_WATCH: Array<MonitorWatch> = Array::pinned(1, 0);

#[map]
pub static EDGEVX_MON_BUDGET: PerCpuArray<MonitorBudget> = PerCpuArray::pinned(1, 0);

#[map]
pub static EDGEVX_MON_EVENTS: RingBuf = RingBuf::pinned(MON_EVENTS_BYTES, 0);

#[map]
pub static EDGEVX_MON_PROGS: ProgramArray = ProgramArray::pinned(1, 0);
