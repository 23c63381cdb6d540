//! Said when the behaviour tests are built without the features they use
//! (`behaviour/main.rs` is then empty): an ignored test naming the command,
//! never a pass.

#[cfg(not(all(
    feature = "tonic",
    feature = "service-config",
    feature = "axum",
    feature = "admin"
)))]
#[test]
#[ignore = "the behaviour tests of retries-tower need its features tonic, service-config, axum and admin: cargo test -p retries-tower --all-features (cargo test --workspace turns them on)"]
fn behaviour_tests_need_every_feature() {}
