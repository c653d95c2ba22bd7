//! What the checks share: fixed times, a tenant of their own, keys, fingerprints, and requests
//! with the suite's lease and TTL.

use std::time::Duration;

use crate::fingerprint::Fingerprint;
use crate::key::{IdempotencyKey, KeyPart, derive_key};
use crate::store::{
    Claim, ClaimRequest, Completion, FencingToken, Orphans, RecordStatus, Renewal, Store,
};

pub(super) const T0: u64 = 1_700_000_000_000;

pub(super) const LEASE: Duration = Duration::from_secs(30);

pub(super) const TTL: Duration = Duration::from_secs(24 * 3600);

pub(super) fn tenant() -> String {
    format!("conformance-{}", uuid::Uuid::new_v4())
}

pub(super) fn key(tenant: &str, n: u32) -> IdempotencyKey {
    derive_key(
        tenant,
        "conformance.tool",
        &[KeyPart::new(&n).expect("key part")],
    )
}

pub(super) fn fp(b: u8) -> Fingerprint {
    Fingerprint::from_bytes([b; 32])
}

pub(super) fn claim<'a>(
    tenant: &'a str,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    now: u64,
) -> ClaimRequest<'a> {
    ClaimRequest {
        tenant,
        key,
        tool: "conformance.tool",
        fingerprint,
        now,
        lease: LEASE,
        ttl: TTL,
        orphans: Orphans::TakeOver,
    }
}

pub(super) fn completion<'a>(
    tenant: &'a str,
    key: IdempotencyKey,
    token: FencingToken,
    result: &'a [u8],
    now: u64,
) -> Completion<'a> {
    Completion {
        tenant,
        key,
        token,
        status: RecordStatus::Completed,
        result,
        now,
        ttl: TTL,
        notify: true,
    }
}

pub(super) fn renewal(
    tenant: &str,
    key: IdempotencyKey,
    token: FencingToken,
    now: u64,
) -> Renewal<'_> {
    Renewal {
        tenant,
        key,
        token,
        now,
        lease: LEASE,
    }
}

pub(super) fn with_orphans(req: ClaimRequest<'_>, orphans: Orphans) -> ClaimRequest<'_> {
    ClaimRequest { orphans, ..req }
}

pub(super) async fn status_of(
    store: &dyn Store,
    tenant: &str,
    key: IdempotencyKey,
) -> RecordStatus {
    store
        .lookup(tenant, key)
        .await
        .expect("lookup")
        .expect("a record")
        .status
}

pub(super) async fn acquire(store: &dyn Store, req: ClaimRequest<'_>) -> FencingToken {
    match store.claim(req).await.expect("claim") {
        Claim::Acquired { token, .. } => token,
        other => panic!("expected the claim to be acquired, got {other:?}"),
    }
}

pub(super) fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}
