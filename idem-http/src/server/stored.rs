//! Stored responses: what a completed key keeps (status, selected headers, body) and replays
//! byte for byte. A streamed response is kept as the key's stream: its head (the status and
//! headers, encoded as a response with no body) as chunk 0, then its frames, one chunk each;
//! the key's result is then [`STREAMED`].

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Response, StatusCode};

use super::body::AnswerBody;
use crate::IDEMPOTENT_REPLAYED;
use idem_core::store::RecordStatus;
use idem_runtime::protocol::Claimed;

const STORED_MAGIC: &[u8; 4] = b"IDR1";

/// The result of a key whose response was streamed: the response is its stream's chunks.
pub(super) const STREAMED: &[u8] = b"IDS1";

/// A stored response: magic, status, the selected headers (name and value, length-prefixed),
/// then the body.
pub(super) fn encode_response(
    status: StatusCode,
    headers: &http::HeaderMap,
    selected: &[HeaderName],
    body: &[u8],
) -> Vec<u8> {
    let kept: Vec<(&HeaderName, &HeaderValue)> = headers
        .iter()
        .filter(|(name, _)| selected.contains(name))
        .collect();
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(STORED_MAGIC);
    out.extend_from_slice(&status.as_u16().to_be_bytes());
    out.extend_from_slice(&(kept.len() as u16).to_be_bytes());
    for (name, value) in kept {
        out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// The response `stored` holds; its body is a slice of `stored`, not a copy.
pub(super) fn decode_response(stored: Vec<u8>) -> Option<Response<Bytes>> {
    let stored = Bytes::from(stored);
    let mut rest = stored.strip_prefix(STORED_MAGIC)?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(head)
    };
    let status = StatusCode::from_u16(u16::from_be_bytes(take(2)?.try_into().ok()?)).ok()?;
    let count = u16::from_be_bytes(take(2)?.try_into().ok()?);
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = status;
    for _ in 0..count {
        let len = u16::from_be_bytes(take(2)?.try_into().ok()?) as usize;
        let name = HeaderName::from_bytes(take(len)?).ok()?;
        let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let value = HeaderValue::from_bytes(take(len)?).ok()?;
        response.headers_mut().append(name, value);
    }
    let body = stored.slice(stored.len() - rest.len()..);
    *response.body_mut() = body;
    Some(response)
}

/// A replayed response, marked so.
pub(super) fn replayed(mut response: Response<AnswerBody>) -> Response<AnswerBody> {
    response
        .headers_mut()
        .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Records `claimed`'s key as `unknown`: its handler ran, and its response did not finish.
pub(super) async fn unknown(claimed: &Claimed) {
    // Tried again through store errors while the lease lasts; if it fails for good, the key
    // stays in flight, and is blocked as unknown once its lease lapses (the orphan policy).
    let _ = claimed.complete_retrying(RecordStatus::Unknown, &[]).await;
}

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use http::header::{self, HeaderValue};

    use super::{decode_response, encode_response};

    #[test]
    fn stored_responses_round_trip_byte_for_byte() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::SET_COOKIE, HeaderValue::from_static("secret=1"));
        headers.append(header::LOCATION, HeaderValue::from_static("/v1/x/1"));
        let body = b"{\"id\": \"pi_1\",\n \"amount\": 500}\xff";
        let selected = [header::CONTENT_TYPE, header::LOCATION];
        let stored = encode_response(StatusCode::CREATED, &headers, &selected, body);
        let replay = decode_response(stored).expect("decodes");
        assert_eq!(replay.status(), StatusCode::CREATED);
        assert_eq!(replay.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(replay.headers()[header::LOCATION], "/v1/x/1");
        assert!(
            replay.headers().get(header::SET_COOKIE).is_none(),
            "not selected"
        );
        assert_eq!(&replay.body()[..], &body[..]);
        assert!(decode_response(b"IDR1\x00".to_vec()).is_none());
        assert!(decode_response(b"nope".to_vec()).is_none());
    }
}
