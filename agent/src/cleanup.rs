//! `edgevx cleanup`: undo everything `edgevx run` did on this host.
use std::fs;

use anyhow::{Context, Result};
use tracing::info;

use crate::{
    cli::CleanupArgs,
    dataplane::{bpffs::PinDir, device, loader},
    state::{AGENT_FILE, MAC_FILE, PEERS_FILE, StateDir},
};

pub async fn run(args: CleanupArgs) -> Result<()> {
    let state = StateDir(args.paths.state_dir.clone());
    let rec = state.load_agent().unwrap_or(None);
    let pins = PinDir::new(&args.paths.bpffs);
    for name in loader::PROGRAMS {
        if loader::detach_pinned(&pins, name)? {
            info!(program = name, "detached");
        }
        loader::remove_pin(&pins.prog(name))?;
    }
    for name in edgevx_common::maps::ALL {
        loader::remove_pin(&pins.map(name))?;
    }
    for dir in [pins.root.join("links"), pins.root.join("progs"), pins.maps(), pins.root.clone()] {
        let _ = fs::remove_dir(&dir);
    }
    if let Some(rec) = &rec {
        let (conn, handle, _) = rtnetlink::new_connection().context("cannot open a netlink socket")?;
        tokio::spawn(conn);
        if device::delete_link(&handle, &rec.vtep_device).await? {
            info!(device = %rec.vtep_device, "deleted (its routes went with it)");
        }
        match fs::remove_file(&rec.subnet_file) {
            Ok(()) => info!(path = %rec.subnet_file.display(), "removed"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("cannot remove {}", rec.subnet_file.display()));
            }
        }
    }
    // our firewall chains, whatever flags the last run had
    match crate::netfilter::Firewall::new() {
        Ok(fw) => {
            if fw.remove_all().context("cannot remove the firewall rules")? {
                info!("removed edgevx's iptables chains");
            }
        }
        Err(e) => info!("no iptables here, so no firewall rules to remove: {e:#}"),
    }
    let mut files = vec![AGENT_FILE, PEERS_FILE, crate::cache::VIEW_FILE];
    if args.purge_mac {
        files.push(MAC_FILE);
    }
    for f in files {
        let _ = fs::remove_file(state.path(f));
    }
    if !args.purge_mac && state.path(MAC_FILE).exists() {
        info!(path = %state.path(MAC_FILE).display(), "kept the VTEP MAC so the next start reuses it (--purge-mac removes it)");
    }
    Ok(())
}
