//! Policies and budgets from configuration files (feature `serde`): TOML,
//! JSON and YAML with human durations, validated by the same rules as in
//! code, every error naming the field it is about.

use std::collections::BTreeMap;
use std::time::Duration;

use retries::{BackoffKind, Jitter, Policy, TokenBucket};

#[derive(Debug, serde::Deserialize)]
struct Downstreams {
    services: BTreeMap<String, Policy>,
    #[allow(dead_code)] // read to be validated
    budget: TokenBucket,
}

const TOML: &str = r#"
budget = { max_tokens = 10, token_ratio = 0.1 }

[services.inventory]
deadline = "2s"
max_attempts = 4
backoff = { kind = "exponential", initial = "50ms", max = "1s", multiplier = 3.0, jitter = "equal" }

[services.payments]
deadline = "1m30s"
attempt_timeout = "1.5s"
reserve = "200ms"
backoff = { kind = "grpc", initial = "100ms", max = "2s", multiplier = 1.5 }
"#;

fn check(d: &Downstreams) {
    let inv = &d.services["inventory"];
    assert_eq!(inv.deadline(), Duration::from_secs(2));
    assert_eq!(inv.max_attempts(), 4);
    let b = inv.backoff();
    assert_eq!(
        (b.kind(), b.initial(), b.max(), b.multiplier(), b.jitter()),
        (
            BackoffKind::Exponential,
            Duration::from_millis(50),
            Duration::from_secs(1),
            3.0,
            Jitter::Equal
        )
    );
    let pay = &d.services["payments"];
    assert_eq!(pay.deadline(), Duration::from_secs(90));
    assert_eq!(pay.attempt_timeout(), Some(Duration::from_millis(1500)));
    assert_eq!(pay.reserve(), Duration::from_millis(200));
    assert_eq!(pay.max_attempts(), 3, "the default where nothing is said");
    assert_eq!(pay.backoff().kind(), BackoffKind::Grpc);
}

#[test]
fn a_policy_per_downstream_from_toml_json_and_yaml() {
    let from_toml: Downstreams = toml::from_str(TOML).unwrap();
    check(&from_toml);
    let json = r#"{
        "budget": {"max_tokens": 10, "token_ratio": 0.1},
        "services": {
            "inventory": {"deadline": "2s", "max_attempts": 4,
                "backoff": {"kind": "exponential", "initial": "50ms", "max": "1s", "multiplier": 3.0, "jitter": "equal"}},
            "payments": {"deadline": "1m30s", "attempt_timeout": "1.5s", "reserve": "200ms",
                "backoff": {"kind": "grpc", "initial": "100ms", "max": "2s", "multiplier": 1.5}}
        }
    }"#;
    check(&serde_json::from_str(json).unwrap());
    let yaml = "
budget: {max_tokens: 10, token_ratio: 0.1}
services:
  inventory:
    deadline: 2s
    max_attempts: 4
    backoff: {kind: exponential, initial: 50ms, max: 1s, multiplier: 3.0, jitter: equal}
  payments:
    deadline: 1m30s
    attempt_timeout: 1.5s
    reserve: 200ms
    backoff: {kind: grpc, initial: 100ms, max: 2s, multiplier: 1.5}
";
    check(&serde_yaml_ng::from_str(yaml).unwrap());
}

#[test]
fn a_proportional_jitter_is_a_number() {
    let p: Policy =
        serde_json::from_str(r#"{"deadline": "1s", "backoff": {"jitter": 0.2}}"#).unwrap();
    assert_eq!(p.backoff().jitter(), Jitter::Proportional(0.2));
}

/// Each bad policy, and a fragment the error must contain (the field).
const BAD_POLICIES: &[(&str, &str)] = &[
    ("{}", "deadline"),
    (r#"{"deadline": "2x"}"#, "`deadline`"),
    (r#"{"deadline": "2"}"#, "`deadline`"),
    (r#"{"deadline": "-1s"}"#, "`deadline`"),
    (r#"{"deadline": ""}"#, "`deadline`"),
    (r#"{"deadline": "0s"}"#, "`deadline`"),
    (r#"{"deadline": "9999999999h"}"#, "`deadline`"),
    (r#"{"deadline": "1s", "max_attempts": 0}"#, "`max_attempts`"),
    (r#"{"deadline": "1s", "max_attempts": -1}"#, "max_attempts"),
    (r#"{"deadline": "1s", "max_attemps": 3}"#, "max_attemps"),
    (
        r#"{"deadline": "1s", "attempt_timeout": "0ms"}"#,
        "`attempt_timeout`",
    ),
    (
        r#"{"deadline": "1s", "attempt_timeout": "soon"}"#,
        "`attempt_timeout`",
    ),
    (r#"{"deadline": "1s", "reserve": "1s"}"#, "`reserve`"),
    (r#"{"deadline": "1s", "reserve": "2s"}"#, "`reserve`"),
    (
        r#"{"deadline": "1s", "min_attempt": "2s"}"#,
        "`min_attempt`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"kind": "fibonacci"}}"#,
        "`backoff.kind`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"initial": "1x"}}"#,
        "`backoff.initial`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"max": "1x"}}"#,
        "`backoff.max`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"initial": "2s", "max": "1s"}}"#,
        "`max_backoff`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"multiplier": 0.5}}"#,
        "`multiplier`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"jitter": 1.5}}"#,
        "`jitter`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"jitter": "some"}}"#,
        "`backoff.jitter`",
    ),
    (r#"{"deadline": "1s", "backoff": {"step": "1s"}}"#, "step"),
    (r#"{"deadline": 2}"#, "`deadline`"),
    (
        r#"{"deadline": "1s", "max_attempts": "three"}"#,
        "`max_attempts`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"multiplier": "2"}}"#,
        "`backoff.multiplier`",
    ),
    (
        r#"{"deadline": "1s", "backoff": {"jitter": true}}"#,
        "`backoff.jitter`",
    ),
];

#[test]
fn every_bad_policy_is_an_error_naming_its_field() {
    for (text, field) in BAD_POLICIES {
        let err = serde_json::from_str::<Policy>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{text}: {err}");
    }
    // TOML says where, too.
    let err = toml::from_str::<Downstreams>(
        "budget = { max_tokens = 10, token_ratio = 0.1 }\n[services.a]\ndeadline = \"2x\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`deadline`") && err.contains("services"),
        "{err}"
    );
}

#[test]
fn a_bad_budget_is_an_error_naming_its_field() {
    for (text, field) in [
        (r#"{"max_tokens": 0, "token_ratio": 0.1}"#, "`max_tokens`"),
        (
            r#"{"max_tokens": 1001, "token_ratio": 0.1}"#,
            "`max_tokens`",
        ),
        (r#"{"max_tokens": 10, "token_ratio": 0}"#, "`token_ratio`"),
        (
            r#"{"max_tokens": 10, "token_ratio": 0.0004}"#,
            "`token_ratio`",
        ),
        (r#"{"max_tokens": 10}"#, "token_ratio"),
        (
            r#"{"max_tokens": 10, "token_ratio": 0.1, "burst": 3}"#,
            "burst",
        ),
        (r#"{"max_tokens": -1, "token_ratio": 0.1}"#, "`max_tokens`"),
    ] {
        let err = serde_json::from_str::<TokenBucket>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{text}: {err}");
    }
}
