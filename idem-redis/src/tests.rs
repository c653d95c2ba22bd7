//! The store's tests: the conformance suite on Redis 7 and on Valkey, both fencings, and what
//! the store does beyond the contract (its keys, its probes, its settlements).

use super::record::record_key;
use super::*;

/// Redis Cluster's slot of a key (CRC16/XMODEM of the hash tag, or of the key, mod 16384).
fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[test]
fn a_tenants_records_share_one_cluster_slot_whatever_the_tenant() {
    assert_eq!(cluster_slot("123456789"), 12739, "CRC16/XMODEM check value");
    let keys = |tenant: &str| -> Vec<String> {
        (0..50u32)
            .map(|n| {
                let key = idem_core::key::derive_key(
                    tenant,
                    "tool",
                    &[idem_core::key::KeyPart::new(&n).unwrap()],
                );
                record_key("idem", tenant, &key)
            })
            .collect()
    };
    for tenant in ["acme", "{evil}", "a}b{c", "x:y", "ñandú", "}", "{}"] {
        let keys = keys(tenant);
        let slot = cluster_slot(&keys[0]);
        assert!(
            keys.iter().all(|k| cluster_slot(k) == slot),
            "tenant {tenant:?}: one slot for all its records"
        );
        assert!(
            keys.iter()
                .all(|k| k.matches('{').count() == 1 && k.matches('}').count() == 1)
        );
    }
    assert_ne!(
        keys("a")[0],
        keys("b")[0],
        "different tenants, different keys"
    );
}

mod conformance {
    async fn store() -> Option<super::RedisStore> {
        let url = idem_core::store::conformance::test_server_url("IDEM_TEST_REDIS_URL")?;
        Some(
            super::RedisStore::open_url(&url)
                .await
                .expect("IDEM_TEST_REDIS_URL names a reachable server"),
        )
    }
    idem_core::store_conformance_tests!(maybe: store());
    idem_core::admin_conformance_tests!(maybe: store());

    /// Two stores on one prefix are two processes: the server's pub/sub carries
    /// settlements.
    #[tokio::test]
    async fn settlements_in_another_process_wake_watches_by_notice() {
        let (Some(here), Some(there)) = (store().await, store().await) else {
            return;
        };
        idem_core::store::conformance::settlements_elsewhere_wake_watches(&here, &there).await;
    }

    /// A stream's hash lives as long as its record (an append gives it the record's time,
    /// a completion the record's new one) and goes with it (a release, an operator's
    /// delete).
    #[tokio::test]
    async fn a_streams_chunks_live_and_go_with_their_record() {
        use idem_core::clock::Clock as _;
        use idem_core::store::{ChunkAppend, Claim, ClaimRequest, Fenced, Store};
        let Some(store) = store().await else { return };
        let tenant = format!("stream-{}", uuid::Uuid::new_v4().simple());
        let chunks = vec![vec![5u8; 10]; 3];
        let ttl = |name: String| {
            let mut conn = store.conn.clone();
            async move {
                redis::cmd("PTTL")
                    .arg(name)
                    .query_async::<i64>(&mut conn)
                    .await
                    .expect("PTTL")
            }
        };
        let now = idem_core::clock::SystemClock.now();
        let mut held = Vec::new();
        for n in 0..2u32 {
            let key = idem_core::key::derive_key(
                &tenant,
                "tool",
                &[idem_core::key::KeyPart::new(&n).unwrap()],
            );
            let claim = store.claim(ClaimRequest {
                tenant: &tenant,
                key,
                tool: "tool",
                fingerprint: idem_core::Fingerprint::from_bytes([7; 32]),
                now,
                lease: std::time::Duration::from_secs(30),
                ttl: std::time::Duration::from_secs(60),
                orphans: idem_core::store::Orphans::TakeOver,
            });
            let Claim::Acquired { token, .. } = claim.await.expect("claim") else {
                panic!("a new key is acquired");
            };
            let append = ChunkAppend {
                tenant: &tenant,
                key,
                token,
                first: 0,
                chunks: &chunks,
            };
            assert_eq!(
                store.append_chunks(append).await.expect("append"),
                Fenced::Applied
            );
            let record = store.record_key(&tenant, &key);
            let (r, s) = (
                ttl(record.clone()).await,
                ttl(format!("{record}:stream")).await,
            );
            assert!(
                s > 0 && (r - s).abs() < 1_000,
                "record {r} ms, stream {s} ms"
            );
            held.push((key, token, record));
        }
        let (key, token, record) = &held[0];
        let completion = idem_core::store::Completion {
            tenant: &tenant,
            key: *key,
            token: *token,
            status: idem_core::store::RecordStatus::Completed,
            result: b"done",
            now,
            ttl: std::time::Duration::from_secs(3_600),
            notify: false,
        };
        assert_eq!(
            store.complete(completion).await.expect("complete"),
            Fenced::Applied
        );
        let (r, s) = (
            ttl(record.clone()).await,
            ttl(format!("{record}:stream")).await,
        );
        assert!(
            s > 3_000_000 && (r - s).abs() < 1_000,
            "record {r} ms, stream {s} ms"
        );
        let deleted = idem_core::store::admin::AdminStore::delete(&store, &tenant, *key);
        assert_eq!(deleted.await.expect("delete"), Fenced::Applied);
        assert_eq!(
            ttl(format!("{record}:stream")).await,
            -2,
            "deleted with its record"
        );
        let (key, token, record) = &held[1];
        assert_eq!(
            store.release(&tenant, *key, *token).await.expect("release"),
            Fenced::Applied
        );
        assert_eq!(
            ttl(format!("{record}:stream")).await,
            -2,
            "released with its record"
        );
    }

