//! The call of a keyed tool, step by step: [`prepare`] (refusals before the store), the
//! [`claim`](super::claim), then [`replay`] or a refusal, the tool's [`Check`] after a
//! takeover, the body, and [`settle`]. [`run`] strings them together.

use std::future::Future;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::policy::ErrorHandling;
use super::record::{encode_value, too_large_marker, too_large_record};
use super::{Claimed, Claiming, Intent, Recorded, claim_waiting};
use crate::registry::ToolInfo;
use crate::runtime::Scope;
use crate::telemetry::Observation;
use idem_core::canonical::CanonicalError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::{EncodedParts, IdempotencyKey, InvalidKey, KeyPart};
use idem_core::store::{Fenced, Orphans, RecordStatus};
use idem_core::{Error, ErrorClass};
use idem_core::{InFlight, Mismatch, Outcome, Unknown};

/// The key parts of one call, collected in declaration order.
pub struct KeyParts {
    parts: EncodedParts,
    missing: Option<&'static str>,
    invalid: Option<(&'static str, InvalidKey)>,
    /// A part the run would give, asked for outside a run's step.
    no_run: Option<&'static str>,
}

impl KeyParts {
    /// No parts yet.
    pub fn new() -> Self {
        KeyParts {
            parts: EncodedParts::new(),
            missing: None,
            invalid: None,
            no_run: None,
        }
    }

    /// Adds the part named `name` (as declared in `key = "…"`).
    pub fn part(mut self, name: &'static str, part: Result<Option<KeyPart>, InvalidKey>) -> Self {
        match part {
            Ok(Some(part)) => self.parts.push(part),
            Ok(None) => {
                self.missing.get_or_insert(name);
            }
            Err(reason) => {
                self.invalid.get_or_insert((name, reason));
            }
        }
        self
    }

    /// Adds the part named `name` that the durable run gives (`None` outside a run's step).
    pub fn run_part(
        mut self,
        name: &'static str,
        part: Option<Result<KeyPart, InvalidKey>>,
    ) -> Self {
        match part {
            Some(part) => self.part(name, part.map(Some)),
            None => {
                self.no_run.get_or_insert(name);
                self
            }
        }
    }
}

impl KeyParts {
    /// The key these parts derive for `tool` under `tenant`, or why there is none: a part is
    /// invalid, asked of a run outside a run's step, or missing (every part is required).
    pub(crate) fn derive_required<E>(
        self,
        tenant: &str,
        tool: &'static str,
    ) -> Result<IdempotencyKey, Error<E>> {
        if let Some((part, reason)) = self.invalid {
            return Err(Error::InvalidKey { tool, part, reason });
        }
        if let Some(part) = self.no_run {
            return Err(Error::NoRun { tool, part });
        }
        if let Some(part) = self.missing {
            return Err(Error::MissingKey { tool, part });
        }
        Ok(self.parts.derive(tenant, tool))
    }
}

impl Default for KeyParts {
    fn default() -> Self {
        Self::new()
    }
}

/// A state check (`check = …`): asked, after a claim took over an orphan or an `unknown`
/// record, whether the effect already happened (`Some(value)`), before the body could run again.
pub trait Check<A, T, E> {
    /// Whether claims reconcile orphans through this check ([`Orphans::Reconcile`]), or follow
    /// the tool's `on_orphan` policy (no check).
    const RECONCILES: bool;

    /// Asks whether the effect of the call with `args` already happened.
    fn check(self, args: &A) -> impl Future<Output = Result<Option<T>, E>>;
}

/// A tool without a state check.
pub struct NoCheck;

impl<A, T, E> Check<A, T, E> for NoCheck {
    const RECONCILES: bool = false;

    async fn check(self, _: &A) -> Result<Option<T>, E> {
        Ok(None)
    }
}

/// A tool's state check: an async function of its arguments.
pub struct StateCheck<C>(pub C);

impl<A, T, E, C: AsyncFnOnce(&A) -> Result<Option<T>, E>> Check<A, T, E> for StateCheck<C> {
    const RECONCILES: bool = true;

