//! The adaptive kind of [`Concurrency`](super::Concurrency) (issue 63,
//! item 3): a limit that finds the server's capacity from the attempts of
//! the calls holding its slots.
//!
//! Each attempt of a call holding a slot tells the limit how long it took
//! and how it ended:
//!
//! * **an overloaded verdict** (429, 503 with a pause, `RESOURCE_EXHAUSTED`,
//!   a `ShedLayer`'s refusal) cuts the limit to four fifths at once, at most
//!   once per round trip (the answers of one burst are one signal, as TCP
//!   halves its window once per window);
//! * **a success** is a round-trip sample. The limit keeps the shortest
//!   sample of the last 10 to 20 seconds as the unloaded round trip (the
//!   baseline), and a moving average of the samples over about a limit's
//!   worth of them. A sample within [`TOLERANCE`] of the baseline, while
//!   at least half the slots are in use, grows the limit: by one slot per
//!   sample until the first cut (it doubles each round trip, so the
//!   capacity is found in a few), then by one slot per four limits' worth
//!   of samples (one every four round trips: probing for more, slowly
//!   enough that it spends few round trips past the capacity before the
//!   first queued answer comes back). A sample past it (a request
//!   that queued at the server) shrinks it, at most once per round trip,
//!   to what the server takes without a queue less 5 % of headroom: the
//!   most successes the calls saw end within one baseline round trip, in
//!   any of the last four such windows (by Little's law, the requests the
//!   server works on at once; BBR's estimate of a path's capacity), but
//!   never by more than half at once (a client starved of CPU sees fewer
//!   successes than the server could give). A limit already under that
//!   is not cut: one slow sample in a healthy flow (a pause of the
//!   machine) costs nothing. The limit's sawtooth
//!   then spends two round trips in about fifteen one slot past the
//!   server's capacity, where one request in forty queues;
//! * a cut-off attempt (its `attempt_timeout`) is a sample of the time it
//!   was given; other failures tell nothing about capacity.
//!
//! Chosen where the issue was silent, and said here: the limit starts at
//! its floor's double, within its ceiling; the tolerance is 50 %, the
//! issue's own yardstick for latency under load (a server whose latency
//! rises smoothly with load is let rise that far; one that queues a
//! request for a whole service time is kept out of its queue, and a
//! machine's scheduling noise is not mistaken for a queue); a hedged
//! call's copies do not feed it (their slots are one, their round trips
//! several).

use std::time::{Duration, Instant};

/// How far a round trip may rise over the unloaded one before it counts
/// as queued and shrinks the limit: 50 %.
pub const TOLERANCE: f64 = 1.5;

/// The cut of an overloaded verdict.
const CUT: f64 = 0.8;

/// The headroom a queued round trip's cut leaves under the capacity it
/// estimates.
const HEADROOM: f64 = 0.95;

/// How many windows of one baseline round trip the capacity is the most
/// successes of.
const WINDOWS: usize = 4;

/// Past the first cut, the limit grows by a slot every this many round
/// trips.
const PROBE: f64 = 4.0;

/// The baseline is the shortest round trip of the current and the
/// previous window of this length.
const BASELINE_WINDOW: Duration = Duration::from_secs(10);

/// The learning state of an adaptive limit.
#[derive(Debug)]
pub(crate) struct Adaptive {
    pub(crate) floor: u32,
    pub(crate) ceiling: u32,
    state: std::sync::Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// The limit, fractional: it moves by less than a slot per sample.
    limit: f64,
    /// Permits in existence, held or free.
    issued: u32,
    /// Permits to withhold as they are given back (the limit shrank below
    /// what is held).
    debt: u32,
    /// The moving average of round trips, in nanoseconds (0: no sample).
    average: f64,
    /// The shortest round trip of the current window and the one before.
    shortest: (Option<Duration>, Option<Duration>),
    /// When the current baseline window began.
    window_from: Option<Instant>,
    /// The last cut (for an overloaded verdict or a queued round trip);
    /// none yet: the limit grows by a slot per sample.
    last_cut: Option<Instant>,
    /// Successes in the current window of one baseline round trip, and
    /// when it began.
    ended: (u32, Option<Instant>),
    /// The successes of the last windows (the capacity is their most).
    windows: [u32; WINDOWS],
}

/// What an attempt told the limit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sample {
    /// It succeeded (or was cut off at its time limit) after this long.
    RoundTrip(Duration),
    /// The server refused it as overloaded.
    Overloaded,
}

