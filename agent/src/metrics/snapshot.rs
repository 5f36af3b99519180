//! The dataplane's counters and map sizes, read from the pinned maps at
//! scrape time on the metrics thread. The programs already count every
//! packet in per-CPU maps; nothing here adds work per packet.
use anyhow::{Context, Result};
use aya::maps::{Map, MapData, PerCpuHashMap};
use edgevx_common::{
    counters::Counter,
    maps::{self as names, MAX_LOCAL_PODS, PeerStats},
};

use super::{report::PeerKey, series::PeerSample};
use crate::dataplane::{bpffs::PinDir, maps::Maps};

/// How full one map is (`edgevx_map_entries{map}`, `edgevx_map_fill_ratio{map}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapFill {
    pub map: &'static str,
    pub entries: u64,
    pub capacity: u64,
}

impl MapFill {
    pub fn ratio(&self) -> f64 {
        if self.capacity == 0 { 0.0 } else { self.entries as f64 / self.capacity as f64 }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Every global counter, summed over CPUs.
    pub global: Vec<(Counter, u64)>,
    /// The programmed peers' counters (not capped yet).
    pub peers: Vec<PeerSample>,
    pub maps: Vec<MapFill>,
}

/// Entries in the per-peer counter map (one per peer whose VXLAN we accept).
fn peer_stats_entries(pins: &PinDir) -> Result<u64> {
    let path = pins.map(names::PEER_STATS);
    let data = MapData::from_pin(&path).with_context(|| format!("cannot open pinned map {}", path.display()))?;
    let map =
        Map::from_map_data(data).with_context(|| format!("pinned map {} has an unexpected type", path.display()))?;
    let stats: PerCpuHashMap<MapData, [u8; 4], PeerStats> =
        PerCpuHashMap::try_from(map).with_context(|| format!("{} is not the per-peer counter map", path.display()))?;
    let mut n = 0;
    for key in stats.keys() {
        key.context("cannot list the per-peer counters")?;
        n += 1;
    }
    Ok(n)
}

impl Snapshot {
    /// Reads the maps pinned under `pins`; `peers` names the programmed
    /// peers, whose counters are keyed by public IP.
    pub fn read(pins: &PinDir, peers: &[PeerKey]) -> Result<Snapshot> {
        let maps = Maps::open(pins)?;
        let sums = maps.global_stats()?;
        let global = Counter::ALL.iter().map(|c| (*c, sums.get(c.name()).copied().unwrap_or(0))).collect();
        let peers = peers
            .iter()
            .map(|p| PeerSample {
                node: p.node.clone(),
                ip: p.public_ip.to_string(),
                // a peer whose counters are gone (removed meanwhile) reads as zeros
                stats: maps.peer_stats(p.public_ip).unwrap_or_default(),
            })
            .collect();
        // the size the kernel has for them (pins made by an earlier run keep theirs)
        let peers_capacity = maps.peer_capacity().into();
        let fill = vec![
            MapFill { map: "peer_subnets", entries: maps.subnets().map(|s| s.len() as u64)?, capacity: peers_capacity },
            MapFill { map: "peer_stats", entries: peer_stats_entries(pins)?, capacity: peers_capacity },
            MapFill { map: "local_pods", entries: maps.local_pods().len() as u64, capacity: MAX_LOCAL_PODS.into() },
        ];
        Ok(Snapshot { global, peers, maps: fill })
    }
}
