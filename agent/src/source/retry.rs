//! How a source waits before it tries its control plane again: exponential
//! back-off with jitter, from backon (the crate kube-runtime's watcher
//! backs off with). Jitter matters at the edge: when a site's uplink comes
//! back, every node of it retries at once, and a plain doubling keeps them
//! in step against the API server or etcd.
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Delays from `min`, doubling up to `max`, each plus a random share of
/// itself (backon's jitter: up to the delay again), with no end.
pub fn delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default().with_min_delay(min).with_max_delay(max).with_jitter().without_max_times().build()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn delays_double_to_the_cap_each_with_its_own_jitter() {
        let (min, max) = (Duration::from_millis(500), Duration::from_secs(10));
        let mut base = min;
        for (i, d) in delays(min, max).take(12).enumerate() {
            assert!(d >= base && d <= base * 2, "delay {i}: {d:?} outside [{base:?}, {:?}]", base * 2);
            base = (base * 2).min(max);
        }
        // a site's nodes starting together do not retry together
        let firsts: BTreeSet<Duration> = (0..50).map(|_| delays(min, max).next().unwrap_or_default()).collect();
        assert!(firsts.len() > 10, "jitter gave {} distinct first delays of 50", firsts.len());
    }
}
