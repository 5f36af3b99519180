//! Command line. Every flag can also come from an `EDGEVX_<FLAG>` variable
//! (for a DaemonSet); `NODE_NAME` is read too, as the flannel manifest sets it.
//! flanneld's names are aliases where the meaning is the same, and its
//! `FLANNELD_<FLAG>` variables are read too (see `cli_flanneld`).
use std::{net::Ipv4Addr, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::annotations::DEFAULT_PREFIX;

#[derive(Parser)]
#[command(name = "edgevx", version = crate::VERSION_LINE, about = "eBPF VXLAN dataplane compatible with flannel's vxlan backend")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written: text for people, or json (one object per line:
    /// timestamp, level, fields, target) for a log shipper.
    #[arg(long, global = true, env = "EDGEVX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the agent in the foreground until SIGTERM or SIGINT.
    Run(Box<RunArgs>),
    /// Show the dataplane: works while the agent runs and after it stopped.
    Status(StatusArgs),
    /// Show the packets the dataplane drops, one line each, with why and where
    /// (the programs write them only while a monitor watches).
    Monitor(MonitorArgs),
    /// Write one .tar.gz with what a bug report needs: status, the pinned maps,
    /// firewall rules, links, routes, tc filters, kernel features (no secrets).
    Bugtool(BugtoolArgs),
    /// Remove everything edgevx created (links, programs, maps, device, subnet file,
    /// firewall chains); with --keep-vtep, hand the node back to flanneld instead.
    Cleanup(CleanupArgs),
}