    /// Without a native compare-and-set, a new key's settlements are one compare-and-set
    /// script each: the full scripts never run.
    #[tokio::test]
    async fn a_new_keys_settlements_are_one_compare_and_set_script() {
        let Some(store) = store().await else { return };
        if store.fencing.set {
            return; // the server's own: tested on Valkey
        }
        super::settlements_are_one_compare_and_set(store, false).await;
    }

    #[tokio::test]
    async fn the_plain_claim_is_used_when_the_server_takes_it() {
        let Some(store) = store().await else { return };
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut store.conn.clone())
            .await
            .expect("INFO");
        assert_eq!(store.set_nx_get, super::super::takes_set_nx_get(&info));
    }

    /// The contract on a store over a connection manager its user built, with a prefix and
    /// a replica wait of its own (the test server has no replica: `wait_replicas=0`).
    mod own_connection {
        async fn store() -> Option<super::super::RedisStore> {
            let url = idem_core::store::conformance::test_server_url("IDEM_TEST_REDIS_URL")?;
            let client = redis::Client::open(url.as_str()).expect("a client");
            let manager = redis::aio::ConnectionManager::new(client)
                .await
                .expect("the user's connection");
            let options = super::super::RedisOptions::from_url(&format!("{url}?prefix=idem-own"))
                .expect("options");
            Some(
                super::super::RedisStore::from_connection_manager(manager, &options)
                    .await
                    .expect("the layout is checked through the user's connection"),
            )
        }
        idem_core::store_conformance_tests!(maybe: store());
    }

    /// A run of replays from another process (no replay cache) makes claims read first; two
    /// new keys in a row make them write first again, each answered as before.
    #[tokio::test]
    async fn a_run_of_replays_reads_first_and_new_keys_end_it() {
        use super::settle::{claimed, completion, request};
        use idem_core::store::{Claim, Fenced, Store};
        let Some(url) = idem_core::store::conformance::test_server_url("IDEM_TEST_REDIS_URL")
        else {
            return;
        };
        let store = super::RedisStore::open_url(&format!("{url}?prefix=idem-rf&replay_cache=0"))
            .await
            .expect("IDEM_TEST_REDIS_URL names a reachable server");
        let tenant = format!("read-first-{}", uuid::Uuid::new_v4().simple());
        let (key, token) = claimed(&store, &tenant, 0).await;
        assert_eq!(
            store
                .complete(completion(&tenant, key, token))
                .await
                .unwrap(),
            Fenced::Applied
        );
        assert!(!store.read_first.wanted(), "a new key's claim wrote");
        let replay = || request(&tenant, key);
        let mut replays = 0;
        while !store.read_first.wanted() {
            let claim = store.claim(replay()).await.unwrap();
            assert!(matches!(claim, Claim::Completed { .. }), "{claim:?}");
            replays += 1;
            assert!(replays < 100, "replays never made claims read first");
        }
        for _ in 0..10 {
            let claim = store.claim(replay()).await.unwrap();
            assert!(
                matches!(&claim, Claim::Completed { result } if result == b"{\"ok\":1}"),
                "{claim:?}"
            );
        }
        claimed(&store, &tenant, 1).await;
        claimed(&store, &tenant, 2).await;
        assert!(!store.read_first.wanted(), "two new keys in a row");
    }

    /// Every claim reads first (`GET`), as under a run of replays: the read answers only what
    /// the claim would have answered.
    mod read_first {
        async fn store() -> Option<super::super::RedisStore> {
            let store = super::store().await?;
            Some(super::super::RedisStore {
                read_first: std::sync::Arc::new(idem_core::store::read_first::ReadFirst::always()),
                ..store
            })
        }
        idem_core::store_conformance_tests!(maybe: store());
    }

    /// Every claim through the script, as on a server before Redis 7.0.
    mod scripts_only {
        async fn store() -> Option<super::super::RedisStore> {
            let store = super::store().await?;
            Some(super::super::RedisStore {
                set_nx_get: false,
                ..store
            })
        }
        idem_core::store_conformance_tests!(maybe: store());
    }
}

