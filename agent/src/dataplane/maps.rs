//! Typed access to the pinned maps, for the running agent and for
//! `edgevx status` alike (both open them the same way: from their pins).
use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context, Result};
use aya::maps::{
    Array, HashMap, IterableMap, LpmTrie, Map, MapData, MapError, PerCpuArray, PerCpuHashMap, PerCpuValues,
    lpm_trie::Key,
};
use edgevx_common::{
    counters::{self, Counter, Slot},
    maps::{
        self as names, ACCEPT_ANY_INNER_SOURCE, DataplaneConfig, LocalPod, Peer as PeerEntry, PeerAccept, PeerAccept6,
        PeerStats,
    },
};
use ipnet::{Ipv4Net, Ipv6Net};

use tracing::warn;

use crate::gone;
use crate::{dataplane::bpffs::PinDir, family::Family, reconcile::Accept};

/// BPF_NOEXIST: insert only if absent (keeps counters across re-adds).
const NOEXIST: u64 = 1;

pub struct Maps {
    config: Array<MapData, DataplaneConfig>,
    subnets: LpmTrie<MapData, [u8; 4], PeerEntry>,
    stats: PerCpuHashMap<MapData, [u8; 4], PeerStats>,
    accept: HashMap<MapData, [u8; 4], PeerAccept>,
    accept6: HashMap<MapData, [u8; 16], PeerAccept6>,
    /// IPv6 pod CIDR → its owner's public IPv6; `None` when the programs
    /// pinned here are an earlier edgevx's, which had no such map.
    subnets6: Option<LpmTrie<MapData, [u8; 16], [u8; 16]>>,
    local_pods: HashMap<MapData, [u8; 4], LocalPod>,
    global: PerCpuArray<MapData, u64>,
    /// The counters added after layout v7 (see [`counters`]); `None` when the
    /// programs pinned here are an earlier edgevx's, which had no such map.
    more: Option<PerCpuArray<MapData, u64>>,
    /// How many peers the maps hold (see [`Maps::peer_capacity`]).
    peer_capacity: u32,
}

fn open(pins: &PinDir, name: &str) -> Result<Map> {
    let path = pins.map(name);
    let data = MapData::from_pin(&path).with_context(|| format!("cannot open pinned map {}", path.display()))?;
    Map::from_map_data(data).with_context(|| format!("pinned map {} has an unexpected type", path.display()))
}

fn typed<T: TryFrom<Map, Error = MapError>>(pins: &PinDir, name: &str) -> Result<T> {
    T::try_from(open(pins, name)?)
        .with_context(|| format!("pinned map {name} does not have the layout this edgevx expects"))
}

fn lpm_key(subnet: Ipv4Net) -> Key<[u8; 4]> {
    Key::new(subnet.prefix_len() as u32, subnet.network().octets())
}

/// A peer's accept entry as the programs hold it (its subnet's network
/// address, prefix length and flags), read the same way for both
/// families. An impossible prefix length (only a hand-written entry has
/// one) reads as the family's whole space (0.0.0.0/0, ::/0), which no plan
/// contains, so the pass rewrites the entry or deletes it; the peer is
/// named in a warning, and the other peers are read as ever.
fn accept_of<N: Family>(peer: N::Addr, network: N::Addr, prefix_len: u8, flags: u8) -> Accept<N> {
    let subnet = N::with_len(network, prefix_len).unwrap_or_else(|| {
        warn!(%peer, prefix_len, "a peer's accept entry has an impossible prefix length (written by hand?); the next pass rewrites it");
        N::default()
    });
    Accept { subnet, any_inner_source: flags & ACCEPT_ANY_INNER_SOURCE != 0 }
}

/// Sums a per-CPU peer counter set.
fn sum(values: &PerCpuValues<PeerStats>) -> PeerStats {
    values.iter().fold(PeerStats::default(), |mut a, v| {
        a.tx_packets += v.tx_packets;
        a.tx_bytes += v.tx_bytes;
        a.rx_packets += v.rx_packets;
        a.rx_bytes += v.rx_bytes;
        a.tx_errors += v.tx_errors;
        a
    })
}