#[derive(Args, Clone, Debug)]
pub struct Paths {
    /// Directory for state that must survive reboots (the VTEP MAC).
    #[arg(long, env = "EDGEVX_STATE_DIR", default_value = "/var/lib/edgevx")]
    pub state_dir: PathBuf,
    /// Directory for pins, on a bpffs the host has mounted (edgevx never mounts one).
    #[arg(long, env = "EDGEVX_BPFFS", default_value = "/sys/fs/bpf/edgevx")]
    pub bpffs: PathBuf,
}

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// This node's name in the node list.
    #[arg(long, env = "EDGEVX_NODE_NAME")]
    pub node_name: Option<String>,
    /// Underlay interface, a name or an IPv4 address; repeat it to try each in order
    /// (flanneld's --iface). Default: the interface owning the public IP, else the default route's.
    #[arg(long, env = "EDGEVX_IFACE")]
    pub iface: Vec<String>,
    /// Underlay interface by regular expression over addresses, then names; repeatable,
    /// tried after every --iface (flanneld's --iface-regex).
    #[arg(long, env = "EDGEVX_IFACE_REGEX")]
    pub iface_regex: Vec<String>,
    /// Underlay interface: the one `ip route get ADDR` leaves by, tried after
    /// --iface and --iface-regex (flanneld's --iface-can-reach).
    #[arg(long, env = "EDGEVX_IFACE_CAN_REACH")]
    pub iface_can_reach: Option<Ipv4Addr>,
    /// Source: a Kubernetes NodeList file (JSON or YAML) naming this node and its peers.
    #[arg(long, env = "EDGEVX_NODES_FILE")]
    pub nodes_file: Option<PathBuf>,
    /// Source: the Kubernetes API (default when KUBERNETES_SERVICE_HOST is set).
    #[arg(long, env = "EDGEVX_KUBE", default_value_t = false, visible_alias = "kube-subnet-mgr")]
    pub kube: bool,
    /// kubeconfig for --kube, and in etcd mode for publishing this Node's annotations
    /// (default: the in-cluster service account).
    #[arg(long, env = "EDGEVX_KUBECONFIG", visible_alias = "kubeconfig-file")]
    pub kubeconfig: Option<PathBuf>,
    /// User agent sent to the API. YurtHub caches only listed agents: see the book, "Edge nodes behind OpenYurt's YurtHub".
    #[arg(long, env = "EDGEVX_USER_AGENT", default_value = concat!("edgevx/", env!("CARGO_PKG_VERSION")))]
    pub user_agent: String,
    /// Source: etcd v3 endpoints, comma-separated (flannel's etcd layout).
    #[arg(long, env = "EDGEVX_ETCD_ENDPOINTS")]
    pub etcd_endpoints: Option<String>,
    /// etcd key prefix of flannel's layout: `<prefix>/config` and `<prefix>/subnets/` (flanneld's --etcd-prefix).
    #[arg(long, env = "EDGEVX_ETCD_PREFIX", default_value = "/coreos.com/network")]
    pub etcd_prefix: String,
    /// CA certificate (PEM) that etcd's server certificate is checked against (flanneld's --etcd-cafile).
    #[arg(long, env = "EDGEVX_ETCD_CAFILE")]
    pub etcd_cafile: Option<PathBuf>,
    /// Client certificate (PEM) for etcd, with --etcd-keyfile (flanneld's --etcd-certfile).
    #[arg(long, env = "EDGEVX_ETCD_CERTFILE")]
    pub etcd_certfile: Option<PathBuf>,
    /// Private key (PEM) of --etcd-certfile.
    #[arg(long, env = "EDGEVX_ETCD_KEYFILE")]
    pub etcd_keyfile: Option<PathBuf>,
    /// etcd user (authentication with --etcd-password), as flanneld's.
    #[arg(long, env = "EDGEVX_ETCD_USERNAME", requires = "etcd_password")]
    pub etcd_username: Option<String>,
    /// etcd password, with --etcd-username (its value is never shown in --help or logs).
    #[arg(long, env = "EDGEVX_ETCD_PASSWORD", requires = "etcd_username", hide_env_values = true)]
    pub etcd_password: Option<String>,
    /// TTL of our etcd subnet lease, in seconds (flannel: 24 h).
    #[arg(long, env = "EDGEVX_SUBNET_LEASE_TTL", default_value_t = 86400)]
    pub subnet_lease_ttl: u64,
    /// Renew the etcd lease this many seconds before it expires (flannel: 60 min).
    #[arg(long, env = "EDGEVX_SUBNET_LEASE_RENEW_MARGIN_SECS", default_value_t = 3600)]
    pub subnet_lease_renew_margin_secs: u64,
    /// flannel net-conf.json (Network, Backend.VNI, Backend.Port, Backend.MTU); in etcd mode it comes from <prefix>/config.
    #[arg(long, env = "EDGEVX_NET_CONF", visible_alias = "net-config-path")]
    pub net_conf: Option<PathBuf>,
    #[command(flatten)]
    pub paths: Paths,
    /// Where to write flannel's subnet.env for the CNI plugin.
    #[arg(long, env = "EDGEVX_SUBNET_FILE", default_value = "/run/flannel/subnet.env")]
    pub subnet_file: PathBuf,
    /// VTEP source address; the Node's node-public-ip annotation beats it, as in flannel
    /// (default: the underlay interface's IPv4).
    #[arg(long, env = "EDGEVX_PUBLIC_IP")]
    pub public_ip: Option<Ipv4Addr>,
    /// The IPv6 VTEP's source address when the network is dual-stack
    /// (`EnableIPv6`); the Node's node-public-ipv6 annotation beats it
    /// (default: the underlay interface's global IPv6 address).
    #[arg(long, env = "EDGEVX_PUBLIC_IPV6")]
    pub public_ipv6: Option<std::net::Ipv6Addr>,
    /// Prefix of flannel's node annotations.
    #[arg(long, env = "EDGEVX_KUBE_ANNOTATION_PREFIX", default_value = DEFAULT_PREFIX)]
    pub kube_annotation_prefix: String,
    /// Opt-in: deliver decapsulated traffic for local pods straight into the
    /// pod, past the host's routing, conntrack and netfilter. Safe only where
    /// pod traffic has no packet-level NAT and no netfilter policy (e.g. a
    /// socket-level kube-proxy replacement, or a gateway node with no Services).
    #[arg(long, env = "EDGEVX_BYPASS_NETFILTER", default_value_t = false)]
    pub bypass_netfilter: bool,
    /// The conntrack-verified fast path: packets of established, plain
    /// (non-NATed) TCP and UDP flows from a peer's pod to a local pod skip
    /// the host stack once the kernel's conntrack entry says they may
    /// (`auto`: where the kernel has the conntrack kfuncs within reach,
    /// else every packet through the host stack, with the reason in
    /// `edgevx status`; `off`: always through the host stack).
    #[arg(long, env = "EDGEVX_FAST_PATH", value_enum, default_value = "auto")]
    pub fast_path: crate::dataplane::fast_path::Mode,
    /// Test only: the fast path skips its liberal-tracking check (and so
    /// never asks for it): the negative control of the kube-proxy
    /// INVALID-drop test, which must then see drops.
    #[arg(long, default_value_t = false, hide = true)]
    pub fast_path_test_ignore_liberal: bool,
    /// The XDP judge on the underlay, in native (driver) mode only: drops a
    /// stranger's VXLAN, bad VXLAN flags and truncated headers before the
    /// kernel builds an skb (TC still judges everything). `auto`: on drivers
    /// with native XDP except veth, where XDP takes GSO off the peer.
    #[arg(long, env = "EDGEVX_XDP_JUDGE", value_enum, default_value_t = crate::dataplane::xdp::XdpChoice::Auto)]
    pub xdp_judge: crate::dataplane::xdp::XdpChoice,
    /// Accepted for older command lines: host routing is now the default.
    #[arg(long, env = "EDGEVX_HOST_ROUTING", default_value_t = false, hide = true)]
    pub host_routing: bool,
    /// Masquerade pod traffic that leaves the Network, as flanneld --ip-masq
    /// (and write FLANNEL_IPMASQ=true, so the CNI plugin does not).
    #[arg(long, env = "EDGEVX_IP_MASQ", default_value_t = false)]
    pub ip_masq: bool,
    /// Accept the Network in both directions in FORWARD, as flanneld's
    /// --iptables-forward-rules (default true; `--iptables-forward-rules=false`).
    #[arg(long, env = "EDGEVX_IPTABLES_FORWARD_RULES", default_value_t = true, action = clap::ArgAction::Set,
        num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub iptables_forward_rules: bool,
    /// Clear the Node's NetworkUnavailable condition once the VTEP is up, as flanneld's
    /// --set-node-network-unavailable (Kubernetes source only; never in etcd mode).
    #[arg(long, env = "EDGEVX_SET_NODE_NETWORK_UNAVAILABLE", default_value_t = true, action = clap::ArgAction::Set,
        num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub set_node_network_unavailable: bool,
    /// The bridge local pods hang off (the flannel CNI plugin's `cni0`).
    #[arg(long, env = "EDGEVX_POD_BRIDGE", default_value = "cni0")]
    pub pod_bridge: String,
    /// How to attach the programs: `tcx` (kernel 6.6+), `clsact` (a clsact
    /// qdisc with direct-action filters, for older kernels), or `auto`.
    #[arg(long, env = "EDGEVX_TC_ATTACH", default_value = "auto", value_parser = ["auto", "tcx", "clsact"])]
    pub tc_attach: String,
    /// Encapsulate as on kernels before 5.13 (automatic there): without the
    /// ENCAP_L2_ETH flag they refuse. For tests of that path on a newer kernel.
    #[arg(long, env = "EDGEVX_LEGACY_ENCAP", default_value_t = false, hide = true)]
    pub legacy_encap: bool,
    /// Deprecated, no effect: VXLAN from a peer whose inner IPv4 source is
    /// outside that peer's pod CIDR is always dropped. An external VTEP that
    /// forwards client traffic without SNAT is exempted with --any-inner-source.
    #[arg(long, env = "EDGEVX_STRICT_INNER_SOURCE", default_value_t = false, hide = true)]
    pub strict_inner_source: bool,
    /// Peers that may send VXLAN with any inner source, not only their pod CIDR's: an
    /// external VTEP that forwards client traffic without SNAT (an F5 BIG-IP). A node
    /// name (in etcd mode, the lease key) or a pod CIDR exactly as the peer has it;
    /// repeatable or comma-separated. Only this flag exempts: a node's own annotation
    /// edgevx.io/any-inner-source or lease field EdgevxAnyInnerSource is ignored.
    #[arg(long, env = "EDGEVX_ANY_INNER_SOURCE", value_name = "NODE|CIDR", value_delimiter = ',')]
    pub any_inner_source: Vec<crate::exempt::Exempt>,
    /// Address to serve /healthz, /readyz and /metrics (Prometheus) on. [::]:PORT is every
    /// address of both families (IPv6 and IPv4, whatever net.ipv6.bindv6only says; IPv4
    /// only on a kernel without IPv6), 0.0.0.0:PORT every IPv4 address.
    #[arg(long, env = "EDGEVX_METRICS_ADDR", default_value = "127.0.0.1:9117")]
    pub metrics_addr: std::net::SocketAddr,
    /// flanneld's (klog's) `-v=N`, as a log level: 0 and 1 info, 2 to 4
    /// debug, 5 and up trace. EDGEVX_LOG, when set, wins.
    #[arg(long = "v", value_name = "N", hide = true)]
    pub verbosity: Option<u8>,
}

