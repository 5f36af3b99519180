//! The VTEP's MTU follows the underlay's while the agent runs.
use anyhow::Result;
use ipnet::{Ipv4Net, Ipv6Net};
use tracing::warn;

use super::{Node, side::SideFamily};
use crate::{netconf::NetConf, state::StateDir};

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
        let mtu6 = self.follow_side_mtu::<Ipv6Net>(conf, underlay_mtu).await?;
        // IPv6-only: subnet.env follows the IPv6 VTEP
        let Some(want) = self.follow_side_mtu::<Ipv4Net>(conf, underlay_mtu).await?.or(mtu6) else { return Ok(()) };
        if self.record.mtu != want {
            // recorded only once subnet.env says it, so a failed write is retried
            super::write_subnet_env(&crate::state::AgentRecord { mtu: want, ..self.record.clone() })?;
            self.record.mtu = want;
            // best effort: status and the next start read it (records.rs)
            state.save_agent(&self.record);
        }
        Ok(())
    }

    /// The family's VTEP MTU, set to what the underlay carries and
    /// recorded (`None`: the family is off).
    async fn follow_side_mtu<N: SideFamily>(&mut self, conf: &NetConf, underlay_mtu: u32) -> Result<Option<u32>> {
        let (Some(side), Some(vtep)) = (N::side(&self.sides), N::vtep(&self.record)) else { return Ok(None) };
        let mtu = side.follow_mtu(&self.handle, &vtep, conf, underlay_mtu).await?;
        N::set_mtu(&mut self.record, mtu);
        Ok(Some(mtu))
    }
}