mod settle {
    use super::RedisStore;
    use idem_core::store::{Claim, ClaimRequest, Completion, RecordStatus, Store};

    /// A claim of a new key on `store`, for `tenant`.
    pub(super) async fn claimed(
        store: &RedisStore,
        tenant: &str,
        n: u32,
    ) -> (
        idem_core::key::IdempotencyKey,
        idem_core::store::FencingToken,
    ) {
        let key = idem_core::key::derive_key(
            tenant,
            "tool",
            &[idem_core::key::KeyPart::new(&n).unwrap()],
        );
        let claim = store.claim(request(tenant, key)).await.expect("claim");
        let Claim::Acquired {
            token,
            takeover: false,
        } = claim
        else {
            panic!("a new key is acquired: {claim:?}");
        };
        (key, token)
    }

    /// The claim of `key` that [`claimed`] sends: a fixed fingerprint, a 30 s lease, a 60 s TTL.
    pub(super) fn request(tenant: &str, key: idem_core::key::IdempotencyKey) -> ClaimRequest<'_> {
        use idem_core::clock::Clock as _;
        ClaimRequest {
            tenant,
            key,
            tool: "tool",
            fingerprint: idem_core::Fingerprint::from_bytes([7; 32]),
            now: idem_core::clock::SystemClock.now(),
            lease: std::time::Duration::from_secs(30),
            ttl: std::time::Duration::from_secs(60),
            orphans: idem_core::store::Orphans::TakeOver,
        }
    }

    pub(super) fn completion<'a>(
        tenant: &'a str,
        key: idem_core::key::IdempotencyKey,
        token: idem_core::store::FencingToken,
    ) -> Completion<'a> {
        use idem_core::clock::Clock as _;
        Completion {
            tenant,
            key,
            token,
            status: RecordStatus::Completed,
            result: b"{\"ok\":1}",
            now: idem_core::clock::SystemClock.now(),
            ttl: std::time::Duration::from_secs(60),
            notify: true,
        }
    }

    /// A new key's claim settles by one compare-and-set of its record: renewed (twice),
    /// completed, or released, with the full settlement scripts failing (and, on a server that
    /// compares and sets on its own, `native`, the emulating script too); a call that appended
    /// chunks takes the full script.
    pub(super) async fn settlements_are_one_compare_and_set(store: RedisStore, native: bool) {
        use idem_core::clock::Clock as _;
        use idem_core::store::{ChunkAppend, Fenced, RecordStatus, Renewal, Store};
        let failing = || redis::Script::new("return redis.error_reply('a script ran')");
        let scripts = super::Scripts {
            complete: failing(),
            renew: failing(),
            release: failing(),
            compare_and_set: if native {
                failing()
            } else {
                redis::Script::new(super::COMPARE_AND_SET)
            },
            ..super::scripts()
        };
        let store = RedisStore {
            scripts: std::sync::Arc::new(scripts),
            ..store
        };
        let tenant = format!("native-{}", uuid::Uuid::new_v4().simple());
        let (key, token) = claimed(&store, &tenant, 1).await;
        let renewal = Renewal {
            tenant: &tenant,
            key,
            token,
            now: idem_core::clock::SystemClock.now(),
            lease: std::time::Duration::from_secs(40),
        };
        assert_eq!(store.renew(renewal).await.expect("renew"), Fenced::Applied);
        assert_eq!(
            store.renew(renewal).await.expect("renew again"),
            Fenced::Applied
        );
        let done = store
            .complete(completion(&tenant, key, token))
            .await
            .expect("complete");
        assert_eq!(done, Fenced::Applied);
        let record = store
            .lookup(&tenant, key)
            .await
            .expect("lookup")
            .expect("a record");
        assert_eq!(record.status, RecordStatus::Completed);
        assert_eq!(record.result.as_deref(), Some(&b"{\"ok\":1}"[..]));
        assert!(
            record.lease_expires_at >= renewal.now + 40_000,
            "the renewed lease"
        );

        let (key, token) = claimed(&store, &tenant, 2).await;
        assert_eq!(
            store.release(&tenant, key, token).await.expect("release"),
            Fenced::Applied
        );
        assert_eq!(store.lookup(&tenant, key).await.expect("lookup"), None);
        assert_eq!(store.written.len(), 0, "nothing kept past the settlements");

        let (key, token) = claimed(&store, &tenant, 3).await;
        let append = ChunkAppend {
            tenant: &tenant,
            key,
            token,
            first: 0,
            chunks: &[b"chunk".to_vec()],
        };
        assert_eq!(
            store.append_chunks(append).await.expect("append"),
            Fenced::Applied
        );
        let full = store.complete(completion(&tenant, key, token)).await;
        assert!(
            full.is_err(),
            "a call with chunks keeps its stream by the full script"
        );
    }
}
use settle::settlements_are_one_compare_and_set;

