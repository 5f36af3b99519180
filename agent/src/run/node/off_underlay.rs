//! Peers' VXLAN refused because it arrived off the underlay
//! (`drop_vxlan_off_underlay`) is most often a multi-homed node's routing,
//! not an attack: say so in the log when the count moves.
use edgevx_common::counters::Counter;
use tracing::warn;

use super::Node;

impl Node {
    /// Warns when the count moved since the last look (bring-up takes the
    /// first: an earlier run warned about what it saw).
    pub(in crate::run) fn warn_off_underlay(&mut self) {
        let Ok(Some(now)) = self.maps.counter(Counter::DropVxlanOffUnderlay) else { return };
        let Some(seen) = self.off_underlay_seen.replace(now) else { return };
        if now > seen {
            warn!(
                dropped = now - seen,
                underlay = %self.record.iface,
                "peers' VXLAN arrived on an interface other than the underlay and was dropped \
                 (drop_vxlan_off_underlay): only the underlay's decap judges it whole. Make peers reach this \
                 node's public IP through its underlay, or choose the interface they arrive on with --iface"
            );
        }
    }
}
