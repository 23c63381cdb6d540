//! The expansion works when the library is renamed and shadowed.

use retries_hygiene::{Client, Error};

#[tokio::test(start_paused = true)]
async fn renamed_crate_path_is_used_everywhere() {
    let c = Client::default();
    assert_eq!(c.fetch().await.unwrap(), 3);
    assert_eq!(c.attempts.load(std::sync::atomic::Ordering::SeqCst), 3);
    let Err(Error::Stopped(s)) = c.never(None).await else {
        panic!("expected the deadline to stop the call")
    };
    assert_eq!(s.reason(), renamed_retry::Reason::DeadlineExceeded);
}
