//! The last good view from a control plane, kept in the state dir so a node
//! that starts cut off from the cloud can bring its dataplane back at once.
use anyhow::Result;

use crate::{peer::Desired, state::StateDir};

pub const VIEW_FILE: &str = "last-view.json";

impl StateDir {
    pub fn load_view(&self) -> Result<Option<Desired>> {
        self.load_json(VIEW_FILE)
    }

    pub fn save_view(&self, view: &Desired) -> Result<()> {
        self.save_json(VIEW_FILE, view)
    }
}
