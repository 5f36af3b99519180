//! `edgevx-ipam` driven as a runtime drives it, against Debian's real
//! `host-local` as the reference: stores taken over both ways, OpenYurt's
//! markers migrated, addresses kept per pod, retention, reclaiming, GC,
//! STATUS, 50 concurrent ADDs, long names, dual-stack, bad input and
//! crashes between writes, two interfaces of one container, store entries
//! that cannot be read. The offline reboot end to end is ipam_reboot.rs.
use std::{
    collections::BTreeSet,
    ffi::CString,
    fs,
    net::IpAddr,
    os::unix::{ffi::OsStrExt, fs::FileTypeExt},
    path::Path,
    thread,
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use edgevx_tests::ipam::{
    CRASH_ENV, Call, DataDir, Plugin, Reply, SHARED_VERSION, add, add_on, config, del, del_on, edgevx_ipam_bin,
    v4_ranges,
};
use serde_json::{Value, json};

const EVX: Plugin = Plugin::EdgevxIpam;
const HL: Plugin = Plugin::HostLocal;

fn configs(d: &DataDir) -> (Value, Value) {
    configs_of(EVX, HL, d)
}

fn configs_of(evx: Plugin, hl: Plugin, d: &DataDir) -> (Value, Value) {
    (config(evx, SHARED_VERSION, d, v4_ranges(), json!({})), config(hl, SHARED_VERSION, d, v4_ranges(), json!({})))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| IpAddr::from([0, 0, 0, 0]))
}

/// Every reservation file names one holder, and no address was handed out
/// twice: `given` (holder -> addresses) maps onto distinct files.
fn no_address_twice(d: &DataDir, given: &[(String, IpAddr)]) -> Result<()> {
    let files = d.reservations()?;
    let mut seen = BTreeSet::new();
    for (holder, ip) in given {
        ensure!(seen.insert(*ip), "{ip} was given twice: {given:?}");
        let content = files.get(ip).with_context(|| format!("{ip} of {holder} has no reservation file"))?;
        ensure!(content == &format!("{holder}\r\neth0"), "{ip} is held by {content:?}, not {holder}");
    }
    Ok(())
}

#[test]
fn ipam_takes_over_a_host_local_store() -> Result<()> {
    takes_over_a_host_local_store(EVX, HL)
}

/// Also run with the arm64 builds of both (arm64.rs).
pub(crate) fn takes_over_a_host_local_store(evx_plugin: Plugin, hl_plugin: Plugin) -> Result<()> {
    let d = DataDir::new("ipamhl")?;
    let (evx, hl) = configs_of(evx_plugin, hl_plugin, &d);
    let mut given = Vec::new();
    for k in 0..5 {
        let id = format!("hl{k}");
        given.push((id.clone(), add(hl_plugin, &hl, &id, "default", &format!("old-{k}"))?[0]));
    }
    del(hl_plugin, &hl, "hl1")?;
    given.retain(|(id, _)| id != "hl1");
    for k in 0..10 {
        let id = format!("evx{k}");
        given.push((id.clone(), add(evx_plugin, &evx, &id, "default", &format!("new-{k}"))?[0]));
    }
    no_address_twice(&d, &given)?;
    // edgevx-ipam releases what host-local reserved
    del(evx_plugin, &evx, "hl2")?;
    let hl2 = given.iter().find(|(id, _)| id == "hl2").map(|g| g.1).context("hl2")?;
    ensure!(!d.reservations()?.contains_key(&hl2), "DEL by edgevx-ipam left host-local's {hl2}");
    Ok(())
}

#[test]
fn host_local_takes_over_an_ipam_store() -> Result<()> {
    host_local_takes_over_an_ipam_store_of(EVX, HL)
}

