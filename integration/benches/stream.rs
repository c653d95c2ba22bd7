//! Streams, measured, on SQLite (a file), Postgres (`IDEM_TEST_POSTGRES_URL`) and Redis
//! (`IDEM_TEST_REDIS_URL`).
//!
//! For each store, `IDEM_BENCH_STREAM_ROUNDS` rounds (default 10, after 2 of warm-up), each
//! of new keys, the modes alternating round by round:
//!
//! - a streaming tool's fresh call, 1,000 chunks of 1 KiB produced as fast as the body can and
//!   read whole, against the same body's chunks sent through a bare channel of the same size
//!   (an unrecorded stream) and read whole: chunks per second, and their ratio per round;
//! - the same, with the body pacing its chunks one a millisecond (a model streaming tokens);
//! - the recorded stream replayed (a retry after completion): chunks per second.
//!
//! Then the peak memory of replaying a 100 MiB stream (1,600 chunks of 64 KiB): the peak resident
//! set is reset (`/proc/self/clear_refs`) after the stream is produced, and read
//! (`VmHWM`) after it is replayed.
//!
//! Every store call is counted. Results go to `stream.json` beside criterion's (read by
//! `bench-report`) and to stdout.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use idem::{Emitter, Idem, Outcome, idempotent};

#[path = "support/mod.rs"]
mod support;

const CHUNKS: u32 = 1000;

/// A chunk of `size` bytes.
fn chunk(n: u32, size: usize) -> String {
    let c = char::from(b'a' + (n % 26) as u8);
    std::iter::repeat_n(c, size).collect()
}

#[idempotent(key = "run_id", mutating, name = "bench.stream")]
async fn produce(
    run_id: String,
    count: u32,
    size: usize,
    pace_us: u64,
    out: Emitter<String>,
) -> Result<u32, std::io::Error> {
    for n in 0..count {
        if pace_us > 0 {
            tokio::time::sleep(Duration::from_micros(pace_us)).await;
        }
        out.emit(chunk(n, size)).await;
    }
    Ok(count)
}

/// The same body with its chunks sent through a bare channel: the stream without idem.
async fn unrecorded(count: u32, size: usize, pace_us: u64) -> u32 {
    let (sender, mut receiver) = tokio::sync::mpsc::channel(Emitter::<String>::BUFFER);
    let body = async move {
        for n in 0..count {
            if pace_us > 0 {
                tokio::time::sleep(Duration::from_micros(pace_us)).await;
            }
            let _ = sender.send(chunk(n, size)).await;
        }
    };
    let read = async {
        let mut got = 0;
        while let Some(chunk) = receiver.recv().await {
            assert_eq!(chunk.len(), size);
            got += 1;
        }
        got
    };
    let ((), got) = tokio::join!(body, read);
    got
}

/// Reads a call's stream whole; the chunks read.
async fn read_all(call: Outcome<idem::Streamed<String, u32, std::io::Error>>, fresh: bool) -> u32 {
    let stream = match call {
        Outcome::Fresh(s) if fresh => s,
        Outcome::Replayed(s) if !fresh => s,
        other => panic!("expected fresh {fresh}: {other:?}"),
    };
    let (chunks, end) = stream.collect().await.unwrap();
    assert_eq!(chunks.len() as u32, end);
    end
}

const MODES: [&str; 5] = [
    "recorded",
    "unrecorded",
    "recorded, paced",
    "unrecorded, paced",
    "replayed",
];

/// The peak resident set since the last reset, in KiB (`VmHWM`).
fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Produces a 100 MiB stream, then replays it with the peak resident set reset in between:
/// (peak KiB while replaying, resident KiB before, bytes replayed).
async fn replay_peak(tenant: &idem::Scope) -> Option<(u64, u64, u64)> {
    const SIZE: usize = 64 * 1024;
    const COUNT: u32 = 1600;
    let run = "big".to_owned();
    let fresh = tenant
        .run(produce(run.clone(), COUNT, SIZE, 0))
        .await
        .unwrap();
    let Outcome::Fresh(mut stream) = fresh else {
        panic!("fresh")
    };
    while stream.next_chunk().await.is_some() {}
    stream.finish().await.unwrap();
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    let before = peak_rss_kib()?;
    let Outcome::Replayed(mut again) = tenant.run(produce(run, COUNT, SIZE, 0)).await.unwrap()
    else {
        panic!("replayed")
    };
    let mut bytes = 0u64;
    while let Some(chunk) = again.next_chunk().await {
        bytes += chunk.len() as u64;
    }
    again.finish().await.unwrap();
    Some((peak_rss_kib()?, before, bytes))
}

