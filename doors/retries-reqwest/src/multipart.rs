//! A multipart upload retried: the form rebuilt for each attempt.

use std::future::Future;

use retries_http::{BoxError, Opened, Reopen};

/// A request body ([`Reopen`], a request extension) that is the multipart
/// form `form` returns, rebuilt for each attempt (hedges included): a
/// `reqwest::multipart::Form` is consumed as it is sent and cannot be
/// cloned, and a file part reads its file again from the start. Each form
/// has a boundary of its own, so each attempt carries its own
/// `Content-Type`. Feature `multipart`.
///
/// Build the request without a body (`.multipart(..)` would send the form
/// once) and put this on it with `with_extension`:
///
/// ```no_run
/// use reqwest::multipart::{Form, Part};
///
/// # async fn upload(client: reqwest_middleware::ClientWithMiddleware) -> reqwest_middleware::Result<reqwest::Response> {
/// client
///     .put("http://127.0.0.1:8080/reports/2026-12")
///     .with_extension(retries_reqwest::multipart(|| async {
///         let form = Form::new()
///             .text("title", "December")
///             .file("report", "/var/reports/2026-12.pdf")
///             .await?;
///         Ok::<_, std::io::Error>(form)
///     }))
///     .send()
///     .await
/// # }
/// ```
///
/// A form that fails to build (its file is gone) ends the call at once,
/// nothing sent ([`Lost::Unopened`](crate::Lost::Unopened)). The form must
/// hold the same data for each attempt: the middleware cannot check it.
pub fn multipart<F, Fut, E>(form: F) -> Reopen
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<reqwest::multipart::Form, E>> + Send + 'static,
    E: Into<BoxError>,
{
    Reopen::with(move || {
        let form = form();
        async move {
            let form = form.await.map_err(Into::into)?;
            let content_type = http::HeaderValue::try_from(format!(
                "multipart/form-data; boundary={}",
                form.boundary()
            ))?;
            Ok::<_, BoxError>(Opened::stream(form.into_stream()).content_type(content_type))
        }
    })
}
