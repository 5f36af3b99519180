//! Applying a [`RuleSet`] through the host's `iptables`, idempotently: a
//! chain whose rules already read as planned is left alone, so a restart
//! changes nothing and drops nothing. What is there is read once per table.
use std::{collections::BTreeMap, process::Command};

use anyhow::{Context, Result, anyhow};
use tracing::{info, warn};

use super::plan::{ALL, Chain, RuleSet, jump_rule};
use crate::family::Family;

/// The host's iptables, through the `iptables` crate.
pub struct Firewall {
    ipt: iptables::IPTables,
}

fn err(what: String) -> impl FnOnce(Box<dyn std::error::Error>) -> anyhow::Error {
    move |e| anyhow!("{what}: {e}")
}

impl Firewall {
    /// The firewall of family `N` (`iptables` or `ip6tables`); fails,
    /// naming the binary, where it cannot be run.
    pub fn new<N: Family>() -> Result<Self> {
        let binary = N::IPTABLES;
        let mut ipt = iptables::new(N::V6).map_err(err(format!("cannot run {binary} (is it installed?)")))?;
        // never reverse-resolve addresses: without DNS (an edge node cut off
        // from the cloud) a plain `iptables -L` blocks for seconds or forever
        ipt.set_numeric(true);
        Ok(Firewall { ipt })
    }

    /// Makes the host's chains what `set` says; removes chains of ours it
    /// does not name. Returns whether anything changed. Each table is read
    /// once (`iptables -t TABLE -S`) and only what differs is written, so a
    /// pass that finds everything in place runs one `iptables` per table.
    pub fn apply(&self, set: &RuleSet) -> Result<bool> {
        let mut changed = false;
        for table in tables() {
            let now = self.snapshot(table)?;
            for chain in set.chains.iter().filter(|c| c.table == table) {
                changed |= self.ensure(chain, &now)?;
            }
            for (_, parent, name) in ALL.iter().filter(|(t, _, _)| *t == table) {
                if !set.chains.iter().any(|c| c.name == *name) {
                    changed |= self.remove(table, parent, name, &now)?;
                }
            }
        }
        Ok(changed)
    }

    /// Removes every chain edgevx owns (for `edgevx cleanup`): what
    /// [`apply`](Self::apply) does with a set that names none.
    pub fn remove_all(&self) -> Result<bool> {
        self.apply(&RuleSet { chains: Vec::new() })
    }

    /// Every chain of `table` and its rules, as `iptables -t TABLE -S`
    /// prints them (`-P`/`-N` name a chain, `-A CHAIN spec` a rule).
    /// (Not the crate's `list`: numeric mode adds `-n`, which `-S` refuses.)
    fn snapshot(&self, table: &str) -> Result<Listing> {
        let out = self.ipt.execute(table, "-S").map_err(err(format!("cannot list the {table} table")))?;
        if !out.status.success() {
            return Err(anyhow!("cannot list the {table} table: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Listing::parse(&String::from_utf8_lossy(&out.stdout)))
    }

    fn ensure(&self, c: &Chain, now: &Listing) -> Result<bool> {
        let mut changed = false;
        let what = || format!("{}/{}", c.table, c.name);
        if now.rules(c.name).is_none() {
            self.ipt.new_chain(c.table, c.name).map_err(err(format!("cannot create {}", what())))?;
            changed = true;
        }
        if now.rules(c.name).unwrap_or_default() != c.rules {
            // a brief flush, only when the plan changed (or on first start)
            self.ipt.flush_chain(c.table, c.name).map_err(err(format!("cannot flush {}", what())))?;
            for r in &c.rules {
                self.ipt.append(c.table, c.name, r).map_err(err(format!("cannot add `{r}` to {}", what())))?;
            }
            info!(chain = c.name, table = c.table, rules = c.rules.len(), "firewall chain written");
            changed = true;
        }
        let jump = c.jump();
        let parent = now.rules(c.parent).unwrap_or_default();
        if !parent.contains(&jump) {
            let added = if c.jump_first {
                self.ipt.insert(c.table, c.parent, &jump, 1)
            } else {
                self.ipt.append(c.table, c.parent, &jump)
            };
            added.map_err(err(format!("cannot hook {} into {}/{}", c.name, c.table, c.parent)))?;
            changed = true;
        } else if c.jump_first && parent.first() != Some(&jump) {
            // an operator's `iptables -I INPUT 1 … -j ACCEPT` went ahead of
            // us: what it accepts would never reach our drops. The order is
            // state like the rules: put the jump back in front.
            self.ipt.delete_all(c.table, c.parent, &jump).map_err(err(format!("cannot unhook {}", c.name)))?;
            self.ipt
                .insert(c.table, c.parent, &jump, 1)
                .map_err(err(format!("cannot hook {} into {}/{}", c.name, c.table, c.parent)))?;
            warn!(
                chain = c.name,
                table = c.table,
                parent = c.parent,
                "a rule had been put ahead of our jump; moved the jump back to the front"
            );
            changed = true;
        }
        Ok(changed)
    }

    fn remove(&self, table: &str, parent: &str, name: &str, now: &Listing) -> Result<bool> {
        if now.rules(name).is_none() {
            return Ok(false);
        }
        let jump = jump_rule(name);
        let hooks = now.rules(parent).unwrap_or_default().iter().filter(|r| **r == jump).count();
        for _ in 0..hooks {
            self.ipt.delete(table, parent, &jump).map_err(err(format!("cannot unhook {name} from {parent}")))?;
        }
        self.ipt.flush_chain(table, name).map_err(err(format!("cannot flush {table}/{name}")))?;
        self.ipt.delete_chain(table, name).map_err(err(format!("cannot delete {table}/{name}")))?;
        info!(chain = name, table, "firewall chain removed");
        Ok(true)
    }
}

/// The tables edgevx's chains are in, each once.
fn tables() -> Vec<&'static str> {
    let mut t: Vec<&str> = ALL.iter().map(|(table, _, _)| *table).collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// One table as `iptables -S` prints it: each chain's rules, in order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Listing(BTreeMap<String, Vec<String>>);

impl Listing {
    fn parse(text: &str) -> Self {
        let mut t = Listing::default();
        for line in text.lines() {
            let mut words = line.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("-P" | "-N"), Some(chain), _) => {
                    t.0.entry(chain.to_string()).or_default();
                }
                (Some("-A"), Some(chain), Some(rule)) => {
                    t.0.entry(chain.to_string()).or_default().push(rule.to_string())
                }
                _ => {}
            }
        }
        t
    }

    /// The rules of `chain`, or `None` when the table has no such chain.
    fn rules(&self, chain: &str) -> Option<&[String]> {
        self.0.get(chain).map(Vec::as_slice)
    }
}

/// Where kube-proxy's packet-level rules are on this host, if anywhere:
/// its iptables chains or its nftables table.
pub fn kube_proxy_present() -> Option<&'static str> {
    if let Ok(mut ipt) = iptables::new(false) {
        ipt.set_numeric(true);
        if ipt.chain_exists("nat", "KUBE-SERVICES").unwrap_or(false) {
            return Some("iptables chain nat/KUBE-SERVICES");
        }
    }
    let nft = Command::new("nft").args(["list", "table", "ip", "kube-proxy"]).output();
    if nft.is_ok_and(|o| o.status.success()) {
        return Some("nftables table ip kube-proxy");
    }
    None
}

