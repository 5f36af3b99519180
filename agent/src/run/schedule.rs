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
    Check,
    /// The local pods (their veths and neighbours).
    Learn,
    /// The reconcile pass: bring-up, the peers, the rules, the attach.
    Pass,
}

pub(super) const JOBS: [Job; 3] = [Job::Check, Job::Learn, Job::Pass];

/// Which jobs to run again, and how soon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[must_use]
pub(super) struct Asks {
    check: Option<Duration>,
    learn: Option<Duration>,
    pass: Option<Duration>,
}

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
        JOBS.iter().fold(Asks::nothing(), |a, j| a.and(*j, Duration::ZERO))
    }

    /// These asks and `job` after `after` (the sooner wins).
    pub(super) fn and(mut self, job: Job, after: Duration) -> Self {
        let slot = self.slot(job);
        *slot = Some(slot.map_or(after, |a| a.min(after)));
        self
    }

    /// Both asks (the sooner wins for each job).
    pub(super) fn with(self, other: Asks) -> Self {
        JOBS.iter().fold(self, |a, j| match other.get(*j) {
            Some(after) => a.and(*j, after),
            None => a,
        })
    }

    fn get(&self, job: Job) -> Option<Duration> {
        match job {
            Job::Check => self.check,
            Job::Learn => self.learn,
            Job::Pass => self.pass,
        }
    }

    fn slot(&mut self, job: Job) -> &mut Option<Duration> {
        match job {
            Job::Check => &mut self.check,
            Job::Learn => &mut self.learn,
            Job::Pass => &mut self.pass,
        }
    }
}

/// When each job is due; the loop sleeps until the earliest.
#[derive(Debug, Default)]
pub(super) struct Due {
    check: Option<Instant>,
    learn: Option<Instant>,
    pass: Option<Instant>,
}

impl Due {
    /// Takes `asks` as of `now`: a job already due sooner stays so.
    pub(super) fn ask(&mut self, asks: Asks, now: Instant) {
        for job in JOBS {
            if let Some(after) = asks.get(job) {
                let at = now + after;
                let slot = self.slot(job);
                if slot.is_none_or(|t| at < t) {
                    *slot = Some(at);
                }
            }
        }
    }

    /// The earliest due job's time, if any is due.
    pub(super) fn next(&self) -> Option<Instant> {
        [self.check, self.learn, self.pass].into_iter().flatten().min()
    }

    /// `job` if it is due by `now`, taken off the schedule.
    pub(super) fn take(&mut self, job: Job, now: Instant) -> bool {
        let slot = self.slot(job);
        let ripe = slot.is_some_and(|t| t <= now);
        if ripe {
            *slot = None;
        }
        ripe
    }

    fn slot(&mut self, job: Job) -> &mut Option<Instant> {
        match job {
            Job::Check => &mut self.check,
            Job::Learn => &mut self.learn,
            Job::Pass => &mut self.pass,
        }
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
