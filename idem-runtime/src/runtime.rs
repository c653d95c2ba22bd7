//! The runtime handle: which store, which defaults, which tenant.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use idem_core::clock::{Clock, SystemClock};
use idem_core::store::admin::AdminStore;
use idem_core::store::{Store, StoreHealth};
use idem_core::{OpenError, StoreError};

use crate::store_handle::IdemStore;

/// Default time a record lives: 24 hours, Stripe's minimum and the IETF draft's example.
pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default lease of an in-flight call: after it, a retry may take an orphaned call over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The default of [`IdemBuilder::max_result_bytes`]: 16 MiB. Results past the store's blob
/// threshold (64 KiB by default) are stored once per tenant, apart from their records (see
/// `idem_core::store::blob`), so a large result costs its bytes once, not a large record.
pub const DEFAULT_MAX_RESULT_BYTES: usize = 16 << 20;

/// The default of [`IdemBuilder::max_argument_bytes`]: 1 MiB of canonical JSON.
pub const DEFAULT_MAX_ARGUMENT_BYTES: usize = 1 << 20;

/// The idem runtime: a store and the defaults of every call. Cheap to clone.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_core::OpenError> {
/// let idem = idem_runtime::Idem::open("sqlite://idem.db").await?;
/// let tenant = idem.scope("tenant-a");
/// // tenant.run(register_payment(…)).await
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Idem {
    inner: Arc<Inner>,
}

struct Inner {
    store: IdemStore,
    /// The same store, for operators' operations, when it is a built-in one opened by URL.
    admin: Option<Arc<dyn AdminStore>>,
    ttl: Duration,
    lease: Duration,
    retry_window: Duration,
    resume_window: Option<Duration>,
    accepted_short_ttls: Vec<String>,
    max_result_bytes: usize,
    max_argument_bytes: usize,
    renew_leases: bool,
    completion_retry: Option<Duration>,
    wait: Duration,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Idem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idem")
            .field("store", &self.inner.store.backend())
            .field("ttl", &self.inner.ttl)
            .field("lease", &self.inner.lease)
            .finish_non_exhaustive()
    }
}

impl Idem {
    /// Opens the store named by `url` with default settings:
    /// `memory://`, `sqlite://PATH`, `postgres://…` or `redis://…` (see [`IdemBuilder::open`]).
    pub async fn open(url: &str) -> Result<Idem, OpenError> {
        Idem::builder().open(url).await
    }

    /// A builder for other TTL, lease, retry window or clock.
    pub fn builder() -> IdemBuilder {
        IdemBuilder {
            ttl: DEFAULT_TTL,
            lease: DEFAULT_LEASE,
            retry_window: None,
            resume_window: None,
            accepted_short_ttls: Vec::new(),
            max_result_bytes: DEFAULT_MAX_RESULT_BYTES,
            max_argument_bytes: DEFAULT_MAX_ARGUMENT_BYTES,
            renew_leases: true,
            completion_retry: None,
            wait: Duration::ZERO,
            clock: Arc::new(SystemClock),
        }
    }

    /// A runtime over a store you built yourself (any [`Store`] implementation).
    pub fn with_store(store: impl Store + 'static) -> Idem {
        Idem::builder().build(store)
    }

    /// The calls of `tenant`: run tool calls inside [`Scope::run`].
    ///
    /// Every record is looked up by tenant + key, so two tenants using the same key never see
    /// each other's results.
    pub fn scope(&self, tenant: impl Into<Arc<str>>) -> Scope {
        Scope {
            idem: self.clone(),
            tenant: tenant.into(),
        }
    }

    /// Makes `tenant` on this runtime the process-wide default, used by calls outside any
    /// [`Scope::run`]. Replaces an earlier default.
    pub fn install(&self, tenant: impl Into<Arc<str>>) {
        let scope = self.scope(tenant);
        *INSTALLED.write().unwrap_or_else(|e| e.into_inner()) = Some(scope);
    }

