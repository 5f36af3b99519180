//! inotify on a file's directory: the file itself may be replaced (editors
//! write a new file and rename it over the old one; `kubectl cp`, ConfigMap
//! mounts swap a `..data` symlink), which a watch on the file would miss.
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use futures::{FutureExt, StreamExt};
use inotify::{EventMask, EventStream, Inotify, WatchMask};

pub struct DirWatch {
    dir: PathBuf,
    events: EventStream<Vec<u8>>,
}

fn mask() -> WatchMask {
    WatchMask::CLOSE_WRITE
        | WatchMask::MODIFY
        | WatchMask::ATTRIB
        | WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

impl DirWatch {
    /// Watches the directory that holds `file`.
    pub fn new(file: &Path) -> Result<Self> {
        let dir = match file.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let inotify = Inotify::init().context("cannot start inotify")?;
        inotify.watches().add(&dir, mask()).with_context(|| format!("cannot watch {} with inotify", dir.display()))?;
        let events = inotify.into_event_stream(vec![0; 4096]).context("cannot read inotify events")?;
        Ok(DirWatch { dir, events })
    }

    /// Waits for the next change in the directory. If the directory itself
    /// went away the watch is set up again on its path (or, failing that,
    /// this returns at once and the caller's slow stat takes over).
    pub async fn changed(&mut self) {
        match self.events.next().await {
            Some(Ok(e)) if e.mask.contains(EventMask::IGNORED) => self.rewatch(),
            Some(_) => {}
            None => self.rewatch(),
        }
    }

    /// Consumes the events already queued (one read covers them all).
    pub fn drain(&mut self) {
        while let Some(Some(e)) = self.events.next().now_or_never() {
            if matches!(e, Ok(ev) if ev.mask.contains(EventMask::IGNORED)) {
                self.rewatch();
            }
        }
    }

    fn rewatch(&mut self) {
        if let Ok(w) = DirWatch::new(&self.dir.join("x")) {
            *self = w;
        }
    }
}
