//! After a `COMMIT` whose reply was lost: the transaction's outcome looked
//! up by its id with `pg_xact_status`, within the call's deadline.

#[allow(clippy::wildcard_imports)]
use super::*;

/// The pause between two `pg_xact_status` look-ups of a transaction still
/// in progress.
pub(crate) const LOOK_AGAIN: Duration = Duration::from_millis(20);

/// How long before the call's deadline the look-ups give up.
pub(crate) const MARGIN: Duration = Duration::from_millis(5);

/// `COMMIT` is not sent with less than this left before the call's
/// deadline (the transaction is rolled back instead: not executed).
pub(crate) const COMMIT_ROOM: Duration = Duration::from_millis(25);

/// The wait for `COMMIT`'s reply ends this long before the call's deadline,
/// leaving the look-up room for one round trip.
pub(crate) const LOOKUP_ROOM: Duration = Duration::from_millis(15);

/// The server's life, as one string: when the postmaster started, when its
/// shared statistics were last reset (crash recovery resets them, also
/// after one backend's crash, which restarts every backend without
/// restarting the postmaster), and the WAL timeline (a promoted standby
/// has a new one). Every event after which PostgreSQL may hand out again
/// a transaction id it had handed out before (crash recovery, a failover,
/// a restore) changes it; so does a manual `pg_stat_reset_shared`, which
/// only makes the door more careful. Epoch seconds, so that the session's
/// `TimeZone` and `DateStyle` do not matter.
macro_rules! generation {
    () => {
        "concat_ws('/', extract(epoch FROM pg_postmaster_start_time()), \
         extract(epoch FROM (SELECT stats_reset FROM pg_stat_bgwriter)), \
         left(pg_walfile_name(pg_current_wal_lsn()), 8))"
    };
}

/// Read before `COMMIT`, in one round trip: the transaction's id and the
/// server's life.
pub(crate) const ID_AND_GENERATION: &str = concat!(
    "SELECT pg_current_xact_id_if_assigned()::text, ",
    generation!()
);

/// The look-up: the id's status and the server's life. For an id not
/// handed out yet `pg_xact_status` fails with [`IN_THE_FUTURE`].
pub(crate) const STATUS_AND_GENERATION: &str =
    concat!("SELECT pg_xact_status($1::xid8), ", generation!());

/// The SQLSTATE of `pg_xact_status` for an id not handed out yet
/// ("transaction ID … is in the future", `invalid_parameter_value`; the id
/// is the only parameter, and a valid `xid8`).
pub(crate) const IN_THE_FUTURE: &str = "22023";

/// When the look-ups must have ended: [`MARGIN`] before the deadline.
pub(crate) fn look_up_end(deadline: Option<Instant>) -> Option<Instant> {
    deadline.map(|d| d.checked_sub(MARGIN).unwrap_or(d))
}

/// The default look-up after an unknown `COMMIT`: `pg_xact_status` of the
/// attempt's transaction, on another connection of the pool.
///
/// A committed transaction's id is durable and never handed out again; an
/// id whose transaction never reached the disk is handed out again after
/// crash recovery or a failover. So when the server's life changed since
/// the id was read, `committed` may be another transaction's: the outcome
/// stays unknown. `aborted` and `in the future` mean not committed in
/// either case (a transaction that committed would still have its id);
/// `in progress` is looked at again.
pub(crate) async fn xact_status<T, E: From<SqlxError>>(
    pool: &PgPool,
    shared: &Shared<T>,
) -> Result<Option<T>, E> {
    let (xid, generation, deadline) = {
        let mut st = shared.state();
        match st.xid.clone() {
            // It wrote nothing: committed or not, its value stands.
            None => return Ok(st.pending.take()),
            Some(xid) => (xid, st.generation.clone(), st.call_deadline),
        }
    };
    // The last look-up ends this long before the deadline, so that the call
    // stops with the unknown outcome, not with the deadline.
    let end = look_up_end(deadline);
    // The last answer the server gave: when the deadline cuts a later
    // look-up short, that answer is still the best account of the outcome.
    let mut seen: Option<String> = None;
    loop {
        let query = sqlx_core::query_as::query_as(STATUS_AND_GENERATION)
            .bind(&xid)
            .fetch_one(pool);
        let answer: Result<(Option<String>, String), SqlxError> = match end {
            Some(end) => {
                let Ok(answer) = tokio::time::timeout_at(end.into(), query).await else {
                    let status = match seen {
                        Some(last) => {
                            format!("{last} when last asked, then no answer before the deadline")
                        }
                        None => "no answer before the deadline".to_owned(),
                    };
                    return Err(unresolved(&xid, &status).into());
                };
                answer
            }
            None => query.await,
        };
        let future = answer.as_ref().is_err_and(|e| {
            e.as_database_error()
                .and_then(DatabaseError::code)
                .is_some_and(|c| c == IN_THE_FUTURE)
        });
        if future {
            shared.state().pending = None;
            return Ok(None);
        }
        let last = match answer
            .as_ref()
            .map(|(s, g)| (s.as_deref(), *g == generation))
        {
            Ok((Some("committed"), true)) => return Ok(shared.state().pending.take()),
            Ok((Some("committed"), false)) => {
                return Err(unresolved(
                    &xid,
                    "'committed', but the server restarted or failed over since the id was \
                     read, and after that PostgreSQL may give the id of a transaction that \
                     never reached the disk to another one; a reconcile by the call's key \
                     can tell",
                )
                .into());
            }
            Ok((Some("aborted"), _)) => {
                shared.state().pending = None;
                return Ok(None);
            }
            Ok((Some(other), _)) => format!("'{other}'"),
            // Too old for the commit log: nobody can tell any more.
            Ok((None, _)) => return Err(unresolved(&xid, "no status (too old)").into()),
            Err(e) => format!("the look-up failed: {e}"),
        };
        if end.is_none_or(|end| retries_core::door::now() + LOOK_AGAIN >= end) {
            return Err(unresolved(&xid, &last).into());
        }
        if answer.is_ok() {
            seen = Some(last);
        }
        tokio::time::sleep(LOOK_AGAIN).await;
    }
}

/// The outcome of the `COMMIT` of transaction `xid` stayed unknown.
pub(crate) fn unresolved(xid: &str, status: &str) -> SqlxError {
    DoorError::sqlx(
        "40003",
        format!(
            "the COMMIT of transaction {xid} was sent and its reply lost; \
             its outcome is unknown (pg_xact_status: {status})"
        ),
    )
}

/// The outcome of a `COMMIT` stayed unknown, with no id to name (the
/// builder's `reconcile` looks by the call's key instead).
pub(crate) fn unknown_commit(why: &str) -> SqlxError {
    DoorError::sqlx(
        "40003",
        format!("the COMMIT was sent and its reply lost; its outcome is unknown ({why})"),
    )
}