    /// Removes the process-wide default set by [`Idem::install`].
    pub fn uninstall() {
        *INSTALLED.write().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// The store: every [`Store`] operation, and the backend's own store under it
    /// ([`IdemStore::postgres`]).
    pub fn store(&self) -> &IdemStore {
        &self.inner.store
    }

    pub(crate) fn admin(&self) -> Result<&dyn AdminStore, StoreError> {
        self.inner.admin.as_deref().ok_or_else(|| {
            StoreError::new(
                self.inner.store.backend(),
                idem_core::StoreErrorKind::Other,
                "this store was built by hand and has no admin side: open it by URL",
            )
        })
    }

    /// Default record lifetime of tools that declare no `ttl`.
    pub fn default_ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Default lease of tools that declare no `lease`.
    pub fn default_lease(&self) -> Duration {
        self.inner.lease
    }

    /// How long agents may retry a call; the audit warns about tools whose TTL is shorter.
    pub fn retry_window(&self) -> Duration {
        self.inner.retry_window
    }

    /// How long a durable run may be resumed after it started, when declared
    /// ([`IdemBuilder::resume_window`]).
    pub fn resume_window(&self) -> Option<Duration> {
        self.inner.resume_window
    }

    /// The key lifetime every keyed tool needs: the resume window plus the retry window, when a
    /// resume window is declared.
    pub fn needed_ttl(&self) -> Option<Duration> {
        self.inner
            .resume_window
            .map(|resume| resume.saturating_add(self.inner.retry_window))
    }

    /// The tools [`IdemBuilder::accept_short_ttl`] named.
    pub(crate) fn accepted_short_ttls(&self) -> &[String] {
        &self.inner.accepted_short_ttls
    }

    /// Whether [`IdemBuilder::accept_short_ttl`] named `tool`.
    pub fn accepts_short_ttl(&self, tool: &str) -> bool {
        self.inner.accepted_short_ttls.iter().any(|t| t == tool)
    }

    /// Whether running bodies renew their lease ([`IdemBuilder::renew_leases`]).
    pub fn renews_leases(&self) -> bool {
        self.inner.renew_leases
    }

    /// How long a call whose body ran tries again to record its result through store errors,
    /// counted from the first failed attempt: `lease` (the call's lease) unless
    /// [`IdemBuilder::completion_retry`] set less.
    pub fn completion_retry(&self, lease: Duration) -> Duration {
        self.inner.completion_retry.map_or(lease, |d| d.min(lease))
    }

    /// How long a call of a keyed tool that declares no `wait` waits for a concurrent call of
    /// its key ([`IdemBuilder::wait`]; zero: it answers `InFlight` at once).
    pub fn default_wait(&self) -> Duration {
        self.inner.wait
    }

    /// The largest result a record keeps: the builder's [`IdemBuilder::max_result_bytes`], or
    /// the store's own limit ([`Store::result_limit`]) if that is smaller.
    pub fn max_result_bytes(&self) -> usize {
        self.inner
            .max_result_bytes
            .min(self.inner.store.result_limit())
    }

    /// The largest argument list a keyed call fingerprints, as canonical JSON.
    pub fn max_argument_bytes(&self) -> usize {
        self.inner.max_argument_bytes
    }

    /// The clock leases and TTLs are measured with.
    pub fn clock(&self) -> &dyn Clock {
        &*self.inner.clock
    }

    /// Checks the store: reachable, schema current, durability.
    pub async fn health(&self) -> Result<StoreHealth, StoreError> {
        self.inner.store.health().await
    }

    /// Runs [`Idem::purge_expired`] every `every` on the current tokio runtime (which must have
    /// timers enabled), until the returned handle is aborted or the runtime stops. A failed
    /// purge is retried at the next tick: records past their TTL are never served anyway.
    pub fn spawn_purger(&self, every: Duration, batch: usize) -> tokio::task::JoinHandle<()> {
        let idem = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                let _ = idem.purge_expired(batch).await;
            }
        })
    }

    /// Deletes records past their TTL, `batch` at a time, until none is left; returns how many.
    pub async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let batch = batch.max(1);
        let now = self.inner.clock.now();
        let mut total = 0;
        loop {
            let n = self.inner.store.purge_expired(now, batch).await?;
            total += n;
            if n < batch {
                return Ok(total);
            }
        }
    }
}

/// Settings of an [`Idem`] runtime.
#[must_use]
pub struct IdemBuilder {
    ttl: Duration,
    lease: Duration,
    retry_window: Option<Duration>,
    resume_window: Option<Duration>,
    accepted_short_ttls: Vec<String>,
    max_result_bytes: usize,
    max_argument_bytes: usize,
    renew_leases: bool,
    completion_retry: Option<Duration>,
    wait: Duration,
    clock: Arc<dyn Clock>,
}

