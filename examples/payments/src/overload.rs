//! A service of fixed capacity over real gRPC on loopback, overloaded ten
//! times over, with and without an [`Admission`] in its callers: the
//! `grpc_overload` example of this package and `tests/overload.rs`.
//!
//! The server's `Work` accepts [`CAPACITY_PER_SEC`] calls a second (a tenth
//! of them per 100 ms) and answers the rest `RESOURCE_EXHAUSTED` at once,
//! before any work: refused as overloaded, not executed. [`CALLERS`] callers
//! each call it every [`EVERY`] (1,000 calls a second) for the plan's
//! `overload`, then one caller in twenty goes on for its `calm` (half the
//! capacity). Every call is `max_attempts = 3` (50 ms apart) within 1 s,
//! under one token bucket shared by the callers, and with [`run`]'s
//! `admission` also under an [`Admission`] (K = 2, the plan's `window`)
//! around that bucket.
//!
//! The server and the callers each run on a thread and a runtime of their
//! own, on one HTTP/2 connection, as a service and its client process would.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use retries::limit::Admission;
use retries::{Attempt, Budget, Policy, Reason, TokenBucket};
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};

use crate::events::pb::events_client::EventsClient;
use crate::events::pb::events_server::{Events, EventsServer};
use crate::events::pb::{Event, SubscribeRequest, UploadReply, WorkReply, WorkRequest};

/// Calls the server accepts per second.
pub const CAPACITY_PER_SEC: u32 = 100;
/// Callers, each calling every [`EVERY`]: 1,000 calls a second together.
pub const CALLERS: u32 = 200;
/// How often each caller calls during the overload.
pub const EVERY: Duration = Duration::from_millis(200);
/// The admission's `K`.
pub const K: f64 = 2.0;

/// How long each phase lasts.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// 1,000 calls a second.
    pub overload: Duration,
    /// The steady state measured: from this instant to the overload's end.
    pub steady_from: Duration,
    /// 50 calls a second, after the overload.
    pub calm: Duration,
    /// The admission's window.
    pub window: Duration,
}

impl Plan {
    /// The plan of the example and the test: 8 s of overload (seconds 4 to
    /// 8 measured), 4 s of calm, a 2 s window.
    pub const SHORT: Self = Self {
        overload: Duration::from_secs(8),
        steady_from: Duration::from_secs(4),
        calm: Duration::from_secs(4),
        window: Duration::from_secs(2),
    };
}

/// What one run measured, over the steady state of the overload.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Calls the callers started per second.
    pub calls_per_sec: f64,
    /// Requests the server received per second (first attempts and retries).
    pub received_per_sec: f64,
    /// Requests it accepted per second.
    pub accepted_per_sec: f64,
    /// The share of calls that succeeded.
    pub success: f64,
    /// Calls refused locally by the admission (nothing sent), per second.
    pub throttled_per_sec: f64,
    /// Whole seconds after the overload ended with a call still refused
    /// locally (0: none).
    pub throttled_after: u64,
}

impl Figures {
    /// Requests received per request accepted.
    #[must_use]
    pub fn per_accepted(&self) -> f64 {
        self.received_per_sec / self.accepted_per_sec.max(f64::MIN_POSITIVE)
    }

    /// Requests received per unit of the server's capacity.
    #[must_use]
    pub fn per_capacity(&self) -> f64 {
        self.received_per_sec / f64::from(CAPACITY_PER_SEC)
    }
}

/// Counts in one second of a run.
#[derive(Debug, Default, Clone, Copy)]
struct Second {
    received: u64,
    accepted: u64,
    calls: u64,
    ok: u64,
    throttled: u64,
}

/// Counts per second since the run's start.
#[derive(Debug)]
struct Log {
    t0: Instant,
    seconds: Mutex<Vec<Second>>,
}

impl Log {
    fn at(&self, f: impl FnOnce(&mut Second)) {
        let s = usize::try_from(self.t0.elapsed().as_secs()).unwrap_or(usize::MAX);
        let mut seconds = self.seconds.lock().expect("the log");
        if seconds.len() <= s {
            seconds.resize(s + 1, Second::default());
        }
        f(&mut seconds[s]);
    }
}

/// The server: a tenth of its capacity per 100 ms tick, the rest refused.
struct Capacity {
    log: Arc<Log>,
    /// The current tick and the calls it may still accept.
    tick: Mutex<(u128, u32)>,
}

#[tonic::async_trait]
impl Events for Capacity {
    type SubscribeStream = tokio_stream::Empty<Result<Event, Status>>;

    async fn subscribe(
        &self,
        _: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        Err(Status::unimplemented("not here"))
    }