pub(crate) fn host_local_takes_over_an_ipam_store_of(evx_plugin: Plugin, hl_plugin: Plugin) -> Result<()> {
    let d = DataDir::new("ipamrev")?;
    let (evx, hl) = configs_of(evx_plugin, hl_plugin, &d);
    let mut given = Vec::new();
    for k in 0..6 {
        let id = format!("evx{k}");
        given.push((id.clone(), add(evx_plugin, &evx, &id, "default", &format!("web-{k}"))?[0]));
    }
    // a released pod: its record stays, host-local does not know it
    del(evx_plugin, &evx, "evx0")?;
    given.retain(|(id, _)| id != "evx0");
    let records_before = fs::read_dir(d.store().join(".edgevx/pods"))?.count();
    for k in 0..10 {
        let id = format!("hl{k}");
        given.push((id.clone(), add(hl_plugin, &hl, &id, "default", &format!("x-{k}"))?[0]));
    }
    no_address_twice(&d, &given)?;
    // host-local's DEL walks the whole tree: it must release only its match
    del(hl_plugin, &hl, "evx3")?;
    del(hl_plugin, &hl, "hl4")?;
    let left = d.reservations()?;
    let evx3 = given.iter().find(|(id, _)| id == "evx3").map(|g| g.1).context("evx3")?;
    ensure!(!left.contains_key(&evx3), "host-local's DEL left edgevx-ipam's {evx3}");
    let records_after = fs::read_dir(d.store().join(".edgevx/pods"))?.count();
    ensure!(records_after == records_before, "host-local removed pod records: {records_before} -> {records_after}");
    // and edgevx-ipam still reads the store host-local changed
    let back = add(evx_plugin, &evx, "evx3b", "default", "web-3")?;
    ensure!(back == [evx3], "web-3 got {back:?} after host-local's DEL, want {evx3}");
    Ok(())
}

#[test]
fn ipam_migrates_an_openyurt_directory() -> Result<()> {
    let d = DataDir::new("ipamyurt")?;
    let store = d.store();
    fs::create_dir_all(&store)?;
    // what the patched host-local (base v0.7.4: bare container IDs) leaves
    fs::write(store.join("10.244.1.5"), "sandbox-old-web")?;
    fs::write(store.join("10.244.1.5_default_web-0"), "")?;
    fs::write(store.join("10.244.1.6_kube-system_coredns-vstxh"), "")?;
    fs::write(store.join("10.244.1.7"), "sandbox-other")?;
    fs::write(store.join("last_reserved_ip.0"), "10.244.1.7")?;
    fs::write(store.join("lock"), "")?;
    let (evx, _) = configs(&d);
    // another pod first: neither kept address may go to it
    let other = add(EVX, &evx, "c-other", "default", "other")?;
    ensure!(!other.contains(&ip("10.244.1.5")) && !other.contains(&ip("10.244.1.6")), "other got {other:?}");
    let web = add(EVX, &evx, "c-web-new", "default", "web-0")?;
    ensure!(web == [ip("10.244.1.5")], "web-0 got {web:?}, want its OpenYurt address 10.244.1.5");
    let dns = add(EVX, &evx, "c-dns-new", "kube-system", "coredns-vstxh")?;
    ensure!(dns == [ip("10.244.1.6")], "coredns got {dns:?}, want 10.244.1.6");
    let files = d.reservations()?;
    ensure!(files.get(&ip("10.244.1.7")).map(String::as_str) == Some("sandbox-other"), "{files:?}");
    ensure!(files.get(&ip("10.244.1.5")).map(String::as_str) == Some("c-web-new\r\neth0"), "{files:?}");
    ensure!(!store.join("10.244.1.5_default_web-0").exists(), "the marker was not migrated");
    Ok(())
}

