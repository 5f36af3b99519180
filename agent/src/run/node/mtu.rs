//! The VTEP's MTU follows the underlay's while the agent runs.
use anyhow::{Context, Result};
use tracing::{info, warn};

use super::Node;
use crate::{dataplane::device, netconf::NetConf, state::StateDir};

/// Says when `Backend.MTU` was capped to what the underlay carries (at
/// bring-up, and whenever the VTEP's MTU is set again).
pub(super) fn warn_if_capped(conf: &NetConf, underlay_mtu: u32, vtep_mtu: u32) {
    if let Some(backend) = crate::run::config::capped(conf, underlay_mtu) {
        warn!(
            backend_mtu = backend,
            underlay_mtu,
            vtep_mtu,
            "Backend.MTU is above the underlay's MTU; the VTEP uses what the underlay carries (kernel VXLAN would \
             fragment the outer packets, edgevx's encap does not)"
        );
    }
}

impl Node {
    /// Keeps the VTEP's MTU at what the underlay carries once encapsulated
    /// (`config::vtep_mtu`), as the kernel holds it: after the underlay's MTU
    /// changed, or someone set the VTEP's by hand. Frames bigger than the
    /// new MTU then meet the kernel's own forwarding before the VTEP, which
    /// fragments them (DF clear) or answers "fragmentation needed" (DF set),
    /// instead of the encap program's last-resort drop. subnet.env follows,
    /// for the pods the CNI plugin sets up from now on.
    pub(in crate::run) async fn follow_mtu(
        &mut self,
        conf: &NetConf,
        underlay_mtu: u32,
        state: &StateDir,
    ) -> Result<()> {
        if let Some(v6) = &mut self.v6 {
            v6.follow_mtu(&self.handle, conf, underlay_mtu).await?;
            self.record.v6 = Some(v6.record.clone());
        }
        // IPv6-only: subnet.env follows the IPv6 VTEP
        let want = match (&self.record.v4, self.vtep_index) {
            (Some(v4), Some(index)) => {
                let want = crate::run::config::vtep_mtu::<ipnet::Ipv4Net>(conf, underlay_mtu);
                let link = device::link_by_name(&self.handle, &v4.vtep_device)
                    .await?
                    .with_context(|| format!("{} is gone", v4.vtep_device))?;
                let have = device::link_mtu(&link);
                if have != Some(want) {
                    warn_if_capped(conf, underlay_mtu, want);
                    device::set_mtu(&self.handle, index, want).await?;
                    info!(device = %v4.vtep_device, underlay_mtu, was = ?have, mtu = want,
                        "VTEP MTU set to what the underlay carries once encapsulated");
                }
                want
            }
            _ => match &self.record.v6 {
                Some(v6) => v6.mtu,
                None => return Ok(()),
            },
        };
        if self.record.mtu != want {
            // recorded only once subnet.env says it, so a failed write is retried
            super::write_subnet_env(&crate::state::AgentRecord { mtu: want, ..self.record.clone() })?;
            self.record.mtu = want;
            // best effort: status and the next start read it (records.rs)
            state.save_agent(&self.record);
        }
        Ok(())
    }
}
