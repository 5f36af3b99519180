//! `edgevx status` as a table, from the same document `--json` prints.
use std::fmt::{self, Display, Write as _};

use super::document::{BroughtUp, Node, Source, Status};

/// A field the document may leave null, as the table says it: its value,
/// or `null` as the JSON does.
fn or_null<T: Display>(x: Option<T>) -> String {
    x.map_or_else(|| "null".to_string(), |x| x.to_string())
}

/// The control plane in one line: connected (and for how long) or cut off
/// on its cached view, and the view's age.
fn source_line(src: &Source) -> String {
    let (name, since) = (&src.name, src.since_seconds);
    let age = src.view_age_seconds.map_or("no view yet".to_string(), |a| format!("view {a} s old"));
    let cached = if src.connected { "" } else { ", the cached view" };
    if src.watching {
        format!("source {name}: watching for {since} s, {age}{cached}")
    } else {
        format!("source {name}: NOT in touch for {since} s, forwarding on the last view ({age}{cached})")
    }
}

/// The document as the table `status` prints.
pub(super) fn render(doc: &Status) -> Result<String, fmt::Error> {
    let mut out = String::new();
    let a = &doc.agent;
    let agent = match a.agent_running {
        true => format!(
            "running{}{}",
            a.agent_pid.map_or(String::new(), |p| format!(" (pid {p})")),
            a.agent_phase.as_ref().map_or(String::new(), |p| format!(": {p};"))
        ),
        false => "stopped".to_string(),
    };
    let version = match a.agent_version.as_deref() {
        Some(v) if v != env!("CARGO_PKG_VERSION") => format!("edgevx {} (agent {v})", env!("CARGO_PKG_VERSION")),
        _ => format!("edgevx {}", env!("CARGO_PKG_VERSION")),
    };
    writeln!(out, "{version}  {}", doc.verdict)?;
    if let Some(src) = &a.source {
        writeln!(out, "{}", source_line(src))?;
    }
    let node = &doc.node;
    let Some(up) = &node.brought_up else {
        writeln!(out, "agent {agent} nothing brought up yet (no agent record in the state dir)")?;
        if !node.pinned.is_empty() {
            writeln!(out, "pinned: {}", node.pinned.join(" "))?;
        }
        return Ok(out);
    };
    writeln!(
        out,
        "node {}  agent {agent}  dataplane {}",
        or_null(node.node.as_ref()),
        if node.dataplane_attached { "attached" } else { "NOT attached" }
    )?;
    if !up.ahead_of_decap.is_empty() {
        writeln!(
            out,
            "NOT first on {}'s ingress: {} run ahead of edgevx's decap (the agent puts it back first at its next \
             check; meanwhile VXLAN they pass on unjudged is dropped on the VTEP)",
            up.iface,
            up.ahead_of_decap.join("; ")
        )?;
    }
    print_vteps(&mut out, up)?;
    print_features(&mut out, up)?;
    print_peers(&mut out, node, up)?;
    Ok(out)
}

/// The VTEP lines: IPv4 (or the IPv6-only line), then the IPv6 VTEP.
fn print_vteps(out: &mut String, up: &BroughtUp) -> fmt::Result {
    let v4 = &up.vtep;
    if v4.vtep_device.is_none() {
        // IPv6-only: the IPv6 VTEP below is the only one
        writeln!(out, "vni {} port {} mtu {} (IPv6-only)", up.vni, up.port, up.mtu)?;
    } else {
        writeln!(
            out,
            "vtep {} mac {} vni {} port {} public-ip {} subnet {} mtu {} delivery {}",
            or_null(v4.vtep_device.as_ref()),
            or_null(v4.vtep_mac),
            up.vni,
            up.port,
            or_null(v4.public_ip),
            or_null(v4.subnet),
            up.mtu,
            up.delivery.name()
        )?;
    }
    if let Some(v6) = &up.vtep6 {
        writeln!(
            out,
            "vtep {} mac {} public-ip {} subnet {} mtu {} (IPv6)",
            v6.device, v6.mac, v6.public_ip, v6.subnet, v6.mtu
        )?;
    }
    Ok(())
}

/// Bring-up timings, the XDP judge and the fast path.
fn print_features(out: &mut String, up: &BroughtUp) -> fmt::Result {
    if let Some(t) = &up.startup {
        let step = |ms: Option<f64>| ms.map_or("-".to_string(), |ms| format!("{ms:.0} ms"));
        writeln!(
            out,
            "started: subnet.env {}, VTEP up {}, attached {}, first peer {}, all peers {} (from process start)",
            step(t.subnet_env_ms),
            step(t.vtep_up_ms),
            step(t.attached_ms),
            step(t.first_peer_ms),
            step(t.all_peers_ms)
        )?;
    }
    let x = &up.xdp_judge;
    match (x.attached, &x.reason) {
        (Some(true), _) => writeln!(out, "xdp judge on {} (native)", up.iface)?,
        (_, Some(why)) => writeln!(out, "xdp judge not attached: {why}")?,
        _ => writeln!(out, "xdp judge not attached")?,
    }
    if let Some(fp) = &up.fast_path {
        writeln!(out, "fast path {fp}")?;
    }
    Ok(())
}

/// The peer table (a dual-stack peer's IPv6 half on a line of its own), then the counters.
fn print_peers(out: &mut String, node: &Node, up: &BroughtUp) -> fmt::Result {
    let fill = &up.capacity;
    writeln!(out, "peers {}  capacity {}", node.peers.len(), or_null(fill.peer_capacity))?;
    if fill.peers_not_programmed > 0 {
        writeln!(
            out,
            "{} of the {} peers in the view NOT programmed: beyond the capacity (see the agent's log)",
            fill.peers_not_programmed,
            or_null(fill.peers_in_view)
        )?;
    }
    writeln!(
        out,
        "\n{:<20} {:<18} {:<16} {:<18} {:<6} {:>12} {:>12}",
        "PEER", "SUBNET", "PUBLIC IP", "VTEP MAC", "ROUTE", "TX PKTS", "RX PKTS"
    )?;
    for p in &node.peers {
        writeln!(
            out,
            "{:<20} {:<18} {:<16} {:<18} {:<6} {:>12} {:>12}",
            p.node,
            or_null(p.subnet),
            or_null(p.public_ip),
            or_null(p.vtep_mac),
            p.route.name(),
            or_null(p.counters.as_ref().map(|c| c.tx_packets)),
            or_null(p.counters.as_ref().map(|c| c.rx_packets))
        )?;
        // a dual-stack peer's IPv6 half, on a line of its own
        if let Some(h) = &p.v6 {
            writeln!(
                out,
                "{:<20} {:<18} {:<16} {:<18} {:<6}",
                "",
                h.subnet.to_string(),
                h.public_ip.to_string(),
                h.vtep_mac.to_string(),
                if h.in_dataplane { "ipv6" } else { "ipv6!" }
            )?;
        }
    }
    if let Some(c) = &up.counters {
        writeln!(out)?;
        for (k, n) in c {
            writeln!(out, "{k:<20} {n}")?;
        }
    }
    Ok(())
}
