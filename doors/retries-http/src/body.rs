//! A request body that can be sent again: [`ReplayBody`] copies what it
//! sends, up to a cap, so a retry sends the same bytes; the tower layer and
//! the reqwest middleware use it.
//!
//! The body is read once, from the caller's body, *as it is sent*: nothing is
//! read ahead, so a streaming body starts flowing at once. Every attempt gets
//! a reader over one shared buffer: it first replays what earlier attempts
//! read, then goes on reading the caller's body where they stopped. So a
//! retry after a failure that came before the body was fully sent (a refused
//! connection) still sends all of it, byte for byte.
//!
//! When more than the cap has been read, the buffer is dropped and the call
//! is *committed*: the attempt in flight may finish, but no other attempt can
//! be made, since its bytes are gone. A body whose own stream fails is not
//! replayable either.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use std::time::Instant;

/// The error type of a [`ReplayBody`]: the caller's body's error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default cap on the bytes kept for replay: 64 KiB.
pub const DEFAULT_CAP: usize = 64 * 1024;

/// A request extension that declares whether this request is safe to repeat,
/// overriding every other rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency(pub bool);

/// A request extension carrying a deadline for the whole call (the earlier of
/// it and the layer's policy applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline(pub Instant);

/// A request extension naming the request's route template (`/users/{id}`):
/// the call then reports (in its events and metrics) as `GET /users/{id}`
/// instead of under the door's name. Give a template, never the raw path:
/// a path with ids in it would make a label per request. (A gRPC call
/// through the tower layer is named by its method path without it.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route(pub &'static str);

/// An error that would have been retried, returned as it is because the
/// request's body could not be sent again.
#[derive(Debug, thiserror::Error)]
#[error("not retried: {lost}")]
pub struct NotReplayed {
    lost: Lost,
    #[source]
    source: BoxError,
}

impl NotReplayed {
    /// The error of a door that could not send `lost`'s body again;
    /// `source` is the error that would have been retried.
    #[must_use]
    pub fn new(lost: Lost, source: BoxError) -> Self {
        Self { lost, source }
    }

    /// Why the body could not be sent again.
    #[must_use]
    pub fn lost(&self) -> Lost {
        self.lost
    }
}

/// What a door's `on_retry` hook (the tower layer's, the reqwest
/// middleware's) is told of the attempt that failed, as the error of its
/// [`RetryEvent`](retries_core::RetryEvent).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum FailedAttempt<'a> {
    /// A response that counts as a failed attempt (by the status table, a
    /// service config's codes, or `retry_if`).
    Response {
        /// Its status.
        status: http::StatusCode,
        /// Its headers (`Retry-After`, `grpc-status`, …).
        headers: &'a HeaderMap,
    },
    /// An error: the connection, a timeout, the inner service, `reconcile`.
    Error(&'a (dyn std::error::Error + Send + Sync + 'static)),
    /// Nothing was sent: the request's body could no longer be replayed.
    NotSent(Lost),
}

/// What the readers of one request body share.
struct Shared<B> {
    /// The caller's body, until it has ended or failed.
    source: Option<B>,
    /// The data read so far, while it fits in the cap.
    chunks: Vec<Bytes>,
    /// Chunks read from the source so far (kept or not).
    read: usize,
    /// Bytes in `chunks`.
    kept: usize,
    cap: usize,
    trailers: Option<HeaderMap>,
    /// The source has ended.
    ended: bool,
    /// What stops a replay, if anything.
    lost: Option<Lost>,
}

/// Why a body cannot be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// More than the cap was read: the bytes sent are no longer held.
    OverCap(usize),
    /// The caller's body failed while it was read.
    Failed,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OverCap(cap) => write!(
                f,
                "the request body is larger than the replay cap ({cap} bytes), so it cannot be sent again"
            ),
            Self::Failed => {
                f.write_str("the request body failed while it was sent, so it cannot be sent again")
            }
        }
    }
}

/// The body of one attempt: replays what was read before, then reads on.
/// Made by [`Replay::body`].
pub struct ReplayBody<B> {
    /// `None` for a body that had ended before the first attempt: nothing
    /// to share.
    shared: Option<Arc<Mutex<Shared<B>>>>,
    /// The index of the next chunk this reader yields.
    next: usize,
    trailers_sent: bool,
}