impl Maps {
    /// Opens the maps pinned under `pins` (the loader pins them on load).
    pub fn open(pins: &PinDir) -> Result<Self> {
        let subnets: LpmTrie<MapData, [u8; 4], PeerEntry> = typed(pins, names::PEER_SUBNETS)?;
        let stats: PerCpuHashMap<MapData, [u8; 4], PeerStats> = typed(pins, names::PEER_STATS)?;
        let accept: HashMap<MapData, [u8; 4], PeerAccept> = typed(pins, names::PEER_ACCEPT)?;
        let accept6: HashMap<MapData, [u8; 16], PeerAccept6> = typed(pins, names::PEER_ACCEPT6)?;
        let subnets6: Option<LpmTrie<MapData, [u8; 16], [u8; 16]>> = match pins.map(names::PEER_SUBNETS6).exists() {
            true => Some(typed(pins, names::PEER_SUBNETS6)?),
            false => None,
        };
        let peer_capacity = [
            (names::PEER_SUBNETS, subnets.map()),
            (names::PEER_STATS, stats.map()),
            (names::PEER_ACCEPT, accept.map()),
            (names::PEER_ACCEPT6, accept6.map()),
        ]
        .into_iter()
        .chain(subnets6.as_ref().map(|m| (names::PEER_SUBNETS6, m.map())))
        .map(|(name, map)| Ok(map.info().with_context(|| format!("cannot read the size of map {name}"))?.max_entries()))
        .collect::<Result<Vec<u32>>>()?
        .into_iter()
        .min()
        .unwrap_or(0);
        Ok(Maps {
            config: typed(pins, names::CONFIG)?,
            subnets,
            stats,
            accept,
            accept6,
            subnets6,
            local_pods: typed(pins, names::LOCAL_PODS)?,
            global: typed(pins, names::GLOBAL_STATS)?,
            more: if pins.map(names::MORE_STATS).exists() { Some(typed(pins, names::MORE_STATS)?) } else { None },
            peer_capacity,
        })
    }

    /// How many peers the maps hold: the smallest `max_entries` of the
    /// maps with one entry per peer (the LPM map, the accept maps, the
    /// per-peer counters), as the kernel says. Today all are made with
    /// [`MAX_PEERS`](edgevx_common::maps::MAX_PEERS); pins an earlier run
    /// made keep the size they were made with.
    pub fn peer_capacity(&self) -> u32 {
        self.peer_capacity
    }

    pub fn set_config(&mut self, cfg: &DataplaneConfig) -> Result<()> {
        self.config.set(0, cfg, 0).context("cannot write the dataplane config map")
    }

    pub fn remove_subnet(&mut self, subnet: Ipv4Net) -> Result<()> {
        gone::removed(self.subnets.remove(&lpm_key(subnet)))
            .with_context(|| format!("cannot remove peer subnet {subnet}"))
    }

    fn remove_stats(&mut self, ip: Ipv4Addr) -> Result<()> {
        gone::removed(self.stats.remove(&ip.octets())).with_context(|| format!("cannot remove counters for {ip}"))
    }

    /// Every programmed subnet with its entry (what the programs see).
    pub fn subnets(&self) -> Result<Vec<(Ipv4Net, PeerEntry)>> {
        let mut out = Vec::new();
        for item in self.subnets.iter() {
            let (key, value) = item.context("cannot read the peer subnet map")?;
            let net = Ipv4Net::new(Ipv4Addr::from(key.data()), key.prefix_len() as u8)
                .context("bad key in the peer subnet map")?;
            out.push((net, value));
        }
        Ok(out)
    }

    pub fn peer_stats(&self, ip: Ipv4Addr) -> Option<PeerStats> {
        self.stats.get(&ip.octets(), 0).ok().map(|v| sum(&v))
    }

    /// One global counter, summed over the CPUs; `None` when the programs
    /// pinned here are an earlier edgevx's, which did not keep it.
    pub fn counter(&self, c: Counter) -> Result<Option<u64>> {
        let (array, i) = match c.slot() {
            Slot::First(i) => (&self.global, i),
            Slot::More(i) => match &self.more {
                Some(more) => (more, i),
                None => return Ok(None),
            },
        };
        let v = array.get(&i, 0).with_context(|| format!("cannot read counter {}", c.name()))?;
        Ok(Some(v.iter().sum()))
    }

