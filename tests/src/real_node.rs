//! Kubernetes flannel nodes made of real parts, in namespaces.
//!
//! Each node sits on the switch of [`Cluster::new_nodes_only`] with a default
//! route to an "internet" namespace (198.18.0.200, no route back to pods), so
//! pod traffic to it leaves unencapsulated and only comes back if the node
//! masqueraded it. A node is one of:
//! - **edgevx**: the agent from a nodes file, writing subnet.env itself;
//! - **kernel flannel**: flanneld's VXLAN device, arp, fdb and routes
//!   ([`Host::kernel_vtep`], [`Host::kernel_add_peer`]), the subnet.env that
//!   `flanneld --ip-masq` writes, and flanneld's own iptables rules.
//!
//! Either way its pods come from the real CNI plugins fed from that
//! subnet.env ([`crate::cni`]), and kube-proxy's rules can be added
//! ([`crate::kube_proxy`]). The nodes' DNS server is out of reach, as on an
//! edge node cut off from the cloud ([`UNREACHABLE_DNS`]). The probes at the
//! end run TCP and UDP endpoints on threads that enter a namespace, and
//! report the source address the server saw.
use std::{
    fmt::Write as _,
    fs,
    io::{self, BufRead, BufReader, ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};

use crate::{
    agent::{Agent, wait_status},
    cni::{Cidr, CniPod, SubnetEnv},
    kube_proxy::{self, KubeProxy, MASQ_MARK, Mode, Service},
    netns::{Netns, spawn_in},
    nodes::{flannel_node, node_list, write},
    topo::{Cluster, Host, POD_MTU, subnet},
    traffic::wait_reachable,
};

/// The stand-in for everything outside the cluster.
pub const INTERNET_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 200);

/// The nodes' DNS server: behind the internet namespace, which drops what
/// it is sent, as an edge node's resolver is unreachable when the node is
/// cut off. Anything on a node that resolves names (`iptables -L` without
/// `-n` looks up every address in the chain) then waits for timeouts.
pub const UNREACHABLE_DNS: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 53);

/// The flannel network (net-conf.json `Network`).
pub const NETWORK: &str = "10.244.0.0/16";

#[derive(Clone, Copy, Debug)]
pub enum NodeKind {
    /// `edgevx run --nodes-file ...` with these extra flags.
    Edgevx(&'static [&'static str]),
    /// Kernel VXLAN set up as flanneld does, with `--ip-masq`.
    KernelFlannel,
}

/// Node `i`'s VTEP MAC, published in the nodes file for every kind of node.
pub fn vtep_mac(i: u8) -> String {
    format!("02:ee:00:00:00:{i:02x}")
}

/// flanneld's `--ip-masq` and forward rules for a node owning `pod_cidr`
/// (flannel `pkg/trafficmngr/iptables/iptables.go`: `masqRules` in
/// `FLANNEL-POSTRTG`, `forwardRules` in `FLANNEL-FWD`), as
/// `iptables-restore --noflush` input. flanneld appends its jumps.
pub fn flannel_iptables_rules(pod_cidr: &str) -> String {
    let net = NETWORK;
    let masq = "-m comment --comment \"flanneld masq\"";
    let fwd = "-m comment --comment \"flanneld forward\"";
    [
        "*nat".to_string(),
        ":FLANNEL-POSTRTG - [0:0]".into(),
        format!("-A POSTROUTING {masq} -j FLANNEL-POSTRTG"),
        // kube-proxy masquerades what it marked; flannel leaves it alone
        format!("-A FLANNEL-POSTRTG -m mark --mark {MASQ_MARK}/{MASQ_MARK} {masq} -j RETURN"),
        // pod to pod: never NAT
        format!("-A FLANNEL-POSTRTG -s {pod_cidr} -d {net} {masq} -j RETURN"),
        format!("-A FLANNEL-POSTRTG -s {net} -d {pod_cidr} {masq} -j RETURN"),
        format!("-A FLANNEL-POSTRTG ! -s {net} -d {pod_cidr} {masq} -j RETURN"),
        // pods to the world, and the host into the overlay
        format!("-A FLANNEL-POSTRTG -s {net} ! -d 224.0.0.0/4 {masq} -j MASQUERADE --random-fully"),
        format!("-A FLANNEL-POSTRTG ! -s {net} -d {net} {masq} -j MASQUERADE --random-fully"),
        "COMMIT".into(),
        "*filter".into(),
        ":FLANNEL-FWD - [0:0]".into(),
        format!("-A FORWARD {fwd} -j FLANNEL-FWD"),
        format!("-A FLANNEL-FWD -s {net} {fwd} -j ACCEPT"),
        format!("-A FLANNEL-FWD -d {net} {fwd} -j ACCEPT"),
        "COMMIT".into(),
        String::new(),
    ]
    .join("\n")
}

