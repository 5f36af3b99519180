//! The test network: a switch namespace with a bridge, node namespaces on
//! it (underlay 198.18.0.<i>/24 on `eth0`), and one pod per node behind the
//! node's `cni0` bridge (10.244.<i>.2, gateway 10.244.<i>.1, MTU 1450), the
//! way the flannel CNI plugin wires pods.
use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result};

use crate::{netns::Netns, sh, unique};

pub const POD_MTU: &str = "1450";

pub fn underlay_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, i)
}
pub fn pod_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, i, 2)
}
pub fn subnet(i: u8) -> String {
    format!("10.244.{i}.0/24")
}
pub fn node_name(i: u8) -> String {
    format!("node{i}")
}

/// A bpffs mounted in the root mount namespace, so pins outlive `ip netns exec`.
pub struct Bpffs {
    pub path: PathBuf,
}

impl Bpffs {
    pub fn mount(path: &Path) -> Result<Self> {
        fs::create_dir_all(path)?;
        sh(&["mount", "-t", "bpf", "bpf", path.to_str().context("path")?])?;
        Ok(Bpffs { path: path.to_path_buf() })
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).output();
        let _ = fs::remove_dir(&self.path);
    }
}

/// One node: its namespace, its pod, and its files.
pub struct Host {
    pub i: u8,
    pub ns: Netns,
    pub pod: Netns,
    pub dir: PathBuf,
    pub bpffs: Option<Bpffs>,
}

impl Host {
    pub fn name(&self) -> String {
        node_name(self.i)
    }
    pub fn state_dir(&self) -> PathBuf {
        self.dir.join("state")
    }
    pub fn bpffs_dir(&self) -> PathBuf {
        self.dir.join("bpffs")
    }
    /// The pin of the agent's map `name` (`<bpffs>/v<layout>/maps/<name>`).
    pub fn map_pin(&self, name: &str) -> anyhow::Result<PathBuf> {
        for e in std::fs::read_dir(self.bpffs_dir())? {
            let p = e?.path().join("maps").join(name);
            if p.exists() {
                return Ok(p);
            }
        }
        anyhow::bail!("no pinned {name} under {}", self.bpffs_dir().display())
    }
    pub fn subnet_file(&self) -> PathBuf {
        self.dir.join("subnet.env")
    }

    /// Mounts this node's bpffs, as a host's boot does: the agent never
    /// mounts one (it exits 2 without it), and inside `ip netns exec` such a
    /// mount would die with the agent anyway.
    pub fn mount_bpffs(&mut self) -> Result<()> {
        if self.bpffs.is_none() {
            self.bpffs = Some(Bpffs::mount(&self.bpffs_dir())?);
        }
        Ok(())
    }

    /// flanneld's `flannel.1`: kernel VXLAN, nolearning, VNI 1, port 8472.
    pub fn kernel_vtep(&self, mac: &str) -> Result<()> {
        self.kernel_vtep_at(mac, &underlay_ip(self.i).to_string())
    }

    /// The same with `local` as its source address (a node renumbered).
    pub fn kernel_vtep_at(&self, mac: &str, ip: &str) -> Result<()> {
        self.ns.batch(&[
            format!("link add flannel.1 address {mac} mtu {POD_MTU} type vxlan id 1 dev eth0 local {ip} dstport 8472 nolearning"),
            format!("addr add 10.244.{}.0/32 dev flannel.1", self.i),
            "link set flannel.1 up".into(),
        ])
    }

    /// What flanneld installs for a remote lease, in its order: arp, fdb, route.
    pub fn kernel_add_peer(&self, peer: u8, mac: &str) -> Result<()> {
        self.kernel_add_lease(peer, peer, mac)
    }

    /// The same for subnet 10.244.<subnet_of>.0/24 living on node `node`.
    pub fn kernel_add_lease(&self, subnet_of: u8, node: u8, mac: &str) -> Result<()> {
        let gw = format!("10.244.{subnet_of}.0");
        self.ns.ip(&["neigh", "replace", &gw, "lladdr", mac, "dev", "flannel.1", "nud", "permanent"])?;
        let dst = underlay_ip(node).to_string();
        self.ns.run(&["bridge", "fdb", "replace", mac, "dev", "flannel.1", "dst", &dst, "self", "permanent"])?;
        self.ns.ip(&["route", "replace", &subnet(subnet_of), "via", &gw, "dev", "flannel.1", "onlink"])?;
        Ok(())
    }

    /// Renumbers this node's bridge and pod into 10.244.<j>.0/24 (after an
    /// allocation handed the node another subnet than its index).
    pub fn renumber_pod(&self, j: u8) -> Result<()> {
        let i = self.i;
        self.ns.ip(&["addr", "del", &format!("10.244.{i}.1/24"), "dev", "cni0"])?;
        self.ns.ip(&["addr", "add", &format!("10.244.{j}.1/24"), "dev", "cni0"])?;
        self.pod.ip(&["addr", "flush", "dev", "eth0"])?;
        self.pod.ip(&["addr", "add", &format!("{}/24", pod_ip(j)), "dev", "eth0"])?;
        self.pod.ip(&["route", "replace", "default", "via", &format!("10.244.{j}.1")])?;
        Ok(())
    }