#[test]
fn ipam_same_pod_same_ip_after_del_and_after_reboot() -> Result<()> {
    let d = DataDir::new("ipamkeep")?;
    let (evx, _) = configs(&d);
    let a = add(EVX, &evx, "a1", "default", "a")?;
    let b = add(EVX, &evx, "b1", "default", "b")?;
    // within retention after a DEL, with others allocating in between
    del(EVX, &evx, "a1")?;
    for k in 0..3 {
        add(EVX, &evx, &format!("x{k}"), "default", &format!("x-{k}"))?;
    }
    ensure!(add(EVX, &evx, "a2", "default", "a")? == a, "a lost its address after DEL");
    // a reboot: no DEL ever comes for b1
    ensure!(add(EVX, &evx, "b2", "default", "b")? == b, "b lost its address after a reboot");
    ensure!(d.reservations()?[&b[0]] == "b2\r\neth0", "b2 does not hold b's address");
    // the reference: host-local gives a new sandbox of the same pod a new address
    let d2 = DataDir::new("ipamkeephl")?;
    let (_, hl2) = configs(&d2);
    let first = add(HL, &hl2, "b1", "default", "b")?;
    let second = add(HL, &hl2, "b2", "default", "b")?;
    ensure!(first != second, "host-local kept the address itself: the test would prove nothing");
    Ok(())
}

#[test]
fn ipam_retention_expires() -> Result<()> {
    let d = DataDir::new("ipamexp")?;
    let evx = config(EVX, SHARED_VERSION, &d, v4_ranges(), json!({"retain": "0s"}));
    let a = add(EVX, &evx, "a1", "default", "a")?;
    del(EVX, &evx, "a1")?;
    let again = add(EVX, &evx, "a2", "default", "a")?;
    ensure!(again != a, "with retain 0s, a got {a:?} again (round-robin moves on)");
    ensure!(!d.store().join(".edgevx/pods").join(a[0].to_string()).exists(), "the expired record is still there");
    Ok(())
}

#[test]
fn ipam_exhaustion_reclaims_the_oldest_retained() -> Result<()> {
    let d = DataDir::new("ipamfull")?;
    let ranges = json!([[{"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.2", "rangeEnd": "10.244.1.4"}]]);
    let evx = config(EVX, "1.1.0", &d, ranges, json!({}));
    let a = add(EVX, &evx, "a1", "default", "a")?;
    let b = add(EVX, &evx, "b1", "default", "b")?;
    add(EVX, &evx, "c1", "default", "c")?;
    del(EVX, &evx, "a1")?;
    del(EVX, &evx, "b1")?;
    let status = Call::new("STATUS", "x").run(EVX, &evx)?;
    ensure!(status.ok, "retained addresses can still be given, STATUS must pass: {:?}", status.stdout);
    let r = Call::new("ADD", "d1").pod("default", "d").run(EVX, &evx)?;
    ensure!(r.ips()? == a, "d got {:?}, want a's {a:?} (the oldest retained)", r.ips()?);
    ensure!(r.stderr.contains("reclaiming") && r.stderr.contains(&a[0].to_string()), "no log line: {}", r.stderr);
    ensure!(add(EVX, &evx, "e1", "default", "e")? == b, "e did not get b's address");
    let full = Call::new("ADD", "f1").pod("default", "f").run(EVX, &evx)?;
    ensure!(full.code() == Some(101), "ADD on a full range: {:?}", full.stdout);
    let status = Call::new("STATUS", "x").run(EVX, &evx)?;
    ensure!(status.code() == Some(50), "STATUS on a full range: {:?}", status.stdout);
    ensure!(
        status.stdout["details"].as_str().is_some_and(|s| s.contains("10.244.1.2-10.244.1.4")),
        "{}",
        status.stdout
    );
    Ok(())
}

