//! A program the kernel's verifier refused, said in one line: the
//! program, the error and the verifier's last lines. The verifier's whole
//! log (370 lines for `edgevx_decap` on Debian 11's 5.10.0-30) is logged
//! once per distinct log and program, not again at every retry of a
//! bring-up that keeps failing the same way; a refusal met again in a row
//! asks for a longer wait before the next try ([`Refused::retry_after`]).
//!
//! A verifier's verdict does not change while the kernel and the object
//! stay the same, so retrying every second only repeats it.
use std::{
    collections::BTreeMap,
    hash::{DefaultHasher, Hash, Hasher},
    io,
    sync::Mutex,
    time::Duration,
};

use aya::programs::ProgramError;
use tracing::{debug, error};

/// How many of the verifier's last lines the one-line error keeps: the
/// instruction it stopped at and why.
const TAIL_LINES: usize = 2;
/// Longer lines are cut (a register state can run to 2,000 characters).
const LINE_MAX: usize = 200;
/// The longest wait [`Refused::retry_after`] asks for.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// The verifier refused `program`: `Display` is one line, for a log line
/// at every retry; the whole log went to the log once (see [`refused`]).
#[derive(Debug, thiserror::Error)]
#[error("the verifier refused {program} ({errno}): {tail}")]
pub struct Refused {
    pub program: String,
    errno: String,
    /// The verifier's last lines, joined.
    tail: String,
    /// How many times in a row this program was refused with this same log (1: news).
    in_a_row: u32,
}

impl Refused {
    /// Whether this log is new for this program (its whole log was logged now).
    pub fn is_new(&self) -> bool {
        self.in_a_row == 1
    }

    /// How long to wait before trying again: 1 s the first time, twice as
    /// long at each same refusal in a row, at most 5 minutes.
    pub fn retry_after(&self) -> Duration {
        let doublings = self.in_a_row.saturating_sub(1).min(16);
        Duration::from_secs(1u64 << doublings).min(RETRY_MAX)
    }
}

/// What the verifier last said about each program, by digest.
#[derive(Default)]
struct Refusals {
    seen: BTreeMap<String, Seen>,
}

struct Seen {
    digest: u64,
    in_a_row: u32,
}

impl Refusals {
    /// Records a refusal of `program` with `log`, returned when it is news;
    /// `None` when the kernel said nothing (no log: not the verifier's
    /// verdict, but EPERM, ENOMEM and the like).
    fn news(&mut self, program: &str, errno: &io::Error, log: String) -> Option<(Refused, Option<String>)> {
        if log.trim().is_empty() {
            return None;
        }
        let refused = self.note(program, errno, &log);
        let news = refused.is_new().then_some(log);
        Some((refused, news))
    }

    /// Records that `program` was refused with `log`.
    fn note(&mut self, program: &str, errno: &io::Error, log: &str) -> Refused {
        let digest = digest(log);
        let seen = self.seen.entry(program.to_string()).or_insert(Seen { digest, in_a_row: 0 });
        if seen.digest != digest {
            *seen = Seen { digest, in_a_row: 0 };
        }
        seen.in_a_row = seen.in_a_row.saturating_add(1);
        Refused { program: program.to_string(), errno: errno.to_string(), tail: tail(log), in_a_row: seen.in_a_row }
    }
}

/// Kept for the process: bring-up is retried from the top, with a new
/// `Ebpf` each time, so nothing the loader returns outlives a try.
static REFUSALS: Mutex<Refusals> = Mutex::new(Refusals { seen: BTreeMap::new() });

/// A load error of `program` as the error to return: a verifier refusal
/// becomes a [`Refused`], its whole log logged (at `error`) only when it
/// differs from the last one for this program; any other error is kept.
pub fn refused(program: &'static str, e: ProgramError) -> anyhow::Error {
    match remember(program, e) {
        Ok((refused, Some(log))) => {
            error!(
                program,
                "the verifier refused {program}; its whole log follows, logged again only when it changes:\n{log}"
            );
            refused.into()
        }
        Ok((refused, None)) => refused.into(),
        Err(e) => anyhow::Error::new(e).context(format!("cannot load {program}")),
    }
}