/// The shared buffer of one request's body; hands out one [`ReplayBody`] per
/// attempt.
pub struct Replay<B> {
    /// `None` for a body that has ended before it was read (a GET's, most
    /// often): no buffer, no lock, no allocation.
    shared: Option<Arc<Mutex<Shared<B>>>>,
}

fn lock<B>(m: &Mutex<Shared<B>>) -> MutexGuard<'_, Shared<B>> {
    // A reader panicking while it held the lock leaves the state as it was
    // between two frames; keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<B: Body> Replay<B> {
    /// Buffer `body` as it is sent, keeping at most `cap` bytes. A body that
    /// has already ended ([`Body::is_end_stream`]) is dropped here: every
    /// attempt sends an empty body, and nothing is allocated.
    #[must_use]
    pub fn new(body: B, cap: usize) -> Self {
        if body.is_end_stream() {
            return Self { shared: None };
        }
        Self {
            shared: Some(Arc::new(Mutex::new(Shared {
                source: Some(body),
                chunks: Vec::new(),
                read: 0,
                kept: 0,
                cap,
                trailers: None,
                ended: false,
                lost: None,
            }))),
        }
    }
}

impl<B> Replay<B> {
    /// The body of the next attempt: everything from the first byte.
    #[must_use]
    pub fn body(&self) -> ReplayBody<B> {
        ReplayBody {
            shared: self.shared.clone(),
            next: 0,
            trailers_sent: false,
        }
    }

    /// `None` while another attempt can send the whole body again; else why not.
    #[must_use]
    pub fn lost(&self) -> Option<Lost> {
        self.shared.as_deref().and_then(|s| lock(s).lost)
    }
}

impl<B> std::fmt::Debug for Replay<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(shared) = self.shared.as_deref() else {
            return f.debug_struct("Replay").field("empty", &true).finish();
        };
        let s = lock(shared);
        f.debug_struct("Replay")
            .field("kept", &s.kept)
            .field("cap", &s.cap)
            .field("ended", &s.ended)
            .field("lost", &s.lost)
            .finish_non_exhaustive()
    }
}

