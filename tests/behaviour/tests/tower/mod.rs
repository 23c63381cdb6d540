//! The tower layer and the reqwest middleware against real servers, the layer
//! on the paused clock, the layer driven by gRPC service configs, and the
//! next attempt on another replica behind a balancer.

mod admin;
mod another_replica;
mod dedup;
mod middleware;
mod proof;
mod service_config;
mod stops;
mod tower_paused;