/// [`refused`] for a program loaded without aya (kfunc/by_hand.rs): the
/// kernel's error and the verifier's log as they came.
pub fn refused_with_log(program: &str, io_error: io::Error, log: String) -> anyhow::Error {
    let mut refusals = REFUSALS.lock().unwrap_or_else(|p| p.into_inner());
    match refusals.news(program, &io_error, log) {
        Some((refused, Some(log))) => {
            error!(
                program,
                "the verifier refused {program}; its whole log follows, logged again only when it changes:\n{log}"
            );
            refused.into()
        }
        Some((refused, None)) => refused.into(),
        None => anyhow::Error::new(io_error).context(format!("cannot load {program} (BPF_PROG_LOAD)")),
    }
}

/// The same for a refusal the caller expects and falls back from (the
/// full socket-lookup guard before 5.17): the whole log only at `debug`.
pub fn expected(program: &'static str, e: ProgramError) -> anyhow::Error {
    match remember(program, e) {
        Ok((refused, Some(log))) => {
            debug!(program, "the verifier refused {program}; its whole log:\n{log}");
            refused.into()
        }
        Ok((refused, None)) => refused.into(),
        Err(e) => anyhow::Error::new(e).context(format!("cannot load {program}")),
    }
}

/// A verifier refusal (an error with a log) recorded, with its log when
/// that is news; any other error back.
fn remember(program: &'static str, e: ProgramError) -> Result<(Refused, Option<String>), ProgramError> {
    let ProgramError::LoadError { io_error, verifier_log } = e else { return Err(e) };
    // a poisoned lock still holds what was seen
    let mut refusals = REFUSALS.lock().unwrap_or_else(|p| p.into_inner());
    match refusals.news(program, &io_error, verifier_log.to_string()) {
        Some(found) => Ok(found),
        None => Err(ProgramError::LoadError { io_error, verifier_log }),
    }
}

/// The verifier's statistics at the end of its log, which say nothing of
/// why (and the time differs at every try).
fn is_statistics(line: &str) -> bool {
    ["verification time", "stack depth", "processed ", "max_states_per_insn"].iter().any(|s| line.starts_with(s))
}

/// A register-state dump (`R0=... R10=fp0 ...`) or a `from 364 to 636:`
/// branch line: the state, not the instruction or the reason.
fn is_state(line: &str) -> bool {
    let mut chars = line.chars();
    (chars.next() == Some('R') && chars.next().is_some_and(|c| c.is_ascii_digit())) || line.starts_with("from ")
}

/// The log's last lines that say where and why: not the statistics, the
/// register states or the source lines (`; ...`).
fn tail(log: &str) -> String {
    let mut lines: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !is_statistics(l) && !is_state(l) && !l.starts_with(';'))
        .rev()
        .take(TAIL_LINES)
        .collect();
    lines.reverse();
    let cut = |l: &str| match l.char_indices().nth(LINE_MAX) {
        Some((at, _)) => format!("{}...", &l[..at]),
        None => l.to_string(),
    };
    lines.into_iter().map(cut).collect::<Vec<_>>().join(" / ")
}

