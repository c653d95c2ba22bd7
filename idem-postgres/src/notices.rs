//! Settlement notices: a completion that asks to notify, and every release, sends `NOTIFY` on
//! the schema's channel in its own statement (delivered when it commits); one connection per
//! store `LISTEN`s to it, from the first watch on, and wakes the watches of the key a notice
//! names.
//!
//! | situation | watches |
//! |---|---|
//! | listening | announced: woken by every settlement of their key, in any process |
//! | the listener's connection drops | all woken (a notice may be lost), then announced again once it listens anew (reconnected with a backoff up to 5 s) |
//! | no listener (a pool handed in, a transaction pooler, which cannot hold a `LISTEN`), or it cannot connect within the response timeout | not announced: the caller polls |
//!
//! The listener's connection is the store's own (same options, TLS included), outside the pool.
//! A `NOTIFY` takes a lock at commit that serializes the commits that send one: that is why
//! only the completions of tools that declare `wait` send one.

use std::future::poll_fn;
use std::sync::Mutex;
use std::time::Duration;

use idem_core::key::IdempotencyKey;
use idem_core::store::{Watch, Watchers};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_postgres::AsyncMessage;

use crate::tls::Connector;

/// The longest pause between two attempts to connect the listener.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The channel of a schema's notices (cut to Postgres's 63 bytes: schemas that share a long
/// prefix share a channel, and only wake each other for nothing).
pub(crate) fn channel(schema: &str) -> String {
    let mut channel = format!("idem:{schema}");
    let mut end = channel.len().min(63);
    while !channel.is_char_boundary(end) {
        end -= 1;
    }
    channel.truncate(end);
    channel
}

/// What the listener connects with.
pub(crate) struct Connect {
    pub(crate) config: tokio_postgres::Config,
    pub(crate) connector: Connector,
    pub(crate) timeout: Duration,
}

/// The store's listener: started by the first watch, stopped with the store.
pub(crate) struct Listener {
    watchers: Watchers,
    /// The channel it listens to.
    channel: String,
    connect: Option<Connect>,
    /// Whether the listener listens now.
    listening: watch::Sender<bool>,
    task: Mutex<Option<AbortHandle>>,
}

impl Listener {
    /// A listener on `channel`; without `connect`, watches are woken only by this store's own
    /// settlements and are not announced.
    pub(crate) fn new(channel: String, connect: Option<Connect>) -> Self {
        Listener {
            watchers: Watchers::new(),
            channel,
            connect,
            listening: watch::Sender::new(false),
            task: Mutex::new(None),
        }
    }

    /// Wakes this process's watches of `key` (a settlement by this store: faster than its
    /// notice, which wakes them again for nothing).
    pub(crate) fn settled(&self, key: &IdempotencyKey) {
        self.watchers.settled(key);
    }

    /// A watch on `key`: announced once the listener listens, which this waits for (at most
    /// the response timeout).
    pub(crate) async fn watch(&self, key: IdempotencyKey) -> Watch {
        let Some(connect) = &self.connect else {
            return self.watchers.watch(key, false);
        };
        self.start(connect);
        let mut listening = self.listening.subscribe();
        let ready = tokio::time::timeout(connect.timeout, listening.wait_for(|on| *on)).await;
        // Registered after the listener listens: a settlement from here on reaches it, and
        // the caller's claim after this sees any before.
        self.watchers.watch(key, matches!(ready, Ok(Ok(_))))
    }

    fn start(&self, connect: &Connect) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.is_some() {
            return;
        }
        let listen = listen(
            connect.config.clone(),
            connect.connector.clone(),
            connect.timeout,
            self.channel.clone(),
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

/// Connects, listens, and wakes watches by the notices, for as long as the store lives.
async fn listen(
    config: tokio_postgres::Config,
    connector: Connector,
    timeout: Duration,
    channel: String,
    watchers: Watchers,
    listening: watch::Sender<bool>,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        if let Ok(Ok((client, mut connection))) =
            tokio::time::timeout(timeout, config.connect(connector.clone())).await
        {
            let statement = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
            let mut subscribe = std::pin::pin!(client.batch_execute(&statement));
            let mut subscribed = false;
            loop {
                tokio::select! {
                    done = &mut subscribe, if !subscribed => {
                        if done.is_err() {
                            break;
                        }
                        subscribed = true;
                        pause = Duration::from_millis(50);
                        listening.send_replace(true);
                    }
                    message = poll_fn(|cx| connection.poll_message(cx)) => match message {
                        Some(Ok(AsyncMessage::Notification(notice))) => {
                            watchers.settled_hex(notice.payload());
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => break,
                    },
                }
            }
            listening.send_replace(false);
            // Notices may have been missed: every waiting caller looks at its key again.
            watchers.all();
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECONNECT_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::channel;

    #[test]
    fn a_channel_names_its_schema_within_postgres_limit() {
        assert_eq!(channel("idem"), "idem:idem");
        let long = "s".repeat(63);
        assert_eq!(channel(&long).len(), 63);
        assert_eq!(
            channel(&"é".repeat(40)).len(),
            63,
            "cut at a character's boundary"
        );
    }
}
