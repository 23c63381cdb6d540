//! [`FaultMiddleware`]: faults injected on the client's side of the wire
//! (reqwest).

use std::io;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

use super::{After, Applied, Chaos, FaultKind, Injected};

/// `reqwest-middleware` middleware that injects a [`Chaos`]'s faults into
/// each request it sends, on the client's side of the wire:
///
/// | fault | what the caller gets | verdict |
/// |---|---|---|
/// | `Refuse` | an error of kind `ConnectionRefused`; nothing is sent | not executed |
/// | `Delay` | the answer, late | — |
/// | `Hang` | an error of kind `TimedOut` after `max` (an attempt timeout usually comes first); nothing is sent | unknown |
/// | `DropReply` | the request is sent and its answer awaited, then dropped: an error of kind `ConnectionReset` | unknown |
/// | `FailAfter` | the request is sent, its answer replaced by one with the rule's HTTP status | by that status |
///
/// The errors are `reqwest_middleware::Error::Middleware` around an
/// `std::io::Error` whose inner error is an [`Injected`]. Add it after the
/// retry middleware, so that each attempt meets the faults:
///
/// ```no_run
/// use std::time::Duration;
/// use retries::Policy;
/// use retries_chaos::{Chaos, Fault, FaultMiddleware, Rule};
/// use retries_reqwest::RetryMiddleware;
///
/// let chaos = Chaos::builder().rule(Rule::new(Fault::DropReply).rate(0.1)).build()?;
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(Policy::new(Duration::from_secs(5))))
///     .with(FaultMiddleware::new(chaos))
///     .build();
/// # let _ = client;
/// # Ok::<(), retries_chaos::ChaosError>(())
/// ```
#[derive(Debug, Clone)]
pub struct FaultMiddleware {
    chaos: Chaos,
}

impl FaultMiddleware {
    /// Inject `chaos`'s faults.
    #[must_use]
    pub const fn new(chaos: Chaos) -> Self {
        Self { chaos }
    }
}

fn injected(kind: io::ErrorKind, fault: FaultKind) -> reqwest_middleware::Error {
    reqwest_middleware::Error::middleware(io::Error::new(kind, Injected::new(fault, None)))
}

#[async_trait::async_trait]
impl Middleware for FaultMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let chaos = &self.chaos;
        let plan = chaos.plan(Some(request.method().as_str()), request.url().path());
        if plan.is_empty() {
            return next.run(request, extensions).await;
        }
        match chaos.apply(plan, || next.run(request, extensions)).await {
            Applied::Ran(result) => result,
            Applied::Hung => Err(injected(io::ErrorKind::TimedOut, FaultKind::Hang)),
            Applied::Refused(_) => Err(injected(
                io::ErrorKind::ConnectionRefused,
                FaultKind::Refuse,
            )),
            Applied::After(After::Drop) => Err(injected(
                io::ErrorKind::ConnectionReset,
                FaultKind::DropReply,
            )),
            Applied::After(After::Fail { http_status, .. }) => {
                let status = http::StatusCode::from_u16(http_status)
                    .unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE);
                let mut answer = http::Response::new(Vec::<u8>::new());
                *answer.status_mut() = status;
                Ok(reqwest::Response::from(answer))
            }
        }
    }
}
