//! [`Replay`]: the body of each attempt of one call, copied as it is sent
//! or opened again ([`Reopen`]).
//!
//! A body copied as it is sent is read once, from the caller's body, *as it
//! is sent*: nothing is read ahead, so a streaming body starts flowing at
//! once. Every attempt gets a reader over one shared buffer: it first
//! replays what earlier attempts read, then goes on reading the caller's
//! body where they stopped. So a retry after a failure that came before the
//! body was fully sent (a refused connection) still sends all of it, byte
//! for byte.
//!
//! When more than the cap has been read, the buffer is dropped and the call
//! is *committed*: the attempt in flight may finish, but no other attempt can
//! be made, since its bytes are gone (a DEBUG event says so when it
//! happens). A body whose own stream fails is not replayable either.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};

use super::reopen::{Opened, Reopening};
use super::{BodyCap, BoxError, Lost, NotReplayed, Reopen};

/// What the readers of one request body share.
struct Shared<B> {
    /// The caller's body, until it has ended or failed.
    source: Option<B>,
    /// The data read so far, while it fits in the cap.
    chunks: Vec<Bytes>,
    /// Chunks read from the source so far (kept or not).
    read: usize,
    /// Bytes read from the source so far (kept or not).
    sent: u64,
    /// Bytes in `chunks`.
    kept: usize,
    cap: usize,
    trailers: Option<HeaderMap>,
    /// The source has ended.
    ended: bool,
    /// What stops a replay, if anything (`OverCap`'s `sent` is filled in
    /// when told).
    lost: Option<Lost>,
}

impl<B> Shared<B> {
    /// What stops a replay, with the bytes sent so far.
    fn lost(&self) -> Option<Lost> {
        self.lost.map(|lost| match lost {
            Lost::OverCap { cap, .. } => Lost::OverCap {
                cap,
                sent: self.sent,
            },
            other => other,
        })
    }
}

/// The body of one attempt: replays what was read before, then reads on;
/// or a body opened for this attempt ([`Reopen`]). Made by [`Replay::next`]
/// (or [`Replay::body`]).
pub struct ReplayBody<B> {
    inner: Inner<B>,
}

enum Inner<B> {
    /// A body that had ended before the first attempt: nothing to share.
    Empty,
    /// A reader over the shared copy.
    Copy {
        shared: Arc<Mutex<Shared<B>>>,
        /// The index of the next chunk this reader yields.
        next: usize,
        trailers_sent: bool,
    },
    /// A body opened for this attempt. Boxed: every attempt's request is
    /// moved several times on its way to the socket (a hyper client moves
    /// it through its dispatch channel and back), and the common bodies
    /// (none, or a replayed copy) are 24 bytes where this one is 72.
    Opened(Box<Opened>),
    /// `body` was asked of a body that is opened again for each attempt.
    NotOpened,
}

/// The bodies of one request's attempts: hands out one [`ReplayBody`] per
/// attempt ([`next`](Self::next)).
pub struct Replay<B> {
    mode: Mode<B>,
}

enum Mode<B> {
    /// A body that has ended before it was read (a GET's, most often): no
    /// buffer, no lock, no allocation.
    Empty,
    Copy(Arc<Mutex<Shared<B>>>),
    Reopen(Box<Reopening>),
}

