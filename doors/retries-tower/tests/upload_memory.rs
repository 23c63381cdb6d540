//! The memory of a large upload retried (issue 61): a file uploaded
//! through each HTTP door (`Reopen::file`) while the server cuts the
//! connection at a random point in the first two attempts, against the
//! same file uploaded once by the bare client, each in a process of its
//! own, compared by peak RSS (`VmHWM`). A door that held the body in
//! memory would exceed the bare upload by the file's size; the bound is
//! 32 MiB.
//!
//! Its own test binary (no test harness): it runs itself as the child
//! processes. The size is 64 MiB here (`RETRIES_UPLOAD_MIB` to change it);
//! the 1 GiB figures of `tests/bench/README.md` come from
//! `RETRIES_UPLOAD_MIB=1024 RETRIES_UPLOAD_ROUNDS=5 cargo test --release -p retries-tower --test upload_memory`
//! (with `RETRIES_UPLOAD_ROUNDS`, it also times uploads with no cut, bare
//! and through each door, interleaved).

#[path = "support/uploads.rs"]
mod support;

use std::process::Command;

use bytes::Bytes;
use http_body_util::Empty;
use retries_http::{Reopen, Replay, ReplayBody};
use support::{Uploads, write_file};

const CHILD: &str = "RETRIES_UPLOAD_CHILD";
const BOUND: u64 = 32 << 10; // KiB

#[allow(clippy::too_many_lines)] // the checks in order, then the timings
fn main() {
    if let Ok(mode) = std::env::var(CHILD) {
        let mut args = std::env::args().skip(1);
        let (url, path) = (args.next().expect("a URL"), args.next().expect("a path"));
        child(&mode, &url, &path);
        return;
    }
    let mib: u64 = std::env::var("RETRIES_UPLOAD_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let len = mib << 20;
    let path = std::env::temp_dir().join(format!("retries-upload-memory-{}", std::process::id()));
    write_file(&path, len);
    let seed = u64::from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(Uploads::start(seed));
    let mut failed = false;
    for door in ["reqwest", "tower"] {
        let plain = format!("{door}-plain");
        let retried = format!("{door}-door");
        let (plain_kib, plain_s) = run(
            &plain,
            &server.url(&format!("/file/{plain}?len={len}")),
            &path,
        );
        let (door_kib, door_s) = run(
            &retried,
            &server.url(&format!("/file/{retried}?len={len}&cuts=2")),
            &path,
        );
        let (p, d) = (server.record(&plain), server.record(&retried));
        let whole = p.completed == Some(len)
            && d.completed == Some(len)
            && p.bad.is_none()
            && d.bad.is_none()
            && p.attempts == 1
            && d.attempts == 3;
        let within = door_kib <= plain_kib + BOUND;
        println!(
            "upload_memory {door}: {mib} MiB; bare upload peak RSS {plain_kib} KiB ({plain_s:.2} s), \
             through the door with two cuts {door_kib} KiB ({door_s:.2} s, cut at {:?}); seed {seed} ... {}",
            d.cut_at,
            if whole && within { "ok" } else { "FAILED" }
        );
        if !whole {
            println!("  the server saw: bare {p:?}, door {d:?}");
        }
        failed |= !(whole && within);
    }
    // The control: the same upload copied as it is sent (a cap above the
    // file's size) holds the file in memory, and the measure says so.
    let (plain_kib, _) = run(
        "reqwest-plain",
        &server.url(&format!("/file/control-plain?len={len}")),
        &path,
    );
    let (copy_kib, _) = run(
        "reqwest-copy",
        &server.url(&format!("/file/control-copy?len={len}&cuts=2")),
        &path,
    );
    let copied = server.record("control-copy");
    let caught = copy_kib > plain_kib + BOUND && copied.completed == Some(len);
    println!(
        "upload_memory control: the body copied as it is sent peaks at {copy_kib} KiB against {plain_kib} KiB bare ... {}",
        if caught {
            "ok (over the bound, as it must be)"
        } else {
            "FAILED"
        }
    );
    failed |= !caught;
    // Throughput, when asked (`RETRIES_UPLOAD_ROUNDS`): uploads with no
    // cut, bare and through each door, interleaved; the median of each.
    let rounds: usize = std::env::var("RETRIES_UPLOAD_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for door in ["reqwest", "tower"] {
        if rounds == 0 {
            break;
        }
        let (mut bare, mut through) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            for (mode, times) in [("plain", &mut bare), ("door", &mut through)] {
                let name = format!("{door}-{mode}-{round}");
                let (_, seconds) = run(
                    &format!("{door}-{mode}"),
                    &server.url(&format!("/file/{name}?len={len}")),
                    &path,
                );
                failed |= server.record(&name).completed != Some(len);
                times.push(seconds);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (b, t) = (median(&mut bare), median(&mut through));
        println!(
            "upload_memory throughput {door}: {mib} MiB, median of {rounds}: bare {b:.3} s ({:.0} MiB/s), through the door {t:.3} s ({:.0} MiB/s): {:.3}x the bare time",
            mib as f64 / b,
            mib as f64 / t,
            t / b
        );
    }
    std::fs::remove_file(&path).unwrap();
    assert!(
        !failed,
        "an upload was not whole, or a door held more than {BOUND} KiB over the bare client"
    );
}

/// Run this binary as a child uploading `path` to `url` in `mode`: its
/// peak RSS in KiB, and the seconds the upload took.
fn run(mode: &str, url: &str, path: &std::path::Path) -> (u64, f64) {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, mode)
        .arg(url)
        .arg(path)
        .output()
        .expect("the child runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{mode} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |name: &str| {
        stdout
            .split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {stdout}"))
            .to_owned()
    };
    (
        field("peak_kib=").parse().unwrap(),
        field("seconds=").parse().unwrap(),
    )
}

fn child(mode: &str, url: &str, path: &str) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = rt.block_on(upload(mode, url, path));
    let seconds = t0.elapsed().as_secs_f64();
    assert_eq!(status, 200, "{mode}");
    let status_file = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let peak = status_file
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM");
    println!("peak_kib={peak} seconds={seconds}");
}

