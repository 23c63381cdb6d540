//! Test support only (for `tests/kill.rs`): a consumer process that a test
//! kills with `SIGKILL` between a republish and its commit, then starts
//! again. Its handler records each effect once in a file, by the record's
//! idempotency key (a second copy is written down as a duplicate, not
//! applied again).
//!
//! `kill_consumer BROKERS GROUP TOPIC EFFECT_FILE [--hang-after-republish]
//! [--delay-ms N] [--session-ms N] [--handler-ms N]`:
//! records `i:fail0` fail at level 0 and succeed at level 1, the rest
//! succeed at once. With the flag, the process prints `REPUBLISHED` after the
//! first republish is acknowledged and hangs before committing.

use std::io::Write;
use std::time::Duration;

use retries::{Attempt, Backoff, Classify, Policy, Verdict};
use retries_kafka::{Record, RetryTopics, Topics};

#[derive(Debug, thiserror::Error)]
#[error("downstream refused")]
struct Refused;

impl Classify for Refused {
    fn classify(&self) -> Verdict {
        Verdict::not_executed()
    }
}

/// Apply the record's effect once: `applied KEY INDEX`, or `duplicate KEY INDEX`.
fn apply(file: &str, r: &Record) -> std::io::Result<()> {
    let key = r.idempotency_key().to_string();
    let index = String::from_utf8_lossy(r.payload().unwrap_or_default())
        .split(':')
        .next()
        .unwrap_or_default()
        .to_owned();
    let seen = std::fs::read_to_string(file).unwrap_or_default();
    let already = seen
        .lines()
        .any(|l| l.starts_with("applied ") && l.contains(&key));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let verb = if already { "duplicate" } else { "applied" };
    // One `write` of the whole line: a kill cannot leave half of it.
    f.write_all(format!("{verb} {key} {index}\n").as_bytes())?;
    f.sync_all()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (brokers, group, topic, file) = (&args[1], &args[2], &args[3], args[4].clone());
    let hang = args.iter().any(|a| a == "--hang-after-republish");
    // `--delay-ms N`: the retry level's delay (100 ms by default).
    let delay = args
        .iter()
        .position(|a| a == "--delay-ms")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // `--session-ms N`: the group session (6,000 ms by default).
    let session: u64 = args
        .iter()
        .position(|a| a == "--session-ms")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(6000);
    // `--handler-ms N`: each call takes this long before its effect (0 by
    // default).
    let pace: u64 = args
        .iter()
        .position(|a| a == "--handler-ms")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let topics = Topics::new(topic, &[Duration::from_millis(delay)]);
    let retry0 = topics.level(0).unwrap_or_default().to_owned();
    // A short session, so the restarted process is not kept waiting for the
    // killed one's membership to expire (45 s by default).
    let runner = RetryTopics::new(brokers, group, topics)
        .consumer_setting("session.timeout.ms", &session.to_string())
        .consumer_setting("heartbeat.interval.ms", &(session / 6).max(100).to_string())
        .consumer_setting("max.poll.interval.ms", "10000")
        .policy(
            Policy::new(Duration::from_secs(1))
                .with_max_attempts(2)
                .with_backoff(Backoff::constant(Duration::ZERO)),
        )
        .after_republish(move |_, to| {
            if hang && to == retry0 {
                println!("REPUBLISHED");
                let _ = std::io::stdout().flush();
                // Frozen before the commit, until the test kills the process.
                std::thread::sleep(Duration::from_mins(2));
            }
        });
    let handler = async |r: &Record, _: &Attempt| -> Result<(), Refused> {
        let fails_first = r.payload().is_some_and(|p| p.ends_with(b":fail0"));
        if fails_first && r.level() == 0 {
            return Err(Refused);
        }
        if pace > 0 {
            tokio::time::sleep(Duration::from_millis(pace)).await;
        }
        apply(&file, r).map_err(|_| Refused)
    };
    runner.run(handler, std::future::pending()).await?;
    Ok(())
}