/// Nodes, their pods, their agents and the internet namespace. Fields drop
/// in order: pods first (CNI DEL while their node still exists), then the
/// agents, then the namespaces.
pub struct RealCluster {
    /// `pods[i - 1]` are node i's pods, in the order they were added.
    pub pods: Vec<Vec<CniPod>>,
    /// `agents[i - 1]` is node i's agent, if it is an edgevx node.
    pub agents: Vec<Option<Agent>>,
    pub kinds: Vec<NodeKind>,
    pub internet: Netns,
    pub cluster: Cluster,
    /// Held for its drop.
    _resolv_conf: ResolvConf,
}

/// `/etc/netns/<node>/resolv.conf`, which `ip netns exec` bind-mounts over
/// `/etc/resolv.conf` for everything run in the node, naming
/// [`UNREACHABLE_DNS`]; removed on drop. Without it a node would use this
/// machine's resolver, and what a lookup does would depend on the machine.
struct ResolvConf {
    dirs: Vec<PathBuf>,
    /// /etc/netns did not exist before: remove it if it is empty again.
    made_parent: bool,
}

const NETNS_ETC: &str = "/etc/netns";

impl ResolvConf {
    fn write(nodes: &[Host]) -> Result<Self> {
        let mut made = ResolvConf { dirs: Vec::new(), made_parent: !Path::new(NETNS_ETC).exists() };
        for h in nodes {
            let dir = Path::new(NETNS_ETC).join(&h.ns.name);
            fs::create_dir_all(&dir)?;
            made.dirs.push(dir.clone());
            fs::write(dir.join("resolv.conf"), format!("nameserver {UNREACHABLE_DNS}\n"))?;
        }
        Ok(made)
    }
}

impl Drop for ResolvConf {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = fs::remove_dir_all(dir);
        }
        if self.made_parent {
            let _ = fs::remove_dir(NETNS_ETC); // fails, as it should, if anyone else put something there
        }
    }
}

