//! `/healthz` and `/readyz`: what the kubelet's liveness and readiness
//! probes are answered, decided from the loop's report alone.
use std::time::Duration;

use super::report::Readiness;

/// The run loop ticks at least once a second (it re-learns local pods that
/// often); ten missed ticks mean it is stuck, not busy. A pass that programs
/// thousands of routes or waits on the xtables lock takes a few seconds.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// A probe's answer: an HTTP status and a line of text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub text: String,
}

/// Alive while the run loop ticked within [`STALE_AFTER`].
pub fn liveness(since_tick: Duration) -> Verdict {
    let secs = since_tick.as_secs_f64();
    if since_tick <= STALE_AFTER {
        Verdict { ok: true, text: format!("ok: the run loop ticked {secs:.1}s ago\n") }
    } else {
        Verdict { ok: false, text: format!("the run loop has not ticked for {secs:.1}s\n") }
    }
}

/// Ready only when the dataplane is; before the first bring-up the text
/// says what the agent waits for, if it waits for the host. A program the
/// last check found ahead of decap (`ahead`) makes a ready dataplane not
/// ready until a check finds decap first again: what it passed on went
/// unjudged to the VTEP, where it was dropped.
pub fn readiness(r: Readiness, waiting: Option<&str>, ahead: &[String]) -> Verdict {
    let text = match waiting {
        Some(what) if r == Readiness::Starting => format!("waiting for the host: {what}\n"),
        _ if r == Readiness::Ready && !ahead.is_empty() => format!(
            "not ready: found ahead of edgevx's decap on the underlay's ingress at the last check: {}; decap was \
             put back first, ready again when the next check finds it first\n",
            ahead.join("; ")
        ),
        _ => format!("{}\n", r.reason()),
    };
    Verdict { ok: r == Readiness::Ready && ahead.is_empty(), text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_heartbeat_is_unhealthy() {
        assert!(liveness(Duration::from_millis(900)).ok);
        assert!(liveness(STALE_AFTER).ok);
        let v = liveness(STALE_AFTER + Duration::from_secs(1));
        assert!(!v.ok);
        assert!(v.text.contains("has not ticked for 11.0s"), "{}", v.text);
    }

    #[test]
    fn only_ready_is_ready() {
        for r in [Readiness::Starting, Readiness::NotAttached, Readiness::Rebuilding] {
            assert!(!readiness(r, None, &[]).ok, "{r:?}");
        }
        assert_eq!(readiness(Readiness::Ready, None, &[]), Verdict { ok: true, text: "ready\n".into() });
    }

    #[test]
    fn a_program_ahead_of_decap_makes_a_ready_node_not_ready_and_is_named() {
        let v = readiness(Readiness::Ready, None, &["id 42 name observe".into()]);
        assert!(!v.ok);
        assert!(v.text.contains("ahead of edgevx's decap") && v.text.contains("id 42 name observe"), "{}", v.text);
        assert!(readiness(Readiness::Ready, None, &[]).ok);
    }

    #[test]
    fn waiting_for_the_host_is_said_until_the_first_bring_up() {
        let v = readiness(Readiness::Starting, Some("no IPv4 default route"), &[]);
        assert_eq!(v, Verdict { ok: false, text: "waiting for the host: no IPv4 default route\n".into() });
        assert_eq!(readiness(Readiness::Ready, Some("stale"), &[]).text, "ready\n");
    }
}
