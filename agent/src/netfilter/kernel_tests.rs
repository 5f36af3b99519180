//! The firewall against the host's real iptables, in a namespace of its own
//! (root, like the other kernel tests): one batch per table, nothing
//! rewritten when in place, the hook put back in front, and a batch that
//! fails changes nothing at all.
use ipnet::Ipv4Net;

use super::{Firewall, Settings, plan, rules::RuleSet};
use crate::testns::TestNs;

fn settings() -> Settings {
    Settings { vxlan_port: 8472, ip_masq: true, forward: true, vxlan_only_on: None }
}

fn set() -> RuleSet {
    let (network, subnet): (Ipv4Net, Ipv4Net) = ("10.244.0.0/16".parse().unwrap(), "10.244.1.0/24".parse().unwrap());
    plan(network, subnet, &settings())
}

#[test]
fn batches_write_once_keep_the_hook_first_and_fail_whole() -> anyhow::Result<()> {
    let ns = TestNs::new("fw")?;
    let save = |ns: &TestNs| ns.exec(&["iptables-save"]);
    let fw = ns.enter(Firewall::new::<Ipv4Net>)??;
    let fw = std::sync::Arc::new(fw);
    let apply = |fw: &std::sync::Arc<Firewall>, set: RuleSet| {
        let fw = fw.clone();
        ns.enter(move || fw.apply(&set))
    };
    assert!(apply(&fw, set())??, "a new namespace gets its chains");
    let first = save(&ns)?;
    for chain in ["EDGEVX-INPUT", "EDGEVX-FWD", "EDGEVX-POSTRTG"] {
        assert!(first.contains(&format!(":{chain} ")), "{chain} missing:\n{first}");
    }
    assert!(!apply(&fw, set())??, "in place: nothing written");
    // another Firewall (a restarted agent) knows no printed forms yet: the plan's text must match
    let fresh = std::sync::Arc::new(ns.enter(Firewall::new::<Ipv4Net>)??);
    assert!(!apply(&fresh, set())??, "a restarted agent rewrites nothing that is in place");

    // an operator's rule ahead of our jump in INPUT: the jump goes back in front, theirs stays
    ns.exec(&["iptables", "-I", "INPUT", "1", "-s", "192.0.2.1", "-j", "ACCEPT"])?;
    assert!(apply(&fw, set())??);
    let input = ns.exec(&["iptables", "-S", "INPUT"])?;
    let rules: Vec<&str> = input.lines().filter(|l| l.starts_with("-A")).collect();
    assert!(rules.first().is_some_and(|r| r.ends_with("-j EDGEVX-INPUT")), "{input}");
    assert!(rules.iter().any(|r| r.contains("192.0.2.1")), "the operator's rule is gone:\n{input}");

    // a batch iptables refuses is applied not at all: the chains stay as they were, never flushed
    let before = save(&ns)?;
    let mut bad = set();
    if let Some(c) = bad.chains.iter_mut().find(|c| c.name == "EDGEVX-FWD") {
        c.rules.push("-m no-such-match -j ACCEPT".into());
    }
    let e = apply(&fw, bad)?.expect_err("a rule iptables cannot parse");
    assert!(format!("{e:#}").contains("nothing of it was applied"), "{e:#}");
    let strip = |s: &str| s.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n");
    assert_eq!(strip(&save(&ns)?), strip(&before), "a failed batch changed the tables");

    let fw2 = fw.clone();
    assert!(ns.enter(move || fw2.remove_all())??);
    let after = save(&ns)?;
    assert!(!after.contains("EDGEVX"), "cleanup left:\n{after}");
    assert!(after.contains("192.0.2.1"), "cleanup took the operator's rule:\n{after}");
    Ok(())
}