impl RealCluster {
    /// Nodes 1..=kinds.len() with `pods_per_node` pods each; returns once
    /// every node's first pod answers a ping from every other node's.
    pub fn start(kinds: &[NodeKind], pods_per_node: u8) -> Result<Self> {
        // the fast path's kfuncs need conntrack's module loaded before the agent probes
        if kinds.iter().any(|k| matches!(k, NodeKind::Edgevx(flags) if !flags.contains(&"--fast-path=off"))) {
            crate::ct_kfuncs::like_a_node()?;
        }
        let cluster = Cluster::new_nodes_only(u8::try_from(kinds.len())?)?;
        let internet = Netns::new(&format!("{}inet", cluster.tag))?;
        cluster.plug(&internet, "sw200")?;
        internet.ip(&["addr", "add", &format!("{INTERNET_IP}/24"), "dev", "eth0"])?;
        internet.ip(&["link", "set", "eth0", "up"])?;
        let resolv_conf = ResolvConf::write(&cluster.hosts)?;
        let mut rc = RealCluster {
            pods: Vec::new(),
            agents: Vec::new(),
            kinds: kinds.to_vec(),
            internet,
            cluster,
            _resolv_conf: resolv_conf,
        };
        for h in &rc.cluster.hosts {
            h.ns.ip(&["route", "add", "default", "via", &INTERNET_IP.to_string()])?;
        }

        let nodes_file = rc.cluster.dir.join("nodes.json");
        let n = u8::try_from(kinds.len())?;
        write(&nodes_file, &node_list((1..=n).map(|i| flannel_node(i, Some(&vtep_mac(i)))).collect()))?;
        for (i, kind) in (1..=n).zip(kinds) {
            let agent = match kind {
                NodeKind::Edgevx(flags) => {
                    rc.cluster.host_mut(i).mount_bpffs()?;
                    let host = rc.cluster.host(i);
                    let agent = Agent::start(host, &nodes_file, flags)?;
                    wait_for_file(&host.subnet_file(), Duration::from_secs(10))
                        .with_context(|| format!("agent log:\n{}", agent.log_text()))?;
                    Some(agent)
                }
                NodeKind::KernelFlannel => {
                    kernel_flannel_node(rc.cluster.host(i), n)?;
                    None
                }
            };
            rc.agents.push(agent);
        }

        for h in &rc.cluster.hosts {
            let env = SubnetEnv::read(&h.subnet_file())?;
            let pods = (0..pods_per_node)
                .map(|k| CniPod::add(&h.ns, &format!("{}c{k}", h.ns.name), &env, &h.dir.join("ipam")))
                .collect::<Result<Vec<_>>>()?;
            rc.pods.push(pods);
        }
        if pods_per_node > 0 {
            // every pod answers across the tunnel, so every node has a
            // neighbour entry for each of its pods and the agents learn them
            let warm = || -> Result<()> {
                for a in 1..=n {
                    for b in (1..=n).filter(|&b| b != a) {
                        for k in 0..usize::from(pods_per_node) {
                            wait_reachable(&rc.pod(a, 0).netns, rc.pod(b, k).ip, 20)?;
                        }
                    }
                }
                for agent in rc.agents.iter().flatten() {
                    let want = u64::from(pods_per_node);
                    wait_status(agent, Duration::from_secs(10), "every local pod learned", |s| {
                        s["local_pods"].as_u64() >= Some(want)
                    })?;
                }
                Ok(())
            };
            if let Err(e) = warm() {
                eprintln!("{}", rc.report());
                return Err(e);
            }
        }
        Ok(rc)
    }

    /// Node `i` loses power and boots again: its agent is killed, its
    /// namespaces, links, pins, pods and rules go with no CNI DEL; its files
    /// (state dir, IPAM store, subnet.env) stay. It comes back with its
    /// underlay, default route and bpffs, and no cni0 or pod until the
    /// bridge plugin makes them. The caller drops its pods' handles first
    /// ([`IpamPod::vanish`](crate::ipam_pod::IpamPod::vanish)).
    pub fn power_loss(&mut self, i: u8) -> Result<()> {
        self.agents[usize::from(i) - 1] = None;
        self.cluster.reboot(i)?;
        // Cluster::reboot gives the node a hand-made pod and cni0; a node
        // of real parts has neither until the bridge plugin runs
        let host = self.node(i);
        host.ns.ip(&["link", "del", "veth1"])?;
        host.ns.ip(&["link", "del", "cni0"])?;
        host.ns.ip(&["route", "add", "default", "via", &INTERNET_IP.to_string()])?;
        self.cluster.host_mut(i).mount_bpffs()
    }

    /// Packets the edgevx nodes' TC decap handed to the host stack so far.
    fn rx_stack_packets(&self) -> u64 {
        self.agents
            .iter()
            .flatten()
            .filter_map(|a| a.status().ok())
            .filter_map(|s| s["counters"]["rx_stack_packets"].as_u64())
            .sum()
    }

    /// Node `i`'s edgevx counter `name`, from its status (0 on a kernel
    /// flannel node).
    pub fn counter(&self, i: u8, name: &str) -> Result<u64> {
        let Some(agent) = self.agents.get(usize::from(i) - 1).and_then(Option::as_ref) else { return Ok(0) };
        Ok(agent.status()?["counters"][name].as_u64().unwrap_or(0))
    }

    pub fn node(&self, i: u8) -> &Host {
        self.cluster.host(i)
    }

    /// Node `i`'s `k`-th pod.
    pub fn pod(&self, i: u8, k: usize) -> &CniPod {
        &self.pods[usize::from(i) - 1][k]
    }

    pub fn subnet_env(&self, i: u8) -> Result<SubnetEnv> {
        SubnetEnv::read(&self.node(i).subnet_file())
    }