impl IdemBuilder {
    /// Default record lifetime (24 h unless set); tools may declare their own `ttl`.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Default lease (30 s unless set); tools may declare their own `lease`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long your agents may retry a call (defaults to the default TTL, at most 24 h). The
    /// audit warns about every tool whose TTL is shorter: a retry after its TTL would run the
    /// body again.
    pub fn retry_window(mut self, window: Duration) -> Self {
        self.retry_window = Some(window);
        self
    }

    /// How long a durable run may be resumed after it started (none unless set): a workflow
    /// that can sleep for a week and then go on declares 7 days. Its steps' calls are then
    /// retried up to the resume window plus the retry window after they were first made, so
    /// the startup [`audit`](crate::audit) refuses every keyed tool whose TTL is shorter than
    /// that (a resumed step would find its key purged and run the body again), naming the tool,
    /// its TTL and the window.
    pub fn resume_window(mut self, window: Duration) -> Self {
        self.resume_window = Some(window);
        self
    }

    /// Accepts that the keys of `tool` (its stable name) may expire before a run that calls it
    /// is resumed: the audit then warns instead of refusing, and each audit logs the accepted
    /// risk (`tracing`, level WARN). For a tool whose effect is harmless to repeat after the
    /// window, or checked by its own `check`.
    pub fn accept_short_ttl(mut self, tool: impl Into<String>) -> Self {
        self.accepted_short_ttls.push(tool.into());
        self
    }

    /// The largest result a record keeps (default [`DEFAULT_MAX_RESULT_BYTES`]; a store with a
    /// smaller limit of its own lowers it: [`Store::result_limit`]). A larger one is never
    /// truncated: the call answers [`Error::ResultTooLarge`](idem_core::Error::ResultTooLarge),
    /// and so does every retry, since the effect happened and cannot be replayed.
    pub fn max_result_bytes(mut self, bytes: usize) -> Self {
        self.max_result_bytes = bytes;
        self
    }

    /// The largest argument list a keyed call fingerprints, as canonical JSON (default
    /// [`DEFAULT_MAX_ARGUMENT_BYTES`]). A call with larger arguments fails before the store is
    /// touched and before the body runs ([`Error::Unfingerprintable`](idem_core::Error::Unfingerprintable)
    /// with [`CanonicalError::TooLarge`](idem_core::canonical::CanonicalError::TooLarge)): arguments
    /// that large belong in a store of their own, passed to the tool by reference.
    pub fn max_argument_bytes(mut self, bytes: usize) -> Self {
        self.max_argument_bytes = bytes;
        self
    }

    /// Whether a running body renews its lease (on unless set).
    ///
    /// With renewal, the owner of a claim extends its lease in the store every third of the
    /// lease while the body runs, fenced by its token: a body that runs many times its lease is
    /// never taken over while its process lives, and one lease after the process dies a retry
    /// takes over. The price is that a body that hangs (a downstream call without a timeout)
    /// holds its key as long as its process lives: give downstream calls timeouts. Without
    /// renewal, a body slower than its lease can be taken over by a retry and run twice.
    pub fn renew_leases(mut self, renew: bool) -> Self {
        self.renew_leases = renew;
        self
    }

    /// How long a call whose body ran tries again to record its result when the store fails
    /// (a reset, a timeout, a failover), counted from the first failed attempt: the call's lease
    /// unless set, and never longer (a longer setting is cut to the lease).
    ///
    /// The result is in memory and the effect has happened: the completion is retried with
    /// backoff while the lease is renewed, and the call answers `Fresh` once it lands. A call
    /// whose completion did not land within this time answers
    /// [`Error::CompletionFailed`](idem_core::Error::CompletionFailed): its key stays in flight
    /// until its lease lapses. Set it shorter when your callers have a deadline of their own.
    pub fn completion_retry(mut self, window: Duration) -> Self {
        self.completion_retry = Some(window);
        self
    }

    /// How long a call that finds its key held by a live call waits for that call to finish,
    /// for keyed tools that declare no `wait = "…"` of their own (none unless set: such a call
    /// answers `InFlight` at once).
    ///
    /// A waiting call watches the key (Postgres `LISTEN`, Redis pub/sub, in-process notices;
    /// SQLite written by another process is polled with a backoff) and claims it again when
    /// the holder settles it: it replays the holder's result as `Replayed` (or its stored
    /// error), runs if the holder released the key, and takes over as a retry would if the
    /// holder's lease lapses (the store lets one caller do so, never two). Past the wait it
    /// answers `InFlight`. The completions of tools that wait are announced to the waiting
    /// callers of every process. Transactional tools keep their own wait (2 s unless declared).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The clock (the system clock unless set).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// A runtime over `store`.
    pub fn build(self, store: impl Store + 'static) -> Idem {
        self.build_arc(Arc::new(store), None)
    }

