//! Durable runs: the run scope a durable engine opens around each step, from which tools keyed
//! by `run_id` and `step_id` take those parts.
//!
//! A durable engine (Restate, Temporal, DBOS, a checkpoint loop of your own) skips the steps it
//! has confirmed, and runs again a step whose effect happened but whose confirmation did not.
//! The key closes that gap: the step's tool calls, run again, find their keys and replay. For
//! that the key must be the same on every execution of the step, and it must not be written
//! by hand at every call. An engine integration opens a [`Run`] with the run's stable id and
//! runs each step inside [`Run::step`]; inside it, a tool that names `run_id` or `step_id` in
//! its key without a parameter of that name takes the part from the step:
//!
//! ```
//! # use idem_runtime as idem;
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Payment;
//! // #[idempotent(key = "run_id, step_id", mutating, name = "payments.register")]
//! // async fn register_payment(customer: String, amount_cents: u64) -> Result<Payment, String>
//! # async fn register_payment(customer: String, amount_cents: u64) -> Result<(), String> { Ok(()) }
//! # async fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let run = idem::run::Run::new("order-1042")?; // the engine's id of the run
//! run.step("charge", register_payment("cus_1".into(), 500))?.await?;
//! # Ok(()) }
//! ```
//!
//! | the tool's key names `run_id`, `step_id` | called inside a step | called outside one |
//! |---|---|---|
//! | without parameters of those names | the run's id; the step's id, then `STEP#2`, `STEP#3`, … for the later calls of the same tool in the step | [`Error::NoRun`](idem_core::Error::NoRun): the body does not run |
//! | as parameters | the arguments: explicit parts win | the arguments |
//!
//! The first call of a tool in a step has the key the explicit form would have
//! (`register_payment(run_id, step_id, …)` with the same two strings), though not its
//! fingerprint (the explicit form's arguments hold the two ids too): a tool moved from one form
//! to the other answers `Mismatch` to the calls made before the change. A call retried by
//! [`retry`](crate::retry::retry) keeps its step id: it is the same call; a call the step's
//! code makes again by hand is a second call, with the next id.
//!
//! # The contract an engine integration meets
//!
//! 1. **The run's id is stable**: the same across replays, restarts of the process and the
//!    engine's own retries of the run (Restate's invocation id, Temporal's workflow id, your
//!    workflow table's primary key). It is a key string: 1 to 255 visible ASCII characters.
//! 2. **The step's id is deterministic**: every execution of the run gives the same step the
//!    same id (the engine's journal position, the step's name in a deterministic workflow).
//!    Two steps of one run never share an id.
//! 3. **A step that runs again opens a new [`Run::step`]**: the ids of its calls are counted
//!    from the start of the step, so they repeat exactly.
//! 4. **The attempt number is information only** ([`Run::with_attempt`], [`Step::attempt`]): it
//!    is never part of a key (each retry would then be a new intent).
//! 5. **Keys outlive the run's resume window**: declare it
//!    ([`IdemBuilder::resume_window`](crate::IdemBuilder::resume_window)), and the startup
//!    [`audit`](crate::audit) refuses tools whose key lifetime is shorter than the window plus
//!    the retry window.
//!
//! The step scope is task-local: a task the step spawns does not inherit it; wrap its future in
//! [`Step::enter`] (from [`current()`]).

use std::sync::{Arc, Mutex};

use idem_core::key::{InvalidKey, KeyPart};
use idem_core::validate_key_string;
use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static STEP: Step;
}

/// A durable run, as its engine identifies it: its stable id, and the attempt the engine is at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    id: Arc<str>,
    attempt: Option<u32>,
}

impl Run {
    /// The run with the engine's stable id for it: a key string (1 to 255 visible ASCII
    /// characters), else the error says what is wrong (never quoting the id).
    pub fn new(id: impl Into<String>) -> Result<Run, InvalidKey> {
        let id = id.into();
        validate_key_string(&id)?;
        Ok(Run {
            id: id.into(),
            attempt: None,
        })
    }

    /// The attempt the engine is at (1 for the first execution), for logs and telemetry only:
    /// it is never part of a key.
    #[must_use]
    pub fn with_attempt(mut self, attempt: u32) -> Run {
        self.attempt = Some(attempt);
        self
    }

    /// The run's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The attempt, when the engine told it.
    pub fn attempt(&self) -> Option<u32> {
        self.attempt
    }

    /// Runs `body` as the step `step_id` of this run: the tools it calls that take `run_id`
    /// and `step_id` from the run are keyed by this run and this step. The step's id is a key
    /// string, else the error says what is wrong.
    ///
    /// The returned future owns what it needs, so it can be spawned.
    pub fn step<F: Future>(
        &self,
        step_id: impl Into<String>,
        body: F,
    ) -> Result<TaskLocalFuture<Step, F>, InvalidKey> {
        Ok(self.open_step(step_id)?.enter(body))
    }

    /// The step `step_id` of this run, to enter later ([`Step::enter`]): for an integration
    /// that checks the id before the engine runs the step. Each `open_step` counts the calls of
    /// its step from the start.
    pub fn open_step(&self, step_id: impl Into<String>) -> Result<Step, InvalidKey> {
        let step_id = step_id.into();
        validate_key_string(&step_id)?;
        Ok(Step {
            run: self.clone(),
            id: step_id.into(),
            calls: Arc::new(Mutex::new(Vec::new())),
        })
    }
}