    /// The address on node `i`'s `flannel.1` (`10.244.<i>.0`).
    pub fn vtep_ip(&self, i: u8) -> Result<Ipv4Addr> {
        Ok(self.subnet_env(i)?.subnet.network().addr)
    }

    /// The source address a pod on another node sees for `pod` of node `i`.
    /// With FLANNEL_IPMASQ=true it is the pod's own. Otherwise the flannel
    /// CNI plugin asked `bridge` for `ipMasq`, whose chain masquerades all
    /// but the node's own pod subnet: a remote pod sees the node's
    /// `flannel.1` address, as on a flannel node run without `--ip-masq`.
    pub fn source_seen_by_remote_pods(&self, i: u8, pod: &CniPod) -> Result<Ipv4Addr> {
        if self.subnet_env(i)?.ip_masq { Ok(pod.ip) } else { self.vtep_ip(i) }
    }

    /// kube-proxy with `services` on every node, as its DaemonSet runs it.
    pub fn kube_proxy(&self, mode: Mode, services: &[Service]) -> Result<()> {
        for h in &self.cluster.hosts {
            KubeProxy::install(&h.ns, mode, services)?;
        }
        Ok(())
    }

    /// `iptables -P FORWARD DROP` on every node (Docker's default since 1.13).
    pub fn forward_policy_drop(&self) -> Result<()> {
        for h in &self.cluster.hosts {
            h.ns.run(&["iptables", "-P", "FORWARD", "DROP"])?;
        }
        Ok(())
    }

    /// Runs a test body; if it fails, prints what every node held. Where
    /// edgevx nodes run in the default mode, the body's cross-node traffic
    /// must have taken their TC decap into the host stack: a pass that only
    /// the kernel's VXLAN receive earned would not test edgevx's path.
    pub fn check(&self, body: impl FnOnce(&Self) -> Result<()>) -> Result<()> {
        let default_mode =
            self.kinds.iter().any(|k| matches!(k, NodeKind::Edgevx(f) if !f.contains(&"--bypass-netfilter")));
        let before = self.rx_stack_packets();
        let mut r = body(self);
        if r.is_ok() && default_mode && self.rx_stack_packets() <= before {
            r = Err(anyhow!("no packet took edgevx's TC decap into the host stack during the test"));
        }
        if r.is_err() {
            eprintln!("{}", self.report());
        }
        r
    }

    /// Each node's kind, subnet.env, rules, routes and agent log.
    pub fn report(&self) -> String {
        let mut out = String::new();
        for (idx, h) in self.cluster.hosts.iter().enumerate() {
            let _ = writeln!(out, "==== node{} ({:?})", h.i, self.kinds.get(idx));
            let _ = writeln!(out, "{}", fs::read_to_string(h.subnet_file()).unwrap_or_else(|e| e.to_string()));
            for args in [&["iptables-save"][..], &["nft", "list", "ruleset"], &["ip", "route"], &["ip", "-br", "addr"]]
            {
                let text = h.ns.run(args).unwrap_or_else(|e| e.to_string());
                let _ = writeln!(out, "--- {}\n{text}", args.join(" "));
            }
            if let Some(Some(agent)) = self.agents.get(idx) {
                let log = agent.log_text();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let _ = writeln!(out, "--- agent log (last lines)");
                for l in tail.iter().rev() {
                    let _ = writeln!(out, "{l}");
                }
            }
        }
        out
    }
}

/// What flanneld sets up on node `i` of `n`: `flannel.1`, every other node
/// as a peer, subnet.env with FLANNEL_IPMASQ=true, and its iptables rules.
fn kernel_flannel_node(host: &Host, n: u8) -> Result<()> {
    let i = host.i;
    host.kernel_vtep(&vtep_mac(i))?;
    for peer in (1..=n).filter(|&p| p != i) {
        host.kernel_add_peer(peer, &vtep_mac(peer))?;
    }
    let env = SubnetEnv {
        network: NETWORK.parse()?,
        subnet: Cidr { addr: Ipv4Addr::new(10, 244, i, 1), len: 24 },
        mtu: POD_MTU.parse()?,
        ip_masq: true,
    };
    fs::write(host.subnet_file(), env.render())?;
    kube_proxy::feed(&host.ns, &["iptables-restore", "--noflush"], &flannel_iptables_rules(&subnet(i)))
}

