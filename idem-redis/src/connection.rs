//! The connection a Redis store sends its commands on: one server (a multiplexed connection) or
//! a Redis Cluster (redis-rs routes each command and script by its key's slot, and follows
//! `MOVED`/`ASK` and failovers).
//!
//! A multiplexed connection pairs replies with requests by their order alone. A reply that never
//! comes back while the connection lives on (a middlebox that drops it, a server that skips it)
//! shifts every later reply onto the request before it: a claim would read another claim's
//! answer, and a body could run on a claim it does not hold. So every request that names a key
//! is **tagged**: sent in one pipeline with `ECHO <tag>`, a number no other request uses, and its
//! reply is taken only when the echo that follows it is its own tag. A request whose reply is
//! out of order, lost (the response timeout) or cut (the connection dropped) fails, and the
//! connection it used is thrown away: the next request opens a new one (within the connection
//! timeout), so one lost reply costs the requests in flight beside it, never a wrong answer.
//!
//! | connection | tagged | replaced |
//! |---|---|---|
//! | one server, opened by the store | every request | after a timeout, a drop, a reply out of order |
//! | a cluster, opened by the store | requests that name a key (claims, completions, `WAIT`) | likewise |
//! | yours ([`RedisStore::from_connection_manager`](super::RedisStore::from_connection_manager), [`from_cluster`](super::RedisStore::from_cluster)) | as above | never (idem cannot rebuild it; the manager reconnects on drops by itself) |
//!
//! On a cluster, commands that name no key and answer from every primary (`INFO`, `CONFIG`
//! in the health check) go untagged: a pipeline would send them to one node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError,
    RedisFuture, RedisResult, Value,
};

/// The TCP settings of the connections the store opens: `TCP_NODELAY`, as Redis sets on its
/// side. With Nagle's algorithm (redis-rs's default) the kernel holds back a request written
/// while an earlier one's bytes are not yet acknowledged, the common case on a multiplexed
/// connection with concurrent callers, until that acknowledgement arrives.
pub(super) fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

/// One server's URL as redis-rs connects to it, with [`tcp_settings`].
pub(super) fn server_info(url: &str) -> RedisResult<ConnectionInfo> {
    Ok(url.into_connection_info()?.set_tcp_settings(tcp_settings()))
}

/// A handle on the store's connection; clones share it.
#[derive(Clone)]
pub(super) struct Connection {
    shared: Arc<Shared>,
}

struct Shared {
    /// The connection in use and its generation, or none after one was thrown away.
    live: std::sync::Mutex<Option<(u64, Live)>>,
    /// How to open a new one.
    source: Source,
    /// Whether it is a cluster connection (the same kind is reopened).
    cluster: bool,
    /// One reconnection at a time.
    reconnecting: tokio::sync::Mutex<()>,
    /// The next tag, the next generation, and how many reconnections were tried.
    tags: AtomicU64,
    generations: AtomicU64,
    attempts: AtomicU64,
}

#[derive(Clone)]
enum Live {
    Multiplexed(MultiplexedConnection),
    Manager(ConnectionManager),
    Cluster(ClusterConnection),
}

enum Source {
    Server(Client, AsyncConnectionConfig),
    Cluster(ClusterClient),
    /// The caller's own connection: never replaced.
    Given,
}

impl Connection {
    /// Opens a connection to one server.
    pub(super) async fn to_server(
        client: Client,
        config: AsyncConnectionConfig,
    ) -> RedisResult<Self> {
        Self::opened(Source::Server(client, config)).await
    }

    /// Opens a connection to a cluster.
    pub(super) async fn to_cluster(client: ClusterClient) -> RedisResult<Self> {
        Self::opened(Source::Cluster(client)).await
    }

    /// The caller's connection manager.
    pub(super) fn given_manager(manager: ConnectionManager) -> Self {
        Self::over(Live::Manager(manager), Source::Given)
    }

    /// The caller's cluster connection.
    pub(super) fn given_cluster(cluster: ClusterConnection) -> Self {
        Self::over(Live::Cluster(cluster), Source::Given)
    }

    async fn opened(source: Source) -> RedisResult<Self> {
        let live = connect(&source).await?;
        Ok(Self::over(live, source))
    }

    fn over(live: Live, source: Source) -> Self {
        Connection {
            shared: Arc::new(Shared {
                cluster: matches!(live, Live::Cluster(_)),
                live: std::sync::Mutex::new(Some((0, live))),
                source,
                reconnecting: tokio::sync::Mutex::new(()),
                tags: AtomicU64::new(1),
                generations: AtomicU64::new(1),
                attempts: AtomicU64::new(0),
            }),
        }
    }

