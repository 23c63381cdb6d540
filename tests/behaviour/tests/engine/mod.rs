//! The engine through `retries::call` and the attribute: the decision table,
//! deadlines, budgets and breakers, nesting and ownership, cancellation,
//! `retry_if`, the concurrency limit, the blocking door, hedging, the testing
//! kit, random fault scripts, contention, and one test per defect found.

mod decision;
mod deadline;
mod reference_rows;
mod budget;
mod breaker;
mod hook_points;
mod owned_state;
mod nested;
mod composition;
mod cancel;
mod on_retry;
mod properties;
mod stress;
mod retry_if;
mod limit;
mod blocking;
mod testing_kit;
mod regressions;
mod hedging;
