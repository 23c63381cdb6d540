//! The draws of `Chaos` through its public API ([`Chaos::around`]): a
//! request's draw depends on the seed, its number and the rule, not on
//! whether the switch was on for the requests before it.

use retries_chaos::{Chaos, Fault, Injected, Rule};

/// 200 requests through `around`; the switch off for the first `off`:
/// which of requests 100 to 199 were refused.
async fn refused_after_100(off: u64) -> Vec<bool> {
    let chaos = Chaos::builder()
        .seed(7)
        .rule(Rule::new(Fault::Refuse { retry_after: None }).rate(0.5))
        .build()
        .unwrap();
    let mut refused = Vec::new();
    for n in 0..200 {
        chaos.set_enabled(n >= off);
        let r: Result<(), Injected> = chaos.around("work", async { Ok(()) }).await;
        if n >= 100 {
            refused.push(r.is_err());
        }
    }
    refused
}

#[tokio::test]
async fn a_draw_does_not_depend_on_the_switch_before_it() {
    let always_on = refused_after_100(0).await;
    let first_hundred_off = refused_after_100(100).await;
    assert_eq!(always_on, first_hundred_off);
    let refused = always_on.iter().filter(|&&r| r).count();
    assert!(
        (30..=70).contains(&refused),
        "a rate of one half: {refused}"
    );
}