    fn check(self, args: &A) -> impl Future<Output = Result<Option<T>, E>> {
        (self.0)(args)
    }
}

/// What [`prepare`] decided before the store was touched.
pub(crate) enum Prepared {
    /// Claim this key in this scope.
    Keyed {
        scope: Scope,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    },
    /// The caller omitted an optional key: the body runs unprotected.
    Unprotected,
}

/// Every refusal that needs no store: no runtime, an unfingerprintable argument, an invalid or
/// missing key part, an invalid tenant.
pub(crate) fn prepare<E>(
    tool: &'static ToolInfo,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
) -> Result<Prepared, Error<E>> {
    let name = tool.name;
    let Some(scope) = Scope::current() else {
        return Err(Error::NoRuntime { tool: name });
    };
    crate::registry::write_report_from_env(Some(scope.idem()));
    let fingerprint =
        fingerprint.map_err(|source| Error::Unfingerprintable { tool: name, source })?;
    if let Some((part, reason)) = key.invalid {
        return Err(Error::InvalidKey {
            tool: name,
            part,
            reason,
        });
    }
    if let Some(part) = key.no_run {
        return Err(Error::NoRun { tool: name, part });
    }
    if let Some(part) = key.missing {
        if tool.key_required {
            return Err(Error::MissingKey { tool: name, part });
        }
        return Ok(Prepared::Unprotected);
    }
    let tenant = scope.tenant();
    check_tenant(name, tenant)?;
    let key = key.parts.derive(tenant, name);
    Ok(Prepared::Keyed {
        scope,
        key,
        fingerprint,
    })
}

/// Runs a keyed tool: claim, run the body at most once, settle the record as the policy `H`
/// says. `args` are lent to `check` (after a takeover) and then given to `body`.
///
/// The refusals before the store ([`prepare`]) are decided when the future is made, by the
/// tool's own future as it runs (in its task, so under its scope): the call's future then holds
/// neither the key parts nor the fingerprint's input. Every call's future is moved as it is
/// made and nested, so its size is paid at every call; a replay's is kept small (see
/// [`run_claimed`]).
pub(crate) fn run<T, E, H, A, C, B, F>(
    tool: &'static ToolInfo,
    key: KeyParts,
    fingerprint: Result<Fingerprint, CanonicalError>,
    args: A,
    check: C,
    body: B,
) -> impl Future<Output = Result<Outcome<T>, Error<E>>>
where
    T: Serialize + DeserializeOwned,
    E: ErrorHandling<H>,
    C: Check<A, T, E>,
    B: FnOnce(A) -> F,
    F: Future<Output = Result<T, E>>,
{
    let prepared = prepare(tool, key, fingerprint);
    async move {
        let name = tool.name;
        let (scope, key, fingerprint) = match prepared? {
            Prepared::Keyed {
                scope,
                key,
                fingerprint,
            } => (scope, key, fingerprint),
            Prepared::Unprotected => {
                return body(args)
                    .await
                    .map(Outcome::Unprotected)
                    .map_err(|error| Error::Tool {
                        class: ErrorHandling::<H>::class(&error),
                        error,
                        replayed: false,
                    });
            }
        };
        crate::current::note_call(name, key);
        let (idem, tenant) = scope.into_parts();
        let idem = &idem;
        let observed = Observation::start(tool, &tenant, key);
        let result = 'call: {
            let orphans = if C::RECONCILES {
                Orphans::Reconcile
            } else {
                tool.orphans()
            };
            let intent = Intent::of_tool(tool, idem, tenant, key, fingerprint, orphans);
            let claimed = match observed.within(claim_waiting(idem, &intent)).await {
                Ok(claiming) => match to_run::<T, E, H>(name, key, claiming) {
                    Ok(claimed) => claimed,
                    Err(answer) => break 'call answer,
                },
                Err(e) => break 'call Err(Error::Store(e)),
            };
            observed.span().record("token", claimed.token().get());
            // Boxed: the check, the body's run and the settlement would make every call's
            // future several times larger, a replay's too. One allocation for a call that
            // writes.
            let rest = Box::pin(run_claimed::<T, E, H, A, C, B, F>(
                name,
                key,
                claimed,
                args,
                check,
                body,
                idem.max_result_bytes(),
            ));
            observed.within(rest).await
        };
        observed.finish(&result);
        result
    }
}

