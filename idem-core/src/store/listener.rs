//! A store's listener for settlement notices from other processes, written once for every
//! backend that has them (Postgres `LISTEN`, Redis pub/sub): the backend says how to
//! subscribe ([`Subscribe`]), the listener does the rest.
//!
//! | moment | the listener |
//! |---|---|
//! | the first [`watch`](Listener::watch) | starts its task, which subscribes; the watch waits for that, at most the timeout |
//! | subscribed | its watches are [announced](Watch::announced); each notice wakes the watches of the key it names |
//! | the subscription ends (the connection dropped) | wakes every watch (a notice may have been lost), subscribes again after a pause of 50 ms doubling to 5 s |
//! | its task ended with the runtime it ran on | the next watch starts it again |
//! | dropped with the store | stops its task |
//!
//! Without a [`Subscribe`] (the store cannot open a connection of its own), watches are woken
//! only by the store's own settlements ([`Listener::settled`]) and are not announced.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::watch::{Watch, Watchers};
use crate::error::StoreError;
use crate::key::IdempotencyKey;

/// The notices of a subscription in place: each names a key in hex; the stream ends when the
/// subscription does.
pub type Notices = Pin<Box<dyn Stream<Item = String> + Send>>;

/// How a backend subscribes to its channel: a new connection each time, its subscription
/// confirmed before the future completes.
pub type Subscribe = Box<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<Notices, StoreError>> + Send>> + Send + Sync,
>;

/// The longest pause between two attempts to subscribe.
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(5);

/// A store's listener: its watches, and the task that wakes them by the server's notices.
pub struct Listener {
    watchers: Watchers,
    subscribe: Option<(std::sync::Arc<Subscribe>, Duration)>,
    /// Whether the task is subscribed now.
    listening: watch::Sender<bool>,
    task: Mutex<Option<AbortHandle>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("subscribes", &self.subscribe.is_some())
            .field("listening", &*self.listening.borrow())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// A listener that subscribes with `subscribe`, waiting at most `timeout` for a
    /// subscription; `None`: one whose watches only this store's own settlements wake.
    pub fn new(subscribe: Option<(Subscribe, Duration)>) -> Self {
        Listener {
            watchers: Watchers::new(),
            subscribe: subscribe.map(|(s, timeout)| (std::sync::Arc::new(s), timeout)),
            listening: watch::Sender::new(false),
            task: Mutex::new(None),
        }
    }

    /// Whether notices from other processes can reach this listener (it has a way to
    /// subscribe): the backend then sends them.
    pub fn subscribes(&self) -> bool {
        self.subscribe.is_some()
    }

    /// Wakes this process's watches of `key`: a settlement by the store itself, faster than its
    /// notice (which then wakes them again for nothing).
    pub fn settled(&self, key: &IdempotencyKey) {
        self.watchers.settled(key);
    }

    /// A watch on `key`, announced once the listener is subscribed (which this waits for, at
    /// most the timeout). Registered after that: a notice from then on reaches it, and a claim
    /// made after this sees any settlement before.
    pub async fn watch(&self, key: IdempotencyKey) -> Watch {
        let Some((subscribe, timeout)) = &self.subscribe else {
            return self.watchers.watch(key, false);
        };
        self.start(subscribe, *timeout);
        let mut listening = self.listening.subscribe();
        let ready = tokio::time::timeout(*timeout, listening.wait_for(|on| *on)).await;
        self.watchers.watch(key, matches!(ready, Ok(Ok(_))))
    }

    fn start(&self, subscribe: &std::sync::Arc<Subscribe>, timeout: Duration) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let listen = listen(
            subscribe.clone(),
            timeout,
            self.watchers.clone(),
            self.listening.clone(),
        );
        *task = Some(tokio::spawn(listen).abort_handle());
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

/// Says "not listening" when the task ends, however it ends (aborted, its runtime gone).
struct NotListening(watch::Sender<bool>);

impl Drop for NotListening {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// Subscribes, and wakes watches by the notices, until aborted.
async fn listen(
    subscribe: std::sync::Arc<Subscribe>,
    timeout: Duration,
    watchers: Watchers,
    listening: watch::Sender<bool>,
) {
    let listening = NotListening(listening);
    let mut pause = Duration::from_millis(50);
    loop {
        if let Ok(Ok(mut notices)) = tokio::time::timeout(timeout, subscribe()).await {
            pause = Duration::from_millis(50);
            listening.0.send_replace(true);
            while let Some(notice) = poll_fn(|cx| notices.as_mut().poll_next(cx)).await {
                watchers.settled_hex(&notice);
            }
            listening.0.send_replace(false);
            // Notices may have been missed: every waiting caller looks at its key again.
            watchers.all();
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RESUBSCRIBE_MAX);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::mpsc;

    use super::{Listener, Notices, Subscribe};
    use crate::key::IdempotencyKey;
    use crate::store::watch::{Watch, notice_payload};

    /// A server whose subscriptions are channels the test holds: each subscription sends its
    /// sender to the test.
    fn server() -> (
        Subscribe,
        mpsc::UnboundedReceiver<mpsc::UnboundedSender<String>>,
        Arc<AtomicUsize>,
    ) {
        let (subscriptions, opened) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        let subscribe: Subscribe = Box::new(move || {
            let subscriptions = subscriptions.clone();
            counted.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                let (notices, received) = mpsc::unbounded_channel::<String>();
                subscriptions.send(notices).unwrap();
                let stream: Notices = Box::pin(channel_stream(received));
                Ok(stream)
            })
        });
        (subscribe, opened, count)
    }

    /// An unbounded receiver as a stream (no `tokio-stream` for one test).
    fn channel_stream(
        received: mpsc::UnboundedReceiver<String>,
    ) -> impl futures_core::Stream<Item = String> + Send {
        struct S(mpsc::UnboundedReceiver<String>);
        impl futures_core::Stream for S {
            type Item = String;
            fn poll_next(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<Option<String>> {
                self.0.poll_recv(cx)
            }
        }
        S(received)
    }

    async fn woken(watch: &Watch) -> bool {
        tokio::time::timeout(Duration::from_millis(200), watch.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn notices_wake_their_key_and_a_dropped_subscription_wakes_all_then_resubscribes() {
        let (subscribe, mut opened, count) = server();
        let listener = Listener::new(Some((subscribe, Duration::from_secs(5))));
        let (a, b) = (
            IdempotencyKey::from_bytes([1; 32]),
            IdempotencyKey::from_bytes([2; 32]),
        );
        let watch_a = listener.watch(a).await;
        let watch_b = listener.watch(b).await;
        assert!(watch_a.announced() && watch_b.announced());
        let first = opened.recv().await.unwrap();
        first.send(notice_payload(&a)).unwrap();
        assert!(woken(&watch_a).await && !woken(&watch_b).await);
        drop(first);
        assert!(
            woken(&watch_a).await && woken(&watch_b).await,
            "all, on a drop"
        );
        let second = opened.recv().await.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 2, "subscribed again");
        second.send(notice_payload(&b)).unwrap();
        assert!(woken(&watch_b).await);
    }

    #[tokio::test]
    async fn without_a_way_to_subscribe_only_the_stores_own_settlements_wake() {
        let listener = Listener::new(None);
        let key = IdempotencyKey::from_bytes([3; 32]);
        let watch = listener.watch(key).await;
        assert!(!watch.announced() && !listener.subscribes());
        listener.settled(&key);
        assert!(woken(&watch).await);
    }
}
