//! The kernel flannel peer: a network namespace on this machine that the
//! guest's NIC is plugged into (a tap QEMU opens from inside it), holding a
//! `flannel.1` configured exactly as flanneld configures it (the e2e tests'
//! `Host::kernel_vtep` and `kernel_add_lease` in tests/src/topo.rs) and a
//! pod behind a `cni0` bridge, as the flannel CNI plugin wires one.
//!
//! Nothing of the root namespace is touched: every link, address, route and
//! sysctl lives in the two namespaces made here, and both are deleted when
//! the peer is dropped (and, from a run that was killed, by the next run).
use std::{fs, process::Command};

use anyhow::{Context, Result, bail};

use crate::exec;

/// The guest's underlay address (its NIC, static in its network config).
pub const GUEST_IP: &str = "198.18.0.1";
/// The peer's underlay address, on the tap; the guest's gateway.
pub const PEER_IP: &str = "198.18.0.2";
/// The guest NIC's MAC: its network config matches it.
pub const GUEST_NIC_MAC: &str = "52:54:00:d1:10:01";
/// The peer's `flannel.1` MAC, as its lease in etcd says.
pub const PEER_VTEP_MAC: &str = "0e:d1:10:00:00:02";
/// The peer's pod subnet, and its pod.
pub const PEER_SUBNET: &str = "10.244.2.0/24";
pub const PEER_POD_IP: &str = "10.244.2.2";
/// The tap the guest's NIC is, inside the peer's namespace.
pub const TAP: &str = "tap0";
const POD_MTU: &str = "1450";
/// Namespaces of this job are named `<PREFIX><pid>` and `<PREFIX><pid>-pod`.
const PREFIX: &str = "evx-d11-";

/// The peer's two namespaces: the node and its pod.
pub struct Peer {
    pub ns: String,
    pub pod: String,
}

