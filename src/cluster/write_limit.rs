//! How many writes go at once. The limit starts at `--write-concurrency`,
//! halves when the API server throttles a write (429) and grows back by
//! one for each round of writes that go through (additive increase,
//! multiplicative decrease, as TCP does), so that writes use the capacity
//! the API server's priority level gives them instead of queueing behind
//! refusals. Only writes sent after the last cut can cut it again: the
//! refusals of one burst count once.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// The state behind its lock; a panic elsewhere while it was held leaves
/// plain numbers, still usable. (Local, so that this module depends on
/// nothing of the operator's state: the writer, below it, uses it.)
fn lock(state: &Mutex<LimitState>) -> MutexGuard<'_, LimitState> {
    crate::sync::lock(state)
}

/// The limit's state; plain data, tested without a runtime.
#[derive(Debug)]
struct LimitState {
    max: f64,
    limit: f64,
    in_flight: usize,
    /// Writes let through so far (each permit's ticket).
    sent: u64,
    /// `sent` when the limit was last cut.
    cut_at: u64,
}

impl LimitState {
    fn new(max: usize) -> Self {
        let max = max.max(1) as f64;
        Self {
            max,
            limit: max,
            in_flight: 0,
            sent: 0,
            cut_at: 0,
        }
    }

    /// Writes allowed in flight now.
    fn allowed(&self) -> usize {
        (self.limit as usize).max(1)
    }

    /// A ticket for one more write, if the limit allows it.
    fn take(&mut self) -> Option<u64> {
        (self.in_flight < self.allowed()).then(|| {
            self.in_flight += 1;
            self.sent += 1;
            self.sent
        })
    }

    fn throttled(&mut self, ticket: u64) {
        if ticket > self.cut_at {
            self.limit = (self.limit / 2.0).max(1.0);
            self.cut_at = self.sent;
        }
    }

    fn succeeded(&mut self) {
        self.limit = (self.limit + 1.0 / self.limit).min(self.max);
    }
}

/// The writes in flight, within a limit that follows the API server's
/// answers.
pub(crate) struct WriteLimit {
    state: Mutex<LimitState>,
    /// A write ended or the limit grew: waiters look again.
    freed: Notify,
}

/// One write's place in flight; given back when dropped. Tell it how the
/// write went: that moves the limit.
pub(crate) struct WritePermit<'a> {
    owner: &'a WriteLimit,
    ticket: u64,
}

impl WriteLimit {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            state: Mutex::new(LimitState::new(max)),
            freed: Notify::new(),
        }
    }

    /// Wait for a place in flight.
    pub(crate) async fn acquire(&self) -> WritePermit<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a place freed meanwhile wakes it.
            freed.as_mut().enable();
            if let Some(ticket) = lock(&self.state).take() {
                return WritePermit {
                    owner: self,
                    ticket,
                };
            }
            freed.await;
        }
    }

    /// Writes allowed in flight now.
    pub(crate) fn allowed(&self) -> usize {
        lock(&self.state).allowed()
    }
}

impl WritePermit<'_> {
    /// The API server throttled this write (429).
    pub(crate) fn throttled(&self) {
        lock(&self.owner.state).throttled(self.ticket);
    }

    /// The API server took this write.
    pub(crate) fn succeeded(&self) {
        let grew = {
            let mut state = lock(&self.owner.state);
            let before = state.allowed();
            state.succeeded();
            state.allowed() > before
        };
        if grew {
            self.owner.freed.notify_waiters();
        }
    }
}

impl Drop for WritePermit<'_> {
    fn drop(&mut self) {
        lock(&self.owner.state).in_flight -= 1;
        self.owner.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_refusals_halves_the_limit_once() {
        let mut state = LimitState::new(16);
        let tickets: Vec<u64> = (0..16).filter_map(|_| state.take()).collect();
        assert_eq!(tickets.len(), 16);
        assert_eq!(state.take(), None, "the limit holds");
        // Every write of the burst is refused: one cut, not sixteen.
        for ticket in &tickets {
            state.throttled(*ticket);
        }
        assert_eq!(state.allowed(), 8);
        // A write sent after the cut and refused cuts again.
        state.in_flight = 0;
        let later = state.take().expect("room");
        state.in_flight -= 1;
        state.throttled(later);
        assert_eq!(state.allowed(), 4);
        for _ in 0..10 {
            let ticket = state.take().expect("room");
            state.in_flight -= 1;
            state.throttled(ticket);
        }
        assert_eq!(state.allowed(), 1, "never below one");
    }

    #[test]
    fn successes_grow_the_limit_back_by_one_per_round_up_to_the_setting() {
        let mut state = LimitState::new(8);
        state.limit = 2.0;
        // About one more for a round of as many successes as the limit.
        let mut successes = 0;
        while state.allowed() < 3 {
            state.succeeded();
            successes += 1;
        }
        assert_eq!(successes, 3, "a round at 2, then one more at 2.9");
        for _ in 0..1000 {
            state.succeeded();
        }
        assert_eq!(state.allowed(), 8, "never above --write-concurrency");
    }

    #[tokio::test]
    async fn a_waiting_write_goes_when_one_in_flight_ends() {
        let limit = std::sync::Arc::new(WriteLimit::new(1));
        let first = limit.acquire().await;
        let waiter = {
            let limit = limit.clone();
            tokio::spawn(async move {
                let _second = limit.acquire().await;
            })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one write at a time");
        drop(first);
        waiter.await.expect("the second write goes");
    }
}