/// The contract on a Valkey 9 server (`IDEM_TEST_VALKEY_URL`), which compares and sets on
/// its own: the native path, and the scripts on the same server (`fencing=script`).
mod valkey {
    use super::settle::{claimed, completion};
    use idem_core::store::{Fenced, RecordStatus, Renewal, Store};

    async fn store_with(options: &str) -> Option<super::RedisStore> {
        let url = idem_core::store::conformance::test_server_url("IDEM_TEST_VALKEY_URL")?;
        let url = format!("{url}?{options}");
        Some(
            super::RedisStore::open_url(&url)
                .await
                .expect("IDEM_TEST_VALKEY_URL names a reachable server"),
        )
    }

    async fn store() -> Option<super::RedisStore> {
        let store = store_with("prefix=idem-valkey").await?;
        assert_eq!(
            store.fencing,
            super::native::Fencing {
                set: true,
                delete: true
            },
            "a Valkey 9 server compares and sets on its own"
        );
        Some(store)
    }
    idem_core::store_conformance_tests!(maybe: store());
    idem_core::admin_conformance_tests!(maybe: store());

    mod scripts {
        async fn store() -> Option<super::super::RedisStore> {
            let store = super::store_with("prefix=idem-valkey-lua&fencing=script").await?;
            assert_eq!(store.fencing, super::super::native::Fencing::default());
            Some(store)
        }
        idem_core::store_conformance_tests!(maybe: store());
    }