impl Adaptive {
    /// A state for `floor..=ceiling` slots, starting at `start` (the
    /// permits the semaphore was made with).
    pub(crate) fn new(floor: u32, ceiling: u32, start: u32) -> Self {
        Self {
            floor,
            ceiling,
            state: std::sync::Mutex::new(State {
                limit: f64::from(start),
                issued: start,
                debt: 0,
                average: 0.0,
                shortest: (None, None),
                window_from: None,
                last_cut: None,
                ended: (0, None),
                windows: [0; WINDOWS],
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The limit now, in whole slots, and the permits in existence (held
    /// or free; more than the limit while a shrink waits for slots to come
    /// back).
    pub(crate) fn current(&self) -> (u32, u32) {
        let s = self.state();
        (s.issued - s.debt, s.issued)
    }

    /// A held permit comes back: withheld if the limit shrank below what is
    /// held, else freed.
    pub(crate) fn give_back(&self, semaphore: &tokio::sync::Semaphore) {
        let mut s = self.state();
        if s.debt > 0 {
            s.debt -= 1;
            s.issued -= 1;
        } else {
            semaphore.add_permits(1);
        }
    }

    /// Learn from one attempt at `now`; `semaphore` is the limit's.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )] // nanoseconds and slots, far inside f64's exact integers
    pub(crate) fn learn(&self, sample: Sample, now: Instant, semaphore: &tokio::sync::Semaphore) {
        let mut s = self.state();
        let (floor, ceiling) = (f64::from(self.floor), f64::from(self.ceiling));
        // One cut per round trip: the answers of one burst are one signal.
        let round_trip = Duration::from_nanos(s.average as u64);
        let may_cut = s
            .last_cut
            .is_none_or(|t| now.saturating_duration_since(t) >= round_trip);
        match sample {
            Sample::Overloaded => {
                if may_cut {
                    s.limit = (s.limit * CUT).max(floor);
                    s.last_cut = Some(now);
                }
            }
            Sample::RoundTrip(rtt) => {
                let from = *s.window_from.get_or_insert(now);
                if now.saturating_duration_since(from) >= BASELINE_WINDOW {
                    s.shortest = (None, s.shortest.0);
                    s.window_from = Some(now);
                }
                s.shortest.0 = Some(s.shortest.0.map_or(rtt, |m| m.min(rtt)));
                let baseline = match s.shortest {
                    (Some(a), Some(b)) => a.min(b),
                    (a, b) => a.or(b).unwrap_or(rtt),
                };
                // The successes within one baseline round trip.
                let began = *s.ended.1.get_or_insert(now);
                if now.saturating_duration_since(began) >= baseline {
                    let count = s.ended.0;
                    s.windows.rotate_right(1);
                    s.windows[0] = count;
                    s.ended = (0, Some(now));
                }
                s.ended.0 += 1;
                // Unknown (0) until a window has closed.
                let capacity = s.windows.iter().copied().max().unwrap_or(0);
                let baseline = (baseline.as_nanos() as f64).max(1.0);
                let n = rtt.as_nanos() as f64;
                let weight = 1.0 / s.limit.max(1.0);
                s.average = if s.average == 0.0 {
                    n
                } else {
                    s.average + (n - s.average) * weight
                };
                if n <= baseline * TOLERANCE {
                    // Grow only a limit in use: idle slots prove nothing.
                    let free = u32::try_from(semaphore.available_permits()).unwrap_or(u32::MAX);
                    let in_use = f64::from(s.issued.saturating_sub(free));
                    if in_use * 2.0 >= s.limit {
                        let step = if s.last_cut.is_some() {
                            weight / PROBE
                        } else {
                            1.0
                        };
                        s.limit = (s.limit + step).min(ceiling);
                    }
                } else if may_cut && capacity > 0 && HEADROOM * f64::from(capacity) < s.limit {
                    let to = (HEADROOM * f64::from(capacity)).max(s.limit / 2.0);
                    s.limit = to.max(floor);
                    s.last_cut = Some(now);
                }
            }
        }
        let target = (s.limit as u32).clamp(self.floor, self.ceiling);
        let effective = s.issued - s.debt;
        if target > effective {
            let mut more = target - effective;
            let cancelled = more.min(s.debt);
            s.debt -= cancelled;
            more -= cancelled;
            if more > 0 {
                semaphore.add_permits(more as usize);
                s.issued += more;
            }
        } else if target < effective {
            let fewer = effective - target;
            let forgotten =
                u32::try_from(semaphore.forget_permits(fewer as usize)).unwrap_or(fewer);
            s.issued -= forgotten;
            s.debt += fewer - forgotten;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use tokio::sync::Semaphore;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Every free permit of `s` taken: all slots in use.
    fn busy(s: &Semaphore) {
        s.forget_permits(s.available_permits());
    }

    #[test]
    fn round_trips_at_the_baseline_grow_it_fast_then_by_one_per_four_round_trips() {
        let s = Semaphore::new(10);
        let a = Adaptive::new(5, 100, 10);
        let t0 = Instant::now();
        busy(&s);
        // Until the first cut, a slot per sample.
        for i in 0..3 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(i), &s);
        }
        assert_eq!(a.current(), (13, 13));
        assert_eq!(s.available_permits(), 3);
        busy(&s);
        // An overload cuts it to 10.4; after that, each sample at the
        // baseline adds about a fortieth of a slot (one per four limits'
        // worth): 26 take it past 11.
        a.learn(Sample::Overloaded, t0 + ms(3), &s);
        assert_eq!(a.current().0, 10);
        for i in 0..25 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(10 + i), &s);
        }
        assert_eq!(a.current().0, 10);
        a.learn(Sample::RoundTrip(ms(20)), t0 + ms(35), &s);
        assert_eq!(a.current().0, 11);
    }

    #[test]
    fn idle_slots_do_not_grow_it() {
        let s = Semaphore::new(10);
        let a = Adaptive::new(5, 100, 10);
        let t0 = Instant::now();
        for i in 0..100 {
            a.learn(Sample::RoundTrip(ms(20)), t0 + ms(i), &s);
        }
        assert_eq!(a.current().0, 10);
    }

    #[test]
    fn an_overloaded_verdict_cuts_at_once_once_per_round_trip() {
        let s = Semaphore::new(40);
        let a = Adaptive::new(5, 100, 40);
        let t0 = Instant::now();
        a.learn(Sample::RoundTrip(ms(20)), t0, &s);
        a.learn(Sample::Overloaded, t0 + ms(1), &s);
        assert_eq!(a.current().0, 32);
        // The same burst's other refusals: no second cut within 20 ms.
        a.learn(Sample::Overloaded, t0 + ms(5), &s);
        assert_eq!(a.current().0, 32);
        a.learn(Sample::Overloaded, t0 + ms(22), &s);
        assert_eq!(a.current().0, 25);
        // Never under the floor.
        for i in 0..20 {
            a.learn(Sample::Overloaded, t0 + ms(100 * (i + 1)), &s);
        }
        assert_eq!(a.current().0, 5);
        assert_eq!(s.available_permits(), 5);
    }

    #[test]
    fn queued_round_trips_cut_it_to_what_the_server_takes() {
        let s = Semaphore::new(60);
        let a = Adaptive::new(5, 100, 60);
        let t0 = Instant::now();
        busy(&s);
        // A cut ends the fast start.
        a.learn(Sample::Overloaded, t0, &s);
        assert_eq!(a.current().0, 48);
        // Unloaded: 20 ms. Then a server that ends 24 requests every 20 ms
        // (its capacity) answers the 48 in flight in 40 ms: queued.
        a.learn(Sample::RoundTrip(ms(20)), t0 + ms(100), &s);
        let mut limits = Vec::new();
        for i in 1..=120u32 {
            let at = t0 + ms(100) + Duration::from_micros(u64::from(i) * 20_000 / 24);
            a.learn(Sample::RoundTrip(ms(40)), at, &s);
            limits.push(a.current().0);
        }
        // No cut before a window of one baseline (20 ms) has closed: the
        // capacity is unknown until then.
        assert!(limits[..22].iter().all(|&n| n == 48), "{limits:?}");
        // Then toward 95 % of the successes of a window (24 or 25), by at
        // most half at once: 24 first, 22 or 23 a round trip later, and no
        // further while the limit is under it.
        assert_eq!(limits[23], 24, "{limits:?}");
        let last = limits[119];
        assert!((22..=23).contains(&last), "{limits:?}");
        assert!(limits[80..].iter().all(|&n| n == last), "{limits:?}");
        // What is held is withheld as it comes back, not taken away.
        let (limit, issued) = a.current();
        assert_eq!(issued, 60);
        for _ in 0..(issued - limit) {
            a.give_back(&s);
        }
        assert_eq!(a.current(), (limit, limit));
        assert_eq!(s.available_permits(), 0);
        a.give_back(&s);
        assert_eq!(s.available_permits(), 1);
    }
}
