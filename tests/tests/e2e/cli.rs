//! Bad flags and config: exit code 2, a message naming the culprit, and
//! nothing changed on the host. A host state that fixes itself (no bpffs
//! mounted yet, an interface not there yet) is waited for instead.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use edgevx_tests::{
    edgevx_bin,
    etcd::{ENDPOINT, Etcd, PREFIX},
    nodes::{flannel_node, node_list, write},
    topo::Cluster,
};

#[test]
fn bad_input_exits_2_naming_the_culprit_and_changes_nothing() -> Result<()> {
    let c = Cluster::new(1)?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let bad_conf = c.dir.join("net-conf.json");
    std::fs::write(&bad_conf, r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":0}}"#)?;
    // both families off: flannel's "none defined stack"
    let ipv6_conf = c.dir.join("net-conf-no-stack.json");
    std::fs::write(&ipv6_conf, r#"{"Network":"10.244.0.0/16","EnableIPv4":false,"Backend":{"Type":"vxlan"}}"#)?;
    let (state, bpffs) = (h.state_dir(), h.bpffs_dir());
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (nodes, bad_conf, ipv6_conf) = (s(&nodes), s(&bad_conf), s(&ipv6_conf));

    // a good command line, then one change each: (flag, value or "" to drop the flag, culprit)
    let good = [("--node-name", "node1"), ("--iface", "eth0"), ("--nodes-file", nodes.as_str())];
    let cases: &[(&str, &str, &str)] = &[
        ("--nodes-file", "/nonexistent/nodes.json", "/nonexistent/nodes.json"),
        ("--net-conf", &bad_conf, "Backend.VNI"),
        ("--net-conf", &ipv6_conf, "none defined stack"),
        ("--net-conf", "/nonexistent/net-conf.json", "/nonexistent/net-conf.json"),
        ("--kube-annotation-prefix", "a/b/c", "a/b/c"),
        ("--public-ip", "300.1.1.1", "300.1.1.1"),
        ("--node-name", "", "--node-name"),
        ("--etcd-endpoints", "http://198.18.0.254:2379", "exactly one source"),
        ("--kube", "", "exactly one source"),
        ("--bypass-netfilter", "", "contradict"),
    ];
    for (flag, value, culprit) in cases {
        let mut args: Vec<String> = vec!["run".into(), "--state-dir".into(), s(&state), "--bpffs".into(), s(&bpffs)];
        let mut replaced = false;
        for (f, v) in good {
            if f == *flag {
                replaced = true;
                if !value.is_empty() {
                    args.extend([f.to_string(), value.to_string()]);
                }
            } else {
                args.extend([f.to_string(), v.to_string()]);
            }
        }
        if *flag == "--bypass-netfilter" {
            args.push("--host-routing".into());
        }
        if !replaced {
            args.push(flag.to_string());
            if !value.is_empty() {
                args.push(value.to_string());
            }
        }
        let out = h.ns.cmd(&s(&edgevx_bin())).args(&args).env_remove("NODE_NAME").output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(culprit), "{args:?}: the error should name {culprit}: {err}");
    }
    // etcd-only mistakes, with etcd as the one source
    let etcd = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> =
            ["run", "--node-name", "node1", "--iface", "eth0", "--etcd-endpoints", "http://198.18.0.254:2379"]
                .iter()
                .map(|a| a.to_string())
                .collect();
        v.extend(["--state-dir".into(), s(&state), "--bpffs".into(), s(&bpffs)]);
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    for (args, culprit) in [
        (etcd(&["--etcd-certfile", &nodes]), "--etcd-keyfile go together"),
        (etcd(&["--etcd-cafile", "/nonexistent/ca.pem"]), "/nonexistent/ca.pem"),
        (etcd(&["--net-conf", &bad_conf]), "--net-conf does not apply"),
        (etcd(&["--subnet-lease-ttl", "60", "--subnet-lease-renew-margin-secs", "60"]), "renew-margin"),
        // TLS files with a plain endpoint: the client would retry (and fail) forever
        (
            etcd(&["--etcd-cafile", &nodes]),
            "--etcd-cafile asks for TLS, but the etcd endpoint http://198.18.0.254:2379",
        ),
        (etcd(&["--etcd-certfile", &nodes, "--etcd-keyfile", &nodes]), "--etcd-certfile asks for TLS"),
    ] {
        let out = h.ns.cmd(&s(&edgevx_bin())).args(&args).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(culprit), "{args:?}: the error should name {culprit}: {err}");
    }
    // no iptables to be found: the VXLAN guard and the forward rules cannot
    // be kept, and the guard is wanted whatever the flags
    let empty = c.dir.join("empty-path");
    std::fs::create_dir_all(&empty)?;
    for flags in [&[][..], &["--iptables-forward-rules=false"][..]] {
        let mut args = vec![format!("PATH={}", empty.display()), s(&edgevx_bin()), "run".into()];
        for (f, v) in good {
            args.extend([f.to_string(), v.to_string()]);
        }
        args.extend(flags.iter().map(|f| f.to_string()));
        args.extend(["--state-dir".into(), s(&state), "--bpffs".into(), s(&bpffs)]);
        let out = h.ns.cmd("env").args(&args).output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("needs iptables, whatever the flags"), "{err}");
    }
    // EnableNFTables with an iptables-legacy: the rules would not be in
    // nftables as flanneld's would; with iptables-nft it is no obstacle
    let nft_conf = c.dir.join("net-conf-nft.json");
    std::fs::write(&nft_conf, r#"{"Network":"10.244.0.0/16","EnableNFTables":true,"Backend":{"Type":"vxlan"}}"#)?;
    for (variant, refused) in [("xtables-legacy-multi", true), ("xtables-nft-multi", false)] {
        let dir = c.dir.join(variant);
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::symlink(format!("/usr/sbin/{variant}"), dir.join("iptables"))?;
        let mut args = vec![format!("PATH={}", dir.display()), s(&edgevx_bin()), "run".into()];
        for (f, v) in good {
            args.extend([f.to_string(), v.to_string()]);
        }
        args.extend(["--net-conf".into(), s(&nft_conf), "--state-dir".into(), s(&state), "--bpffs".into(), s(&bpffs)]);
        let (code, err) = exit_or_wait(h.ns.cmd("env").args(&args), &c.dir)?;
        // with iptables-nft the run goes on to the host's part (no bpffs mounted here: waited for)
        assert_eq!(code, refused.then_some(2), "{variant}: {err}");
        assert_eq!(err.contains("EnableNFTables"), refused, "{variant}: {err}");
        assert_eq!(err.contains("is not a bpffs"), !refused, "{variant}: {err}");
    }
    assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "a device was created");
    assert!(!bpffs.exists(), "bpffs was mounted");
    Ok(())
}

