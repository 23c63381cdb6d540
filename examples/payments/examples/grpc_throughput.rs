//! `cargo run --release -p retries-payments --example grpc_throughput`: what
//! the gRPC layer costs on every call of a busy client, in one run beside
//! the bare channel. The payments service answers `GetCharge` of a charge
//! that exists, on loopback; 64 tasks call it through a tonic channel
//! (HTTP/2), bare and behind `retries_tower::RetryLayer::grpc`, in
//! alternating rounds (the harness of `retries-bench`'s `layer_throughput`).
//! No call fails: this is the happy path's cost.
//!
//! `grpc_throughput VARIANT CALLS` makes `CALLS` calls through variant
//! `VARIANT` alone (0 bare, 1 with the layer), one at a time, and exits:
//! under `valgrind --tool=callgrind` at two counts, the difference is the
//! instructions one call costs, client and server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use retries::Policy;
use retries_bench::load::{Variant, block_on, measure, only, only_args, print};
use retries_payments::pb::GetChargeRequest;
use retries_payments::pb::payments_client::PaymentsClient;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `GetCharge` of `key` through `channel`, as a variant.
fn variant<T>(name: &'static str, channel: T, key: &str) -> Variant
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + Sync + 'static,
    T::Future: Send,
    T::Error: Into<BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<BoxError> + Send,
{
    let client = PaymentsClient::new(channel);
    let key = key.to_owned();
    (
        name,
        Arc::new(move || {
            let (mut client, key) = (client.clone(), key.clone());
            Box::pin(async move {
                let receipt = client
                    .get_charge(GetChargeRequest {
                        idempotency_key: key,
                    })
                    .await
                    .expect("a receipt");
                assert_eq!(receipt.get_ref().cents, 100);
            })
        }),
    )
}

fn channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("a URI")
        .connect_lazy()
}

fn main() {
    let only_one = only_args();
    block_on(only_one.is_some(), async {
        let addr = retries_payments::serve(retries_payments::Ledger::with_faults(&[])).await;
        let receipt = retries_payments::Client::new(addr)
            .charge_without_deadline(100)
            .await
            .expect("a charge");
        let key = receipt.id.trim_start_matches("receipt-").to_owned();
        let policy = Policy::new(Duration::from_secs(5)).with_max_attempts(3);
        let variants = vec![
            variant("tonic channel", channel(addr), &key),
            variant(
                "tonic channel + retries RetryLayer::grpc",
                retries_tower::RetryLayer::grpc(policy).layer(channel(addr)),
                &key,
            ),
        ];
        if let Some((variant, n)) = only_one {
            return only(&variants, variant, n).await;
        }
        let figures = measure(&variants).await;
        print(&variants, &figures, |_| 0);
    });
}
