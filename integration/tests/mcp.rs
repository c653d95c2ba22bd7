//! The MCP example, driven by rmcp's own client over stdio: the example binary is spawned, its
//! tools listed and called as a model's host would.

use std::path::{Path, PathBuf};

#[path = "common/python.rs"]
mod python;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ProgressNotificationParam};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

/// `target/debug/examples/mcp_server`: `cargo test` builds the examples beside the tests.
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .join("examples/mcp_server");
    assert!(
        binary.exists(),
        "{} is missing: `cargo test` builds the examples",
        binary.display()
    );
    binary
}

fn arguments(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_over_stdio_sees_replays_mismatches_and_honest_tools() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let mut command = tokio::process::Command::new(example());
    command.args(["--store", &store]);
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();

    let info = client.peer_info().expect("the server's info");
    let advertised = info
        .capabilities
        .experimental
        .as_ref()
        .and_then(|e| e.get(idem::mcp::CAPABILITY))
        .expect("idempotency advertised");
    assert_eq!(
        advertised["keys"],
        json!(["_meta.idempotencyKey", "_meta.idempotency_key"])
    );
    let tools = client.list_all_tools().await.unwrap();
    let tool = |name: &str| tools.iter().find(|t| t.name == name).unwrap().clone();
    let pay = tool("register_payment");
    let description = pay.description.clone().unwrap_or_default();
    assert!(description.contains("Charges a customer"), "{description}");
    assert!(description.contains("idempotency_key"), "{description}");
    assert!(description.contains("replayed: true"), "{description}");
    assert!(description.contains("may be omitted"), "{description}");
    let annotations = pay.annotations.clone().unwrap();
    assert_eq!(annotations.idempotent_hint, Some(true));
    assert_eq!(annotations.destructive_hint, Some(false));
    assert_eq!(annotations.read_only_hint, Some(false));
    let schema = serde_json::to_string(&pay.input_schema).unwrap();
    assert!(
        schema.contains("idempotency_key") && schema.contains("amount_cents"),
        "{schema}"
    );
    assert!(
        tool("assign_shift")
            .description
            .unwrap_or_default()
            .contains("already done")
    );
    assert!(
        tool("set_status")
            .description
            .unwrap_or_default()
            .contains("Safe to retry")
    );
    assert_eq!(
        tool("list_charges").annotations.unwrap().read_only_hint,
        Some(true)
    );

    let call = |name: &'static str, args: Value| {
        let client = &client;
        async move {
            client
                .call_tool(CallToolRequestParams::new(name).with_arguments(arguments(args)))
                .await
                .unwrap()
        }
    };
    let charge = json!({
        "customer": "cus_42", "amount_cents": 500, "currency": "eur", "idempotency_key": "pay-r9-s3"
    });
    let first = call("register_payment", charge.clone()).await;
    let first = first.structured_content.unwrap();
    assert_eq!(first["status"], "ok");
    assert_eq!(first["replayed"], false);
    let second = call("register_payment", charge.clone()).await;
    assert_eq!(second.is_error, Some(false));
    let second = second.structured_content.unwrap();
    assert_eq!(second["replayed"], true, "{second}");
    assert_eq!(
        second["value"], first["value"],
        "the first charge, replayed"
    );

    let mut other = charge.clone();
    other["amount_cents"] = json!(900);
    let mismatch = call("register_payment", other).await;
    assert_eq!(mismatch.is_error, Some(true));
    let mismatch = mismatch.structured_content.unwrap();
    assert_eq!(mismatch["status"], "mismatch");
    assert!(
        !mismatch.to_string().contains("pay-r9-s3"),
        "no key in {mismatch}"
    );

    let charges = call("list_charges", json!({})).await;
    let text = serde_json::to_value(&charges.content).unwrap().to_string();
    assert_eq!(text.matches("pay_").count(), 1, "one charge: {text}");

    let shift = json!({"crewmate": "ana", "shift": "night"});
    let assigned = call("assign_shift", shift.clone())
        .await
        .structured_content
        .unwrap();
    assert_eq!(assigned["value"]["already_assigned"], false);
    let again = call("assign_shift", shift)
        .await
        .structured_content
        .unwrap();
    assert_eq!(again["replayed"], true);
    assert_eq!(again["value"]["already_assigned"], true);

    let status = json!({"entity": "order-7", "status": "shipped"});
    for _ in 0..2 {
        let out = call("set_status", status.clone())
            .await
            .structured_content
            .unwrap();
        assert_eq!(out["status"], "ok");
    }
    client.cancel().await.unwrap();
}