#[test]
fn ipam_fifty_concurrent_adds_never_share_an_address() -> Result<()> {
    let d = DataDir::new("ipamconc")?;
    let (evx, hl) = configs(&d);
    // 40 of ours and 10 of host-local's at once, all under the one lock
    let handles: Vec<_> = (0..50)
        .map(|k| {
            let (plugin, cfg) = if k % 5 == 0 { (HL, hl.clone()) } else { (EVX, evx.clone()) };
            thread::spawn(move || -> Result<(String, IpAddr)> {
                let id = format!("c{k}");
                let ips = add(plugin, &cfg, &id, "default", &format!("pod-{k}"))?;
                Ok((id, ips[0]))
            })
        })
        .collect();
    let mut given = Vec::new();
    for h in handles {
        given.push(h.join().map_err(|_| anyhow!("ADD thread panicked"))??);
    }
    ensure!(given.len() == 50);
    no_address_twice(&d, &given)
}

#[test]
fn ipam_gc_releases_unlisted_attachments_and_keeps_pods() -> Result<()> {
    let d = DataDir::new("ipamgc")?;
    let evx = config(EVX, "1.1.0", &d, v4_ranges(), json!({}));
    let a = add(EVX, &evx, "a1", "default", "a")?;
    let b = add(EVX, &evx, "b1", "default", "b")?;
    // a torn file, as host-local leaves after a power cut
    fs::write(d.store().join("10.244.1.200"), "")?;
    let mut gc = evx.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "a1", "ifname": "eth0"}]);
    let r = Call::new("GC", "unused").run(EVX, &gc)?;
    ensure!(r.ok, "GC failed: {:?} {}", r.stdout, r.stderr);
    let files = d.reservations()?;
    ensure!(files.get(&a[0]).map(String::as_str) == Some("a1\r\neth0"), "GC freed the listed a1: {files:?}");
    ensure!(!files.contains_key(&b[0]) && !files.contains_key(&ip("10.244.1.200")), "GC kept {files:?}");
    ensure!(
        d.store().join("lock").exists() && d.store().join("last_reserved_ip.0").exists(),
        "GC removed host-local's files"
    );
    // the unlisted pod's address is retained for it
    add(EVX, &evx, "x1", "default", "x")?;
    ensure!(add(EVX, &evx, "b2", "default", "b")? == b, "b lost its address to GC");
    // an empty list is meaningful: everything goes, pods' addresses stay theirs
    gc["cni.dev/valid-attachments"] = json!([]);
    ensure!(Call::new("GC", "unused").run(EVX, &gc)?.ok);
    ensure!(d.reservations()?.is_empty(), "GC with no valid attachment left {:?}", d.reservations()?);
    ensure!(add(EVX, &evx, "a2", "default", "a")? == a, "a lost its address to GC");
    Ok(())
}

#[test]
fn ipam_long_names_and_dual_stack_are_kept() -> Result<()> {
    let d = DataDir::new("ipamlong")?;
    let ranges = json!([[{"subnet": "10.244.1.0/24"}], [{"subnet": "fd00:10:244:1::/64"}]]);
    let evx = config(EVX, "1.1.0", &d, ranges, json!({}));
    let ns = format!("n{}", "s".repeat(62));
    let pod = format!("p{}", "o".repeat(251)) + "d";
    ensure!(ns.len() == 63 && pod.len() == 253);
    let first = add(EVX, &evx, "long1", &ns, &pod)?;
    ensure!(first.len() == 2 && first[0].is_ipv4() && first[1].is_ipv6(), "dual-stack ADD gave {first:?}");
    add(EVX, &evx, "other1", "default", "other")?;
    // reboot: no DEL
    ensure!(add(EVX, &evx, "long2", &ns, &pod)? == first, "the long-named pod lost an address");
    del(EVX, &evx, "long2")?;
    add(EVX, &evx, "other2", "default", "other-2")?;
    ensure!(add(EVX, &evx, "long3", &ns, &pod)? == first, "the long-named pod lost an address after DEL");
    Ok(())
}