    /// Every counter the pinned programs keep, by name.
    pub fn global_stats(&self) -> Result<BTreeMap<&'static str, u64>> {
        let mut out = BTreeMap::new();
        for c in Counter::ALL {
            if let Some(v) = self.counter(c)? {
                out.insert(c.name(), v);
            }
        }
        debug_assert!(out.len() == counters::COUNT as usize || self.more.is_none());
        Ok(out)
    }

    pub fn local_pods(&self) -> BTreeMap<[u8; 4], LocalPod> {
        self.local_pods.iter().filter_map(Result::ok).collect()
    }

    /// Makes the local pod table equal `want`.
    pub fn sync_local_pods(&mut self, want: &BTreeMap<[u8; 4], LocalPod>) -> Result<()> {
        let have = self.local_pods();
        for ip in have.keys().filter(|ip| !want.contains_key(*ip)) {
            let _ = self.local_pods.remove(ip);
        }
        for (ip, pod) in want {
            if have.get(ip) != Some(pod) {
                self.local_pods
                    .insert(ip, pod, 0)
                    .with_context(|| format!("cannot add local pod {}", Ipv4Addr::from(*ip)))?;
            }
        }
        Ok(())
    }
}

/// Key-by-key writes for the IPv4 table (`crate::reconcile::ipv4_maps::Ipv4MapWriter`).
impl Maps {
    /// `subnet` → the peer at `public_ip` with `vtep_mac` (overwrites in place).
    pub fn put_subnet(&mut self, subnet: Ipv4Net, public_ip: Ipv4Addr, vtep_mac: [u8; 6]) -> Result<()> {
        let entry = PeerEntry { public_ip: public_ip.octets(), vtep_mac, _pad: [0; 2] };
        self.subnets.insert(&lpm_key(subnet), &entry, 0).with_context(|| format!("cannot add peer subnet {subnet}"))
    }

    /// Gives the IPv4 peer at `ip` a zeroed counter set if it has none
    /// (existing counters stay).
    fn add_stats(&mut self, ip: Ipv4Addr) -> Result<()> {
        if self.stats.get(&ip.octets(), 0).is_ok() {
            return Ok(());
        }
        let zeros = PerCpuValues::try_from(vec![
            PeerStats::default();
            aya::util::nr_cpus().map_err(|(_, e)| e)?.get() as usize
        ])
        .context("cannot size per-CPU counters")?;
        match self.stats.insert(&ip.octets(), zeros, NOEXIST) {
            Ok(()) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("cannot add counters for {ip}")),
        }
    }
}

/// Both families' accept maps (`EDGEVX_PEER_ACCEPT`, `EDGEVX_PEER_ACCEPT6`):
/// which peers may send VXLAN, and the pod CIDR their inner sources are
/// bound to, judged by decap (and, for IPv6, the socket guard). Our own
/// public IPv6 goes in [`DataplaneConfig::public_ip6`]; while it is all
/// zero, IPv6 VXLAN is not judged and the IPv6 map is not read.
impl Maps {
    /// Every peer of family `N` we accept VXLAN from, with its binding (what decap sees).
    pub fn accepted<N: AcceptFamily>(&self) -> Result<BTreeMap<N::Addr, Accept<N>>> {
        let mut out = BTreeMap::new();
        for item in N::map(self).iter() {
            let (key, e) = item.with_context(|| format!("cannot read the {} accept map", N::PEER))?;
            let peer = N::addr(key);
            out.insert(peer, N::read(peer, &e));
        }
        Ok(out)
    }

    /// Accepts VXLAN from `ip`, its inner sources bound as `a` says
    /// (overwrites in place), with the peer's counters when the family
    /// keeps some.
    pub fn put_accept<N: AcceptFamily>(&mut self, ip: N::Addr, a: &Accept<N>) -> Result<()> {
        N::counted(self, ip, true)?;
        N::map_mut(self)
            .insert(&N::key(ip), &N::entry(a), 0)
            .with_context(|| format!("cannot accept {} from peer {ip}", N::VXLAN))
    }

    /// Stops accepting VXLAN from `ip` (a peer not there is fine) and drops
    /// its counters.
    pub fn remove_accept<N: AcceptFamily>(&mut self, ip: N::Addr) -> Result<()> {
        gone::removed(N::map_mut(self).remove(&N::key(ip)))
            .with_context(|| format!("cannot stop accepting {} from {ip}", N::VXLAN))?;
        N::counted(self, ip, false)
    }
}