/// The step of a durable run that the running code is in: got with [`current()`].
#[derive(Debug, Clone)]
pub struct Step {
    run: Run,
    id: Arc<str>,
    /// How many calls of each tool the step has made so far.
    calls: Arc<Mutex<Vec<(&'static str, u32)>>>,
}

impl Step {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.run.id()
    }

    /// The step's id, as the engine gave it.
    pub fn step_id(&self) -> &str {
        &self.id
    }

    /// The attempt the engine is at, when it told it.
    pub fn attempt(&self) -> Option<u32> {
        self.run.attempt()
    }

    /// Runs `fut` in this step, sharing its count of calls: for a task the step spawns.
    pub fn enter<F: Future>(&self, fut: F) -> TaskLocalFuture<Step, F> {
        STEP.scope(self.clone(), fut)
    }

    /// The step id of the next call of `tool` in this step: the step's own for the first,
    /// `STEP#n` for the n-th.
    fn next_call(&self, tool: &'static str) -> String {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let n = match calls.iter_mut().find(|(name, _)| *name == tool) {
            Some((_, count)) => {
                *count += 1;
                *count
            }
            None => {
                calls.push((tool, 1));
                1
            }
        };
        if n == 1 {
            self.id.to_string()
        } else {
            format!("{}#{n}", self.id)
        }
    }
}

/// The step the running code is in, if any.
pub fn current() -> Option<Step> {
    STEP.try_with(Step::clone).ok()
}

/// The `run_id` part of a tool that takes it from the run: `None` outside a step.
pub(crate) fn run_id_part() -> Option<Result<KeyPart, InvalidKey>> {
    STEP.try_with(|step| KeyPart::new(step.run_id())).ok()
}

/// The `step_id` part of a call of `tool` that takes it from the run, counting the call:
/// `None` outside a step.
pub(crate) fn step_id_part(tool: &'static str) -> Option<Result<KeyPart, InvalidKey>> {
    // A string part is checked as a key string by `KeyPart::new` (a numbered id may be too long).
    STEP.try_with(|step| KeyPart::new(&step.next_call(tool)))
        .ok()
}

/// The count of calls of the current step at one moment, to be restored before each retry of
/// the same call ([`retry`](crate::retry::retry)), so that a retry keeps its step id.
pub(crate) struct Mark(Option<(Step, Vec<(&'static str, u32)>)>);

impl Mark {
    /// The current step's count now (nothing outside a step).
    pub(crate) fn now() -> Mark {
        Mark(current().map(|step| {
            let calls = step.calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
            (step, calls)
        }))
    }

    /// Puts the step's count back where it was.
    pub(crate) fn rewind(&self) {
        if let Some((step, calls)) = &self.0 {
            *step.calls.lock().unwrap_or_else(|e| e.into_inner()) = calls.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(s: &str) -> Option<Result<KeyPart, InvalidKey>> {
        Some(KeyPart::new(s))
    }

    #[tokio::test]
    async fn parts_come_from_the_step_and_later_calls_of_a_tool_are_numbered() {
        assert!(run_id_part().is_none(), "no step, no part");
        assert!(step_id_part("a").is_none());
        let run = Run::new("run-1").unwrap().with_attempt(3);
        run.step("charge", async {
            assert_eq!(run_id_part(), part("run-1"));
            assert_eq!(step_id_part("a"), part("charge"));
            assert_eq!(step_id_part("b"), part("charge"), "each tool counts apart");
            assert_eq!(step_id_part("a"), part("charge#2"));
            assert_eq!(step_id_part("a"), part("charge#3"));
            let step = current().unwrap();
            assert_eq!(
                (step.run_id(), step.step_id(), step.attempt()),
                ("run-1", "charge", Some(3))
            );
        })
        .unwrap()
        .await;
        // The step run again counts from the start: the same ids.
        run.step("charge", async {
            assert_eq!(step_id_part("a"), part("charge"));
            assert_eq!(step_id_part("a"), part("charge#2"));
        })
        .unwrap()
        .await;
    }

    #[tokio::test]
    async fn a_mark_rewinds_the_count_and_a_spawned_task_enters_the_step() {
        let run = Run::new("run-1").unwrap();
        run.step("s", async {
            let mark = Mark::now();
            assert_eq!(step_id_part("a"), part("s"));
            mark.rewind();
            assert_eq!(step_id_part("a"), part("s"), "a retry keeps its id");
            let step = current().unwrap();
            let spawned = tokio::spawn(step.enter(async { step_id_part("a") }));
            assert_eq!(
                spawned.await.unwrap(),
                part("s#2"),
                "one count for the step"
            );
            assert!(
                tokio::spawn(async { run_id_part() })
                    .await
                    .unwrap()
                    .is_none(),
                "a task not entered is outside the step"
            );
        })
        .unwrap()
        .await;
    }

    #[test]
    fn ids_are_key_strings() {
        assert_eq!(Run::new("").unwrap_err(), InvalidKey::Empty);
        assert!(Run::new("run 1").is_err(), "a space is not a key character");
        let run = Run::new("r").unwrap();
        assert!(run.step("a b", async {}).is_err());
        assert!(run.step("x".repeat(256), async {}).is_err());
    }

    #[tokio::test]
    async fn a_step_id_that_has_no_room_for_its_number_is_an_invalid_part() {
        let run = Run::new("r").unwrap();
        run.step("x".repeat(254), async {
            assert!(step_id_part("a").unwrap().is_ok());
            assert!(
                step_id_part("a").unwrap().is_err(),
                "`#2` makes it 256 long"
            );
        })
        .unwrap()
        .await;
    }
}