/// Each bad input gets a CNI error object naming the culprit, and the store
/// is byte for byte what it was.
#[test]
fn ipam_bad_input_gets_a_named_error_and_keeps_the_store() -> Result<()> {
    let d = DataDir::new("ipambad")?;
    let evx = config(EVX, "1.1.0", &d, v4_ranges(), json!({}));
    add(EVX, &evx, "a1", "default", "a")?;
    del(EVX, &evx, "a1")?;
    add(EVX, &evx, "b1", "default", "b")?;

    let with_ipam = |ipam: Value| {
        let mut c = evx.clone();
        c["ipam"] = ipam;
        c
    };
    let data = d.0.to_string_lossy().into_owned();
    let cases: Vec<(&str, Call<'_>, Vec<u8>, u64, &str)> = vec![
        ("not JSON", Call::new("ADD", "c1").pod("default", "c"), b"{\"cniVersion\": ".to_vec(), 6, "JSON"),
        (
            "unknown version",
            Call::new("ADD", "c1").pod("default", "c"),
            serde_json::to_vec(&json!({"cniVersion": "7.0.0", "name": "cbr0", "ipam": evx["ipam"]}))?,
            1,
            "7.0.0",
        ),
        (
            "host bits in subnet",
            Call::new("ADD", "c1").pod("default", "c"),
            serde_json::to_vec(&with_ipam(json!({"ranges": [[{"subnet": "10.244.1.1/24"}]], "dataDir": data})))?,
            7,
            "10.244.1.1/24",
        ),
        (
            "a network name that climbs out of dataDir",
            Call::new("ADD", "c1").pod("default", "c"),
            serde_json::to_vec(&json!({"cniVersion": "1.1.0", "name": "../../etc", "ipam": evx["ipam"]}))?,
            7,
            "../../etc",
        ),
        ("missing CNI_ARGS", Call::new("ADD", "c1"), serde_json::to_vec(&evx)?, 4, "CNI_ARGS"),
        (
            "CNI_ARGS without the pod name",
            Call { args: Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=default".into()), ..Call::new("ADD", "c1") },
            serde_json::to_vec(&evx)?,
            4,
            "K8S_POD_NAME",
        ),
        (
            "a container ID that forges a reservation's content",
            Call::new("ADD", "b1\r\neth0").pod("default", "c"),
            serde_json::to_vec(&evx)?,
            4,
            "CNI_CONTAINERID",
        ),
    ];
    for (what, call, stdin, code, culprit) in cases {
        let before = d.snapshot()?;
        let r = call.run_raw(EVX, &stdin)?;
        ensure!(r.code() == Some(code), "{what}: want code {code}, got {:?}", r.stdout);
        let details = r.stdout["details"].as_str().unwrap_or_default();
        ensure!(details.contains(culprit), "{what}: details {details:?} do not name {culprit:?}");
        ensure!(d.snapshot()? == before, "{what}: the store changed");
    }

    // and the reservations are still whole
    ensure!(add(EVX, &evx, "a2", "default", "a")?.len() == 1);
    ensure!(d.reservations()?.values().any(|v| v == "b1\r\neth0"));
    Ok(())
}

/// A process killed right after each write: the store it leaves is read by
/// both plugins, and no address is held twice.
#[test]
fn ipam_crash_between_writes_leaves_a_store_both_plugins_read() -> Result<()> {
    ensure!(edgevx_ipam_bin().exists(), "build edgevx-ipam first");
    for step in [
        "add-record",
        "add-reservation",
        "add-last-reserved",
        "takeover-record",
        "takeover-reservation",
        "release-record",
    ] {
        crash_case(step).with_context(|| format!("crash at {step}"))?;
    }
    Ok(())
}

fn crash_case(step: &str) -> Result<()> {
    let d = DataDir::new("ipamcrash")?;
    let (evx, hl) = configs(&d);
    let crash = |mut call: Call<'static>| {
        call.env.push((CRASH_ENV, step.to_string()));
        call
    };
    // p holds an address under sandbox p1 before the crash, except in the first-ADD cases
    let first_add = step.starts_with("add-");
    let kept = if first_add { None } else { Some(add(EVX, &evx, "p1", "default", "p")?[0]) };
    let call = match step {
        "release-record" => crash(Call::new("DEL", "p1")),
        s if s.starts_with("takeover-") => crash(Call::new("ADD", "p2").pod("default", "p")),
        _ => crash(Call::new("ADD", "p1").pod("default", "p")),
    };
    let r = call.run(EVX, &evx)?;
    ensure!(!r.ok && r.stderr.contains("aborting"), "the crash hook did not fire: {:?} {}", r.stdout, r.stderr);

    // host-local reads the store and never takes a held address
    let held_before = d.reservations()?;
    let q = add(HL, &hl, "q1", "default", "q")?[0];
    ensure!(!held_before.contains_key(&q), "host-local gave {q}, which is held: {held_before:?}");
    // the runtime's recovery: DEL of the failed sandbox, then a new one
    let failed = if step.starts_with("takeover-") { "p2" } else { "p1" };
    del(EVX, &evx, failed)?;
    let p = add(EVX, &evx, "p3", "default", "p")?[0];
    ensure!(p != q, "p got {p}, host-local's q holds it");
    if let Some(kept) = kept {
        ensure!(p == kept, "p got {p}, want its address {kept} back");
    }
    no_address_twice(&d, &[("q1".into(), q), ("p3".into(), p)])?;
    // and host-local can still release in it
    del(HL, &hl, "q1")?;
    ensure!(!d.reservations()?.contains_key(&q));
    Ok(())
}

