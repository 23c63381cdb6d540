//! What a call reports: tracing events and spans, and metrics.

mod observe_metrics;
mod observe_tracing;
