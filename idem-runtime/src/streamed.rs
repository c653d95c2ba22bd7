//! What a streaming tool works with: the [`Emitter`] its body sends chunks through, and the
//! [`Streamed`] its caller reads them from, then the tool's end.
//!
//! | the call | its `Streamed` gives |
//! |---|---|
//! | ran the body (`Outcome::Fresh`) | each chunk once it is recorded, then the body's value |
//! | found the call completed (`Outcome::Replayed`) | the recorded chunks, in order, then the stored value or error |
//! | found the call still running (`Outcome::Replayed`) | the chunks recorded so far, then the rest as they are recorded, then the end |
//!
//! Chunks come out as the stream is read: nothing is produced or read ahead of a reader that
//! stopped reading but a bounded buffer (the body waits in [`Emitter::emit`] meanwhile).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use idem_core::Error;

/// The chunks a stream's driver made ready and its reader has not taken yet.
pub(crate) type Ready<T> = Arc<Mutex<VecDeque<T>>>;

/// The end of a stream: the tool's value, or why there is none.
pub(crate) type End<V, E> = Result<V, Error<E>>;

/// What makes a stream's chunks ready (running the body, or reading the store) and answers its
/// end.
pub(crate) type Driver<V, E> = Pin<Box<dyn Future<Output = End<V, E>> + Send>>;

/// The sending end of a streaming tool: its body's last parameter (`out: idem::Emitter<T>`).
///
/// Each chunk is recorded under the call's key, in order, fenced by the call's claim, before
/// a reader gets it; a retry of the call replays the recorded chunks. Chunks are recorded in
/// batches while the body goes on: [`emit`](Emitter::emit) waits only when
/// [`Emitter::BUFFER`] chunks wait to be recorded.
pub struct Emitter<T> {
    sender: tokio::sync::mpsc::Sender<T>,
}

impl<T> Emitter<T> {
    /// How many emitted chunks may wait to be recorded before [`emit`](Emitter::emit) waits.
    pub const BUFFER: usize = 256;

    pub(crate) fn new(sender: tokio::sync::mpsc::Sender<T>) -> Self {
        Emitter { sender }
    }

    /// Sends one chunk. If the call can record nothing more (its claim was taken over, or the
    /// store failed past the completion window), the body is stopped at this await and the
    /// call answers why.
    pub async fn emit(&self, chunk: T) {
        // A closed channel: the recording stopped, and the body is dropped at its next await.
        let _ = self.sender.send(chunk).await;
    }
}

impl<T> fmt::Debug for Emitter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Emitter").finish_non_exhaustive()
    }
}

/// The chunks of a streaming tool's call, as a [`Stream`](futures_core::Stream) of `T`, and its
/// end ([`Streamed::finish`]): the tool's value `V`, or the error that ended the stream.
///
/// Read the chunks (`while let Some(chunk) = streamed.next_chunk().await`, or any `Stream`
/// combinator), then call [`finish`](Streamed::finish): a stream that broke off ends early, and
/// `finish` says why.
#[must_use = "a stream does nothing unless read, and its end (`finish`) says whether it completed"]
pub struct Streamed<T, V, E> {
    ready: Ready<T>,
    driver: Option<Driver<V, E>>,
    end: Option<End<V, E>>,
}

impl<T, V, E> Streamed<T, V, E> {
    pub(crate) fn new(ready: Ready<T>, driver: Driver<V, E>) -> Self {
        Streamed {
            ready,
            driver: Some(driver),
            end: None,
        }
    }

    /// The next chunk, or `None` at the end of the stream (then [`finish`](Streamed::finish)).
    pub async fn next_chunk(&mut self) -> Option<T> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// The end of the call: the tool's value once every chunk was produced (or replayed), or
    /// the error that ended the stream. Chunks not read yet are read and dropped.
    pub async fn finish(mut self) -> Result<V, Error<E>> {
        while self.next_chunk().await.is_some() {}
        self.end
            .take()
            .expect("a stream that gave its last chunk has its end")
    }

    /// Every chunk, in order, and the end.
    pub async fn collect(mut self) -> Result<(Vec<T>, V), Error<E>> {
        let mut chunks = Vec::new();
        while let Some(chunk) = self.next_chunk().await {
            chunks.push(chunk);
        }
        let end = self.finish().await?;
        Ok((chunks, end))
    }

    fn take_ready(&self) -> Option<T> {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(chunk) = self.take_ready() {
            return Poll::Ready(Some(chunk));
        }
        let Some(driver) = self.driver.as_mut() else {
            return Poll::Ready(None);
        };
        let done = driver.as_mut().poll(cx);
        // The driver makes chunks ready as it goes: those come before its end.
        if let Some(chunk) = self.take_ready() {
            if let Poll::Ready(end) = done {
                self.driver = None;
                self.end = Some(end);
            }
            return Poll::Ready(Some(chunk));
        }
        match done {
            Poll::Ready(end) => {
                self.driver = None;
                self.end = Some(end);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T, V, E> futures_core::Stream for Streamed<T, V, E> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.get_mut().poll_chunk(cx)
    }
}

impl<T, V, E> fmt::Debug for Streamed<T, V, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Streamed")
            .field("ended", &self.driver.is_none())
            .finish_non_exhaustive()
    }
}

// `Streamed` holds its driver boxed and pinned, and nothing it holds is pinned in place.
impl<T, V, E> Unpin for Streamed<T, V, E> {}

/// Gives way once: the reader takes the chunks made ready before the driver goes on, so a
/// driver whose store answers at once (memory) never runs ahead of its reader.
pub(crate) async fn give_way() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}
