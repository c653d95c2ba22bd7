//! A timer that needs nothing of the caller's runtime: one keeper thread per process wakes the
//! tasks whose deadlines passed.
//!
//! Lease renewals wait on it, so a call needs no tokio time driver. It is written for their
//! pattern: almost every call registers a deadline a third of a lease away and finishes long
//! before it. Registering takes a short lock and wakes the keeper thread only when the new
//! deadline is earlier than the keeper's next planned wake-up; while calls keep coming, the
//! keeper plans a wake-up at least every [`IDLE_TICK`], so a deadline farther away than that
//! (every default lease's) never wakes it. A general-purpose timer (`futures-timer`) wakes its
//! thread for every new timer: a microsecond per call, measured in the `renewal` benchmark.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often the keeper wakes up while timers come and go, so that a new deadline beyond it
/// needs no wake-up of its own.
const IDLE_TICK: Duration = Duration::from_millis(250);

/// After this many idle ticks without a timer, the keeper sleeps until the next one.
const IDLE_TICKS: u32 = 8;

/// Completes at `deadline` (on the keeper thread's clock, [`Instant`]).
pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        entry: None,
    }
}

/// Full jitter: a uniformly random wait between zero and `max`.
pub(crate) fn jitter(max: Duration) -> Duration {
    let random = uuid::Uuid::new_v4().as_u128() as u64;
    Duration::from_nanos(random % (max.as_nanos().max(1) as u64))
}

/// Completes after `duration`.
pub(crate) fn sleep(duration: Duration) -> Sleep {
    sleep_until(Instant::now() + duration)
}

/// The future of [`sleep_until`]. It registers its deadline when first polled, and removes it
/// when dropped.
#[derive(Debug)]
pub(crate) struct Sleep {
    deadline: Instant,
    entry: Option<(u64, Arc<Entry>)>,
}

#[derive(Debug, Default)]
struct Entry {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        match &this.entry {
            Some((_, entry)) => {
                if entry.fired.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                let mut waker = lock(&entry.waker);
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *waker = Some(cx.waker().clone());
                }
                drop(waker);
                // Fired between the check and the new waker: do not wait for a wake-up.
                if entry.fired.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                Poll::Pending
            }
            None => {
                if this.deadline <= Instant::now() {
                    return Poll::Ready(());
                }
                let entry = Arc::new(Entry {
                    fired: AtomicBool::new(false),
                    waker: Mutex::new(Some(cx.waker().clone())),
                });
                let id = keeper().register(this.deadline, entry.clone());
                this.entry = Some((id, entry));
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((id, _)) = self.entry.take() {
            keeper().remove(id);
        }
    }
}

/// The process's keeper: the timers waiting, and the thread that fires them.
struct Keeper {
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    timers: HashMap<u64, (Instant, Arc<Entry>)>,
    next_id: u64,
    /// When the keeper thread wakes up next on its own (`None`: it waits for a registration).
    planned: Option<Instant>,
    started: bool,
}

fn keeper() -> &'static Keeper {
    static KEEPER: OnceLock<Keeper> = OnceLock::new();
    KEEPER.get_or_init(|| Keeper {
        state: Mutex::new(State::default()),
        wake: Condvar::new(),
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can panic halfway through an update.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Keeper {
    fn register(&'static self, deadline: Instant, entry: Arc<Entry>) -> u64 {
        let mut state = lock(&self.state);
        let id = state.next_id;
        state.next_id += 1;
        state.timers.insert(id, (deadline, entry));
        if !state.started {
            state.started = true;
            // Planned "now": the new thread looks at the timers before it sleeps.
            state.planned = Some(Instant::now());
            std::thread::Builder::new()
                .name("idem-timer".into())
                .spawn(move || self.run())
                .expect("idem: cannot start the timer thread");
        } else if state.planned.is_none_or(|planned| deadline < planned) {
            state.planned = Some(deadline);
            self.wake.notify_one();
        }
        id
    }

    fn remove(&self, id: u64) {
        lock(&self.state).timers.remove(&id);
    }

    fn run(&self) {
        let mut idle_ticks = 0;
        let mut state = lock(&self.state);
        loop {
            let now = Instant::now();
            let mut fired = Vec::new();
            let mut earliest: Option<Instant> = None;
            state.timers.retain(|_, (deadline, entry)| {
                if *deadline <= now {
                    fired.push(entry.clone());
                    false
                } else {
                    earliest = Some(earliest.map_or(*deadline, |e| e.min(*deadline)));
                    true
                }
            });
            idle_ticks = if state.timers.is_empty() && fired.is_empty() {
                idle_ticks + 1
            } else {
                0
            };
            let tick = (idle_ticks <= IDLE_TICKS).then(|| now + IDLE_TICK);
            state.planned = match (earliest, tick) {
                (Some(e), Some(t)) => Some(e.min(t)),
                (e, t) => e.or(t),
            };
            drop(state);
            for entry in fired {
                entry.fired.store(true, Ordering::Release);
                if let Some(waker) = lock(&entry.waker).take() {
                    waker.wake();
                }
            }
            state = lock(&self.state);
            state = match state.planned {
                Some(planned) => {
                    let wait = planned.saturating_duration_since(Instant::now());
                    self.wake
                        .wait_timeout(state, wait)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.wake.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{keeper, lock, sleep, sleep_until};

    #[test]
    fn sleeps_wake_at_their_deadlines_in_any_order_without_a_tokio_timer() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let start = Instant::now();
            let far = tokio::spawn(sleep(Duration::from_millis(120)));
            let near = tokio::spawn(sleep(Duration::from_millis(30)));
            near.await.unwrap();
            let near_at = start.elapsed();
            far.await.unwrap();
            let far_at = start.elapsed();
            assert!(near_at >= Duration::from_millis(30));
            assert!(far_at >= Duration::from_millis(120));
            assert!(near_at < far_at);
        });
    }

    #[test]
    fn a_past_deadline_is_ready_and_a_dropped_sleep_leaves_nothing_behind() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            sleep_until(Instant::now() - Duration::from_millis(1)).await;
            let mut dropped = Box::pin(sleep(Duration::from_secs(3600)));
            assert!(futures_poll_once(dropped.as_mut()).await.is_pending());
            let id = dropped.entry.as_ref().expect("registered").0;
            assert!(lock(&keeper().state).timers.contains_key(&id));
            drop(dropped);
            assert!(!lock(&keeper().state).timers.contains_key(&id));
        });
    }

    async fn futures_poll_once<F: std::future::Future + Unpin>(
        mut fut: F,
    ) -> std::task::Poll<F::Output> {
        std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut fut).poll(cx)))
            .await
    }
}