impl<B> std::fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayBody")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(shared) = this.shared.as_deref() else {
            return Poll::Ready(None);
        };
        let mut s = lock(shared);
        // Replay what an earlier attempt read.
        if this.next < s.read {
            if let Some(lost) = s.lost {
                // Only a reader started after the loss gets here, and the
                // doors never start one; fail rather than send a torn body.
                return Poll::Ready(Some(Err(lost.to_string().into())));
            }
            let chunk = s.chunks[this.next].clone();
            this.next += 1;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if s.ended {
            if !this.trailers_sent
                && let Some(t) = s.trailers.clone()
            {
                this.trailers_sent = true;
                return Poll::Ready(Some(Ok(Frame::trailers(t))));
            }
            return Poll::Ready(None);
        }
        let Some(source) = s.source.as_mut() else {
            return Poll::Ready(Some(Err(
                "the request body failed in an earlier attempt".into()
            )));
        };
        match Pin::new(source).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                s.ended = true;
                s.source = None;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(e))) => {
                s.source = None;
                s.lost = Some(Lost::Failed);
                s.chunks = Vec::new();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(mut data) => {
                        let bytes = data.copy_to_bytes(data.remaining());
                        s.read += 1;
                        this.next = s.read;
                        if s.lost.is_none() {
                            if s.kept.saturating_add(bytes.len()) > s.cap {
                                s.lost = Some(Lost::OverCap(s.cap));
                                s.chunks = Vec::new();
                            } else {
                                s.kept += bytes.len();
                                s.chunks.push(bytes.clone());
                            }
                        }
                        Frame::data(bytes)
                    }
                    Err(frame) => match frame.into_trailers() {
                        Ok(trailers) => {
                            s.trailers = Some(trailers.clone());
                            this.trailers_sent = true;
                            Frame::trailers(trailers)
                        }
                        // A frame of a kind http-body may add later: passed on
                        // once, not replayed.
                        Err(other) => other.map_data(|mut d| d.copy_to_bytes(d.remaining())),
                    },
                };
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let Some(shared) = self.shared.as_deref() else {
            return true;
        };
        let s = lock(shared);
        s.ended && self.next >= s.read && (self.trailers_sent || s.trailers.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        let Some(shared) = self.shared.as_deref() else {
            return SizeHint::with_exact(0);
        };
        let s = lock(shared);
        let replayed: u64 = s
            .chunks
            .get(self.next..)
            .map_or(0, |c| c.iter().map(|b| b.len() as u64).sum());
        let rest = match &s.source {
            Some(source) => source.size_hint(),
            None => SizeHint::with_exact(0),
        };
        let mut hint = SizeHint::new();
        hint.set_lower(replayed.saturating_add(rest.lower()));
        if let Some(upper) = rest.upper() {
            hint.set_upper(replayed.saturating_add(upper));
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A body yielding the given chunks, one per poll, then the trailers.
    struct Chunks(VecDeque<Result<Frame<Bytes>, &'static str>>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|r| r.map_err(BoxError::from)))
        }
    }

    fn chunks(parts: &[&'static str]) -> Chunks {
        Chunks(
            parts
                .iter()
                .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
                .collect(),
        )
    }

    /// Read at most `frames` frames of `body`: (data, trailers seen, ended).
    fn read(body: &mut ReplayBody<Chunks>, frames: usize) -> (Vec<u8>, bool, bool) {
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let (mut data, mut trailers) = (Vec::new(), false);
        for _ in 0..frames {
            match Pin::new(&mut *body).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(f) => trailers |= f.is_trailers(),
                },
                Poll::Ready(Some(Err(_))) | Poll::Pending => return (data, trailers, false),
                Poll::Ready(None) => return (data, trailers, true),
            }
        }
        (data, trailers, false)
    }

    #[test]
    fn a_retry_sends_the_same_bytes_even_after_a_partial_send() {
        let replay = Replay::new(chunks(&["ab", "cd", "ef"]), DEFAULT_CAP);
        let mut first = replay.body();
        assert_eq!(first.size_hint().lower(), 0);
        assert_eq!(read(&mut first, 2).0, b"abcd"); // the attempt failed midway
        drop(first);
        let mut second = replay.body();
        assert_eq!(read(&mut second, 10), (b"abcdef".to_vec(), false, true));
        let mut third = replay.body();
        assert_eq!(third.size_hint().exact(), Some(6));
        assert_eq!(read(&mut third, 10), (b"abcdef".to_vec(), false, true));
        assert!(third.is_end_stream());
        assert_eq!(replay.lost(), None);
    }

    #[test]
    fn trailers_are_replayed() {
        let mut source = chunks(&["x"]);
        let mut t = HeaderMap::new();
        t.insert("checksum", "1".parse().unwrap());
        source.0.push_back(Ok(Frame::trailers(t)));
        let replay = Replay::new(source, DEFAULT_CAP);
        assert_eq!(read(&mut replay.body(), 10), (b"x".to_vec(), true, true));
        assert_eq!(read(&mut replay.body(), 10), (b"x".to_vec(), true, true));
    }

    #[test]
    fn more_than_the_cap_is_not_kept_and_the_body_is_lost() {
        let replay = Replay::new(chunks(&["1234", "5678", "9"]), 8);
        let mut first = replay.body();
        assert_eq!(read(&mut first, 2).0, b"12345678");
        assert_eq!(replay.lost(), None, "exactly the cap still fits");
        assert_eq!(read(&mut first, 10), (b"9".to_vec(), false, true));
        assert_eq!(replay.lost(), Some(Lost::OverCap(8)));
        // The attempt in flight got every byte; a new reader fails cleanly.
        let mut late = replay.body();
        assert_eq!(read(&mut late, 10), (Vec::new(), false, false));
    }

    #[test]
    fn a_failing_source_is_lost() {
        let mut source = chunks(&["a"]);
        source.0.push_back(Err("disk"));
        let replay = Replay::new(source, DEFAULT_CAP);
        assert_eq!(read(&mut replay.body(), 10), (b"a".to_vec(), false, false));
        assert_eq!(replay.lost(), Some(Lost::Failed));
    }
}
