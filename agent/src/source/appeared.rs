//! When a Node appeared: its `metadata.creationTimestamp`, set by the API
//! server (a node cannot choose it), as Unix seconds. The API server
//! writes it in RFC 3339 in UTC with a `Z` and no fraction
//! (`2026-11-28T15:26:14Z`, metav1.Time's form); anything else is not
//! read, and the entry's age is then unknown.
use serde_json::Value;

/// The Node's creationTimestamp in Unix seconds, if it has one in the API
/// server's form.
pub fn node_appeared(node: &Value) -> Option<i64> {
    node.pointer("/metadata/creationTimestamp").and_then(Value::as_str).and_then(unix_seconds)
}

/// `YYYY-MM-DDTHH:MM:SSZ` as seconds since 1970-01-01T00:00:00Z.
fn unix_seconds(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' || b[19] != b'Z'
    {
        return None;
    }
    let num = |at: usize, len: usize| -> Option<i64> {
        let s = text.get(at..at + len)?;
        s.bytes().all(|c| c.is_ascii_digit()).then(|| s.parse().ok())?
    };
    let (y, m, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hh, mm, ss) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    Some(days_from_civil(y, m, d) * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_servers_timestamps_are_read() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_seconds("2026-11-28T15:26:14Z"), Some(1_795_879_574));
        assert!(unix_seconds("2026-11-28T15:26:14Z") < unix_seconds("2026-11-28T15:26:15Z"));
        for bad in ["", "2026-11-28", "2026-11-28T15:26:14+01:00", "2026-13-28T15:26:14Z", "2026-11-28T15:2a:14Z"] {
            assert_eq!(unix_seconds(bad), None, "{bad}");
        }
        let node = serde_json::json!({"metadata": {"creationTimestamp": "1970-01-02T00:00:01Z"}});
        assert_eq!(node_appeared(&node), Some(86_401));
        assert_eq!(node_appeared(&serde_json::json!({"metadata": {}})), None);
    }
}
