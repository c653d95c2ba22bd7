//! The connection a Redis store sends its commands on: one server (a reconnecting multiplexed
//! connection) or a Redis Cluster (redis-rs routes each command and script by its key's slot,
//! and follows `MOVED`/`ASK` and failovers).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// One server or a cluster.
#[derive(Clone)]
pub(super) enum Connection {
    /// One server, or a primary with replicas behind one address.
    Single(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
}

impl Connection {
    /// Whether this is a cluster connection.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Connection::Cluster(_))
    }

    /// Sends `cmd`, which names no key, to the primary that holds `key`: `WAIT` after a write of
    /// `key`, `SCAN` of one tenant's hash tag. On one server, simply sends it.
    pub(super) async fn on_primary_of(&mut self, key: &str, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(conn) => cmd.query_async(conn).await,
            Connection::Cluster(conn) => {
                let primary = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(primary));
                conn.route_command(cmd.clone(), routing).await
            }
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(conn) => conn.req_packed_command(cmd),
            Connection::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Connection::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(conn) => conn.get_db(),
            Connection::Cluster(conn) => conn.get_db(),
        }
    }
}
