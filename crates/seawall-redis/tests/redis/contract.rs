//! The store contract suite of the core crate, run against Redis: with the
//! server's clock (real sleeps, durations checked as bounds) and with the
//! caller's clock (a counter, every duration checked exactly).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use seawall::store::contract::{self, ContractClock, ManualClock};
use seawall_redis::{RedisStore, TimeSource};

use crate::support::{unique, RedisServer};

/// Wall-clock time, the same clock the local server reads with `TIME`.
struct WallClock;

impl ContractClock for WallClock {
    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
    }
    fn advance(&self, by: Duration) {
        std::thread::sleep(by + Duration::from_millis(3));
    }
    fn is_exact(&self) -> bool {
        false
    }
}

#[test]
fn contract_holds_on_the_server_clock() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("contract-server"))
        .fail_closed()
        .build()
        .unwrap();
    contract::run_all(&store, &WallClock);
}

#[test]
fn contract_holds_exactly_on_the_caller_clock() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("contract-caller"))
        .time_source(TimeSource::Caller)
        .fail_closed()
        .build()
        .unwrap();
    let clock = ManualClock::new();
    contract::run_all(&store, &clock);
    // Twice on one store: checks do not interfere.
    contract::run_all(&store, &clock);
}
