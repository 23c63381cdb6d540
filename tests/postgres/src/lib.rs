//! What the database tests of `retries::sqlx` stand on: a throwaway
//! PostgreSQL cluster per test ([`Cluster`]), and a TCP proxy between the
//! pool and the server that loses what a network loses, on cue ([`Proxy`]).

mod binaries;

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The folder of PostgreSQL's server programs, if this machine has them.
#[must_use]
pub fn binaries() -> Option<PathBuf> {
    binaries::find()
}

/// A PostgreSQL cluster of its own: a copy of the process's template data
/// folder (one `initdb` per process) in a temporary folder, the server on a
/// free loopback port, stopped (`immediate`) and removed on drop.
/// As root it runs as the `postgres` user (`postgres` refuses to run as
/// root).
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    /// Copied from the process's template (counted in [`TEMPLATE`]).
    from_template: bool,
}

static CLUSTERS: AtomicU32 = AtomicU32::new(0);

/// The data folder every cluster of this process is copied from: `initdb`
/// runs once (about a second of a test's time; the copy takes a tenth), and
/// the folder is removed when the last cluster made from it is dropped.
static TEMPLATE: Mutex<Template> = Mutex::new(Template { dir: None, live: 0 });

struct Template {
    dir: Option<PathBuf>,
    live: usize,
}

impl Cluster {
    /// Start one; `settings` are extra `-c name=value` server settings.
    ///
    /// # Panics
    ///
    /// When the programs are missing or the server does not start: the
    /// tests that call this are compiled as ignored on a machine without
    /// them (see the build script).
    #[must_use]
    pub fn start(settings: &[&str]) -> Self {
        let bin = binaries().expect("PostgreSQL's initdb and pg_ctl (13 or later); set PG_BIN");
        let as_postgres = is_root();
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("retries-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        let mut cluster = Self {
            bin,
            dir,
            port: 0,
            as_postgres,
            from_template: true,
        };
        if as_postgres {
            check(
                Command::new("chown")
                    .arg("postgres")
                    .arg(&cluster.dir)
                    .output(),
                "chown",
            );
        }
        let template = cluster.template();
        // `-a`: the owner (postgres) and the folder's mode (0700) kept.
        check(
            Command::new("cp")
                .arg("-a")
                .arg(&template)
                .arg(cluster.data())
                .output(),
            "cp -a (the template's data folder)",
        );
        cluster.boot(settings);
        cluster
    }

    /// The process's template data folder, made now if none is there;
    /// counts this cluster as one made from it.
    fn template(&self) -> PathBuf {
        let mut t = TEMPLATE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        t.live += 1;
        if let Some(dir) = &t.dir {
            return dir.join("data");
        }
        let dir = std::env::temp_dir().join(format!("retries-pg-{}-template", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        if self.as_postgres {
            check(
                Command::new("chown").arg("postgres").arg(&dir).output(),
                "chown",
            );
        }
        let data = dir.join("data");
        check(
            self.command("initdb")
                .arg("-D")
                .arg(&data)
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-N",
                    "--no-instructions",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ])
                .output(),
            "initdb",
        );
        t.dir = Some(dir);
        data
    }

    /// Start the server of this cluster's data folder on a free port.
    fn boot(&mut self, settings: &[&str]) {
        let cluster = self;
        let data = cluster.data();
        // A port taken between the probe and the server's bind: try again.
        for _ in 0..5 {
            cluster.port = free_port();
            let mut options = format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=60",
                cluster.port,
                cluster.dir.display()
            );
            for s in settings {
                options.push_str(" -c ");
                options.push_str(s);
            }
            let out = cluster
                .command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(["-w", "-t", "30", "-l"])
                .arg(cluster.dir.join("log"))
                .args(["-o", &options, "start"])
                .output();
            if out.as_ref().is_ok_and(|o| o.status.success()) {
                return;
            }
        }
        let log = std::fs::read_to_string(cluster.dir.join("log")).unwrap_or_default();
        panic!("the PostgreSQL server did not start:\n{log}");
    }

    /// The server's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A connection URL for `addr` (the server's, or a proxy's in front of it).
    #[must_use]
    pub fn url_via(addr: SocketAddr) -> String {
        format!("postgres://postgres@{addr}/postgres?sslmode=disable")
    }

    /// A connection URL for the server itself.
    #[must_use]
    pub fn url(&self) -> String {
        Self::url_via(self.addr())
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }
}

