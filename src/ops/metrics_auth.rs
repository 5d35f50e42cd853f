//! Who may read /metrics when `--metrics-auth` is on: a caller whose
//! bearer token the API server accepts (a TokenReview) and who may `get`
//! the non-resource URL `/metrics` (a SubjectAccessReview), as the API
//! server's own /metrics is guarded. The metrics name every rule and every
//! member cluster; tenants have no business reading them.
//!
//! Whoever reaches the port may send any token, and each new one costs
//! the operator a review, sent as the operator: in its own share of the
//! API server's capacity (API Priority and Fairness), beside its writes.
//! So what a caller can make it ask is bounded:
//!
//! - Answers are kept for a minute, by a digest of the token (the token
//!   itself is not kept), so that a scrape every few seconds costs two
//!   reviews a minute. At most [`KEPT_AT_MOST`] answers are kept of each
//!   class, the oldest dropped first: the tokens the API server refused
//!   apart from the callers it knows, so that made-up tokens never push
//!   out a scraper's answer.
//! - Concurrent requests with one token share one review: the first asks,
//!   the others wait for its answer.
//! - At most `--max-metrics-reviews` reviews are in flight; a caller with
//!   a token under review by nobody gets 503 past that bound, and costs
//!   nothing.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ring::digest::{SHA256, digest};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::ops::metrics::Metrics;

/// How long an answer is kept.
const KEPT_FOR: Duration = Duration::from_secs(60);
/// Answers kept at most, per class (a flood of made-up tokens forgets the
/// oldest, not grows).
const KEPT_AT_MOST: usize = 1024;

/// What a caller of /metrics is let do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// Authenticated, but may not get /metrics: 403.
    Forbidden,
    Allowed,
    /// The reviews could not be asked: 503, and nothing kept.
    Unavailable,
    /// `--max-metrics-reviews` reviews are in flight already: 503, and
    /// nothing asked.
    Busy,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Unauthenticated => "unauthenticated",
            Verdict::Forbidden => "forbidden",
            Verdict::Allowed => "allowed",
            Verdict::Unavailable => "unavailable",
            Verdict::Busy => "busy",
        }
    }
}

/// A token as it is kept: its SHA-256.
type TokenDigest = [u8; 32];

fn token_digest(token: &str) -> TokenDigest {
    let mut key = [0u8; 32];
    key.copy_from_slice(digest(&SHA256, token.as_bytes()).as_ref());
    key
}

/// Answers kept for [`KEPT_FOR`], at most `at_most` of them, the oldest
/// dropped first.
struct Kept {
    at_most: usize,
    /// Each token's answer, when it was given, and its place in `order`.
    by_token: HashMap<TokenDigest, (Instant, Verdict, u64)>,
    /// Tokens in the order their answers came; an entry whose place no
    /// longer matches `by_token` is stale and skipped.
    order: VecDeque<(TokenDigest, u64)>,
    next_place: u64,
}

impl Kept {
    fn new(at_most: usize) -> Self {
        Self {
            at_most,
            by_token: HashMap::new(),
            order: VecDeque::new(),
            next_place: 0,
        }
    }

    fn get(&self, token: &TokenDigest, now: Instant) -> Option<Verdict> {
        self.by_token
            .get(token)
            .filter(|(at, _, _)| now.duration_since(*at) < KEPT_FOR)
            .map(|(_, verdict, _)| *verdict)
    }