/// A tenant idem takes: 1 to 255 bytes, without NUL.
pub(crate) fn check_tenant<E>(tool: &'static str, tenant: &str) -> Result<(), Error<E>> {
    if tenant.is_empty() || tenant.len() > 255 || tenant.contains('\0') {
        return Err(Error::InvalidTenant { tool });
    }
    Ok(())
}

/// The key to run, when the claim acquired it; else the call's answer without running: the
/// replay of a completed record, or the refusal (mismatch, in flight, unknown).
pub(crate) fn to_run<T, E, H>(
    name: &'static str,
    key: IdempotencyKey,
    claiming: Claiming,
) -> Result<Claimed, Result<Outcome<T>, Error<E>>>
where
    T: DeserializeOwned,
    E: ErrorHandling<H>,
{
    let hash = key.short_hash();
    Err(match claiming {
        Claiming::Acquired(claimed) => return Ok(claimed),
        Claiming::Completed(bytes) => replay::<T, E, H>(name, key, &bytes),
        Claiming::Mismatch => Ok(Outcome::Mismatch(Mismatch::new(name, hash))),
        Claiming::InFlight(wait) => Ok(Outcome::InFlight(InFlight::new(name, hash, wait))),
        Claiming::Unknown => Ok(Outcome::Unknown(Unknown::new(name, hash))),
    })
}

/// The rest of a call whose claim acquired the key: the state check after a takeover, the
/// body, the settlement.
async fn run_claimed<T, E, H, A, C, B, F>(
    name: &'static str,
    key: IdempotencyKey,
    claimed: Claimed,
    args: A,
    check: C,
    body: B,
    limit: usize,
) -> Result<Outcome<T>, Error<E>>
where
    T: Serialize,
    E: ErrorHandling<H>,
    C: Check<A, T, E>,
    B: FnOnce(A) -> F,
    F: Future<Output = Result<T, E>>,
{
    // An orphan or an unknown record: an earlier owner may have had the effect. The state
    // check, if the tool has one, says which before anything runs again.
    if C::RECONCILES && claimed.takeover() {
        let check =
            crate::current::run_as(name, key, claimed.lease_state().clone(), check.check(&args));
        match claimed.hold(check).await {
            Ok(Some(value)) => {
                let bytes = encode_value(&value).map_err(|source| not_stored(name, key, source))?;
                let recorded = claimed
                    .complete_retrying(RecordStatus::Completed, &bytes)
                    .await;
                return match recorded.answer {
                    Ok(Fenced::Applied) => Ok(Outcome::Replayed(value)),
                    Ok(Fenced::Lost) => Err(lease_lost(name, key)),
                    Err(e) => Err(Error::Store(e)),
                };
            }
            Ok(None) => {}
            // Still unknown whether the effect happened: keep the claim (the lease protects
            // it, and the next claim checks again) and run nothing.
            Err(error) => return Err(Error::CheckFailed { tool: name, error }),
        }
    }
    let body = crate::current::run_as(name, key, claimed.lease_state().clone(), body(args));
    let result = claimed.hold(body).await;
    settle::<T, E, H>(name, key, claimed, result, limit).await
}

/// A completed record, read back: the stored value, or the stored error of the tool.
pub(crate) fn replay<T, E, H>(
    name: &'static str,
    key: IdempotencyKey,
    bytes: &[u8],
) -> Result<Outcome<T>, Error<E>>
where
    T: DeserializeOwned,
    E: ErrorHandling<H>,
{
    if let Some((size, limit)) = too_large_marker(bytes) {
        return Err(Error::ResultTooLarge {
            tool: name,
            key: key.short_hash(),
            size,
            limit,
            replayed: true,
        });
    }
    match <E as ErrorHandling<H>>::decode::<T>(bytes) {
        Ok(Ok(v)) => Ok(Outcome::Replayed(v)),
        Ok(Err(error)) => Err(Error::Tool {
            error,
            replayed: true,
            class: ErrorClass::Store,
        }),
        Err(source) => Err(Error::StoredResultUnreadable {
            tool: name,
            key: key.short_hash(),
            source,
        }),
    }
}

