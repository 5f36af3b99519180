//! The XDP judge, put on the underlay once decap is attached
//! (`dataplane/xdp.rs`): never fatal, its record says what became of it.
use rtnetlink::packet_route::link::{InfoKind, LinkAttribute, LinkInfo};
use tracing::warn;

use super::Node;
use crate::{
    dataplane::{
        device,
        xdp::{self, XDP_FILE},
    },
    state::StateDir,
};

impl Node {
    /// Attaches the XDP judge to the underlay as `--xdp-judge` says (or
    /// takes an earlier run's off), and records the outcome for `edgevx status`.
    pub(in crate::run) async fn attach_xdp_judge(&mut self, state: &StateDir) {
        let iface = self.record.iface.clone();
        let veth = match device::link_by_name(&self.handle, &iface).await {
            Ok(link) => link.is_some_and(|l| {
                l.attributes.iter().any(|a| {
                    matches!(a, LinkAttribute::LinkInfo(infos)
                        if infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Veth))))
                })
            }),
            Err(e) => {
                warn!("cannot tell the underlay's driver, the XDP judge is left alone: {e:#}");
                return;
            }
        };
        let Some(ebpf) = self.loaded.as_mut() else { return };
        let record = xdp::apply(ebpf, &self.pins, &iface, self.record.xdp_judge, veth);
        // best effort (records.rs)
        state.save_record(XDP_FILE, &record);
    }
}