    /// Whether this is a cluster connection.
    pub(super) fn is_cluster(&self) -> bool {
        self.shared.cluster
    }

    fn current(&self) -> Option<(u64, Live)> {
        self.shared
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The connection in use, or a new one when the last was thrown away. One caller reopens
    /// it; the callers that waited meanwhile share its failure rather than each trying in turn,
    /// so that a request waits for at most one connection timeout.
    async fn live(&self) -> RedisResult<(u64, Live)> {
        if let Some(live) = self.current() {
            return Ok(live);
        }
        // Boxed: opening a connection is a future of kilobytes, which every request's future
        // would otherwise carry (and copy) for this rare path.
        Box::pin(self.reopen()).await
    }

    /// Opens a new connection in place of the one thrown away (see [`Connection::live`]).
    async fn reopen(&self) -> RedisResult<(u64, Live)> {
        let tried = self.shared.attempts.load(Ordering::Acquire);
        let _one_at_a_time = self.shared.reconnecting.lock().await;
        if let Some(live) = self.current() {
            return Ok(live);
        }
        if self.shared.attempts.load(Ordering::Acquire) != tried {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the connection could not be reopened just now",
            )));
        }
        self.shared.attempts.fetch_add(1, Ordering::AcqRel);
        let live = connect(&self.shared.source).await?;
        let generation = self.shared.generations.fetch_add(1, Ordering::Relaxed);
        *self
            .shared
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((generation, live.clone()));
        Ok((generation, live))
    }

    /// Throws the connection of `generation` away when `error` says it cannot be trusted.
    fn judge(&self, generation: u64, error: &RedisError) {
        if error.is_timeout() || error.is_connection_dropped() || error.is_unrecoverable_error() {
            self.discard(generation);
        }
    }

    /// Throws the connection of `generation` away, when the store can open another.
    fn discard(&self, generation: u64) {
        if matches!(self.shared.source, Source::Given) {
            return;
        }
        let mut live = self
            .shared
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.as_ref().is_some_and(|(g, _)| *g == generation) {
            *live = None;
        }
    }

    /// Sends `commands` (at most three), tagged, and returns each one's reply, an error reply
    /// as [`Value::ServerError`] (as `query_async` would not): the store's own requests on its
    /// hot path, which build their commands for this and give them up, so nothing is copied.
    pub(super) async fn send(
        &self,
        commands: impl IntoIterator<Item = Cmd>,
    ) -> RedisResult<Vec<Value>> {
        let mut pipeline = Pipeline::with_capacity(4);
        for cmd in commands {
            pipeline.add_command(cmd);
        }
        let count = pipeline.len();
        self.tagged(pipeline, count, None).await
    }

    /// Sends the `count` commands of `pipeline` with `ECHO <tag>` after them, on `route` when
    /// given (a cluster), and returns their replies once the last is the tag. The tag is the
    /// number's eight bytes as they are (`ECHO` sends back any bytes): nothing to format.
    async fn tagged(
        &self,
        mut pipeline: Pipeline,
        count: usize,
        route: Option<Route>,
    ) -> RedisResult<Vec<Value>> {
        let tag = self
            .shared
            .tags
            .fetch_add(1, Ordering::Relaxed)
            .to_le_bytes();
        pipeline.add_command(command(&[b"ECHO", &tag]));
        let (generation, live) = self.live().await?;
        let sent = match (live, route) {
            // Boxed, as the cluster's own requests are: a future of kilobytes otherwise.
            (Live::Cluster(mut conn), Some(route)) => {
                Box::pin(conn.route_pipeline(
                    pipeline,
                    0,
                    count + 1,
                    SingleNodeRoutingInfo::SpecificNode(route),
                ))
                .await
            }
            (mut live, _) => live.req_packed_commands(&pipeline, 0, count + 1).await,
        };
        let mut replies = sent.inspect_err(|e| self.judge(generation, e))?;
        match replies.pop() {
            Some(Value::BulkString(echo)) if echo == tag && replies.len() == count => Ok(replies),
            _ => {
                self.discard(generation);
                Err(out_of_order_error())
            }
        }
    }

    /// Sends an untagged command (on a cluster, one that answers from every primary).
    async fn untagged(&self, cmd: &Cmd) -> RedisResult<Value> {
        let (generation, mut live) = self.live().await?;
        let sent = live.req_packed_command(cmd).await;
        if let Err(e) = &sent {
            self.judge(generation, e);
        }
        sent
    }

    /// Sends `cmd`, which names no key, to the primary that holds `key`: `WAIT` after a write of
    /// `key`, `SCAN` of one tenant's hash tag. On one server, simply sends it.
    pub(super) async fn on_primary_of(&mut self, key: &str, cmd: &Cmd) -> RedisResult<Value> {
        let route = self
            .is_cluster()
            .then(|| Route::with_key(key, SlotAddr::Master));
        let mut replies = self.tagged(one(cmd), 1, route).await?;
        replies
            .pop()
            .ok_or_else(out_of_order_error)?
            .extract_error()
    }
}