/// How a body's answer settles its claim, as the tool's policy classes it.
pub(crate) enum Settling {
    /// No effect happened: release, so a corrected retry may run.
    Release,
    /// Record the key as `status` with `bytes`; `too_large` is the size of a result over the
    /// limit, recorded as its marker (never truncated).
    Record {
        status: RecordStatus,
        bytes: Vec<u8>,
        too_large: Option<usize>,
    },
    /// The value or error could not be encoded: the claim is left to its lease.
    NotStored(serde_json::Error),
}

/// How `result` settles its claim, with the class of its error (`None` for a value).
pub(crate) fn settling<T, E, H>(
    result: &Result<T, E>,
    limit: usize,
) -> (Option<ErrorClass>, Settling)
where
    T: Serialize,
    E: ErrorHandling<H>,
{
    let (class, encoded) = match result {
        Ok(v) => (None, Some((RecordStatus::Completed, encode_value(v)))),
        Err(e) => {
            let class = ErrorHandling::<H>::class(e);
            let encoded = match class {
                ErrorClass::Release => None,
                ErrorClass::Store => Some((RecordStatus::Completed, ErrorHandling::<H>::encode(e))),
                ErrorClass::Unknown => Some((RecordStatus::Unknown, Ok(Vec::new()))),
            };
            (Some(class), encoded)
        }
    };
    let settling = match encoded {
        None => Settling::Release,
        Some((_, Err(source))) => Settling::NotStored(source),
        Some((status, Ok(bytes))) => {
            let too_large = (bytes.len() > limit).then_some(bytes.len());
            Settling::Record {
                status,
                bytes: match too_large {
                    Some(size) => too_large_record(size, limit),
                    None => bytes,
                },
                too_large,
            }
        }
    };
    (class, settling)
}

/// What a call answers once its claim settled as `settling` said, with `recorded` the store's
/// answer to a recording (ignored for a release: if it failed, the lease still protects the
/// key, and the tool's error, the more useful of the two, is what the caller gets).
pub(crate) fn settled<T, E>(
    name: &'static str,
    key: IdempotencyKey,
    result: Result<T, E>,
    class: Option<ErrorClass>,
    settling: Settling,
    recorded: Option<Recorded>,
    limit: usize,
) -> Result<Outcome<T>, Error<E>> {
    match (settling, recorded) {
        (Settling::Release, _) => {}
        (Settling::NotStored(source), _) => return Err(not_stored(name, key, source)),
        (Settling::Record { too_large, .. }, recorded) => {
            let recorded = recorded.unwrap_or(Recorded {
                answer: Ok(Fenced::Lost),
                retries: 0,
            });
            match recorded.answer {
                Ok(Fenced::Applied) => {}
                Ok(Fenced::Lost) => return Err(lease_lost(name, key)),
                Err(source) => {
                    return Err(Error::CompletionFailed {
                        tool: name,
                        key: key.short_hash(),
                        attempts: recorded.retries + 1,
                        source,
                    });
                }
            }
            if let Some(size) = too_large {
                return Err(Error::ResultTooLarge {
                    tool: name,
                    key: key.short_hash(),
                    size,
                    limit,
                    replayed: false,
                });
            }
        }
    }
    match (result, class) {
        (Ok(v), _) => Ok(Outcome::Fresh(v)),
        (Err(error), class) => Err(Error::Tool {
            error,
            replayed: false,
            class: class.unwrap_or(ErrorClass::Release),
        }),
    }
}

/// Settles the claim with what the body answered: complete with its value, or as the policy
/// classes its error (release, store, or block as unknown). A result larger than `limit` is
/// never truncated: the record says how large it was.
pub(crate) async fn settle<T, E, H>(
    name: &'static str,
    key: IdempotencyKey,
    claimed: Claimed,
    result: Result<T, E>,
    limit: usize,
) -> Result<Outcome<T>, Error<E>>
where
    T: Serialize,
    E: ErrorHandling<H>,
{
    let (class, settling) = settling::<T, E, H>(&result, limit);
    let recorded = match &settling {
        Settling::Release => {
            let _ = claimed.release().await;
            None
        }
        Settling::NotStored(_) => None,
        Settling::Record { status, bytes, .. } => {
            Some(claimed.complete_retrying(*status, bytes).await)
        }
    };
    settled(name, key, result, class, settling, recorded, limit)
}

fn not_stored<E>(name: &'static str, key: IdempotencyKey, source: serde_json::Error) -> Error<E> {
    Error::ResultNotStored {
        tool: name,
        key: key.short_hash(),
        source,
    }
}

