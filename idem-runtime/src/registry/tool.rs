//! One tool's registration ([`ToolInfo`], built by the macro in a `const` context), the list of
//! them, and how durations are written in reports.

use std::sync::OnceLock;
use std::time::Duration;

use serde::Serialize;

use crate::metric_keys::ToolMetrics;
use crate::runtime::Idem;
use idem_core::store::Orphans;

/// Which of the three forms of idempotency a tool uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Form {
    /// `mutating`: a side effect guarded by a key in the store.
    Keyed,
    /// `natural`: safe to repeat as it is (`set_status("active")`); no store traffic.
    Natural,
    /// `check = …` without a key: the tool asks its state check whether the effect already
    /// happened (`assign_shift`) before running; no store traffic.
    StateCheck,
}

/// What happens to the claim when the tool body returns an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorPolicy {
    /// Delete the claim: the error happened before any effect, a corrected retry may run.
    Release,
    /// Store the error and replay it, as Stripe does for requests that started executing.
    Store,
    /// Block the key as `unknown`: the effect may have happened.
    Unknown,
    /// The error type says, error by error ([`ClassifyError`](idem_core::ClassifyError)).
    Classify,
}

impl ErrorPolicy {
    /// The attribute value: `release`, `store`, `unknown` or `classify`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorPolicy::Release => "release",
            ErrorPolicy::Store => "store",
            ErrorPolicy::Unknown => "unknown",
            ErrorPolicy::Classify => "classify",
        }
    }
}

/// What a later call does with an orphan of a tool **without** a state check: an `in_flight`
/// record whose lease lapsed, because its owner crashed or was cancelled, maybe after the effect.
/// (A tool with `check = …` always asks its check.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OrphanPolicy {
    /// Take it over and run the body again (the default of [`decide`](idem_core::store::decide)): right for tools whose effect
    /// is deduplicated downstream (a derived `Idempotency-Key`) or harmless to repeat.
    TakeOver,
    /// Mark it `unknown` and block the key until an operator resolves it: the body never runs
    /// twice, at the price of a human decision after a crash.
    Unknown,
}

impl OrphanPolicy {
    /// The attribute value: `takeover` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrphanPolicy::TakeOver => "takeover",
            OrphanPolicy::Unknown => "unknown",
        }
    }
}

/// The registration of one `#[idempotent]` tool. Built by the macro in a `const` context.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct ToolInfo {
    /// The stable name that goes into the key (`name = "…"`, else the fn name).
    pub name: &'static str,
    /// Whether `name` was declared explicitly (renaming the fn then keeps the keys).
    pub stable_name: bool,
    /// The Rust function's name.
    pub function: &'static str,
    /// `module_path!()` of the tool.
    pub module: &'static str,
    /// Source file.
    pub file: &'static str,
    /// Source line of the attribute.
    pub line: u32,
    /// Keyed or natural.
    pub form: Form,
    /// The declared key parts, in order (`run_id`, `req.step_id`).
    pub key_parts: &'static [&'static str],
    /// Whether a `None` key part is an error (`required`) rather than an unprotected call.
    pub key_required: bool,
    /// The key parts the durable run gives (`run_id`, `step_id` without parameters of those
    /// names: see [`crate::run`]).
    pub run_parts: &'static [&'static str],
    /// Declared TTL, if any (else the runtime's default).
    #[serde(serialize_with = "ser_opt_duration")]
    pub ttl: Option<Duration>,
    /// Declared lease, if any (else the runtime's default).
    #[serde(serialize_with = "ser_opt_duration")]
    pub lease: Option<Duration>,
    /// Argument fields left out of the fingerprint, as paths.
    pub skip: &'static [&'static [&'static str]],
    /// What an error of the body does to the claim.
    pub on_error: ErrorPolicy,
    /// What a later call does with an orphan, when there is no state check.
    pub on_orphan: OrphanPolicy,
    /// The state check (`check = path`) that reconciles orphans, or decides a keyless tool.
    pub check: Option<&'static str>,
    /// Whether the tool is transactional (`transactional`): its claim, its writes and its
    /// record commit in one transaction on the store's database.
    pub transactional: bool,
    /// How long a call waits for a concurrent call of the same key to finish before it answers
    /// in flight (`wait = "…"`; else the runtime's default wait, or [`DEFAULT_WAIT`] for a
    /// transactional tool, whose call waits for the other's commit).
    #[serde(serialize_with = "ser_opt_duration")]
    pub wait: Option<Duration>,
    /// A batch tool's list parameter (`items` of `key = "…, items[].id"`): each item has its
    /// own key and outcome; its calls never wait.
    pub batch: Option<&'static str>,
    /// A streaming tool (its body sends chunks through an `Emitter`): its chunks are recorded
    /// and replayed, and a retry during the stream follows it instead of waiting.
    pub stream: bool,
    /// The tool's metric keys, built at its first keyed call.
    #[serde(skip)]
    metrics: OnceLock<ToolMetrics>,
}