/// The log's digest, without what changes from one try to the next: the
/// verification time and kernel addresses (a map's, in `r1 = 0xffff...`).
fn digest(log: &str) -> u64 {
    let mut h = DefaultHasher::new();
    for line in log.lines().filter(|l| !l.starts_with("verification time")) {
        for word in line.split_whitespace() {
            let address = word.len() >= 18 && word.starts_with("0xffff");
            if address { "0xKERNEL" } else { word }.hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of 5.10.0-30's refusal of `edgevx_decap`, as it logged it.
    const LOG_5_10_0_30: &str = "\
; #[classifier]
0: (bf) r6 = r1
5: (18) r1 = 0xffff971fffe50200
7: (85) call bpf_map_lookup_elem#1
; h[0] == VXLAN_FLAG_VNI && h[1] == 0 && h[2] == 0 && h[3] == 0 && h[7] == 0
724: (15) if r6 == 0x800 goto pc+1
 R0_w=inv1 R1=inv(id=0,umax_value=255,var_off=(0x0; 0xff)) R10=fp0 fp-8=??????mm fp-280=mmmmmmmm
725: (b7) r0 = 0
726: (79) r2 = *(u64 *)(r10 -288)
invalid read from stack off -288+0 size 8
verification time 218033 usec
stack depth 448
processed 1666 insns (limit 1000000) max_states_per_insn 3 total_states 94 peak_states 94 mark_read 13
";

    fn eacces() -> io::Error {
        io::Error::from_raw_os_error(libc::EACCES)
    }

    #[test]
    fn the_error_is_one_line_naming_the_program_and_the_verifiers_reason() {
        let r = Refusals::default().note("edgevx_decap", &eacces(), LOG_5_10_0_30);
        let line = r.to_string();
        assert_eq!(
            line,
            "the verifier refused edgevx_decap (Permission denied (os error 13)): \
             726: (79) r2 = *(u64 *)(r10 -288) / invalid read from stack off -288+0 size 8"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn the_same_log_again_is_no_news_and_waits_longer_each_time() {
        let mut seen = Refusals::default();
        let first = seen.note("edgevx_decap", &eacces(), LOG_5_10_0_30);
        assert!(first.is_new());
        assert_eq!(first.retry_after(), Duration::from_secs(1));
        // the next try: another verification time and map address, the same refusal
        let again =
            LOG_5_10_0_30.replace("218033 usec", "201877 usec").replace("0xffff971fffe50200", "0xffff971fffe51e00");
        let waits: Vec<u64> = (0..12)
            .map(|_| seen.note("edgevx_decap", &eacces(), &again))
            .map(|r| {
                assert!(!r.is_new(), "{r}");
                r.retry_after().as_secs()
            })
            .collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300, 300]);
        // another program's refusal is news of its own, and does not make the first one news again
        assert!(seen.note("edgevx_guard", &eacces(), "invalid bpf_context access off=64 size=4\n").is_new());
        assert!(!seen.note("edgevx_decap", &eacces(), LOG_5_10_0_30).is_new());
        // a different log for the same program is news, and starts the waits again
        let other = LOG_5_10_0_30.replace("-288", "-296");
        let changed = seen.note("edgevx_decap", &eacces(), &other);
        assert!(changed.is_new());
        assert_eq!(changed.retry_after(), Duration::from_secs(1));
    }

    #[test]
    fn a_long_line_is_cut_and_a_short_log_is_kept_whole() {
        let long = format!("{}\nR0=inv0\n", "x".repeat(500));
        let t = tail(&long);
        assert_eq!(t.len(), LINE_MAX + 3, "{t}");
        assert_eq!(tail("only line\n"), "only line");
    }

    #[test]
    fn an_error_without_a_verifier_log_is_not_a_refusal_and_a_log_is_handed_out_once() {
        let mut seen = Refusals::default();
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert!(seen.news("edgevx_decap", &eperm, " \n".into()).is_none());
        let (_, log) = seen.news("edgevx_decap", &eacces(), LOG_5_10_0_30.into()).expect("a refusal");
        assert_eq!(log.as_deref(), Some(LOG_5_10_0_30), "news: the whole log, to be logged");
        let (again, log) = seen.news("edgevx_decap", &eacces(), LOG_5_10_0_30.into()).expect("a refusal");
        assert_eq!(log, None, "the same log is not logged again");
        assert!(again.to_string().ends_with("invalid read from stack off -288+0 size 8"), "{again}");
    }
}
