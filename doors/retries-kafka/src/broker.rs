//! A real Kafka-protocol broker for the tests and the example: tansu 0.6.0
//! (Apache-2.0, written in Rust), in-memory storage (or a sqlite file, to
//! survive a restart), on a free loopback port, as a child process killed
//! when the [`Broker`] is dropped.
//!
//! `.ci/run` installs it with [`INSTALL`] into `~/.cache/retries-ci/tansu`
//! (kept between runs; skipped when the binary there reports `tansu 0.6.0`
//! and was built with the features `.ci/run` asks for, `dynostore` and
//! `libsql`).
//! The binary is looked up in `$TANSU`, then there, then on `PATH`.
//!
//! Three behaviours of tansu 0.6.0 shape the clients here. A member whose
//! session expires in a formed group is dropped, but its partitions are
//! handed to the others only at the next join or leave (a real Kafka broker
//! rebalances at once): the rebalance test lets a member leave after the
//! killed one's session expired. It does not create topics on produce
//! (create them with [`Broker::create_topics`]). And a fetch from the middle of a multi-record batch loses the batch's other
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
    /// Where a durable broker keeps its sqlite file.
    dir: Option<PathBuf>,
}

impl Broker {
    /// Start a broker on a free loopback port and wait until it accepts
    /// connections (tens of milliseconds).
    ///
    /// # Errors
    ///
    /// No binary ([`binary`]), or it did not start listening within 10 s.
    pub fn start() -> io::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Self::spawn(port, None)
    }

    /// Start a broker that keeps its records and offsets in a sqlite file in
    /// `dir` (tansu's `sqlite://` storage, built with its `libsql` feature),
    /// so that [`restart`](Self::restart) finds them again.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start); [`io::ErrorKind::Unsupported`] when the
    /// binary was not installed with `libsql` (no `features` stamp naming it
    /// beside its `bin/`, as [`INSTALL`] writes).
    pub fn start_durable(dir: &std::path::Path) -> io::Result<Self> {
        if let Some(bin) = binary().filter(|b| !tansu::durable(b)) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} has no `features` stamp naming libsql beside its bin/ (durable storage); install it with: {INSTALL}",
                    bin.display()
                ),
            ));
        }
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Self::spawn(port, Some(dir.to_owned()))
    }

    /// Stop the broker (`SIGKILL`: no goodbye to its clients).
    ///
    /// # Errors
    ///
    /// The process could not be killed.
    pub fn kill(&mut self) -> io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(drop)
    }

    /// Start it again on the same port, with the same storage (a durable
    /// broker has every record and offset it had).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn restart(&mut self) -> io::Result<()> {
        let _ = self.kill();
        let again = Self::spawn(self.port, self.dir.clone())?;
        *self = again;
        Ok(())
    }

    fn spawn(port: u16, dir: Option<PathBuf>) -> io::Result<Self> {
        let bin = binary().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("tansu 0.6.0 not found; install it with: {INSTALL}"),
            )
        })?;
        let url = format!("tcp://127.0.0.1:{port}");
        // sqlite's path is relative to the broker's working directory.
        let storage = if dir.is_some() {
            "sqlite://tansu.db"
        } else {
            "memory://tansu/"
        };
        let mut command = Command::new(bin);
        command
            .args([
                "broker",
                "--storage-engine",
                storage,
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(dir) = &dir {
            command.current_dir(dir);
        }
        let mut child = command.spawn()?;
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait()? {
                return Err(io::Error::other(format!(
                    "tansu exited at start ({status}) with storage {storage}"
                )));
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "tansu did not listen within 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Self { child, port, dir })
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
                tracing::warn!(target: "retries_kafka", error = %e, "no Kafka test broker: the test is skipped");
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
