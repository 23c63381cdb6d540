//! The switch itself ([`Chaos`]): the plan of faults for one request,
//! what took effect, the counts ([`Report`]) and their events.

#[allow(clippy::wildcard_imports)]
use super::*;

/// One rule as it runs: its rate may change.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) fault: Fault,
    pub(crate) ppm: AtomicU32,
    pub(crate) scope: Vec<Pattern>,
    pub(crate) injected: AtomicU64,
    pub(crate) observed: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) seed: u64,
    pub(crate) enabled: AtomicBool,
    /// Requests seen, enabled or not: the next request's number.
    pub(crate) requests: AtomicU64,
    pub(crate) rules: Box<[Live]>,
    pub(crate) effects: AtomicU64,
    /// Hashes of the keys of effects reported (for duplicates).
    pub(crate) keys: Mutex<HashSet<u64>>,
}

/// Faults to inject, shared by every place that injects them: see the
/// [module docs](crate).
#[derive(Clone)]
pub struct Chaos {
    pub(crate) inner: Arc<Inner>,
}

/// The settings and the switch; not the keys of the effects seen.
impl fmt::Debug for Chaos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("Chaos")
            .field("seed", &inner.seed)
            .field("enabled", &inner.enabled)
            .field("rules", &inner.rules)
            .field("requests", &inner.requests)
            .finish_non_exhaustive()
    }
}

/// The counts of a [`Chaos`]: [`Chaos::report`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Report {
    /// Requests (and [`Chaos::around`] calls) seen, with the switch on or off.
    pub requests: u64,
    /// Effects reported with [`Chaos::effect`].
    pub effects: u64,
    /// Effects whose key had been reported before.
    pub duplicate_effects: u64,
    /// Per kind, in [`FaultKind::ALL`]'s order: (kind, injected, observed).
    pub faults: Vec<(FaultKind, u64, u64)>,
}

impl Report {
    /// Faults of `kind` injected.
    #[must_use]
    pub fn injected(&self, kind: FaultKind) -> u64 {
        self.faults.iter().find(|f| f.0 == kind).map_or(0, |f| f.1)
    }

    /// Faults of `kind` that took effect.
    #[must_use]
    pub fn observed(&self, kind: FaultKind) -> u64 {
        self.faults.iter().find(|f| f.0 == kind).map_or(0, |f| f.2)
    }
}

/// What to do to one request: the rule behind each fault, and its fault.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Plan {
    pub(crate) delay: Option<(usize, Duration)>,
    pub(crate) hang: Option<(usize, Duration)>,
    pub(crate) refuse: Option<(usize, Option<Duration>)>,
    pub(crate) after: Option<(usize, After)>,
}

/// What happens after the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum After {
    Drop,
    Fail { http_status: u16, grpc_code: u8 },
}

impl Plan {
    pub(crate) const fn is_empty(&self) -> bool {
        self.delay.is_none() && self.hang.is_none() && self.refuse.is_none() && self.after.is_none()
    }
}

