//! The document from what `status` would read, built without the host: the
//! JSON and the table as printed, byte for byte against the snapshots in
//! `snapshots/` (this binary's release stands as `VERSION` there). A field
//! that changes here changes what every reader of `--json` gets.
use std::{collections::BTreeMap, fmt::Debug, str::FromStr};

use edgevx_common::maps::{Peer as PeerEntry, PeerStats};
use serde::de::DeserializeOwned;

use super::{Records, agent, brought_up, document::XdpJudge, json_text, kernel::Kernel, peers, text, unrecorded};
use crate::{
    dataplane::{
        bpffs::PinDir,
        loader::AttachMode,
        order::{Foreign, Place},
        xdp::{XdpChoice, status_json},
    },
    mac::VtepMac,
    peer::{Half, Peer},
    reconcile::{Accept, Fill},
    run::netns_lock::{Holder, Record, Role, SourceState},
    state::{AgentRecord, Record4, Record6, StateDir},
};

fn p<T: FromStr>(s: &str) -> T
where
    T::Err: Debug,
{
    s.parse().unwrap()
}

/// A record as its file holds it.
fn parse<T: DeserializeOwned>(json: &str) -> T {
    serde_json::from_str(json).unwrap()
}

/// What `--json` and the table print, this release written `VERSION`.
fn printed(json: String, table: String) -> (String, String) {
    let v = env!("CARGO_PKG_VERSION");
    (json.replace(v, "VERSION"), table.replace(v, "VERSION"))
}

fn holder(phase: &str, source: Option<SourceState>) -> Holder {
    let record = Record {
        pid: 1,
        role: Role::Run,
        state_dir: "/var/lib/edgevx".into(),
        phase: phase.into(),
        version: "0.1.9".into(),
        source,
    };
    Holder { pid: Some(4242), record: Some(record) }
}

fn record(v4: Option<Record4>, v6: Option<Record6>) -> AgentRecord {
    AgentRecord {
        node: "node-a".into(),
        iface: "eth0".into(),
        v4,
        vni: 1,
        port: 8472,
        mtu: 1450,
        bypass_netfilter: false,
        fast_path: "on".into(),
        ip_masq: true,
        attach: AttachMode::Tcx,
        pod_bridge: "cni0".into(),
        subnet_file: "/run/flannel/subnet.env".into(),
        pid: 4242,
        v6,
        xdp_judge: XdpChoice::Auto,
    }
}

fn record4() -> Record4 {
    Record4 {
        vtep_device: "flannel.1".into(),
        vtep_mac: p("02:00:00:00:00:0a"),
        public_ip: p("192.0.2.10"),
        subnet: p("10.244.0.0/24"),
        network: p("10.244.0.0/16"),
    }
}

fn record6() -> Record6 {
    Record6 {
        device: "flannel-v6.1".into(),
        mac: p("02:00:00:00:60:0a"),
        public_ip: p("2001:db8::10"),
        subnet: p("fd00:10:244::/64"),
        network: p("fd00:10:244::/56"),
        mtu: 1430,
    }
}

fn peer(node: &str, v4: Option<(&str, &str, &str)>, v6: Option<(&str, &str, &str)>) -> Peer {
    Peer {
        node: node.into(),
        v4: v4.map(|(subnet, ip, mac)| Half { subnet: p(subnet), public_ip: p(ip), vtep_mac: p(mac) }),
        any_inner_source: false,
        appeared: None,
        v6: v6.map(|(subnet, ip, mac)| Half { subnet: p(subnet), public_ip: p(ip), vtep_mac: p(mac) }),
    }
}

fn dual_stack() -> (String, String) {
    dual_stack_with(|_| {})
}

