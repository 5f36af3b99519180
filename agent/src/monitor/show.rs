//! One drop event as a line of text or a JSON object: what `edgevx monitor`
//! prints. Pure, beside its tests; the names of interfaces and peers come
//! in from the caller.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use edgevx_common::monitor::{
    DropEvent, EV_INNER, EV_INNER_PORTS, EV_INNER6, EV_OUTER, EV_OUTER_PORTS, EV_OUTER6, EV_PEER, EV_VNI, Program,
    reason_name,
};
use serde_json::{Value, json};

/// What turns numbers into names: interfaces by ifindex, peers by public IP.
#[derive(Debug, Default)]
pub struct Names {
    pub ifaces: HashMap<u32, String>,
    pub peers: HashMap<IpAddr, String>,
}

/// An event's reading, with everything the program did not parse `None`.
#[derive(Debug, PartialEq, Eq)]
pub struct Shown<'a> {
    pub reason: String,
    pub program: &'a str,
    pub direction: &'a str,
    pub iface: Option<&'a str>,
    pub outer: Option<Tuple>,
    pub vni: Option<u32>,
    pub inner: Option<Tuple>,
    pub peer: Option<(IpAddr, Option<&'a str>)>,
}

/// Addresses, protocol and (when there) ports of one IP header.
#[derive(Debug, PartialEq, Eq)]
pub struct Tuple {
    pub proto: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ports: Option<(u16, u16)>,
}

fn addr(b: &[u8; 16], v6: bool) -> IpAddr {
    if v6 { IpAddr::V6(Ipv6Addr::from(*b)) } else { IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])) }
}

pub fn read<'a>(ev: &DropEvent, names: &'a Names) -> Shown<'a> {
    let program = Program::from_u8(ev.program);
    let has = |bit: u8| ev.flags & bit != 0;
    let outer = has(EV_OUTER).then(|| Tuple {
        proto: ev.outer_proto,
        src: addr(&ev.outer_src, has(EV_OUTER6)),
        dst: addr(&ev.outer_dst, has(EV_OUTER6)),
        ports: has(EV_OUTER_PORTS).then_some((ev.outer_sport, ev.outer_dport)),
    });
    let inner = has(EV_INNER).then(|| Tuple {
        proto: ev.inner_proto,
        src: addr(&ev.inner_src, has(EV_INNER6)),
        dst: addr(&ev.inner_dst, has(EV_INNER6)),
        ports: has(EV_INNER_PORTS).then_some((ev.inner_sport, ev.inner_dport)),
    });
    // the peer is IPv6 exactly when the outer header is (decap: its
    // source; encap: the IPv4 next hop, there being no IPv6 encap)
    let peer = has(EV_PEER).then(|| {
        let ip = addr(&ev.peer, has(EV_OUTER6));
        (ip, names.peers.get(&ip).map(String::as_str))
    });
    Shown {
        reason: reason_name(ev.reason).map_or_else(|| format!("reason_{}", ev.reason), str::to_string),
        program: program.map_or("unknown", |p| p.name()),
        direction: program.map_or("unknown", |p| p.direction()),
        iface: names.ifaces.get(&ev.ifindex).map(String::as_str),
        outer,
        vni: has(EV_VNI).then_some(ev.vni),
        inner,
        peer,
    }
}

fn proto_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        n => format!("proto-{n}"),
    }
}

fn endpoint(ip: IpAddr, port: Option<u16>) -> String {
    match (ip, port) {
        (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
        (a, Some(p)) => format!("{a}:{p}"),
        (a, None) => a.to_string(),
    }
}

impl std::fmt::Display for Tuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (sp, dp) = self.ports.map_or((None, None), |(s, d)| (Some(s), Some(d)));
        write!(f, "{} {} -> {}", proto_name(self.proto), endpoint(self.src, sp), endpoint(self.dst, dp))
    }
}

impl Tuple {
    fn json(&self) -> Value {
        json!({
            "proto": proto_name(self.proto),
            "src": self.src.to_string(),
            "dst": self.dst.to_string(),
            "sport": self.ports.map(|p| p.0),
            "dport": self.ports.map(|p| p.1),
        })
    }
}

/// `time reason program iface direction outer [vni N] [| inner ...] [| peer ...]`.
pub fn line(time: &str, ev: &DropEvent, names: &Names) -> String {
    let s = read(ev, names);
    let iface = s.iface.map_or_else(|| format!("if{}", ev.ifindex), str::to_string);
    let mut out = format!("{time} {} {} {iface} {}", s.reason, s.program, s.direction);
    if let Some(o) = &s.outer {
        out += &format!(" {o}");
    }
    if let Some(v) = s.vni {
        out += &format!(" vni {v}");
    }
    if let Some(i) = &s.inner {
        out += &format!(" | inner {i}");
    }
    if let Some((ip, node)) = s.peer {
        out += &format!(" | peer {ip}");
        if let Some(n) = node {
            out += &format!(" ({n})");
        }
    }
    out
}

