//! The claim's own parts: the record a new key's claim writes, and the decision a claim makes
//! without writing.

/// The record a claim of a new key sends reads back as that claim's record, and the
/// script's arguments cut from it are the fields the script expects.
#[test]
fn a_new_record_reads_back_as_the_claim_that_made_it() {
    use std::time::Duration;

    use super::new_record;
    use crate::record::{decode_record, layout};
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::IdempotencyKey;
    use idem_core::store::{ClaimRequest, FencingToken, Orphans, RecordStatus};

    let key = IdempotencyKey::from_bytes([2; 32]);
    let req = ClaimRequest {
        tenant: "t",
        key,
        tool: "register_payment",
        fingerprint: Fingerprint::from_bytes([1; 32]),
        now: 1_700_000_000_000,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
        orphans: Orphans::TakeOver,
    };
    let new = new_record(&req, FencingToken::from_raw(42));
    let record = decode_record("test", "t", key, new.clone()).expect("laid out as a record");
    assert_eq!(record.fingerprint, req.fingerprint);
    assert_eq!(record.status, RecordStatus::InFlight);
    assert_eq!(record.token, FencingToken::from_raw(42));
    assert_eq!(record.created_at, req.now);
    assert_eq!(record.lease_expires_at, req.now + 30_000);
    assert_eq!(record.expires_at, req.now + 3_600_000);
    assert_eq!(record.tool, "register_payment");
    assert_eq!(record.result, None);
    assert_eq!(&new[layout::CREATED], b"0001700000000000");
    assert_eq!(&new[layout::TOKEN], b"0000000000000000042");
    assert_eq!(&new[layout::TOOL_LEN.start..], b"0016register_payment");

    // Times stay below 2^53, which Lua compares exactly.
    let late = ClaimRequest {
        now: u64::MAX - 1,
        ..req
    };
    let new = new_record(&late, FencingToken::from_raw(1));
    assert_eq!(&new[layout::EXPIRES], b"9007199254740992");
    assert_eq!(&new[layout::CREATED], b"9007199254740992");
}

/// The decisions the plain command takes on its own are the script's, and it leaves to the
/// script every one that writes.
#[test]
fn a_found_record_is_decided_without_writing_only_when_nothing_changes() {
    use std::time::Duration;

    use super::decide_without_writing;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::IdempotencyKey;
    use idem_core::store::{Claim, ClaimRequest, FencingToken, Orphans, Record, RecordStatus};

    let (now, mine, theirs) = (
        1_000_000,
        FencingToken::from_raw(7),
        FencingToken::from_raw(9),
    );
    let fp = Fingerprint::from_bytes([1; 32]);
    let key = IdempotencyKey::from_bytes([2; 32]);
    let req = |orphans| ClaimRequest {
        tenant: "t",
        key,
        tool: "tool",
        fingerprint: fp,
        now,
        lease: Duration::from_secs(30),
        ttl: Duration::from_secs(3600),
        orphans,
    };
    let record = |status, token, lease_expires_at, expires_at| Record {
        tenant: "t".into(),
        key,
        tool: "tool".into(),
        fingerprint: fp,
        status,
        token,
        lease_expires_at,
        created_at: now - 10,
        expires_at,
        result: (status != RecordStatus::InFlight).then(|| b"42".to_vec()),
        note: None,
    };
    let decide = |found: Record, orphans| decide_without_writing(found, &req(orphans), mine);
    let live = now + 1;
    let (i, c, u) = (
        RecordStatus::InFlight,
        RecordStatus::Completed,
        RecordStatus::Unknown,
    );

    for orphans in [Orphans::TakeOver, Orphans::Reconcile, Orphans::Block] {
        // Expired by the caller's clock, though Redis still holds it: the script replaces it.
        assert_eq!(decide(record(c, theirs, 0, now), orphans), None);
        let other = Record {
            fingerprint: Fingerprint::from_bytes([3; 32]),
            ..record(c, theirs, 0, live)
        };
        assert_eq!(decide(other, orphans), Some(Claim::Mismatch));
        assert_eq!(
            decide(record(c, theirs, 0, live), orphans),
            Some(Claim::Completed {
                result: b"42".to_vec()
            })
        );
        assert_eq!(
            decide(record(i, theirs, live, live), orphans),
            Some(Claim::InFlight {
                lease_expires_at: live
            })
        );
        // A lapsed lease is taken over or marked: a write.
        assert_eq!(decide(record(i, theirs, now, live), orphans), None);
        // This very claim, delivered twice.
        assert_eq!(
            decide(record(i, mine, live, live), orphans),
            Some(Claim::Acquired {
                token: mine,
                takeover: true
            })
        );
        let first = Record {
            created_at: now,
            ..record(i, mine, live, live)
        };
        assert_eq!(
            decide(first, orphans),
            Some(Claim::Acquired {
                token: mine,
                takeover: false
            })
        );
    }
    assert_eq!(
        decide(record(u, theirs, 0, live), Orphans::TakeOver),
        Some(Claim::Unknown)
    );
    assert_eq!(
        decide(record(u, theirs, 0, live), Orphans::Block),
        Some(Claim::Unknown)
    );
    assert_eq!(decide(record(u, theirs, 0, live), Orphans::Reconcile), None);
}