/// Whether a command names a key idem's records live under (and so may go in a pipeline that a
/// cluster routes by that key).
fn names_a_key(cmd: &Cmd) -> bool {
    let Some(name) = cmd.args_iter().next() else {
        return false;
    };
    let redis::Arg::Simple(name) = name else {
        return false;
    };
    [
        &b"GET"[..],
        b"SET",
        b"DEL",
        b"DELIFEQ",
        b"HGET",
        b"HSET",
        b"EVALSHA",
        b"EVAL",
    ]
    .iter()
    .any(|known| name.eq_ignore_ascii_case(known))
}

async fn connect(source: &Source) -> RedisResult<Live> {
    match source {
        Source::Server(client, config) => Ok(Live::Multiplexed(
            client
                .get_multiplexed_async_connection_with_config(config)
                .await?,
        )),
        Source::Cluster(client) => Ok(Live::Cluster(client.get_async_connection().await?)),
        Source::Given => Err(RedisError::from((
            redis::ErrorKind::Client,
            "the connection the store was given is gone",
        ))),
    }
}

const OUT_OF_ORDER: &str = "a reply came back out of order (one was lost on the way, or the \
                            connection skipped one): the connection was thrown away";

fn out_of_order_error() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        OUT_OF_ORDER,
    ))
}

/// The command `args` spell (its name first), its buffers sized once: built an argument at a
/// time, a command grows them several times over.
pub(super) fn command(args: &[&[u8]]) -> Cmd {
    let mut cmd = Cmd::with_capacity(args.len(), args.iter().map(|arg| arg.len()).sum());
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// The reply to the first command [`Connection::send`] sent, an error reply as an error.
pub(super) fn first_reply(replies: Vec<Value>) -> RedisResult<Value> {
    replies
        .into_iter()
        .next()
        .ok_or_else(out_of_order_error)?
        .extract_error()
}

/// A pipeline of `cmd` alone.
fn one(cmd: &Cmd) -> Pipeline {
    let mut pipeline = redis::pipe();
    pipeline.add_command(cmd.clone());
    pipeline
}

impl Live {
    /// The connection under this one, whichever it is.
    fn inner(&mut self) -> &mut dyn ConnectionLike {
        match self {
            Live::Multiplexed(conn) => conn,
            Live::Manager(conn) => conn,
            Live::Cluster(conn) => conn,
        }
    }
}

impl ConnectionLike for Live {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.inner().req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner().req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        match self {
            Live::Multiplexed(conn) => conn.get_db(),
            Live::Manager(conn) => conn.get_db(),
            Live::Cluster(conn) => conn.get_db(),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            if self.is_cluster() && !names_a_key(cmd) {
                return self.untagged(cmd).await;
            }
            let mut replies = self.tagged(one(cmd), 1, None).await?;
            replies.pop().ok_or_else(out_of_order_error)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            // The store sends plain pipelines only (no MULTI): every reply is one command's.
            debug_assert_eq!(offset, 0, "an atomic pipeline");
            self.tagged(cmd.clone(), count, None).await
        })
    }

    fn get_db(&self) -> i64 {
        self.current().map_or(0, |(_, live)| live.get_db())
    }
}

#[cfg(test)]
mod tests {
    use super::server_info;

    /// The store's own connections send each request at once (`TCP_NODELAY`), over TLS too;
    /// the rest of the URL is redis-rs's to read.
    #[test]
    fn the_stores_connections_turn_nagles_algorithm_off() {
        for url in ["redis://127.0.0.1:6379/2", "rediss://cache.internal:6380/0"] {
            let info = server_info(url).expect("a valid URL");
            assert!(info.tcp_settings().nodelay(), "{url}");
        }
        let info = server_info("redis://127.0.0.1:6379/2").expect("a valid URL");
        assert_eq!(info.redis_settings().db(), 2);
        assert!(server_info("http://127.0.0.1:6379/").is_err());
    }
}
