//! Untrusted gRPC header text never panics a parser (issue #11, defect 3),
//! and `tonic::Status` is recognised inside an error's source chain (defect 4).

use std::time::Duration;

use proptest::prelude::*;
use retries::tonic::{Pushback, pushback};

use retries::wire::parse_grpc_timeout;
use retries::{Classify, VerdictKind, classify_chain};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

#[test]
fn grpc_timeout_with_non_ascii_text_is_malformed_not_a_panic() {
    for bad in [
        "1µ", "5秒", "é", "1😀", "😀", "µS", "1\u{301}", "１S", "1Ｓ",
    ] {
        assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
    }
    assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
    assert_eq!(
        parse_grpc_timeout("99999999H"),
        Some(Duration::from_hours(99_999_999))
    );
}

fn with_pushback(code: Code, raw: &[u8]) -> Option<Status> {
    let value = MetadataValue::try_from(raw).ok()?;
    let mut status = Status::new(code, "busy");
    status
        .metadata_mut()
        .insert("grpc-retry-pushback-ms", value);
    Some(status)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    #[test]
    fn grpc_timeout_parser_takes_any_utf8(text in any::<String>()) {
        if let Some(d) = parse_grpc_timeout(&text) {
            // Whatever it accepts is digits and a unit, and means what it says.
            let (digits, unit) = text.split_at(text.len() - 1);
            prop_assert!(digits.bytes().all(|b| b.is_ascii_digit()) && digits.len() <= 8);
            let n: u64 = digits.parse().unwrap();
            let expected = match unit {
                "H" => Duration::from_secs(n * 3600),
                "M" => Duration::from_secs(n * 60),
                "S" => Duration::from_secs(n),
                "m" => Duration::from_millis(n),
                "u" => Duration::from_micros(n),
                _ => Duration::from_nanos(n),
            };
            prop_assert_eq!(d, expected);
        }
    }

    #[test]
    fn grpc_timeout_parser_takes_near_valid_text(text in "[0-9]{0,10}[HMSmun\u{b5}\u{79d2}\u{e9}\u{1f600}xS]{0,2}") {
        let parsed = parse_grpc_timeout(&text);
        let b = text.as_bytes();
        let well_formed = (2..=9).contains(&b.len())
            && b[..b.len() - 1].iter().all(u8::is_ascii_digit)
            && b"HMSmun".contains(&b[b.len() - 1]);
        prop_assert_eq!(parsed.is_some(), well_formed, "{:?}", text);
    }

    #[test]
    fn grpc_timeout_parser_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..16)) {
        let _ = parse_grpc_timeout(&String::from_utf8_lossy(&bytes));
        if let Ok(text) = std::str::from_utf8(&bytes) {
            let _ = parse_grpc_timeout(text);
        }
    }

    #[test]
    fn pushback_parser_takes_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
        if let Some(status) = with_pushback(Code::ResourceExhausted, &bytes) {
            let p = pushback(&status);
            let digits = std::str::from_utf8(&bytes).ok().map(str::trim).filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()));
            let expected = digits
                .and_then(|t| t.parse::<u64>().ok())
                .map_or(Pushback::Stop, |ms| Pushback::Pause(Duration::from_millis(ms)));
            prop_assert_eq!(p, expected);
            let _ = status.classify();
        }
    }

    #[test]
    fn pushback_parser_takes_any_utf8(text in any::<String>()) {
        if let Some(status) = with_pushback(Code::Unavailable, text.as_bytes()) {
            let _ = pushback(&status);
            let _ = status.classify();
        }
    }
}

/// A wrapper error, as applications write them, around a cause.
#[derive(Debug, thiserror::Error)]
#[error("charging the card")]
struct Charging(#[source] Status);

#[test]
fn classify_chain_finds_a_status_behind_a_wrapper() {
    let status = with_pushback(Code::ResourceExhausted, b"250").unwrap();
    let v = classify_chain(&Charging(status)).unwrap();
    assert_eq!(v.kind(), VerdictKind::NotExecuted);
    assert_eq!(v.retry_after(), Some(Duration::from_millis(250)));
}

#[test]
fn an_io_error_wrapping_a_status_is_classified_by_the_status() {
    let e = std::io::Error::other(Status::unavailable("replica went away"));
    assert_eq!(classify_chain(&e).unwrap().kind(), VerdictKind::Unknown);
    assert_eq!(e.classify().kind(), VerdictKind::Unknown);
    let boxed: Box<dyn std::error::Error + Send + Sync> =
        Box::new(Charging(Status::unavailable("")));
    assert_eq!(boxed.classify().kind(), VerdictKind::Unknown);
}
