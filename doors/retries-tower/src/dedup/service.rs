//! The layer's service: a keyed request claimed, run with its lease renewed
//! beside the handler, its answer stored (or the key released), and the
//! layer's own answers (a replay, a 409, a 422, a 400).

#[allow(clippy::wildcard_imports)]
use super::*;

/// The service of [`IdempotencyLayer`].
pub struct IdempotencyService<S, St> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<St>>,
}

impl<S: Clone, St> Clone for IdempotencyService<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for IdempotencyService<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

pub(crate) type Answer<RB, E> = Result<Response<KeyedBody<RB>>, E>;

impl<S, St, B, RB> tower_service::Service<Request<B>> for IdempotencyService<S, St>
where
    S: tower_service::Service<Request<KeyedBody<B>>, Response = Response<RB>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    type Response = Response<KeyedBody<RB>>;
    /// The inner service's: the layer's own failures are answers (an
    /// unreadable body 400, a handler that panicked 500), so under axum the
    /// service stays infallible.
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Answer<RB, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = Arc::clone(&self.shared);
        let (parts, body) = request.into_parts();
        let keyed = !retries_http::door::method_is_idempotent(&parts.method);
        let key = keyed.then(|| parts.headers.get(&shared.settings.header).cloned());
        let pass = |parts, body, mut inner: S| -> Self::Future {
            Box::pin(async move {
                let response = inner
                    .call(Request::from_parts(parts, KeyedBody::passed(body)))
                    .await?;
                Ok(response.map(KeyedBody::passed))
            })
        };
        match key {
            // Idempotent by method: nothing to deduplicate.
            None => pass(parts, body, inner),
            Some(None) if !shared.settings.required => pass(parts, body, inner),
            Some(None) => {
                answered("missing");
                Box::pin(std::future::ready(Ok(marked(
                    shared.refuse(Refusal::Missing),
                ))))
            }
            Some(Some(value)) => Box::pin(async move {
                let Some(key) = key_of(&value) else {
                    answered("missing");
                    return Ok(marked(shared.refuse(Refusal::Malformed)));
                };
                let bytes = match read(body, shared.settings.request_cap).await {
                    Ok(Some(bytes)) => bytes,
                    Ok(None) => return Ok(marked(shared.refuse(Refusal::TooLarge))),
                    Err(_) => return Ok(marked(shared.refuse(Refusal::Unreadable))),
                };
                poll_fn(|cx| inner.poll_ready(cx)).await?;
                keyed_call(&shared, inner, parts, bytes, &key)
                    .await
                    .map(marked)
            }),
        }
    }
}

/// An answer to a keyed request, with the mark that proves to the client
/// that the key is deduplicated here (`retries_http::proof`): first runs,
/// replays and the layer's own answers alike. Never stored in a record: a
/// replay gets it when it is sent.
fn marked<RB>(mut response: Response<KeyedBody<RB>>) -> Response<KeyedBody<RB>> {
    response.headers_mut().insert(
        retries_http::proof::DEDUPLICATED,
        HeaderValue::from_static("1"),
    );
    response
}