    fn build_arc(self, store: Arc<dyn Store>, admin: Option<Arc<dyn AdminStore>>) -> Idem {
        Idem {
            inner: Arc::new(Inner {
                store: IdemStore::new(store),
                admin,
                ttl: self.ttl,
                lease: self.lease,
                retry_window: self.retry_window.unwrap_or(self.ttl.min(DEFAULT_TTL)),
                resume_window: self.resume_window,
                accepted_short_ttls: self.accepted_short_ttls,
                max_result_bytes: self.max_result_bytes,
                max_argument_bytes: self.max_argument_bytes,
                renew_leases: self.renew_leases,
                completion_retry: self.completion_retry,
                wait: self.wait,
                clock: self.clock,
            }),
        }
    }

    /// Opens the store named by `url`:
    ///
    /// - `memory://`: in process memory, forgotten on exit (tests, demos);
    /// - `sqlite://PATH[?synchronous=full|normal&busy_timeout_ms=N]`: a file, created if missing
    ///   (`sqlite://idem.db` is relative to the working directory, `sqlite:///var/lib/idem.db`
    ///   absolute);
    /// - `postgres://USER@HOST[:PORT]/DATABASE[?schema=NAME&pool_size=N&sslmode=…]` (also
    ///   `postgresql://`): the shared store for many processes and machines, TLS as libpq (see
    ///   `idem::store::postgres` for every option);
    /// - `redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=NAME…]`, `rediss://…` (TLS),
    ///   `redis+cluster://HOST:PORT[,HOST:PORT…]` and `rediss+cluster://…` (a Redis Cluster):
    ///   the shared store whose records expire on their own (see
    ///   `idem::store::redis`).
    ///
    /// Passwords never appear in errors (`postgres://app:***@db/…`).
    pub async fn open(self, url: &str) -> Result<Idem, OpenError> {
        let admin = idem_core::store::admin::open(url).await?;
        let store: Arc<dyn Store> = admin.clone();
        Ok(self.build_arc(store, Some(admin)))
    }
}

/// A runtime bound to a tenant: the context tool calls run in.
#[derive(Clone, Debug)]
pub struct Scope {
    idem: Idem,
    tenant: Arc<str>,
}

tokio::task_local! {
    static CURRENT: Scope;
}

static INSTALLED: RwLock<Option<Scope>> = RwLock::new(None);

impl Scope {
    /// Runs `fut` (typically one or more tool calls) with this scope as the current one.
    ///
    /// The scope is task-local: a task spawned inside `fut` does not inherit it; wrap the spawned
    /// future in `scope.run(…)` too.
    /// The returned future owns a clone of the scope, so it can be spawned:
    /// `tokio::spawn(scope.run(tool(…)))`.
    pub fn run<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> + use<F> {
        CURRENT.scope(self.clone(), fut)
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The tenant, shared (a reference count, not a copy).
    pub(crate) fn shared_tenant(&self) -> Arc<str> {
        self.tenant.clone()
    }

    /// The runtime and the tenant, taken apart.
    pub(crate) fn into_parts(self) -> (Idem, Arc<str>) {
        (self.idem, self.tenant)
    }

    /// The runtime.
    pub fn idem(&self) -> &Idem {
        &self.idem
    }

    /// The scope of the running task, else the installed default, else `None`.
    pub fn current() -> Option<Scope> {
        Scope::with_current(|scope| scope.cloned())
    }

    /// `f` of the [current](Scope::current) scope, lent rather than cloned.
    pub(crate) fn with_current<R>(f: impl FnOnce(Option<&Scope>) -> R) -> R {
        let mut f = Some(f);
        if let Ok(out) = CURRENT.try_with(|scope| (f.take().expect("called once"))(Some(scope))) {
            return out;
        }
        let installed = INSTALLED.read().unwrap_or_else(|e| e.into_inner());
        (f.take().expect("called once"))(installed.as_ref())
    }
}
