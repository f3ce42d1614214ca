//! `choreography`: the store as three services (stock, payment, shipping),
//! each with its own SQLite database, outbox relay and inbox consumer,
//! talking only through Redis Streams (the services are the
//! `seawall-saga` example `store`, run here as three tasks of one process).
//!
//! Starts a `redis-server` of its own on a free loopback port, places the
//! orders, prints a line per effect per service, waits until every order is
//! done or undone, and prints a `CHOREOGRAPHY {json}` summary line.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use seawall_saga::broker::redis_streams::RedisStreams;

use crate::cli::ChoreographyOptions;
use crate::store::{self, Role};
use crate::{say, Failure};

/// How long the orders may take to settle.
const SETTLE: Duration = Duration::from_secs(30);

/// A throw-away `redis-server` and its directory, both gone on drop.
struct Redis {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Redis {
    /// Starts `redis-server` on a free loopback port in `dir`.
    fn start(dir: &Path) -> Result<Redis, Failure> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Failure::Runtime(format!("no free loopback port: {e}")))?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                Failure::BadInput(format!("choreography needs redis-server on PATH ({e})"))
            })?;
        let redis = Redis {
            child,
            dir: dir.to_owned(),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !redis.answers() {
            if Instant::now() > deadline {
                return Err(Failure::Runtime(
                    "redis-server did not answer PING within 5 s".to_owned(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(redis)
    }

    /// Whether the server answers PING.
    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut reply = [0u8; 5];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG"
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs the three services and the orders; prints the effects and the
/// summary.
///
/// # Errors
/// [`Failure::BadInput`] without `redis-server`; [`Failure::Runtime`] when
/// the services fail, or the orders do not all settle once.
pub(crate) fn run(options: &ChoreographyOptions) -> Result<(), Failure> {
    let dir =
        std::env::temp_dir().join(format!("seawall-demo-choreography-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::Runtime(format!("cannot create {}: {e}", dir.display())))?;
    let redis = Redis::start(&dir).inspect_err(|_| {
        let _ = std::fs::remove_dir_all(&dir);
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the async runtime: {e}")))?;
    let orders = u64::from(options.orders);
    say(&format!(
        "three services, three SQLite files, one Redis stream ({}); shipping cancels orders 3, 8, 13, ...\n",
        store::STREAM
    ));
    let summary = runtime.block_on(async {
        let url = redis.url();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut services = Vec::new();
        for role in Role::ALL {
            let (db, url, mut stopped) = (store::db_path(&dir, role), url.clone(), stopped.clone());
            services.push(tokio::spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                store::run(role, &db, &url, shutdown, |e| {
                    say(&format!(
                        "{:<8} order {:>3} {}\n",
                        e.role.name(),
                        e.order,
                        e.effect
                    ));
                })
                .await
                .map_err(|e| format!("{}: {e}", role.name()))
            }));
        }
        drop(stopped);
        let broker = RedisStreams::open(&url).map_err(|e| Failure::Runtime(e.to_string()))?;
        for order in 0..orders {
            store::place_order(&broker, order)
                .await
                .map_err(|e| Failure::Runtime(format!("placing order {order}: {e}")))?;
        }
        let deadline = Instant::now() + SETTLE;
        let summary = loop {
            let summary =
                store::summary(&dir, orders).map_err(|e| Failure::Runtime(e.to_string()))?;
            if summary.pending == 0
                || Instant::now() > deadline
                || services.iter().any(|s| s.is_finished())
            {
                break summary;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let _ = stop.send(true);
        for service in services {
            match service.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Failure::Runtime(e)),
                Err(e) => return Err(Failure::Runtime(format!("a service panicked: {e}"))),
            }
        }
        Ok(summary)
    });
    drop(runtime);
    drop(redis);
    let summary = summary?;
    say(&format!("CHOREOGRAPHY {}\n", summary.json(orders)));
    if summary.pending > 0 || summary.duplicates > 0 || summary.wrong > 0 {
        return Err(Failure::Runtime(format!(
            "the orders did not all settle once: {}",
            summary.json(orders)
        )));
    }
    Ok(())
}
