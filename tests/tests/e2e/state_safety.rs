//! What the agent writes as root never follows a link someone planted, and
//! an older agent never touches a newer one's dataplane: both stop `run`
//! with exit 2, a message naming the culprit, and nothing changed.
use std::{os::unix::fs::symlink, path::Path, process::Output};

use anyhow::Result;
use edgevx_common::SCHEMA_VERSION;
use edgevx_tests::{
    agent::Agent,
    edgevx_bin,
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host},
};

/// `edgevx run` for `h` with a nodes file, waited for (it is expected to exit).
fn run_once(h: &Host, nodes: &Path) -> Result<Output> {
    let out =
        h.ns.cmd(&edgevx_bin().to_string_lossy())
            .args(["run", "--node-name", &h.name(), "--iface", "eth0", "--nodes-file"])
            .arg(nodes)
            .arg("--state-dir")
            .arg(h.state_dir())
            .arg("--bpffs")
            .arg(h.bpffs_dir())
            .arg("--subnet-file")
            .arg(h.subnet_file())
            .output()?;
    Ok(out)
}

fn assert_untouched(h: &Host) {
    assert!(h.ns.ip(&["link", "show", "flannel.1"]).is_err(), "a VTEP was created");
    assert!(!h.bpffs_dir().join(format!("v{SCHEMA_VERSION}")).exists(), "pins were made");
}

#[test]
fn a_symlinked_state_file_or_subnet_env_is_refused_and_its_target_untouched() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let victim = c.dir.join("victim");
    std::fs::write(&victim, "root-owned file an attacker wants overwritten\n")?;

    // 1. a link where a VTEP MAC is saved (either family's: the IPv6 one is
    // refused before anything starts too, IPv6 on or not)
    std::fs::create_dir_all(h.state_dir())?;
    for name in ["vtep-mac", "vtep-mac6"] {
        let mac_file = h.state_dir().join(name);
        symlink(&victim, &mac_file)?;
        let out = run_once(h, &nodes)?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(&mac_file.display().to_string()) && err.contains("symlink"), "{err}");
        assert_untouched(h);
        std::fs::remove_file(&mac_file)?;
    }

    // 2. a link (here dangling: the file would be created) where subnet.env goes
    let planted = c.dir.join("planted-by-attacker");
    symlink(&planted, h.subnet_file())?;
    let out = run_once(h, &nodes)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--subnet-file") && err.contains(&h.subnet_file().display().to_string()), "{err}");
    assert!(!planted.exists(), "the link was followed");
    assert_untouched(h);
    std::fs::remove_file(h.subnet_file())?;

    // 3. a state dir that is itself a link
    std::fs::remove_dir_all(h.state_dir())?;
    let elsewhere = c.dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere)?;
    symlink(&elsewhere, h.state_dir())?;
    let out = run_once(h, &nodes)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&h.state_dir().display().to_string()) && err.contains("symlink"), "{err}");
    assert_eq!(std::fs::read_dir(&elsewhere)?.count(), 0, "something was written through the link");
    std::fs::remove_file(h.state_dir())?;

    assert_eq!(std::fs::read_to_string(&victim)?, "root-owned file an attacker wants overwritten\n");
    assert_untouched(h);

    // with the links gone the same node starts, its state dir private
    let a = Agent::start(h, &nodes, &[])?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(h.state_dir())?.permissions());
    assert_eq!(mode & 0o777, 0o700, "state dir mode {mode:o}");
    drop(a);
    Ok(())
}

#[test]
fn a_newer_pin_version_stops_an_older_agent_which_touches_nothing() -> Result<()> {
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let h = c.host(1);
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    // what a newer edgevx and an older one left on this node
    let newer = h.bpffs_dir().join(format!("v{}", SCHEMA_VERSION + 1));
    let older = h.bpffs_dir().join(format!("v{}", SCHEMA_VERSION - 1));
    for d in [&newer, &older] {
        for sub in ["maps", "links", "progs"] {
            std::fs::create_dir_all(d.join(sub))?;
        }
    }

    let out = run_once(h, &nodes)?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&newer.display().to_string()) && err.contains("newer"), "{err}");
    assert!(newer.join("maps").is_dir() && older.join("maps").is_dir(), "pins were removed");
    assert_untouched(h);
    assert!(!h.state_dir().exists(), "the state dir was written");
    assert!(!h.subnet_file().exists(), "subnet.env was written");

    // once the newer one is gone, the older pins (and only they) are retired
    std::fs::remove_dir_all(&newer)?;
    let a = Agent::start(h, &nodes, &[])?;
    assert!(!older.exists(), "the older version's pins were not retired");
    assert!(h.bpffs_dir().join(format!("v{SCHEMA_VERSION}")).is_dir());
    drop(a);
    Ok(())
}

/// A fresh state dir (it holds the VTEP MAC and the cached view) is made
/// 0700 from the start, with no window at a looser mode to tighten later.
#[test]
fn a_fresh_state_dir_is_created_0700() -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut c = Cluster::new(1)?;
    c.host_mut(1).mount_bpffs()?;
    let nodes = c.dir.join("nodes.json");
    write(&nodes, &node_list(vec![flannel_node(1, None)]))?;
    let h = c.host(1);
    assert!(!h.state_dir().exists());
    let agent = Agent::start(h, &nodes, &[])?;
    let mode = std::fs::metadata(h.state_dir())?.permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "the state dir is {mode:o}");
    assert!(!agent.log_text().contains("tightening"), "{}", agent.log_text());
    Ok(())
}
