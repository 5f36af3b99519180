//! The event program behind `edgevx monitor` (ebpf/src/monitor.rs): a drop
//! point tail-calls it through the one-slot program array while a monitor
//! watches. Loaded with the others and put in the slot at every load, so
//! the slot always holds the event program of the object the attached
//! programs came from. The array is pinned, as the kernel empties a
//! program array's slots when its last user-space reference goes, and is
//! made anew at every load (`loader::load` removes the old pin first).
//!
//! It is attached nowhere; should the slot be empty, a drop point drops
//! without an event, as when nobody watches.
use anyhow::{Context, Result};
use aya::maps::ProgramArray;
use edgevx_common::monitor::{EVENT_PROGRAM, MON_PROGS};

use crate::dataplane::{loaded::Loaded, refused};

/// Loads the event program (once) and puts it in the drop points' slot.
pub fn arm(ebpf: &mut Loaded) -> Result<()> {
    let prog = ebpf.classifier(EVENT_PROGRAM)?;
    if prog.fd().is_err() {
        prog.load().map_err(|e| refused::refused(EVENT_PROGRAM, e))?;
    }
    let fd = prog
        .fd()
        .with_context(|| format!("{EVENT_PROGRAM} has no descriptor after its load"))?
        .try_clone()
        .with_context(|| format!("cannot duplicate {EVENT_PROGRAM}'s descriptor"))?;
    let map = ebpf.map_mut(MON_PROGS).with_context(|| format!("map {MON_PROGS} is missing from the eBPF object"))?;
    let mut slots = ProgramArray::try_from(map).with_context(|| format!("map {MON_PROGS} is not a program array"))?;
    slots.set(0, &fd, 0).with_context(|| format!("cannot put {EVENT_PROGRAM} in {MON_PROGS}"))
}
