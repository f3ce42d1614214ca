//! `choreography`: the store as three services (stock, payment, shipping),
//! each with its own SQLite database, outbox relay and inbox consumer,
//! talking only through Redis Streams (the services are the
//! `seawall-saga` example `store`, run here as three tasks of one process).
//!
//! Starts a `redis-server` of its own on a free loopback port, places the
//! orders, prints a line per effect per service, waits until every order is
//! done or undone, and prints a `CHOREOGRAPHY {json}` summary line.

use std::time::{Duration, Instant};

use seawall_saga::broker::redis_streams::RedisStreams;

use crate::cli::ChoreographyOptions;
use crate::redis_server::RedisServer;
use crate::store::{self, Role};
use crate::{say, Failure};

/// How long the orders may take to settle.
const SETTLE: Duration = Duration::from_secs(30);

/// Runs the three services and the orders; prints the effects and the
/// summary.
///
/// # Errors
/// [`Failure::BadInput`] without `redis-server`; [`Failure::Runtime`] when
/// the services fail, or the orders do not all settle once.
pub(crate) fn run(options: &ChoreographyOptions) -> Result<(), Failure> {
    let dir =
        std::env::temp_dir().join(format!("seawall-demo-choreography-{}", std::process::id()));
    let redis = RedisServer::start(&dir, "choreography")?;
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
