//! A job of the operator as steps, each within a budget: a step is a check
//! polled until it holds; the job stops at the first step that does not
//! happen in time, with what it saw last.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::POLL;

/// The step at which a job stopped: it did not happen within its budget.
#[derive(Debug)]
pub struct Stopped {
    pub step: String,
    /// What the step saw last.
    pub last: String,
}

pub struct Steps {
    budget: Duration,
    /// The steps that happened, with when (since the job started).
    passed: Mutex<Vec<(String, Duration)>>,
    started: Instant,
}

impl Steps {
    pub fn new(budget: Duration) -> Steps {
        Steps {
            budget,
            passed: Mutex::new(Vec::new()),
            started: Instant::now(),
        }
    }

    /// Polls `check` until it holds (the step happened) or the budget is
    /// spent (the job stops here).
    pub async fn step(
        &self,
        name: impl Into<String>,
        mut check: impl AsyncFnMut() -> Result<(), String>,
    ) -> Result<(), Stopped> {
        let name = name.into();
        let start = Instant::now();
        loop {
            let last = match check().await {
                Ok(()) => {
                    self.passed
                        .lock()
                        .unwrap()
                        .push((name, self.started.elapsed()));
                    return Ok(());
                }
                Err(last) => last,
            };
            if start.elapsed() >= self.budget {
                return Err(Stopped { step: name, last });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The steps that happened so far, with when.
    pub fn passed(&self) -> Vec<(String, Duration)> {
        self.passed.lock().unwrap().clone()
    }

    /// "step 1.2s, step 0.3s, ...": how long each step took.
    pub fn durations(&self) -> String {
        let mut previous = Duration::ZERO;
        self.passed()
            .iter()
            .map(|(step, at)| {
                let took = at.saturating_sub(previous);
                previous = *at;
                format!("{step} {took:.1?}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
