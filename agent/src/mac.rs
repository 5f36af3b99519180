//! VTEP MAC addresses in flannel's text form (`aa:bb:cc:dd:ee:ff`).
use std::{fmt, fs::File, io::Read, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A unicast Ethernet address used as a VXLAN tunnel endpoint MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VtepMac(pub [u8; 6]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MacError {
    #[error("{0:?} is not a MAC address (want six colon-separated hex bytes)")]
    Syntax(String),
    #[error("{0} is a multicast address, not usable as a VTEP MAC")]
    Multicast(String),
    #[error("00:00:00:00:00:00 is not usable as a VTEP MAC")]
    Zero,
}

impl VtepMac {
    /// A random locally administered unicast MAC, as flannel makes one
    /// (first byte: clear the multicast bit, set the local bit).
    pub fn random() -> std::io::Result<Self> {
        let mut b = [0u8; 6];
        File::open("/dev/urandom")?.read_exact(&mut b)?;
        b[0] = (b[0] & 0xfe) | 0x02;
        Ok(VtepMac(b))
    }
}

impl FromStr for VtepMac {
    type Err = MacError;
    fn from_str(s: &str) -> Result<Self, MacError> {
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(|| MacError::Syntax(s.to_string()))?;
            if part.len() != 2 {
                return Err(MacError::Syntax(s.to_string()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| MacError::Syntax(s.to_string()))?;
        }
        if parts.next().is_some() {
            return Err(MacError::Syntax(s.to_string()));
        }
        if out == [0; 6] {
            return Err(MacError::Zero);
        }
        if out[0] & 1 == 1 {
            return Err(MacError::Multicast(s.to_string()));
        }
        Ok(VtepMac(out))
    }
}

impl fmt::Display for VtepMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

impl Serialize for VtepMac {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VtepMac {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_flannel_form() {
        let m: VtepMac = "9E:c9:07:f9:b3:8b".parse().unwrap();
        assert_eq!(m.to_string(), "9e:c9:07:f9:b3:8b");
    }

    #[test]
    fn rejects_bad_input() {
        for bad in
            ["", "9e:c9:07:f9:b3", "9e:c9:07:f9:b3:8b:00", "9e-c9-07-f9-b3-8b", "zz:c9:07:f9:b3:8b", "9e:c9:7:f9:b3:8b"]
        {
            assert!(matches!(bad.parse::<VtepMac>(), Err(MacError::Syntax(_))), "{bad}");
        }
        assert_eq!("00:00:00:00:00:00".parse::<VtepMac>(), Err(MacError::Zero));
        assert!(matches!("01:00:5e:00:00:01".parse::<VtepMac>(), Err(MacError::Multicast(_))));
    }

    #[test]
    fn random_is_local_unicast() {
        for _ in 0..64 {
            let m = VtepMac::random().unwrap();
            assert_eq!(m.0[0] & 0x03, 0x02);
        }
    }
}
