//! A token bucket that paces the operator's API requests (client-side QPS and burst).

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

pub(crate) struct RateLimiter {
    per_second: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// `per_second` of 0 means no limit.
    pub(crate) fn new(per_second: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            per_second,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Wait until one request may go.
    pub(crate) async fn acquire(&self) {
        if self.per_second <= 0.0 {
            return;
        }
        let wait = {
            let mut state = self.state.lock().await;
            let (tokens, last) = &mut *state;
            let now = Instant::now();
            *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.per_second)
                .min(self.burst);
            *last = now;
            *tokens -= 1.0;
            if *tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-*tokens / self.per_second)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_goes_at_once_then_paced() {
        let limiter = RateLimiter::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            limiter.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        for _ in 0..10 {
            limiter.acquire().await;
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (0.9..1.1).contains(&elapsed),
            "10 requests over the burst at 10/s took {elapsed}s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn zero_means_unlimited() {
        let limiter = RateLimiter::new(0.0, 1);
        let start = Instant::now();
        for _ in 0..1000 {
            limiter.acquire().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