fn wait_for_file(path: &Path, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + crate::patience(timeout);
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear within {timeout:?}", path.display());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Where a cluster address answers: `ip:port`.
pub fn at(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip, port)
}

// ---- probes: endpoints on threads inside namespaces ----

/// How long a server waits for its client, and a client for its answer.
/// These bound a hung test; no assertion depends on them.
const PATIENCE: Duration = Duration::from_secs(20);

fn join<T>(h: JoinHandle<Result<T>>) -> Result<T> {
    h.join().map_err(|_| anyhow!("probe thread panicked"))?
}

fn v4(addr: SocketAddr) -> Result<SocketAddrV4> {
    match addr {
        SocketAddr::V4(a) => Ok(a),
        SocketAddr::V6(a) => bail!("unexpected IPv6 peer {a}"),
    }
}

/// A server bound in a namespace, serving on its thread until done or stopped.
struct Server<T> {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Result<T>>,
}

impl<T: Send + 'static> Server<T> {
    /// Returns once `bind` succeeded inside `ns`; `serve` then runs there.
    fn start<S: 'static>(
        ns: &Netns,
        bind: impl FnOnce() -> io::Result<S> + Send + 'static,
        serve: impl FnOnce(S, &AtomicBool) -> Result<T> + Send + 'static,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, (tx, rx)) = (stop.clone(), mpsc::channel());
        let handle = spawn_in(ns, move || {
            let socket = bind().context("bind")?;
            let _ = tx.send(());
            serve(socket, &flag)
        });
        if rx.recv().is_err() {
            // the thread ended before binding: its result says why
            return Err(join(handle).err().unwrap_or_else(|| anyhow!("server ended before binding")));
        }
        Ok(Server { stop, handle })
    }

    fn finish(self) -> Result<T> {
        self.stop.store(true, Ordering::Relaxed);
        join(self.handle)
    }
}

/// What a TCP server got from its one client.
#[derive(Debug)]
pub struct Accepted {
    /// The client address as the server saw it (after any NAT).
    pub peer: SocketAddrV4,
    pub bytes: u64,
}

/// Accepts one connection on `0.0.0.0:port`, reads it to the end and
/// answers with `<bytes> <sha256>\n`.
pub struct TcpServer(Server<Option<Accepted>>);

impl TcpServer {
    pub fn start(ns: &Netns, port: u16) -> Result<Self> {
        let bind = move || {
            let l = TcpListener::bind(("0.0.0.0", port))?;
            l.set_nonblocking(true)?;
            Ok(l)
        };
        Ok(TcpServer(Server::start(ns, bind, |l: TcpListener, stop: &AtomicBool| {
            let deadline = Instant::now() + crate::patience(PATIENCE);
            let (mut s, peer) = loop {
                match l.accept() {
                    Ok(conn) => break conn,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
                            return Ok(None);
                        }
                        thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(crate::patience(PATIENCE)))?;
            let (bytes, digest) = digest_of(&mut s)?;
            s.write_all(format!("{bytes} {digest}\n").as_bytes())?;
            Ok(Some(Accepted { peer: v4(peer)?, bytes }))
        })?))
    }

    /// The connection it served, or None if no client ever connected.
    pub fn finish(self) -> Result<Option<Accepted>> {
        self.0.finish()
    }
}

