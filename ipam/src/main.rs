//! `edgevx-ipam`: a CNI 1.1 IPAM plugin that reads host-local's config and
//! shares host-local's store, and gives a pod (namespace/name) its address
//! back under a new sandbox, also after a reboot with no DEL.
//!
//! The runtime (or the bridge plugin, delegating) runs it as any plugin:
//! the CNI_* variables, the network config on stdin, the result or a CNI
//! error object on stdout, logs on stderr.
//!
//! Run with no CNI_COMMAND, it prints what it is and the spec versions it
//! speaks, as plugins built on the Go skel do. `edgevx-ipam install DIR`
//! and `install-conf SRC DEST` are the DaemonSet's init containers
//! (src/install.rs); `--help` lists them (src/cli.rs).
mod add;
mod cli;
mod dns;
mod entry;
mod env;
mod holder;
mod identity;
mod inspect;
mod install;
mod ledger;
#[cfg(test)]
mod ledger_tests;
mod release;
mod salvage;
mod store;

use std::{
    io::{Read, Write},
    process::ExitCode,
};

// the parser and wire types are the library's (src/lib.rs), for the fuzz targets
use edgevx_ipam::{config, range, wire};

use config::NetConf;
use env::Command;
use ledger::Ledger;
use store::Store;
use wire::{CniError, Code, IpamResult};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match cli::parse(&argv) {
        Ok(cli::Invocation::Plugin) => {}
        Ok(cli::Invocation::Version) => {
            println!("edgevx-ipam {} (commit {})", env!("CARGO_PKG_VERSION"), env!("EDGEVX_COMMIT"));
            return ExitCode::SUCCESS;
        }
        Ok(cli::Invocation::Help) => {
            println!("{}", cli::USAGE);
            return ExitCode::SUCCESS;
        }
        Ok(cli::Invocation::Install { dir }) => {
            return installed(install::install(std::path::Path::new(&dir)).map(|at| at.display().to_string()));
        }
        Ok(cli::Invocation::InstallConf { src, dest }) => {
            let (src, dest) = (std::path::Path::new(&src), std::path::Path::new(&dest));
            return installed(install::install_conf(src, dest).map(|()| dest.display().to_string()));
        }
        Err(e) => {
            eprintln!("edgevx-ipam: {e}\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    }
    // no CNI_COMMAND: a person at a terminal, not a runtime; answered before
    // stdin is read (which would wait for them), as the Go skel does
    if std::env::var_os("CNI_COMMAND").is_none_or(|c| c.is_empty()) {
        eprintln!("{}", cli::about());
        return ExitCode::SUCCESS;
    }
    let mut stdin = Vec::new();
    let read = std::io::stdin().read_to_end(&mut stdin);
    let version = config::version_of(&stdin)
        .filter(|v| wire::SUPPORTED_VERSIONS.contains(&v.as_str()))
        .unwrap_or_else(|| wire::LATEST.to_string());
    let get = |k: &str| std::env::var(k).ok();
    let outcome = match read {
        Err(e) => Err(CniError::new(Code::Io, "cannot read the network config", format!("stdin: {e}"))),
        Ok(_) => run(&get, &stdin),
    };
    let (json, code) = match outcome {
        Ok(None) => return ExitCode::SUCCESS,
        Ok(Some(json)) => (json, ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("edgevx-ipam: {e}");
            (e.to_json(&version), ExitCode::FAILURE)
        }
    };
    let mut out = std::io::stdout().lock();
    let text = json.to_string();
    if writeln!(out, "{text}").is_err() {
        return ExitCode::FAILURE;
    }
    code
}

fn installed(r: Result<String, install::InstallError>) -> ExitCode {
    match r {
        Ok(at) => {
            eprintln!("edgevx-ipam: installed {at}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("edgevx-ipam: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One invocation; the JSON to print, if the command prints any.
fn run(get: &impl Fn(&str) -> Option<String>, stdin: &[u8]) -> Result<Option<serde_json::Value>, CniError> {
    let command = env::command(get)?;
    if command == Command::Version {
        let asked = config::version_of(stdin).unwrap_or_else(|| wire::LATEST.to_string());
        return Ok(Some(wire::version_json(&asked)));
    }
    let conf = NetConf::parse(stdin)?;
    if matches!(command, Command::Gc | Command::Status) && !wire::has_gc_and_status(&conf.cni_version) {
        return Err(CniError::new(
            Code::IncompatibleVersion,
            "incompatible CNI version",
            format!("{command:?} needs cniVersion 1.1.0, the config has {}", conf.cni_version),
        ));
    }
    match command {
        Command::Add => {
            let att = env::attachment(get, true)?;
            let pod = env::pod(get)?;
            // before the lock, so a bad path costs no reservation
            let dns = conf.resolv_conf.as_deref().map(dns::read).transpose()?.unwrap_or_default();
            let store = Store::open_locked(&conf.store_dir())?;
            let mut ledger = Ledger::load(&store, conf.retain)?;
            let ips = add::add(&mut ledger, &conf.range_sets, &pod, &att)?;
            store.commit()?;
            Ok(Some(IpamResult { ips, routes: conf.routes.clone(), dns }.to_json(&conf.cni_version)))
        }
        Command::Del => {
            let att = env::attachment(get, false)?;
            let store = Store::open_locked(&conf.store_dir())?;
            let mut ledger = Ledger::for_release(&store, &att.container_id, &att.ifname)?;
            release::del(&mut ledger, &att)?;
            store.commit()?;
            Ok(None)
        }
        Command::Check => {
            let att = env::attachment(get, true)?;
            let store = Store::open_locked(&conf.store_dir())?;
            inspect::check(&store.reservations()?, &conf.range_sets, &att)?;
            Ok(None)
        }
        Command::Gc => {
            let valid = conf.valid_attachments.clone().ok_or_else(|| {
                CniError::new(Code::InvalidConfig, "invalid network config", "GC without cni.dev/valid-attachments")
            })?;
            let store = Store::open_locked(&conf.store_dir())?;
            let mut ledger = Ledger::load(&store, conf.retain)?;
            let released = release::gc(&mut ledger, &valid)?;
            store.commit()?;
            for ip in released {
                ledger::log(format_args!("GC released {ip}"));
            }
            Ok(None)
        }
        Command::Status => {
            let store = Store::open_read_only(&conf.store_dir());
            let records = identity::load(&store)?;
            inspect::status(&store.reservations()?, &records.unreadable, &conf.range_sets)?;
            Ok(None)
        }
        // answered before the config is parsed
        Command::Version => Ok(Some(wire::version_json(&conf.cni_version))),
    }
}
