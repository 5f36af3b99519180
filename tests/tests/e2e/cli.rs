//! Bad flags and config: exit code 2, a message naming the culprit, and
//! nothing changed on the host.
use std::process::Output;

use anyhow::Result;
use edgevx_tests::{
    edgevx_bin,
    nodes::{flannel_node, node_list, write},
    topo::Cluster,
};

fn run(c: &Cluster, args: &[&str]) -> Result<Output> {
    Ok(c.host(1).ns.cmd(edgevx_bin().to_str().unwrap_or("edgevx")).arg("run").args(args).output()?)
}

#[test]
fn bad_input_exits_2_naming_the_culprit_and_changes_nothing() -> Result<()> {
    let c = Cluster::new(1)?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let bad_conf = c.dir.join("net-conf.json");
    std::fs::write(&bad_conf, r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":0}}"#)?;
    let state = h.state_dir();
    let bpffs = h.bpffs_dir();
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--state-dir", state.to_str().unwrap_or(""), "--bpffs", bpffs.to_str().unwrap_or("")]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let nodes_s = nodes.to_str().unwrap_or("");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (base(&["--node-name", "node1", "--iface", "nosuch0", "--nodes-file", nodes_s]), "nosuch0"),
        (
            base(&["--node-name", "node1", "--iface", "eth0", "--nodes-file", "/nonexistent/nodes.json"]),
            "/nonexistent/nodes.json",
        ),
        (
            base(&[
                "--node-name",
                "node1",
                "--iface",
                "eth0",
                "--nodes-file",
                nodes_s,
                "--net-conf",
                bad_conf.to_str().unwrap_or(""),
            ]),
            "Backend.VNI",
        ),
        (
            base(&[
                "--node-name",
                "node1",
                "--iface",
                "eth0",
                "--nodes-file",
                nodes_s,
                "--net-conf",
                "/nonexistent/net-conf.json",
            ]),
            "/nonexistent/net-conf.json",
        ),
        (
            base(&[
                "--node-name",
                "node1",
                "--iface",
                "eth0",
                "--nodes-file",
                nodes_s,
                "--kube-annotation-prefix",
                "a/b/c",
            ]),
            "a/b/c",
        ),
        (
            base(&["--node-name", "node1", "--iface", "eth0", "--nodes-file", nodes_s, "--public-ip", "300.1.1.1"]),
            "300.1.1.1",
        ),
        (base(&["--iface", "eth0", "--nodes-file", nodes_s]), "--node-name"),
    ];
    for (args, culprit) in cases {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&c, &refs)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(culprit), "{args:?}: error should name {culprit}: {err}");
    }
    assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "a device was created");
    assert!(!state.exists(), "the state dir was written");
    assert!(!bpffs.exists(), "bpffs was mounted");
    Ok(())
}
