//! `edgevx status` as a table, from the same document `--json` prints.
use std::fmt::{self, Write as _};

use serde_json::{Map, Value};

/// The control plane in one line: connected (and for how long) or cut off
/// on its cached view, and the view's age.
fn source_line(src: &Map<String, Value>) -> String {
    let name = src.get("name").and_then(Value::as_str).unwrap_or("?");
    let since = src.get("since_seconds").and_then(Value::as_u64).map_or(String::new(), |s| format!(" for {s} s"));
    let age = src
        .get("view_age_seconds")
        .and_then(Value::as_u64)
        .map_or("no view yet".to_string(), |a| format!("view {a} s old"));
    let cached = if src.get("connected") == Some(&Value::Bool(true)) { "" } else { ", the cached view" };
    if src.get("watching") == Some(&Value::Bool(true)) {
        format!("source {name}: watching{since}, {age}{cached}")
    } else {
        format!("source {name}: NOT in touch{since}, forwarding on the last view ({age}{cached})")
    }
}

/// What is pinned under the bpffs, when nothing else can be said.
/// Field `k` of the status document as text: a string as it is, anything
/// else as JSON.
fn field(v: &Value, k: &str) -> String {
    v[k].as_str().map(str::to_string).unwrap_or_else(|| v[k].to_string())
}

fn print_pinned(out: &mut String, v: &Value) -> fmt::Result {
    if let Some(p) = v["pinned"].as_array().filter(|p| !p.is_empty()) {
        let names: Vec<&str> = p.iter().filter_map(Value::as_str).collect();
        writeln!(out, "pinned: {}", names.join(" "))?;
    }
    Ok(())
}

/// The document as the table `status` prints.
pub(super) fn render(v: &Value) -> Result<String, fmt::Error> {
    let mut out = String::new();
    let out = &mut out;
    let agent = match (&v["agent_running"], v["agent_pid"].as_u64(), v["agent_phase"].as_str()) {
        (Value::Bool(true), pid, phase) => format!(
            "running{}{}",
            pid.map_or(String::new(), |p| format!(" (pid {p})")),
            phase.map_or(String::new(), |p| format!(": {p};"))
        ),
        _ => "stopped".to_string(),
    };
    let version = match v["agent_version"].as_str() {
        Some(a) if a != env!("CARGO_PKG_VERSION") => format!("edgevx {} (agent {a})", env!("CARGO_PKG_VERSION")),
        _ => format!("edgevx {}", env!("CARGO_PKG_VERSION")),
    };
    writeln!(out, "{version}  {}", v["verdict"].as_str().unwrap_or_default())?;
    if let Some(src) = v["source"].as_object() {
        writeln!(out, "{}", source_line(src))?;
    }
    if v["iface"].is_null() {
        writeln!(out, "agent {agent} nothing brought up yet (no agent record in the state dir)")?;
        print_pinned(out, v)?;
        return Ok(std::mem::take(out));
    }
    writeln!(
        out,
        "node {}  agent {agent}  dataplane {}",
        field(v, "node"),
        if v["dataplane_attached"] == true { "attached" } else { "NOT attached" }
    )?;
    if let Some(ahead) = v["ahead_of_decap"].as_array().filter(|a| !a.is_empty()) {
        let names: Vec<&str> = ahead.iter().filter_map(Value::as_str).collect();
        writeln!(
            out,
            "NOT first on {}'s ingress: {} run ahead of edgevx's decap (the agent puts it back first at its next \
             check; meanwhile VXLAN they pass on unjudged is dropped on the VTEP)",
            field(v, "iface"),
            names.join("; ")
        )?;
    }
    print_vteps(out, v)?;
    print_features(out, v)?;
    print_peers(out, v)?;
    Ok(std::mem::take(out))
}

