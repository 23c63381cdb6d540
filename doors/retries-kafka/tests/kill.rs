//! A consumer process killed (`SIGKILL`) after republishing a record and
//! before committing it, then started again, against a real broker: nothing
//! is lost; the record is republished twice (at least once, as the commit
//! never happened), both copies carry the same idempotency key, and the
//! handler applies its effect once. Records finished just before the kill
//! whose batch of offsets was not committed yet come again too (each once,
//! deduplicated by its key).

mod common;

const N: usize = 20;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{produce, read_all};
use retries_kafka::Topics;
use retries_kafka::broker::Broker;

fn consumer(broker: &Broker, file: &str, hang: bool) -> std::process::Child {
    consumer_of(broker, "jobs", file, hang, &[])
}

fn consumer_of(
    broker: &Broker,
    topic: &str,
    file: &str,
    hang: bool,
    extra: &[&str],
) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kill_consumer"));
    let group = format!("{topic}-app");
    cmd.args([broker.address().as_str(), group.as_str(), topic, file]);
    cmd.args(extra);
    if hang {
        cmd.arg("--hang-after-republish");
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// A consumer process killed when dropped: a failed assertion leaves no
/// process behind.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lines(file: &str) -> Vec<(String, String, String)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut w = l.split(' ').map(str::to_owned);
            (w.next().unwrap(), w.next().unwrap(), w.next().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn a_consumer_killed_between_republish_and_commit_loses_nothing() {
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("jobs", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 1).await.unwrap();
    let payloads: Vec<String> = (0..N)
        .map(|i| {
            if i == 5 {
                "5:fail0".into()
            } else {
                format!("{i}:ok")
            }
        })
        .collect();
    produce(&broker, topics.main(), &payloads).await;
    let dir = std::env::temp_dir().join(format!("retries-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("effects.txt").to_string_lossy().into_owned();
    let _ = std::fs::remove_file(&file);

    // The first process: it republishes record 5, then is killed before the commit.
    let mut first = consumer(&broker, &file, true);
    let mut out = BufReader::new(first.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "REPUBLISHED");
    first.kill().unwrap(); // SIGKILL
    first.wait().unwrap();
    let before = lines(&file);
    assert_eq!(
        before.len(),
        5,
        "records 0 to 4 applied before the kill: {before:?}"
    );

    // The second process picks up from the committed offset.
    let mut second = consumer(&broker, &file, false);
    let t0 = Instant::now();
    loop {
        let l = lines(&file);
        let applied = l.iter().filter(|(v, _, _)| v == "applied").count();
        let dup = l.iter().any(|(v, _, _)| v == "duplicate");
        if applied == N && dup {
            break;
        }
        assert!(t0.elapsed() < Duration::from_mins(1), "not done: {l:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await; // nothing more should come
    second.kill().unwrap();
    second.wait().unwrap();

    let l = lines(&file);
    let mut applied: Vec<usize> = l
        .iter()
        .filter(|(v, _, _)| v == "applied")
        .map(|(_, _, i)| i.parse().unwrap())
        .collect();
    applied.sort_unstable();
    assert_eq!(
        applied,
        (0..N).collect::<Vec<_>>(),
        "every record's effect once: none lost, none twice"
    );
    // Offsets are committed in batches, one commit in flight at a time: the
    // records finished just before the kill may not be committed yet, and
    // come again (at least once). Only those: records 0 to 5, each at most
    // once more, record 5 (in flight at the kill) among them.
    let dups: Vec<_> = l.iter().filter(|(v, _, _)| v == "duplicate").collect();
    let again: Vec<usize> = dups.iter().map(|d| d.2.parse().unwrap()).collect();
    assert!(
        again.contains(&5),
        "the record in flight came again: {dups:?}"
    );
    assert!(
        again.iter().all(|&i| i <= 5),
        "only records before the kill: {dups:?}"
    );
    let distinct: std::collections::BTreeSet<_> = again.iter().collect();
    assert_eq!(
        distinct.len(),
        again.len(),
        "each at most once more: {dups:?}"
    );
    let fifth = dups.iter().find(|d| d.2 == "5").unwrap();
    // Two copies in the retry topic, one key.
    let copies = read_all(&broker, topics.level(0).unwrap(), Duration::from_secs(1)).await;
    assert_eq!(copies.len(), 2);
    let key = |c: &(String, Vec<(String, String)>)| {
        c.1.iter()
            .find(|(k, _)| k == "retries-key")
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(key(&copies[0]), key(&copies[1]));
    assert_eq!(key(&copies[0]), fifth.1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ten `SIGKILL`s at random moments (a seeded pick of 0 to 400 ms after
/// the process applied its first effect since it started) of a consumer
/// handling 1,200 records over 4 partitions (10 ms a call), each restarted
/// once the killed one's session has expired: every
/// record's effect is applied, and the records that come again after each
/// kill (each a `duplicate`, with the key of its first copy) are at most
/// what was in flight (one record a partition: 4) plus one commit's worth
/// of finished records: the records finished during one commit's round
/// trip, bounded here by `PER_KILL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    no_kafka_broker,
    ignore = "needs the Kafka test broker, tansu 0.6.0 (see retries_kafka::broker::INSTALL)"
)]
async fn ten_kills_at_random_moments_repeat_at_most_a_commits_worth_each() {
    const RECORDS: usize = 1200;
    const KILLS: usize = 10;
    /// In flight (4) plus one commit's worth at this handler's pace (at
    /// most 400 calls a second: a few in a commit's round trip on an idle
    /// machine), with room for a busy one.
    const PER_KILL: usize = 4 + 36;
    let Some(broker) = Broker::for_tests() else {
        return;
    };
    let topics = Topics::new("soak", &[Duration::from_millis(100)]);
    broker.create_topics(&topics.all(), 4).await.unwrap();
    let payloads: Vec<String> = (0..RECORDS).map(|i| format!("{i}:ok")).collect();
    produce(&broker, topics.main(), &payloads).await;
    let dir = std::env::temp_dir().join(format!("retries-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("effects.txt").to_string_lossy().into_owned();
    let _ = std::fs::remove_file(&file);
    let session = ["--session-ms", "1200", "--handler-ms", "10"];
    let mut seed: u64 = 0x5eed_0001;
    let mut after_kill = Vec::new();
    for kill in 0..KILLS {
        let before = lines(&file).len();
        let mut process = KillOnDrop(consumer_of(&broker, "soak", &file, false, &session));
        let t0 = Instant::now();
        while lines(&file).len() == before {
            assert!(
                t0.elapsed() < Duration::from_mins(1),
                "kill {kill}: no progress"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        tokio::time::sleep(Duration::from_millis((seed >> 33) % 400)).await;
        process.0.kill().unwrap(); // SIGKILL
        process.0.wait().unwrap();
        after_kill.push(lines(&file).len());
        // The next process joins once the killed one's session (1.2 s) has
        // expired: tansu 0.6.0 hands a member's partitions on only at a join
        // or leave after its session expired (see `broker`).
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    // The last one runs until every record's effect is applied.
    let last = KillOnDrop(consumer_of(&broker, "soak", &file, false, &session));
    let t0 = Instant::now();
    loop {
        let applied = lines(&file)
            .iter()
            .filter(|(v, _, _)| v == "applied")
            .count();
        if applied == RECORDS {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_mins(2),
            "{applied} of {RECORDS} applied"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(last);

    let l = lines(&file);
    let mut keys = std::collections::HashMap::new();
    for (verb, key, index) in &l {
        if verb == "applied" {
            assert!(
                keys.insert(index.clone(), key.clone()).is_none(),
                "{index} applied twice"
            );
        }
    }
    assert_eq!(keys.len(), RECORDS, "every record's effect");
    // The duplicates in what each restarted process wrote: what the one
    // killed before it had finished but not committed. (Partitions run
    // concurrently, so they mix with its new effects.)
    let mut bounds = after_kill.clone();
    bounds.push(l.len());
    let duplicates: Vec<usize> = bounds
        .windows(2)
        .map(|w| {
            l[w[0]..w[1]]
                .iter()
                .filter(|(verb, _, _)| verb == "duplicate")
                .count()
        })
        .collect();
    eprintln!("lines after each kill: {after_kill:?}; duplicates after each: {duplicates:?}");
    for (verb, key, index) in &l {
        if verb == "duplicate" {
            assert_eq!(
                keys.get(index),
                Some(key),
                "a duplicate has its first copy's key"
            );
        }
    }
    let total = l.iter().filter(|(v, _, _)| v == "duplicate").count();
    assert_eq!(
        total,
        duplicates.iter().sum::<usize>(),
        "duplicates only after kills"
    );
    assert!(
        duplicates.iter().all(|&d| d <= PER_KILL),
        "at most {PER_KILL} a kill: {duplicates:?}"
    );
}
