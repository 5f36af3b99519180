//! The two address families as one type parameter. What edgevx does the
//! same way for IPv4 and IPv6 is written once over `N: Family` (`Ipv4Net`
//! or `Ipv6Net`), and what differs between them is data here: the address
//! type, the netlink family, and which addresses no VTEP can have.
//!
//! A leaf: it imports nothing of edgevx.
use std::{
    fmt::{Debug, Display},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::packet_route::AddressFamily;

/// A prefix of one address family, and what the family decides. Its
/// `Default` is the whole space (`0.0.0.0/0`, `::/0`).
pub trait Family: Copy + Ord + Debug + Display + Default + Into<IpNet> {
    type Addr: Copy + Ord + Debug + Display + Into<IpAddr>;
    /// The netlink family its routes are dumped in (`ip -4` / `ip -6`).
    const NETLINK: AddressFamily;
    /// IPv6: no broadcast, and the `ip6tables` binary.
    const IPV6: bool;
    /// `IPv4` / `IPv6`, as flannel's network config and the logs say it.
    const NAME: &'static str;
    /// The multicast range, as iptables spells it.
    const MULTICAST: &'static str;
    /// The binary that writes this family's firewall rules.
    const IPTABLES: &'static str;
    /// `addr/len`, `None` when `len` is too long for the family.
    fn with_len(addr: Self::Addr, len: u8) -> Option<Self>;
    /// The address of `addr` when it is of this family.
    fn of(addr: IpAddr) -> Option<Self::Addr>;
    /// The family's `0.0.0.0` or `::` (a route without a destination).
    fn unspecified() -> Self::Addr;
    fn network_addr(&self) -> Self::Addr;
    fn prefix_length(&self) -> u8;
    /// `addr` lies within.
    fn holds(&self, addr: &Self::Addr) -> bool;
    /// `other` lies within.
    fn covers(&self, other: &Self) -> bool;
    /// What kind of address `ip` is, if no VTEP can have it.
    fn not_unicast(ip: Self::Addr) -> Option<&'static str>;
    /// The address's width: 32 or 128.
    const BITS: u8;
    /// The address as a number, for stepping through a range.
    fn bits(addr: Self::Addr) -> u128;
    /// The address of a number [`bits`](Self::bits) gave or a step from one
    /// within the family's width (an IPv4 one keeps the low 32 bits).
    fn from_bits(bits: u128) -> Self::Addr;
    /// The prefix's last address as a number.
    fn last_bits(&self) -> u128 {
        let host = u128::MAX.checked_shr(u32::from(128 - Self::BITS + self.prefix_length())).unwrap_or(0);
        Self::bits(self.network_addr()) | host
    }
}

macro_rules! family {
    ($net:ty, $addr:ty, $bits:ty, $variant:ident, $netlink:ident, $v6:expr, $name:expr, $multicast:expr, $iptables:expr) => {
        impl Family for $net {
            type Addr = $addr;
            const NETLINK: AddressFamily = AddressFamily::$netlink;
            const IPV6: bool = $v6;
            const NAME: &'static str = $name;
            const MULTICAST: &'static str = $multicast;
            const IPTABLES: &'static str = $iptables;
            fn with_len(addr: $addr, len: u8) -> Option<Self> {
                <$net>::new(addr, len).ok()
            }
            fn of(addr: IpAddr) -> Option<$addr> {
                if let IpAddr::$variant(a) = addr { Some(a) } else { None }
            }
            fn unspecified() -> $addr {
                <$addr>::UNSPECIFIED
            }
            fn network_addr(&self) -> $addr {
                self.network()
            }
            fn prefix_length(&self) -> u8 {
                self.prefix_len()
            }
            fn holds(&self, addr: &$addr) -> bool {
                self.contains(addr)
            }
            fn covers(&self, other: &Self) -> bool {
                self.contains(other)
            }
            fn not_unicast(ip: $addr) -> Option<&'static str> {
                ip.special()
            }
            const BITS: u8 = <$bits>::BITS as u8;
            fn bits(addr: $addr) -> u128 {
                u128::from(addr.to_bits())
            }
            fn from_bits(bits: u128) -> $addr {
                <$addr>::from_bits(bits as $bits)
            }
        }
    };
}
family!(Ipv4Net, Ipv4Addr, u32, V4, Inet, false, "IPv4", "224.0.0.0/4", "iptables");
family!(Ipv6Net, Ipv6Addr, u128, V6, Inet6, true, "IPv6", "ff00::/8", "ip6tables");

/// The addresses of one type that no VTEP can have, which
/// [`Family::not_unicast`] asks for. Written per address type, not over the
/// family: each family has its own special ranges, and Rust's `Ipv4Addr`
/// and `Ipv6Addr` their own tests for them.
trait SpecialRanges {
    /// What kind of special address this is, if it is one.
    fn special(self) -> Option<&'static str>;
}

impl SpecialRanges for Ipv4Addr {
    fn special(self) -> Option<&'static str> {
        if self.octets()[0] == 0 {
            Some("0.0.0.0/8, \"this network\"")
        } else if self.is_loopback() {
            Some("loopback")
        } else if self.is_multicast() {
            Some("multicast")
        } else if self.is_broadcast() {
            Some("broadcast")
        } else if self.is_link_local() {
            // one link only; 169.254.1.1 is also the VTEP's on-link gateway
            Some("link-local, 169.254.0.0/16")
        } else if self.octets()[0] >= 240 {
            Some("reserved, 240.0.0.0/4")
        } else {
            None
        }
    }
}

/// A link-local address is reachable only on one link and the kernel would
/// need a scope for it, so a peer's `flannel-v6` device could not send to it.
impl SpecialRanges for Ipv6Addr {
    fn special(self) -> Option<&'static str> {
        if self.is_unspecified() {
            Some("unspecified")
        } else if self.is_loopback() {
            Some("loopback")
        } else if self.is_multicast() {
            Some("multicast")
        } else if self.segments()[0] & 0xffc0 == 0xfe80 {
            Some("link-local, fe80::/10")
        } else if self.to_ipv4_mapped().is_some() {
            // never on the wire as IPv6: the kernel would send it as IPv4
            Some("IPv4-mapped, ::ffff:0:0/96; give the IPv4 address as public-ip")
        } else if self.segments()[..6] == [0; 6] {
            Some("IPv4-compatible, ::/96 (deprecated)")
        } else {
            None
        }
    }
}
