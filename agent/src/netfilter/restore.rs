//! One firewall change per table as one `iptables-restore --noflush`
//! batch: the whole batch commits or none of it does (one nftables
//! transaction with iptables-nft, one table replace with legacy), so a
//! chain is never seen flushed and half rewritten, and a pass writes with
//! one process per table where `-F` then one `-A` per rule took a dozen
//! (flannel#2145 is that class of race: rules checked and rewritten one
//! process at a time against a kube-proxy doing the same).
//!
//! The batch is planned here, purely, from the table as `iptables -S` read
//! it and the chains wanted ([`batch`]); `iptables.rs` runs it.
use std::fmt::Write as _;

use super::rules::{ALL, Chain};

/// One table as `iptables -S` prints it: each chain's rules, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing(pub std::collections::BTreeMap<String, Vec<String>>);

impl Listing {
    pub fn parse(text: &str) -> Self {
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
    pub fn rules(&self, chain: &str) -> Option<&[String]> {
        self.0.get(chain).map(Vec::as_slice)
    }

    /// The rules of `parent` that jump to `chain`, as printed: ours by their
    /// target, whatever this iptables prints for the comment before it.
    pub fn jumps_to(&self, parent: &str, chain: &str) -> Vec<String> {
        let target = format!("-j {chain}");
        self.rules(parent).unwrap_or_default().iter().filter(|r| r.ends_with(&target)).cloned().collect()
    }
}

/// What a chain's rules read as on this host once written: iptables prints
/// a rule in its own canonical form (an implied `-m udp`, a netmask, quoting),
/// which differs between versions. A chain whose listing is what the same
/// plan read as right after it was written is in place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Printed {
    pub planned: Vec<String>,
    pub printed: Vec<String>,
}

/// Whether `chain` reads as planned: its listing is the plan's own text, or
/// what this plan read as when it was last written (`learned`).
pub fn in_place(chain: &Chain, listed: Option<&[String]>, learned: Option<&Printed>) -> bool {
    let Some(listed) = listed else { return false };
    listed == chain.rules.as_slice() || learned.is_some_and(|p| p.planned == chain.rules && p.printed == listed)
}

/// The batch that makes `table` hold `wanted` (the chains of this table)
/// and none of the other chains edgevx owns in it, or `None` when nothing
/// differs. `learned(name)` gives a chain's printed form from its last
/// write. Chain declarations come first (with `--noflush`, `:CHAIN` creates
/// a chain or flushes the existing one), then the rules, the hooks, and
/// the removals.
pub fn batch<'a>(
    table: &str,
    now: &Listing,
    wanted: impl Iterator<Item = &'a Chain>,
    learned: impl Fn(&str) -> Option<Printed>,
) -> Option<Batch> {
    let mut b = Batch::default();
    let (mut declare, mut commands) = (String::new(), String::new());
    let wanted: Vec<&Chain> = wanted.filter(|c| c.table == table).collect();
    for c in &wanted {
        if !in_place(c, now.rules(c.name), learned(c.name).as_ref()) {
            let _ = writeln!(declare, ":{} - [0:0]", c.name);
            for r in &c.rules {
                let _ = writeln!(commands, "-A {} {r}", c.name);
            }
            b.written.push(c.name);
        }
        let jumps = now.jumps_to(c.parent, c.name);
        let first = now.rules(c.parent).and_then(<[String]>::first);
        let hooked = !jumps.is_empty();
        let in_front = first.is_some_and(|f| jumps.contains(f));
        if !hooked || (c.jump_first && !in_front) || jumps.len() > 1 {
            // every hook goes (as printed, so the delete matches), then one in its place
            for j in &jumps {
                let _ = writeln!(commands, "-D {} {j}", c.parent);
            }
            let verb = if c.jump_first { "-I" } else { "-A" };
            let at = if c.jump_first { " 1" } else { "" };
            let _ = writeln!(commands, "{verb} {}{at} {}", c.parent, c.jump());
            if hooked {
                b.moved.push(c.name);
            }
        }
    }
    for (_, parent, name) in ALL.iter().filter(|(t, _, name)| *t == table && !wanted.iter().any(|c| c.name == *name)) {
        if now.rules(name).is_none() {
            continue;
        }
        for j in now.jumps_to(parent, name) {
            let _ = writeln!(commands, "-D {parent} {j}");
        }
        let _ = writeln!(commands, "-F {name}\n-X {name}");
        b.removed.push(name);
    }
    if declare.is_empty() && commands.is_empty() {
        return None;
    }
    b.text = format!("*{table}\n{declare}{commands}COMMIT\n");
    Some(b)
}

