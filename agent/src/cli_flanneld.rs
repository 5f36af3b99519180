//! flanneld's command line and environment, so that a flanneld unit or env
//! file runs edgevx unchanged: every flag of flannel's `main.go` is either
//! accepted (the same name, or a clap alias of ours) or refused with exit 2
//! and what to do instead. `FLANNELD_<FLAG>` variables are read as flanneld
//! reads them (`flagutil.SetFlagsFromEnv(flannelFlags, "FLANNELD")`: the
//! flag name upper-cased, `-` as `_`, only for a flag not on the command
//! line); an `EDGEVX_` variable of the same setting beats them.
//!
//! This runs on the raw arguments of `edgevx run`, before clap: it turns
//! Go's spellings into ours (`-flag` as `--flag`, `--bool=true`, minutes).
use std::{ffi::OsString, slice};

/// What edgevx does with one flanneld flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// A value flag edgevx has under this name (or as an alias of `edgevx`).
    Value { edgevx: &'static str },
    /// A Go bool (`--f`, `--f=true`, `--f=false`) that is a clap switch here.
    Switch { edgevx: &'static str },
    /// `--subnet-lease-renew-margin` in minutes (1 to 1439, as flanneld checks).
    Minutes { edgevx_secs: &'static str },
    /// No edgevx meaning: exit 2 with the reason and what to do instead. A
    /// bool whose value is its default (false) is harmless and accepted.
    Refused { reason: &'static str, bool_default_false: bool },
    /// `--healthz-ip` (`port: false`) or `--healthz-port`: flanneld serves
    /// `/healthz` on IP:PORT when PORT is not 0; edgevx serves its probes and
    /// metrics there (`--metrics-addr`) unless `--metrics-addr` is given.
    Healthz { port: bool },
}

use Meaning::*;

/// Every flag of flanneld's `main.go` (flannelFlags, and klog's copied ones).
pub const FLAGS: &[(&str, Meaning)] = &[
    ("etcd-endpoints", Value { edgevx: "etcd-endpoints" }),
    ("etcd-prefix", Value { edgevx: "etcd-prefix" }),
    ("etcd-keyfile", Value { edgevx: "etcd-keyfile" }),
    ("etcd-certfile", Value { edgevx: "etcd-certfile" }),
    ("etcd-cafile", Value { edgevx: "etcd-cafile" }),
    ("etcd-username", Value { edgevx: "etcd-username" }),
    ("etcd-password", Value { edgevx: "etcd-password" }),
    ("iface", Value { edgevx: "iface" }),
    ("iface-regex", Value { edgevx: "iface-regex" }),
    ("iface-can-reach", Value { edgevx: "iface-can-reach" }),
    ("subnet-file", Value { edgevx: "subnet-file" }),
    ("public-ip", Value { edgevx: "public-ip" }),
    ("public-ipv6", Value { edgevx: "public-ipv6" }),
    ("subnet-lease-renew-margin", Minutes { edgevx_secs: "subnet-lease-renew-margin-secs" }),
    ("ip-masq", Switch { edgevx: "ip-masq" }),
    (
        "ip-masq-fully-random-disable",
        Refused {
            reason: "edgevx's MASQUERADE rules always use --random-fully, as flanneld's default; drop the flag",
            bool_default_false: true,
        },
    ),
    ("kube-subnet-mgr", Switch { edgevx: "kube" }),
    (
        "kube-api-url",
        Refused {
            reason: "give a kubeconfig whose cluster server is that URL (--kubeconfig-file / --kubeconfig), or run in-cluster",
            bool_default_false: false,
        },
    ),
    ("kube-annotation-prefix", Value { edgevx: "kube-annotation-prefix" }),
    ("kubeconfig-file", Value { edgevx: "kubeconfig" }),
    ("version", Refused { reason: "use `edgevx --version` (before the subcommand)", bool_default_false: true }),
    ("healthz-ip", Healthz { port: false }),
    ("healthz-port", Healthz { port: true }),
    (
        "iptables-resync",
        Refused {
            reason: "edgevx re-asserts its rules on every resync (10 s) and after a kernel event; drop the flag",
            bool_default_false: false,
        },
    ),
    ("iptables-forward-rules", Value { edgevx: "iptables-forward-rules" }),
    (
        "ip-blackhole-route",
        Refused {
            reason: "edgevx adds no blackhole route for the local pod CIDR; drop the flag (or add the route in the host's network config)",
            bool_default_false: true,
        },
    ),
    ("net-config-path", Value { edgevx: "net-conf" }),
    ("set-node-network-unavailable", Value { edgevx: "set-node-network-unavailable" }),
    // klog's verbosity, as a log level (EDGEVX_LOG, when set, wins)
    ("v", Value { edgevx: "v" }),
    (
        "vmodule",
        Refused {
            reason: "set per-module levels with EDGEVX_LOG (e.g. EDGEVX_LOG=info,edgevx::source=debug)",
            bool_default_false: false,
        },
    ),
    (
        "log_backtrace_at",
        Refused { reason: "edgevx has no backtrace-on-log; drop the flag", bool_default_false: false },
    ),
];

/// A flanneld flag with no edgevx meaning, or a value flanneld would refuse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FlanneldError {
    #[error("flanneld's --{flag} has no edgevx equivalent: {reason}")]
    Refused { flag: String, reason: &'static str },
    #[error("flanneld's {from} is set ({flag}): it has no edgevx equivalent: {reason}")]
    RefusedEnv { from: String, flag: String, reason: &'static str },
    #[error("--{flag} {value:?}: {why}")]
    BadValue { flag: String, value: String, why: String },
}

/// The environment variable flanneld reads for `flag`.
pub fn env_name(flag: &str) -> String {
    format!("FLANNELD_{}", flag.to_uppercase().replace('-', "_"))
}

/// The `EDGEVX_` variable of an edgevx flag.
fn edgevx_env(long: &str) -> String {
    format!("EDGEVX_{}", long.to_uppercase().replace('-', "_"))
}

/// Go's strconv.ParseBool.
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

fn lookup(name: &str) -> Option<Meaning> {
    FLAGS.iter().find(|(f, _)| *f == name).map(|(_, m)| *m)
}

fn minutes_to_secs(flag: &str, value: &str) -> Result<String, FlanneldError> {
    let bad = |why: &str| FlanneldError::BadValue { flag: flag.into(), value: value.into(), why: why.into() };
    let m: u64 = value.parse().map_err(|_| bad("minutes, a whole number"))?;
    if !(1..24 * 60).contains(&m) {
        return Err(bad("out of flanneld's range, 1 to 1439 minutes"));
    }
    Ok((m * 60).to_string())
}

/// flanneld's `--healthz-ip` (default 0.0.0.0, which Go serves on both
/// families) and `--healthz-port`
/// (default 0: no server), as given.
#[derive(Default)]
struct HealthzAddr {
    ip: Option<String>,
    port: Option<String>,
}

impl HealthzAddr {
    fn set(&mut self, port: bool, value: String) {
        if port { self.port = Some(value) } else { self.ip = Some(value) }
    }

    /// `--metrics-addr=IP:PORT` for a port that is not 0 (flanneld serves
    /// nothing on port 0, and edgevx keeps its own default then).
    fn metrics_addr(&self) -> Result<Option<String>, FlanneldError> {
        let bad = |flag: &str, value: &str, why: &str| FlanneldError::BadValue {
            flag: flag.into(),
            value: value.into(),
            why: why.into(),
        };
        let Some(port) = &self.port else { return Ok(None) };
        let n: u16 = port.parse().map_err(|_| bad("healthz-port", port, "a port, 0 to 65535"))?;
        let ip = self.ip.as_deref().unwrap_or("0.0.0.0");
        let mut ip: std::net::IpAddr = ip.parse().map_err(|_| bad("healthz-ip", ip, "an IP address"))?;
        // Go listens on the IPv4 wildcard with an IPv6 socket, V6ONLY off
        // (net/ipsock_posix.go, favoriteAddrFamily): flanneld's 0.0.0.0 serves
        // both families, and an IPv6-only node's probes reach it. [::] does so here.
        if ip == std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED) {
            ip = std::net::Ipv6Addr::UNSPECIFIED.into();
        }
        Ok((n != 0).then(|| format!("--metrics-addr={}", std::net::SocketAddr::new(ip, n))))
    }
}

/// Rewrites the arguments after `run`: flanneld's spellings into ours,
/// refused flags into an error, then `FLANNELD_*` settings the command line
/// and the `EDGEVX_*` variables leave open, appended as flags.
pub fn translate(args: Vec<OsString>, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<OsString>, FlanneldError> {
    let is_run = args.get(1).is_some_and(|a| a == "run");
    if !is_run {
        return Ok(args);
    }
    let mut line = Rewritten { out: args[..2].to_vec(), given: Vec::new(), healthz: HealthzAddr::default() };
    let mut rest = args[2..].iter();
    while let Some(arg) = rest.next() {
        line.take(arg, &mut rest)?;
    }
    let healthz_env = line.fill_from_env(env)?;
    line.finish(healthz_env, env)
}

/// The arguments as rewritten so far, and what the command line gave.
struct Rewritten {
    out: Vec<OsString>,
    /// The edgevx long names given on the command line.
    given: Vec<&'static str>,
    /// flanneld's healthz flags on the command line.
    healthz: HealthzAddr,
}

/// A flag as Go spells it: its name and its `=value`, if any. Go accepts
/// `-flag` and `--flag`; `None` for anything else (a value, `-`, `--`).
fn go_flag(text: &str) -> Option<(&str, Option<String>)> {
    // Go accepts -flag and --flag, with =value or (not for bools) a separate value
    let body = text.strip_prefix("--").or_else(|| text.strip_prefix('-').filter(|b| !b.starts_with('-')));
    let body = body.filter(|b| !b.is_empty())?;
    Some(match body.split_once('=') {
        Some((n, v)) => (n, Some(v.to_string())),
        None => (body, None),
    })
}

/// A flag's value: its `=value`, else the next argument (empty when there
/// is none).
fn value_of(inline: Option<String>, rest: &mut slice::Iter<'_, OsString>) -> String {
    match inline {
        Some(v) => v,
        None => rest.next().and_then(|v| v.to_str()).unwrap_or_default().to_string(),
    }
}

impl Rewritten {
    /// Takes one argument of the command line (and the value after it, for
    /// a flanneld flag that takes one); anything not flanneld's passes as is.
    fn take(&mut self, arg: &OsString, rest: &mut slice::Iter<'_, OsString>) -> Result<(), FlanneldError> {
        let Some((name, inline)) = arg.to_str().and_then(go_flag) else {
            self.out.push(arg.clone());
            return Ok(());
        };
        let Some(meaning) = lookup(name) else {
            self.note_ours(name);
            self.out.push(arg.clone());
            return Ok(());
        };
        self.flanneld_flag(name, meaning, inline, rest)
    }

    /// Notes `name` as given when it is our `--metrics-addr` or our name
    /// for a setting flanneld has too.
    fn note_ours(&mut self, name: &str) {
        if name == "metrics-addr" {
            self.given.push("metrics-addr");
        }
        // one of our own names for a setting flanneld has too: the command line wins over FLANNELD_*
        if let Some(ours) = FLAGS.iter().find_map(|(_, m)| match m {
            Value { edgevx } | Switch { edgevx } if *edgevx == name => Some(*edgevx),
            Minutes { edgevx_secs } if *edgevx_secs == name => Some(*edgevx_secs),
            _ => None,
        }) {
            self.given.push(ours);
        }
    }

    /// Rewrites the flanneld flag `name` as its [`Meaning`] says, or refuses it.
    fn flanneld_flag(
        &mut self,
        name: &str,
        meaning: Meaning,
        inline: Option<String>,
        rest: &mut slice::Iter<'_, OsString>,
    ) -> Result<(), FlanneldError> {
        match meaning {
            Value { edgevx } => {
                self.given.push(edgevx);
                self.out.push(match inline {
                    Some(v) => format!("--{name}={v}").into(),
                    None => format!("--{name}").into(),
                });
            }
            Switch { edgevx } => {
                self.given.push(edgevx);
                let on = match &inline {
                    None => true,
                    Some(v) => go_bool(v).ok_or_else(|| FlanneldError::BadValue {
                        flag: name.into(),
                        value: v.clone(),
                        why: "want true or false".into(),
                    })?,
                };
                if on {
                    self.out.push(format!("--{edgevx}").into());
                }
            }
            Minutes { edgevx_secs } => {
                self.given.push(edgevx_secs);
                let value = value_of(inline, rest);
                self.out.push(format!("--{edgevx_secs}={}", minutes_to_secs(name, &value)?).into());
            }
            Refused { reason, bool_default_false } => {
                let harmless = bool_default_false && inline.as_deref().and_then(go_bool) == Some(false);
                if !harmless {
                    return Err(FlanneldError::Refused { flag: name.into(), reason });
                }
            }
            Healthz { port } => self.healthz.set(port, value_of(inline, rest)),
        }
        Ok(())
    }

    /// Appends the `FLANNELD_*` settings that neither the command line nor
    /// an `EDGEVX_*` variable gives, refusing those with no edgevx meaning.
    /// Returns the healthz ones, for [`Rewritten::finish`].
    fn fill_from_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<HealthzAddr, FlanneldError> {
        let mut healthz_env = HealthzAddr::default();
        for (flag, meaning) in FLAGS {
            let var = env_name(flag);
            let Some(value) = env(&var) else { continue };
            let edgevx = match meaning {
                Healthz { port } => {
                    healthz_env.set(*port, value);
                    continue;
                }
                Value { edgevx } | Switch { edgevx } => *edgevx,
                Minutes { edgevx_secs } => *edgevx_secs,
                Refused { reason, bool_default_false } => {
                    if *bool_default_false && go_bool(&value) == Some(false) {
                        continue;
                    }
                    return Err(FlanneldError::RefusedEnv { from: var, flag: format!("--{flag}"), reason });
                }
            };
            if self.given.contains(&edgevx) || env(&edgevx_env(edgevx)).is_some() {
                continue;
            }
            self.push_env(meaning, edgevx, &var, &value)?;
        }
        Ok(healthz_env)
    }

    /// Appends the variable `var`'s `value` as our flag `--edgevx`.
    fn push_env(&mut self, meaning: &Meaning, edgevx: &str, var: &str, value: &str) -> Result<(), FlanneldError> {
        match meaning {
            Switch { .. } => {
                let on = go_bool(value).ok_or_else(|| FlanneldError::BadValue {
                    flag: var.into(),
                    value: value.into(),
                    why: "want true or false".into(),
                })?;
                if on {
                    self.out.push(format!("--{edgevx}").into());
                }
            }
            Minutes { .. } => self.out.push(format!("--{edgevx}={}", minutes_to_secs(var, value)?).into()),
            _ => self.out.push(format!("--{edgevx}={value}").into()),
        }
        Ok(())
    }

    /// The arguments, with `--metrics-addr` from flanneld's healthz settings
    /// appended unless ours is given on the command line or in the
    /// environment.
    fn finish(
        mut self,
        healthz_env: HealthzAddr,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<OsString>, FlanneldError> {
        // the command line's healthz settings, each filled from FLANNELD_* where not given
        let healthz =
            HealthzAddr { ip: self.healthz.ip.or(healthz_env.ip), port: self.healthz.port.or(healthz_env.port) };
        if let Some(addr) = healthz.metrics_addr()?
            && !self.given.contains(&"metrics-addr")
            && env(&edgevx_env("metrics-addr")).is_none()
        {
            self.out.push(addr.into());
        }
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Vec<String>, FlanneldError> {
        let mut all = vec!["edgevx".to_string(), "run".to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let lookup = move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        translate(all.into_iter().map(OsString::from).collect(), &lookup)
            .map(|v| v[2..].iter().map(|a| a.to_string_lossy().into_owned()).collect())
    }

    #[test]
    fn env_names_are_derived_as_flanneld_derives_them() {
        assert_eq!(env_name("kube-subnet-mgr"), "FLANNELD_KUBE_SUBNET_MGR");
        assert_eq!(env_name("iface"), "FLANNELD_IFACE");
    }

    #[test]
    fn go_spellings_become_ours() {
        assert_eq!(
            run(&["-iface=eth1", "--ip-masq=true", "-kube-subnet-mgr", "--etcd-prefix", "/p"], &[]).unwrap(),
            ["--iface=eth1", "--ip-masq", "--kube", "--etcd-prefix", "/p"]
        );
        assert_eq!(run(&["--ip-masq=false"], &[]).unwrap(), Vec::<String>::new());
        assert_eq!(run(&["--node-name", "n1"], &[]).unwrap(), ["--node-name", "n1"], "our own flags pass");
    }

    #[test]
    fn renew_margin_in_minutes_within_flanneld_range() {
        assert_eq!(run(&["--subnet-lease-renew-margin=60"], &[]).unwrap(), ["--subnet-lease-renew-margin-secs=3600"]);
        assert_eq!(run(&["--subnet-lease-renew-margin", "2"], &[]).unwrap(), ["--subnet-lease-renew-margin-secs=120"]);
        assert!(matches!(run(&["--subnet-lease-renew-margin=1440"], &[]), Err(FlanneldError::BadValue { .. })));
        assert!(matches!(run(&["--subnet-lease-renew-margin=0"], &[]), Err(FlanneldError::BadValue { .. })));
    }

    #[test]
    fn refused_flags_name_themselves_and_what_to_do() {
        let e = run(&["--ip-blackhole-route"], &[]).unwrap_err().to_string();
        assert!(e.contains("--ip-blackhole-route") && e.contains("drop the flag"), "{e}");
        assert!(run(&["--ip-blackhole-route=false"], &[]).unwrap().is_empty(), "the default is harmless");
        let e = run(&[], &[("FLANNELD_KUBE_API_URL", "https://10.0.0.1")]).unwrap_err().to_string();
        assert!(e.contains("FLANNELD_KUBE_API_URL") && e.contains("kubeconfig"), "{e}");
    }

    #[test]
    fn flanneld_env_fills_what_the_command_line_and_edgevx_env_leave_open() {
        let env = [
            ("FLANNELD_IFACE", "eth1"),
            ("FLANNELD_IP_MASQ", "true"),
            ("FLANNELD_ETCD_ENDPOINTS", "http://198.18.0.254:2379"),
            ("FLANNELD_SUBNET_LEASE_RENEW_MARGIN", "30"),
            ("FLANNELD_PUBLIC_IP", "198.18.0.9"),
            ("EDGEVX_PUBLIC_IP", "198.18.0.1"),
            ("FLANNELD_KUBE_SUBNET_MGR", "false"),
        ];
        let out = run(&["--iface", "eth0", "--subnet-lease-renew-margin-secs=60"], &env).unwrap();
        assert_eq!(
            out,
            [
                "--iface",
                "eth0",
                "--subnet-lease-renew-margin-secs=60",
                "--etcd-endpoints=http://198.18.0.254:2379",
                "--ip-masq"
            ]
        );
    }

    #[test]
    fn the_public_ipv6_of_a_dual_stack_flanneld_is_taken() {
        assert_eq!(run(&[], &[("FLANNELD_PUBLIC_IPV6", "fd00::1")]).unwrap(), ["--public-ipv6=fd00::1"]);
        assert_eq!(run(&["-public-ipv6=fd00::2"], &[]).unwrap(), ["--public-ipv6=fd00::2"]);
    }

    #[test]
    fn kube_flannel_yml_args_run_unchanged() {
        // Documentation/kube-flannel.yml's container args (flannel HEAD)
        assert_eq!(
            run(&["--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"], &[]).unwrap(),
            ["--ip-masq", "--kube", "--metrics-addr=[::]:8081"]
        );
        // its older args, and a verbosity as flannel's troubleshooting asks for
        assert_eq!(run(&["--ip-masq", "--kube-subnet-mgr", "-v=2"], &[]).unwrap(), ["--ip-masq", "--kube", "--v=2"]);
        assert_eq!(run(&["--v", "4"], &[]).unwrap(), ["--v", "4"]);
    }

    #[test]
    fn healthz_becomes_the_metrics_address_unless_one_is_given() {
        assert_eq!(
            run(&["--healthz-ip", "10.0.0.5", "--healthz-port", "8081"], &[]).unwrap(),
            ["--metrics-addr=10.0.0.5:8081"]
        );
        assert_eq!(
            run(&["--healthz-ip=fd00::5", "--healthz-port=8081"], &[]).unwrap(),
            ["--metrics-addr=[fd00::5]:8081"]
        );
        // port 0 (flanneld's default) serves nothing there: edgevx's own default stays
        assert!(run(&["--healthz-port=0", "--healthz-ip=10.0.0.5"], &[]).unwrap().is_empty());
        assert!(run(&["--healthz-ip=10.0.0.5"], &[]).unwrap().is_empty());
        // ours wins, on the command line or in the environment
        assert_eq!(
            run(&["--metrics-addr", "127.0.0.1:9117", "--healthz-port=8081"], &[]).unwrap(),
            ["--metrics-addr", "127.0.0.1:9117"]
        );
        assert!(run(&["--healthz-port=8081"], &[("EDGEVX_METRICS_ADDR", "127.0.0.1:1")]).unwrap().is_empty());
        // flanneld's environment fills what the command line leaves open
        assert_eq!(
            run(&["--healthz-port=8081"], &[("FLANNELD_HEALTHZ_IP", "10.0.0.6")]).unwrap(),
            ["--metrics-addr=10.0.0.6:8081"]
        );
        let e = run(&["--healthz-port=http"], &[]).unwrap_err().to_string();
        assert!(e.contains("--healthz-port \"http\""), "{e}");
        let e = run(&["--healthz-port=8081", "--healthz-ip=nowhere"], &[]).unwrap_err().to_string();
        assert!(e.contains("--healthz-ip \"nowhere\""), "{e}");
    }

    #[test]
    fn other_subcommands_are_left_alone() {
        let args: Vec<OsString> = ["edgevx", "status", "-v"].iter().map(OsString::from).collect();
        assert_eq!(translate(args.clone(), &|_| Some("x".into())).unwrap(), args);
    }
}