/// The finaliser of `SplitMix64`: a well-mixed 64-bit value from any input.
pub(crate) const fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Chaos {
    /// A builder: seed, rules, the switch's first position.
    pub fn builder() -> ChaosBuilder {
        ChaosBuilder::default()
    }

    /// Turn injection on or off, for the next requests.
    pub fn set_enabled(&self, on: bool) {
        self.inner.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether injection is on.
    #[must_use]
    pub fn is_enabled(&self) -> bool {
        self.inner.enabled.load(Ordering::Relaxed)
    }

    /// Set the rate of every rule of `kind`, for the next requests.
    pub fn set_rate(&self, kind: FaultKind, rate: f64) -> Result<(), ChaosError> {
        let mut found = false;
        for (i, rule) in self.inner.rules.iter().enumerate() {
            if rule.fault.kind() == kind {
                rule.ppm.store(ppm(i, kind, rate)?, Ordering::Relaxed);
                found = true;
            }
        }
        if found {
            Ok(())
        } else {
            Err(ChaosError::NoRule(kind))
        }
    }

    /// Report an effect the service performed (a charge written, a message
    /// sent), identified by `key`: the same key twice is a duplicate effect.
    /// Keys are kept as 64-bit hashes (8 bytes each), until the `Chaos` is
    /// dropped.
    pub fn effect<K: Hash + ?Sized>(&self, key: &K) {
        // Fixed keys: the same key hashes the same throughout the process.
        let mut hasher = std::hash::DefaultHasher::new();
        key.hash(&mut hasher);
        let h = hasher.finish();
        self.inner.effects.fetch_add(1, Ordering::Relaxed);
        self.inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(h);
    }

    /// Requests, effects, duplicate effects, and each kind's injected and
    /// observed faults.
    #[must_use]
    pub fn report(&self) -> Report {
        let inner = &*self.inner;
        let effects = inner.effects.load(Ordering::Relaxed);
        let distinct = inner
            .keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64;
        let faults = FaultKind::ALL
            .iter()
            .map(|&kind| {
                inner.rules.iter().filter(|r| r.fault.kind() == kind).fold(
                    (kind, 0, 0),
                    |(k, i, o), r| {
                        (
                            k,
                            i + r.injected.load(Ordering::Relaxed),
                            o + r.observed.load(Ordering::Relaxed),
                        )
                    },
                )
            })
            .collect();
        Report {
            requests: inner.requests.load(Ordering::Relaxed),
            effects,
            duplicate_effects: effects.saturating_sub(distinct),
            faults,
        }
    }

    /// What to do to a request with `method` (HTTP) and `path` (or a
    /// name): one draw per rule in scope.
    pub(crate) fn plan(&self, method: Option<&str>, path: &str) -> Plan {
        self.plan_with(method, path, true)
    }

    /// [`plan`](Self::plan), without the faults after the work when
    /// `after_allowed` is false: a `FaultLayer` inside an idempotency layer
    /// (the request carries its claim) injects none there, since the layer
    /// would take a reply lost after the work for a handler that failed
    /// (500) and a 503 after it for a refusal (the key run again). Said in
    /// one WARN.
    pub(crate) fn plan_with(&self, method: Option<&str>, path: &str, after_allowed: bool) -> Plan {
        let inner = &*self.inner;
        // Every request is numbered, the switch on or off: a draw depends
        // on the seed, this number and the rule, never on the switch's past.
        let n = inner.requests.fetch_add(1, Ordering::Relaxed);
        let mut plan = Plan::default();
        if !inner.enabled.load(Ordering::Relaxed) || inner.rules.is_empty() {
            return plan;
        }
        let base = mix(inner.seed ^ mix(n));
        for (i, rule) in inner.rules.iter().enumerate() {
            let ppm = rule.ppm.load(Ordering::Relaxed);
            if ppm == 0
                || !(rule.scope.is_empty() || rule.scope.iter().any(|p| p.matches(method, path)))
            {
                continue;
            }
            if mix(base ^ (i as u64)) % 1_000_000 >= u64::from(ppm) {
                continue;
            }
            match rule.fault {
                Fault::Delay(d) => set(&mut plan.delay, (i, d)),
                Fault::Hang { max } => set(&mut plan.hang, (i, max)),
                Fault::Refuse { retry_after } => set(&mut plan.refuse, (i, retry_after)),
                Fault::DropReply => set(&mut plan.after, (i, After::Drop)),
                Fault::FailAfter {
                    http_status,
                    grpc_code,
                } => set(
                    &mut plan.after,
                    (
                        i,
                        After::Fail {
                            http_status,
                            grpc_code,
                        },
                    ),
                ),
            }
        }
        // A hang comes before a refusal, and after either the work never
        // runs: nothing after it.
        if plan.hang.is_some() {
            plan.refuse = None;
        }
        if plan.hang.is_some() || plan.refuse.is_some() {
            plan.after = None;
        }
        if !after_allowed && plan.after.take().is_some() {
            inside_dedup(path);
        }
        let rules = [
            plan.delay.map(|p| p.0),
            plan.hang.map(|p| p.0),
            plan.refuse.map(|p| p.0),
            plan.after.map(|p| p.0),
        ];
        for i in rules.into_iter().flatten() {
            let rule = &inner.rules[i];
            rule.injected.fetch_add(1, Ordering::Relaxed);
            fault(rule.fault.kind().as_str(), false, path);
        }
        plan
    }

    /// The fault of rule `rule` took effect.
    pub(crate) fn observed(&self, rule: usize) {
        if let Some(r) = self.inner.rules.get(rule) {
            r.observed.fetch_add(1, Ordering::Relaxed);
            fault(r.fault.kind().as_str(), true, "");
        }
    }

    /// Run `work` (a future resolving to a `Result`) under the faults in
    /// scope for `name`, for code no network layer sees: inside a
    /// `#[retryable]` body or a `retries::call` closure, around the part
    /// that has the effect.
    ///
    /// `Refuse` fails before `work` runs ([`Injected`], not executed);
    /// `Delay` waits first; `Hang` waits `max` (an attempt timeout or the
    /// call's deadline usually ends it first) and fails, unknown;
    /// `DropReply` and `FailAfter` run `work` and, when it succeeded, drop
    /// its value and fail, unknown. The error type takes an [`Injected`]
    /// through `From` (with `#[derive(Classify)]`, a
    /// `#[classify(transparent)] Chaos(#[from] Injected)` variant).
    ///
    /// ```
    /// use retries_chaos::{Chaos, Fault, Injected, Rule};
    ///
    /// #[derive(Debug, thiserror::Error, retries::Classify)]
    /// enum Error {
    ///     #[error(transparent)] #[classify(transparent)] Chaos(#[from] Injected),
    ///     #[error(transparent)] Stopped(#[from] retries::Stopped),
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let chaos = Chaos::builder().rule(Rule::new(Fault::DropReply)).build().unwrap();
    /// let mut effects = 0;
    /// let r: Result<u32, Error> = chaos.around("ledger.write", async { effects += 1; Ok(7) }).await;
    /// assert!(matches!(r, Err(Error::Chaos(_))));
    /// assert_eq!(effects, 1); // the work ran; its answer was lost
    /// # }
    /// ```
    pub async fn around<T, E, F>(&self, name: &str, work: F) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<Injected>,
    {
        let plan = self.plan(None, name);
        if plan.is_empty() {
            return work.await;
        }
        let kind = match self.apply(plan, || work).await {
            Applied::Ran(result) => return result,
            Applied::Hung => FaultKind::Hang,
            Applied::Refused(retry_after) => {
                return Err(Injected::new(FaultKind::Refuse, retry_after).into());
            }
            Applied::After(After::Drop) => FaultKind::DropReply,
            Applied::After(After::Fail { .. }) => FaultKind::FailAfter,
        };
        Err(Injected::new(kind, None).into())
    }

    /// The faults of `plan` around `work`, in their one order: a delay, then
    /// a hang or a refusal (the work never starts: `work` makes its future
    /// only when it runs), and after a successful work its answer dropped or
    /// replaced. Each place maps the result to its own errors; the server
    /// layer, whose future is a named type, follows the same order by hand.
    pub(crate) async fn apply<T, E, W, F>(&self, plan: Plan, work: W) -> Applied<Result<T, E>>
    where
        W: FnOnce() -> F,
        F: Future<Output = Result<T, E>>,
    {
        if let Some((rule, d)) = plan.delay {
            tokio::time::sleep(d).await;
            self.observed(rule);
        }
        if let Some((rule, max)) = plan.hang {
            let _ended = Ended(self, rule);
            tokio::time::sleep(max).await;
            return Applied::Hung;
        }
        if let Some((rule, retry_after)) = plan.refuse {
            self.observed(rule);
            return Applied::Refused(retry_after);
        }
        match (work().await, plan.after) {
            (Ok(answer), Some((rule, after))) => {
                // The answer came: it is lost here.
                drop(answer);
                self.observed(rule);
                Applied::After(after)
            }
            (result, _) => Applied::Ran(result),
        }
    }
}

/// What became of a request under its plan: [`Chaos::apply`].
pub(crate) enum Applied<R> {
    /// The work ran and its result stands (an error, or no fault after it).
    Ran(R),
    /// It hung for its bound; the work never ran.
    Hung,
    /// It was refused (with the pause asked for); the work never ran.
    Refused(Option<Duration>),
    /// The work succeeded, and its answer was then dropped or replaced.
    After(After),
}

/// Counts a hang as observed when it ends, however it ends (its bound, or
/// its caller dropping the future).
pub(crate) struct Ended<'a>(&'a Chaos, usize);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.observed(self.1);
    }
}

