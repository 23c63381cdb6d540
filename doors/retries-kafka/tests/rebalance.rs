//! Rebalances while retry partitions are paused, against a real broker
//! (tansu, on loopback): three consumers of one group join, one (a separate
//! process) is killed with `SIGKILL`, one leaves; the one that stays ends
//! only when asked, and every record is handled by someone. Ten runs, five
//! at a time.

// Scenario tests read top to bottom: long, with their constants where used.
#![allow(clippy::too_many_lines)]

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{HandlerError, in_process, produce, wait_for};
use retries::Attempt;
use retries_kafka::broker::Broker;
use retries_kafka::{Record, RetryTopics, Topics};

const N: usize = 160;
const RUNS: usize = 10;

/// The indices whose effect the killed process applied (its effect file).
fn applied_by_process(file: &str) -> BTreeSet<usize> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            (w.next()? == "applied").then_some(())?;
            w.nth(1)?.parse().ok()
        })
        .collect()
}

/// A runner of the group, in this process: it handles as the killed process
/// does (`i:fail0` fails at level 0) and writes down what it handled.
fn runner(broker: &Broker, topics: &Topics, name: &str) -> RetryTopics {
    RetryTopics::new(&broker.address(), "shared-app", topics.clone())
        .consumer_setting("client.id", name)
        .policy(in_process())
        .consumer_setting("session.timeout.ms", "6000")
        .consumer_setting("heartbeat.interval.ms", "1000")
        // The rebalance timeout: how long the broker waits for a member
        // (the killed one) to rejoin (300 s by default).
        .consumer_setting("max.poll.interval.ms", "10000")
}

fn handler(
    handled: &Arc<Mutex<BTreeSet<usize>>>,
) -> impl AsyncFn(&Record, &Attempt) -> Result<(), HandlerError> {
    let handled = Arc::clone(handled);
    async move |r: &Record, _: &Attempt| {
        let p = String::from_utf8_lossy(r.payload().unwrap_or_default()).into_owned();
        let (index, kind) = p.split_once(':').expect("i:kind");
        if kind == "fail0" && r.level() == 0 {
            return Err(HandlerError::Refused);
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
        handled
            .lock()
            .unwrap()
            .insert(index.parse().expect("an index"));
        Ok(())
    }
}

async fn one_run(run: usize) {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    // Retry copies wait 1 s: their partitions are paused through the
    // rebalances.
    let topics = Topics::new("shared", &[Duration::from_secs(1)]);
    broker.create_topics(&topics.all(), 4).await.unwrap();
    let records: Vec<String> = (0..N)
        .map(|i| {
            if i % 6 == 0 {
                format!("{i}:fail0")
            } else {
                format!("{i}:ok")
            }
        })
        .collect();
    produce(&broker, topics.main(), &records).await;
    let dir = std::env::temp_dir().join(format!("retries-rebalance-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir
        .join(format!("effects-{run}.txt"))
        .to_string_lossy()
        .into_owned();
    let _ = std::fs::remove_file(&file);

    let handled = Arc::new(Mutex::new(BTreeSet::new()));
    let everyone = {
        let (handled, file) = (Arc::clone(&handled), file.clone());
        move || {
            let mut all = handled.lock().unwrap().clone();
            all.extend(applied_by_process(&file));
            all
        }
    };
    let stays = runner(&broker, &topics, "stays");
    let leaves = runner(&broker, &topics, "leaves");
    let left = Arc::new(AtomicBool::new(false));
    let mut process = Command::new(env!("CARGO_BIN_EXE_kill_consumer"))
        .args([
            broker.address().as_str(),
            "shared-app",
            "shared",
            &file,
            "--delay-ms",
            "1000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let killed = Arc::new(AtomicBool::new(false));
    let (all, l, k) = (everyone.clone(), Arc::clone(&left), Arc::clone(&killed));
    let stayed = stays.run(handler(&handled), async move {
        // The process is killed once some records are handled, while its
        // partitions (retry ones among them) are in use.
        wait_for(Duration::from_mins(1), || all().len() >= N / 4).await;
        process.kill().unwrap();
        process.wait().unwrap();
        k.store(true, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        while !(l.load(Ordering::SeqCst) && all().len() == N) {
            let have = all();
            let lost: Vec<usize> = (0..N).filter(|i| !have.contains(i)).collect();
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "run {run}: not all handled within 90 s; never handled: {lost:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let l = Arc::clone(&left);
    let went = leaves.run(handler(&handled), async move {
        // It leaves once the killed member's session (6 s) has expired:
        // tansu 0.6.0 hands a member's partitions on only at the next join
        // or leave after its session expired (see `broker`).
        wait_for(Duration::from_mins(1), || killed.load(Ordering::SeqCst)).await;
        tokio::time::sleep(Duration::from_secs(7)).await;
        l.store(true, Ordering::SeqCst);
    });
    let (stayed, went) = tokio::join!(stayed, went);
    stayed.unwrap_or_else(|e| panic!("run {run}: the consumer that stays ended: {e}"));
    went.unwrap_or_else(|e| panic!("run {run}: the consumer that leaves failed: {e}"));
    let all = everyone();
    let lost: Vec<usize> = (0..N).filter(|i| !all.contains(i)).collect();
    assert!(lost.is_empty(), "run {run}: lost {lost:?}");
    let _ = std::fs::remove_file(&file);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn consumers_join_die_and_leave_while_retries_are_paused_and_nothing_is_lost() {
    // Five runs at a time, each with a broker of its own: a run waits on
    // sessions and timers more than it works (about 15 s each).
    for batch in (0..RUNS).collect::<Vec<_>>().chunks(5) {
        futures_util::future::join_all(batch.iter().map(|&run| one_run(run))).await;
    }
}
