//! The database tests, one binary (one link, and the tests run side by
//! side): each starts its own PostgreSQL cluster. Without PostgreSQL's
//! programs (and without `RETRIES_POSTGRES_REQUIRED`) they are compiled as
//! ignored (see the build script).

#![cfg_attr(no_postgres, allow(unused))]

mod crashes;
mod durable;
mod exactly_once;
mod in_progress;
mod key_store;
mod lock_wait;
mod readme;
mod renewals;
mod replay;
mod scripts;
mod transactions;
