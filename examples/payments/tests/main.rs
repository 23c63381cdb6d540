//! The payments service's tests, one binary (one link, and the tests run
//! side by side instead of one binary after another): gRPC and HTTP over
//! loopback, real processes where the point is a process boundary. The
//! OpenTelemetry tests are binaries of their own (each installs a global
//! subscriber or recorder), and so are the outbox's (its counting allocator
//! measures the whole process: beside this binary's other tests it counted
//! their bytes too).

mod across;
mod chain_processes;
mod chaos;
mod deadline_chain;
mod dedup;
mod headers;
mod layer;
mod overload;
mod reference;
mod stream;
mod transport;