/// Fill `slot` if empty: the first rule of a kind wins.
pub(crate) fn set<T>(slot: &mut Option<T>, value: T) {
    if slot.is_none() {
        *slot = Some(value);
    }
}

/// A fault injected (`observed` false: a DEBUG event naming the request) or
/// one that took effect: door `chaos`, and `retry.chaos.injected` /
/// `retry.chaos.observed` by `kind`.
pub(crate) fn fault(kind: &'static str, observed: bool, request: &str) {
    use retries_core::door::observe;
    if observed {
        observe::event(observe::Level::Debug, "chaos", "fault took effect", &kind);
        observe::counter("retry.chaos.observed", &[("kind", kind)]);
    } else {
        observe::event(
            observe::Level::Debug,
            "chaos",
            "fault injected",
            &format_args!("{kind} on {request}"),
        );
        observe::counter("retry.chaos.injected", &[("kind", kind)]);
    }
}

/// A fault after the work was drawn for a request inside an idempotency
/// layer, and not injected: one WARN for the process.
fn inside_dedup(path: &str) {
    use retries_core::door::observe;
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        observe::event(
            observe::Level::Warn,
            "chaos",
            "FaultLayer is inside IdempotencyLayer: faults after the work (DropReply, FailAfter) \
             are not injected on keyed requests there; put FaultLayer outside the idempotency \
             layer to lose replies after their record",
            &path,
        );
    }
}