impl Cluster {
    /// A streaming standby of this cluster (asynchronous, as PostgreSQL's
    /// replication is by default): `pg_basebackup -R` into a folder of its
    /// own, started on a free port, following this server until
    /// [`promote`](Self::promote)d.
    ///
    /// # Panics
    ///
    /// When the copy or the start fails.
    #[must_use]
    pub fn standby(&self) -> Self {
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("retries-pg-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary folder");
        if self.as_postgres {
            check(
                Command::new("chown").arg("postgres").arg(&dir).output(),
                "chown",
            );
        }
        let mut standby = Self {
            bin: self.bin.clone(),
            dir,
            port: 0,
            as_postgres: self.as_postgres,
            from_template: false,
        };
        check(
            standby
                .command("pg_basebackup")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "postgres",
                ])
                .arg("-D")
                .arg(standby.data())
                .args(["-R", "-X", "stream"])
                .output(),
            "pg_basebackup",
        );
        standby.boot(&[]);
        standby
    }

    /// End this standby's recovery: it becomes a primary on a new timeline.
    ///
    /// # Panics
    ///
    /// When `pg_ctl promote` fails.
    pub fn promote(&self) {
        check(
            self.command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-w", "-t", "30", "promote"])
                .output(),
            "pg_ctl promote",
        );
    }

    /// Stop the server at once (`-m immediate`: no shutdown checkpoint, as
    /// a machine that died), and leave it stopped.
    pub fn kill(&self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }

    /// Crash the server and start it again: `pg_ctl restart -m immediate`
    /// (no shutdown checkpoint, so the start runs crash recovery, as after
    /// a power loss or an OOM kill), waiting until it accepts connections.
    ///
    /// # Panics
    ///
    /// When the server does not come back.
    pub fn crash_restart(&self) {
        check(
            self.command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "-t", "30", "-l"])
                .arg(self.dir.join("log"))
                .arg("restart")
                .output(),
            "pg_ctl restart",
        );
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
        if self.from_template {
            let mut t = TEMPLATE
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            t.live -= 1;
            if t.live == 0
                && let Some(dir) = t.dir.take()
            {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn check(out: io::Result<Output>, what: &str) {
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!(
            "{what} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => panic!("{what} could not run: {e}"),
    }
}

fn free_port() -> u16 {
    StdListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// What the [`Proxy`] does to the next run of a statement whose SQL matches,
/// once, on whichever connection sends it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Close both sockets instead of forwarding the message: the server never
    /// sees it (for `COMMIT`: the transaction aborts when the server sees
    /// the connection close).
    DropRequest,
    /// Forward the message, wait for the server's first bytes of answer,
    /// then close both sockets without relaying them: the work is done, the
    /// reply is lost.
    DropReply,
    /// Forward the message and relay the answer, then close both sockets.
    DropAfterReply,
    /// Hold the message this long, then forward it (the client may have
    /// given up by then; the server still runs it).
    Delay(Duration),
}

#[derive(Debug, Default)]
struct Armed {
    /// `(SQL prefix, fault)`, used once each, in order.
    faults: Vec<(String, Fault)>,
    /// How many faults were set off.
    fired: u32,
    /// New connections are closed at once (the server looks down).
    down: bool,
    /// Where new connections go.
    target: Option<SocketAddr>,
}

/// A TCP proxy on a free loopback port in front of a target (which a
/// failover can change: [`retarget`](Proxy::retarget)), reading the
/// frontend side of the PostgreSQL protocol message by message (no TLS: the
/// URL says `sslmode=disable`) so that it can act on the SQL it carries.
#[derive(Debug, Clone)]
pub struct Proxy {
    addr: SocketAddr,
    armed: Arc<Mutex<Armed>>,
}

impl Proxy {
    /// Start forwarding to `target`, on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let armed = Arc::new(Mutex::new(Armed {
            target: Some(target),
            ..Armed::default()
        }));
        let shared = armed.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let target = match shared.lock() {
                    Ok(a) if !a.down => a.target,
                    _ => None,
                };
                let Some(target) = target else {
                    drop(client);
                    continue;
                };
                let armed = shared.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(target).await {
                        let _ = relay(client, server, &armed).await;
                    }
                });
            }
        });
        Self { addr, armed }
    }

    /// The proxy's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Set off `fault` on the next message whose SQL starts with `prefix`
    /// (case-insensitive, after leading white space). Faults armed earlier
    /// are matched first.
    pub fn arm(&self, prefix: &str, fault: Fault) {
        self.lock()
            .faults
            .push((prefix.to_ascii_uppercase(), fault));
    }

    /// Close every new connection at once (`true`) or relay them again:
    /// the server as the pool sees it while it is down, for as long as the
    /// test needs (connections already relayed are not touched).
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Send new connections to `target` from now on (a failover, as a
    /// virtual IP or a DNS name moves to the promoted standby).
    pub fn retarget(&self, target: SocketAddr) {
        self.lock().target = Some(target);
    }

    /// Forget the faults not set off yet.
    pub fn disarm(&self) {
        self.lock().faults.clear();
    }

    /// How many armed faults were set off so far.
    #[must_use]
    pub fn fired(&self) -> u32 {
        self.lock().fired
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Armed> {
        self.armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The SQL a frontend message runs, if it runs any: a simple query (`Q`),
/// or the bind (`B`) of a statement parsed earlier on this connection (its
/// text is kept from the parse, `P`, in `statements`). A statement is matched
/// at each bind, not at its parse, so a statement the client keeps prepared
/// is matched each time it runs.
fn sql_of(statements: &mut HashMap<Vec<u8>, String>, tag: u8, body: &[u8]) -> Option<String> {
    let cstr = |b: &[u8]| b.iter().position(|&c| c == 0);
    match tag {
        b'Q' => Some(String::from_utf8_lossy(body).into_owned()),
        // Parse: the statement's name (NUL-terminated), then its text.
        b'P' => {
            let name_end = cstr(body)?;
            let text = &body[name_end + 1..];
            let text = &text[..cstr(text).unwrap_or(text.len())];
            statements.insert(
                body[..name_end].to_vec(),
                String::from_utf8_lossy(text).into_owned(),
            );
            None
        }
        // Bind: the portal's name, then the statement's.
        b'B' => {
            let portal_end = cstr(body)?;
            let rest = &body[portal_end + 1..];
            let name = &rest[..cstr(rest)?];
            statements.get(name).cloned()
        }
        _ => None,
    }
}

/// The fault armed for `sql`, if one is.
fn fault_for(armed: &Mutex<Armed>, sql: &str) -> Option<Fault> {
    let sql = sql.trim_start().to_ascii_uppercase();
    let mut armed = armed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let i = armed
        .faults
        .iter()
        .position(|(p, _)| sql.starts_with(p.as_str()))?;
    let (_, fault) = armed.faults.remove(i);
    armed.fired += 1;
    Some(fault)
}

async fn relay(
    mut client: TcpStream,
    mut server: TcpStream,
    armed: &Mutex<Armed>,
) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let mut from_client = Vec::with_capacity(8192);
    let mut cbuf = vec![0u8; 8192];
    let mut sbuf = vec![0u8; 8192];
    // The startup message has no type byte; every later one has.
    let mut started = false;
    // The text of each statement parsed on this connection, by name.
    let mut statements = HashMap::new();
    // After `DropReply`: the next bytes from the server end the connection.
    let mut swallow = false;
    // After `DropAfterReply`: relay the next bytes, then end it.
    let mut close_after = false;
    loop {
        tokio::select! {
            n = client.read(&mut cbuf) => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                from_client.extend_from_slice(&cbuf[..n]);
                loop {
                    let (header, tag) = if started { (5, Some(from_client.first().copied())) } else { (4, None) };
                    if from_client.len() < header {
                        break;
                    }
                    let at = header - 4;
                    let len = u32::from_be_bytes(from_client[at..at + 4].try_into().expect("4 bytes")) as usize;
                    let total = at + len;
                    if from_client.len() < total {
                        break;
                    }
                    let msg: Vec<u8> = from_client.drain(..total).collect();
                    let fault = match tag {
                        Some(Some(t)) => sql_of(&mut statements, t, &msg[header..])
                            .and_then(|sql| fault_for(armed, &sql)),
                        _ => None,
                    };
                    // An SSL request is answered 'N' by the server and
                    // followed by the real startup message, also untyped.
                    let ssl_request = !started && len == 8 && msg[4..8] == [0x04, 0xd2, 0x16, 0x2f];
                    started = started || !ssl_request;
                    match fault {
                        None => server.write_all(&msg).await?,
                        Some(Fault::DropRequest) => return Ok(()),
                        Some(Fault::DropReply) => {
                            server.write_all(&msg).await?;
                            swallow = true;
                        }
                        Some(Fault::DropAfterReply) => {
                            server.write_all(&msg).await?;
                            close_after = true;
                        }
                        Some(Fault::Delay(d)) => {
                            tokio::time::sleep(d).await;
                            server.write_all(&msg).await?;
                        }
                    }
                }
            }
            n = server.read(&mut sbuf) => {
                let n = n?;
                if n == 0 || swallow {
                    return Ok(());
                }
                client.write_all(&sbuf[..n]).await?;
                if close_after {
                    return Ok(());
                }
            }
        }
    }
}

/// A busy machine for the length of a test: three spinning processes a
/// core (as CI's busy-machine step runs), killed on drop.
#[derive(Debug)]
pub struct Hog {
    spinners: Vec<std::process::Child>,
}

impl Hog {
    /// Start `3 × cores` spinning shell processes.
    ///
    /// # Panics
    ///
    /// When `sh` cannot be started.
    #[must_use]
    pub fn start() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let spinners = (0..3 * cores)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("a spinning sh")
            })
            .collect();
        Self { spinners }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        for s in &mut self.spinners {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

/// The handler shape the docs show for a key store in PostgreSQL, shared by
/// the key store's tests: the charge and the key's record in one
/// transaction through the transaction door (`policy`). It books a row
/// `(key)` in `charges`, works `before` the record, stores the record of
/// its answer (`201`, `charge {id}`) with `PgKeyStore::complete_in`, tells
/// `stored`, then works `after` it (the key's row held meanwhile) and
/// answers. A claim that is no longer the handler's rolls the charge back
/// (reported as `RowNotFound`, which is not retried). An axum state: its
/// clones share `runs` and `stored`.
#[derive(Clone)]
pub struct DoorCharge {
    /// The database.
    pub pool: sqlx::PgPool,
    /// The key store.
    pub keys: retries_sqlx::PgKeyStore,
    /// The transaction door's policy.
    pub policy: retries::Policy,
    /// Work before the record.
    pub before: Duration,
    /// Work after the record, inside the transaction.
    pub after: Duration,
    /// Told once the record is written (uncommitted).
    pub stored: Arc<tokio::sync::Notify>,
    /// Handler runs, over every clone.
    pub runs: Arc<std::sync::atomic::AtomicUsize>,
}

impl DoorCharge {
    /// A charge on `pool` and `keys` with the door's `policy`, no work.
    #[must_use]
    pub fn new(
        pool: sqlx::PgPool,
        keys: retries_sqlx::PgKeyStore,
        policy: retries::Policy,
    ) -> Self {
        Self {
            pool,
            keys,
            policy,
            before: Duration::ZERO,
            after: Duration::ZERO,
            stored: Arc::default(),
            runs: Arc::default(),
        }
    }

    /// The tables a charge writes to in `pool`'s database (`charges`, and
    /// the key store's), made once per database: its key store.
    ///
    /// # Panics
    ///
    /// When a table cannot be made.
    pub async fn migrate(pool: &sqlx::PgPool) -> retries_sqlx::PgKeyStore {
        sqlx::query("CREATE TABLE charges (id bigserial PRIMARY KEY, key text NOT NULL)")
            .execute(pool)
            .await
            .expect("the charges table");
        let keys = retries_sqlx::PgKeyStore::new(pool.clone());
        keys.migrate().await.expect("the key table");
        keys
    }

    /// Run the charge of `claim`: its answer, or the door's error.
    ///
    /// # Errors
    ///
    /// The transaction door's.
    ///
    /// # Panics
    ///
    /// Never: the answer it builds is a valid response.
    pub async fn run(
        &self,
        claim: &retries_tower::dedup::Claimed,
    ) -> Result<axum::http::Response<String>, retries_sqlx::Error> {
        use retries_sqlx::Transactions as _;
        self.runs.fetch_add(1, Ordering::Relaxed);
        retries::call(&self.policy)
            .transaction_fn(
                retries_sqlx::Transaction::on(&self.pool),
                |tx: &mut retries_sqlx::Tx, _: &retries::Attempt| {
                    // Owned copies: the attempt's future outlives no borrow.
                    let (keys, claim, stored) =
                        (self.keys.clone(), claim.clone(), Arc::clone(&self.stored));
                    let (before, after) = (self.before, self.after);
                    Box::pin(async move {
                        let id: i64 = sqlx::query_scalar(
                            "INSERT INTO charges (key) VALUES ($1) RETURNING id",
                        )
                        .bind(claim.key().key)
                        .fetch_one(&mut *tx)
                        .await?;
                        tokio::time::sleep(before).await;
                        let answer = axum::http::Response::builder()
                            .status(201)
                            .header("content-type", "text/plain")
                            .body(format!("charge {id}"))
                            .expect("a response");
                        let record = retries_tower::dedup::Stored::from_response(&answer);
                        keys.complete_in(&mut *tx, &claim, &record)
                            .await
                            .map_err(|e| match e {
                                retries_sqlx::KeyError::Database(e) => retries_sqlx::Error::from(e),
                                _ => sqlx::Error::RowNotFound.into(),
                            })?;
                        stored.notify_one();
                        tokio::time::sleep(after).await;
                        Ok::<_, retries_sqlx::Error>(answer)
                    })
                },
            )
            .await
    }

    /// Serve `POST /charges` with this charge behind `layer` on a free
    /// loopback port, in a task of its own: the port.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn serve(
        self,
        layer: retries_tower::dedup::IdempotencyLayer<retries_sqlx::PgKeyStore>,
    ) -> u16 {
        let router = axum::Router::new()
            .route("/charges", axum::routing::post(Self::handle))
            .with_state(self)
            .layer(layer);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let port = listener.local_addr().expect("its address").port();
        tokio::spawn(async move { axum::serve(listener, router).await });
        port
    }

    /// The axum handler: [`run`](Self::run)'s response, or 500 with the
    /// error.
    pub async fn handle(
        axum::extract::State(door): axum::extract::State<Self>,
        claim: retries_tower::dedup::Claimed,
    ) -> axum::response::Response {
        use axum::response::IntoResponse as _;
        match door.run(&claim).await {
            Ok(answer) => answer.into_response(),
            Err(e) => {
                (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
            }
        }
    }
}
