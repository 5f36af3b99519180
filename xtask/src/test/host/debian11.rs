//! The Debian 11 tests: the systemd path on a booted Debian 11 (its systemd
//! 247 as PID 1, its 5.10 kernel, its etcd 3.3), edgevx installed from the
//! release tarball exactly as README.md says, next to a kernel flannel peer
//! (host/peer.rs). They run in this order on one guest, each after the
//! install (host/install.rs); each can fail on its own, and a failed one
//! does not stop the next unless the guest is gone.
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use super::{
    install::{ENV_FILE, Node, node_lease},
    machine::{COMMAND, Machine},
    peer::{GUEST_IP, PEER_IP, PEER_POD_IP, PEER_SUBNET, PEER_VTEP_MAC, Peer},
    root::{NETWORK_FILE, network_config},
};

/// What the tests share: the guest, the peer, the node as installed.
pub struct Bed {
    pub m: Machine,
    pub peer: Peer,
    pub node: Node,
}

pub type TestFn = fn(&mut Bed) -> Result<()>;

/// Every test, in the order they run.
pub const TESTS: &[(&str, TestFn)] = &[
    ("ready::the_unit_is_active_once_the_node_forwards_and_etcd_holds_its_lease", ready),
    ("reboot::the_vtep_mac_and_the_pod_path_survive_systemctl_reboot", reboot),
    ("offline_reboot::without_default_route_or_etcd_the_node_forwards_from_its_last_bring_up", offline_reboot),
    ("bad_flag::a_bad_flag_stays_down_with_exit_2_and_a_line_naming_it", bad_flag),
];

/// The agent's line when rule 5 of interface selection takes the interface
/// of the recorded public IP (agent/src/run/iface.rs).
const NO_ROUTE_LINE: &str = "no default route: taking the interface that carries the public IP of the last bring-up";
/// How long the unit has to become active: its own TimeoutStartSec is two
/// minutes a start, and systemd restarts it after a timeout.
const ACTIVE: Duration = Duration::from_secs(600);

/// 1. `systemctl enable --now` returned with the unit active (Type=notify:
///    READY=1 once the node forwards), systemd says so, etcd holds the
///    node's lease in flannel's layout, and the pods reach each other.
fn ready(bed: &mut Bed) -> Result<()> {
    let m = &mut bed.m;
    let state = prop(m, "ActiveState")?;
    ensure!(state == "active", "edgevx.service is {state}, not active:\n{}", journal(m));
    ensure!(m.sh("systemctl is-active edgevx")?.trim() == "active");
    let text = prop(m, "StatusText")?;
    ensure!(text.contains("forwarding"), "StatusText is {text:?}, not what READY=1 sends (forwarding)");
    let status = vtep_agrees(m)?;
    ensure!(status["dataplane_attached"] == true, "edgevx status: the dataplane is not attached:\n{status:#}");
    ensure!(status["public_ip"] == GUEST_IP, "edgevx status: public_ip {}", status["public_ip"]);
    ensure!(status["subnet"] == bed.node.subnet.as_str(), "edgevx status: subnet {}", status["subnet"]);
    let peer = status["peers"].as_array().into_iter().flatten().find(|p| p["public_ip"] == PEER_IP);
    let peer = peer.with_context(|| format!("edgevx status lists no peer {PEER_IP}:\n{status:#}"))?;
    ensure!(
        peer["subnet"] == PEER_SUBNET && peer["vtep_mac"] == PEER_VTEP_MAC && peer["in_dataplane"] == true,
        "the peer from etcd is not programmed as its lease says:\n{peer:#}"
    );
    // flannel's layout: <prefix>/subnets/<a.b.c.d>-<len>, flanneld's JSON, on an etcd lease (a TTL)
    let (subnet, lease) = node_lease(m)?;
    ensure!(subnet == bed.node.subnet, "the lease is for {subnet}");
    ensure!(lease["BackendType"] == "vxlan" && lease["BackendData"]["VNI"] == 1, "the lease: {lease}");
    ensure!(lease["BackendData"]["VtepMAC"] == status["vtep_mac"], "the lease's MAC is not the VTEP's: {lease}");
    ensure!(lease["lease_id"].as_i64().is_some_and(|id| id != 0), "the node's key has no TTL (no etcd lease): {lease}");
    pods_reach_each_other(bed)?;
    match &bed.node.workaround {
        None => Ok(()),
        Some(why) => {
            bail!("the unit as shipped never became active; all the above held only with a workaround:\n{why}")
        }
    }
}

