//! Settlement notices: a completion that asks to notify, and every release, sends `NOTIFY` on
//! the schema's channel in its own statement (delivered when it commits); the store's
//! [`Listener`](idem_core::store::listener::Listener) subscribes with [`subscribe`]: a
//! connection of its own, outside the pool (same options, TLS included), that `LISTEN`s.
//!
//! No listener subscribes through a transaction pooler (a `LISTEN` needs a session) or over a
//! pool handed in (idem cannot open a connection of its own): those waiting callers poll. A
//! `NOTIFY` takes a lock at commit that serializes the commits that send one: that is why only
//! the completions of tools that declare `wait` send one.

use std::future::poll_fn;

use idem_core::store::listener::{Notices, Subscribe};
use tokio_postgres::AsyncMessage;

use crate::driver::{BACKEND, pg_error};
use crate::tls::Connector;
use idem_core::{StoreError, StoreErrorKind};

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

/// Subscribes by connecting with `config` and `LISTEN`ing to `channel`; the notices end when
/// the connection does.
pub(crate) fn subscribe(
    config: tokio_postgres::Config,
    connector: Connector,
    channel: String,
) -> Subscribe {
    Box::new(move || {
        let (config, connector) = (config.clone(), connector.clone());
        let statement = format!("LISTEN \"{}\"", channel.replace('"', "\"\""));
        Box::pin(async move {
            const OP: &str = "listening for settlements";
            let (client, mut connection) = config
                .connect(connector)
                .await
                .map_err(|e| pg_error(OP, e))?;
            // The connection answers the `LISTEN` only while it is polled.
            {
                let mut listen = std::pin::pin!(client.batch_execute(&statement));
                loop {
                    tokio::select! {
                        done = &mut listen => {
                            done.map_err(|e| pg_error(OP, e))?;
                            break;
                        }
                        message = poll_fn(|cx| connection.poll_message(cx)) => match message {
                            Some(Ok(_)) => {}
                            Some(Err(e)) => return Err(pg_error(OP, e)),
                            None => {
                                return Err(StoreError::new(
                                    BACKEND,
                                    StoreErrorKind::Unavailable,
                                    format!("{OP}: the connection closed"),
                                ));
                            }
                        },
                    }
                }
            }
            let notices = futures_util::stream::unfold(
                (client, connection),
                |(client, mut connection)| async move {
                    loop {
                        match poll_fn(|cx| connection.poll_message(cx)).await {
                            Some(Ok(AsyncMessage::Notification(notice))) => {
                                let payload = notice.payload().to_owned();
                                return Some((payload, (client, connection)));
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => return None,
                        }
                    }
                },
            );
            let notices: Notices = Box::pin(notices);
            Ok(notices)
        })
    })
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