impl Peer {
    /// Makes the peer node, its `flannel.1` and its pod; the tap is left for
    /// QEMU to open.
    pub fn create() -> Result<Self> {
        remove_stale();
        let ns = format!("{PREFIX}{}", std::process::id());
        let peer = Peer { pod: format!("{ns}-pod"), ns };
        for n in [&peer.ns, &peer.pod] {
            exec::run(Command::new("ip").args(["netns", "add", n]))?;
        }
        let gw = PEER_SUBNET.replace(".0/24", ".1");
        peer.batch(
            &peer.ns,
            &[
                "link set lo up".into(),
                format!("tuntap add dev {TAP} mode tap"),
                format!("addr add {PEER_IP}/24 dev {TAP}"),
                format!("link set {TAP} up"),
                // flanneld's flannel.1 (tests/src/topo.rs, kernel_vtep)
                format!(
                    "link add flannel.1 address {PEER_VTEP_MAC} mtu {POD_MTU} type vxlan id 1 dev {TAP} \
                     local {PEER_IP} dstport 8472 nolearning"
                ),
                format!("addr add {} dev flannel.1", PEER_SUBNET.replace("/24", "/32")),
                "link set flannel.1 up".into(),
                // the pod's bridge, as the bridge plugin makes it for the flannel plugin
                "link add cni0 type bridge".into(),
                format!("link set cni0 mtu {POD_MTU} up"),
                format!("addr add {gw}/24 dev cni0"),
                format!("link add veth0 mtu {POD_MTU} type veth peer name eth0 netns {}", peer.pod),
                "link set veth0 master cni0 up".into(),
            ],
        )?;
        peer.batch(
            &peer.pod,
            &[
                "link set lo up".into(),
                format!("addr add {PEER_POD_IP}/24 dev eth0"),
                "link set eth0 up".into(),
                format!("route add default via {gw}"),
            ],
        )?;
        // a node routes its pods' traffic (in this namespace only)
        exec::output(Command::new("ip").args(["netns", "exec", &peer.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"]))?;
        Ok(peer)
    }

    fn batch(&self, ns: &str, lines: &[String]) -> Result<()> {
        let file = std::env::temp_dir().join(format!("{ns}.ip-batch"));
        fs::write(&file, lines.join("\n") + "\n")?;
        let r = exec::output(Command::new("ip").args(["-n", ns, "-batch"]).arg(&file));
        let _ = fs::remove_file(&file);
        r.map(|_| ()).with_context(|| format!("cannot set up the peer's namespace {ns}"))
    }

    /// What flanneld writes to etcd for this node: its lease's key (under
    /// the prefix) and value, in flanneld's exact format.
    pub fn lease() -> (String, String) {
        let key = format!("/coreos.com/network/subnets/{}", PEER_SUBNET.replace('/', "-"));
        let value = format!(
            r#"{{"PublicIP":"{PEER_IP}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{PEER_VTEP_MAC}"}}}}"#
        );
        (key, value)
    }

    /// What flanneld installs for a remote lease, in its order: arp, fdb,
    /// route (tests/src/topo.rs, kernel_add_lease).
    pub fn add_lease(&self, subnet: &str, public_ip: &str, mac: &str) -> Result<()> {
        let Some(gw) = subnet.strip_suffix("/24").filter(|s| s.ends_with(".0")) else {
            bail!("the guest's subnet {subnet} is not a /24 (flannel's SubnetLen in the test's config)");
        };
        self.ip(&["neigh", "replace", gw, "lladdr", mac, "dev", "flannel.1", "nud", "permanent"])?;
        self.run(
            &self.ns,
            &["bridge", "fdb", "replace", mac, "dev", "flannel.1", "dst", public_ip, "self", "permanent"],
        )?;
        self.ip(&["route", "replace", subnet, "via", gw, "dev", "flannel.1", "onlink"])?;
        Ok(())
    }

    /// `bridge fdb show dev flannel.1` in the peer: the MACs it sends to.
    pub fn fdb(&self) -> Result<String> {
        self.run(&self.ns, &["bridge", "fdb", "show", "dev", "flannel.1"])
    }

    /// Packets the peer's `flannel.1` has received.
    pub fn vxlan_rx_packets(&self) -> Result<u64> {
        let out = self.run(&self.ns, &["cat", "/sys/class/net/flannel.1/statistics/rx_packets"])?;
        out.trim().parse().with_context(|| format!("rx_packets of the peer's flannel.1: {out:?}"))
    }

    /// Pings `ip` from the peer's pod: `ping -c 3 -w 60`, which waits up
    /// to a minute for three answers. Its output, or an error holding it.
    pub fn ping_from_pod(&self, ip: &str) -> Result<String> {
        self.run(&self.pod, &["ping", "-n", "-c", "3", "-w", "60", ip])
            .with_context(|| format!("the peer's pod {PEER_POD_IP} cannot reach {ip}"))
    }

    fn ip(&self, args: &[&str]) -> Result<String> {
        exec::output(Command::new("ip").arg("-n").arg(&self.ns).args(args))
    }

    fn run(&self, ns: &str, args: &[&str]) -> Result<String> {
        exec::output(Command::new("ip").args(["netns", "exec", ns]).args(args))
    }

    /// `ip netns exec <peer>`, for QEMU to open the tap from inside.
    pub fn exec_in(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        for n in [&self.pod, &self.ns] {
            let _ = Command::new("ip").args(["netns", "delete", n]).output();
        }
    }
}

/// Deletes this job's namespaces left by a run that was killed (whose pid
/// is gone): a killed run cannot drop its peer.
fn remove_stale() {
    let Ok(out) = exec::output(Command::new("ip").args(["netns", "list"])) else { return };
    for name in out.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(pid) = name.strip_prefix(PREFIX).map(|r| r.trim_end_matches("-pod")) else { continue };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
            eprintln!("xtask: deleting the namespace {name}, left by a run that was killed");
            let _ = Command::new("ip").args(["netns", "delete", name]).output();
        }
    }
}
