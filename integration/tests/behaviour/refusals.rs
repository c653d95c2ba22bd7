//! What fails closed before the body runs, and what says that the body ran.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idem::{Error, Idem, idempotent};

use crate::common::{CountingStore, DownStore, effect, effects, unique};
use crate::{call, register_payment};

#[tokio::test]
async fn an_unreachable_store_fails_closed() {
    let idem = Idem::with_store(DownStore);
    let run = unique("run");
    let err = idem
        .scope("tenant-a")
        .run(call(&run, 500))
        .await
        .unwrap_err();
    let Error::Store(store) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(store.kind(), idem::StoreErrorKind::Unavailable);
    assert!(!err.body_ran());
    assert_eq!(effects(&run), 0, "no store, no effect");
}

#[tokio::test]
async fn a_store_failing_at_completion_says_the_body_ran() {
    let store = Arc::new(CountingStore::default());
    store
        .fail_completions
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The completion is tried again for 200 ms, then given up.
    let idem = Idem::builder()
        .completion_retry(Duration::from_millis(200))
        .build(store.clone());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let started = Instant::now();
    let err = tenant.run(call(&run, 500)).await.unwrap_err();
    let took = started.elapsed();
    let Error::CompletionFailed { attempts, .. } = &err else {
        panic!("not a plain store error, which would say the body did not run: {err:?}");
    };
    assert!(*attempts > 1, "tried again: {err}");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert!(err.body_ran() && !err.is_store());
    assert!(!err.to_string().contains(&run), "no raw key in: {err}");
    assert_eq!(effects(&run), 1);

    store
        .fail_completions
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let again = tenant.run(call(&run, 500)).await.expect("call");
    assert!(
        again.is_in_flight(),
        "the unrecorded claim keeps the key until its lease lapses: {again:?}"
    );
    assert_eq!(effects(&run), 1, "the retry did not run the body again");
}

#[tokio::test]
async fn a_store_blip_at_completion_is_ridden_out_and_the_call_is_fresh() {
    let store = Arc::new(CountingStore::default());
    store
        .fail_completions_left
        .store(3, std::sync::atomic::Ordering::SeqCst);
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let fresh = tenant.run(call(&run, 500)).await.expect("call");
    assert!(fresh.is_fresh(), "{fresh:?}");
    let replayed = tenant.run(call(&run, 500)).await.expect("call");
    assert!(replayed.is_replayed(), "{replayed:?}");
    assert_eq!(effects(&run), 1);
}

#[tokio::test]
async fn an_invalid_key_is_refused_before_the_store_is_touched() {
    let store = Arc::new(CountingStore::default());
    let idem = Idem::with_store(store.clone());
    let tenant = idem.scope("tenant-a");
    for bad in ["", "run 9", "señal", &"x".repeat(256)] {
        let err = tenant
            .run(register_payment(bad.to_owned(), "s".into(), "c".into(), 5))
            .await
            .unwrap_err();
        let Error::InvalidKey { tool, part, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!((*tool, *part), ("payments.register", "run_id"));
        if !bad.is_empty() {
            assert!(
                !err.to_string().contains(bad),
                "the message never shows the key: {err}"
            );
        }
        assert_eq!(effects(bad), 0);
    }
    assert_eq!(store.count(), 0, "the store was never asked");
    for tenant in [String::new(), "t".repeat(256), "nul\0byte".to_owned()] {
        let err = idem
            .scope(tenant.clone())
            .run(call(&unique("run"), 5))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidTenant { .. }),
            "{tenant:?}: {err:?}"
        );
    }
    assert_eq!(store.count(), 0);
}

#[idempotent(key = "run_id", mutating, name = "limits.report")]
async fn big_report(run_id: String, size: usize) -> Result<String, String> {
    effect(&run_id);
    Ok("x".repeat(size))
}

