//! Said when the behaviour tests are built without the features they use
//! (`behaviour/main.rs` is then empty): an ignored test naming the command,
//! never a pass.

#[cfg(not(all(feature = "tower", feature = "tonic", feature = "reqwest-middleware")))]
#[test]
#[ignore = "the behaviour tests of retries-chaos need its features tower, tonic and reqwest-middleware: cargo test -p retries-chaos --all-features (cargo test --workspace turns them on)"]
fn behaviour_tests_need_every_feature() {}
