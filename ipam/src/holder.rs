//! Who holds a reserved address: the content of its file in host-local's
//! format, and the two ways of matching it to an attachment.
//!
//! An attachment is (container ID, interface), as in host-local, which
//! writes `<containerID>\r\n<ifname>`: one container has one address per
//! interface and range set. host-local before v0.8.0 (and OpenYurt's patch
//! of v0.7.4) wrote only the container ID. Such a bare ID is matched two
//! ways:
//! - [`Holder::is`], host-local's `GetByID`/`ReleaseByID` match, for DEL and
//!   CHECK: a bare ID matches every interface of its container. Those
//!   plugins wrote bare IDs for whatever interface they served (a second
//!   network's store holds `net1`'s), so taking one as any single interface
//!   would leak it on DEL; and a runtime deletes every interface of a
//!   sandbox when it goes.
//! - [`Holder::is_attachment`], for handing addresses out: a bare ID is the
//!   container's [`LEGACY_IFNAME`], the pod's only interface when those
//!   plugins ran, so an ADD of another interface never gets it as its own.
/// The interface a holder or pod record without one is taken to be: the
/// one kubelet's CNI config gives every pod.
pub const LEGACY_IFNAME: &str = "eth0";

/// Who holds a reserved address, from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// `<containerID>\r\n<ifname>`, or a bare container ID (`ifname` None).
    Attachment { container_id: String, ifname: Option<String> },
    /// Empty: host-local's unsynced write torn by a power cut. Nobody's,
    /// but taken, as host-local also treats it.
    Torn,
    /// A name of an address that cannot be read ([`crate::entry`]): a
    /// directory, a FIFO, a link, an I/O error. Taken, as host-local also
    /// finds it taken (its `O_EXCL` create fails), and never released: no
    /// DEL matches it and GC leaves it, since nobody can say it is free.
    Unreadable,
}

impl Holder {
    pub fn parse(content: &str) -> Holder {
        let t = content.trim();
        if t.is_empty() || t.chars().all(|c| c == '\0') {
            return Holder::Torn;
        }
        match t.split_once("\r\n") {
            Some((id, ifname)) => Holder::Attachment { container_id: id.to_string(), ifname: Some(ifname.to_string()) },
            None => Holder::Attachment { container_id: t.to_string(), ifname: None },
        }
    }

    /// host-local's `ReleaseByID` match: the exact pair, or a legacy bare
    /// ID (any interface of the container). For DEL and CHECK.
    pub fn is(&self, container_id: &str, ifname: &str) -> bool {
        match self {
            Holder::Attachment { container_id: id, ifname: Some(i) } => id == container_id && i == ifname,
            Holder::Attachment { container_id: id, ifname: None } => id == container_id,
            Holder::Torn | Holder::Unreadable => false,
        }
    }

    /// The exact attachment, a bare ID taken as [`LEGACY_IFNAME`]. For ADD.
    pub fn is_attachment(&self, container_id: &str, ifname: &str) -> bool {
        self.container_id() == Some(container_id) && self.ifname() == Some(ifname)
    }

    pub fn container_id(&self) -> Option<&str> {
        match self {
            Holder::Attachment { container_id, .. } => Some(container_id),
            Holder::Torn | Holder::Unreadable => None,
        }
    }

    /// The interface, a bare ID's taken as [`LEGACY_IFNAME`].
    pub fn ifname(&self) -> Option<&str> {
        match self {
            Holder::Attachment { ifname, .. } => Some(ifname.as_deref().unwrap_or(LEGACY_IFNAME)),
            Holder::Torn | Holder::Unreadable => None,
        }
    }
}

/// The content host-local writes for an attachment.
pub fn holder_content(container_id: &str, ifname: &str) -> String {
    format!("{}\r\n{ifname}", container_id.trim())
}

/// An interface as a pod record stores it: empty (a record migrated from
/// OpenYurt by an earlier version) or absent is [`LEGACY_IFNAME`].
pub fn ifname_or_legacy(ifname: &str) -> &str {
    if ifname.is_empty() { LEGACY_IFNAME } else { ifname }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_reads_both_formats() {
        assert_eq!(
            Holder::parse("abc\r\neth0"),
            Holder::Attachment { container_id: "abc".into(), ifname: Some("eth0".into()) }
        );
        assert!(Holder::parse("abc\r\neth0").is("abc", "eth0"));
        assert!(!Holder::parse("abc\r\neth0").is("abc", "eth1"));
        assert_eq!(Holder::parse(""), Holder::Torn);
        assert_eq!(Holder::parse("\0\0\0"), Holder::Torn);
    }

    #[test]
    fn a_bare_id_is_any_interface_to_release_and_eth0_to_hand_out() {
        let bare = Holder::parse("abc\n");
        assert!(bare.is("abc", "eth0") && bare.is("abc", "net1"), "DEL of any interface releases it, as host-local");
        assert!(bare.is_attachment("abc", "eth0"));
        assert!(!bare.is_attachment("abc", "net1"), "an ADD of net1 must not take eth0's address as its own");
        assert_eq!(bare.ifname(), Some("eth0"));
    }

    #[test]
    fn a_pair_is_its_own_interface_only() {
        let net1 = Holder::parse("abc\r\nnet1");
        assert!(net1.is_attachment("abc", "net1"));
        assert!(!net1.is_attachment("abc", "eth0"));
        assert!(!net1.is_attachment("abd", "net1"));
        for nobody in [Holder::Torn, Holder::Unreadable] {
            assert!(!nobody.is("abc", "eth0") && !nobody.is_attachment("abc", "eth0"));
            assert_eq!(nobody.container_id(), None);
        }
    }
}
