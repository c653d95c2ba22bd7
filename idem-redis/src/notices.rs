//! Settlement notices: a completion that asks to notify, and every release, `PUBLISH`es the key
//! on the prefix's channel from inside its script (so a notice goes out exactly when the record
//! changed); the store's [`Listener`](idem_core::store::listener::Listener) subscribes with
//! [`subscribe`]: a pub/sub connection of its own to the same server.
//!
//! No listener subscribes on a cluster (a `PUBLISH` there is broadcast to every node, so the
//! scripts send none) or over a connection handed in (idem cannot open one of its own): those
//! waiting callers poll.
//!
//! Pub/sub rather than a blocking pop on a list per key: a notice reaches every waiting process
//! at once and leaves nothing behind when nobody waits (a list would need one push per waiter,
//! which the completing script cannot count, and an expiry for the pushes nobody popped).

use futures_util::StreamExt;
use idem_core::key::IdempotencyKey;
use idem_core::store::listener::{Notices, Subscribe};
use idem_core::store::watch::notice_payload;
use redis::Client;

use crate::driver::redis_error;
use crate::store::RedisStore;

/// The channel of a prefix's notices.
pub(crate) fn channel(prefix: &str) -> String {
    format!("{prefix}:settled")
}

impl RedisStore {
    /// The channel and the notice a script announces `key`'s settlement with (`announce`: the
    /// completion asks to, or a release): both empty when it goes unannounced, so a plain
    /// completion sends nothing more. Nothing is announced where the store's listener cannot
    /// subscribe (a cluster, a connection handed in).
    pub(crate) fn announcement(&self, key: &IdempotencyKey, announce: bool) -> (&str, String) {
        if announce && self.notices.subscribes() {
            (&self.channel, notice_payload(key))
        } else {
            ("", String::new())
        }
    }
}

/// Subscribes to `channel` on a new pub/sub connection of `client`'s; the notices end when the
/// connection does.
pub(crate) fn subscribe(client: Client, channel: String) -> Subscribe {
    Box::new(move || {
        let (client, channel) = (client.clone(), channel.clone());
        Box::pin(async move {
            const OP: &str = "listening for settlements";
            let mut pubsub = client
                .get_async_pubsub()
                .await
                .map_err(|e| redis_error(OP, e))?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| redis_error(OP, e))?;
            let notices = pubsub.into_on_message().filter_map(|message| async move {
                std::str::from_utf8(message.get_payload_bytes())
                    .ok()
                    .map(str::to_owned)
            });
            let notices: Notices = Box::pin(notices);
            Ok(notices)
        })
    })
}