/// A `tools/call` of `charge_run_step` with `_meta` holding `meta` (a JSON object).
fn step_call(meta: Option<Value>) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new("charge_run_step").with_arguments(arguments(
        json!({"customer": "cus_7", "amount_cents": 250, "currency": "eur"}),
    ));
    params.meta = meta.map(|m| serde_json::from_value(m).unwrap());
    params
}

/// Two `tools/call`s of `refund` over raw streamable HTTP, its key beside the arguments
/// (`params.idempotencyKey`, as MCP's proposal puts it): their structured results.
async fn raw_http_refunds(mcp: &str) -> Vec<Value> {
    let http = reqwest::Client::new();
    let post = |body: Value, session: Option<&str>| {
        let mut req = http
            .post(mcp)
            .header("accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            req = req
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-06-18");
        }
        req.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    let init = post(init, None).await.unwrap();
    let session = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let _ = init.text().await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(initialized, Some(&session)).await.unwrap();
    let mut out = Vec::new();
    for id in [2, 3] {
        let call = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "refund", "arguments": {"charge": "ch_9", "amount_cents": 100},
            "idempotencyKey": "r-http"}});
        let text = post(call, Some(&session))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // A stream of events (`data: {…}`), or one JSON body.
        let answer = text
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .chain(serde_json::from_str::<Value>(&text).ok())
            .find(|message| message["id"] == id)
            .unwrap_or_else(|| panic!("no answer to call {id}: {text}"));
        out.push(answer["result"]["structuredContent"].clone());
    }
    out
}

