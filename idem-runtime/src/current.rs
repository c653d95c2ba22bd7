//! What a running tool body knows about its own call: [`current()`].

use std::sync::Arc;

use crate::lease_state::LeaseState;
use idem_core::key::{DownstreamKey, IdempotencyKey, KeyHash, derive_downstream_key};

tokio::task_local! {
    static CURRENT: Current;
    static CURRENT_BATCH: CurrentBatch;
}

/// The call whose body is running: its tool, its key and its lease.
///
/// Got with [`current()`] inside the body of a keyed `#[idempotent]` tool. Its main use is
/// [`Current::derive`]: the key to send with each downstream call. A body that runs long may
/// also watch its lease ([`Current::lease_lost`]).
#[derive(Debug, Clone)]
pub struct Current {
    tool: &'static str,
    key: IdempotencyKey,
    lease: Arc<LeaseState>,
}

impl Current {
    /// The stable name of the running tool.
    pub fn tool(&self) -> &'static str {
        self.tool
    }

    /// The short, loggable hash of the call's key.
    pub fn key_hash(&self) -> KeyHash {
        self.key.short_hash()
    }

    /// The key for the downstream call named `name` (`"stripe"`, `"ledger"`, …): the same for
    /// every retry and every re-execution of this intent, different for each name and intent.
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # async fn charge_with_stripe() -> Result<(), ()> {
    /// if let Some(call) = idem::current() {
    ///     let key = call.derive("stripe");
    ///     // request.header("Idempotency-Key", key.as_str())
    /// #   let _ = key;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn derive(&self, name: &str) -> DownstreamKey {
        derive_downstream_key(&self.key, name)
    }

    /// Whether this call lost its lease: the store refused a renewal (another call took the
    /// key over), or could not be reached until the last lease it confirmed lapsed. Another call
    /// may then be running the same intent, and this call's completion will be refused if it
    /// did take the key over ([`Error::LeaseLost`](idem_core::Error::LeaseLost)). Once lost, lost.
    pub fn is_lease_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Completes when this call loses its lease (never, while it holds it): race it against
    /// long work to stop early.
    ///
    /// ```
    /// # use idem_runtime as idem;
    /// # async fn deploy_step() {}
    /// # async fn f() -> Result<(), &'static str> {
    /// if let Some(call) = idem::current() {
    ///     tokio::select! {
    ///         () = deploy_step() => {}
    ///         () = call.lease_lost() => return Err("lease lost: another worker took over"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lease_lost(&self) {
        self.lease.lost().await;
    }
}

/// The call whose body is running, inside the body of a keyed `#[idempotent]` tool; `None`
/// elsewhere: outside a tool, in a naturally idempotent tool, in a call that ran unprotected
/// (no key), and in tasks the body spawns (pass a clone of the [`Current`] along).
pub fn current() -> Option<Current> {
    CURRENT.try_with(Current::clone).ok()
}

/// The items of a batch tool's call whose body is running: one [`Current`] per item the body
/// was given, in the order it was given them.
///
/// Got with [`current_batch()`] inside the body of a batch tool (`key = "…, items[].id"`),
/// where [`current()`] is `None` (the call has no one key). Each item's [`Current::derive`] is
/// the key to send downstream for that item: the same at every retry and after a takeover, so
/// a provider that honours it (Stripe's `Idempotency-Key`) applies an item sent again once.
///
/// ```
/// # use idem_runtime as idem;
/// # struct Invoice { id: String }
/// # async fn charge(items: Vec<Invoice>) {
/// let batch = idem::current_batch();
/// for (i, invoice) in items.iter().enumerate() {
///     let key = batch.as_ref().and_then(|b| b.item(i)).map(|call| call.derive("stripe"));
///     // request.header("Idempotency-Key", key.as_str()) for this invoice
/// #   let _ = (invoice, key);
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CurrentBatch {
    tool: &'static str,
    items: Arc<[Current]>,
}

impl CurrentBatch {
    /// The stable name of the running tool.
    pub fn tool(&self) -> &'static str {
        self.tool
    }

    /// How many items the body was given.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether the body was given no item (never: a batch with nothing to run runs no body).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The call of the `index`-th item the body was given.
    pub fn item(&self, index: usize) -> Option<&Current> {
        self.items.get(index)
    }

    /// The calls of the items the body was given, in its order.
    pub fn items(&self) -> &[Current] {
        &self.items
    }
}

/// The items of the batch whose body is running, inside the body of a batch tool; `None`
/// elsewhere (and in tasks the body spawns: pass a clone along).
pub fn current_batch() -> Option<CurrentBatch> {
    CURRENT_BATCH.try_with(CurrentBatch::clone).ok()
}

/// Runs `body` as the body of a batch of `tool` over the items with these keys and leases.
pub(crate) async fn run_batch_as<F: Future>(
    tool: &'static str,
    items: Vec<(IdempotencyKey, Arc<LeaseState>)>,
    body: F,
) -> F::Output {
    let items = items
        .into_iter()
        .map(|(key, lease)| Current { tool, key, lease })
        .collect();
    CURRENT_BATCH
        .scope(CurrentBatch { tool, items }, body)
        .await
}

/// Runs `body` as the body of the call of `tool` with `key`, holding the lease `lease` tells of.
pub(crate) async fn run_as<F: Future>(
    tool: &'static str,
    key: IdempotencyKey,
    lease: Arc<LeaseState>,
    body: F,
) -> F::Output {
    CURRENT.scope(Current { tool, key, lease }, body).await
}

tokio::task_local! {
    /// The tool and key of the last keyed call made inside [`recording_calls`].
    static LAST_CALL: std::cell::Cell<Option<(&'static str, IdempotencyKey)>>;
}

/// Tells a surrounding [`recording_calls`], if any, which keyed call is being made.
pub(crate) fn note_call(tool: &'static str, key: IdempotencyKey) {
    let _ = LAST_CALL.try_with(|cell| cell.set(Some((tool, key))));
}

/// Runs `fut`, keeping the tool and key of the last keyed call made inside it for
/// [`last_call`] (the retry executor names the step it gives up on by them).
pub(crate) async fn recording_calls<F: Future>(fut: F) -> F::Output {
    LAST_CALL.scope(std::cell::Cell::new(None), fut).await
}

/// The last keyed call made inside the running [`recording_calls`], if any.
pub(crate) fn last_call() -> Option<(&'static str, IdempotencyKey)> {
    LAST_CALL.try_with(std::cell::Cell::get).ok().flatten()
}
