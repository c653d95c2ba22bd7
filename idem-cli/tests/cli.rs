//! Every subcommand of `idem`, run as a process against a store filled through the store API:
//! on SQLite always, on Postgres and Redis when `IDEM_TEST_POSTGRES_URL` / `IDEM_TEST_REDIS_URL`
//! name servers (each test in a schema or key prefix of its own). No output may contain a key.

use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::Fingerprint;
use idem_core::key::{IdempotencyKey, KeyPart, derive_key};
use idem_core::store::admin;
use idem_core::store::conformance::test_server_url;
use idem_core::store::{Claim, ClaimRequest, Completion, Orphans, RecordStatus};
// The backends register their URL schemes when they are linked: naming them makes sure they are.
use idem_postgres as _;
use idem_redis as _;
use idem_sqlite as _;

const TENANT: &str = "tenant-cli";
const SECRET: &str = "secret-run";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn key(n: u32) -> IdempotencyKey {
    derive_key(
        TENANT,
        "payments.charge",
        &[KeyPart::new(&format!("{SECRET}-{n}")).unwrap()],
    )
}

fn idem(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["--store", url])
        .args(args)
        .env_remove("IDEM_STORE_URL")
        .output()
        .expect("run idem")
}

/// Runs `idem`, checks the exit code and that no key leaks, and returns stdout.
fn ok(url: &str, args: &[&str], code: i32) -> String {
    let out = idem(url, args);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(code),
        "idem {args:?}\n{stdout}\n{stderr}"
    );
    for n in 0..6 {
        let full: String = key(n)
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        for text in [&stdout, &stderr] {
            assert!(!text.contains(SECRET), "a key part leaked: {text}");
            assert!(!text.contains(&full), "a whole key digest leaked: {text}");
        }
    }
    stdout
}

/// Fills the store: 0–2 completed, 3 unknown, 4 orphaned (lease lapsed), 5 expired.
async fn fill(url: &str) {
    let store = admin::open(url).await.expect("open");
    let t = now();
    for n in 0..6u32 {
        let (created, lease, ttl) = match n {
            4 => (
                t - 120_000,
                Duration::from_secs(30),
                Duration::from_secs(3600),
            ),
            5 => (
                t - 7_200_000,
                Duration::from_secs(30),
                Duration::from_secs(3600),
            ),
            _ => (t, Duration::from_secs(30), Duration::from_secs(3600)),
        };
        let claim = store
            .claim(ClaimRequest {
                tenant: TENANT,
                key: key(n),
                tool: "payments.charge",
                fingerprint: Fingerprint::from_bytes([n as u8; 32]),
                now: created,
                lease,
                ttl,
                orphans: Orphans::TakeOver,
            })
            .await
            .expect("claim");
        let Claim::Acquired { token, .. } = claim else {
            panic!("{claim:?}")
        };
        let status = match n {
            0..=2 => RecordStatus::Completed,
            3 => RecordStatus::Unknown,
            _ => continue,
        };
        let result = format!("{{\"ok\":{{\"charge\":{n}}}}}");
        store
            .complete(Completion {
                tenant: TENANT,
                key: key(n),
                token,
                status,
                result: result.as_bytes(),
                now: created,
                ttl,
                notify: false,
            })
            .await
            .expect("complete");
    }
}

fn hash(n: u32) -> String {
    key(n).short_hash().to_string()
}