/// A request with a key: claimed, run once, answered from the record.
pub(crate) async fn keyed_call<S, St, B, RB>(
    shared: &Arc<Shared<St>>,
    mut inner: S,
    mut parts: Parts,
    body: Bytes,
    key: &str,
) -> Answer<RB, S::Error>
where
    S: tower_service::Service<Request<KeyedBody<B>>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    B: Send + 'static,
    RB: Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<BoxError>,
{
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let fingerprint = Fingerprint::of(parts.method.as_str(), path, &body);
    let principal = shared.settings.principal.as_ref().map(|f| f(&parts));
    let at = Key {
        principal: principal.as_deref().unwrap_or(""),
        key,
        fingerprint: &fingerprint,
    };
    collect_if_due(shared);
    let claim = match shared.store.claim(at, shared.settings.terms).await {
        Ok(claim) => claim,
        Err(e) => {
            store_failed("claim", &e);
            answered("refused");
            return Ok(shared.refuse(Refusal::StoreDown));
        }
    };
    let token = match claim {
        Claim::Run(token) => token,
        Claim::Answered(stored) => {
            answered("replayed");
            return Ok(replay(stored));
        }
        Claim::InProgress { retry_after } => {
            answered("in_progress");
            let pause = next_renewal(retry_after, shared.settings.terms.lease);
            return Ok(shared.refuse(Refusal::InProgress(pause)));
        }
        Claim::Mismatch => {
            answered("mismatch");
            return Ok(shared.refuse(Refusal::Mismatch));
        }
    };
    answered("run");
    let claimed = Claimed::new(at, token, shared.settings.terms);
    parts.extensions.insert(claimed.clone());
    let handler = inner.call(Request::from_parts(parts, KeyedBody::whole(body, None)));
    let task = Arc::clone(shared);
    // Its own task: a caller that leaves does not cut the handler off
    // between its effect and its record.
    let run = tokio::spawn(async move {
        let response = renewing(&task, &claimed, handler).await?;
        let (head, body) = response.into_parts();
        let Ok(body) = body.collect().await else {
            // The answer broke off: what the handler did is unknown, so the
            // claim waits out its lease.
            return Ok(task.refuse(Refusal::HandlerFailed));
        };
        let trailers = body.trailers().cloned();
        let body = body.to_bytes();
        let key = claimed.key();
        if task.refused(&head, trailers.as_ref()) {
            // A refusal: the work was not done; the next request runs it.
            if let Err(e) = task.store.release(key, token).await {
                store_failed("release", &e);
            }
        } else if !claimed.is_stored() {
            let answer = Stored::from_parts(
                head.status,
                &head.headers,
                &body,
                trailers.as_ref(),
                task.settings.response_cap,
            );
            if let Err(e) = task
                .store
                .complete(key, token, &answer, task.settings.terms)
                .await
            {
                store_failed("complete", &e);
            }
        }
        Ok(Response::from_parts(head, KeyedBody::whole(body, trailers)))
    });
    match run.await {
        Ok(answer) => answer,
        // A panic in the handler: the claim waits out its lease.
        Err(_) => Ok(shared.refuse(Refusal::HandlerFailed)),
    }
}

/// Run `handler`, renewing its claim every third of the lease while it
/// runs: a handler slower than the lease keeps its key. The renewals run
/// beside the handler, never instead of it: the handler is polled while a
/// renewal waits (on a busy store, or on the key's row that the handler's
/// own transaction holds after `complete_in`), so a renewal can neither
/// stall the handler nor be stalled by it. Each renewal is due a third of
/// the lease after the previous one *started*, so a slow store does not
/// stretch the cadence; one that fails is tried again after a twelfth of
/// the lease. A renewal that finds the claim gone is said at DEBUG
/// (`lease_lost`) and renewing stops; one that fails is said at WARN.
pub(crate) async fn renewing<St: Store, F: Future>(
    shared: &Shared<St>,
    claimed: &Claimed,
    handler: F,
) -> F::Output {
    let lease = shared.settings.terms.lease;
    let every = (lease / 3).max(Duration::from_millis(10));
    let again = (lease / 12).max(Duration::from_millis(5));
    let renewals = async {
        let mut due = tokio::time::Instant::now() + every;
        loop {
            tokio::time::sleep_until(due).await;
            let started = tokio::time::Instant::now();
            match shared
                .store
                .renew(claimed.key(), claimed.token(), shared.settings.terms)
                .await
            {
                Ok(true) => due = started + every,
                Ok(false) => {
                    answered("lease_lost");
                    return std::future::pending::<std::convert::Infallible>().await;
                }
                Err(e) => {
                    store_failed("renew", &e);
                    due = tokio::time::Instant::now() + again;
                }
            }
        }
    };
    let mut handler = std::pin::pin!(handler);
    let mut renewals = std::pin::pin!(renewals);
    poll_fn(|cx| {
        if let Poll::Ready(output) = handler.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        // Never ready: it ends when the handler does.
        let _ = renewals.as_mut().poll(cx);
        Poll::Pending
    })
    .await
}

/// The pause a request is told to take while the key's holder runs: the
/// time until the holder is next expected to renew its claim (a third of
/// the lease after its last renewal, so `lease_left - 2/3 lease`). Not the
/// lease's whole time left: the holder
/// usually finishes well before its lease would run out, and a client told
/// to wait 30 s gives up instead of waiting inside a 5 s deadline.
pub(crate) fn next_renewal(lease_left: Duration, lease: Duration) -> Duration {
    lease_left.saturating_sub(lease.saturating_sub(lease / 3))
}