/// Runs `cmd` until it exits (its code and stderr) or says it waits for the
/// host (`None`, and it is stopped).
fn exit_or_wait(cmd: &mut Command, dir: &std::path::Path) -> Result<(Option<i32>, String)> {
    let log = dir.join(format!("{}.log", edgevx_tests::unique("run")));
    let mut child = cmd.stdout(Stdio::null()).stderr(std::fs::File::create(&log)?).spawn()?;
    let deadline = Instant::now() + edgevx_tests::patience(Duration::from_secs(20));
    loop {
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(status) = child.try_wait()? {
            return Ok((status.code(), std::fs::read_to_string(&log)?));
        }
        if err.contains("not ready to bring up the dataplane") {
            let _ = child.kill();
            let _ = child.wait();
            return Ok((None, err));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            anyhow::bail!("neither exited nor waited:\n{err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_host_not_ready_yet_is_waited_for_and_the_agent_comes_up_by_itself() -> Result<()> {
    // every flag right, but no bpffs at --bpffs yet and no interface of that
    // name yet: edgevx mounts nothing and creates nothing, it says what it
    // waits for, and comes up once the host has it, with no restart
    let c = Cluster::new(1)?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let h = c.host(1);
    let (state, bpffs) = (h.state_dir(), h.bpffs_dir());
    let log = c.dir.join("waiting.log");
    let mut cmd = h.ns.cmd(edgevx_bin().to_str().context("bin path")?);
    cmd.args(["run", "--node-name", "node1", "--iface", "uplink0", "--nodes-file"])
        .arg(&nodes)
        .arg("--state-dir")
        .arg(&state)
        .arg("--bpffs")
        .arg(&bpffs)
        .arg("--subnet-file")
        .arg(h.subnet_file())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?);
    let mut agent = KillOnDrop(cmd.spawn()?);
    let wait_for = |needle: &str, child: &mut std::process::Child| -> Result<String> {
        let deadline = Instant::now() + edgevx_tests::patience(Duration::from_secs(20));
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains(needle) {
                return Ok(text);
            }
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("exited ({status}) before {needle:?}:\n{text}");
            }
            anyhow::ensure!(Instant::now() < deadline, "no {needle:?}:\n{text}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let text = wait_for("waiting for the host to mount one", &mut agent.0)?;
    assert!(text.contains(&format!("--bpffs {}", bpffs.display())) && text.contains("is not a bpffs"), "{text}");
    assert!(!bpffs.exists(), "bpffs was mounted");
    // the host mounts it now; in the agent's own mount namespace (that of its
    // `ip netns exec`), where a later mount of the root namespace would not
    // propagate here, as it would into a unit's or a HostToContainer volume
    std::fs::create_dir_all(&bpffs)?;
    let pid = agent.0.id().to_string();
    edgevx_tests::sh(&["nsenter", "-t", &pid, "-m", "mount", "-t", "bpf", "bpf", &bpffs.to_string_lossy()])?;
    let text = wait_for("no interface matches --iface uplink0", &mut agent.0)?;
    assert!(text.contains("waiting for it"), "{text}");
    assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "a device was created while waiting");
    assert!(!h.subnet_file().exists(), "subnet.env was written while waiting");
    // the interface appears (renamed into place, as udev does)
    h.ns.ip(&["link", "set", "eth0", "down"])?;
    h.ns.ip(&["link", "set", "eth0", "name", "uplink0"])?;
    h.ns.ip(&["link", "set", "uplink0", "up"])?;
    h.ns.ip(&["addr", "replace", "198.18.0.1/24", "dev", "uplink0"])?;
    wait_for("dataplane up", &mut agent.0)?;
    assert!(h.ns.ip(&["-d", "link", "show", "flannel.1"])?.contains("dev uplink0 "), "flannel.1 is not on uplink0");
    Ok(())
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_etcd_config_with_ipv6_only_exits_2_before_changing_anything() -> Result<()> {
    // flannel's etcd subnet manager always takes an IPv4 lease, so IPv6-only
    // (EnableIPv4:false) is refused in etcd mode. The config is known only
    // once etcd answers; with no cached view the agent has changed nothing by then.
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let etcd = Etcd::start(&c)?;
    let h = c.host(1);
    let (config, culprit) = (
        r#"{"Network":"10.244.0.0/16","EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fc00::/48","Backend":{"Type":"vxlan"}}"#,
        "works with the Kubernetes subnet manager only",
    );
    {
        etcd.put(&format!("{PREFIX}/config"), config)?;
        let out =
            h.ns.cmd(&edgevx_bin().to_string_lossy())
                .args(["run", "--node-name", "node1", "--iface", "eth0", "--etcd-endpoints", ENDPOINT, "--state-dir"])
                .arg(h.state_dir())
                .arg("--bpffs")
                .arg(h.bpffs_dir())
                .arg("--subnet-file")
                .arg(h.subnet_file())
                .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{config}: {err}");
        assert!(err.contains(culprit) && err.contains(&format!("{PREFIX}/config")), "{config}: {err}");
        assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "{config}: a device was created");
        assert!(!h.subnet_file().exists(), "{config}: subnet.env was written");
        assert!(etcd.get_prefix(&format!("{PREFIX}/subnets/"))?.is_empty(), "{config}: a lease was taken");
    }
    Ok(())
}

/// docs/src/migrating.md's table of refused net-confs is the binary's: each
/// row, run as `edgevx run --net-conf`, exits 2 naming the field the table
/// says, before anything on the node changes.
#[test]
fn every_net_conf_migration_md_says_is_refused_is_refused_naming_its_field() -> Result<()> {
    let doc =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/migrating.md"))?;
    let start =
        doc.find("<!-- refused net-confs").ok_or_else(|| anyhow::anyhow!("migrating.md has no refused table"))?;
    let end = doc[start..].find("<!-- end of refused net-confs -->").map(|e| start + e).unwrap_or(doc.len());
    // | `{...}` | `Field` |
    let rows: Vec<(String, String)> = doc[start..end]
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> =
                l.trim().trim_matches('|').split(" | ").map(|c| c.trim().trim_matches('`')).collect();
            (cells.len() == 2 && cells[0].starts_with('{')).then(|| (cells[0].to_string(), cells[1].to_string()))
        })
        .collect();
    assert!(rows.len() >= 5, "only {} rows in migrating.md's refused table", rows.len());
    let c = Cluster::new(1)?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    for (k, (conf, culprit)) in rows.iter().enumerate() {
        let path = c.dir.join(format!("refused-{k}.json"));
        std::fs::write(&path, conf)?;
        let out =
            h.ns.cmd(&edgevx_bin().to_string_lossy())
                .args(["run", "--node-name", "node1", "--iface", "eth0", "--nodes-file"])
                .arg(&nodes)
                .arg("--net-conf")
                .arg(&path)
                .arg("--state-dir")
                .arg(h.state_dir())
                .arg("--bpffs")
                .arg(h.bpffs_dir())
                .arg("--subnet-file")
                .arg(h.subnet_file())
                .output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{conf}: {err}");
        assert!(err.contains(culprit.as_str()), "{conf}: the error should name {culprit}: {err}");
        assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "{conf}: a device was created");
        assert!(!h.subnet_file().exists(), "{conf}: subnet.env was written");
    }
    Ok(())
}

