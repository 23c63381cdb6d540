//! [`Reopen`]: a request body opened again for each attempt, from a file,
//! bytes, or a factory of the caller's, so that no copy of it is held
//! between attempts.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::HeaderValue;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use tokio::io::{AsyncRead, ReadBuf};

use super::{BoxError, Lost, NotReplayed};

/// The bytes read from a file per frame.
const CHUNK: usize = 256 * 1024;

type Factory =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Opened, BoxError>> + Send>> + Send + Sync>;

/// A request extension: the request's body, opened again for each attempt,
/// so that a body of any size can be retried without a copy of it in
/// memory. Set it on the request (the tower layer: `extensions_mut()`;
/// reqwest-middleware: `with_extension`); the request's own body is then
/// dropped.
///
/// Three sources:
///
/// * [`file`](Self::file): the file is opened and read from its start for
///   each attempt, in chunks of 256 KiB, with an exact length (so the
///   request carries `Content-Length`). An attempt whose file is not the
///   first attempt's (its length, modification time or, on Unix, its device
///   and inode differ) is not sent: the call stops with
///   [`Lost::Changed`]. A file changed while it is sent is cut after its
///   last byte (the body fails instead of ending).
/// * [`bytes`](Self::bytes): the same bytes for each attempt, shared, never
///   copied.
/// * [`with`](Self::with): a factory called for each attempt, returning a
///   fresh body ([`Opened::body`], [`Opened::stream`]): a multipart form
///   rebuilt (see `retries_reqwest::multipart`), an object read again from
///   a store. It must return the same bytes each time: the door cannot
///   check a factory's body.
///
/// A source that cannot be opened (the factory's error, a file that is
/// gone) ends the call at once with [`NotReplayed`] ([`Lost::Unopened`]),
/// nothing sent: a factory is the caller's code, and its failures are not
/// the server's to retry.
#[derive(Clone)]
pub struct Reopen {
    source: Source,
}

#[derive(Clone)]
enum Source {
    File(Arc<Path>),
    Bytes(Bytes),
    Factory(Factory),
}

impl Reopen {
    /// The file at `path`, opened and read from its start for each attempt.
    #[must_use]
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            source: Source::File(Arc::from(path.into())),
        }
    }

    /// These bytes, for each attempt (a clone of `Bytes` shares them).
    #[must_use]
    pub fn bytes(bytes: impl Into<Bytes>) -> Self {
        Self {
            source: Source::Bytes(bytes.into()),
        }
    }

    /// A body made by `factory` for each attempt. It is called once per
    /// attempt (hedges included), when the attempt is about to be sent.
    #[must_use]
    pub fn with<F, Fut, E>(factory: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Opened, E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let factory: Factory = Arc::new(move || {
            let fut = factory();
            Box::pin(async move { fut.await.map_err(Into::into) })
        });
        Self {
            source: Source::Factory(factory),
        }
    }
}

impl std::fmt::Debug for Reopen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::File(path) => f.debug_tuple("Reopen::file").field(path).finish(),
            Source::Bytes(b) => f.debug_tuple("Reopen::bytes").field(&b.len()).finish(),
            Source::Factory(_) => f.write_str("Reopen::with(..)"),
        }
    }
}

/// One attempt's body, as a [`Reopen::with`] factory returns it.
pub struct Opened {
    body: BoxBody<Bytes, BoxError>,
    /// Bytes still to come, when the length is known.
    left: Option<u64>,
    pub(super) content_type: Option<HeaderValue>,
}

impl Opened {
    /// A body.
    #[must_use]
    pub fn body<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        Self {
            body: body.map_err(Into::into).boxed(),
            left: None,
            content_type: None,
        }
    }

    /// A stream of chunks.
    #[must_use]
    pub fn stream<S, E>(stream: S) -> Self
    where
        S: futures_core::Stream<Item = Result<Bytes, E>> + Send + Sync + 'static,
        E: Into<BoxError>,
    {
        Self::body(http_body_util::StreamBody::new(Frames(Box::pin(stream))))
    }

    /// The body's length in bytes: sent as its exact size (the request then
    /// carries `Content-Length`; a body that yields another length fails
    /// the attempt).
    #[must_use]
    pub fn length(mut self, bytes: u64) -> Self {
        self.left = Some(bytes);
        self
    }

    /// The `Content-Type` this body is sent with (a multipart form's, with
    /// its boundary): the door sets it on the attempt's request.
    #[must_use]
    pub fn content_type(mut self, value: HeaderValue) -> Self {
        self.content_type = Some(value);
        self
    }

    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = ready!(Pin::new(&mut self.body).poll_frame(cx));
        if let (Some(left), Some(Ok(frame))) = (self.left.as_mut(), frame.as_ref())
            && let Some(data) = frame.data_ref()
        {
            *left = left.saturating_sub(data.len() as u64);
        }
        Poll::Ready(frame)
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        self.left
            .map_or_else(|| self.body.size_hint(), SizeHint::with_exact)
    }
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("left", &self.left)
            .field("content_type", &self.content_type)
            .finish_non_exhaustive()
    }
}