fn digest_of(r: &mut impl Read) -> Result<(u64, String)> {
    let (mut h, mut n, mut buf) = (Sha256::new(), 0u64, vec![0u8; 1 << 16]);
    loop {
        let got = r.read(&mut buf)?;
        if got == 0 {
            return Ok((n, hex(&h.finalize())));
        }
        h.update(&buf[..got]);
        n += got as u64;
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// How a TCP connect ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Dialed {
    Connected,
    /// A RST or an ICMP unreachable came back (ECONNREFUSED).
    Refused,
    Failed(String),
}

/// One connect from inside `ns` to `to`; the connection is closed at once.
pub fn tcp_dial(ns: &Netns, to: SocketAddrV4) -> Result<Dialed> {
    join(spawn_in(ns, move || {
        Ok(match TcpStream::connect_timeout(&to.into(), Duration::from_secs(5)) {
            Ok(_) => Dialed::Connected,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Dialed::Refused,
            Err(e) => Dialed::Failed(e.to_string()),
        })
    }))
}

/// Sends `bytes` from inside `ns` to `to` and checks the server's digest of
/// them against our own.
pub fn tcp_send(ns: &Netns, to: SocketAddrV4, bytes: u64) -> Result<()> {
    join(spawn_in(ns, move || {
        let mut s = TcpStream::connect_timeout(&to.into(), Duration::from_secs(5))
            .with_context(|| format!("connect to {to}"))?;
        s.set_read_timeout(Some(crate::patience(PATIENCE)))?;
        let (mut h, mut left, mut buf, mut x) = (Sha256::new(), bytes, vec![0u8; 1 << 16], 0x2545_f491_u32);
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            for b in &mut buf[..n] {
                // a cheap generator, so the stream is not all zeros
                x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                *b = (x >> 24) as u8;
            }
            s.write_all(&buf[..n])?;
            h.update(&buf[..n]);
            left -= n as u64;
        }
        s.shutdown(std::net::Shutdown::Write)?;
        let mut answer = String::new();
        BufReader::new(&s).read_line(&mut answer).with_context(|| format!("no answer from {to}"))?;
        let want = format!("{bytes} {}", hex(&h.finalize()));
        anyhow::ensure!(answer.trim() == want, "server at {to} got {:?}, we sent {want:?}", answer.trim());
        Ok(())
    }))
}

/// One TCP exchange: a server on `port` in `server`, a client in `client`
/// dialling `dial` (the server itself, or a service in front of it). Both
/// sides' digests must match; returns the client address the server saw.
pub fn tcp_exchange(client: &Netns, dial: SocketAddrV4, server: &Netns, port: u16, bytes: u64) -> Result<SocketAddrV4> {
    let srv = TcpServer::start(server, port)?;
    let sent = tcp_send(client, dial, bytes);
    let got = srv.finish()?;
    sent?;
    let got = got.with_context(|| format!("nothing reached the server behind {dial}"))?;
    anyhow::ensure!(got.bytes == bytes, "server read {} bytes, want {bytes}", got.bytes);
    Ok(got.peer)
}

/// A DNS-style UDP exchange: what came back, and who the server saw.
#[derive(Debug)]
pub struct UdpOutcome {
    /// Queries whose exact answer came back from the address dialled.
    pub answered: u32,
    /// The source address of every query that reached the server.
    pub seen: Vec<SocketAddrV4>,
}

/// `queries` request/reply rounds: a client in `client` sends `query <n>`
/// to `dial` from one connected socket (so only answers from `dial` count,
/// as a resolver's would); a server on `port` in `server` answers
/// `answer <n>` to whoever asked.
pub fn udp_exchange(client: &Netns, dial: SocketAddrV4, server: &Netns, port: u16, queries: u32) -> Result<UdpOutcome> {
    let bind = move || {
        let s = UdpSocket::bind(("0.0.0.0", port))?;
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(s)
    };
    let srv = Server::start(server, bind, |s: UdpSocket, stop: &AtomicBool| {
        let (mut seen, mut buf, deadline) = (Vec::new(), [0u8; 512], Instant::now() + crate::patience(PATIENCE));
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            match s.recv_from(&mut buf) {
                Ok((n, from)) => {
                    let answer = String::from_utf8_lossy(&buf[..n]).replacen("query", "answer", 1);
                    s.send_to(answer.as_bytes(), from)?;
                    seen.push(v4(from)?);
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(seen)
    })?;
    let answered = join(spawn_in(client, move || {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.connect(dial)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let (mut answered, mut buf) = (0, [0u8; 512]);
        for q in 0..queries {
            s.send(format!("query {q}").as_bytes())?;
            // a lost answer (timeout, or an ICMP error as ECONNREFUSED) just does not count
            if let Ok(n) = s.recv(&mut buf) {
                answered += u32::from(buf[..n] == *format!("answer {q}").as_bytes());
            }
        }
        Ok(answered)
    }));
    let seen = srv.finish()?;
    Ok(UdpOutcome { answered: answered?, seen })
}