    fn insert(&mut self, token: TokenDigest, verdict: Verdict, now: Instant) {
        let place = self.next_place;
        self.next_place += 1;
        self.by_token.insert(token, (now, verdict, place));
        self.order.push_back((token, place));
        while let Some(&(oldest, oldest_place)) = self.order.front() {
            let current = self
                .by_token
                .get(&oldest)
                .map(|(at, _, place)| (*at, *place));
            let (expired, stale) = match current {
                Some((at, place)) => (now.duration_since(at) >= KEPT_FOR, place != oldest_place),
                None => (false, true),
            };
            if stale {
                self.order.pop_front();
            } else if expired || self.by_token.len() > self.at_most {
                self.order.pop_front();
                self.by_token.remove(&oldest);
            } else {
                break;
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_token.len()
    }
}

/// Asks the API server about a token (`cluster::token_reviews`); tests
/// answer from memory.
pub(crate) trait Reviewer: Send + Sync + 'static {
    fn review(&self, token: String) -> impl Future<Output = Verdict> + Send;
}

struct State {
    /// Answers for callers the API server knows (allowed or forbidden).
    authenticated: Kept,
    /// Answers for tokens it refused.
    unauthenticated: Kept,
    /// Reviews in flight, by token: their answer, once it comes.
    in_flight: HashMap<TokenDigest, watch::Receiver<Option<Verdict>>>,
}

/// The verdicts on callers of /metrics, asked of a [`Reviewer`] within
/// the bounds above.
pub(crate) struct Reviews<R: Reviewer> {
    reviewer: Arc<R>,
    max_in_flight: usize,
    metrics: Arc<Metrics>,
    state: Arc<Mutex<State>>,
}

/// Who may read /metrics, as the HTTP server asks it (its reviews are
/// asked of the API server by `cluster::token_reviews`).
pub(crate) trait Judge: Send + Sync + 'static {
    /// The verdict for a request with this `Authorization` header.
    fn verdict<'a>(
        &'a self,
        authorization: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Verdict> + Send + 'a>>;
}

impl<R: Reviewer> Judge for Reviews<R> {
    fn verdict<'a>(
        &'a self,
        authorization: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Verdict> + Send + 'a>> {
        Box::pin(self.judge(authorization))
    }
}

impl<R: Reviewer> Reviews<R> {
    /// Reviews asked of `reviewer`, at most `max_in_flight` at once.
    pub(crate) fn new(reviewer: R, max_in_flight: u32, metrics: Arc<Metrics>) -> Self {
        Self::with_reviewer(reviewer, max_in_flight as usize, metrics)
    }

    fn with_reviewer(reviewer: R, max_in_flight: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            reviewer: Arc::new(reviewer),
            max_in_flight: max_in_flight.max(1),
            metrics,
            state: Arc::new(Mutex::new(State {
                authenticated: Kept::new(KEPT_AT_MOST),
                unauthenticated: Kept::new(KEPT_AT_MOST),
                in_flight: HashMap::new(),
            })),
        }
    }

    /// The verdict for a request with this `Authorization` header.
    pub(crate) async fn judge(&self, authorization: Option<&str>) -> Verdict {
        let Some(token) = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Verdict::Unauthenticated;
        };
        let key = token_digest(token);
        let mut answer = {
            let mut state = crate::sync::lock(&self.state);
            let now = Instant::now();
            if let Some(verdict) = state
                .authenticated
                .get(&key, now)
                .or_else(|| state.unauthenticated.get(&key, now))
            {
                return verdict;
            }
            if let Some(answer) = state.in_flight.get(&key) {
                answer.clone()
            } else if state.in_flight.len() >= self.max_in_flight {
                self.metrics.metrics_reviews_busy.inc();
                return Verdict::Busy;
            } else {
                let (tell, answer) = watch::channel(None);
                state.in_flight.insert(key, answer.clone());
                self.spawn_review(key, token.to_owned(), tell);
                answer
            }
        };
        // The review runs apart from this request, so that a caller who
        // hangs up leaves the others waiting for it an answer.
        match answer.wait_for(Option::is_some).await {
            Ok(verdict) => verdict.unwrap_or(Verdict::Unavailable),
            Err(_) => Verdict::Unavailable,
        }
    }

    fn spawn_review(&self, key: TokenDigest, token: String, tell: watch::Sender<Option<Verdict>>) {
        let reviewer = self.reviewer.clone();
        let state = self.state.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            // Out of the in-flight set however the review ends (a panic
            // too): the set bounds reviews, and a stale entry would hold a
            // place forever.
            let mut pending = InFlight {
                state: &state,
                key,
                pending: true,
            };
            let verdict = reviewer.review(token).await;
            metrics
                .metrics_reviews
                .get_or_create(&crate::ops::metrics::VerdictLabels {
                    verdict: verdict.label(),
                })
                .inc();
            {
                let mut state = crate::sync::lock(&state);
                let now = Instant::now();
                match verdict {
                    Verdict::Allowed | Verdict::Forbidden => {
                        state.authenticated.insert(key, verdict, now);
                    }
                    Verdict::Unauthenticated => state.unauthenticated.insert(key, verdict, now),
                    Verdict::Unavailable | Verdict::Busy => {}
                }
                state.in_flight.remove(&key);
                // Removed with its answer kept, in one step: a request for
                // this token now finds the one or starts a review anew.
                pending.pending = false;
            }
            let _ = tell.send(Some(verdict));
        });
    }

    #[cfg(test)]
    fn kept(&self) -> (usize, usize) {
        let state = crate::sync::lock(&self.state);
        (state.authenticated.len(), state.unauthenticated.len())
    }
}