/// A stream of chunks as a stream of data frames.
struct Frames<S>(Pin<Box<S>>);

impl<S, E> futures_core::Stream for Frames<S>
where
    S: futures_core::Stream<Item = Result<Bytes, E>>,
{
    type Item = Result<Frame<Bytes>, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0
            .as_mut()
            .poll_next(cx)
            .map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// What makes a file the same file between two attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    len: u64,
    modified: Option<SystemTime>,
    /// Device and inode: a file replaced by another under the same name.
    #[cfg(unix)]
    node: (u64, u64),
}

impl FileId {
    /// What differs in `now`, in words.
    fn change(&self, now: &Self) -> String {
        #[cfg(unix)]
        if self.node != now.node {
            return "another file under the same name since the first attempt".to_owned();
        }
        if self.len != now.len {
            return format!(
                "{} bytes at the first attempt, {} bytes now",
                self.len, now.len
            );
        }
        "modified since the first attempt".to_owned()
    }

    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        use std::os::unix::fs::MetadataExt;
        Self {
            len: meta.len(),
            modified: meta.modified().ok(),
            #[cfg(unix)]
            node: (meta.dev(), meta.ino()),
        }
    }
}

/// A [`Reopen`] in one call: a file's identity is the one its first
/// attempt opened.
pub(super) struct Reopening {
    reopen: Reopen,
    first: OnceLock<FileId>,
}

impl std::fmt::Debug for Reopening {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reopen.fmt(f)
    }
}

impl Reopening {
    pub(super) fn new(reopen: Reopen) -> Self {
        Self {
            reopen,
            first: OnceLock::new(),
        }
    }

    /// The body of the next attempt.
    pub(super) async fn open(&self) -> Result<Opened, NotReplayed> {
        match &self.reopen.source {
            Source::Bytes(b) => {
                let len = b.len() as u64;
                Ok(Opened::body(http_body_util::Full::new(b.clone())).length(len))
            }
            Source::Factory(factory) => factory()
                .await
                .map_err(|e| NotReplayed::new(Lost::Unopened, e)),
            Source::File(path) => self.open_file(path).await,
        }
    }

    async fn open_file(&self, path: &Arc<Path>) -> Result<Opened, NotReplayed> {
        let owned = Arc::clone(path);
        let opened = tokio::task::spawn_blocking(move || {
            let file = std::fs::File::open(&owned)?;
            let meta = file.metadata()?;
            let check = file.try_clone()?;
            Ok::<_, std::io::Error>((file, check, meta))
        })
        .await;
        let unopened = |e: std::io::Error| {
            NotReplayed::new(
                Lost::Unopened,
                format!("the file {}: {e}", path.display()).into(),
            )
        };
        let (file, check, meta) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => return Err(unopened(e)),
            Err(join) => return Err(unopened(std::io::Error::other(join))),
        };
        let id = FileId::of(&meta);
        let first = *self.first.get_or_init(|| id);
        if first != id {
            return Err(NotReplayed::new(
                Lost::Changed,
                format!("the file {}: {}", path.display(), first.change(&id)).into(),
            ));
        }
        let body = FileBody {
            file: tokio::fs::File::from_std(file),
            check,
            id,
            left: id.len,
            buf: BytesMut::new(),
            done: false,
        };
        Ok(Opened::body(body).length(id.len))
    }
}

/// A file's bytes, `id.len` of them, then a check that the file is still
/// the one opened.
struct FileBody {
    file: tokio::fs::File,
    /// The same open file, for the check at the end (a `stat` of an open
    /// file: no path lookup, no blocking worth a thread).
    check: std::fs::File,
    id: FileId,
    left: u64,
    buf: BytesMut,
    done: bool,
}

