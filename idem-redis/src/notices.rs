//! Settlement notices: a completion that asks to notify, and every release, `PUBLISH`es the key
//! on the prefix's channel from inside its script (so a notice goes out exactly when the record
//! changed); one subscriber connection per store, from the first watch on, wakes the watches of
//! the key a notice names.
//!
//! | situation | watches |
//! |---|---|
//! | subscribed | announced: woken by every settlement of their key, in any process |
//! | the subscriber's connection drops | all woken (a notice may be lost), then announced again once it subscribes anew (reconnected with a backoff up to 5 s) |
//! | a cluster, a connection handed in, or no subscription within the response timeout | not announced: the caller polls (on a cluster, a `PUBLISH` would be broadcast to every node, so none is sent) |
//!
//! Pub/sub rather than a blocking pop on a list per key: a notice reaches every waiting process
//! at once and leaves nothing behind when nobody waits (a list would need one push per waiter,
//! which the completing script cannot count, and an expiry for the pushes nobody popped).

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::Stream;
use idem_core::key::IdempotencyKey;
use idem_core::store::{Watch, Watchers};
use redis::Client;
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// The longest pause between two attempts to connect the subscriber.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The channel of a prefix's notices.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:settled")
}

/// The store's subscriber: started by the first watch, stopped with the store.
pub(crate) struct Subscriber {
    watchers: Watchers,
    /// The channel the scripts publish to; empty when nobody can listen (a cluster).
    channel: String,
    /// The server and the response timeout, when the store opened the connection itself.
    client: Option<(Client, Duration)>,
    /// Whether the subscriber is subscribed now.
    subscribed: watch::Sender<bool>,
    task: Mutex<Option<AbortHandle>>,
}

impl Subscriber {
    /// A subscriber on `channel` through `client`; without one, watches are woken only by this
    /// store's own settlements and nothing is published.
    pub(crate) fn new(channel: String, client: Option<(Client, Duration)>) -> Self {
        Subscriber {
            watchers: Watchers::new(),
            channel: if client.is_some() {
                channel
            } else {
                String::new()
            },
            client,
            subscribed: watch::Sender::new(false),
            task: Mutex::new(None),
        }
    }

    /// The channel a script publishes to (empty: none).
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Wakes this process's watches of `key` (a settlement by this store).
    pub(crate) fn settled(&self, key: &IdempotencyKey) {
        self.watchers.settled(key);
    }

    /// A watch on `key`: announced once the subscriber is subscribed, which this waits for (at
    /// most the response timeout).
    pub(crate) async fn watch(&self, key: IdempotencyKey) -> Watch {
        let Some((client, timeout)) = &self.client else {
            return self.watchers.watch(key, false);
        };
        self.start(client, *timeout);
        let mut subscribed = self.subscribed.subscribe();
        let ready = tokio::time::timeout(*timeout, subscribed.wait_for(|on| *on)).await;
        self.watchers.watch(key, matches!(ready, Ok(Ok(_))))
    }

    fn start(&self, client: &Client, timeout: Duration) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.is_none() {
            let listen = listen(
                client.clone(),
                timeout,
                self.channel.clone(),
                self.watchers.clone(),
                self.subscribed.clone(),
            );
            *task = Some(tokio::spawn(listen).abort_handle());
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).take() {
            task.abort();
        }
    }
}

/// Subscribes, and wakes watches by the notices, for as long as the store lives.
async fn listen(
    client: Client,
    timeout: Duration,
    channel: String,
    watchers: Watchers,
    subscribed: watch::Sender<bool>,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        let connected = tokio::time::timeout(timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            redis::RedisResult::Ok(pubsub)
        })
        .await;
        if let Ok(Ok(pubsub)) = connected {
            pause = Duration::from_millis(50);
            subscribed.send_replace(true);
            let mut messages = pubsub.into_on_message();
            while let Some(message) = poll_fn(|cx| Pin::new(&mut messages).poll_next(cx)).await {
                if let Ok(payload) = std::str::from_utf8(message.get_payload_bytes()) {
                    watchers.settled_hex(payload);
                }
            }
            subscribed.send_replace(false);
            // Notices may have been missed: every waiting caller looks at its key again.
            watchers.all();
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}
