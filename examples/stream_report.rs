//! A streaming tool: a sub-agent drafts a report section by section, and the agent shows each
//! section as it comes. The host's retry handler sends the call again while the draft is being
//! written, and after a restart the agent asks once more.
//!
//! Each section is recorded under the call's key before the agent sees it. The retry sent
//! during the stream follows it (the sections so far, then the rest as they are written); the
//! call after the restart replays them from the SQLite file. The sub-agent (the paid model)
//! writes the report once.
//!
//! Run it with `cargo run --example stream_report`. It exits non-zero if the report was
//! written twice or a reader got other sections, or fewer.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem::{Emitter, Idem, Outcome, idempotent};

/// How many times the sub-agent wrote a report.
static WRITTEN: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Section {
    title: String,
    text: String,
}

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Summary {
    sections: usize,
    words: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("the sub-agent gave up: {0}")]
struct DraftFailed(String);

const TITLES: [&str; 6] = [
    "Revenue",
    "Costs",
    "Churn",
    "Pipeline",
    "Risks",
    "Next quarter",
];

/// Drafts the quarterly report, one section every 60 ms (a model streaming its answer).
#[idempotent(key = "run_id, step_id", mutating, name = "reports.draft")]
async fn draft_report(
    run_id: String,
    step_id: u32,
    quarter: String,
    out: Emitter<Section>,
) -> Result<Summary, DraftFailed> {
    WRITTEN.fetch_add(1, Ordering::SeqCst);
    let mut words = 0;
    for title in TITLES {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let text = format!("{title} for {quarter}: steady, with details to follow.");
        words += text.split_whitespace().count();
        out.emit(Section {
            title: title.to_owned(),
            text,
        })
        .await;
    }
    Ok(Summary {
        sections: TITLES.len(),
        words,
    })
}

/// Reads a call's sections as they come, and its end.
async fn read(
    who: &str,
    call: Outcome<idem::Streamed<Section, Summary, DraftFailed>>,
) -> Result<(Vec<Section>, Summary), Box<dyn std::error::Error>> {
    let (how, mut stream) = match call {
        Outcome::Fresh(stream) => ("ran the sub-agent", stream),
        Outcome::Replayed(stream) => ("reads the recorded draft", stream),
        other => return Err(format!("{who}: {other:?}").into()),
    };
    println!("{who} {how}");
    let mut sections = Vec::new();
    while let Some(section) = stream.next_chunk().await {
        println!("  {who}: {}", section.title);
        sections.push(section);
    }
    let summary = stream.finish().await?;
    Ok((sections, summary))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::temp_dir().join(format!("idem-stream-{}.db", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", path.display());
    let idem = Idem::open(&url).await?;
    let tenant = idem.scope("tenant-a");
    let call = || draft_report("run-4".into(), 2, "Q3".into());

    // The agent's call, and the retry handler's 150 ms later, during the draft.
    let first = tenant.run(call()).await?;
    let agent = tokio::spawn(async move { read("agent", first).await.map_err(|e| e.to_string()) });
    tokio::time::sleep(Duration::from_millis(150)).await;
    let retry = tenant.run(call()).await?;
    let followed = read("retry", retry).await?;
    let written = agent.await??;

    // The process restarts, and the agent asks once more.
    drop(idem);
    let idem = Idem::open(&url).await?;
    let again = idem.scope("tenant-a").run(call()).await?;
    let replayed = read("after the restart", again).await?;

    let times = WRITTEN.load(Ordering::SeqCst);
    println!(
        "the sub-agent wrote the report {times} time(s); summary {:?}",
        written.1
    );
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    if times != 1 || written.0.len() != TITLES.len() || followed != written || replayed != written {
        return Err("expected one draft, read whole and alike by every call".into());
    }
    Ok(())
}