/// 2. A real `systemctl reboot`: the same disk, the kernel booted again.
///    The VTEP MAC is the one before (the peer keeps that one in its fdb and
///    is not told anything), the pod is made again after edgevx, and the
///    peer's pod reaches it.
fn reboot(bed: &mut Bed) -> Result<()> {
    let before = vtep_agrees(&mut bed.m)?["vtep_mac"].as_str().unwrap_or_default().to_string();
    ensure!(before == bed.node.mac, "the VTEP MAC {before} is not the lease's {} before the reboot", bed.node.mac);
    let state = bed.m.reboot()?;
    eprintln!("xtask: rebooted ({} kernel starts on the console); systemd: {state}", bed.m.kernel_starts());
    wait_active(&mut bed.m)?;
    let after = vtep_agrees(&mut bed.m)?["vtep_mac"].as_str().unwrap_or_default().to_string();
    ensure!(after == before, "the VTEP MAC changed across the reboot: {before} before, {after} after");
    let fdb = bed.peer.fdb()?;
    ensure!(fdb.contains(&before), "the peer's fdb lost {before}:\n{fdb}");
    pods_reach_each_other(bed)
}

/// 3. A reboot with no default route (the gateway taken out of the guest's
///    network config) and etcd stopped: the agent takes the interface that
///    carries the public IP of its last bring-up, the unit is active, and
///    the pods reach each other.
fn offline_reboot(bed: &mut Bed) -> Result<()> {
    let iface = vtep_agrees(&mut bed.m)?["iface"].as_str().unwrap_or_default().to_string();
    bed.m.write(NETWORK_FILE, &network_config(false))?;
    bed.m.sh("systemctl disable --quiet etcd")?;
    bed.m.reboot()?;
    let m = &mut bed.m;
    let routes = m.sh("ip -4 route show default")?;
    ensure!(routes.trim().is_empty(), "the guest still has a default route, the test would prove nothing:\n{routes}");
    let etcd = m.exec("systemctl is-active etcd", COMMAND)?.stdout;
    ensure!(etcd.trim() != "active", "etcd is running, the test would prove nothing");
    wait_active(m)?;
    let log = m.sh("journalctl -b -u edgevx -o cat --no-pager")?;
    ensure!(
        log.contains(NO_ROUTE_LINE),
        "this boot's journal of edgevx has no {NO_ROUTE_LINE:?}:\n{}",
        super::tail(&log, 30)
    );
    let status = vtep_agrees(m)?;
    ensure!(status["iface"] == iface.as_str(), "the agent took {} and not {iface}", status["iface"]);
    ensure!(status["vtep_mac"] == bed.node.mac.as_str(), "the VTEP MAC changed: {}", status["vtep_mac"]);
    pods_reach_each_other(bed)
}

/// 4. A bad flag stays down: an invalid EDGEVX_IFACE_REGEX in the env file,
///    then a flanneld flag with no edgevx meaning in ExecStart (a drop-in).
///    Each makes the agent exit 2, which systemd does not restart, and the
///    journal names the culprit. Put right, the unit is active again.
fn bad_flag(bed: &mut Bed) -> Result<()> {
    let m = &mut bed.m;
    m.write(ENV_FILE, &format!("{}EDGEVX_IFACE_REGEX=(\n", bed.node.env))?;
    stays_down(m, "iface-regex")?;
    m.write(ENV_FILE, &bed.node.env)?;
    let dropin = "/etc/systemd/system/edgevx.service.d/flanneld-flag.conf";
    m.write(dropin, "[Service]\nExecStart=\nExecStart=/usr/local/bin/edgevx run -iptables-resync=5\n")?;
    m.sh("systemctl daemon-reload")?;
    stays_down(m, "iptables-resync")?;
    m.sh(&format!("rm {dropin} && systemctl daemon-reload && systemctl restart edgevx"))
        .context("put right, edgevx did not start again")?;
    wait_active(m)
}

/// Restarts the unit with a bad setting in place: it must fail with exit
/// status 2, stay failed (no restart) for three times its RestartSec, and
/// its journal must have a line naming `culprit`.
fn stays_down(m: &mut Machine, culprit: &str) -> Result<()> {
    let restart = m.exec("systemctl restart edgevx", ACTIVE)?;
    ensure!(restart.code != 0, "systemctl restart edgevx succeeded with the bad {culprit}");
    let (state, status) = (prop(m, "ActiveState")?, prop(m, "ExecMainStatus")?);
    ensure!(state == "failed", "with the bad {culprit} the unit is {state}, not failed:\n{}", journal(m));
    ensure!(status == "2", "with the bad {culprit} the agent exited {status}, not 2:\n{}", journal(m));
    let restarts = prop(m, "NRestarts")?;
    let restart_sec: f64 = prop(m, "RestartUSec")?.trim_end_matches('s').parse().unwrap_or(5.0);
    std::thread::sleep(Duration::from_secs_f64(3.0 * restart_sec));
    let (state, later) = (prop(m, "ActiveState")?, prop(m, "NRestarts")?);
    ensure!(state == "failed" && later == restarts, "exit 2 was restarted: {state}, NRestarts {restarts} then {later}");
    let invocation = prop(m, "InvocationID")?;
    let log = m.sh(&format!("journalctl -b -o cat --no-pager _SYSTEMD_INVOCATION_ID={invocation}"))?;
    let line = log.lines().find(|l| l.to_lowercase().contains(culprit) || l.contains(&culprit_env(culprit)));
    let line = line.with_context(|| format!("no journal line names {culprit}:\n{}", super::tail(&log, 30)))?;
    eprintln!("xtask: the bad {culprit}: exit 2, not restarted; the journal says: {line}");
    Ok(())
}