/// The example over streamable HTTP (`--http`), with Prometheus metrics (`--metrics`): keys from
/// the request's `_meta`, replays across two client sessions, the counters of what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_keys_from_meta_and_prometheus_metrics() {
    use rmcp::transport::StreamableHttpClientTransport;
    use tokio::io::AsyncBufReadExt;

    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let mut server = tokio::process::Command::new(example())
        .args([
            "--store",
            &store,
            "--http",
            "127.0.0.1:0",
            "--metrics",
            "127.0.0.1:0",
            "--latency",
            "300",
        ])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The example prints where it listens: the metrics first, then MCP.
    let mut lines = tokio::io::BufReader::new(server.stderr.take().unwrap()).lines();
    let (mut mcp, mut metrics) = (None, None);
    while mcp.is_none() || metrics.is_none() {
        let line = lines
            .next_line()
            .await
            .unwrap()
            .expect("the server's addresses");
        let url = line.rsplit(' ').next().unwrap().to_owned();
        if line.contains("streamable HTTP") {
            mcp = Some(url);
        } else if line.contains("Prometheus") {
            metrics = Some(url);
        }
    }
    let (mcp, metrics) = (mcp.unwrap(), metrics.unwrap());

    let client = ().serve(StreamableHttpClientTransport::from_uri(mcp.clone())).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    let step = tools.iter().find(|t| t.name == "charge_run_step").unwrap();
    let description = step.description.clone().unwrap_or_default();
    assert!(description.contains("`_meta`"), "{description}");
    assert!(description.contains("never pass a key"), "{description}");
    let schema = serde_json::to_string(&step.input_schema).unwrap();
    assert!(
        !schema.contains("run_id"),
        "the key is not the model's: {schema}"
    );

    let meta = json!({"run_id": "run-42", "step_id": "7"});
    let first = client
        .call_tool(step_call(Some(meta.clone())))
        .await
        .unwrap();
    let first = first.structured_content.unwrap();
    assert_eq!(
        (first["status"].clone(), first["replayed"].clone()),
        (json!("ok"), json!(false))
    );
    client.cancel().await.unwrap();

    // Another session (a restarted host) retries the same step: replayed, not charged again.
    let client = ().serve(StreamableHttpClientTransport::from_uri(mcp.clone())).await.unwrap();
    let again = client.call_tool(step_call(Some(meta))).await.unwrap();
    let again = again.structured_content.unwrap();
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["value"], first["value"]);
    // Another step of the run is another charge; a call without the ids is refused, not run.
    let next = client
        .call_tool(step_call(Some(json!({"run_id": "run-42", "step_id": "8"}))))
        .await
        .unwrap();
    assert_eq!(next.structured_content.unwrap()["replayed"], false);
    let keyless = client.call_tool(step_call(None)).await.unwrap();
    assert_eq!(keyless.is_error, Some(true));
    let keyless = keyless.structured_content.unwrap();
    assert!(
        keyless["message"].as_str().unwrap().contains("key"),
        "{keyless}"
    );
    let wrong = client
        .call_tool(step_call(Some(json!({"run_id": "run-42", "step_id": 9}))))
        .await
        .unwrap_err();
    assert!(wrong.to_string().contains("_meta.step_id"), "{wrong}");
    // Two sessions send one step at once (a host retried while the first call ran, 300 ms at the
    // provider): the second waits for the first, and both answer its one charge.
    let other = ().serve(StreamableHttpClientTransport::from_uri(mcp.clone())).await.unwrap();
    let meta = json!({"run_id": "run-42", "step_id": "10"});
    let (a, b) = tokio::join!(
        client.call_tool(step_call(Some(meta.clone()))),
        other.call_tool(step_call(Some(meta)))
    );
    let (a, b) = (
        a.unwrap().structured_content.unwrap(),
        b.unwrap().structured_content.unwrap(),
    );
    assert_eq!(
        (&a["status"], &b["status"]),
        (&json!("ok"), &json!("ok")),
        "{a} {b}"
    );
    assert_eq!(a["value"], b["value"], "one charge");
    assert_ne!(a["replayed"], b["replayed"], "one ran, one waited: {a} {b}");
    other.cancel().await.unwrap();
    // A key beside the arguments, over raw HTTP: lifted into `_meta`, the second call replays.
    let refunds = raw_http_refunds(&mcp).await;
    assert_eq!(refunds[0]["replayed"], false, "{refunds:?}");
    assert_eq!(refunds[1]["replayed"], true, "{refunds:?}");
    assert_eq!(refunds[1]["value"], refunds[0]["value"]);
    let charges = client
        .call_tool(CallToolRequestParams::new("list_charges"))
        .await
        .unwrap();
    let text = serde_json::to_value(&charges.content).unwrap().to_string();
    assert_eq!(
        text.matches("pay_").count(),
        3,
        "three steps, three charges: {text}"
    );
    client.cancel().await.unwrap();

    let scrape = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
    let calls = |outcome: &str| {
        scrape
            .lines()
            .find(|l| {
                l.starts_with("idem_calls_total{")
                    && l.contains(r#"tool="mcp.charge_run_step""#)
                    && l.contains(&format!(r#"outcome="{outcome}""#))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(calls("fresh").as_deref(), Some("3"), "{scrape}");
    assert_eq!(calls("replayed").as_deref(), Some("2"), "{scrape}");
    assert!(
        scrape.contains("# HELP idem_calls_total ")
            && scrape.contains("# TYPE idem_calls_total counter"),
        "described for Prometheus: {scrape}"
    );
    assert!(!scrape.contains("run-42"), "no key in the metrics");
    server.kill().await.unwrap();
}

/// A client that keeps the progress notifications it receives.
#[derive(Clone, Default)]
struct Listener {
    notes: std::sync::Arc<std::sync::Mutex<Vec<ProgressNotificationParam>>>,
}

impl rmcp::ClientHandler for Listener {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.notes.lock().unwrap().push(params);
    }
}

/// A progress notification as the test compares it: progress, total, message.
type Note = (f64, Option<f64>, Option<String>);

impl Listener {
    /// How many notifications came.
    fn count(&self) -> usize {
        self.notes.lock().unwrap().len()
    }

    /// The notes received once `count` came (or 10 s passed), by the token they were sent to
    /// (rmcp's client gives each request a token of its own), each token's in the order of
    /// their progress (the client may handle them out of order): progress, total, message.
    async fn by_token(&self, count: usize) -> Vec<Vec<Note>> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.count() < count && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let mut tokens: Vec<(String, Vec<Note>)> = Vec::new();
        for note in self.notes.lock().unwrap().iter() {
            let token = serde_json::to_string(&note.progress_token).unwrap();
            let entry = (note.progress, note.total, note.message.clone());
            match tokens.iter_mut().find(|(t, _)| *t == token) {
                Some((_, notes)) => notes.push(entry),
                None => tokens.push((token, vec![entry])),
            }
        }
        tokens
            .into_iter()
            .map(|(_, mut notes)| {
                notes.sort_by(|a, b| a.0.total_cmp(&b.0));
                notes
            })
            .collect()
    }
}

/// A `tools/call` of `export_ledger` of `rows` rows under `key` (rmcp's client asks for progress
/// with a token of its own).
fn export_call(rows: u32, key: &str) -> CallToolRequestParams {
    CallToolRequestParams::new("export_ledger")
        .with_arguments(arguments(json!({"rows": rows, "idempotency_key": key})))
}

/// A streaming tool's progress notifications, recorded and replayed: a retried export (a new
/// request, with a token of its own) receives the same 40 notifications, then the first
/// export's result; a retry sent while the first still streams receives them all too; the
/// export ran once per key (its result counts the exports the server ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_export_replays_its_progress_notifications() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let mut command = tokio::process::Command::new(example());
    command.args(["--store", &store, "--latency", "5"]);
    let listener = Listener::default();
    let client = listener
        .clone()
        .serve(TokioChildProcess::new(command).unwrap())
        .await
        .unwrap();

    let rows = |n: u32| -> Vec<Note> {
        (1..=n)
            .map(|row| {
                (
                    f64::from(row),
                    Some(f64::from(n)),
                    Some(format!("exported row {row} of {n}")),
                )
            })
            .collect()
    };
    let first = client.call_tool(export_call(40, "exp-1")).await.unwrap();
    let first = first.structured_content.unwrap();
    assert_eq!(
        (&first["status"], &first["replayed"]),
        (&json!("ok"), &json!(false))
    );
    assert_eq!(first["value"], json!({"rows": 40, "export": 1}));
    assert_eq!(listener.by_token(40).await, vec![rows(40)]);
    let again = client.call_tool(export_call(40, "exp-1")).await.unwrap();
    let again = again.structured_content.unwrap();
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["value"], first["value"], "the first export's result");
    assert_eq!(
        listener.by_token(80).await,
        vec![rows(40), rows(40)],
        "the same notifications, to the retry's token"
    );

    // A retry while the first export streams (40 rows 5 ms apart) follows it.
    let fresh = client.call_tool(export_call(40, "exp-2"));
    let retry = async {
        listener.by_token(85).await;
        client.call_tool(export_call(40, "exp-2")).await
    };
    let (fresh, retry) = tokio::join!(fresh, retry);
    let (fresh, retry) = (
        fresh.unwrap().structured_content.unwrap(),
        retry.unwrap().structured_content.unwrap(),
    );
    assert_eq!(fresh["value"], json!({"rows": 40, "export": 2}));
    assert_eq!(
        (&retry["replayed"], &retry["value"]),
        (&json!(true), &fresh["value"])
    );
    assert_eq!(
        listener.by_token(160).await,
        vec![rows(40), rows(40), rows(40), rows(40)],
        "the follower's too, all 40"
    );

    // Another key exports again; a bad argument is the tool's error, and notifies nothing.
    let next = client.call_tool(export_call(3, "exp-3")).await.unwrap();
    assert_eq!(
        next.structured_content.unwrap()["value"],
        json!({"rows": 3, "export": 3})
    );
    let bad = client.call_tool(export_call(0, "exp-4")).await.unwrap();
    assert_eq!(bad.is_error, Some(true));
    let bad = bad.structured_content.unwrap();
    assert!(
        bad["message"].as_str().unwrap().contains("rows must be"),
        "{bad}"
    );
    let all = listener.by_token(163).await;
    assert_eq!(all.len(), 5, "one token per call that exported");
    assert_eq!(all[4], rows(3));
    assert_eq!(listener.count(), 163, "no more");
    client.cancel().await.unwrap();
}

/// The `PYTHONPATH` under which the official MCP Python SDK imports (`IDEM_TEST_PYTHON_MCP`,
/// which `.ci/run` sets and fills with `pip install --target`; unset, the system's packages);
/// `None` skips the test (with `IDEM_REQUIRE_BACKENDS=1`, as in CI, a missing SDK is a
/// failure).
fn python_mcp() -> Option<String> {
    let dir = std::env::var("IDEM_TEST_PYTHON_MCP").unwrap_or_default();
    let install = "pip install --target DIR mcp==2.3.0, and set IDEM_TEST_PYTHON_MCP=DIR";
    python::can_import("mcp", Some(&dir), install).then_some(dir)
}

/// The official MCP Python SDK sends the key each way a client may (`tests/mcp_python/keys.py`):
/// `_meta.idempotency_key`, `_meta.idempotencyKey` and `params.idempotencyKey` (beside
/// `arguments`, as MCP's proposal puts it: rmcp 3.11 drops it, and the example lifts it into
/// `_meta` first, `idem::mcp::lift_keys`) each replay the first refund; the same key with other
/// arguments is a mismatch; no key is refused (the tool requires one). The server's
/// experimental capability says where keys go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_sends_the_key_each_way_a_client_may() {
    let Some(lib) = python_mcp() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", dir.path().join("idem.db").display());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp_python/keys.py");
    let output = tokio::process::Command::new("python3")
        .arg(script)
        .arg(example())
        .arg(&store)
        .env("PYTHONPATH", &lib)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        out["experimental"]["idempotency"]["keys"],
        json!(["_meta.idempotencyKey", "_meta.idempotency_key"])
    );
    // (The raw JSON-RPC calls run a server process of their own: its first refund is re_1.)
    for (form, id) in [("snake", "re_1"), ("camel", "re_2"), ("params", "re_1")] {
        let [first, again] = [&out[form][0], &out[form][1]];
        assert_eq!(first["is_error"], false, "{form}: {first}");
        assert_eq!(first["content"]["value"]["id"], id, "{form}: {first}");
        assert_eq!(first["content"]["replayed"], false);
        assert_eq!(again["content"]["replayed"], true, "{form}: {again}");
        assert_eq!(again["content"]["value"], first["content"]["value"]);
    }
    assert_eq!(out["reused"]["is_error"], true);
    assert_eq!(out["reused"]["content"]["status"], "mismatch");
    let refused = |answer: &Value| {
        answer["is_error"] == true
            && answer["content"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("requires an idempotency key"))
    };
    assert!(refused(&out["keyless"]), "{}", out["keyless"]);
}
