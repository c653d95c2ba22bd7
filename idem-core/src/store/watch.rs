//! Watching a key for its settlement: how a caller that found the key in flight learns, without
//! polling the store, that the holder finished.
//!
//! | store | a settlement in this process | a settlement in another process |
//! |---|---|---|
//! | memory | wakes the watch | (there is none) |
//! | SQLite | wakes the watch | not announced: the caller polls, with a bounded backoff |
//! | Postgres | `NOTIFY` on the schema's channel, one `LISTEN` connection per store ([`Listener`](super::listener::Listener)) | likewise |
//! | Redis | `PUBLISH` on the prefix's channel, one subscriber connection per store (likewise) | likewise |
//!
//! A notice is a hint, never an answer: the woken caller claims the key again, and the store's
//! decision table says what it gets (the stored result, the key to run after a release or a
//! lapsed lease, or still in flight). A lost notice costs time, never an effect: callers also
//! claim again when the holder's lease lapses and, as a safety net, at a bounded interval.
//!
//! A store announces a completion only when it asks to ([`Completion::notify`](super::Completion::notify):
//! the tool declares `wait`), since a `NOTIFY` serializes the commits that send one on Postgres;
//! a release, rare, is always announced.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::key::IdempotencyKey;

/// A watch on one key, from [`Store::watch`](super::Store::watch). Dropping it stops watching.
#[derive(Debug)]
pub struct Watch {
    notice: Arc<Notify>,
    /// Whether settlements in other processes reach this watch.
    announced: bool,
    /// Where the watch is registered, to leave on drop.
    entry: Option<(Watchers, IdempotencyKey, u64)>,
}

impl Watch {
    /// A watch that no notice ever reaches: the caller polls.
    pub fn unannounced() -> Self {
        Watch {
            notice: Arc::new(Notify::new()),
            announced: false,
            entry: None,
        }
    }

    /// Whether every settlement of the key, in any process, wakes this watch (Postgres and
    /// Redis while their listener is connected, the memory store): a caller then needs no
    /// polling beyond a safety net. `false` for settlements the store cannot announce (SQLite
    /// written by another process, a store without notifications).
    pub fn announced(&self) -> bool {
        self.announced
    }

    /// Completes at the next notice for the key since the watch began (one that came while
    /// nobody awaited counts once). Never completes on a watch without notices.
    pub async fn notified(&self) {
        self.notice.notified().await;
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some((watchers, key, id)) = self.entry.take() {
            watchers.leave(key, id);
        }
    }
}

/// The watches of one store in this process, by key: what a backend wakes when it learns that
/// a key settled (its own completion, or a notice from the server).
#[derive(Debug, Clone, Default)]
pub struct Watchers {
    inner: Arc<Mutex<Registered>>,
}

#[derive(Debug, Default)]
struct Registered {
    by_key: HashMap<IdempotencyKey, Vec<(u64, Arc<Notify>)>>,
    next_id: u64,
}

impl Watchers {
    /// No watches yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new watch on `key`; `announced` says whether settlements in other processes reach it.
    pub fn watch(&self, key: IdempotencyKey, announced: bool) -> Watch {
        let notice = Arc::new(Notify::new());
        let mut registered = self.lock();
        let id = registered.next_id;
        registered.next_id += 1;
        registered
            .by_key
            .entry(key)
            .or_default()
            .push((id, notice.clone()));
        Watch {
            notice,
            announced,
            entry: Some((self.clone(), key, id)),
        }
    }

    /// Wakes every watch on `key`.
    pub fn settled(&self, key: &IdempotencyKey) {
        if let Some(watches) = self.lock().by_key.get(key) {
            for (_, notice) in watches {
                notice.notify_one();
            }
        }
    }

    /// Wakes every watch on `key` given as the hex of its bytes (a server's notice); ignores
    /// anything else.
    pub fn settled_hex(&self, hex: &str) {
        if let Some(key) = crate::hex::decode(hex)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .map(IdempotencyKey::from_bytes)
        {
            self.settled(&key);
        }
    }

    /// Wakes every watch: notices may have been lost (the listener's connection dropped), so
    /// every caller looks at its key again.
    pub fn all(&self) {
        for watches in self.lock().by_key.values() {
            for (_, notice) in watches {
                notice.notify_one();
            }
        }
    }

    /// How many keys are watched.
    pub fn keys(&self) -> usize {
        self.lock().by_key.len()
    }

    fn leave(&self, key: IdempotencyKey, id: u64) {
        let mut registered = self.lock();
        if let Some(watches) = registered.by_key.get_mut(&key) {
            watches.retain(|(other, _)| *other != id);
            if watches.is_empty() {
                registered.by_key.remove(&key);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registered> {
        // A panic under this lock leaves the map consistent (every change is one call).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The hex of `key`'s bytes, as notices carry it.
pub fn notice_payload(key: &IdempotencyKey) -> String {
    crate::hex::encode(key.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Watch, Watchers, notice_payload};
    use crate::key::IdempotencyKey;

    fn key(n: u8) -> IdempotencyKey {
        IdempotencyKey::from_bytes([n; 32])
    }

    async fn woken(watch: &Watch) -> bool {
        tokio::time::timeout(Duration::from_millis(20), watch.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_settlement_wakes_the_watches_of_its_key_only_and_counts_while_nobody_waits() {
        let watchers = Watchers::new();
        let (a1, a2, b) = (
            watchers.watch(key(1), true),
            watchers.watch(key(1), true),
            watchers.watch(key(2), true),
        );
        watchers.settled(&key(1));
        assert!(
            woken(&a1).await && woken(&a2).await,
            "a notice before the await counts"
        );
        assert!(!woken(&a1).await, "once");
        assert!(!woken(&b).await, "another key sleeps on");
        watchers.settled_hex(&notice_payload(&key(2)));
        assert!(woken(&b).await, "a server's notice names the key in hex");
        watchers.settled_hex("not hex");
        watchers.all();
        assert!(woken(&a1).await && woken(&b).await);
    }

    #[tokio::test]
    async fn a_dropped_watch_leaves_and_an_unannounced_one_never_wakes() {
        let watchers = Watchers::new();
        let watch = watchers.watch(key(3), false);
        assert!(!watch.announced());
        assert_eq!(watchers.keys(), 1);
        drop(watch);
        assert_eq!(watchers.keys(), 0);
        let never = Watch::unannounced();
        watchers.all();
        assert!(!woken(&never).await);
    }
}
