//! Untrusted HTTP header text never panics a parser (issue #11, defect 3), and
//! `reqwest::Error` is recognised inside an error's source chain (defect 4).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, header::RETRY_AFTER};
use proptest::prelude::*;
use retries::http::retry_after_at;
use retries::{VerdictKind, classify_chain};

fn headers(values: &[HeaderValue]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(RETRY_AFTER, v.clone());
    }
    h
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn retry_after_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..40), secs in any::<u32>()) {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::from(secs));
        if let Ok(v) = HeaderValue::from_bytes(&bytes) {
            let parsed = retry_after_at(&headers(&[v]), now);
            // delta-seconds are read exactly; anything else is a date or nothing
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let t = text.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    prop_assert_eq!(parsed, t.parse::<u64>().ok().map(Duration::from_secs));
                }
            }
        }
    }

    #[test]
    fn retry_after_takes_any_utf8(text in any::<String>()) {
        if let Ok(v) = HeaderValue::from_str(&text) {
            let _ = retry_after_at(&headers(std::slice::from_ref(&v)), SystemTime::now());
            // Given twice, the value is ambiguous and ignored.
            prop_assert_eq!(retry_after_at(&headers(&[v.clone(), v]), SystemTime::now()), None);
        }
    }

    #[test]
    fn retry_after_takes_near_valid_text(text in "[ ]?[0-9]{0,25}[ ]?|(Mon|Sun|Xyz), [0-9]{1,2} (Jan|Feb|Foo) [0-9]{1,5} [0-9]{2}:[0-9]{2}:[0-9]{2} (GMT|UTC|µ)") {
        let v = HeaderValue::from_str(&text).unwrap();
        let _ = retry_after_at(&headers(&[v]), SystemTime::now());
    }
}

#[derive(Debug, thiserror::Error)]
#[error("fetching the price list")]
struct Fetching(#[source] reqwest::Error);

#[tokio::test]
async fn classify_chain_finds_a_reqwest_error_behind_a_wrapper() {
    // A real refused connection on loopback: nothing listens on the port of a
    // listener that was just closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/"))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect());
    let v = classify_chain(&Fetching(err)).unwrap();
    assert_eq!(v.kind(), VerdictKind::NotExecuted);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    /// The wire deadline parsers take any bytes: a value is 1–10 digits or
    /// nothing, never more than a day, never a panic.
    #[test]
    fn wire_deadlines_take_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
        if let Ok(v) = HeaderValue::from_bytes(&bytes) {
            let mut h = HeaderMap::new();
            h.insert(retries::wire::TIMEOUT_MS, v.clone());
            h.insert(retries::wire::ENVOY_TIMEOUT_MS, v.clone());
            h.insert("grpc-timeout", v);
            if let Some(d) = retries::wire::incoming_timeout(&h) {
                prop_assert!(d <= retries::wire::MAX_WIRE_TIMEOUT);
            }
            if let Ok(text) = std::str::from_utf8(&bytes) {
                let t = text.trim();
                let digits = !t.is_empty() && t.len() <= 10 && t.bytes().all(|b| b.is_ascii_digit());
                prop_assert_eq!(retries::wire::parse_timeout_ms(text).is_some(), digits);
            }
        }
    }
}