impl Body for FileBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.left == 0 {
            this.done = true;
            return Poll::Ready(match this.check.metadata() {
                Ok(meta) if FileId::of(&meta) == this.id => None,
                Ok(_) => Some(Err(
                    "the file changed while it was sent: the body is cut".into()
                )),
                Err(e) => Some(Err(e.into())),
            });
        }
        let want = usize::try_from(this.left).map_or(CHUNK, |left| left.min(CHUNK));
        if this.buf.len() != want {
            this.buf = BytesMut::zeroed(want);
        }
        let mut read = ReadBuf::new(&mut this.buf[..]);
        if let Err(e) = ready!(Pin::new(&mut this.file).poll_read(cx, &mut read)) {
            this.done = true;
            return Poll::Ready(Some(Err(e.into())));
        }
        let n = read.filled().len();
        if n == 0 {
            this.done = true;
            return Poll::Ready(Some(Err(
                "the file ended before its length: it changed while it was sent".into(),
            )));
        }
        let mut chunk = std::mem::take(&mut this.buf);
        chunk.truncate(n);
        this.left -= n as u64;
        Poll::Ready(Some(Ok(Frame::data(chunk.freeze()))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Replay;

    async fn read_all(
        body: crate::ReplayBody<http_body_util::Empty<Bytes>>,
    ) -> Result<Vec<u8>, BoxError> {
        let collected = body.collect().await?;
        Ok(collected.to_bytes().to_vec())
    }

    fn temp(name: &str, bytes: &[u8]) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("retries-reopen-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        path
    }

    #[tokio::test]
    async fn a_file_is_read_from_its_start_for_each_attempt() {
        let data: Vec<u8> = (0..CHUNK * 2 + 17).map(|i| (i % 251) as u8).collect();
        let path = temp("each", &data);
        let replay = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::file(&path));
        for _ in 0..3 {
            let body = replay.next().await.unwrap();
            assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
            assert_eq!(read_all(body).await.unwrap(), data);
        }
        assert_eq!(replay.lost(), None);
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test]
    async fn a_file_changed_between_attempts_is_not_sent() {
        let path = temp("changed", b"first body");
        let replay = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::file(&path));
        assert_eq!(
            read_all(replay.next().await.unwrap()).await.unwrap(),
            b"first body"
        );
        std::fs::write(&path, b"second body!").unwrap();
        let err = replay.next().await.unwrap_err();
        assert_eq!(err.lost(), Lost::Changed);
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test]
    async fn a_file_replaced_under_its_name_is_not_sent_again() {
        let path = temp("while", b"0123456789");
        let replay = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::file(&path));
        let body = replay.next().await.unwrap();
        // Same length, another inode: written under the same name.
        let other = temp("while-new", b"abcdefghij");
        std::fs::rename(&other, &path).unwrap();
        // The attempt in flight reads the file it opened, unchanged.
        assert_eq!(read_all(body).await.unwrap(), b"0123456789");
        let body = replay.next().await.unwrap_err();
        assert_eq!(
            body.lost(),
            Lost::Changed,
            "the name now points at another file"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test]
    async fn a_file_grown_while_sent_fails_its_body() {
        use std::io::Write;
        let path = temp("grown", b"0123456789");
        let replay = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::file(&path));
        let body = replay.next().await.unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"more").unwrap();
        drop(f);
        assert!(
            read_all(body).await.is_err(),
            "a body whose file changed must not end"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test]
    async fn a_missing_file_or_a_failing_factory_is_unopened() {
        let replay =
            Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::file("/nonexistent/retries"));
        assert_eq!(replay.next().await.unwrap_err().lost(), Lost::Unopened);
        let replay = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::with(|| async {
            Err::<Opened, _>("the store is down")
        }));
        let err = replay.next().await.unwrap_err();
        assert_eq!(err.lost(), Lost::Unopened);
        assert_eq!(
            std::error::Error::source(&err).unwrap().to_string(),
            "the store is down"
        );
    }

    #[tokio::test]
    async fn a_factory_is_called_for_each_attempt_with_its_content_type() {
        let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = Arc::clone(&calls);
        let replay = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::with(move || {
            let n = counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                let chunks = vec![Ok::<_, BoxError>(Bytes::from(format!("part {n}")))];
                Ok::<_, BoxError>(
                    Opened::stream(Iter(chunks.into_iter()))
                        .content_type(HeaderValue::from_static("text/plain")),
                )
            }
        }));
        for n in 0..2 {
            let body = replay.next().await.unwrap();
            assert_eq!(body.content_type().unwrap(), "text/plain");
            assert_eq!(
                read_all(body).await.unwrap(),
                format!("part {n}").as_bytes()
            );
        }
        let bytes = Replay::<http_body_util::Empty<Bytes>>::reopen(Reopen::bytes("same"));
        let body = bytes.next().await.unwrap();
        assert_eq!(body.size_hint().exact(), Some(4));
        assert_eq!(read_all(body).await.unwrap(), b"same");
    }

    /// A stream over an iterator.
    struct Iter<I>(I);
    impl<I: Iterator + Unpin> futures_core::Stream for Iter<I> {
        type Item = I::Item;
        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<I::Item>> {
            Poll::Ready(self.0.next())
        }
    }
}