/// A batch for `iptables-restore --noflush`, and what it changes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub text: String,
    /// Chains (re)written.
    pub written: Vec<&'static str>,
    /// Chains whose hook was put back in place (something went ahead of it).
    pub moved: Vec<&'static str>,
    /// Chains removed with their hooks.
    pub removed: Vec<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netfilter::rules::{FWD_CHAIN, INPUT_CHAIN, MASQ_CHAIN, jump_rule};

    fn chain(table: &'static str, name: &'static str, parent: &'static str, first: bool, rules: &[&str]) -> Chain {
        Chain { table, name, parent, jump_first: first, rules: rules.iter().map(|r| r.to_string()).collect() }
    }

    fn none(_: &str) -> Option<Printed> {
        None
    }

    #[test]
    fn a_new_node_gets_each_chain_and_its_hook_in_one_batch() {
        let input = chain("filter", INPUT_CHAIN, "INPUT", true, &["-p udp -m udp --dport 8472 -j DROP"]);
        let fwd = chain("filter", FWD_CHAIN, "FORWARD", false, &["-s 10.244.0.0/16 -j ACCEPT"]);
        let now = Listing::parse("-P INPUT ACCEPT\n-P FORWARD DROP\n-A FORWARD -j KUBE-FORWARD\n");
        let b = batch("filter", &now, [&input, &fwd].into_iter(), none).expect("a batch");
        let want = format!(
            "*filter\n:EDGEVX-INPUT - [0:0]\n:EDGEVX-FWD - [0:0]\n\
             -A EDGEVX-INPUT -p udp -m udp --dport 8472 -j DROP\n-I INPUT 1 {}\n\
             -A EDGEVX-FWD -s 10.244.0.0/16 -j ACCEPT\n-A FORWARD {}\nCOMMIT\n",
            jump_rule(INPUT_CHAIN),
            jump_rule(FWD_CHAIN)
        );
        assert_eq!(b.text, want);
        assert_eq!((b.written, b.moved, b.removed), (vec![INPUT_CHAIN, FWD_CHAIN], vec![], vec![]));
    }

    #[test]
    fn what_is_in_place_is_not_written_whatever_this_iptables_prints() {
        let fwd = chain("filter", FWD_CHAIN, "FORWARD", false, &["-s 10.244.0.0/16 -j ACCEPT"]);
        // another iptables prints the comment unquoted: the hook is found by its target
        let listed = "-P FORWARD DROP\n-N EDGEVX-FWD\n-A FORWARD -j KUBE-FORWARD\n\
                      -A FORWARD -m comment --comment edgevx-edgevx-fwd -j EDGEVX-FWD\n\
                      -A EDGEVX-FWD -s 10.244.0.0/16 -j ACCEPT\n";
        assert_eq!(batch("filter", &Listing::parse(listed), [&fwd].into_iter(), none), None);
        // a rule printed differently than planned: in place once learned from the last write
        let masq = chain("nat", MASQ_CHAIN, "POSTROUTING", true, &["-s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN"]);
        let printed = "-s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment x -j RETURN".to_string();
        let listed = format!(
            "-P POSTROUTING ACCEPT\n-N {MASQ_CHAIN}\n-A POSTROUTING {}\n-A {MASQ_CHAIN} {printed}\n",
            jump_rule(MASQ_CHAIN)
        );
        let now = Listing::parse(&listed);
        assert!(batch("nat", &now, [&masq].into_iter(), none).is_some(), "unknown form: rewritten");
        let learned = |_: &str| Some(Printed { planned: masq.rules.clone(), printed: vec![printed.clone()] });
        assert_eq!(batch("nat", &now, [&masq].into_iter(), learned), None, "the form it read as last time");
        // a different plan than the learned one is written
        let other = chain("nat", MASQ_CHAIN, "POSTROUTING", true, &["-s 10.245.0.0/16 -j RETURN"]);
        assert!(batch("nat", &now, [&other].into_iter(), learned).is_some());
    }

    #[test]
    fn a_rule_put_ahead_of_a_first_hook_and_a_doubled_hook_are_put_right() {
        let input = chain("filter", INPUT_CHAIN, "INPUT", true, &[]);
        let j = jump_rule(INPUT_CHAIN);
        let now = Listing::parse(&format!("-P INPUT ACCEPT\n-N {INPUT_CHAIN}\n-A INPUT -j ACCEPT\n-A INPUT {j}\n"));
        let b = batch("filter", &now, [&input].into_iter(), none).expect("a batch");
        assert_eq!(b.text, format!("*filter\n-D INPUT {j}\n-I INPUT 1 {j}\nCOMMIT\n"));
        assert_eq!(b.moved, vec![INPUT_CHAIN]);
        let now = Listing::parse(&format!("-P INPUT ACCEPT\n-N {INPUT_CHAIN}\n-A INPUT {j}\n-A INPUT {j}\n"));
        let b = batch("filter", &now, [&input].into_iter(), none).expect("a batch");
        assert_eq!(b.text, format!("*filter\n-D INPUT {j}\n-D INPUT {j}\n-I INPUT 1 {j}\nCOMMIT\n"));
    }

    #[test]
    fn chains_no_longer_wanted_go_with_their_hooks_and_others_stay() {
        let j = jump_rule(MASQ_CHAIN);
        let now = Listing::parse(&format!(
            "-P POSTROUTING ACCEPT\n-N {MASQ_CHAIN}\n-N KUBE-POSTROUTING\n-A POSTROUTING -j KUBE-POSTROUTING\n\
             -A POSTROUTING {j}\n-A {MASQ_CHAIN} -j RETURN\n"
        ));
        let b = batch("nat", &now, std::iter::empty(), none).expect("a batch");
        assert_eq!(b.text, format!("*nat\n-D POSTROUTING {j}\n-F {MASQ_CHAIN}\n-X {MASQ_CHAIN}\nCOMMIT\n"));
        assert_eq!(b.removed, vec![MASQ_CHAIN]);
        // nothing of ours: nothing to do, kube-proxy's chains untouched
        let theirs = Listing::parse("-P POSTROUTING ACCEPT\n-N KUBE-POSTROUTING\n-A POSTROUTING -j KUBE-POSTROUTING\n");
        assert_eq!(batch("nat", &theirs, std::iter::empty(), none), None);
    }

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
}