fn lock<B>(m: &Mutex<Shared<B>>) -> MutexGuard<'_, Shared<B>> {
    // A reader panicking while it held the lock leaves the state as it was
    // between two frames; keep going.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<B: Body> Replay<B> {
    /// Copy `body` as it is sent, keeping at most `cap` bytes. A body that
    /// has already ended ([`Body::is_end_stream`]) is dropped here: every
    /// attempt sends an empty body, and nothing is allocated.
    #[must_use]
    pub fn new(body: B, cap: usize) -> Self {
        if body.is_end_stream() {
            return Self { mode: Mode::Empty };
        }
        Self {
            mode: Mode::Copy(Arc::new(Mutex::new(Shared {
                source: Some(body),
                chunks: Vec::new(),
                read: 0,
                sent: 0,
                kept: 0,
                cap,
                trailers: None,
                ended: false,
                lost: None,
            }))),
        }
    }

    /// The bodies of a request with these `extensions`: its [`Reopen`] if it
    /// carries one (`body` is then dropped), else `body` copied as it is
    /// sent, up to its [`BodyCap`] or else `cap`. What both HTTP doors do.
    #[must_use]
    pub fn for_request(body: B, extensions: &http::Extensions, cap: usize) -> Self {
        if let Some(reopen) = extensions.get::<Reopen>() {
            return Self::reopen(reopen.clone());
        }
        let cap = extensions.get::<BodyCap>().map_or(cap, |c| c.0);
        Self::new(body, cap)
    }
}

impl<B> Replay<B> {
    /// A body opened again for each attempt, from `reopen`.
    #[must_use]
    pub fn reopen(reopen: Reopen) -> Self {
        Self {
            mode: Mode::Reopen(Box::new(Reopening::new(reopen))),
        }
    }

    /// The body of the next attempt, everything from the first byte: at
    /// once for a copied body, opened first for a [`Reopen`] one. Await it;
    /// an error means nothing can be sent, and says why
    /// ([`Lost::Unopened`], [`Lost::Changed`]).
    pub fn next(&self) -> Next<'_, B> {
        match &self.mode {
            Mode::Reopen(reopening) => Next {
                ready: None,
                opening: Some(Box::pin(reopening.open())),
            },
            _ => Next {
                ready: Some(self.body()),
                opening: None,
            },
        }
    }

    /// The body of the next attempt, for a body copied as it is sent. A
    /// [`Reopen`] body is opened by [`next`](Self::next): here its body
    /// fails at once.
    #[must_use]
    pub fn body(&self) -> ReplayBody<B> {
        let inner = match &self.mode {
            Mode::Empty => Inner::Empty,
            Mode::Copy(shared) => Inner::Copy {
                shared: Arc::clone(shared),
                next: 0,
                trailers_sent: false,
            },
            Mode::Reopen(_) => Inner::NotOpened,
        };
        ReplayBody { inner }
    }

    /// `None` while another attempt can send the whole body again; else why
    /// not. A [`Reopen`] body is never lost here: it fails to open instead.
    #[must_use]
    pub fn lost(&self) -> Option<Lost> {
        match &self.mode {
            Mode::Copy(s) => lock(s).lost(),
            Mode::Empty | Mode::Reopen(_) => None,
        }
    }
}

/// A [`Reopen`] body being opened.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Opened, NotReplayed>> + Send + 'a>>;

/// The body of one attempt, made by [`Replay::next`]: ready at once for a
/// copied body, opened first for a [`Reopen`] one.
#[must_use = "a future does nothing unless awaited"]
pub struct Next<'a, B> {
    ready: Option<ReplayBody<B>>,
    opening: Option<Opening<'a>>,
}

impl<B> Future for Next<'_, B> {
    type Output = Result<ReplayBody<B>, NotReplayed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(opening) = this.opening.as_mut() {
            return opening.as_mut().poll(cx).map(|r| {
                r.map(|opened| ReplayBody {
                    inner: Inner::Opened(Box::new(opened)),
                })
            });
        }
        match this.ready.take() {
            Some(body) => Poll::Ready(Ok(body)),
            None => Poll::Ready(Err(NotReplayed::new(
                Lost::Unopened,
                "the body was taken already".into(),
            ))),
        }
    }
}

impl<B> std::fmt::Debug for Next<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Next")
            .field("opening", &self.opening.is_some())
            .finish_non_exhaustive()
    }
}