/// `--log-format json` (or `EDGEVX_LOG_FORMAT`): every log line is one JSON
/// object a log shipper can take, with the level, the message and the
/// event's fields; a format edgevx does not have is a usage error.
#[test]
fn json_logs_are_one_object_per_line_with_the_events_fields() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let h = c.host(1);
    let bin = edgevx_bin();
    let bin = bin.to_str().context("bin path")?;
    let (state, bpffs) = (h.state_dir(), h.bpffs_dir());
    let out =
        h.ns.cmd(bin)
            .args(["cleanup", "--log-format", "json", "--state-dir"])
            .arg(&state)
            .arg("--bpffs")
            .arg(&bpffs)
            .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(out.status.success(), "cleanup of an empty node failed:\n{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("not a JSON log line: {l:?}")))
        .collect::<Result<_>>()?;
    let done = lines
        .iter()
        .find(|l| l["message"] == "nothing of edgevx is pinned any more")
        .with_context(|| format!("no line for the end of cleanup in:\n{stderr}"))?;
    assert_eq!(done["level"], "INFO", "{done}");
    assert!(done["bpffs"].as_str().is_some_and(|b| b.ends_with("bpffs")), "the event's field is flattened: {done}");
    assert!(done["timestamp"].is_string(), "{done}");
    // the environment variable a DaemonSet sets, and a format that does not exist
    let out = h.ns.cmd(bin).env("EDGEVX_LOG_FORMAT", "xml").args(["status"]).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("xml") && stderr.contains("--log-format"), "{stderr}");
    Ok(())
}