#[tokio::test]
async fn a_result_too_large_to_keep_is_an_error_never_truncated_and_never_run_twice() {
    let idem = Idem::builder()
        .max_result_bytes(1024)
        .build(idem::store::memory::MemoryStore::new());
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let err = tenant.run(big_report(run.clone(), 4096)).await.unwrap_err();
    let Error::ResultTooLarge {
        size,
        limit,
        replayed: false,
        ..
    } = &err
    else {
        panic!("{err:?}")
    };
    assert_eq!((*size > 4096, *limit), (true, 1024));
    assert!(err.body_ran(), "the effect happened");
    assert!(!err.to_string().contains(&run), "{err}");
    let again = tenant.run(big_report(run.clone(), 4096)).await.unwrap_err();
    assert!(
        matches!(again, Error::ResultTooLarge { replayed: true, .. }),
        "{again:?}"
    );
    assert!(!again.body_ran());
    assert_eq!(effects(&run), 1, "the body ran once");
    // Under the limit, as before.
    let small = unique("run");
    let out = tenant.run(big_report(small.clone(), 100)).await.unwrap();
    assert!(out.is_fresh());
    assert!(
        tenant
            .run(big_report(small, 100))
            .await
            .unwrap()
            .is_replayed()
    );
    assert_eq!(idem::DEFAULT_MAX_RESULT_BYTES, 16 << 20);
}

#[tokio::test]
async fn a_store_with_a_smaller_limit_of_its_own_lowers_the_runtimes() {
    let store = Arc::new(CountingStore::default());
    store.result_limit.store(2048, Ordering::SeqCst);
    let idem = Idem::with_store(store.clone());
    assert_eq!(idem.max_result_bytes(), 2048, "the smaller of the two");
    let tenant = idem.scope("tenant-a");
    let run = unique("run");
    let err = tenant.run(big_report(run.clone(), 4096)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ResultTooLarge {
                limit: 2048,
                replayed: false,
                ..
            }
        ),
        "{err:?}"
    );
    let again = tenant.run(big_report(run.clone(), 4096)).await.unwrap_err();
    assert!(
        matches!(again, Error::ResultTooLarge { replayed: true, .. }),
        "{again:?}"
    );
    assert_eq!(effects(&run), 1, "never truncated, never run twice");
    // A store's limit above the runtime's leaves the runtime's.
    store.result_limit.store(usize::MAX - 1, Ordering::SeqCst);
    assert_eq!(idem.max_result_bytes(), idem::DEFAULT_MAX_RESULT_BYTES);
}

#[tokio::test]
async fn arguments_too_large_to_fingerprint_are_refused_before_the_store() {
    #[idempotent(key = "run_id", mutating, name = "limits.upload")]
    async fn upload(run_id: String, blob: String) -> Result<usize, String> {
        effect(&run_id);
        Ok(blob.len())
    }
    let store = Arc::new(CountingStore::default());
    let idem = Idem::with_store(store.clone());
    let run = unique("run");
    let blob = "b".repeat(idem::DEFAULT_MAX_ARGUMENT_BYTES);
    let err = idem
        .scope("tenant-a")
        .run(upload(run.clone(), blob))
        .await
        .unwrap_err();
    let Error::Unfingerprintable { source, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(
        matches!(source, idem::canonical::CanonicalError::TooLarge { limit, .. } if *limit == 1 << 20),
        "{source:?}"
    );
    assert!(!err.body_ran());
    assert_eq!(store.count(), 0, "the store was never asked");
    assert_eq!(effects(&run), 0);
    let small = idem
        .scope("tenant-a")
        .run(upload(run.clone(), "b".repeat(1000)))
        .await;
    assert!(small.unwrap().is_fresh());

    // The limit is the runtime's to set: 2,000 bytes refuses what 1 MiB took.
    let strict = Idem::builder()
        .max_argument_bytes(2_000)
        .build(store.clone());
    assert_eq!(strict.max_argument_bytes(), 2_000);
    let other = unique("run");
    let err = strict
        .scope("tenant-a")
        .run(upload(other.clone(), "b".repeat(3_000)))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Unfingerprintable { source: idem::canonical::CanonicalError::TooLarge { limit: 2_000, size }, .. } if *size > 3_000),
        "{err:?}"
    );
    assert!(!err.body_ran());
    assert_eq!(effects(&other), 0);
    let fits = strict
        .scope("tenant-a")
        .run(upload(other.clone(), "b".repeat(1_900)))
        .await;
    assert!(fits.unwrap().is_fresh());
}
