//! Streams: the chunks a claimed call produces, recorded under its key as they come, so that a
//! retry replays them and a retry during the stream attaches to it.
//!
//! | operation | does | answers |
//! |---|---|---|
//! | [`Store::append_chunks`] | appends chunks `first, first + 1, …` to the stream of a key, if the token still owns its `in_flight` record | [`Fenced::Applied`](super::Fenced::Applied) when the chunks are there (written now, or by an earlier delivery of this very append), [`Fenced::Lost`](super::Fenced::Lost) when the token lost the key |
//! | [`Store::read_chunks`] | reads the record of a key and at most `limit` chunks of its stream from `from`, in one atomic read | `None` without a record; else the [`StreamPage`] |
//!
//! Chunks belong to the claim that wrote them: a stream is the chunks of the record's current
//! token only, so a holder that lost its lease can append nothing, and a reader never sees the
//! chunks of two holders interleaved. The first append of a new holder (`first == 0`) drops
//! whatever an earlier holder of the key left; deleting a record (release, purge, an operator)
//! drops its chunks. Once a record is `completed`, the page read with it holds every chunk of
//! its stream from `from` (a completion comes after the holder's last append), so a reader knows
//! the stream ended.
//!
//! The defaults answer [`StoreErrorKind::Unsupported`]: a store written before streams keeps
//! working for every other tool. The backends of this workspace implement both.

use super::{FencingToken, Record, Store};
use crate::error::{StoreError, StoreErrorKind};
use crate::key::IdempotencyKey;

/// Chunks appended to a claimed key's stream, fenced by the claim's token.
#[derive(Debug, Clone, Copy)]
pub struct ChunkAppend<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The key.
    pub key: IdempotencyKey,
    /// The token the claim returned.
    pub token: FencingToken,
    /// The position of the first chunk in the stream: how many chunks this token appended
    /// before. An append sent again after its answer was lost carries the same `first` and is
    /// applied once; a `first` past the end of the stream is an error (a chunk would be
    /// missing).
    pub first: u64,
    /// The encoded chunks, in order.
    pub chunks: &'a [Vec<u8>],
}

/// A read of a key's stream from chunk `from`.
#[derive(Debug, Clone, Copy)]
pub struct ChunkRead<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The key.
    pub key: IdempotencyKey,
    /// The position of the first chunk to read.
    pub from: u64,
    /// At most this many chunks (at least one is asked for).
    pub limit: usize,
}

/// What [`Store::read_chunks`] found: the record, and chunks of its current token's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPage {
    /// The record as it was when the chunks were read.
    pub record: Record,
    /// The chunks `from, from + 1, …` of the stream of `record.token`, at most `limit`.
    pub chunks: Vec<Vec<u8>>,
}

/// The error of a store that does not record streams.
pub(super) fn unsupported(store: &(impl Store + ?Sized), op: &str) -> StoreError {
    StoreError::new(
        store.backend(),
        StoreErrorKind::Unsupported,
        format!("{op}: this store does not record streams"),
    )
}

/// The error of an append whose `first` is past the end of the stream.
pub fn out_of_order(backend: &'static str, first: u64, have: u64) -> StoreError {
    StoreError::new(
        backend,
        StoreErrorKind::Other,
        format!(
            "append_chunks: the stream holds {have} chunks, and the append starts at {first}: \
             a chunk would be missing"
        ),
    )
}

/// What an append does to a stream that holds `have` chunks of the same token: nothing (this
/// append was applied before), append them, or refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendAt {
    /// The chunks are there already: an earlier delivery of this append was applied.
    Done,
    /// Append the chunks from position `skip` of the append (chunks before it are there).
    From(usize),
    /// The append starts past the end: refuse.
    Gap,
}

impl AppendAt {
    /// Where an append of `count` chunks at `first` goes in a stream of `have` chunks.
    pub fn decide(have: u64, first: u64, count: usize) -> AppendAt {
        if first > have {
            AppendAt::Gap
        } else if have >= first + count as u64 {
            AppendAt::Done
        } else {
            AppendAt::From((have - first) as usize)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AppendAt;

    #[test]
    fn an_append_goes_where_the_stream_ends() {
        assert_eq!(AppendAt::decide(0, 0, 3), AppendAt::From(0));
        assert_eq!(AppendAt::decide(3, 3, 2), AppendAt::From(0));
        assert_eq!(AppendAt::decide(5, 3, 2), AppendAt::Done);
        assert_eq!(AppendAt::decide(4, 3, 2), AppendAt::From(1));
        assert_eq!(AppendAt::decide(2, 3, 2), AppendAt::Gap);
        assert_eq!(AppendAt::decide(0, 0, 0), AppendAt::Done);
    }
}
