//! The tower layer and the reqwest middleware against real servers, the layer
//! on the paused clock, and the layer driven by gRPC service configs.

mod middleware;
mod service_config;
mod tower_paused;