/// The dual-stack node of the snapshot, its kernel's answers changed by `edit`.
fn dual_stack_with(edit: impl FnOnce(&mut Kernel)) -> (String, String) {
    let source =
        SourceState { name: "kube".into(), connected: true, watching: true, since: 1_000, view_at: Some(1_500) };
    let agent = agent::section(Some(&holder("forwarding", Some(source))), 2_000);
    let peers = vec![
        peer(
            "node-b",
            Some(("10.244.1.0/24", "192.0.2.11", "02:00:00:00:00:0b")),
            Some(("fd00:10:244:1::/64", "2001:db8::11", "02:00:00:00:60:0b")),
        ),
        peer("node-c", Some(("10.244.2.0/24", "192.0.2.12", "02:00:00:00:00:0c")), None),
        peer("node-d", None, Some(("fd00:10:244:3::/64", "2001:db8::13", "02:00:00:00:60:0d"))),
    ];
    let b = p("192.0.2.11");
    let entry = PeerEntry { public_ip: [192, 0, 2, 11], vtep_mac: p::<VtepMac>("02:00:00:00:00:0b").0, _pad: [0; 2] };
    let seen = peers::Seen {
        programmed: vec![(p("10.244.1.0/24"), entry)],
        accepted: BTreeMap::from([(b, Accept { subnet: p("10.244.1.0/24"), any_inner_source: false })]),
        accepted6: BTreeMap::from([(
            p("2001:db8::11"),
            Accept { subnet: p("fd00:10:244:1::/64"), any_inner_source: false },
        )]),
        direct: BTreeMap::from([(p("10.244.2.0/24"), p("192.0.2.12"))]),
        stats: BTreeMap::from([(
            b,
            PeerStats { tx_packets: 10, tx_bytes: 1_500, rx_packets: 20, rx_bytes: 3_000, tx_errors: 1 },
        )]),
    };
    let mut kernel = Kernel {
        vtep4_on: true,
        vtep6_on: true,
        decap: Some(Place::Behind(vec![Foreign { id: Some(77), name: Some("other_fw".into()), filter: None }])),
        bridge_attached: true,
        counters: Some(BTreeMap::from([("rx_accepted", 20), ("drop_not_peer", 3)])),
        local_pods: 2,
        peer_capacity: Some(16_384),
        peers: seen,
        xdp_judge: parse(r#"{"choice": "auto", "attached": true, "mode": "native", "reason": null}"#),
    };
    edit(&mut kernel);
    let records = Records {
        rec: record(Some(record4()), Some(record6())),
        peers,
        fill: Some(Fill { capacity: 16_384, wanted: 4, not_programmed: 1 }),
        startup: parse(r#"{"subnet_env_ms": 12.3, "vtep_up_ms": 15.0, "attached_ms": 20.5, "pid": 4242}"#),
    };
    let doc = brought_up(agent, vec!["v7/links/edgevx_decap".into()], &records, &kernel);
    printed(json_text(&doc).unwrap(), text::render(&doc).unwrap())
}

fn ipv6_only() -> (String, String) {
    let agent = agent::section(None, 2_000);
    let mut rec = record(None, Some(record6()));
    rec.bypass_netfilter = true;
    rec.fast_path = String::new();
    rec.ip_masq = false;
    rec.attach = AttachMode::Clsact;
    rec.xdp_judge = XdpChoice::Off;
    let kernel = Kernel {
        vtep4_on: true,
        vtep6_on: false,
        decap: None,
        bridge_attached: false,
        counters: None,
        local_pods: 0,
        peer_capacity: None,
        peers: peers::Seen::default(),
        xdp_judge: parse(r#"{"choice": "off", "attached": false, "mode": null, "reason": "--xdp-judge=off"}"#),
    };
    let records = Records {
        rec,
        peers: vec![peer("node-b", None, Some(("fd00:10:244:1::/64", "2001:db8::11", "02:00:00:00:60:0b")))],
        fill: Some(Fill { capacity: 100, wanted: 1, not_programmed: 0 }),
        startup: None,
    };
    let doc = brought_up(agent, vec!["v7/progs/edgevx_decap".into()], &records, &kernel);
    printed(json_text(&doc).unwrap(), text::render(&doc).unwrap())
}

fn waiting() -> (String, String) {
    let agent = agent::section(Some(&holder("waiting for the host: no eth0 yet", None)), 2_000);
    let doc = unrecorded(agent, vec!["v7/links/edgevx_decap".into()]);
    printed(json_text(&doc).unwrap(), text::render(&doc).unwrap())
}

#[test]
fn a_dual_stack_node_prints_as_its_snapshot() {
    let (json, table) = dual_stack();
    assert_eq!(json, include_str!("snapshots/dual_stack.json"));
    assert_eq!(table, include_str!("snapshots/dual_stack.txt"));
}

#[test]
fn either_familys_vtep_program_missing_means_not_attached() {
    let attached = |json: &str| json.contains("\"dataplane_attached\": true");
    assert!(attached(&dual_stack().0), "the snapshot's node is attached");
    assert!(!attached(&dual_stack_with(|k| k.vtep6_on = false).0), "the IPv6 guard gone");
    assert!(!attached(&dual_stack_with(|k| k.vtep4_on = false).0), "the IPv4 encap or guard gone");
    assert!(!attached(&dual_stack_with(|k| k.decap = None).0), "decap gone");
}

#[test]
fn an_ipv6_only_node_with_no_agent_prints_as_its_snapshot() {
    let (json, table) = ipv6_only();
    assert_eq!(json, include_str!("snapshots/ipv6_only.json"));
    assert_eq!(table, include_str!("snapshots/ipv6_only.txt"));
}

#[test]
fn an_agent_before_its_first_bring_up_prints_as_its_snapshot() {
    let (json, table) = waiting();
    assert_eq!(json, include_str!("snapshots/waiting.json"));
    assert_eq!(table, include_str!("snapshots/waiting.txt"));
}

/// Writes the snapshots from what the code prints now (run once, by hand,
/// when a document is meant to change).
#[test]
#[ignore]
fn write_snapshots() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/status/snapshots");
    for (name, (json, table)) in [("dual_stack", dual_stack()), ("ipv6_only", ipv6_only()), ("waiting", waiting())] {
        std::fs::write(dir.join(format!("{name}.json")), json).unwrap();
        std::fs::write(dir.join(format!("{name}.txt")), table).unwrap();
    }
}

/// `dataplane::xdp` says the judge's status as JSON; [`XdpJudge`] reads it
/// and prints it back the same.
#[test]
fn the_xdp_judges_own_words_read_as_its_section() {
    let nowhere = std::env::temp_dir().join(format!("edgevx-status-xdp-{}", std::process::id()));
    let said = status_json(&StateDir(nowhere.clone()), &PinDir::new(&nowhere), "edgevx-none0", XdpChoice::On);
    let read: XdpJudge = serde_json::from_value(said.clone()).unwrap();
    assert_eq!(read.attached, Some(false), "no such interface: {said}");
    assert_eq!(serde_json::to_value(&read).unwrap(), said);
}