impl<B> std::fmt::Debug for Replay<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.mode {
            Mode::Empty => f.debug_struct("Replay").field("empty", &true).finish(),
            Mode::Reopen(r) => f.debug_struct("Replay").field("reopen", r).finish(),
            Mode::Copy(shared) => {
                let s = lock(shared);
                f.debug_struct("Replay")
                    .field("kept", &s.kept)
                    .field("cap", &s.cap)
                    .field("ended", &s.ended)
                    .field("lost", &s.lost())
                    .finish_non_exhaustive()
            }
        }
    }
}

impl<B> std::fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("ReplayBody");
        match &self.inner {
            Inner::Copy { next, .. } => d.field("next", next),
            Inner::Opened(_) => d.field("opened", &true),
            Inner::Empty | Inner::NotOpened => &mut d,
        }
        .finish_non_exhaustive()
    }
}

impl<B> ReplayBody<B> {
    /// The `Content-Type` this attempt's body must be sent with, if its
    /// [`Reopen`] source gave one ([`Opened::content_type`]: a multipart
    /// form's boundary is new with each form). The doors set it on the
    /// attempt's request.
    #[must_use]
    pub fn content_type(&self) -> Option<&HeaderValue> {
        match &self.inner {
            Inner::Opened(o) => o.content_type.as_ref(),
            _ => None,
        }
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
        match &mut self.get_mut().inner {
            Inner::Empty => Poll::Ready(None),
            Inner::Opened(opened) => opened.poll_frame(cx),
            Inner::NotOpened => Poll::Ready(Some(Err(
                "a `Reopen` body is opened by `Replay::next`".into(),
            ))),
            Inner::Copy {
                shared,
                next,
                trailers_sent,
            } => poll_copy(shared, next, trailers_sent, cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Empty => true,
            Inner::NotOpened => false,
            Inner::Opened(opened) => opened.is_end_stream(),
            Inner::Copy {
                shared,
                next,
                trailers_sent,
            } => {
                let s = lock(shared);
                s.ended && *next >= s.read && (*trailers_sent || s.trailers.is_none())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        let (shared, next) = match &self.inner {
            Inner::Empty => return SizeHint::with_exact(0),
            Inner::NotOpened => return SizeHint::new(),
            Inner::Opened(opened) => return opened.size_hint(),
            Inner::Copy { shared, next, .. } => (shared, *next),
        };
        let s = lock(shared);
        let replayed: u64 = s
            .chunks
            .get(next..)
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

/// One frame of a reader over the shared copy.
fn poll_copy<B>(
    shared: &Mutex<Shared<B>>,
    next: &mut usize,
    trailers_sent: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    let mut s = lock(shared);
    // Replay what an earlier attempt read.
    if *next < s.read {
        if let Some(lost) = s.lost() {
            // Only a reader started after the loss gets here, and the
            // doors never start one; fail rather than send a torn body.
            return Poll::Ready(Some(Err(lost.to_string().into())));
        }
        let chunk = s.chunks[*next].clone();
        *next += 1;
        return Poll::Ready(Some(Ok(Frame::data(chunk))));
    }
    if s.ended {
        if !*trailers_sent && let Some(t) = s.trailers.clone() {
            *trailers_sent = true;
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
                    s.sent += bytes.len() as u64;
                    *next = s.read;
                    if s.lost.is_none() {
                        if s.kept.saturating_add(bytes.len()) > s.cap {
                            s.lost = Some(Lost::OverCap {
                                cap: s.cap,
                                sent: 0,
                            });
                            s.chunks = Vec::new();
                            retries_core::door::observe::event(
                                retries_core::door::observe::Level::Debug,
                                "http",
                                "request body passed the replay cap: the call is committed to this attempt",
                                &format_args!("cap {} bytes", s.cap),
                            );
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
                        *trailers_sent = true;
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

#[cfg(test)]
mod tests {
    use super::super::DEFAULT_CAP;
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
        assert_eq!(replay.lost(), Some(Lost::OverCap { cap: 8, sent: 9 }));
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
