//! The local pods: the bridge program attached to the pod bridge whenever
//! it (re)appears, and the pods the programs may deliver to, learned from
//! the kernel.
use anyhow::Result;
use aya::programs::TcAttachType;
use edgevx_common::maps::LocalPod;
use tracing::warn;

use super::Node;
use crate::dataplane::{device, loader, local_pods};

impl Node {
    /// Attaches the bridge program to the pod bridge if it is there and not
    /// attached yet; returns the bridge's ifindex while it is attached.
    async fn ensure_bridge_program(&mut self) -> Option<u32> {
        let index = match device::ifindex(&self.record.pod_bridge) {
            Ok(Some(index)) => index,
            Ok(None) => {
                self.bridge = None;
                return None;
            }
            // cannot be asked (out of descriptors): what was attached stays attached
            Err(e) => {
                warn!(bridge = %self.record.pod_bridge, "cannot look up the pod bridge, keeping what is attached: {e}");
                return self.bridge;
            }
        };
        let mode = self.record.attach;
        let on = |attached: Result<bool>| match attached {
            Ok(on) => on,
            Err(e) => {
                warn!(bridge = %self.record.pod_bridge, "cannot tell whether the bridge program is attached, keeping it: {e:#}");
                true
            }
        };
        if self.bridge == Some(index)
            && on(loader::attached_as(
                mode,
                &self.handle,
                &self.pins,
                loader::BRIDGE,
                &self.record.pod_bridge,
                TcAttachType::Egress,
            )
            .await)
        {
            return Some(index);
        }
        let ebpf = self.loaded.as_mut()?;
        match loader::attach_as(mode, ebpf, &self.pins, loader::BRIDGE, &self.record.pod_bridge, TcAttachType::Egress) {
            Ok(()) => {
                self.bridge = Some(index);
                Some(index)
            }
            Err(e) => {
                warn!(bridge = %self.record.pod_bridge, "cannot attach to the pod bridge: {e:#}");
                self.bridge = None;
                None
            }
        }
    }

    /// Learns the local pods from the kernel and puts in the map those the
    /// programs may deliver to. In the default mode that is a pod behind a
    /// bridge our program is attached to (so the decapsulated GSO packets
    /// reach its port whole), or a pod on a routed veth of its own.
    /// IPv6-only: nothing, the kernel delivers IPv6.
    pub(in crate::run) async fn learn_pods(&mut self) {
        let Some(subnet) = self.own.subnet.filter(|_| self.pending.is_none() && self.sides.v4.is_some()) else {
            return; // not attached yet, or no IPv4
        };
        let bridge = self.ensure_bridge_program().await;
        let bypass = self.record.bypass_netfilter;
        match local_pods::discover(&self.handle, subnet).await {
            Ok(learned) => {
                let pods: std::collections::BTreeMap<[u8; 4], LocalPod> = learned
                    .into_iter()
                    .filter(|(_, l)| bypass || l.bridge.is_none() || l.bridge == bridge)
                    .map(|(ip, l)| (ip, l.pod))
                    .collect();
                if let Err(e) = self.maps.sync_local_pods(&pods) {
                    warn!("cannot update local pods: {e:#}");
                }
            }
            Err(e) => warn!("cannot learn local pods: {e:#}"),
        }
    }
}
