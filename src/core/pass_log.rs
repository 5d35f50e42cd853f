//! Which line a rule's pass logs, so that a rule that keeps failing for one
//! reason logs about once a minute however many copies fail and however
//! many passes run: a line when it starts failing or the reason changes,
//! then "still failing" once a minute with the writes made meanwhile, and
//! one when it recovers. Pure data, no I/O; time is passed in.

use std::time::Duration;

use tokio::time::Instant;

/// An unchanged failure is logged again after this long.
pub(crate) const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Writes a pass made (or passes made since the last line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) created: u32,
    pub(crate) updated: u32,
    pub(crate) deleted: u32,
    /// Handed over to their namespaces (`deletionPolicy` Orphan).
    pub(crate) orphaned: u32,
}

impl Written {
    pub(crate) fn any(self) -> bool {
        self.created + self.updated + self.deleted + self.orphaned > 0
    }

    fn add(&mut self, other: Written) {
        self.created += other.created;
        self.updated += other.updated;
        self.deleted += other.deleted;
        self.orphaned += other.orphaned;
    }
}

/// What a failing rule's last line said, and what it has not said since.
#[derive(Clone, Debug)]
pub(crate) struct FailureLog {
    /// The reason (a failure class) it is failing for.
    reason: &'static str,
    logged_at: Instant,
    unlogged: Written,
}

/// The line a pass logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// At info: a pass that wrote and fails nothing.
    Pass(Written),
    /// At info: the rule starts failing, or fails for another reason.
    Failing(Written),
    /// At info: the same failure a minute on, with the writes since.
    StillFailing(Written),
    /// At info: nothing fails any more; the writes since the last line.
    Recovered(Written),
    /// At debug: nothing new to say.
    Quiet,
}

/// The line for a pass that wrote `written` and leaves copies failing for
/// `reason` (`None`: nothing fails), given what the rule's last lines said
/// (`state`, updated).
pub(crate) fn line(
    state: &mut Option<FailureLog>,
    reason: Option<&'static str>,
    written: Written,
    now: Instant,
) -> Line {
    let Some(reason) = reason else {
        return match state.take() {
            Some(mut log) => {
                log.unlogged.add(written);
                Line::Recovered(log.unlogged)
            }
            None if written.any() => Line::Pass(written),
            None => Line::Quiet,
        };
    };
    match state {
        Some(log) if log.reason == reason => {
            log.unlogged.add(written);
            if now.duration_since(log.logged_at) < FAILURE_LOG_EVERY {
                return Line::Quiet;
            }
            log.logged_at = now;
            Line::StillFailing(std::mem::take(&mut log.unlogged))
        }
        _ => {
            *state = Some(FailureLog {
                reason,
                logged_at: now,
                unlogged: Written::default(),
            });
            Line::Failing(written)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: Written = Written {
        created: 1,
        updated: 0,
        deleted: 0,
        orphaned: 0,
    };

    #[test]
    fn a_permanent_refusal_logs_once_a_minute_whatever_the_passes() {
        let mut state = None;
        let start = Instant::now();
        let mut info = 0;
        // Ten minutes of passes every 100 ms, each writing one copy of the
        // rule's others (events keep coming) while the same refusal stays.
        let mut now = start;
        while now < start + Duration::from_secs(600) {
            if line(&mut state, Some("refused"), ONE, now) != Line::Quiet {
                info += 1;
            }
            now += Duration::from_millis(100);
        }
        assert!((10..=11).contains(&info), "{info} lines in ten minutes");
        // The writes made meanwhile are told, not lost.
        let mut later = now + FAILURE_LOG_EVERY;
        let Line::StillFailing(told) = line(&mut state, Some("refused"), ONE, later) else {
            panic!("a minute on");
        };
        assert!(told.created >= 590, "{told:?}");
        later += Duration::from_millis(100);
        let quiet = line(&mut state, Some("refused"), ONE, later);
        assert_eq!(quiet, Line::Quiet);
        assert_eq!(
            line(&mut state, None, ONE, later),
            Line::Recovered(Written {
                created: 2,
                ..Written::default()
            }),
            "the recovery is told with the writes since the last line"
        );
        assert_eq!(
            line(&mut state, None, Written::default(), later),
            Line::Quiet
        );
        assert_eq!(line(&mut state, None, ONE, later), Line::Pass(ONE));
    }

    #[test]
    fn another_reason_is_a_new_line_at_once() {
        let mut state = None;
        let now = Instant::now();
        assert_eq!(
            line(&mut state, Some("refused"), Written::default(), now),
            Line::Failing(Written::default())
        );
        assert_eq!(
            line(&mut state, Some("refused"), Written::default(), now),
            Line::Quiet
        );
        assert_eq!(
            line(&mut state, Some("throttled"), ONE, now),
            Line::Failing(ONE)
        );
    }
}
