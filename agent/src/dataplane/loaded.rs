//! The eBPF object as loaded: aya's `Ebpf` (every map, and the programs aya
//! loads) and the programs loaded beside it by hand, those that call a
//! kfunc in a module's BTF (kfunc/by_hand.rs). aya 0.16 takes no program
//! into an `Ebpf`, so the two are kept together here and a program is
//! asked for by name from either.
use std::ops::{Deref, DerefMut};

use anyhow::{Context, Result};
use aya::{Ebpf, programs::SchedClassifier};

pub struct Loaded {
    ebpf: Ebpf,
    by_hand: Vec<(String, SchedClassifier)>,
}

impl Loaded {
    pub fn new(ebpf: Ebpf, by_hand: Vec<(String, SchedClassifier)>) -> Self {
        Loaded { ebpf, by_hand }
    }

    /// Whether program `name` was loaded by hand (and must not be loaded by aya).
    pub fn by_hand(&self, name: &str) -> bool {
        self.by_hand.iter().any(|(n, _)| n == name)
    }

    /// TC program `name`: the hand-loaded one, else aya's.
    pub fn classifier(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        if let Some(i) = self.by_hand.iter().position(|(n, _)| n == name) {
            return Ok(&mut self.by_hand[i].1);
        }
        self.ebpf
            .program_mut(name)
            .with_context(|| format!("program {name} is missing from the eBPF object"))?
            .try_into()
            .with_context(|| format!("program {name} is not a classifier"))
    }

    /// [`Self::classifier`], to read (a test run, say).
    pub fn classifier_ref(&self, name: &str) -> Result<&SchedClassifier> {
        if let Some((_, prog)) = self.by_hand.iter().find(|(n, _)| n == name) {
            return Ok(prog);
        }
        self.ebpf
            .program(name)
            .with_context(|| format!("program {name} is missing from the eBPF object"))?
            .try_into()
            .with_context(|| format!("program {name} is not a classifier"))
    }
}

/// The maps and aya's programs, as before.
impl Deref for Loaded {
    type Target = Ebpf;
    fn deref(&self) -> &Ebpf {
        &self.ebpf
    }
}

impl DerefMut for Loaded {
    fn deref_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }
}