    async fn work(&self, _: Request<WorkRequest>) -> Result<Response<WorkReply>, Status> {
        let accepted = {
            let now = self.log.t0.elapsed().as_millis() / 100;
            let mut tick = self.tick.lock().expect("the tick");
            if tick.0 != now {
                *tick = (now, CAPACITY_PER_SEC / 10);
            }
            let accepted = tick.1 > 0;
            tick.1 = tick.1.saturating_sub(1);
            accepted
        };
        self.log.at(|s| {
            s.received += 1;
            s.accepted += u64::from(accepted);
        });
        if accepted {
            Ok(Response::new(WorkReply { in_flight: 1 }))
        } else {
            Err(Status::resource_exhausted("over capacity"))
        }
    }

    async fn upload(
        &self,
        _: Request<tonic::Streaming<Event>>,
    ) -> Result<Response<UploadReply>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

/// Run the plan once, with or without the admission, and measure it.
///
/// # Panics
///
/// When a thread, a runtime or a loopback port cannot be had.
#[must_use]
pub fn run(admission: bool, plan: &Plan) -> Figures {
    let log = Arc::new(Log {
        t0: Instant::now(),
        seconds: Mutex::new(Vec::new()),
    });
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the server's runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("a loopback port");
                addr_tx
                    .send(listener.local_addr().expect("its address"))
                    .expect("the caller waits for it");
                let service = EventsServer::new(Capacity {
                    log,
                    tick: Mutex::new((u128::MAX, 0)),
                });
                Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        async {
                            let _ = stop_rx.await;
                        },
                    )
                    .await
                    .expect("the server runs");
            });
        })
    };
    let addr: SocketAddr = addr_rx.recv().expect("the server's address");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the callers' runtime");
    let local = tokio::task::LocalSet::new();
    if admission {
        let budget =
            Admission::try_around(TokenBucket::DEFAULT, K, plan.window).expect("valid settings");
        local.block_on(&rt, callers(addr, Rc::new(budget), &log, plan));
    } else {
        local.block_on(
            &rt,
            callers(addr, Rc::new(TokenBucket::DEFAULT), &log, plan),
        );
    }
    drop(rt);
    let _ = stop_tx.send(());
    server.join().expect("the server's thread");
    let seconds = log.seconds.lock().expect("the log").clone();
    figures(&seconds, plan)
}

/// Every caller, each on a local task, until the plan's end.
async fn callers<B: Budget + 'static>(
    addr: SocketAddr,
    budget: Rc<B>,
    log: &Arc<Log>,
    plan: &Plan,
) {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .connect_lazy();
    let client = EventsClient::new(channel);
    let policy = Rc::new(
        Policy::new(Duration::from_secs(1))
            .with_max_attempts(3)
            .with_backoff(retries::Backoff::constant(Duration::from_millis(50))),
    );
    let t0 = tokio::time::Instant::from_std(log.t0);
    let end = t0 + plan.overload + plan.calm;
    let overload = plan.overload;
    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let (client, budget, log, policy) = (
            client.clone(),
            Rc::clone(&budget),
            Arc::clone(log),
            Rc::clone(&policy),
        );
        tasks.push(tokio::task::spawn_local(async move {
            let mut next = t0 + EVERY * i / CALLERS;
            while next < end {
                tokio::time::sleep_until(next).await;
                next += EVERY;
                if t0.elapsed() >= overload && i % 20 != 0 {
                    continue; // the calm: one caller in twenty
                }
                let sent = Cell::new(false);
                let r = retries::call(&policy)
                    .idempotent()
                    .budget(&*budget)
                    .outcome(async |at: &Attempt| {
                        sent.set(true);
                        let request = retries::tonic::request(at, WorkRequest { millis: 0 });
                        client.clone().work(request).await.map(Response::into_inner)
                    })
                    .await;
                log.at(|s| {
                    s.calls += 1;
                    match &r {
                        Ok(_) => s.ok += 1,
                        Err(f) if f.reason() == Reason::Throttled => {
                            debug_assert!(!sent.get(), "a throttled call sends nothing");
                            s.throttled += 1;
                        }
                        Err(_) => {}
                    }
                });
            }
        }));
    }
    for task in tasks {
        task.await.expect("a caller");
    }
}

fn figures(seconds: &[Second], plan: &Plan) -> Figures {
    let secs = |d: Duration| usize::try_from(d.as_secs()).unwrap_or(usize::MAX);
    let (from, to) = (secs(plan.steady_from), secs(plan.overload));
    let steady = seconds.get(from..to.min(seconds.len())).unwrap_or_default();
    let n = steady.len().max(1) as f64;
    let sum = |f: fn(&Second) -> u64| steady.iter().map(f).sum::<u64>() as f64;
    let calm = seconds.get(to..).unwrap_or_default();
    Figures {
        calls_per_sec: sum(|s| s.calls) / n,
        received_per_sec: sum(|s| s.received) / n,
        accepted_per_sec: sum(|s| s.accepted) / n,
        success: sum(|s| s.ok) / sum(|s| s.calls).max(1.0),
        throttled_per_sec: sum(|s| s.throttled) / n,
        throttled_after: calm
            .iter()
            .rposition(|s| s.throttled > 0)
            .map_or(0, |i| i as u64 + 1),
    }
}