fn main() {
    if !support::wanted("stream") {
        return;
    }
    let rounds: usize =
        std::env::var("IDEM_BENCH_STREAM_ROUNDS").map_or(10, |v| v.parse().unwrap());
    let (_dir, stores) = support::stores("stream", "stream.db");
    let rt = support::runtime();
    let mut json = Vec::new();
    for (store, url) in stores {
        let (seconds, calls, ratios, paced_ratios, peak) = rt.block_on(async {
            let counts = Arc::new(support::Counts::default());
            let idem = Idem::with_store(support::Counted {
                inner: idem::store::admin::open(&url).await.expect("open"),
                counts: counts.clone(),
            });
            let tenant = idem.scope(format!("bench-stream-{}", uuid::Uuid::new_v4().simple()));
            let mut seconds: [Vec<f64>; 5] = Default::default();
            let mut calls: [u64; 5] = [0; 5];
            let (mut ratios, mut paced_ratios) = (Vec::new(), Vec::new());
            for round in 0..rounds + 2 {
                let mut took = [0.0; 5];
                for (mode, took) in took.iter_mut().enumerate() {
                    let before = counts.calls.load(Ordering::Relaxed);
                    let started = Instant::now();
                    let got = match mode {
                        0 => {
                            read_all(
                                tenant
                                    .run(produce(format!("r{round}"), CHUNKS, 1024, 0))
                                    .await
                                    .unwrap(),
                                true,
                            )
                            .await
                        }
                        1 => unrecorded(CHUNKS, 1024, 0).await,
                        2 => {
                            read_all(
                                tenant
                                    .run(produce(format!("p{round}"), CHUNKS, 1024, 1000))
                                    .await
                                    .unwrap(),
                                true,
                            )
                            .await
                        }
                        3 => unrecorded(CHUNKS, 1024, 1000).await,
                        _ => {
                            read_all(
                                tenant
                                    .run(produce(format!("r{round}"), CHUNKS, 1024, 0))
                                    .await
                                    .unwrap(),
                                false,
                            )
                            .await
                        }
                    };
                    assert_eq!(got, CHUNKS);
                    *took = started.elapsed().as_secs_f64();
                    calls[mode] = calls[mode].max(counts.calls.load(Ordering::Relaxed) - before);
                }
                if round >= 2 {
                    for (mode, took) in took.iter().enumerate() {
                        seconds[mode].push(*took);
                    }
                    // Chunks per second recorded over unrecorded: the time ratio inverted.
                    ratios.push(took[1] / took[0]);
                    paced_ratios.push(took[3] / took[2]);
                }
            }
            let peak = replay_peak(&tenant).await;
            (seconds, calls, ratios, paced_ratios, peak)
        });
        let mut modes = serde_json::Map::new();
        for (mode, label) in MODES.iter().enumerate() {
            let s = support::median(&seconds[mode]);
            let per_s = f64::from(CHUNKS) / s;
            println!(
                "stream/{store}/{label}: {per_s:.0} chunks/s of 1 KiB ({:.2} ms for {CHUNKS}, \
                 median of {}), {} store round trips",
                s * 1e3,
                seconds[mode].len(),
                calls[mode]
            );
            modes.insert(
                (*label).to_owned(),
                serde_json::json!({"chunks_per_s": per_s, "ms": s * 1e3, "round_trips": calls[mode]}),
            );
        }
        let (ratio, paced) = (support::median(&ratios), support::median(&paced_ratios));
        println!(
            "stream/{store}: recorded over unrecorded, chunks/s: {ratio:.3}x as fast as the body \
             can, {paced:.3}x paced at one a millisecond (medians of the rounds' ratios)"
        );
        if let Some((peak, before, bytes)) = peak {
            println!(
                "stream/{store}: replaying {} MiB: peak resident set {} MiB (resident before: {} \
                 MiB)",
                bytes >> 20,
                peak >> 10,
                before >> 10
            );
        }
        json.push(serde_json::json!({
            "store": store,
            "chunks": CHUNKS,
            "chunk_bytes": 1024,
            "rounds": rounds,
            "modes": modes,
            "ratio": ratio,
            "ratio_paced": paced,
            "replay_100mib": peak.map(|(peak, before, bytes)| serde_json::json!({
                "peak_rss_kib": peak, "rss_before_kib": before, "bytes": bytes,
            })),
        }));
    }
    support::write_json("stream.json", &serde_json::Value::Array(json));
}
