//! The quota fields as servers send them, and as attackers do: exact cases,
//! then properties over generated and arbitrary input (proptest).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

use super::*;

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

fn at(unix: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix)
}

#[test]
fn the_drafts_fields_joined_by_policy_name() {
    let h = headers(&[
        ("ratelimit", r#""a";r=0;t=10"#),
        ("ratelimit", r#""b";r=100;t=5;pk=:dGVuYW50LTE=:"#),
        (
            "ratelimit-policy",
            r#""a";q=50;w=10, "b";q=1000;w=60;qu="requests""#,
        ),
    ]);
    let q = announced(&h, SystemTime::now()).unwrap();
    // `a` has nothing left for 10 s: the tightest (spacing 10 s, not 50 ms).
    assert_eq!(q.policy.as_deref(), Some("a"));
    assert_eq!(
        (q.remaining, q.reset, q.limit),
        (0, Duration::from_secs(10), Some(50))
    );
    assert_eq!(q.spacing(), Duration::from_secs(10));
    let all = parse_rate_limit(br#""b";r=100;t=5;pk=:dGVuYW50LTE=:"#).unwrap();
    assert_eq!(all[0].partition.as_deref(), Some(&b"tenant-1"[..]));
    let p = parse_rate_limit_policy(br#""b";q=1000;w=60;qu="requests""#).unwrap();
    assert_eq!(p[0].unit.as_deref(), Some("requests"));
}

#[test]
fn a_member_without_t_takes_its_policys_window() {
    let h = headers(&[
        ("ratelimit", r#""w";r=4"#),
        ("ratelimit-policy", r#""w";q=8;w=2"#),
    ]);
    let q = announced(&h, SystemTime::now()).unwrap();
    assert_eq!(
        (q.reset, q.spacing()),
        (Duration::from_secs(2), Duration::from_millis(500))
    );
}

#[test]
fn x_ratelimit_reset_as_seconds_or_as_a_unix_time() {
    let now = 1_800_000_000;
    let delay = headers(&[("x-ratelimit-remaining", "9"), ("x-ratelimit-reset", "60")]);
    let q = announced(&delay, at(now)).unwrap();
    assert_eq!((q.remaining, q.reset), (9, Duration::from_mins(1)));
    let epoch = headers(&[
        ("x-ratelimit-remaining", "9"),
        ("x-ratelimit-reset", &(now + 45).to_string()),
        ("x-ratelimit-limit", "60"),
    ]);
    let q = announced(&epoch, at(now)).unwrap();
    assert_eq!((q.reset, q.limit), (Duration::from_secs(45), Some(60)));
    // A fraction of a second to the millisecond (a finer one rounded up),
    // as a delay or a Unix time; a fraction of a count dropped.
    for (remaining, reset, want) in [
        ("1", "0.25", (1, 250)),
        ("2.9", "0.2501", (2, 251)),
        ("3", "1.9999", (3, 2000)),
        ("4", &format!("{}.125", now + 1) as &str, (4, 1125)),
    ] {
        let frac = headers(&[
            ("x-ratelimit-remaining", remaining),
            ("x-ratelimit-reset", reset),
        ]);
        let q = announced(&frac, at(now)).unwrap();
        assert_eq!(
            (q.remaining, q.reset),
            (want.0, Duration::from_millis(want.1)),
            "{reset}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn heard_announces_to_the_pace() {
    let pace = retries_core::limit::Pace::new();
    let now = retries_core::door::now();
    // No quota field: nothing announced.
    heard(&pace, &headers(&[("retry-after", "3")]), now);
    assert_eq!(pace.window(now), None);
    heard(
        &pace,
        &headers(&[
            ("ratelimit", r#""s";r=3;t=2"#),
            ("ratelimit-policy", r#""s";q=10;w=2"#),
        ]),
        now,
    );
    assert_eq!(pace.window(now), Some((now + Duration::from_secs(2), 3)));
    // A hostile field is ignored: the window stands.
    heard(&pace, &headers(&[("ratelimit", r#""s";r=-1;t=2"#)]), now);
    assert_eq!(pace.window(now), Some((now + Duration::from_secs(2), 3)));
}

#[test]
fn hostile_and_absurd_values_are_ignored() {
    let now = at(1_800_000_000);
    for pairs in [
        vec![("ratelimit", r#""a";r=-1;t=10"#)],
        vec![("ratelimit", r#""a";r=5;t=-10"#)],
        vec![("ratelimit", r#""a";r=5;t=999999999"#)],
        vec![("ratelimit", r#""a";t=10"#)],
        vec![("ratelimit", r#""a";r="five";t=10"#)],
        vec![("ratelimit", r#""a";r=5;t=10,"#)],
        vec![("x-ratelimit-remaining", "-3"), ("x-ratelimit-reset", "10")],
        vec![
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1700000000"),
        ],
        vec![
            ("x-ratelimit-remaining", "3"),
            ("x-ratelimit-reset", "1900000000"),
        ],
        vec![("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "1e9")],
        vec![("x-ratelimit-remaining", "3"), ("x-ratelimit-reset", "")],
        vec![
            ("x-ratelimit-remaining", "99999999999999999999"),
            ("x-ratelimit-reset", "1"),
        ],
        vec![("x-ratelimit-remaining", "3")],
    ] {
        assert_eq!(announced(&headers(&pairs), now), None, "{pairs:?}");
    }
    // An unparsable `RateLimit` falls back to the `X-` fields.
    let both = headers(&[
        ("ratelimit", "not a list;;"),
        ("x-ratelimit-remaining", "2"),
        ("x-ratelimit-reset", "4"),
    ]);
    assert_eq!(announced(&both, now).unwrap().source, Source::XRateLimit);
    for bad in ["-1", "1.5", "", "9999999999999", "0x10"] {
        let h = headers(&[("x-amz-retry-after", bad)]);
        assert_eq!(amz_retry_after(&h), None, "{bad:?}");
    }
    assert_eq!(amz_retry_after(&HeaderMap::new()), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Any bytes at all: an answer or an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_rate_limit(&bytes);
        let _ = parse_rate_limit_policy(&bytes);
        if let Ok(v) = HeaderValue::from_bytes(&bytes) {
            let mut h = HeaderMap::new();
            h.insert("ratelimit", v.clone());
            h.insert("ratelimit-policy", v.clone());
            h.insert("x-ratelimit-remaining", v.clone());
            h.insert("x-ratelimit-reset", v.clone());
            h.insert("x-amz-retry-after", v);
            if let Some(q) = announced(&h, SystemTime::now()) {
                prop_assert!(q.reset <= MAX_RESET);
                prop_assert!(q.spacing() <= q.reset);
            }
            if let Some(d) = amz_retry_after(&h) {
                prop_assert!(d <= MAX_RESET);
            }
        }
    }

    /// Text shaped like the fields, mutated: the same.
    #[test]
    fn near_misses_never_panic(
        text in r#"[ "a-z0-9;=,:*.?@%()\\-]{0,80}"#,
    ) {
        let _ = parse_rate_limit(text.as_bytes());
        let _ = parse_rate_limit_policy(text.as_bytes());
    }

    /// Well-formed members read back exactly, and the tightest is chosen.
    #[test]
    fn well_formed_members_read_back(
        members in proptest::collection::vec((0u64..=1_000_000_000_000_000, 0u64..=86_400), 1..8),
    ) {
        let field = members
            .iter()
            .enumerate()
            .map(|(i, (r, t))| format!("\"p{i}\";r={r};t={t}"))
            .collect::<Vec<_>>()
            .join(", ");
        let read = parse_rate_limit(field.as_bytes()).unwrap();
        prop_assert_eq!(read.len(), members.len());
        for (q, (r, t)) in read.iter().zip(&members) {
            prop_assert_eq!(q.remaining, *r);
            prop_assert_eq!(q.reset, Duration::from_secs(*t));
        }
        let mut h = HeaderMap::new();
        h.insert("ratelimit", HeaderValue::from_str(&field).unwrap());
        let q = announced(&h, SystemTime::now()).unwrap();
        prop_assert_eq!(Some(q.spacing()), read.iter().map(Quota::spacing).max());
    }

    /// `X-RateLimit-Reset` as a delay or as a Unix time gives the same reset.
    #[test]
    fn a_delay_and_its_unix_time_agree(now in 1_000_000_000u64..4_000_000_000, delay in 0u64..=86_400) {
        let as_delay = headers(&[("x-ratelimit-remaining", "1"), ("x-ratelimit-reset", &delay.to_string())]);
        let as_time = headers(&[("x-ratelimit-remaining", "1"), ("x-ratelimit-reset", &(now + delay).to_string())]);
        let a = announced(&as_delay, at(now)).map(|q| q.reset);
        let b = announced(&as_time, at(now)).map(|q| q.reset);
        prop_assert_eq!(a, Some(Duration::from_secs(delay)));
        prop_assert_eq!(b, Some(Duration::from_secs(delay)));
    }
}

#[test]
fn announces_reads_short_and_long_maps_alike() {
    // Up to 8 names the map is scanned, past that looked up: the same
    // answer either way, for both fields and for neither.
    for filler in [0usize, 3, 8, 20] {
        let mut plain = HeaderMap::new();
        for i in 0..filler {
            let name = http::HeaderName::from_bytes(format!("x-filler-{i}").as_bytes()).unwrap();
            plain.insert(name, "1".parse().unwrap());
        }
        assert!(!announces(&plain), "{filler} other headers");
        for field in ["ratelimit", "x-ratelimit-remaining"] {
            let mut with = plain.clone();
            with.insert(field, "1".parse().unwrap());
            assert!(announces(&with), "{field} among {filler} other headers");
        }
        let mut policy_only = plain.clone();
        policy_only.insert("ratelimit-policy", "\"q\";q=10;w=1".parse().unwrap());
        assert!(
            !announces(&policy_only),
            "a policy alone announces no remaining quota"
        );
    }
}