fn lease_lost<E>(name: &'static str, key: IdempotencyKey) -> Error<E> {
    Error::LeaseLost {
        tool: name,
        key: key.short_hash(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::{KeyParts, NoCheck, StateCheck, run};
    use crate::protocol::policy::{ReleaseErrors, StoreErrors, UnknownErrors};
    use crate::registry::ToolInfo;
    use crate::runtime::Idem;
    use idem_core::Outcome;
    use idem_core::fingerprint::Fingerprint;
    use idem_core::key::KeyPart;
    use idem_core::store::faulty::{Faults, FaultyStore};
    use idem_core::store::memory::MemoryStore;
    use idem_core::{Error, ErrorClass};

    static TOOL: ToolInfo = ToolInfo::new("call.test", "charge", "m", "f.rs", 1)
        .stable_name()
        .key(&["run"], false);
    static SHORT_LEASE: ToolInfo = ToolInfo::new("call.short", "charge", "m", "f.rs", 2)
        .stable_name()
        .key(&["run"], false)
        .lease_ms(1);

    fn key(run: &str) -> KeyParts {
        KeyParts::new().part("run", KeyPart::new(run).map(Some))
    }

    fn fingerprint(amount: u8) -> Result<Fingerprint, idem_core::canonical::CanonicalError> {
        Ok(Fingerprint::from_bytes([amount; 32]))
    }

    /// One call of a counting tool without a check, under the policy `H`.
    async fn charge<H>(
        tool: &'static ToolInfo,
        runs: &AtomicUsize,
        run_id: &str,
        amount: u8,
        answer: Result<u32, String>,
    ) -> Result<Outcome<u32>, Error<String>>
    where
        String: crate::protocol::policy::ErrorHandling<H>,
    {
        let body = move |()| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            answer
        };
        run::<_, _, H, _, _, _, _>(tool, key(run_id), fingerprint(amount), (), NoCheck, body).await
    }

    #[tokio::test]
    async fn the_body_runs_once_and_retries_replay_or_mismatch() {
        let idem = Idem::with_store(MemoryStore::new());
        let runs = AtomicUsize::new(0);
        idem.scope("t")
            .run(async {
                let first = charge::<ReleaseErrors>(&TOOL, &runs, "r1", 5, Ok(7)).await;
                assert!(matches!(first, Ok(Outcome::Fresh(7))));
                let retry = charge::<ReleaseErrors>(&TOOL, &runs, "r1", 5, Ok(8)).await;
                assert!(matches!(retry, Ok(Outcome::Replayed(7))), "{retry:?}");
                let other = charge::<ReleaseErrors>(&TOOL, &runs, "r1", 6, Ok(9)).await;
                assert!(matches!(other, Ok(Outcome::Mismatch(_))), "{other:?}");
            })
            .await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn each_policy_settles_an_error_its_own_way() {
        let idem = Idem::with_store(MemoryStore::new());
        let runs = AtomicUsize::new(0);
        idem.scope("t")
            .run(async {
                // Released: the corrected retry runs.
                let e = charge::<ReleaseErrors>(&TOOL, &runs, "rel", 1, Err("no".into())).await;
                assert!(matches!(
                    e,
                    Err(Error::Tool {
                        class: ErrorClass::Release,
                        replayed: false,
                        ..
                    })
                ));
                let ok = charge::<ReleaseErrors>(&TOOL, &runs, "rel", 1, Ok(1)).await;
                assert!(matches!(ok, Ok(Outcome::Fresh(1))));
                // Stored: replayed as the tool's own error, the body not run again.
                let e = charge::<StoreErrors>(&TOOL, &runs, "sto", 1, Err("declined".into())).await;
                assert!(matches!(
                    e,
                    Err(Error::Tool {
                        class: ErrorClass::Store,
                        replayed: false,
                        ..
                    })
                ));
                match charge::<StoreErrors>(&TOOL, &runs, "sto", 1, Ok(1)).await {
                    Err(Error::Tool {
                        error,
                        replayed: true,
                        ..
                    }) => assert_eq!(error, "declined"),
                    other => panic!("a stored error replays: {other:?}"),
                }
                // Unknown: the key is blocked.
                let e =
                    charge::<UnknownErrors>(&TOOL, &runs, "unk", 1, Err("timeout".into())).await;
                assert!(matches!(
                    e,
                    Err(Error::Tool {
                        class: ErrorClass::Unknown,
                        ..
                    })
                ));
                let blocked = charge::<UnknownErrors>(&TOOL, &runs, "unk", 1, Ok(1)).await;
                assert!(matches!(blocked, Ok(Outcome::Unknown(_))), "{blocked:?}");
            })
            .await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            4,
            "rel twice, sto once, unk once"
        );
    }

    #[tokio::test]
    async fn an_orphan_is_reconciled_by_the_check_before_the_body_could_run_again() {
        let idem = Idem::with_store(MemoryStore::new());
        let (runs, checks) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let call = |found: Option<u32>| {
            let (runs, checks) = (&runs, &checks);
            let check = StateCheck(async move |amount: &u8| {
                checks.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(found.map(|v| v + u32::from(*amount)))
            });
            let body = move |amount: u8| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(u32::from(amount))
            };
            run::<_, _, ReleaseErrors, _, _, _, _>(
                &SHORT_LEASE,
                key("orphan"),
                fingerprint(3),
                3u8,
                check,
                body,
            )
        };
        idem.scope("t")
            .run(async {
                // A claim whose owner died: its lease (1 ms) lapses with the key held.
                let claimed = crate::protocol::claim(
                    &idem,
                    &crate::protocol::Intent {
                        tenant: "t".into(),
                        key: idem_core::key::derive_key(
                            "t",
                            "call.short",
                            &[KeyPart::new("orphan").unwrap()],
                        ),
                        tool: "call.short",
                        fingerprint: Fingerprint::from_bytes([3; 32]),
                        lease: Duration::from_millis(1),
                        ttl: Duration::from_secs(60),
                        orphans: idem_core::store::Orphans::Reconcile,
                        wait: Duration::ZERO,
                    },
                )
                .await
                .unwrap();
                assert!(matches!(claimed, crate::protocol::Claiming::Acquired(_)));
                tokio::time::sleep(Duration::from_millis(5)).await;
                // The check finds the effect: stored and replayed, the body never runs.
                let found = call(Some(100)).await;
                assert!(matches!(found, Ok(Outcome::Replayed(103))), "{found:?}");
            })
            .await;
        assert_eq!(
            (runs.load(Ordering::SeqCst), checks.load(Ordering::SeqCst)),
            (0, 1)
        );
    }

    #[tokio::test]
    async fn a_store_that_fails_before_the_claim_never_runs_the_body() {
        let faults = Faults::seeded(3).fail_before(1.0);
        let idem = Idem::with_store(FaultyStore::new(MemoryStore::new(), faults));
        let runs = AtomicUsize::new(0);
        let answer = idem
            .scope("t")
            .run(charge::<ReleaseErrors>(&TOOL, &runs, "down", 1, Ok(1)))
            .await;
        assert!(matches!(answer, Err(Error::Store(_))), "{answer:?}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn refusals_come_before_the_store() {
        let runs = AtomicUsize::new(0);
        // No runtime in scope.
        let answer = charge::<ReleaseErrors>(&TOOL, &runs, "r", 1, Ok(1)).await;
        assert!(matches!(answer, Err(Error::NoRuntime { .. })), "{answer:?}");
        let idem = Idem::with_store(MemoryStore::new());
        idem.scope("t")
            .run(async {
                // A missing optional key runs unprotected.
                let missing = KeyParts::new().part("run", Ok(None));
                let body = |()| async { Ok::<u32, String>(4) };
                let out = run::<_, _, ReleaseErrors, _, _, _, _>(
                    &TOOL,
                    missing,
                    fingerprint(1),
                    (),
                    NoCheck,
                    body,
                )
                .await;
                assert!(matches!(out, Ok(Outcome::Unprotected(4))), "{out:?}");
            })
            .await;
        idem.scope("")
            .run(async {
                let answer = charge::<ReleaseErrors>(&TOOL, &runs, "r", 1, Ok(1)).await;
                assert!(
                    matches!(answer, Err(Error::InvalidTenant { .. })),
                    "{answer:?}"
                );
            })
            .await;
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}
