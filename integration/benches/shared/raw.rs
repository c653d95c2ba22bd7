//! The hand-written baselines on the same servers: what a raw idempotency store does per call,
//! with the same connection handling as idem's.

use std::future::Future;

use crate::run_tenant;
use crate::support::{Payment, RawArgs, payment_json, raw_key};

/// A raw baseline: how to look one record up, and how to write one intent's two writes.
pub(crate) trait Raw: Send + Sync + 'static {
    fn lookup(&self) -> impl Future<Output = Payment> + Send;
    fn two_writes(&self, n: u64) -> impl Future<Output = ()> + Send;
}

/// One connection of the raw Postgres baseline, with its prepared statements.
pub(crate) struct RawConnection {
    pub(crate) client: tokio_postgres::Client,
    select: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
}

/// The raw Postgres baseline: a connection per concurrent caller (a connection runs one
/// statement at a time), handed out as idem's pool hands out its own: the idle connection used
/// last, so that a lone caller keeps one warm server process, as idem's does (spreading one
/// caller's calls over every connection in turn made each call wake a server process that had
/// slept through the others' calls, and slowed the baseline's lone caller).
pub(crate) struct RawPostgres {
    pub(crate) connections: Vec<RawConnection>,
    /// The connections no caller holds, the last one returned on top.
    idle: std::sync::Mutex<Vec<usize>>,
    tenant: String,
}

impl RawPostgres {
    /// Connects `connections` times and creates the baseline's table in the schema `raw` (new
    /// for each run, so that both sides start from empty tables of the same shape).
    pub(crate) async fn connect(url: &str, raw: &str, connections: usize) -> Self {
        let tenant = run_tenant();
        let mut opened = Vec::new();
        for _ in 0..connections {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            opened.push(client);
        }
        // The same table and index as idem's, in a schema of its own.
        opened[0]
            .batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {raw};
                 CREATE TABLE IF NOT EXISTS {raw}.raw (
                    tenant text NOT NULL, key bytea NOT NULL, tool text NOT NULL,
                    fingerprint bytea NOT NULL, status text NOT NULL, token bigint NOT NULL,
                    lease_expires_at bigint NOT NULL, created_at bigint NOT NULL,
                    expires_at bigint NOT NULL, result bytea, PRIMARY KEY (tenant, key));
                 CREATE INDEX IF NOT EXISTS raw_expires_at ON {raw}.raw (expires_at);"
            ))
            .await
            .expect("schema");
        opened[0]
            .execute(
                &format!(
                    "INSERT INTO {raw}.raw VALUES ($1, $2, 'raw', $3, 'completed', 1, 0, 0, \
                     9000000000000, $4)"
                ),
                &[
                    &tenant,
                    &&raw_key(&tenant, 7)[..],
                    &&RawArgs::payment("run-1", 7).fingerprint()[..],
                    &payment_json(7),
                ],
            )
            .await
            .expect("insert");
        let mut connections = Vec::new();
        for client in opened {
            let prepare = |sql: String| {
                let client = &client;
                async move { client.prepare(&sql).await.expect("prepare") }
            };
            let select = prepare(format!(
                "SELECT fingerprint, result FROM {raw}.raw WHERE tenant = $1 AND key = $2"
            ))
            .await;
            let insert = prepare(format!(
                "INSERT INTO {raw}.raw VALUES ($1, $2, 'raw', $3, 'in_flight', $4, \
                 30000, 0, $5, NULL) ON CONFLICT (tenant, key) DO NOTHING"
            ))
            .await;
            let update = prepare(format!(
                "UPDATE {raw}.raw SET status = 'completed', result = $3, \
                 expires_at = $5 WHERE tenant = $1 AND key = $2 AND token = $4"
            ))
            .await;
            connections.push(RawConnection {
                client,
                select,
                insert,
                update,
            });
        }
        RawPostgres {
            idle: std::sync::Mutex::new((0..connections.len()).rev().collect()),
            connections,
            tenant,
        }
    }
}

impl Raw for RawPostgres {
    async fn lookup(&self) -> Payment {
        let c = &self.connections[0];
        let args = RawArgs::payment("run-1", 7);
        let row = c
            .client
            .query_one(&c.select, &[&self.tenant, &&raw_key(&self.tenant, 7)[..]])
            .await
            .expect("select");
        args.replay(row.get::<_, &[u8]>(0), row.get::<_, &[u8]>(1))
    }

    async fn two_writes(&self, n: u64) {
        let held = self
            .idle
            .lock()
            .unwrap()
            .pop()
            .expect("no more callers than connections");
        let c = &self.connections[held];
        let key = raw_key(&self.tenant, n + 1_000);
        let (token, expires) = (n as i64, 86_400_000 + n as i64);
        let fingerprint = RawArgs::payment("run-1", n).fingerprint();
        c.client
            .execute(
                &c.insert,
                &[&self.tenant, &&key[..], &&fingerprint[..], &token, &expires],
            )
            .await
            .expect("insert");
        c.client
            .execute(
                &c.update,
                &[&self.tenant, &&key[..], &payment_json(n), &token, &expires],
            )
            .await
            .expect("update");
        self.idle.lock().unwrap().push(held);
    }
}

pub(crate) struct RawRedis {
    conn: redis::aio::MultiplexedConnection,
    pub(crate) tenant: String,
    /// The fenced completion of [`RawRedis::fenced_writes`].
    compare_and_set: redis::Script,
}

