//! What a call reports: tracing events and spans, and metrics.

mod observe_tracing;
mod observe_metrics;