    /// Plain routing, no overlay: the pod subnet via the peer's underlay IP.
    pub fn plain_route(&self, peer: u8) -> Result<()> {
        self.ns.ip(&["route", "replace", &subnet(peer), "via", &underlay_ip(peer).to_string()]).map(|_| ())
    }
}

pub struct Cluster {
    pub tag: String,
    pub dir: PathBuf,
    pub switch: Netns,
    pub hosts: Vec<Host>,
}

impl Cluster {
    /// Nodes 1..=n on one switch, each with one pod.
    pub fn new(n: u8) -> Result<Self> {
        let tag = unique("");
        let dir = std::env::temp_dir().join(&tag);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let switch = Netns::bare(&format!("{tag}sw"))?;
        switch.batch(&["link set lo up".into(), "link add br0 type bridge".into(), "link set br0 up".into()])?;
        let mut c = Cluster { tag, dir, switch, hosts: Vec::new() };
        for i in 1..=n {
            let h = c.make_host(i)?;
            c.hosts.push(h);
        }
        Ok(c)
    }

    /// Nodes 1..=n on one switch with no `cni0` and no pod: pods come later
    /// from the real CNI plugins (`crate::cni`). Each host's `pod` is an
    /// empty namespace (only `lo`) that nothing is wired to.
    /// [`Cluster::reboot`] would give such a node the hand-made pod back.
    pub fn new_nodes_only(n: u8) -> Result<Self> {
        let mut c = Self::new(0)?;
        for i in 1..=n {
            let (ns, dir) = c.make_node(i)?;
            let pod = Netns::new(&format!("{}p{i}", c.tag))?;
            c.hosts.push(Host { i, ns, pod, dir, bpffs: None });
        }
        Ok(c)
    }

    pub fn host(&self, i: u8) -> &Host {
        &self.hosts[i as usize - 1]
    }
    pub fn host_mut(&mut self, i: u8) -> &mut Host {
        &mut self.hosts[i as usize - 1]
    }

    fn make_host(&self, i: u8) -> Result<Host> {
        let (ns, dir) = self.make_node(i)?;
        let pod = Netns::bare(&format!("{}p{i}", self.tag))?;
        let veth = format!("veth{i}");
        sh(&[
            "ip", "link", "add", "eth0", "netns", &pod.name, "mtu", POD_MTU, "type", "veth", "peer", "name", &veth,
            "netns", &ns.name, "mtu", POD_MTU,
        ])?;
        ns.batch(&[
            format!("link add cni0 mtu {POD_MTU} type bridge"),
            format!("addr add 10.244.{i}.1/24 dev cni0"),
            "link set cni0 up".into(),
            format!("link set {veth} master cni0 up"),
        ])?;
        pod.batch(&[
            "link set lo up".into(),
            format!("addr add {}/24 dev eth0", pod_ip(i)),
            "link set eth0 up".into(),
            format!("route add default via 10.244.{i}.1"),
        ])?;
        Ok(Host { i, ns, pod, dir, bpffs: None })
    }

    /// Node `i`'s namespace on the switch (`eth0`, 198.18.0.<i>/24,
    /// forwarding on) and its directory: a node before any pod exists.
    fn make_node(&self, i: u8) -> Result<(Netns, PathBuf)> {
        let ns = Netns::bare(&format!("{}n{i}", self.tag))?;
        let dir = self.dir.join(node_name(i));
        fs::create_dir_all(&dir)?;
        self.plug(&ns, &format!("sw{i}"))?;
        ns.batch(&[
            "link set lo up".into(),
            // a NIC keeps its MAC across reboots; so does this one
            format!("link set eth0 address 02:00:c6:12:00:{i:02x}"),
            format!("addr add {}/24 dev eth0", underlay_ip(i)),
            "link set eth0 up".into(),
        ])?;
        ns.sysctl("net.ipv4.ip_forward", "1")?;
        Ok((ns, dir))
    }

    /// Connects `ns` to the switch: its `eth0` is a veth whose peer is
    /// switch port `port` (`ip link add eth0 netns NS type veth peer name
    /// PORT netns SWITCH; ip link set PORT master br0 up`).
    pub fn plug(&self, ns: &Netns, port: &str) -> Result<()> {
        sh(&[
            "ip",
            "link",
            "add",
            "eth0",
            "netns",
            &ns.name,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            &self.switch.name,
        ])?;
        self.switch.ip(&["link", "set", port, "master", "br0", "up"])?;
        Ok(())
    }

    /// A reboot of node `i`: every bit of kernel state goes (namespaces,
    /// links, bpffs pins); only its files (the state dir) remain.
    pub fn reboot(&mut self, i: u8) -> Result<()> {
        let idx = i as usize - 1;
        let old_bpffs = self.hosts[idx].bpffs.take();
        drop(old_bpffs);
        let placeholder = self.make_placeholder(i)?;
        let old = std::mem::replace(&mut self.hosts[idx], placeholder);
        drop(old);
        let _ = self.switch.ip(&["link", "del", &format!("sw{i}")]);
        self.hosts[idx] = self.make_host(i)?;
        Ok(())
    }

    fn make_placeholder(&self, i: u8) -> Result<Host> {
        Ok(Host {
            i,
            ns: Netns::new(&format!("{}x{i}", self.tag))?,
            pod: Netns::new(&format!("{}y{i}", self.tag))?,
            dir: self.dir.join(node_name(i)),
            bpffs: None,
        })
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.hosts.clear();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
