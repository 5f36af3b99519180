//! Applying a [`RuleSet`] through the host's `iptables`, idempotently: a
//! chain whose rules already read as planned is left alone, so a restart
//! changes nothing and drops nothing. Each table is read once per pass
//! (`iptables -S`) and what differs is written in one atomic batch
//! (`iptables-restore --noflush`, [`super::restore`]).
use std::{
    collections::BTreeMap,
    io::Write as _,
    process::{Command, Stdio},
    sync::Mutex,
};

use anyhow::{Context, Result, anyhow};
use tracing::{info, warn};

use super::{
    restore::{Listing, Printed, batch},
    rules::{ALL, RuleSet},
};
use crate::family::Family;

/// The host's iptables of one family.
pub struct Firewall {
    ipt: iptables::IPTables,
    /// `iptables-restore` or `ip6tables-restore`: the same alternative
    /// (nft or legacy) as the `iptables` beside it.
    restore: String,
    /// How each chain read right after this process last wrote it, by
    /// (table, chain): this iptables' own print of the plan.
    printed: Mutex<BTreeMap<(String, String), Printed>>,
}

fn err(what: String) -> impl FnOnce(Box<dyn std::error::Error>) -> anyhow::Error {
    move |e| anyhow!("{what}: {e}")
}

impl Firewall {
    /// The firewall of family `N` (`iptables` or `ip6tables`); fails,
    /// naming the binary, where it cannot be run.
    pub fn new<N: Family>() -> Result<Self> {
        let binary = N::IPTABLES;
        let mut ipt = iptables::new(N::IPV6).map_err(err(format!("cannot run {binary} (is it installed?)")))?;
        // never reverse-resolve addresses: without DNS (an edge node cut off
        // from the cloud) a plain `iptables -L` blocks for seconds or forever
        ipt.set_numeric(true);
        Ok(Firewall { ipt, restore: format!("{binary}-restore"), printed: Mutex::new(BTreeMap::new()) })
    }

    /// Makes the host's chains what `set` says; removes chains of ours it
    /// does not name. Returns whether anything changed. A pass that finds
    /// everything in place runs one `iptables -S` per table; one that does
    /// not, one `iptables-restore` per table that differs, and one more
    /// `-S` to learn how this iptables prints what was written.
    pub fn apply(&self, set: &RuleSet) -> Result<bool> {
        let mut changed = false;
        for table in tables() {
            let now = self.snapshot(table)?;
            let learned = |chain: &str| {
                let printed = self.printed.lock().unwrap_or_else(|p| p.into_inner());
                printed.get(&(table.to_string(), chain.to_string())).cloned()
            };
            let Some(b) = batch(table, &now, set.chains.iter(), learned) else { continue };
            self.run_restore(&b.text).with_context(|| format!("cannot write the {table} table's edgevx chains"))?;
            let after = self.snapshot(table)?;
            let mut printed = self.printed.lock().unwrap_or_else(|p| p.into_inner());
            for c in set.chains.iter().filter(|c| c.table == table) {
                let listed = after.rules(c.name).unwrap_or_default().to_vec();
                printed.insert(
                    (table.to_string(), c.name.to_string()),
                    Printed { planned: c.rules.clone(), printed: listed },
                );
            }
            for name in &b.written {
                let rules = set.chains.iter().find(|c| c.name == *name).map_or(0, |c| c.rules.len());
                info!(chain = name, table, rules, "firewall chain written");
            }
            for name in &b.moved {
                // an operator's `iptables -I INPUT 1 … -j ACCEPT` went ahead of
                // us: what it accepts would never reach our drops. The order
                // is state like the rules: the jump is back in front.
                warn!(chain = name, table, "a rule had been put ahead of our jump; moved the jump back to the front");
            }
            for name in &b.removed {
                printed.remove(&(table.to_string(), name.to_string()));
                info!(chain = name, table, "firewall chain removed");
            }
            changed = true;
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

    /// `iptables-restore --noflush --wait` with `text` on its standard input:
    /// it takes the host's xtables lock as kube-proxy does, and commits the
    /// table's batch whole or not at all.
    fn run_restore(&self, text: &str) -> Result<()> {
        let mut child = Command::new(&self.restore)
            .args(["--noflush", "--wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot run {} (is it installed beside iptables?)", self.restore))?;
        let mut stdin = child.stdin.take().context("no stdin for iptables-restore")?;
        stdin.write_all(text.as_bytes()).with_context(|| format!("cannot write to {}", self.restore))?;
        drop(stdin);
        let out = child.wait_with_output().with_context(|| format!("cannot wait for {}", self.restore))?;
        if !out.status.success() {
            return Err(anyhow!(
                "{} refused the batch (nothing of it was applied): {}\n{text}",
                self.restore,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(())
    }
}

/// The tables edgevx's chains are in, each once.
fn tables() -> Vec<&'static str> {
    let mut t: Vec<&str> = ALL.iter().map(|(table, _, _)| *table).collect();
    t.sort_unstable();
    t.dedup();
    t
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
    use super::writes_nftables;

    #[test]
    fn the_version_line_names_the_backend() {
        assert!(writes_nftables("iptables v1.8.9 (nf_tables)"));
        assert!(!writes_nftables("iptables v1.8.9 (legacy)"));
        assert!(!writes_nftables("iptables v1.4.21"));
    }
}