async fn every_subcommand(url: &str, backend: &str) {
    fill(url).await;

    // SQLite is at schema version 6 (chunks that name blobs), Postgres at 5 (likewise), Redis
    // at 4 (likewise).
    let version = match backend {
        "sqlite" => 6,
        "postgres" => 5,
        _ => 4,
    };
    let doctor = ok(url, &["doctor"], if backend == "redis" { 1 } else { 0 });
    assert!(doctor.contains(backend), "{doctor}");
    assert!(doctor.contains(&format!("version {version}")), "{doctor}");
    let doctor: serde_json::Value = serde_json::from_str(&ok(
        url,
        &["doctor", "--json"],
        if backend == "redis" { 1 } else { 0 },
    ))
    .unwrap();
    assert_eq!(doctor["schema_version"], version);
    match backend {
        "sqlite" => assert!(doctor["encrypted"].is_null(), "{doctor}"),
        "redis" => assert_eq!(doctor["encrypted"], false, "{doctor}"),
        _ => assert!(doctor["encrypted"].is_boolean(), "{doctor}"),
    }
    if backend != "sqlite" {
        assert!(doctor["clock_skew_ms"].is_i64(), "{doctor}");
    }
    if backend == "redis" {
        assert!(doctor["fencing"].is_string(), "{doctor}");
    } else {
        assert!(doctor["fencing"].is_null(), "{doctor}");
    }

    assert!(ok(url, &["migrate"], 0).contains(&format!("schema version {version}")));

    let stats: serde_json::Value =
        serde_json::from_str(&ok(url, &["stats", "--tenant", TENANT, "--json"], 0)).unwrap();
    assert_eq!(stats["records"], 6, "{stats}");
    assert_eq!(stats["unknown"], 1, "{stats}");
    assert_eq!(stats["orphaned"], 1, "{stats}");
    assert_eq!(stats["expired_awaiting_purge"], 1, "{stats}");
    let table = ok(url, &["stats", "--tenant", TENANT], 0);
    assert!(
        table.contains("payments.charge") && table.contains("6 record(s)"),
        "{table}"
    );

    let unknown = ok(url, &["list", "--tenant", TENANT, "--status", "unknown"], 0);
    assert!(
        unknown.contains(&hash(3)) && unknown.contains("1 record(s)"),
        "{unknown}"
    );
    let old: serde_json::Value = serde_json::from_str(&ok(
        url,
        &["list", "--tenant", TENANT, "--older-than", "1m", "--json"],
        0,
    ))
    .unwrap();
    let old: Vec<&str> = old
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(old.len(), 2, "{old:?}");
    assert!(old.contains(&hash(4).as_str()) && old.contains(&hash(5).as_str()));

    let shown: serde_json::Value = serde_json::from_str(&ok(
        url,
        &["show", "--tenant", TENANT, &hash(1), "--json"],
        0,
    ))
    .unwrap();
    assert_eq!(shown["result"]["ok"]["charge"], 1);
    assert_eq!(shown["status"], "completed");

    // Resolving: a completed record is refused; the unknown one completes; the orphan releases.
    let refused = idem(
        url,
        &[
            "resolve",
            "--tenant",
            TENANT,
            &hash(0),
            "--release",
            "--reason",
            "x",
        ],
    );
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("only unknown records and orphans"));
    let done = ok(
        url,
        &[
            "resolve",
            "--tenant",
            TENANT,
            &hash(3),
            "--complete",
            r#"{"charge":3,"by":"ops"}"#,
            "--reason",
            "found in the bank statement",
        ],
        0,
    );
    assert!(done.contains("completed"), "{done}");
    let store = admin::open(url).await.unwrap();
    let record = store.lookup(TENANT, key(3)).await.unwrap().unwrap();
    assert_eq!(record.status, RecordStatus::Completed);
    assert_eq!(record.note.as_deref(), Some("found in the bank statement"));
    let shown = ok(url, &["show", "--tenant", TENANT, &hash(3)], 0);
    assert!(shown.contains("found in the bank statement"), "{shown}");
    ok(
        url,
        &[
            "resolve",
            "--tenant",
            TENANT,
            &hash(4),
            "--release",
            "--reason",
            "never sent",
        ],
        0,
    );
    assert!(store.lookup(TENANT, key(4)).await.unwrap().is_none());

    // A dead letter, as the retry executor writes one.
    let letter_key = derive_key(
        TENANT,
        "idem.dead_letter",
        &[KeyPart::new(&"step").unwrap()],
    );
    let id = letter_key.short_hash().to_string();
    let entry = serde_json::json!({
        "id": id, "tenant": TENANT, "tool": "payments.charge", "key": hash(2),
        "reason": "idempotency_in_flight", "attempts": 8, "at": now(),
    });
    let claim = store
        .claim(ClaimRequest {
            tenant: TENANT,
            key: letter_key,
            tool: "idem.dead_letter",
            fingerprint: Fingerprint::from_bytes([0; 32]),
            now: now(),
            lease: Duration::from_secs(30),
            ttl: Duration::from_secs(3600),
            orphans: Orphans::TakeOver,
        })
        .await
        .unwrap();
    let Claim::Acquired { token, .. } = claim else {
        panic!("{claim:?}")
    };
    let bytes = serde_json::to_vec(&entry).unwrap();
    store
        .complete(Completion {
            tenant: TENANT,
            key: letter_key,
            token,
            status: RecordStatus::Completed,
            result: &bytes,
            now: now(),
            ttl: Duration::from_secs(3600),
            notify: false,
        })
        .await
        .unwrap();
    let listed = ok(url, &["dlq", "list", "--tenant", TENANT], 0);
    assert!(
        listed.contains(&id)
            && listed.contains("idempotency_in_flight")
            && listed.contains("1 dead letter"),
        "{listed}"
    );
    let listed: serde_json::Value =
        serde_json::from_str(&ok(url, &["dlq", "list", "--tenant", TENANT, "--json"], 0)).unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["id"] == id.as_str())
    );
    ok(url, &["dlq", "ack", "--tenant", TENANT, &id], 0);
    assert!(ok(url, &["dlq", "list", "--tenant", TENANT], 0).contains("0 dead letter"));
    let not_a_letter = idem(url, &["dlq", "ack", "--tenant", TENANT, &hash(1)]);
    assert_eq!(not_a_letter.status.code(), Some(2));

    let missing = idem(url, &["show", "--tenant", TENANT, "abcdef"]);
    assert_eq!(missing.status.code(), Some(2));

    if backend == "redis" {
        // Expired records are gone by themselves; the fabricated one expired an hour ago.
        let purged = ok(url, &["purge"], 0);
        assert!(purged.contains("expire on their own"), "{purged}");
    } else {
        assert!(ok(url, &["purge", "--dry-run"], 0).contains("would delete 1 "));
        assert!(ok(url, &["purge"], 0).contains("deleted 1 "));
        assert!(ok(url, &["purge", "--dry-run"], 0).contains("would delete 0 "));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    every_subcommand(&url, "sqlite").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_on_postgres() {
    let Some(url) = test_server_url("IDEM_TEST_POSTGRES_URL") else {
        return;
    };
    let schema = format!("idem_cli_{}", uuid::Uuid::new_v4().simple());
    let sep = if url.contains('?') { '&' } else { '?' };
    every_subcommand(&format!("{url}{sep}schema={schema}"), "postgres").await;
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn every_subcommand_on_redis() {
    let Some(url) = test_server_url("IDEM_TEST_REDIS_URL") else {
        return;
    };
    let prefix = format!("idem-cli-{}", uuid::Uuid::new_v4().simple());
    // Database 7 of the same server: the scans walk a small keyspace, not every test's keys.
    let base = url.split_once('?').map_or(url.as_str(), |(b, _)| b);
    let base = base
        .trim_end_matches(|c: char| c.is_ascii_digit())
        .trim_end_matches('/');
    let url = format!("{base}/7");
    every_subcommand(&format!("{url}?prefix={prefix}"), "redis").await;
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{prefix}:meta"))
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// `idem doctor` says how the Redis store fences its writes: on Valkey 9 by the server's own
/// compare-and-set, unless the URL asks for scripts.
#[test]
fn doctor_names_the_fencing_of_a_valkey_server() {
    let Some(url) = test_server_url("IDEM_TEST_VALKEY_URL") else {
        return;
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{sep}prefix=idem-cli-doctor");
    // Not durable (the test server keeps nothing on disk): exit code 1.
    let native = ok(&url, &["doctor"], 1);
    assert!(
        native.contains("fencing      the server's compare-and-set (SET … IFEQ, DELIFEQ)"),
        "{native}"
    );
    let scripts = ok(&format!("{url}&fencing=script"), &["doctor"], 1);
    assert!(scripts.contains("fencing      Lua scripts"), "{scripts}");
}

#[test]
fn bad_urls_and_unreachable_stores_are_clear_errors() {
    for (url, expect) in [
        ("nope", "expected `scheme://…`"),
        ("mysql://h/db", "mysql"),
        ("postgres://postgres@127.0.0.1:1/test", "postgres"),
        (
            "sqlite:///nonexistent-idem-dir/x.db",
            "directory does not exist",
        ),
    ] {
        let out = idem(url, &["doctor"]);
        assert_eq!(out.status.code(), Some(2), "{url}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("idem: ") && err.contains(expect),
            "{url}: {err}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("stats")
        .env_remove("IDEM_STORE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("IDEM_STORE_URL"));
}

/// `--older-than` takes humantime's forms (`ms`, compound) and refuses what does not fit,
/// clearly, instead of panicking or wrapping (`99999999999d` used to overflow `n * 86_400`).
#[tokio::test(flavor = "multi_thread")]
async fn durations_take_compound_forms_and_refuse_overflow_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("d.db").display());
    fill(&url).await;
    // Record 5 is two hours old; the others are new.
    for (age, listed) in [
        ("1h30m", true),
        ("500ms", true),
        ("3h", false),
        ("2h 1m", false),
    ] {
        let out = ok(&url, &["list", "--older-than", age, "--json"], 0);
        let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
        let found = rows
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["key"] == hash(5).as_str());
        assert_eq!(found, listed, "--older-than {age}: {out}");
    }
    // A huge but representable duration lists nothing: no record is that old, and no wrap.
    let out = ok(&url, &["list", "--older-than", "99999999999d", "--json"], 0);
    assert_eq!(out.trim(), "[]", "{out}");
    for bad in ["99999999999999999999d", "5 parsecs", "-1h", ""] {
        let out = idem(&url, &["list", &format!("--older-than={bad}")]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is not a duration") && err.contains("1h30m"),
            "{bad}: {err}"
        );
    }
}

/// Tables are aligned by display width, and what callers wrote (tenants, tool names, notes)
/// reaches the terminal escaped: no control character or bidi override goes through.
#[tokio::test(flavor = "multi_thread")]
async fn tables_align_wide_text_and_escape_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let store = admin::open(&url).await.expect("open");
    let t = now();
    for (tenant, tool) in [
        ("租户-東京", "payments.charge"),
        ("plain", "evil\u{1b}[2Jtool"),
        ("rtl\u{202e}gnp.exe", "mail.send"),
    ] {
        store
            .claim(ClaimRequest {
                tenant,
                key: derive_key(tenant, tool, &[KeyPart::new("k").unwrap()]),
                tool,
                fingerprint: Fingerprint::from_bytes([1; 32]),
                now: t,
                lease: Duration::from_secs(30),
                ttl: Duration::from_secs(3600),
                orphans: Orphans::TakeOver,
            })
            .await
            .expect("claim");
    }
    for args in [&["list"][..], &["stats"][..]] {
        let out = ok(&url, args, 0);
        assert!(
            !out.contains('\u{1b}') && !out.contains('\u{202e}'),
            "{out:?}"
        );
        assert!(out.contains("evil\\u{1b}[2Jtool"), "{out}");
        assert!(
            out.contains("租户-東京") && out.contains("rtl\\u{202e}gnp.exe"),
            "{out}"
        );
        // The column after the tenant starts at the same display column on every row.
        let starts: Vec<usize> = out
            .lines()
            .take_while(|l| !l.is_empty() && !l.contains("record(s)"))
            .map(|l| {
                let tenant_end = l.find("  ").unwrap();
                let rest = &l[tenant_end..];
                let pad = rest.len() - rest.trim_start().len();
                unicode_width::UnicodeWidthStr::width(&l[..tenant_end]) + pad
            })
            .collect();
        assert!(starts.len() >= 4, "{out}");
        assert!(starts.windows(2).all(|w| w[0] == w[1]), "{args:?}:\n{out}");
    }
}

#[idem::idempotent(key = "run_id, step_id", mutating, name = "cli.runs.day", ttl = "1d")]
async fn daily(amount_cents: u64) -> Result<u64, std::fmt::Error> {
    Ok(amount_cents)
}

#[idem::idempotent(key = "run_id, step_id", mutating, name = "cli.runs.week", ttl = "8d")]
async fn weekly(amount_cents: u64) -> Result<u64, std::fmt::Error> {
    Ok(amount_cents)
}

/// `doctor --tools` reads the JSON report a runtime wrote, and shows each keyed tool's TTL
/// beside the resume window: a shorter one is a problem (exit 1), unless accepted.
#[test]
fn doctor_shows_each_ttl_beside_the_resume_window() {
    let _ = (daily, weekly);
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("idem.db").display());
    let report = dir.path().join("tools.json");
    let week = Duration::from_secs(7 * 24 * 3600);
    let runtime = |accept: bool| {
        let builder = idem::Idem::builder().resume_window(week);
        let builder = if accept {
            builder.accept_short_ttl("cli.runs.day")
        } else {
            builder
        };
        builder.build(idem::store::memory::MemoryStore::new())
    };
    runtime(false).report().write(&report).unwrap();
    let path = report.to_str().unwrap();
    let text = ok(&url, &["doctor", "--tools", path], 1);
    for words in [
        "resume for up to 7d: keys must live 8d",
        "cli.runs.week",
        "problem: tool `cli.runs.day`: TTL 1d is shorter than 8d",
        "declare `ttl = \"8d\"` on it",
    ] {
        assert!(text.contains(words), "{words}: {text}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&ok(&url, &["doctor", "--tools", path, "--json"], 1)).unwrap();
    assert_eq!(json["runs"]["resume_window"], "7d", "{json}");
    let tools = json["runs"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2, "{json}");
    assert_eq!(tools[0]["tool"], "cli.runs.day");
    assert_eq!(tools[0]["enough"], false);
    assert_eq!(tools[1]["enough"], true);

    runtime(true).report().write(&report).unwrap();
    let text = ok(&url, &["doctor", "--tools", path], 0);
    assert!(text.contains("✗ accepted (accept_short_ttl)"), "{text}");

    std::fs::write(&report, "not json").unwrap();
    let out = idem(&url, &["doctor", "--tools", path]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not a JSON tool report"), "{stderr}");
}