/// How long a call of a transactional tool that declares no `wait` waits for a concurrent call of
/// the same key to commit: then it replays (or runs, if that call rolled back), else it answers
/// in flight.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(2);

/// A duration the way the attribute takes it (`24h`), or none.
pub(super) fn ser_opt_duration<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&format_duration(*d)),
        None => s.serialize_none(),
    }
}

impl ToolInfo {
    /// A keyed tool with the runtime's defaults; chain the other `const fn`s to refine it.
    pub const fn new(
        name: &'static str,
        function: &'static str,
        module: &'static str,
        file: &'static str,
        line: u32,
    ) -> Self {
        ToolInfo {
            name,
            stable_name: false,
            function,
            module,
            file,
            line,
            form: Form::Keyed,
            key_parts: &[],
            key_required: false,
            run_parts: &[],
            ttl: None,
            lease: None,
            skip: &[],
            on_error: ErrorPolicy::Release,
            on_orphan: OrphanPolicy::TakeOver,
            check: None,
            transactional: false,
            wait: None,
            batch: None,
            stream: false,
            metrics: OnceLock::new(),
        }
    }

    /// Marks the tool transactional.
    pub const fn transactional(mut self) -> Self {
        self.transactional = true;
        self
    }

    /// Marks the tool a batch over its parameter `list`.
    pub const fn batch(mut self, list: &'static str) -> Self {
        self.batch = Some(list);
        self
    }

    /// Marks the tool a streaming one.
    pub const fn stream(mut self) -> Self {
        self.stream = true;
        self
    }

    /// The declared wait, in milliseconds.
    pub const fn wait_ms(mut self, ms: u64) -> Self {
        self.wait = Some(Duration::from_millis(ms));
        self
    }

    /// Marks `name` as declared explicitly.
    pub const fn stable_name(mut self) -> Self {
        self.stable_name = true;
        self
    }

    /// Marks the tool naturally idempotent.
    pub const fn natural(mut self) -> Self {
        self.form = Form::Natural;
        self
    }