    /// A server with `SET … IFEQ` but without `DELIFEQ` (Valkey 8.1, Redis 8.4, whose
    /// `DELEX` idem does not send): native completions and renewals, scripted releases.
    mod set_only {
        async fn store() -> Option<super::super::RedisStore> {
            let store = super::store_with("prefix=idem-valkey-set").await?;
            Some(super::super::RedisStore {
                fencing: super::super::native::Fencing {
                    set: true,
                    delete: false,
                },
                ..store
            })
        }
        idem_core::store_conformance_tests!(maybe: store());
    }

    /// The completion, the renewal and the release of a new key's claim send no script at
    /// all: the server compares and sets.
    #[tokio::test]
    async fn a_new_keys_settlements_are_the_servers_own_compare_and_set() {
        let Some(store) = store().await else { return };
        super::settlements_are_one_compare_and_set(store, true).await;
    }

    /// A native write that finds another value than the one its claim wrote (here another
    /// process renewed the lease by script) hands over to the script, which applies it;
    /// and a token that lost the key loses natively and by script alike.
    #[tokio::test]
    async fn a_native_write_that_finds_another_value_is_decided_by_the_script() {
        use idem_core::clock::Clock as _;
        let (Some(here), Some(there)) = (store().await, store().await) else {
            return;
        };
        let tenant = format!("native-{}", uuid::Uuid::new_v4().simple());
        let (key, token) = claimed(&here, &tenant, 1).await;
        let renewal = Renewal {
            tenant: &tenant,
            key,
            token,
            now: idem_core::clock::SystemClock.now(),
            lease: std::time::Duration::from_secs(45),
        };
        assert_eq!(
            there.renew(renewal).await.expect("renew elsewhere"),
            Fenced::Applied
        );
        let done = here
            .complete(completion(&tenant, key, token))
            .await
            .expect("complete");
        assert_eq!(done, Fenced::Applied);
        let record = here
            .lookup(&tenant, key)
            .await
            .expect("lookup")
            .expect("a record");
        assert_eq!(record.status, RecordStatus::Completed);

        let (key, token) = claimed(&here, &tenant, 2).await;
        let deleted = idem_core::store::admin::AdminStore::delete(&there, &tenant, key);
        assert_eq!(deleted.await.expect("delete"), Fenced::Applied);
        let lost = here
            .complete(completion(&tenant, key, token))
            .await
            .expect("complete");
        assert_eq!(lost, Fenced::Lost);
        let (key, token) = claimed(&here, &tenant, 3).await;
        let deleted = idem_core::store::admin::AdminStore::delete(&there, &tenant, key);
        assert_eq!(deleted.await.expect("delete"), Fenced::Applied);
        assert_eq!(
            here.release(&tenant, key, token).await.expect("release"),
            Fenced::Lost
        );
    }

    /// The health check says which fencing the store uses.
    #[tokio::test]
    async fn the_health_check_names_the_fencing() {
        let (Some(native), Some(scripts)) = (store().await, store_with("fencing=script").await)
        else {
            return;
        };
        let native = native
            .health()
            .await
            .expect("health")
            .fencing
            .expect("said");
        assert!(native.contains("SET … IFEQ, DELIFEQ"), "{native}");
        let scripts = scripts
            .health()
            .await
            .expect("health")
            .fencing
            .expect("said");
        assert!(scripts.starts_with("Lua scripts"), "{scripts}");
    }
}

#[test]
fn set_nx_get_is_used_from_redis_7() {
    use super::takes_set_nx_get;
    assert!(takes_set_nx_get(
        "# Server\r\nredis_version:7.0.15\r\nredis_mode:standalone\r\n"
    ));
    assert!(takes_set_nx_get(
        "redis_version:7.2.4\r\nvalkey_version:8.0.1\r\n"
    ));
    assert!(takes_set_nx_get("redis_version:10.0.0"));
    assert!(!takes_set_nx_get("# Server\r\nredis_version:6.2.14\r\n"));
    assert!(!takes_set_nx_get("redis_version:garbage"));
    assert!(!takes_set_nx_get(""));
}