/// `iface-regex` → `IFACE_REGEX`, as the variable's name says it.
fn culprit_env(flag: &str) -> String {
    flag.to_uppercase().replace('-', "_")
}

/// Both ways between the pods, through VXLAN: the guest's pod (made again
/// after every boot) and the peer's. The peer's `flannel.1` must count what
/// it received.
fn pods_reach_each_other(bed: &mut Bed) -> Result<()> {
    let m = &mut bed.m;
    let unit = prop_of(m, "edgevx-test-pod", "ActiveState")?;
    ensure!(
        unit == "active",
        "the pod's unit is {unit}:\n{}",
        m.exec("journalctl -b -u edgevx-test-pod", COMMAND)?.both()
    );
    let addr = m.sh("ip -n pod -4 -o addr show dev eth0")?;
    let pod = addr
        .split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .with_context(|| format!("the guest's pod has no IPv4 address: {addr}"))?
        .to_string();
    ensure!(
        pod.starts_with(bed.node.subnet.trim_end_matches("0/24")),
        "the pod's {pod} is outside the node's {}",
        bed.node.subnet
    );
    let rx = bed.peer.vxlan_rx_packets()?;
    let out = m.exec(&format!("ip netns exec pod ping -n -c 3 -w 60 {PEER_POD_IP}"), COMMAND)?;
    ensure!(out.code == 0, "the guest's pod {pod} cannot reach the peer's pod {PEER_POD_IP}:\n{}", out.both());
    bed.peer.ping_from_pod(&pod)?;
    let got = bed.peer.vxlan_rx_packets()? - rx;
    ensure!(got >= 6, "the peer's flannel.1 received {got} packets for 6 echo requests and replies");
    eprintln!("xtask: pods {pod} and {PEER_POD_IP} reach each other through VXLAN");
    Ok(())
}

/// `edgevx status --json`, after checking that its VTEP MAC is the one
/// `ip -d link show flannel.1` shows on a VXLAN device as flanneld makes it.
fn vtep_agrees(m: &mut Machine) -> Result<Value> {
    let out = m.sh("edgevx status --json")?;
    let status: Value = serde_json::from_str(&out).with_context(|| format!("edgevx status --json: {out}"))?;
    let link = m.sh("ip -d link show flannel.1")?;
    let mac = link.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).unwrap_or_default();
    ensure!(
        link.contains("vxlan id 1 ") && link.contains("dstport 8472"),
        "flannel.1 is not VXLAN id 1 on port 8472:\n{link}"
    );
    ensure!(status["vtep_mac"] == mac, "edgevx status says VTEP MAC {}, the link has {mac}", status["vtep_mac"]);
    Ok(status)
}

/// Waits for edgevx.service to be active.
fn wait_active(m: &mut Machine) -> Result<()> {
    let since = Instant::now();
    loop {
        let state = prop(m, "ActiveState")?;
        if state == "active" {
            return Ok(());
        }
        if since.elapsed() > ACTIVE {
            let text = prop(m, "StatusText")?;
            bail!("edgevx.service is {state} ({text}) after {} s:\n{}", ACTIVE.as_secs(), journal(m));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn prop(m: &mut Machine, name: &str) -> Result<String> {
    prop_of(m, "edgevx", name)
}

fn prop_of(m: &mut Machine, unit: &str, name: &str) -> Result<String> {
    Ok(m.sh(&format!("systemctl show -p {name} --value {unit}"))?.trim().to_string())
}

/// The end of this boot's journal of edgevx, for a failure's message.
fn journal(m: &mut Machine) -> String {
    m.exec("journalctl -b -u edgevx -o short-monotonic --no-pager -n 40", COMMAND)
        .map(|o| o.both())
        .unwrap_or_else(|e| format!("(no journal: {e:#})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_are_unique_and_the_culprits_read_as_variables_too() {
        let mut names: Vec<&str> = TESTS.iter().map(|(n, _)| *n).collect();
        names.dedup();
        assert_eq!(names.len(), TESTS.len());
        assert_eq!(culprit_env("iface-regex"), "IFACE_REGEX");
    }
}