/// One JSON object per event (`--json`).
pub fn json(time: &str, ev: &DropEvent, names: &Names) -> Value {
    let s = read(ev, names);
    json!({
        "time": time,
        "type": "drop",
        "reason": s.reason,
        "program": s.program,
        "direction": s.direction,
        "ifindex": ev.ifindex,
        "iface": s.iface,
        "len": ev.len,
        "outer": s.outer.as_ref().map(Tuple::json),
        "vni": s.vni,
        "inner": s.inner.as_ref().map(Tuple::json),
        "peer": s.peer.map(|(ip, node)| json!({"ip": ip.to_string(), "node": node})),
    })
}

/// Unix nanoseconds as RFC 3339 UTC with milliseconds.
pub fn rfc3339(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let ms = (unix_ns / 1_000_000) % 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z", rem / 3600, (rem / 60) % 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day): Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use edgevx_common::counters::Counter;

    use super::*;

    fn stranger() -> DropEvent {
        let mut e = DropEvent {
            reason: Counter::DropUnknownPeer as u32,
            ifindex: 2,
            program: Program::Decap as u8,
            flags: EV_OUTER | EV_OUTER_PORTS | EV_VNI | EV_INNER | EV_INNER_PORTS,
            outer_proto: 17,
            inner_proto: 6,
            outer_sport: 40000,
            outer_dport: 8472,
            inner_sport: 1234,
            inner_dport: 80,
            vni: 1,
            ..Default::default()
        };
        e.outer_src[..4].copy_from_slice(&[198, 18, 0, 66]);
        e.outer_dst[..4].copy_from_slice(&[198, 18, 0, 1]);
        e.inner_src[..4].copy_from_slice(&[10, 244, 2, 9]);
        e.inner_dst[..4].copy_from_slice(&[10, 244, 1, 2]);
        e
    }

    #[test]
    fn a_strangers_vxlan_reads_as_one_line() {
        let mut names = Names::default();
        names.ifaces.insert(2, "eth0".into());
        assert_eq!(
            line("T", &stranger(), &names),
            "T drop_unknown_peer decap eth0 ingress udp 198.18.0.66:40000 -> 198.18.0.1:8472 vni 1 | inner tcp \
             10.244.2.9:1234 -> 10.244.1.2:80"
        );
    }

    #[test]
    fn a_known_peer_is_named_and_missing_parts_are_null() {
        let mut e = stranger();
        e.reason = Counter::DropSpoofedSource as u32;
        e.flags = EV_OUTER | EV_PEER;
        e.peer[..4].copy_from_slice(&[198, 18, 0, 2]);
        let mut names = Names::default();
        names.peers.insert("198.18.0.2".parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), "node-b".into());
        let j = json("T", &e, &names);
        assert_eq!(j["reason"], "drop_spoofed_source");
        assert_eq!(j["iface"], Value::Null);
        assert_eq!(j["outer"]["src"], "198.18.0.66");
        assert_eq!(j["outer"]["sport"], Value::Null);
        assert_eq!(j["vni"], Value::Null);
        assert_eq!(j["inner"], Value::Null);
        assert_eq!(j["peer"], json!({"ip": "198.18.0.2", "node": "node-b"}));
        assert!(
            line("T", &e, &names).ends_with("if2 ingress udp 198.18.0.66 -> 198.18.0.1 | peer 198.18.0.2 (node-b)")
        );
    }

    #[test]
    fn ipv6_endpoints_are_bracketed() {
        let mut e = stranger();
        e.flags |= EV_OUTER6;
        let v6 = |s: &str| s.parse::<Ipv6Addr>().map(|a| a.octets()).unwrap_or_default();
        (e.outer_src, e.outer_dst) = (v6("fd00::66"), v6("fd00::1"));
        let names = Names::default();
        let s = read(&e, &names);
        assert_eq!(s.outer.map(|o| o.to_string()).unwrap_or_default(), "udp [fd00::66]:40000 -> [fd00::1]:8472");
    }

    #[test]
    fn unix_time_formats_as_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T12:34:56.789Z, a leap day
        assert_eq!(rfc3339(1_709_210_096_789_000_000), "2024-02-29T12:34:56.789Z");
    }
}
