//! A real Kafka-protocol broker for the tests and the example: tansu 0.6.0
//! (Apache-2.0, written in Rust), in-memory storage, on a free loopback port,
//! as a child process killed when the [`Broker`] is dropped.
//!
//! `.ci/run` installs it with [`INSTALL`] into `~/.cache/retries-ci/tansu`
//! (kept between runs; skipped when the binary there reports `tansu 0.6.0`).
//! The binary is looked up in `$TANSU`, then there, then on `PATH`.
//!
//! Two behaviours of tansu 0.6.0 shape the clients here: it does not create
//! topics on produce (create them with [`Broker::create_topics`]), and a
//! fetch from the middle of a multi-record batch loses the batch's other
//! records, so every producer here (the runner's and [`Broker::producer`])
//! sends one record per batch (`batch.num.messages=1`).

use std::io;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;

#[path = "tansu.rs"]
mod tansu;

pub use tansu::INSTALL;

/// The tansu binary, if one reporting version 0.6.0 is found: `$TANSU`, the
/// cache `.ci/run` installs into ([`INSTALL`]), then `tansu` on the `PATH`.
#[must_use]
pub fn binary() -> Option<PathBuf> {
    tansu::find()
}

/// A running broker.
#[derive(Debug)]
pub struct Broker {
    child: Child,
    port: u16,
}

impl Broker {
    /// Start a broker on a free loopback port and wait until it accepts
    /// connections (tens of milliseconds).
    ///
    /// # Errors
    ///
    /// No binary ([`binary`]), or it did not start listening within 10 s.
    pub fn start() -> io::Result<Self> {
        let bin = binary().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("tansu 0.6.0 not found; install it with: {INSTALL}"),
            )
        })?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(bin)
            .args([
                "broker",
                "--storage-engine",
                "memory://tansu/",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let broker = Self { child, port };
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "tansu did not listen within 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(broker)
    }

    /// For a test: the broker, or `None` (with a note on stderr) when no
    /// binary is installed, unless `RETRIES_KAFKA_REQUIRED` is set (as
    /// `.ci/run` sets it): then a missing broker fails the test.
    ///
    /// # Panics
    ///
    /// When the broker is required and cannot start.
    #[must_use]
    pub fn for_tests() -> Option<Self> {
        match Self::start() {
            Ok(b) => Some(b),
            Err(e) if std::env::var_os("RETRIES_KAFKA_REQUIRED").is_some() => {
                panic!("the Kafka test broker is required: {e}")
            }
            Err(e) => {
                eprintln!("skipped: {e}");
                None
            }
        }
    }

    /// `127.0.0.1:PORT`, for `bootstrap.servers`.
    #[must_use]
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Create `topics` with `partitions` each (tansu does not create them on produce).
    ///
    /// # Errors
    ///
    /// The admin request failed.
    pub async fn create_topics(&self, topics: &[&str], partitions: i32) -> Result<(), KafkaError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", self.address())
            .create()?;
        let new: Vec<_> = topics
            .iter()
            .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
            .collect();
        for r in admin.create_topics(&new, &AdminOptions::new()).await? {
            r.map_err(|(_, code)| KafkaError::AdminOp(code))?;
        }
        Ok(())
    }

    /// A producer that sends one record per batch (see the module docs).
    ///
    /// # Errors
    ///
    /// The client could not be created.
    pub fn producer(&self) -> Result<FutureProducer, KafkaError> {
        ClientConfig::new()
            .set("bootstrap.servers", self.address())
            .set("batch.num.messages", "1")
            .set("linger.ms", "0")
            .set("acks", "all")
            .create()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
