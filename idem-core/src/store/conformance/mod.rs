//! The store contract as executable checks, run against every backend.
//!
//! A backend's test file only says how to build the store:
//!
//! ```ignore
//! idem::store_conformance_tests!(async { MyStore::connect("…").await.unwrap() });
//! ```
//!
//! Each check uses tenants of its own (`conformance-<uuid>`), so the checks can run in parallel
//! against one shared server. Times are explicit (`now` in every request), so no check sleeps.
//! The checks panic with a message naming the rule that failed.

mod admin;
mod batches;
mod blobs;
mod claims;
mod records;
mod streams;
mod support;

pub use self::admin::*;
pub use self::batches::*;
pub use self::blobs::*;
pub use self::claims::*;
pub use self::records::*;
pub use self::streams::*;

/// Generates one `#[tokio::test]` per conformance check for the store that `$make` (an
/// expression evaluating to a future of the store) builds. Needs `tokio` with `macros` and
/// `rt-multi-thread` in the calling crate.
///
/// For a server that may be absent, `store_conformance_tests!(maybe: $make)` takes a future of
/// `Option<store>`; `None` skips each check (see [`test_server_url`]).
#[macro_export]
macro_rules! store_conformance_tests {
    (maybe: $make:expr) => {
        $crate::store_conformance_tests!(@each dyn $crate::store::Store; $make;
            acquire_complete_replay,
            mismatch_is_checked_first,
            lapsed_lease_is_taken_over_and_fenced,
            renewal_extends_the_lease_and_is_fenced,
            blocked_orphans_become_unknown,
            unknown_records_block_until_reconciled,
            release_is_fenced_and_frees_the_key,
            expired_records_are_new_intents,
            tenants_are_isolated,
            hostile_tenants_stay_apart,
            purge_is_bounded_and_spares_live_records,
            concurrent_claims_have_one_winner,
            results_are_stored_byte_exact,
            health_reports_the_current_schema,
            settlements_wake_watches,
            a_completion_sent_again_is_recognised,
            batches_answer_item_by_item,
            batch_renewals_are_fenced_item_by_item,
            streams_read_back_in_order,
            appends_sent_again_apply_once,
            streams_are_fenced_by_their_holder
        );
    };
    ($make:expr) => {
        $crate::store_conformance_tests!(maybe: async { ::core::option::Option::Some($make.await) });
    };
    (@each $store:ty; $make:expr; $($check:ident),*) => {$(
        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $check() {
            let ::core::option::Option::Some(store) = $make.await else {
                return;
            };
            let store: ::std::sync::Arc<$store> = ::std::sync::Arc::new(store);
            $crate::store::conformance::$check(store).await;
        }
    )*};
}

/// Generates one `#[tokio::test]` per admin conformance check ([`AdminStore`](crate::store::admin::AdminStore)): the same
/// shapes as [`store_conformance_tests!`](crate::store_conformance_tests).
#[macro_export]
macro_rules! admin_conformance_tests {
    (maybe: $make:expr) => {
        $crate::store_conformance_tests!(@each dyn $crate::store::admin::AdminStore; $make;
            scan_walks_a_tenant_in_pages,
            resolve_settles_only_blocked_records,
            large_results_are_stored_once_per_tenant,
            the_last_record_naming_a_blob_deletes_it,
            only_the_holder_writes_a_blob,
            large_chunks_are_blobs_let_go_with_their_stream
        );
    };
    ($make:expr) => {
        $crate::admin_conformance_tests!(maybe: async { ::core::option::Option::Some($make.await) });
    };
}

/// The URL of a test server from the environment variable `var`
/// (`IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL`).
///
/// Unset, it returns `None` after printing why the test is skipped, unless
/// `IDEM_REQUIRE_BACKENDS=1`, which makes a missing server a failure (CI sets it).
pub fn test_server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("IDEM_REQUIRE_BACKENDS").as_deref() == Ok("1") => {
            panic!("{var} is not set, and IDEM_REQUIRE_BACKENDS=1 requires this backend")
        }
        _ => {
            eprintln!("skipped: set {var} to run this test against a real server");
            None
        }
    }
}
