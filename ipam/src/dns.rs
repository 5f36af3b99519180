//! `ipam.resolvConf`: a resolv.conf turned into the result's `dns`, as
//! host-local's `parseResolvConf` (plugins/ipam/host-local/dns.go) does.
use std::{fs, path::Path};

use crate::wire::{CniError, Code, Dns};

pub fn read(path: &Path) -> Result<Dns, CniError> {
    let text = fs::read_to_string(path).map_err(|e| {
        CniError::new(Code::InvalidConfig, "cannot read ipam.resolvConf", format!("{}: {e}", path.display()))
    })?;
    Ok(parse(&text))
}

pub fn parse(text: &str) -> Dns {
    let mut dns = Dns::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(key) = words.next() else { continue };
        let rest: Vec<String> = words.map(str::to_string).collect();
        match key {
            "nameserver" => dns.nameservers.extend(rest.into_iter().take(1)),
            "domain" => dns.domain = rest.into_iter().next(),
            "search" => dns.search = rest,
            "options" => dns.options.extend(rest),
            _ => {} // comments ('#', ';') and unknown keys
        }
    }
    dns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_becomes_dns() {
        let d = parse(
            "# c\nnameserver 10.96.0.10\nnameserver fd00::a\nsearch default.svc cluster.local\noptions ndots:5\ndomain x\n",
        );
        assert_eq!(d.nameservers, ["10.96.0.10", "fd00::a"]);
        assert_eq!(d.search, ["default.svc", "cluster.local"]);
        assert_eq!(d.options, ["ndots:5"]);
        assert_eq!(d.domain.as_deref(), Some("x"));
    }
}