/// Removes a review that ended without an answer (its task panicked or
/// was aborted) from the in-flight set when dropped.
struct InFlight<'a> {
    state: &'a Mutex<State>,
    key: TokenDigest,
    pending: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.pending {
            crate::sync::lock(self.state).in_flight.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers from the token's text once the gate opens, counting
    /// what it was asked.
    struct Fake {
        asked: AtomicUsize,
        gate: watch::Receiver<bool>,
    }

    impl Reviewer for Fake {
        async fn review(&self, token: String) -> Verdict {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let _ = self.gate.clone().wait_for(|open| *open).await;
            match token.as_str() {
                "scraper" => Verdict::Allowed,
                "tenant" => Verdict::Forbidden,
                "down" => Verdict::Unavailable,
                "panics" => panic!("the review broke"),
                _ => Verdict::Unauthenticated,
            }
        }
    }

    fn reviews(max_in_flight: usize, open: bool) -> (Arc<Reviews<Fake>>, watch::Sender<bool>) {
        let (gate, opened) = watch::channel(open);
        let fake = Fake {
            asked: AtomicUsize::new(0),
            gate: opened,
        };
        let reviews = Reviews::with_reviewer(fake, max_in_flight, Arc::new(Metrics::default()));
        (Arc::new(reviews), gate)
    }

    fn asked(reviews: &Reviews<Fake>) -> usize {
        reviews.reviewer.asked.load(Ordering::SeqCst)
    }

    /// Lets every spawned task run as far as it can.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    fn judge_later(reviews: &Arc<Reviews<Fake>>, token: &str) -> tokio::task::JoinHandle<Verdict> {
        let reviews = reviews.clone();
        let header = format!("Bearer {token}");
        tokio::spawn(async move { reviews.judge(Some(&header)).await })
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_with_one_token_share_one_review() {
        let (reviews, gate) = reviews(4, false);
        let waiting: Vec<_> = (0..10).map(|_| judge_later(&reviews, "scraper")).collect();
        settle().await;
        assert_eq!(asked(&reviews), 1, "one review for ten requests");
        gate.send_replace(true);
        for request in waiting {
            assert_eq!(request.await.ok(), Some(Verdict::Allowed));
        }
        assert_eq!(
            reviews.judge(Some("Bearer scraper")).await,
            Verdict::Allowed
        );
        assert_eq!(asked(&reviews), 1, "and the answer is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_bound_a_new_token_is_busy_and_asks_nothing() {
        let (reviews, gate) = reviews(2, false);
        let first = judge_later(&reviews, "made-up-1");
        let second = judge_later(&reviews, "scraper");
        settle().await;
        assert_eq!(asked(&reviews), 2);
        assert_eq!(reviews.judge(Some("Bearer made-up-2")).await, Verdict::Busy);
        assert_eq!(asked(&reviews), 2, "a busy answer costs no review");
        assert_eq!(reviews.metrics.metrics_reviews_busy.get(), 1);
        // A token already under review waits for that review.
        let same = judge_later(&reviews, "scraper");
        settle().await;
        assert!(
            !same.is_finished(),
            "it waits rather than being turned away"
        );
        gate.send_replace(true);
        assert_eq!(first.await.ok(), Some(Verdict::Unauthenticated));
        assert_eq!(second.await.ok(), Some(Verdict::Allowed));
        assert_eq!(same.await.ok(), Some(Verdict::Allowed));
        assert_eq!(
            reviews.judge(Some("Bearer made-up-2")).await,
            Verdict::Unauthenticated,
            "with the reviews done, a new token is reviewed"
        );
        assert_eq!(asked(&reviews), 3);
    }

    #[test]
    fn the_oldest_answer_goes_first() {
        let now = Instant::now();
        let mut kept = Kept::new(3);
        let token = |n: u8| [n; 32];
        for n in 1..=4 {
            kept.insert(token(n), Verdict::Unauthenticated, now);
        }
        assert_eq!(kept.len(), 3);
        assert_eq!(kept.get(&token(1), now), None, "the oldest went");
        for n in 2..=4 {
            assert_eq!(kept.get(&token(n), now), Some(Verdict::Unauthenticated));
        }
        // Answered again, a token is the newest.
        kept.insert(token(2), Verdict::Unauthenticated, now);
        kept.insert(token(5), Verdict::Unauthenticated, now);
        assert_eq!(kept.get(&token(3), now), None);
        assert!(kept.get(&token(2), now).is_some());
        assert!(kept.order.len() <= 4, "stale places are dropped");
        // Expired answers are not served, and go at the next insert.
        let later = now + KEPT_FOR;
        assert_eq!(kept.get(&token(4), later), None);
        kept.insert(token(6), Verdict::Unauthenticated, later);
        assert_eq!(kept.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn made_up_tokens_never_push_out_a_caller_the_api_server_knows() {
        let (reviews, _gate) = reviews(4, true);
        assert_eq!(
            reviews.judge(Some("Bearer scraper")).await,
            Verdict::Allowed
        );
        assert_eq!(
            reviews.judge(Some("Bearer tenant")).await,
            Verdict::Forbidden
        );
        for n in 0..(KEPT_AT_MOST + 500) {
            let made_up = format!("Bearer made-up-{n}");
            assert_eq!(
                reviews.judge(Some(&made_up)).await,
                Verdict::Unauthenticated
            );
        }
        assert_eq!(reviews.kept(), (2, KEPT_AT_MOST));
        let before = asked(&reviews);
        assert_eq!(
            reviews.judge(Some("Bearer scraper")).await,
            Verdict::Allowed
        );
        assert_eq!(
            reviews.judge(Some("Bearer tenant")).await,
            Verdict::Forbidden
        );
        assert_eq!(asked(&reviews), before, "both answers were still kept");
        // A minute on, the scraper is asked about again.
        tokio::time::advance(KEPT_FOR).await;
        assert_eq!(
            reviews.judge(Some("Bearer scraper")).await,
            Verdict::Allowed
        );
        assert_eq!(asked(&reviews), before + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_review_that_fails_or_breaks_is_not_kept_and_frees_its_place() {
        let (reviews, _gate) = reviews(1, true);
        assert_eq!(
            reviews.judge(Some("Bearer down")).await,
            Verdict::Unavailable
        );
        assert_eq!(
            reviews.judge(Some("Bearer down")).await,
            Verdict::Unavailable
        );
        assert_eq!(asked(&reviews), 2, "an unavailable answer is asked again");
        assert_eq!(
            reviews.judge(Some("Bearer panics")).await,
            Verdict::Unavailable
        );
        assert_eq!(
            reviews.judge(Some("Bearer scraper")).await,
            Verdict::Allowed,
            "the broken review's place is free again"
        );
    }

    #[tokio::test]
    async fn no_bearer_token_is_unauthenticated_unasked() {
        let (reviews, _gate) = reviews(1, true);
        for header in [
            None,
            Some("Basic dXNlcg=="),
            Some("Bearer "),
            Some("Bearer   "),
        ] {
            assert_eq!(reviews.judge(header).await, Verdict::Unauthenticated);
        }
        assert_eq!(asked(&reviews), 0);
    }
}
