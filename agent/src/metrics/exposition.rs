//! `/metrics`: one registry per scrape, holding the loop's own counters
//! (shared handles) and families filled from a dataplane [`Snapshot`],
//! written in the OpenMetrics text format Prometheus scrapes.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::{EncodeLabelSet, text},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
    },
    registry::{Registry, Unit},
};

use super::{
    report::{LoopReport, Readiness},
    series::{EGRESS, INGRESS, PeerSample, Series, cap_peers, series},
    snapshot::Snapshot,
};

/// What a scrape's response says it is.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    direction: &'static str,
    path: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    reason: &'static str,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer_node: String,
    peer_ip: String,
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerOnlyLabels {
    peer_node: String,
    peer_ip: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MapLabels {
    map: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    source: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn dataplane_families(reg: &mut Registry, snap: &Snapshot) {
    let packets = Family::<PathLabels, Counter>::default();
    let bytes = Family::<PathLabels, Counter>::default();
    let drops = Family::<DropLabels, Counter>::default();
    let fast_path_stack = Family::<ReasonLabels, Counter>::default();
    let (mut bridge, mut not_ours) = (0, 0);
    for (c, v) in &snap.global {
        match series(*c) {
            Series::Packets { direction, path } => {
                packets.get_or_create(&PathLabels { direction, path }).inc_by(*v);
            }
            Series::Bytes { direction, path } => {
                bytes.get_or_create(&PathLabels { direction, path }).inc_by(*v);
            }
            Series::Drops { reason, direction } => {
                drops.get_or_create(&DropLabels { reason, direction }).inc_by(*v);
            }
            Series::BridgeRedirects => bridge += v,
            Series::NotOurs => not_ours += v,
            Series::FastPathStack { reason } => {
                fast_path_stack.get_or_create(&ReasonLabels { reason }).inc_by(*v);
            }
        }
    }
    reg.register("packets", "Tunnel packets by direction and path through the dataplane", packets);
    reg.register("bytes", "Tunnel bytes (inner frames) by direction and path through the dataplane", bytes);
    reg.register("drops", "Packets the programs dropped, by reason and direction", drops);
    reg.register(
        "fast_path_stack",
        "Packets the conntrack-verified fast path left to the host stack, by reason",
        fast_path_stack,
    );
    reg.register(
        "bridge_redirects",
        "Frames the pod bridge program sent straight to a learned pod's port",
        ConstCounter::new(bridge),
    );
    reg.register(
        "vxlan_not_ours",
        "VXLAN to our port with another VNI or inner MAC, left to the kernel",
        ConstCounter::new(not_ours),
    );
    peers(reg, &snap.peers);

    let entries = Family::<MapLabels, Gauge>::default();
    let fill = Family::<MapLabels, FloatGauge>::default();
    for m in &snap.maps {
        entries.get_or_create(&MapLabels { map: m.map }).set(i64::try_from(m.entries).unwrap_or(i64::MAX));
        fill.get_or_create(&MapLabels { map: m.map }).set(m.ratio());
    }
    reg.register("map_entries", "Entries in a BPF map", entries);
    reg.register("map_fill_ratio", "Entries in a BPF map over its max_entries", fill);
}

fn peers(reg: &mut Registry, all: &[PeerSample]) {
    let packets = Family::<PeerLabels, Counter>::default();
    let bytes = Family::<PeerLabels, Counter>::default();
    let errors = Family::<PeerOnlyLabels, Counter>::default();
    for p in cap_peers(all.to_vec()) {
        let labels = |direction| PeerLabels { peer_node: p.node.clone(), peer_ip: p.ip.clone(), direction };
        let s = &p.stats;
        packets.get_or_create(&labels(EGRESS)).inc_by(s.tx_packets);
        packets.get_or_create(&labels(INGRESS)).inc_by(s.rx_packets);
        bytes.get_or_create(&labels(EGRESS)).inc_by(s.tx_bytes);
        bytes.get_or_create(&labels(INGRESS)).inc_by(s.rx_bytes);
        errors.get_or_create(&PeerOnlyLabels { peer_node: p.node.clone(), peer_ip: p.ip.clone() }).inc_by(s.tx_errors);
    }
    reg.register("peer_packets", "Tunnel packets to (egress) and from (ingress) a peer", packets);
    reg.register("peer_bytes", "Tunnel bytes (inner frames) to (egress) and from (ingress) a peer", bytes);
    reg.register("peer_tx_errors", "Frames for a peer that could not be encapsulated", errors);
    reg.register(
        "peers",
        "Peers programmed; those past the per-peer cap are summed as _other",
        ConstGauge::new(i64::try_from(all.len()).unwrap_or(i64::MAX)),
    );
}

/// The loop's own metrics, in the order they are exposed: its passes, its
/// source, its readiness and decap's place, its startup.
fn run_loop(reg: &mut Registry, report: &LoopReport) {
    passes(reg, report);
    source_state(reg, report);
    readiness(reg, report);
    startup_times(reg, report);
}

/// The reconcile passes: how many, how many failed, how long they took,
/// and the rebuilds.
fn passes(reg: &mut Registry, report: &LoopReport) {
    let p = &report.pass;
    reg.register("reconcile_passes", "Passes that applied a view to the dataplane", p.passes.clone());
    reg.register("reconcile_errors", "Passes that failed, by the step that failed", p.errors.clone());
    reg.register_with_unit(
        "reconcile_duration",
        "How long a pass took (bring-up, peers, rules, attach)",
        Unit::Seconds,
        p.duration.clone(),
    );
    reg.register(
        "dataplane_rebuilds",
        "Times the VTEP device or an attached program vanished and the dataplane was rebuilt",
        p.rebuilds.clone(),
    );
}

/// The source: whether it delivered a view, whether its watch is open,
/// and the age of the view in use.
fn source_state(reg: &mut Registry, report: &LoopReport) {
    let source = SourceLabels { source: report.source };
    let connected = Family::<SourceLabels, Gauge>::default();
    connected.get_or_create(&source).set(report.connected().into());
    reg.register(
        "source_connected",
        "1 once the source delivered a view since start; 0 while running from the cached view",
        connected,
    );
    let watching = Family::<SourceLabels, Gauge>::default();
    watching.get_or_create(&source).set(report.watching.get().into());
    reg.register(
        "source_watching",
        "1 while the source has read the control plane in full and its watch is open; 0 while it connects, \
         lists again or retries (a quiet watch is 1: the view's age alone cannot tell)",
        watching,
    );
    if let Some(age) = report.view_age() {
        let g = Family::<SourceLabels, FloatGauge>::default();
        g.get_or_create(&source).set(age.as_secs_f64());
        reg.register_with_unit(
            "source_last_view_age",
            "Time since the source sent the view in use (a cached view: since it was cached)",
            Unit::Seconds,
            g,
        );
    }
}

/// `/readyz` as a gauge, and decap's place on the underlay's ingress: the
/// times it was put back first, the last check's verdict, and the
/// programs found ahead of it.
fn readiness(reg: &mut Registry, report: &LoopReport) {
    let ahead = report.ahead_of_decap();
    reg.register(
        "ready",
        "1 when /readyz is 200: subnet.env written, programs attached, first pass done, decap first",
        ConstGauge::new(i64::from(report.readiness() == Readiness::Ready && ahead.is_empty())),
    );
    reg.register(
        "decap_displaced",
        "Times a check found another program ahead of decap on the underlay's ingress and put decap back first",
        report.pass.decap_displaced.clone(),
    );
    if let Some(first) = report.decap_first() {
        reg.register(
            "decap_first",
            "1 when the last check found decap first on the underlay's ingress; 0 when programs ran ahead of it \
             (edgevx_program_ahead_of_decap names them)",
            ConstGauge::new(i64::from(first)),
        );
    }
    let named = Family::<AheadLabels, Gauge>::default();
    for program in ahead {
        named.get_or_create(&AheadLabels { program }).set(1);
    }
    reg.register(
        "program_ahead_of_decap",
        "A program the last check found running ahead of decap on the underlay's ingress (by id, name or filter)",
        named,
    );
}

/// The time from process start to each step of the first bring-up reached so far.
fn startup_times(reg: &mut Registry, report: &LoopReport) {
    let startup = Family::<MilestoneLabels, FloatGauge>::default();
    for (m, d) in report.startup.times() {
        startup.get_or_create(&MilestoneLabels { milestone: m.label() }).set(d.as_secs_f64());
    }
    reg.register_with_unit(
        "startup",
        "Time from process start to each step of the first bring-up (subnet_env, vtep_up, attached, first_peer, \
         all_peers); a step not reached yet has no series",
        Unit::Seconds,
        startup,
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AheadLabels {
    program: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MilestoneLabels {
    milestone: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    commit: &'static str,
}

/// The whole exposition. `dataplane` is `None` when the maps cannot be
/// read (before the first bring-up): the loop's metrics are still served.
pub fn render(report: &LoopReport, dataplane: Option<&Snapshot>) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("edgevx");
    reg.register(
        "build",
        "The running agent's version and the commit it was built from",
        prometheus_client::metrics::info::Info::new(BuildLabels { version: crate::VERSION, commit: crate::COMMIT }),
    );
    run_loop(&mut reg, report);
    reg.register(
        "dataplane_maps_readable",
        "1 when the pinned maps could be read for this scrape",
        ConstGauge::new(i64::from(dataplane.is_some())),
    );
    if let Some(snap) = dataplane {
        dataplane_families(&mut reg, snap);
    }
    let mut out = String::new();
    text::encode(&mut out, &reg)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use edgevx_common::{counters::Counter, maps::PeerStats};

    use super::*;
    use crate::metrics::{series::MAX_PEER_SERIES, snapshot::MapFill};

    fn snapshot(peers: usize) -> Snapshot {
        Snapshot {
            global: Counter::ALL.iter().map(|c| (*c, *c as u64 + 1)).collect(),
            peers: (0..peers)
                .map(|i| PeerSample {
                    node: format!("node{:03}", i + 2),
                    ip: format!("198.18.0.{}", i + 2),
                    stats: PeerStats { tx_packets: 5, tx_bytes: 500, rx_packets: 7, rx_bytes: 700, tx_errors: 1 },
                })
                .collect(),
            maps: vec![MapFill { map: "peer_subnets", entries: 41, capacity: 16384 }],
        }
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn counters_become_labelled_series() {
        let report = LoopReport::new("nodes file");
        report.pass_done(Instant::now(), true, true);
        report.view_from_source();
        report.watching.on();
        let text = render(&report, Some(&snapshot(1))).unwrap();
        let l = lines(&text);
        let build_info = format!(r#"edgevx_build_info{{version="{}",commit="{}"}} 1"#, crate::VERSION, crate::COMMIT);
        for want in [
            r#"edgevx_packets_total{direction="egress",path="encap"} 1"#,
            r#"edgevx_bytes_total{direction="egress",path="encap"} 2"#,
            r#"edgevx_packets_total{direction="ingress",path="stack"} 14"#,
            r#"edgevx_drops_total{reason="unknown_peer",direction="ingress"} 7"#,
            r#"edgevx_drops_total{reason="adjust_room",direction="both"} 9"#,
            "edgevx_bridge_redirects_total 16",
            "edgevx_vxlan_not_ours_total 12",
            r#"edgevx_peer_packets_total{peer_node="node002",peer_ip="198.18.0.2",direction="egress"} 5"#,
            r#"edgevx_peer_bytes_total{peer_node="node002",peer_ip="198.18.0.2",direction="ingress"} 700"#,
            r#"edgevx_peer_tx_errors_total{peer_node="node002",peer_ip="198.18.0.2"} 1"#,
            "edgevx_peers 1",
            r#"edgevx_map_entries{map="peer_subnets"} 41"#,
            "edgevx_reconcile_passes_total 1",
            r#"edgevx_reconcile_errors_total{stage="attach"} 0"#,
            "edgevx_reconcile_duration_seconds_count 1",
            r#"edgevx_source_connected{source="nodes file"} 1"#,
            r#"edgevx_source_watching{source="nodes file"} 1"#,
            "edgevx_ready 1",
            "edgevx_dataplane_maps_readable 1",
            &build_info,
            "# EOF",
        ] {
            assert!(l.contains(&want), "no {want:?} in\n{text}");
        }
        assert!(text.contains(r#"edgevx_map_fill_ratio{map="peer_subnets"} 0.0025"#), "{text}");
        assert!(text.contains("# TYPE edgevx_source_last_view_age_seconds gauge"), "{text}");
    }

    #[test]
    fn without_maps_the_loop_is_still_reported() {
        let report = LoopReport::new("etcd");
        let text = render(&report, None).unwrap();
        let l = lines(&text);
        assert!(l.contains(&"edgevx_dataplane_maps_readable 0"), "{text}");
        assert!(l.contains(&"edgevx_ready 0"), "{text}");
        assert!(l.contains(&r#"edgevx_source_connected{source="etcd"} 0"#), "{text}");
        assert!(l.contains(&r#"edgevx_source_watching{source="etcd"} 0"#), "{text}");
        assert!(!text.contains("edgevx_drops_total"), "{text}");
        assert!(!text.contains("source_last_view_age"), "no view, no age: {text}");
    }

    #[test]
    fn peer_series_are_capped() {
        let text = render(&LoopReport::new("etcd"), Some(&snapshot(MAX_PEER_SERIES + 5))).unwrap();
        let per_peer = text.lines().filter(|l| l.starts_with("edgevx_peer_tx_errors_total{")).count();
        assert_eq!(per_peer, MAX_PEER_SERIES + 1, "{text}");
        assert!(text.contains(r#"edgevx_peer_tx_errors_total{peer_node="_other",peer_ip="_other"} 5"#), "{text}");
        assert!(text.lines().any(|l| l == format!("edgevx_peers {}", MAX_PEER_SERIES + 5)), "{text}");
    }
}