/// The VTEP lines: IPv4 (or the IPv6-only line), then the IPv6 VTEP.
fn print_vteps(out: &mut String, v: &Value) -> fmt::Result {
    if v["vtep_device"].is_null() {
        // IPv6-only: the IPv6 VTEP below is the only one
        writeln!(out, "vni {} port {} mtu {} (IPv6-only)", field(v, "vni"), field(v, "port"), field(v, "mtu"))?;
    } else {
        writeln!(
            out,
            "vtep {} mac {} vni {} port {} public-ip {} subnet {} mtu {} delivery {}",
            field(v, "vtep_device"),
            field(v, "vtep_mac"),
            field(v, "vni"),
            field(v, "port"),
            field(v, "public_ip"),
            field(v, "subnet"),
            field(v, "mtu"),
            field(v, "delivery")
        )?;
    }
    if let Some(v6) = v["vtep6"].as_object() {
        let f = |k: &str| v6.get(k).map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string()));
        writeln!(
            out,
            "vtep {} mac {} public-ip {} subnet {} mtu {} (IPv6)",
            f("device").unwrap_or_default(),
            f("mac").unwrap_or_default(),
            f("public_ip").unwrap_or_default(),
            f("subnet").unwrap_or_default(),
            f("mtu").unwrap_or_default()
        )?;
    }
    Ok(())
}

/// Bring-up timings, the XDP judge and the fast path.
fn print_features(out: &mut String, v: &Value) -> fmt::Result {
    if let Some(t) = v["startup"].as_object() {
        let step = |k: &str| t.get(k).and_then(Value::as_f64).map_or("-".to_string(), |ms| format!("{ms:.0} ms"));
        writeln!(
            out,
            "started: subnet.env {}, VTEP up {}, attached {}, first peer {}, all peers {} (from process start)",
            step("subnet_env_ms"),
            step("vtep_up_ms"),
            step("attached_ms"),
            step("first_peer_ms"),
            step("all_peers_ms")
        )?;
    }
    if let Some(x) = v["xdp_judge"].as_object() {
        match (x.get("attached"), x.get("reason").and_then(Value::as_str)) {
            (Some(Value::Bool(true)), _) => writeln!(out, "xdp judge on {} (native)", field(v, "iface"))?,
            (_, Some(why)) => writeln!(out, "xdp judge not attached: {why}")?,
            _ => writeln!(out, "xdp judge not attached")?,
        }
    }
    if let Some(fp) = v["fast_path"].as_str() {
        writeln!(out, "fast path {fp}")?;
    }
    Ok(())
}

/// The peer table (a dual-stack peer's IPv6 half on a line of its own), then the counters.
fn print_peers(out: &mut String, v: &Value) -> fmt::Result {
    let programmed = v["peers"].as_array().map_or(0, |p| p.len());
    writeln!(out, "peers {programmed}  capacity {}", field(v, "peer_capacity"))?;
    if let Some(n) = v["peers_not_programmed"].as_u64().filter(|n| *n > 0) {
        writeln!(
            out,
            "{n} of the {} peers in the view NOT programmed: beyond the capacity (see the agent's log)",
            field(v, "peers_in_view")
        )?;
    }
    writeln!(
        out,
        "\n{:<20} {:<18} {:<16} {:<18} {:<6} {:>12} {:>12}",
        "PEER", "SUBNET", "PUBLIC IP", "VTEP MAC", "ROUTE", "TX PKTS", "RX PKTS"
    )?;
    for p in v["peers"].as_array().into_iter().flatten() {
        let f = |k: &str| p[k].as_str().map(str::to_string).unwrap_or_else(|| p[k].to_string());
        writeln!(
            out,
            "{:<20} {:<18} {:<16} {:<18} {:<6} {:>12} {:>12}",
            f("node"),
            f("subnet"),
            f("public_ip"),
            f("vtep_mac"),
            f("route"),
            f("tx_packets"),
            f("rx_packets")
        )?;
        // a dual-stack peer's IPv6 half, on a line of its own
        if let Some(h) = p["v6"].as_object() {
            let g = |k: &str| h.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            writeln!(
                out,
                "{:<20} {:<18} {:<16} {:<18} {:<6}",
                "",
                g("subnet"),
                g("public_ip"),
                g("vtep_mac"),
                if h.get("in_dataplane") == Some(&Value::Bool(true)) { "ipv6" } else { "ipv6!" }
            )?;
        }
    }
    if let Some(c) = v["counters"].as_object() {
        writeln!(out)?;
        for (k, n) in c {
            writeln!(out, "{k:<20} {n}")?;
        }
    }
    Ok(())
}