#[test]
fn ipam_version_check_and_cni_args_parsing() -> Result<()> {
    let d = DataDir::new("ipamver")?;
    let evx = config(EVX, "0.3.1", &d, v4_ranges(), json!({}));
    let r = Call::new("VERSION", "x").run_raw(EVX, br#"{"cniVersion":"0.3.1"}"#)?;
    ensure!(r.ok && r.stdout["supportedVersions"].as_array().is_some_and(|v| v.contains(&json!("1.1.0"))));
    // the flannel conflist's 0.3.1: ips carry their family
    let r = Call::new("ADD", "a1").pod("default", "a").run(EVX, &evx)?;
    ensure!(r.stdout["cniVersion"] == "0.3.1" && r.stdout["ips"][0]["version"] == "4", "{}", r.stdout);
    ensure!(Call::new("CHECK", "a1").run(EVX, &evx)?.ok, "CHECK of a held attachment failed");
    let unknown = Call::new("CHECK", "zz").run(EVX, &evx)?;
    ensure!(unknown.code() == Some(3), "CHECK of an unknown attachment: {:?}", unknown.stdout);
    // GC and STATUS came with 1.1.0
    ensure!(Call::new("STATUS", "x").run(EVX, &evx)?.code() == Some(1));
    Ok(())
}

/// One container with two interfaces on the same network (eth0, and net1
/// as Multus adds it): two addresses, each file naming its own attachment,
/// and a DEL of one leaves the other; host-local shows the expected.
#[test]
fn ipam_two_interfaces_of_one_container_get_two_addresses() -> Result<()> {
    let mut kept = None;
    for plugin in [HL, EVX] {
        let d = DataDir::new("ipamifs")?;
        let cfg = config(plugin, SHARED_VERSION, &d, v4_ranges(), json!({}));
        let (eth0, net1) = two_interfaces(plugin, &d, &cfg).with_context(|| format!("{plugin:?}"))?;
        if plugin == EVX {
            kept = Some((d, cfg, eth0, net1));
        }
    }
    // edgevx-ipam only: after a reboot (no DEL of cA eth0) the pod's new
    // sandbox gets back, on each interface, the address it had there
    let (d, evx, eth0, net1) = kept.context("no edgevx-ipam run")?;
    ensure!(add_on(EVX, &evx, "cB", "net1", "default", "multi")? == [net1], "net1 did not get its address back");
    ensure!(add_on(EVX, &evx, "cB", "eth0", "default", "multi")? == [eth0], "eth0 did not get its address back");
    let files = d.reservations()?;
    ensure!(files.get(&eth0).map(String::as_str) == Some("cB\r\neth0"), "{files:?}");
    ensure!(files.get(&net1).map(String::as_str) == Some("cB\r\nnet1"), "{files:?}");

    // host-local's two attachments in the store, edgevx-ipam's DEL of one
    let (evx, hl) = configs(&d);
    let h_eth0 = add_on(HL, &hl, "cH", "eth0", "default", "hl-multi")?[0];
    let h_net1 = add_on(HL, &hl, "cH", "net1", "default", "hl-multi")?[0];
    del_on(EVX, &evx, "cH", "net1")?;
    let files = d.reservations()?;
    ensure!(!files.contains_key(&h_net1), "edgevx-ipam's DEL left host-local's net1 {h_net1}");
    ensure!(files.get(&h_eth0).map(String::as_str) == Some("cH\r\neth0"), "and took its eth0: {files:?}");
    Ok(())
}

/// ADD eth0 and net1 of `cA`, another pod, DEL net1: (eth0's, net1's address).
fn two_interfaces(plugin: Plugin, d: &DataDir, cfg: &Value) -> Result<(IpAddr, IpAddr)> {
    let eth0 = add_on(plugin, cfg, "cA", "eth0", "default", "multi")?;
    let net1 = add_on(plugin, cfg, "cA", "net1", "default", "multi")?;
    let (eth0, net1) = (eth0[0], net1[0]);
    ensure!(eth0 != net1, "eth0 and net1 of cA both got {eth0}");
    let files = d.reservations()?;
    ensure!(files.get(&eth0).map(String::as_str) == Some("cA\r\neth0"), "eth0's {eth0}: {files:?}");
    ensure!(files.get(&net1).map(String::as_str) == Some("cA\r\nnet1"), "net1's {net1}: {files:?}");
    let other = add(plugin, cfg, "cO", "default", "other")?[0];
    ensure!(other != eth0 && other != net1, "another pod got {other}, held by cA");
    del_on(plugin, cfg, "cA", "net1")?;
    let files = d.reservations()?;
    ensure!(!files.contains_key(&net1), "DEL of net1 left {net1}: {files:?}");
    ensure!(files.get(&eth0).map(String::as_str) == Some("cA\r\neth0"), "DEL of net1 took eth0's {eth0}: {files:?}");
    Ok((eth0, net1))
}

/// A record cut short and a stray file in `.edgevx/pods`, then a FIFO and
/// a directory named by addresses, stop no ADD or DEL, also not the DEL of
/// the pod whose record it is: each run names them on stderr, leaves them
/// as they are, and gives their addresses to nobody. A garbled
/// `last_reserved_ip.0` only restarts the round-robin. host-local, the
/// reference, walks past the first two (a FIFO hangs it: it reads every
/// file of the tree it walks).
#[test]
fn ipam_unreadable_store_entries_are_skipped_with_a_warning() -> Result<()> {
    let d = DataDir::new("ipamdamage")?;
    // seven addresses, 10.244.1.2 to 10.244.1.8
    let ranges = json!([[{"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.2", "rangeEnd": "10.244.1.8"}]]);
    let evx = config(EVX, "1.1.0", &d, ranges.clone(), json!({}));
    let hl = config(HL, SHARED_VERSION, &d, ranges, json!({}));
    let a = add(EVX, &evx, "a1", "default", "a")?[0];
    let b = add(EVX, &evx, "b1", "default", "b")?[0];
    let pods = d.store().join(".edgevx/pods");
    let record = pods.join(a.to_string());
    let whole = fs::read(&record)?;
    let cut = whole.get(..whole.len() / 2).context("a's record")?.to_vec();
    fs::write(&record, &cut)?;
    let stray = pods.join("notes.txt");
    fs::write(&stray, "left here by hand")?;

    let h = add(HL, &hl, "h1", "default", "h")?[0];
    ensure!(h != a && h != b, "host-local gave {h}, which is held");
    del(HL, &hl, "h1")?;

    // and a garbled round-robin mark: a hint, which the next ADD rewrites
    let last = d.store().join("last_reserved_ip.0");
    fs::write(&last, "ten dot")?;
    let r = Call::new("ADD", "c1").pod("default", "c").run(EVX, &evx)?;
    let c = r.ips().context("another pod's ADD with a damaged store")?[0];
    names(&r, &[&record, &stray, &last])?;
    ensure!(fs::read_to_string(&last)? == c.to_string(), "the mark was not rewritten");
    ensure!(c != a && c != b, "c got {c}, which is held");
    // a's record was cut after its pod: repaired (ipam_damage.rs has the records nothing can be read from)
    ensure!(r.stderr.contains("repaired"), "{}", r.stderr);
    let repaired: Value = serde_json::from_slice(&fs::read(&record)?)?;
    ensure!(repaired["pod"]["name"] == "a" && repaired["containerID"] == "a1", "{repaired}");
    let r = Call::new("DEL", "a1").run(EVX, &evx)?;
    ensure!(r.ok, "DEL of the pod with the repaired record failed: {} {}", r.stdout, r.stderr);
    ensure!(!d.reservations()?.contains_key(&a), "DEL a1 left its reservation");

    let fifo = pods.join("10.244.1.7");
    let path = CString::new(fifo.as_os_str().as_bytes())?;
    // SAFETY: mkfifo(3) with a NUL-terminated path that lives for the call.
    ensure!(unsafe { libc::mkfifo(path.as_ptr(), 0o644) } == 0, "mkfifo {}", fifo.display());
    let dir = d.store().join("10.244.1.8");
    fs::create_dir(&dir)?;
    // fill the range: the FIFO's and the directory's addresses go to nobody; a's, retained
    // for its pod, goes last
    let mut given = vec![b, c];
    for k in 0..8 {
        let r = Call::new("ADD", &format!("f{k}")).pod("default", &format!("f-{k}")).run(EVX, &evx)?;
        names(&r, &[&stray, &fifo, &dir])?;
        if r.code() == Some(101) {
            break;
        }
        given.push(r.ips().with_context(|| format!("ADD f{k}"))?[0]);
    }
    let unique: BTreeSet<_> = given.iter().collect();
    ensure!(unique.len() == given.len(), "an address was given twice: {given:?}");
    for taken in [ip("10.244.1.7"), ip("10.244.1.8")] {
        ensure!(!given.contains(&taken), "{taken} was given: {given:?}");
    }
    ensure!(given.last() == Some(&a), "a's retained address was not the last given: {given:?}");
    ensure!(given.len() == 5, "want the 5 usable addresses given, then code 101: {given:?}");
    let status = Call::new("STATUS", "x").run(EVX, &evx)?;
    ensure!(status.code() == Some(50), "STATUS counts unreadable entries as free: {:?}", status.stdout);
    del(EVX, &evx, "b1")?;

    ensure!(stray.is_file(), "the stray file was removed");
    ensure!(fs::symlink_metadata(&fifo).is_ok_and(|m| m.file_type().is_fifo()), "the FIFO was removed");
    ensure!(dir.is_dir(), "the directory was removed");
    Ok(())
}

/// Every one of `paths` is named in the run's stderr.
fn names(r: &Reply, paths: &[&Path]) -> Result<()> {
    for p in paths {
        if !r.stderr.contains(&p.display().to_string()) {
            bail!("no warning names {}: {}", p.display(), r.stderr);
        }
    }
    Ok(())
}
