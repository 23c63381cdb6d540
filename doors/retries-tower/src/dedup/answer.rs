//! The bodies the layer passes on or holds whole ([`KeyedBody`]), a stored
//! answer sent again, and why the layer answers itself.

#[allow(clippy::wildcard_imports)]
use super::*;

pin_project_lite::pin_project! {
    /// A body the layer passes on or holds whole: the request body the
    /// inner service gets (the caller's, or, for a request with a key, the
    /// bytes read to fingerprint it), and the response body of
    /// [`IdempotencyService`] (the handler's, or the one the layer holds:
    /// the handler's answer read to be stored, a replay, its own refusal).
    pub struct KeyedBody<B> {
        #[pin]
        inner: Either<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = EitherProj]
    enum Either<B> {
        Passed { #[pin] body: B },
        Whole { data: Option<Bytes>, trailers: Option<HeaderMap> },
    }
}

impl<B> KeyedBody<B> {
    pub(crate) fn passed(body: B) -> Self {
        Self {
            inner: Either::Passed { body },
        }
    }

    pub(crate) fn whole(data: impl Into<Bytes>, trailers: Option<HeaderMap>) -> Self {
        let data: Bytes = data.into();
        Self {
            inner: Either::Whole {
                data: (!data.is_empty()).then_some(data),
                trailers,
            },
        }
    }
}

impl<B> Body for KeyedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().inner.project() {
            EitherProj::Passed { body } => body.poll_frame(cx).map_err(Into::into),
            EitherProj::Whole { data, trailers } => Poll::Ready(
                data.take()
                    .map(Frame::data)
                    .or_else(|| trailers.take().map(Frame::trailers))
                    .map(Ok),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Either::Passed { body } => body.is_end_stream(),
            Either::Whole { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Either::Passed { body } => body.size_hint(),
            Either::Whole { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A body read whole, or `None` past `cap`.
pub(crate) async fn read<B>(body: B, cap: usize) -> Result<Option<Bytes>, BoxError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        if let Ok(mut data) = frame.map_err(Into::into)?.into_data() {
            if out.len() + data.remaining() > cap {
                return Ok(None);
            }
            while data.has_remaining() {
                let chunk = data.chunk();
                out.extend_from_slice(chunk);
                let n = chunk.len();
                data.advance(n);
            }
        }
    }
    Ok(Some(out.freeze()))
}

/// Stored pairs as a header map (a pair that is not a valid header is
/// left out).
pub(crate) fn header_map(pairs: Vec<(String, Vec<u8>)>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) {
            map.append(n, v);
        }
    }
    map
}

/// A record as the answer to a later request.
pub(crate) fn replay<RB>(stored: Stored) -> Response<KeyedBody<RB>> {
    let trailers = (!stored.trailers.is_empty()).then(|| header_map(stored.trailers));
    let mut response = Response::new(KeyedBody::whole(stored.body, trailers));
    *response.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    headers.extend(header_map(stored.headers));
    headers.insert(
        retries_core::wire::REPLAYED_NAME,
        HeaderValue::from_static(if stored.body_dropped {
            "body-dropped"
        } else {
            "true"
        }),
    );
    response
}

/// Why the layer answers itself.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refusal {
    Missing,
    Malformed,
    TooLarge,
    Unreadable,
    StoreDown,
    InProgress(Duration),
    Mismatch,
    HandlerFailed,
}

impl Refusal {
    /// HTTP status, gRPC code, title, detail.
    pub(crate) fn words(self) -> (StatusCode, u8, &'static str, &'static str) {
        match self {
            Self::Missing => (
                StatusCode::BAD_REQUEST,
                3,
                retries_dedup::KEY_MISSING.0,
                retries_dedup::KEY_MISSING.1,
            ),
            Self::Malformed => (
                StatusCode::BAD_REQUEST,
                3,
                "Idempotency-Key is malformed",
                "The key must be 1 to 255 printable ASCII characters (visible ones and spaces).",
            ),
            Self::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                3,
                "Request body too large",
                "A request with an Idempotency-Key must fit the server's cap.",
            ),
            Self::Unreadable => (
                StatusCode::BAD_REQUEST,
                3,
                "Request body unreadable",
                "The request body ended in an error.",
            ),
            Self::StoreDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                14,
                "Idempotency store unavailable",
                "The request was not run; send it again later.",
            ),
            Self::InProgress(_) => (
                StatusCode::CONFLICT,
                14,
                "A request with this Idempotency-Key is being processed",
                "Send it again after the pause given.",
            ),
            Self::Mismatch => (
                StatusCode::UNPROCESSABLE_ENTITY,
                9,
                "Idempotency-Key reused",
                "This key was used for a different request.",
            ),
            Self::HandlerFailed => (
                StatusCode::INTERNAL_SERVER_ERROR,
                13,
                "Handler failed",
                "The handler stopped without a whole answer.",
            ),
        }
    }

    /// The pause a client should take before sending the key again.
    pub(crate) fn pause(self) -> Option<Duration> {
        match self {
            Self::InProgress(left) => Some(left),
            Self::StoreDown => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}