/// A compare-and-set in Lua, as a Redis without `SET … IFEQ` must fence a completion: the
/// record is replaced only if it is still the claim's. KEYS: the record. ARGV: the claim's
/// value, the completed one, the TTL in ms.
const COMPARE_AND_SET: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
";

impl RawRedis {
    pub(crate) async fn connect(url: &str) -> Self {
        use redis::IntoConnectionInfo as _;
        // `TCP_NODELAY`, as idem's connection: each request leaves when it is written.
        let nodelay = redis::io::tcp::TcpSettings::default().set_nodelay(true);
        let info = url.into_connection_info().expect("url");
        let mut conn = redis::Client::open(info.set_tcp_settings(nodelay))
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let tenant = run_tenant();
        // The fingerprint, then the result, in one value.
        let mut value = RawArgs::payment("run-1", 7).fingerprint().to_vec();
        value.extend(payment_json(7));
        let _: () = redis::cmd("SET")
            .arg(format!("idem-bench-raw:{tenant}:7"))
            .arg(value)
            .arg("PX")
            .arg(3_600_000)
            .query_async(&mut conn)
            .await
            .expect("set");
        RawRedis {
            conn,
            tenant,
            compare_and_set: redis::Script::new(COMPARE_AND_SET),
        }
    }

    /// Deletes the keys that match `pattern` (this run's), as the Postgres run drops its
    /// schemas: the runs' records would otherwise stay for their TTL, and a server holding
    /// millions of them answers every later run's lookups more slowly.
    pub(crate) async fn purge(&self, pattern: &str) -> usize {
        let mut conn = self.conn.clone();
        let (mut cursor, mut deleted) = (0u64, 0);
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut conn)
                .await
                .expect("scan");
            if !keys.is_empty() {
                let unlinked: usize = redis::cmd("UNLINK")
                    .arg(&keys)
                    .query_async(&mut conn)
                    .await
                    .expect("unlink");
                deleted += unlinked;
            }
            if next == 0 {
                return deleted;
            }
            cursor = next;
        }
    }
}

impl RawRedis {
    /// The raw two writes with the completion fenced as a server without a native
    /// compare-and-set must: `SET NX PX` of a claim carrying its token, then a Lua
    /// compare-and-set of the completed record.
    pub(crate) async fn fenced_writes(&self, n: u64) {
        let key = format!("idem-bench-raw:{}:{}", self.tenant, n + 1_000);
        let mut conn = self.conn.clone();
        let fingerprint = RawArgs::payment("run-1", n).fingerprint();
        let mut claim = fingerprint.to_vec();
        claim.extend(format!("{n:019}").bytes());
        claim_new(&mut conn, &key, &claim).await;
        let mut value = fingerprint.to_vec();
        value.extend(payment_json(n));
        let applied: i64 = self
            .compare_and_set
            .key(&key)
            .arg(&claim)
            .arg(value)
            .arg(86_400_000)
            .invoke_async(&mut conn)
            .await
            .expect("compare and set");
        assert_eq!(applied, 1);
    }
}

/// The claim of a raw baseline's new key: `SET NX PX` of `value`, which must write.
async fn claim_new(conn: &mut redis::aio::MultiplexedConnection, key: &str, value: &[u8]) {
    let claimed: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(86_400_000)
        .query_async(conn)
        .await
        .expect("set nx");
    assert!(claimed.is_some());
}

impl RawRedis {
    /// [`Raw::lookup`] sent as idem sends each request: in one pipeline with an `ECHO` of a
    /// number, whose reply is checked (what a tagged request costs over a plain one).
    #[allow(dead_code, reason = "the costs bench's, not the shared bench's")]
    pub(crate) async fn lookup_tagged(&self, tag: u64) -> Payment {
        let (bytes, echoed): (Vec<u8>, Vec<u8>) = redis::pipe()
            .cmd("GET")
            .arg(self.replayed_key())
            .cmd("ECHO")
            .arg(&tag.to_le_bytes()[..])
            .query_async(&mut self.conn.clone())
            .await
            .expect("get");
        assert_eq!(echoed, tag.to_le_bytes());
        replayed(&bytes)
    }

    /// The key of the call every lookup replays (written at connect).
    fn replayed_key(&self) -> String {
        format!("idem-bench-raw:{}:7", self.tenant)
    }
}

/// The replay of the call [`RawRedis::connect`] stored, from its value as a `GET` found it:
/// the fingerprint checked, the result deserialized.
fn replayed(value: &[u8]) -> Payment {
    let (stored, result) = value.split_at(32);
    RawArgs::payment("run-1", 7).replay(stored, result)
}

impl Raw for RawRedis {
    async fn lookup(&self) -> Payment {
        let bytes: Vec<u8> = redis::cmd("GET")
            .arg(self.replayed_key())
            .query_async(&mut self.conn.clone())
            .await
            .expect("get");
        replayed(&bytes)
    }

    async fn two_writes(&self, n: u64) {
        let key = format!("idem-bench-raw:{}:{}", self.tenant, n + 1_000);
        let mut conn = self.conn.clone();
        let fingerprint = RawArgs::payment("run-1", n).fingerprint();
        claim_new(&mut conn, &key, &fingerprint).await;
        let mut value = fingerprint.to_vec();
        value.extend(payment_json(n));
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PX")
            .arg(86_400_000)
            .query_async(&mut conn)
            .await
            .expect("set");
    }
}