    /// The key parts.
    pub const fn key(mut self, parts: &'static [&'static str], required: bool) -> Self {
        self.key_parts = parts;
        self.key_required = required;
        self
    }

    /// The key parts the durable run gives.
    pub const fn run_parts(mut self, parts: &'static [&'static str]) -> Self {
        self.run_parts = parts;
        self
    }

    /// The declared TTL in milliseconds.
    pub const fn ttl_ms(mut self, ms: u64) -> Self {
        self.ttl = Some(Duration::from_millis(ms));
        self
    }

    /// The declared lease in milliseconds.
    pub const fn lease_ms(mut self, ms: u64) -> Self {
        self.lease = Some(Duration::from_millis(ms));
        self
    }

    /// The skipped argument paths.
    pub const fn skip(mut self, paths: &'static [&'static [&'static str]]) -> Self {
        self.skip = paths;
        self
    }

    /// The state check, by its path as written.
    pub const fn check(mut self, path: &'static str) -> Self {
        self.check = Some(path);
        self
    }

    /// Marks the tool as decided by its state check alone (no key).
    pub const fn state_check(mut self) -> Self {
        self.form = Form::StateCheck;
        self
    }

    /// The error policy.
    pub const fn on_error(mut self, policy: ErrorPolicy) -> Self {
        self.on_error = policy;
        self
    }

    /// The orphan policy.
    pub const fn on_orphan(mut self, policy: OrphanPolicy) -> Self {
        self.on_orphan = policy;
        self
    }

    /// What a claim of this tool does with orphans and `unknown` records: its state check
    /// decides when it has one, else its `on_orphan` policy.
    pub fn orphans(&self) -> Orphans {
        match (self.check, self.on_orphan) {
            (Some(_), _) => Orphans::Reconcile,
            (None, OrphanPolicy::TakeOver) => Orphans::TakeOver,
            (None, OrphanPolicy::Unknown) => Orphans::Block,
        }
    }

    /// The TTL in force under `idem`.
    pub fn effective_ttl(&self, idem: &Idem) -> Duration {
        self.ttl.unwrap_or(idem.default_ttl())
    }

    /// The tool's metric keys, built at its first call.
    pub(crate) fn metrics(&self) -> &ToolMetrics {
        self.metrics.get_or_init(|| ToolMetrics::new(self.name))
    }

    /// How long a call waits for a concurrent one of the same key, when the runtime's default
    /// wait is `default`: none for a batch tool or a streaming one (whose retries follow the
    /// stream), declared, else [`DEFAULT_WAIT`] for a transactional tool, else `default`.
    pub fn effective_wait(&self, default: Duration) -> Duration {
        match self.wait {
            _ if self.batch.is_some() || self.stream => Duration::ZERO,
            Some(wait) => wait,
            None if self.transactional => DEFAULT_WAIT,
            None => default,
        }
    }

    /// The lease in force under `idem`.
    pub fn effective_lease(&self, idem: &Idem) -> Duration {
        self.lease.unwrap_or(idem.default_lease())
    }
}

/// What the macro submits to `inventory`.
#[doc(hidden)]
pub struct Registration(pub &'static ToolInfo);

inventory::collect!(Registration);

/// Every registered tool, sorted by name, then module and function (registration order is
/// unspecified, so it is never exposed).
pub fn tools() -> Vec<&'static ToolInfo> {
    let mut all: Vec<&'static ToolInfo> = inventory::iter::<Registration>
        .into_iter()
        .map(|r| r.0)
        .collect();
    sort_tools(&mut all);
    all
}

/// The one order of tools in listings and reports: by name, then where they are defined
/// (registration order is unspecified, so it is never exposed).
pub(crate) fn sort_tools(tools: &mut [&'static ToolInfo]) {
    tools.sort_by(|a, b| {
        (a.name, a.module, a.function, a.file, a.line)
            .cmp(&(b.name, b.module, b.function, b.file, b.line))
    });
}

/// Writes a duration the way the attribute takes it: `24h`, `30s`, `1500ms`.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) static A: ToolInfo = ToolInfo::new("payments.register", "register", "m", "f.rs", 1)
        .stable_name()
        .key(&["run_id", "step_id"], false)
        .ttl_ms(3_600_000);
    pub(crate) static B: ToolInfo =
        ToolInfo::new("payments.register", "register_v2", "m2", "g.rs", 9)
            .stable_name()
            .key(&["id"], true);
    pub(crate) static SHORT: ToolInfo = ToolInfo::new("short", "short", "m", "f.rs", 5)
        .key(&["id"], false)
        .ttl_ms(1_000)
        .lease_ms(5_000);
    pub(crate) static NATURAL: ToolInfo =
        ToolInfo::new("set_status", "set_status", "m", "f.rs", 7).natural();

    #[test]
    fn durations_are_written_as_the_attribute_takes_them() {
        assert_eq!(format_duration(Duration::from_secs(86_400)), "1d");
        assert_eq!(format_duration(Duration::from_secs(7_200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1_500)), "1500ms");
        assert_eq!(format_duration(Duration::ZERO), "0ms");
    }
}