/// Where a family's accept map is in [`Maps`] and how its entries are laid
/// out: the rest of the accept path is one for both families.
pub trait AcceptFamily: Family {
    /// The map's key: the public IP's bytes.
    type Key: aya::Pod + Ord;
    /// The map's value.
    type Entry: aya::Pod;
    /// How the map is named in messages.
    const PEER: &'static str;
    /// What the map lets in, in messages.
    const VXLAN: &'static str;
    fn map(m: &Maps) -> &HashMap<MapData, Self::Key, Self::Entry>;
    fn map_mut(m: &mut Maps) -> &mut HashMap<MapData, Self::Key, Self::Entry>;
    fn key(ip: Self::Addr) -> Self::Key;
    fn addr(key: Self::Key) -> Self::Addr;
    fn entry(a: &Accept<Self>) -> Self::Entry;
    fn read(peer: Self::Addr, e: &Self::Entry) -> Accept<Self>;
    /// Adds (`true`) or drops the peer's counters. Encap and decap count
    /// per IPv4 peer; the IPv6 peers' packets are the kernel's (its VXLAN
    /// device carries them), so there are none to keep.
    fn counted(m: &mut Maps, ip: Self::Addr, add: bool) -> Result<()>;
}

impl AcceptFamily for Ipv4Net {
    type Key = [u8; 4];
    type Entry = PeerAccept;
    const PEER: &'static str = "peer";
    const VXLAN: &'static str = "VXLAN";
    fn map(m: &Maps) -> &HashMap<MapData, [u8; 4], PeerAccept> {
        &m.accept
    }
    fn map_mut(m: &mut Maps) -> &mut HashMap<MapData, [u8; 4], PeerAccept> {
        &mut m.accept
    }
    fn key(ip: Ipv4Addr) -> [u8; 4] {
        ip.octets()
    }
    fn addr(key: [u8; 4]) -> Ipv4Addr {
        key.into()
    }
    fn entry(a: &Accept<Self>) -> PeerAccept {
        PeerAccept {
            pod_subnet: a.subnet.network().octets(),
            prefix_len: a.subnet.prefix_len(),
            flags: if a.any_inner_source { ACCEPT_ANY_INNER_SOURCE } else { 0 },
            _pad: [0; 2],
        }
    }
    fn read(peer: Ipv4Addr, e: &PeerAccept) -> Accept<Self> {
        accept_of(peer, e.pod_subnet.into(), e.prefix_len, e.flags)
    }
    fn counted(m: &mut Maps, ip: Ipv4Addr, add: bool) -> Result<()> {
        match add {
            true => m.add_stats(ip),
            false => m.remove_stats(ip),
        }
    }
}

impl AcceptFamily for Ipv6Net {
    type Key = [u8; 16];
    type Entry = PeerAccept6;
    const PEER: &'static str = "IPv6 peer";
    const VXLAN: &'static str = "IPv6 VXLAN";
    fn map(m: &Maps) -> &HashMap<MapData, [u8; 16], PeerAccept6> {
        &m.accept6
    }
    fn map_mut(m: &mut Maps) -> &mut HashMap<MapData, [u8; 16], PeerAccept6> {
        &mut m.accept6
    }
    fn key(ip: Ipv6Addr) -> [u8; 16] {
        ip.octets()
    }
    fn addr(key: [u8; 16]) -> Ipv6Addr {
        key.into()
    }
    fn entry(a: &Accept<Self>) -> PeerAccept6 {
        PeerAccept6 {
            pod_subnet: a.subnet.network().octets(),
            prefix_len: a.subnet.prefix_len(),
            flags: if a.any_inner_source { ACCEPT_ANY_INNER_SOURCE } else { 0 },
            _pad: [0; 2],
        }
    }
    fn read(peer: Ipv6Addr, e: &PeerAccept6) -> Accept<Self> {
        accept_of(peer, e.pod_subnet.into(), e.prefix_len, e.flags)
    }
    fn counted(_: &mut Maps, _: Ipv6Addr, _: bool) -> Result<()> {
        Ok(())
    }
}

