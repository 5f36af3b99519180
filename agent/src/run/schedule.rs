//! When each of the loop's jobs runs next. A job, an event or a timer
//! answers with [`Asks`] (kube-runtime's `Action`: "run me again after
//! this long"), and the loop sleeps until the earliest due job. The loop
//! decides nothing else.
use std::time::{Duration, Instant};

/// The loop's jobs, in the order they run when several are due at once:
/// the underlay and the VTEP are checked before the pods are learnt, and
/// both before a pass programs anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Job {
    /// The underlay, the VTEP's MTU and MAC, and the dataplane's integrity.
    Check = 0,
    /// The local pods (their veths and neighbours).
    Learn = 1,
    /// The reconcile pass: bring-up, the peers, the rules, the attach.
    Pass = 2,
}

pub(super) const JOBS: [Job; 3] = [Job::Check, Job::Learn, Job::Pass];

/// Which jobs to run again, and how soon (by [`Job`], in [`JOBS`]' order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub(super) struct Asks([Option<Duration>; 3]);

impl Asks {
    /// Nothing more is due.
    pub(super) fn nothing() -> Self {
        Asks::default()
    }

    /// `job` again after `after`.
    pub(super) fn run(job: Job, after: Duration) -> Self {
        Asks::nothing().and(job, after)
    }

    /// Every job, now.
    pub(super) fn everything() -> Self {
        Asks([Some(Duration::ZERO); 3])
    }

    /// These asks and `job` after `after` (the sooner wins).
    pub(super) fn and(mut self, job: Job, after: Duration) -> Self {
        let slot = &mut self.0[job as usize];
        *slot = Some(slot.map_or(after, |a| a.min(after)));
        self
    }

    /// Both asks (the sooner wins for each job).
    pub(super) fn with(self, other: Asks) -> Self {
        JOBS.iter().fold(self, |a, j| match other.0[*j as usize] {
            Some(after) => a.and(*j, after),
            None => a,
        })
    }
}

/// When each job is due (by [`Job`]); the loop sleeps until the earliest.
#[derive(Debug, Default)]
pub(super) struct Due([Option<Instant>; 3]);

impl Due {
    /// Takes `asks` as of `now`: a job already due sooner stays so.
    pub(super) fn ask(&mut self, asks: Asks, now: Instant) {
        for (slot, after) in self.0.iter_mut().zip(asks.0) {
            if let Some(at) = after.map(|a| now + a)
                && slot.is_none_or(|t| at < t)
            {
                *slot = Some(at);
            }
        }
    }

    /// The earliest due job's time, if any is due.
    pub(super) fn next(&self) -> Option<Instant> {
        self.0.iter().flatten().min().copied()
    }

    /// `job` if it is due by `now`, taken off the schedule.
    pub(super) fn take(&mut self, job: Job, now: Instant) -> bool {
        self.0[job as usize].take_if(|t| *t <= now).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_sooner_ask_wins_and_a_later_one_never_delays_a_due_job() {
        let now = Instant::now();
        let mut due = Due::default();
        due.ask(Asks::run(Job::Pass, 30 * MS), now);
        due.ask(Asks::run(Job::Pass, 1000 * MS), now);
        assert_eq!(due.next(), Some(now + 30 * MS));
        due.ask(Asks::run(Job::Pass, Duration::ZERO), now);
        assert_eq!(due.next(), Some(now));
    }

    #[test]
    fn a_job_is_taken_once_when_ripe_and_not_before() {
        let now = Instant::now();
        let mut due = Due::default();
        due.ask(Asks::run(Job::Check, 30 * MS).and(Job::Learn, Duration::ZERO), now);
        assert!(due.take(Job::Learn, now));
        assert!(!due.take(Job::Learn, now), "taken off the schedule");
        assert!(!due.take(Job::Check, now), "not yet");
        assert!(due.take(Job::Check, now + 30 * MS));
        assert_eq!(due.next(), None, "nothing left");
    }

    #[test]
    fn everything_asks_every_job_now_and_with_merges_the_sooner() {
        let now = Instant::now();
        let mut due = Due::default();
        due.ask(Asks::everything(), now);
        assert!(JOBS.iter().all(|j| due.take(*j, now)));
        let merged = Asks::run(Job::Pass, 5 * MS).with(Asks::run(Job::Pass, MS).and(Job::Check, 7 * MS));
        assert_eq!(merged, Asks::run(Job::Pass, MS).and(Job::Check, 7 * MS));
        assert_eq!(Asks::nothing().with(Asks::nothing()), Asks::nothing());
    }
}
