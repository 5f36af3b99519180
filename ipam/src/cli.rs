//! The command line. A runtime runs the plugin with no arguments (the CNI_*
//! variables say what to do); anything after the program name is a person
//! or the DaemonSet's init containers, and is read here.
//!
//! Exit codes as the agent's: 0, 1 for a failure, 2 for a usage error
//! (named, with the usage, on stderr).
use thiserror::Error;

use crate::wire;

pub const USAGE: &str = "\
usage: edgevx-ipam                        run as a CNI IPAM plugin (CNI_COMMAND=ADD|DEL|CHECK|GC|STATUS|VERSION)
       edgevx-ipam install DIR            copy this binary to DIR/edgevx-ipam (atomically)
       edgevx-ipam install-conf SRC DEST  copy the CNI config SRC to DEST (atomically; SRC must be JSON)
       edgevx-ipam --version | --help";

#[derive(Debug, PartialEq, Eq)]
pub enum Invocation {
    /// No arguments: the CNI plugin.
    Plugin,
    Version,
    Help,
    Install {
        dir: String,
    },
    InstallConf {
        src: String,
        dest: String,
    },
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum UsageError {
    #[error("{command}: unknown flag {flag}")]
    UnknownFlag { command: &'static str, flag: String },
    #[error("unknown command {0:?}")]
    UnknownCommand(String),
    #[error("{command} takes {want}, got {got} argument(s)")]
    Operands { command: &'static str, want: &'static str, got: usize },
}

/// Reads `args` (without the program name). `--help` anywhere is help;
/// `--` ends the flags, so a directory may start with `-`.
pub fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let Some((first, rest)) = args.split_first() else {
        return Ok(Invocation::Plugin);
    };
    let (command, want, n) = match first.as_str() {
        "--help" | "-h" | "help" => return Ok(Invocation::Help),
        "--version" | "-V" => return Ok(Invocation::Version),
        "install" => ("install", "one directory", 1),
        "install-conf" => ("install-conf", "a source and a destination", 2),
        other if other.starts_with('-') => {
            return Err(UsageError::UnknownFlag { command: "edgevx-ipam", flag: other.to_string() });
        }
        other => return Err(UsageError::UnknownCommand(other.to_string())),
    };
    let mut operands = Vec::new();
    let mut flags_end = false;
    for a in rest {
        match a.as_str() {
            _ if flags_end => operands.push(a.clone()),
            "--" => flags_end = true,
            "--help" | "-h" => return Ok(Invocation::Help),
            f if f.starts_with('-') && f.len() > 1 => {
                return Err(UsageError::UnknownFlag { command, flag: f.to_string() });
            }
            _ => operands.push(a.clone()),
        }
    }
    if operands.len() != n {
        return Err(UsageError::Operands { command, want, got: operands.len() });
    }
    let mut o = operands.into_iter();
    let mut next = || o.next().unwrap_or_default();
    Ok(match command {
        "install" => Invocation::Install { dir: next() },
        _ => Invocation::InstallConf { src: next(), dest: next() },
    })
}

/// What a plugin run with no CNI_COMMAND prints, on stderr, as the Go skel
/// (containernetworking/cni pkg/skel) prints its `about` string and the
/// versions, with the name as the plugins' buildversion.BuildString has it.
pub fn about() -> String {
    format!(
        "CNI edgevx-ipam plugin v{}\nCNI protocol versions supported: {}",
        env!("CARGO_PKG_VERSION"),
        wire::SUPPORTED_VERSIONS.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Invocation, UsageError> {
        parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn help_is_help_wherever_it_is_asked() {
        assert_eq!(p(&["--help"]), Ok(Invocation::Help));
        assert_eq!(p(&["install", "--help"]), Ok(Invocation::Help));
        assert_eq!(p(&["install", "/opt/cni/bin", "-h"]), Ok(Invocation::Help));
        assert_eq!(p(&["install-conf", "--help"]), Ok(Invocation::Help));
    }

    #[test]
    fn an_unknown_flag_is_named_never_taken_for_a_directory() {
        assert_eq!(
            p(&["install", "--hlep"]),
            Err(UsageError::UnknownFlag { command: "install", flag: "--hlep".into() })
        );
        let e = p(&["install-conf", "a", "-f", "b"]).unwrap_err();
        assert!(e.to_string().contains("unknown flag -f"), "{e}");
        assert!(matches!(p(&["--frobnicate"]), Err(UsageError::UnknownFlag { .. })));
        // after --, a name is a name
        assert_eq!(p(&["install", "--", "--help"]), Ok(Invocation::Install { dir: "--help".into() }));
    }

    #[test]
    fn operands_are_counted() {
        assert_eq!(p(&[]), Ok(Invocation::Plugin));
        assert_eq!(p(&["install", "/opt/cni/bin"]), Ok(Invocation::Install { dir: "/opt/cni/bin".into() }));
        assert!(matches!(p(&["install"]), Err(UsageError::Operands { got: 0, .. })));
        assert!(matches!(p(&["install", "a", "b"]), Err(UsageError::Operands { got: 2, .. })));
        assert_eq!(
            p(&["install-conf", "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"]),
            Ok(Invocation::InstallConf {
                src: "/etc/kube-flannel/cni-conf.json".into(),
                dest: "/etc/cni/net.d/10-flannel.conflist".into()
            })
        );
        assert!(matches!(p(&["install-conf", "a"]), Err(UsageError::Operands { .. })));
        assert_eq!(p(&["uninstall"]), Err(UsageError::UnknownCommand("uninstall".into())));
    }

    #[test]
    fn the_about_text_is_the_skels() {
        let a = about();
        let (first, second) = a.split_once('\n').unwrap();
        assert_eq!(first, format!("CNI edgevx-ipam plugin v{}", env!("CARGO_PKG_VERSION")));
        assert_eq!(second, "CNI protocol versions supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0");
    }
}