fn policy() -> retries::Policy {
    retries::Policy::new(std::time::Duration::from_mins(10))
        .with_max_attempts(4)
        .with_backoff(retries::Backoff::constant(
            std::time::Duration::from_millis(5),
        ))
}

/// The file as a body, read the way the doors read it, with no door.
async fn bare_body(path: &str) -> ReplayBody<Empty<Bytes>> {
    Replay::<Empty<Bytes>>::reopen(Reopen::file(path))
        .next()
        .await
        .expect("the file opens")
}

async fn upload(mode: &str, url: &str, path: &str) -> u16 {
    use tower::ServiceExt;
    match mode {
        "reqwest-plain" => {
            let body = reqwest::Body::wrap(bare_body(path).await);
            let response = reqwest::Client::new().put(url).body(body).send().await;
            response.expect("the bare upload").status().as_u16()
        }
        "reqwest-door" => {
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(retries_reqwest::RetryMiddleware::new(policy()))
                .build();
            let response = client
                .put(url)
                .with_extension(Reopen::file(path))
                .send()
                .await;
            response
                .expect("the upload through the middleware")
                .status()
                .as_u16()
        }
        "reqwest-copy" => {
            let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
                .with(retries_reqwest::RetryMiddleware::new(policy()))
                .build();
            let body = reqwest::Body::wrap(bare_body(path).await);
            let response = client
                .put(url)
                .body(body)
                .with_extension(retries_http::BodyCap(usize::MAX))
                .send()
                .await;
            response
                .expect("the upload copied as it is sent")
                .status()
                .as_u16()
        }
        "tower-plain" => {
            let client: hyper_util::client::legacy::Client<_, ReplayBody<Empty<Bytes>>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http();
            let request = http::Request::put(url).body(bare_body(path).await).unwrap();
            let response = client.request(request).await;
            response.expect("the bare upload").status().as_u16()
        }
        "tower-door" => {
            let client: hyper_util::client::legacy::Client<_, ReplayBody<Empty<Bytes>>> =
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .build_http();
            let mut request = http::Request::put(url).body(Empty::<Bytes>::new()).unwrap();
            request.extensions_mut().insert(Reopen::file(path));
            let layered = retries_tower::RetryLayer::new(policy()).layer(client);
            let response = layered.oneshot(request).await;
            response
                .expect("the upload through the layer")
                .status()
                .as_u16()
        }
        other => panic!("no mode {other}"),
    }
}