/// Collect expired records, at most once a minute, in a task of its own.
pub(crate) fn collect_if_due<St: Store>(shared: &Arc<Shared<St>>) {
    const EVERY_MS: u64 = 60_000;
    let epoch = *shared.collector.epoch.get_or_init(retries_core::door::now);
    let now = retries_core::door::since(epoch).as_millis() as u64 + EVERY_MS;
    let last = shared.collector.collected.load(Ordering::Relaxed);
    if now.saturating_sub(last) < EVERY_MS
        || shared
            .collector
            .collected
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        if let Err(e) = shared.store.collect().await {
            store_failed("collect", &e);
        }
    });
}

/// The key in a header's value: a structured-field string (`"…"`, as the
/// draft writes it) or the bare characters; 1 to 255 printable ASCII
/// (visible characters and the space, the characters a structured-field
/// string may hold; a bare key is trimmed of spaces at its ends).
pub(crate) fn key_of(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?.trim();
    let key = match text.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(quoted) => {
            let mut key = String::with_capacity(quoted.len());
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => key.push(chars.next().filter(|c| matches!(c, '"' | '\\'))?),
                    '"' => return None,
                    c => key.push(c),
                }
            }
            key
        }
        None => text.to_string(),
    };
    let visible = key.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    (visible && (1..=255).contains(&key.len())).then_some(key)
}

impl<St> Shared<St> {
    /// The layer's own answer: a problem document (RFC 9457) with
    /// `Retry-After` over HTTP; a trailers-only status with
    /// `grpc-retry-pushback-ms` over gRPC.
    fn refuse<RB>(&self, why: Refusal) -> Response<KeyedBody<RB>> {
        let (status, code, title, detail) = why.words();
        if self.settings.grpc {
            let mut response = Response::new(KeyedBody::whole(Bytes::new(), None));
            let h = response.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert(grpc::STATUS, HeaderValue::from(u16::from(code)));
            h.insert(grpc::MESSAGE, HeaderValue::from_static(title));
            if let Some(pause) = why.pause() {
                let ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX).max(1);
                h.insert(grpc::PUSHBACK, HeaderValue::from(ms));
            }
            return response;
        }
        let body = retries_dedup::problem(status.as_u16(), title, detail);
        let mut response = Response::new(KeyedBody::whole(body, None));
        *response.status_mut() = status;
        let h = response.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(pause) = why.pause() {
            let secs = pause.as_secs() + u64::from(pause.subsec_nanos() > 0);
            h.insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        response
    }

    /// Did the handler refuse (the work not done), so that the key is
    /// released instead of recorded? HTTP 429 and 503; gRPC
    /// `RESOURCE_EXHAUSTED` and `UNAVAILABLE`.
    fn refused(&self, head: &http::response::Parts, trailers: Option<&HeaderMap>) -> bool {
        if self.settings.grpc {
            let code = head
                .headers
                .get(&grpc::STATUS)
                .or_else(|| trailers.and_then(|t| t.get(&grpc::STATUS)));
            return code.is_some_and(|c| c == "8" || c == "14");
        }
        matches!(head.status.as_u16(), 429 | 503)
    }
}

/// A keyed request answered by the layer: a DEBUG event (door `dedup`) and
/// `retry.server.dedup` by `outcome` (`run`, `replayed`, `in_progress`,
/// `mismatch`, `missing`, `refused`, `lease_lost`).
pub(crate) fn answered(outcome: &'static str) {
    use retries_core::door::observe;
    observe::event(observe::Level::Debug, "dedup", "keyed request", &outcome);
    observe::counter("retry.server.dedup", &[("outcome", outcome)]);
}

/// The store failed at `step` (`claim`, `complete`, `release`, `renew`,
/// `collect`): a WARN event (door `dedup`), since a record not stored may
/// let the key run again.
pub(crate) fn store_failed(step: &'static str, error: &dyn std::error::Error) {
    use retries_core::door::observe;
    observe::event(
        observe::Level::Warn,
        "dedup",
        "idempotency store failed",
        &format_args!("{step}: {error}"),
    );
}