impl RunArgs {
    /// The log filter `-v=N` asks for, if any.
    pub fn log_filter(&self) -> Option<&'static str> {
        self.verbosity.map(|v| match v {
            0 | 1 => "info",
            2..=4 => "debug",
            _ => "trace",
        })
    }
}

#[derive(Args, Clone, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub paths: Paths,
    /// Print JSON instead of a table.
    #[arg(long, env = "EDGEVX_JSON")]
    pub json: bool,
    /// Print the node's state as Prometheus metrics, for a node exporter's
    /// textfile collector.
    #[arg(long, conflicts_with = "json")]
    pub prometheus: bool,
}

/// What `edgevx monitor` shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MonitorType {
    /// Packets a program dropped.
    #[default]
    Drop,
}

#[derive(Args, Clone, Debug)]
pub struct MonitorArgs {
    #[command(flatten)]
    pub paths: Paths,
    /// Print one JSON object per event instead of a line of text.
    #[arg(long, env = "EDGEVX_JSON")]
    pub json: bool,
    /// Which events (drops are the only kind so far).
    #[arg(long = "type", value_enum, default_value_t = MonitorType::Drop)]
    pub r#type: MonitorType,
}

#[derive(Args, Clone, Debug)]
pub struct BugtoolArgs {
    #[command(flatten)]
    pub paths: Paths,
    /// Where to write the archive (default: edgevx-bugtool-<host>-<time>.tar.gz
    /// in the current directory).
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// The agent's log file; its last --log-lines lines go in. Without it, the
    /// journal of the edgevx unit when journalctl is there.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// How many of the log's last lines to include.
    #[arg(long, default_value_t = 2000)]
    pub log_lines: usize,
}

#[derive(Args, Clone, Debug)]
pub struct CleanupArgs {
    #[command(flatten)]
    pub paths: Paths,
    /// Also delete the saved VTEP MAC (peers will need the new one after the next start).
    #[arg(long, env = "EDGEVX_PURGE_MAC")]
    pub purge_mac: bool,
    /// Roll back to flanneld: keep flannel.<VNI> (its MAC, address and routes) and
    /// subnet.env, and give the kernel flanneld's arp and fdb entries for every peer
    /// before the programs go, so the node keeps forwarding. flanneld adopts the device.
    #[arg(long, env = "EDGEVX_KEEP_VTEP")]
    pub keep_vtep: bool,
}
