//! An operator's own firewall rules for VXLAN, written the ordinary way:
//! `iptables -I INPUT 1 -p udp --dport 8472 -j ACCEPT` (and its ip6tables
//! twin) ahead of everything, and an nftables table of their own that
//! accepts the port at a priority before iptables' filter table.
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::{kube_proxy::feed, netns::Netns, patience};

/// The resync that re-asserts the firewall order runs every 10 s.
const RESYNC: Duration = Duration::from_secs(10);

/// Puts the operator's accept rules in front, for `iptables` or `ip6tables`.
pub fn accept_vxlan_first(node: &Netns, iptables: &str) -> Result<()> {
    node.run(&[iptables, "-I", "INPUT", "1", "-p", "udp", "--dport", "8472", "-j", "ACCEPT"])?;
    let family = if iptables == "ip6tables" { "ip6" } else { "ip" };
    let table = format!(
        "table {family} operator-{family} {{\n  chain input {{\n    type filter hook input priority filter - 10;\n    \
         udp dport 8472 accept\n  }}\n}}\n"
    );
    feed(node, &["nft", "-f", "-"], &table)
}

/// Waits until the jump to EDGEVX-INPUT is the first rule of INPUT again
/// (one resync, and a little), failing with the chain as it stands.
pub fn wait_jump_first(node: &Netns, iptables: &str) -> Result<()> {
    let deadline = Instant::now() + patience(RESYNC + Duration::from_secs(5));
    loop {
        let input = node.run(&[iptables, "-S", "INPUT"])?;
        let first = input.lines().find(|l| l.starts_with("-A INPUT "));
        if first.is_some_and(|l| l.ends_with("-j EDGEVX-INPUT")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{iptables}: the jump to EDGEVX-INPUT is not first in INPUT after a resync:\n{input}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