/// For callers that want the error text of a missing binary up front.
pub fn check_binary() -> Result<()> {
    version().map(|_| ())
}

/// `iptables --version`, e.g. `iptables v1.8.9 (nf_tables)`.
fn version() -> Result<String> {
    let out = Command::new("iptables").arg("--version").output().context("cannot run `iptables --version`")?;
    if !out.status.success() {
        return Err(anyhow!("`iptables --version` failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// With `EnableNFTables` (flanneld then writes its rules with nftables),
/// the `iptables` binary edgevx writes through must be iptables-nft, so the
/// rules land in nftables as flanneld's would; iptables-legacy is refused,
/// naming the setting and what to do.
pub fn check_backend(nftables: bool) -> Result<()> {
    if !nftables {
        return Ok(());
    }
    // whether iptables runs at all is check_binary's business (at start),
    // and a passing failure to run it must not refuse a config
    let Ok(version) = version() else { return Ok(()) };
    if writes_nftables(&version) {
        return Ok(());
    }
    Err(anyhow!(
        "EnableNFTables is true, but this host's iptables is not iptables-nft ({version}): edgevx writes its rules \
         through the `iptables` binary, so they would not be in nftables. Make `iptables` the nft variant \
         (update-alternatives --set iptables /usr/sbin/iptables-nft) or set EnableNFTables to false"
    ))
}

fn writes_nftables(version: &str) -> bool {
    version.contains("(nf_tables)")
}

#[cfg(test)]
mod backend_tests {
    use super::{Listing, writes_nftables};

    #[test]
    fn a_table_reads_its_chains_and_their_rules_in_order() {
        let t = Listing::parse(
            "-P INPUT ACCEPT\n-P FORWARD DROP\n-N EDGEVX-INPUT\n-N EMPTY\n\
             -A INPUT -m comment --comment \"edgevx edgevx-input\" -j EDGEVX-INPUT\n\
             -A INPUT -j ACCEPT\n-A EDGEVX-INPUT -p udp -m udp --dport 8472 -m addrtype --dst-type BROADCAST -j DROP\n",
        );
        assert_eq!(
            t.rules("INPUT").unwrap(),
            ["-m comment --comment \"edgevx edgevx-input\" -j EDGEVX-INPUT", "-j ACCEPT"]
        );
        assert_eq!(t.rules("EDGEVX-INPUT").unwrap().len(), 1);
        assert_eq!(t.rules("EMPTY"), Some(&[][..]), "a chain with no rules exists");
        assert_eq!(t.rules("FORWARD"), Some(&[][..]));
        assert_eq!(t.rules("EDGEVX-FWD"), None, "no such chain");
    }

    #[test]
    fn the_version_line_names_the_backend() {
        assert!(writes_nftables("iptables v1.8.9 (nf_tables)"));
        assert!(!writes_nftables("iptables v1.8.9 (legacy)"));
        assert!(!writes_nftables("iptables v1.4.21"));
    }
}
