//! `edgevx-ipam` after a power cut and on a full disk (issue 33, finding
//! 8), run as the runtime runs it: a pod record left empty, cut short or
//! garbled is repaired (its pod still readable) or released, with a
//! warning naming the file, so no address is blocked for good and a pod
//! whose record says who it is keeps its address; DEL succeeds with the
//! store's filesystem full, as host-local's does, and the pod still gets
//! its address back afterwards.
use std::{fs, net::IpAddr, process::Command};

use anyhow::{Context, Result, ensure};
use edgevx_tests::{
    ipam::{Call, DataDir, Plugin, Reply, SHARED_VERSION, add, config, del},
    mount_ns::MountNs,
};
use serde_json::json;

const EVX: Plugin = Plugin::EdgevxIpam;
const HL: Plugin = Plugin::HostLocal;
const PODS: &str = ".edgevx/pods";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| IpAddr::from([0, 0, 0, 0]))
}

fn add_reply(call: Call<'_>, config: &serde_json::Value) -> Result<(Vec<IpAddr>, String)> {
    let r: Reply = call.run(EVX, config)?;
    let ips = r.ips().with_context(|| r.stderr.clone())?;
    Ok((ips, r.stderr))
}

#[test]
fn ipam_repairs_or_releases_damaged_pod_records() -> Result<()> {
    let d = DataDir::new("ipamdmg")?;
    // four addresses, so a blocked one shows as an ADD that finds none
    let ranges = json!([[{"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.2", "rangeEnd": "10.244.1.5"}]]);
    let evx = config(EVX, SHARED_VERSION, &d, ranges, json!({}));
    let a = add(EVX, &evx, "cA", "default", "a")?[0];
    let b = add(EVX, &evx, "cB", "default", "b")?[0];
    let g = add(EVX, &evx, "cG", "default", "g")?[0];
    ensure!([a, b, g] == [ip("10.244.1.2"), ip("10.244.1.3"), ip("10.244.1.4")], "{a} {b} {g}");

    // the power cut: a's record empty, b's cut short after its pod, g's garbled
    let pods = d.store().join(PODS);
    let (ra, rb, rg) = (pods.join(a.to_string()), pods.join(b.to_string()), pods.join(g.to_string()));
    fs::write(&ra, "")?;
    let whole = fs::read_to_string(&rb)?;
    let cut = whole.find("\"containerID\"").context("no containerID in b's record")? + 8;
    fs::write(&rb, &whole[..cut])?;
    fs::write(&rg, b"\x00\x00\xff\xfe{\"pod\":garbage")?;

    // the node comes back without DELs: b's new sandbox gets b's address back, the repair said
    let (got, stderr) = add_reply(Call::new("ADD", "cB2").pod("default", "b"), &evx)?;
    ensure!(got == [b], "b got {got:?}:\n{stderr}");
    for (file, what) in [(&rb, "repaired"), (&ra, "released"), (&rg, "released")] {
        ensure!(
            stderr.lines().any(|l| l.contains(&file.display().to_string()) && l.contains(what)),
            "no warning that {} was {what}:\n{stderr}",
            file.display()
        );
    }
    let record: serde_json::Value = serde_json::from_slice(&fs::read(&rb)?)?;
    ensure!(record["pod"]["name"] == "b" && record["containerID"] == "cB2", "{record}");
    // nothing is deleted: the released records' bytes are kept aside
    let kept: Vec<Vec<u8>> =
        fs::read_dir(d.store().join(".edgevx/damaged"))?.map(|e| Ok(fs::read(e?.path())?)).collect::<Result<_>>()?;
    ensure!(kept.contains(&Vec::new()) && kept.iter().any(|k| k.ends_with(b"garbage")), "{kept:?}");

    // a's and g's old sandboxes are deleted at last: their addresses are free again, not blocked
    del(EVX, &evx, "cA")?;
    del(EVX, &evx, "cG")?;
    let mut given = Vec::new();
    for (id, name) in [("cC", "c"), ("cD", "d"), ("cE", "e")] {
        given.push(add(EVX, &evx, id, "default", name)?[0]);
    }
    given.sort();
    ensure!(given == [a, g, ip("10.244.1.5")], "{given:?}");
    Ok(())
}

/// A small tmpfs at `dir` in a mount namespace of the test's own: what
/// runs through `via` sees it, nothing else does.
struct FullDisk(MountNs);

impl FullDisk {
    fn mount(dir: &std::path::Path) -> Result<Self> {
        let m = FullDisk(MountNs::new(Command::new("unshare"))?);
        m.sh(&format!("mount -t tmpfs -o size=256k evxipam {}", dir.display()))?;
        Ok(m)
    }

    fn via(&self) -> Vec<String> {
        self.0.via()
    }

    fn sh(&self, script: &str) -> Result<String> {
        self.0.sh(Command::new("nsenter"), script)
    }
}

#[test]
fn ipam_del_succeeds_on_a_full_disk_as_host_locals_does() -> Result<()> {
    let d = DataDir::new("ipamfull")?;
    let disk = FullDisk::mount(&d.0)?;
    let evx = config(EVX, SHARED_VERSION, &d, json!([[{"subnet": "10.244.1.0/24"}]]), json!({}));
    let hl = config(HL, SHARED_VERSION, &d, json!([[{"subnet": "10.244.1.0/24"}]]), json!({}));
    let run = |call: Call<'_>, plugin: Plugin, conf: &serde_json::Value| -> Result<Reply> {
        Call { via: disk.via(), ..call }.run(plugin, conf)
    };
    let mine = run(Call::new("ADD", "cA").pod("default", "a"), EVX, &evx)?.ips()?[0];
    let theirs = run(Call::new("ADD", "cH").pod("default", "h"), HL, &hl)?.ips()?[0];
    let store = d.store();
    disk.sh(&format!("dd if=/dev/zero of={}/fill bs=4k 2>/dev/null; true", d.0.display()))?;
    ensure!(disk.sh(&format!("echo x > {}/probe", d.0.display())).is_err(), "the store's filesystem is not full");

    // both DELs succeed, and free the addresses
    let r = run(Call::new("DEL", "cH"), HL, &hl)?;
    ensure!(r.ok, "host-local's DEL failed on a full disk: {} {}", r.stdout, r.stderr);
    let r = run(Call::new("DEL", "cA"), EVX, &evx)?;
    ensure!(r.ok, "edgevx-ipam's DEL failed on a full disk: {} {}", r.stdout, r.stderr);
    let left = disk.sh(&format!("ls {}", store.display()))?;
    ensure!(!left.lines().any(|l| l == mine.to_string() || l == theirs.to_string()), "still reserved: {left}");
    // a repeated DEL (the runtime retries) succeeds too
    ensure!(run(Call::new("DEL", "cA"), EVX, &evx)?.ok, "a repeated DEL failed");
    // an ADD needs space: it fails, naming the store, and changes nothing
    let r = run(Call::new("ADD", "cX").pod("default", "x"), EVX, &evx)?;
    ensure!(!r.ok && r.stdout.to_string().contains(&store.display().to_string()), "{} {}", r.stdout, r.stderr);

    // space again: the pod's next sandbox still gets its address back
    disk.sh(&format!("rm {}/fill", d.0.display()))?;
    let back = run(Call::new("ADD", "cA2").pod("default", "a"), EVX, &evx)?.ips()?[0];
    ensure!(back == mine, "the pod got {back}, not its {mine}");
    Ok(())
}
