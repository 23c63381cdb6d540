//! The engine through `retries::call` and the attribute: the decision table,
//! deadlines, budgets and breakers, nesting and ownership, cancellation,
//! `retry_if`, the concurrency limit, the blocking door, hedging, the testing
//! kit, random fault scripts, contention, and one test per defect found.

mod admission;
mod blocking;
mod breaker;
mod budget;
mod cancel;
mod composition;
mod deadline;
mod decision;
mod hedge_delay;
mod hedging;
mod hook_points;
mod limit;
mod nested;
mod on_retry;
mod owned_state;
mod properties;
mod rate;
mod reference_rows;
mod regressions;
mod retry_if;
mod stress;
mod testing_kit;