/// The IPv6 owner map (`EDGEVX_PEER_SUBNETS6`): whose an inner IPv6
/// source is, for the judge. The kernel's routes on `flannel-v6.<VNI>`
/// carry the traffic; this map only mirrors which peer owns which prefix.
impl Maps {
    fn owner_map(&mut self) -> Result<&mut LpmTrie<MapData, [u8; 16], [u8; 16]>> {
        self.subnets6.as_mut().with_context(|| {
            format!("map {} is not pinned: the programs loaded are an earlier edgevx's", names::PEER_SUBNETS6)
        })
    }

    /// Every IPv6 pod CIDR with its owner, as the programs see them.
    pub fn ipv6_owners(&mut self) -> Result<BTreeMap<Ipv6Net, Ipv6Addr>> {
        let mut out = BTreeMap::new();
        for item in self.owner_map()?.iter() {
            let (key, owner) = item.context("cannot read the IPv6 peer subnet map")?;
            let net = Ipv6Net::new(Ipv6Addr::from(key.data()), key.prefix_len() as u8)
                .context("bad key in the IPv6 peer subnet map")?;
            out.insert(net, Ipv6Addr::from(owner));
        }
        Ok(out)
    }

    /// `subnet` is `owner`'s (overwrites in place).
    pub fn put_ipv6_owner(&mut self, subnet: Ipv6Net, owner: Ipv6Addr) -> Result<()> {
        let key = Key::new(subnet.prefix_len() as u32, subnet.network().octets());
        self.owner_map()?
            .insert(&key, &owner.octets(), 0)
            .with_context(|| format!("cannot add IPv6 peer subnet {subnet}"))
    }

    /// Forgets `subnet`; one not there is fine.
    pub fn remove_ipv6_owner(&mut self, subnet: Ipv6Net) -> Result<()> {
        let key = Key::new(subnet.prefix_len() as u32, subnet.network().octets());
        gone::removed(self.owner_map()?.remove(&key))
            .with_context(|| format!("cannot remove IPv6 peer subnet {subnet}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_accept_entry_round_trips() {
        for a in [
            Accept { subnet: "fd00:10:244:2::/64".parse().unwrap(), any_inner_source: false },
            Accept { subnet: "2001:db8:1:ff00::/56".parse().unwrap(), any_inner_source: true },
            Accept { subnet: "fd00::7/128".parse().unwrap(), any_inner_source: false },
        ] {
            let peer: Ipv6Addr = "fd00:198:18::2".parse().unwrap();
            assert_eq!(Ipv6Net::read(peer, &Ipv6Net::entry(&a)), a);
        }
    }

    #[test]
    fn an_ipv4_accept_entry_round_trips() {
        let peer: Ipv4Addr = "198.18.0.2".parse().unwrap();
        for (net, any) in [("10.244.2.0/24", false), ("10.244.0.0/16", true), ("10.244.2.7/32", false)] {
            let e = Ipv4Net::entry(&Accept { subnet: net.parse().unwrap(), any_inner_source: any });
            let a = Ipv4Net::read(peer, &e);
            assert_eq!((a.subnet, a.any_inner_source), (net.parse().unwrap(), any));
        }
    }

    #[test]
    fn the_entry_holds_the_network_address_and_the_flag() {
        let a = Accept { subnet: "fd00:10:244:2::9/64".parse().unwrap(), any_inner_source: true };
        let e = Ipv6Net::entry(&a);
        assert_eq!(Ipv6Addr::from(e.pod_subnet), "fd00:10:244:2::".parse::<Ipv6Addr>().unwrap());
        assert_eq!((e.prefix_len, e.flags), (64, ACCEPT_ANY_INNER_SOURCE));
    }

    #[test]
    fn an_impossible_prefix_length_reads_as_the_whole_space_in_both_families() {
        // the whole space is in no plan (a peer's subnet lies inside the
        // Network), so the pass's diff rewrites or deletes the entry
        let e6 = PeerAccept6 { prefix_len: 129, flags: ACCEPT_ANY_INNER_SOURCE, ..Default::default() };
        let a6 = Ipv6Net::read("fd00:198:18::2".parse().unwrap(), &e6);
        assert_eq!((a6.subnet, a6.any_inner_source), ("::/0".parse().unwrap(), true));
        let a4: Accept<Ipv4Net> = accept_of("198.18.0.2".parse().unwrap(), [10, 244, 2, 0].into(), 33, 0);
        assert_eq!((a4.subnet, a4.any_inner_source), ("0.0.0.0/0".parse().unwrap(), false));
    }
}
