//! What a damaged pod record still says. A record is written whole (a
//! temporary file, fsync, rename), but a power cut on a filesystem or card
//! that does not keep its promises leaves one empty, NUL-filled or cut
//! short. Left unreadable it would hold its address for nobody, forever,
//! and its pod would silently get another one.
//!
//! [`salvage`] reads a cut-short record field by field, as far as each is
//! whole. The pod (namespace and name, both complete and well-formed) is
//! what makes a record: without it nothing says whose the address is, and
//! the record is released (moved aside, see `identity::repair`).
use crate::identity::{PodRecord, PodRef};

/// The string value of `"key":"…"` in `text`, if it is there whole and
/// made of characters a Kubernetes name or a container ID may have.
fn string_field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let start = text.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let rest = &text[start..];
    let end = rest.find('"')?;
    let value = &rest[..end];
    let tame = value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b':'));
    tame.then_some(value)
}

/// `"key":<digits>` followed by `,` or `}` (so the number is whole).
fn number_field(text: &str, key: &str) -> Option<u64> {
    let start = text.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &text[start..];
    let end = rest.find([',', '}'])?;
    rest[..end].trim().parse().ok()
}

/// The record `bytes` still holds, if its pod can be read whole. Fields
/// cut off are left empty (the container ID, the interface: the caller
/// fills them from the reservation) or `None` (the release time: the
/// ledger then counts the retention from now).
pub fn salvage(bytes: &[u8]) -> Option<PodRecord> {
    let text = std::str::from_utf8(bytes).ok().or_else(|| {
        // cut inside a multi-byte character: the whole part before it
        let valid = std::str::from_utf8(bytes).err()?.valid_up_to();
        std::str::from_utf8(&bytes[..valid]).ok()
    })?;
    let namespace = string_field(text, "namespace").filter(|s| !s.is_empty())?;
    let name = string_field(text, "name").filter(|s| !s.is_empty())?;
    Some(PodRecord {
        pod: PodRef { namespace: namespace.to_string(), name: name.to_string() },
        container_id: string_field(text, "containerID").unwrap_or_default().to_string(),
        ifname: string_field(text, "ifname").unwrap_or_default().to_string(),
        previous_container_id: string_field(text, "previousContainerID").map(str::to_string),
        released_at_ns: number_field(text, "releasedAtNs"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole() -> PodRecord {
        PodRecord {
            pod: PodRef { namespace: "default".into(), name: "web-0".into() },
            container_id: "0123abcd".into(),
            ifname: "eth0".into(),
            previous_container_id: None,
            released_at_ns: Some(1_700_000_000_000_000_000),
        }
    }

    #[test]
    fn a_record_cut_anywhere_after_its_pod_keeps_the_pod() {
        let json = serde_json::to_string(&whole()).unwrap();
        let pod_end = json.find("web-0\"").unwrap() + "web-0\"".len();
        for cut in 0..=json.len() {
            let got = salvage(&json.as_bytes()[..cut]);
            if cut < pod_end {
                assert_eq!(got, None, "cut at {cut}: {:?}", &json[..cut]);
                continue;
            }
            let got = got.unwrap_or_else(|| panic!("cut at {cut}: {:?}", &json[..cut]));
            assert_eq!(got.pod, whole().pod, "cut at {cut}");
            // a field is either whole or absent, never a prefix
            assert!(got.container_id.is_empty() || got.container_id == "0123abcd", "{got:?}");
            assert!(got.ifname.is_empty() || got.ifname == "eth0", "{got:?}");
            assert!(got.released_at_ns.is_none() || got.released_at_ns == whole().released_at_ns, "{got:?}");
        }
        assert_eq!(salvage(json.as_bytes()), Some(whole()));
    }

    #[test]
    fn empty_nul_filled_and_garbage_records_say_nothing() {
        for bad in
            [&b""[..], &[0u8; 120][..], b"\xff\xfe garbage", b"{\"pod\":{\"namespace\":\"a\\\"b\",\"name\":\"c\"}"]
        {
            assert_eq!(salvage(bad), None, "{bad:?}");
        }
    }
}
