//! Reading a stream another call records: its chunks from the first, page by page, waiting
//! while its record is in flight, until its end (see [`Follower`]).

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::Idem;
use idem_core::StoreError;
use idem_core::fingerprint::Fingerprint;
use idem_core::key::IdempotencyKey;
use idem_core::store::{ChunkRead, FencingToken, RecordStatus};

/// The most chunks one read returns.
pub const PAGE: usize = 128;

/// The first wait of a follower that found no new chunk.
const FIRST_POLL: Duration = Duration::from_millis(1);
/// The longest wait of a follower between two reads.
const LONGEST_POLL: Duration = Duration::from_millis(25);

/// What a [`Follower`] read next.
#[derive(Debug)]
pub enum Followed {
    /// The next chunks of the stream, in order, as the store holds them (at least one).
    Chunks(Vec<Vec<u8>>),
    /// The stream ended: every chunk was read, and the record completed with this result.
    Completed(Vec<u8>),
    /// The stream broke off after `received` chunks: the record changed hands, was deleted or
    /// released, ended `unknown`, or its holder's lease lapsed with nothing more written.
    Interrupted {
        /// How many chunks were read before.
        received: u64,
    },
}

/// Reads the chunks a call records under a key (another call's: a replay, or a follower
/// while the stream is produced), from the first, in pages of at most [`PAGE`], the bytes as
/// the store holds them. While the record is in flight and nothing new comes, it polls (from
/// 1 ms, doubling to 25 ms). It reads one holder's chunks only: a record that changes hands
/// is [`Followed::Interrupted`].
#[derive(Debug)]
pub struct Follower {
    idem: Idem,
    tenant: Arc<str>,
    key: IdempotencyKey,
    fingerprint: Fingerprint,
    next: u64,
    holder: Option<FencingToken>,
    idle: Duration,
    ended: bool,
    /// The end read with the last page, answered after it.
    end: Option<Vec<u8>>,
}

impl Follower {
    /// A follower of the stream of `key` under `tenant`, recorded by a call with
    /// `fingerprint` (a record with another fingerprint is an interruption).
    pub fn new(
        idem: Idem,
        tenant: Arc<str>,
        key: IdempotencyKey,
        fingerprint: Fingerprint,
    ) -> Self {
        Follower {
            idem,
            tenant,
            key,
            fingerprint,
            next: 0,
            holder: None,
            idle: FIRST_POLL,
            ended: false,
            end: None,
        }
    }

    /// The key whose stream this follower reads.
    pub(crate) fn key(&self) -> IdempotencyKey {
        self.key
    }

    /// How many chunks were read so far.
    pub fn received(&self) -> u64 {
        self.next
    }

    /// The next chunks, or the end of the stream (then nothing more: a follower that ended
    /// answers its end's kind again, as an interruption).
    pub async fn next(&mut self) -> Result<Followed, StoreError> {
        if self.ended {
            return Ok(Followed::Interrupted {
                received: self.next,
            });
        }
        let followed = self.read().await;
        if !matches!(followed, Ok(Followed::Chunks(_)) | Err(_)) {
            self.ended = true;
        }
        followed
    }

    async fn read(&mut self) -> Result<Followed, StoreError> {
        if let Some(result) = self.end.take() {
            return Ok(Followed::Completed(result));
        }
        let interrupted = Followed::Interrupted {
            received: self.next,
        };
        loop {
            let page = self
                .idem
                .store()
                .read_chunks(ChunkRead {
                    tenant: &self.tenant,
                    key: self.key,
                    from: self.next,
                    limit: PAGE,
                })
                .await?;
            let Some(page) = page else {
                return Ok(interrupted);
            };
            let record = page.record;
            if record.fingerprint != self.fingerprint
                || *self.holder.get_or_insert(record.token) != record.token
            {
                return Ok(interrupted);
            }
            let got = page.chunks.len();
            let last_page = got < PAGE;
            match record.status {
                _ if got > 0 => {
                    self.next += got as u64;
                    self.idle = FIRST_POLL;
                    if record.status == RecordStatus::Completed && last_page {
                        self.end = Some(record.result.unwrap_or_default());
                    }
                    return Ok(Followed::Chunks(page.chunks));
                }
                RecordStatus::Completed if last_page => {
                    return Ok(Followed::Completed(record.result.unwrap_or_default()));
                }
                RecordStatus::InFlight => {
                    // Nothing new: the holder is still at work, or died (its lease lapses, and
                    // then nothing more will come: a retry of the call takes the key over).
                    let now = self.idem.clock().now();
                    if record.lease_expires_at < now {
                        return Ok(interrupted);
                    }
                    crate::timer::sleep(self.idle).await;
                    self.idle = (self.idle * 2).min(LONGEST_POLL);
                }
                _ => return Ok(interrupted),
            }
        }
    }
}
