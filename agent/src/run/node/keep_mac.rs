//! The VTEP MAC is what peers cannot relearn while they are cut off: their
//! arp and fdb entries hold it. It is observed like the VTEP's MTU, and a
//! MAC changed by hand (`ip link set flannel.1 address …`) is put back.
use anyhow::{Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use rtnetlink::{Handle, LinkUnspec};
use tracing::warn;

use super::{Node, side::SideFamily};
use crate::{dataplane::device, mac::VtepMac};

impl Node {
    /// Puts the recorded MAC back on each VTEP whose MAC differs.
    pub(in crate::run) async fn keep_macs(&self) -> Result<()> {
        self.keep_mac::<Ipv4Net>().await?;
        self.keep_mac::<Ipv6Net>().await
    }

    /// The family's VTEP, if on, gets its recorded MAC back.
    async fn keep_mac<N: SideFamily>(&self) -> Result<()> {
        let (Some(side), Some(vtep)) = (N::side(&self.sides), N::vtep(&self.record)) else { return Ok(()) };
        put_back(&self.handle, vtep.device, side.index, vtep.mac).await
    }
}

/// `ip link set DEV address MAC` when DEV (still `index`) has another MAC.
async fn put_back(handle: &Handle, device: &str, index: u32, want: VtepMac) -> Result<()> {
    let Some(link) = device::link_by_name(handle, device).await? else { return Ok(()) };
    if link.header.index != index {
        return Ok(()); // re-created: the intact check rebuilds it with the MAC
    }
    let have = device::link_mac(&link);
    if have.as_deref() == Some(&want.0[..]) {
        return Ok(());
    }
    let msg = LinkUnspec::new_with_index(index).address(want.0.to_vec()).build();
    handle.link().set(msg).execute().await.with_context(|| format!("cannot put the MAC {want} back on {device}"))?;
    let was = have.map(|m| m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":"));
    warn!(device, was = ?was, mac = %want,
        "the VTEP's MAC had been changed; put back the one peers know (their entries hold it)");
    Ok(())
}
