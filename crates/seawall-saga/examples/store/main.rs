//! One service of the store, talking to the others only through Redis
//! Streams (see `service.rs`).
//!
//! ```text
//! cargo run -p seawall-saga --features redis-streams --example store -- \
//!     stock|payment|shipping DB_FILE REDIS_URL
//! cargo run -p seawall-saga --features redis-streams --example store -- \
//!     orders COUNT REDIS_URL
//! ```
//!
//! Each service runs until killed and prints a line per effect it commits;
//! `orders` places orders `0..COUNT` and exits. `seawall-demo choreography`
//! runs all of it in one command.

mod service;

use std::path::Path;
use std::process::ExitCode;

use seawall_saga::broker::redis_streams::RedisStreams;
use service::Role;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [role, target, url] = args.as_slice() else {
        eprintln!(
            "usage: store stock|payment|shipping DB_FILE REDIS_URL | store orders COUNT REDIS_URL"
        );
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("store: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        if role == "orders" {
            let count: u64 = target
                .parse()
                .map_err(|e| format!("order count {target:?}: {e}"))?;
            let broker = RedisStreams::open(url)?;
            for order in 0..count {
                service::place_order(&broker, order).await?;
            }
            return Ok(());
        }
        let Some(role) = Role::parse(role) else {
            return Err(
                format!("unknown service {role:?} (stock, payment, shipping, orders)").into(),
            );
        };
        service::run(role, Path::new(target), url, std::future::pending(), |e| {
            println!("{:<8} order {:>3} {}", e.role.name(), e.order, e.effect);
        })
        .await
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("store: {e}");
            ExitCode::FAILURE
        }
    }
}
