//! The store contract suite of the core crate, run against Redis: with the
//! server's clock (real sleeps, durations checked as bounds) and with the
//! caller's clock (a counter, every duration checked exactly).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use seawall::store::contract::{self, ContractClock, ManualClock};
use seawall_redis::{RedisStore, TimeSource};

use crate::support::{command_calls, scripts_only_url, unique, RedisServer};

/// Wall-clock time, the same clock the local server reads with `TIME`.
pub(crate) struct WallClock;

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

/// The same on a server whose user may not run functions: the scripts run
/// by `EVALSHA` (the admissions by the scripts compiled for their spec),
/// as on a server before Redis 7.
#[test]
fn contract_holds_exactly_by_evalsha() {
    let server = RedisServer::start();
    let store = RedisStore::builder(scripts_only_url(&server))
        .prefix(unique("contract-evalsha"))
        .time_source(TimeSource::Caller)
        .fail_closed()
        .build()
        .unwrap();
    contract::run_all(&store, &ManualClock::new());
    let stats = command_calls(&mut server.conn());
    assert_eq!(stats.get("fcall"), None, "{stats:?}");
    assert!(stats.get("evalsha").is_some_and(|n| *n > 100), "{stats:?}");
}

/// `caller_clock()`: every script takes its time from the request, so a
/// circuit tripped at 10^6 s on the caller's clock (far from the server's
/// `TIME`) waits out exactly its cooldown, and the metrics and controls
/// measure time on the same clock.
#[test]
fn caller_clock_option_takes_the_time_from_the_caller() {
    use seawall::breaker::{CircuitControl, CircuitState, CircuitTransition};
    use seawall::store::{AdmitRequest, Outcome, Record, ResourceSpec};
    use seawall::CircuitBreaker;

    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("caller-clock"))
        .caller_clock()
        .fail_closed()
        .build()
        .unwrap();
    let spec = ResourceSpec::new("r")
        .with_circuit(CircuitBreaker::consecutive_failures(1).cooldown(Duration::from_secs(30)));
    let state = seawall::StateStore::bind(&store, &spec).unwrap();
    let t0 = Duration::from_secs(1_000_000);
    let s = |secs_after: f64| t0 + Duration::from_secs_f64(secs_after);
    let admit = |now| {
        state
            .admit(&AdmitRequest {
                partition: None,
                now,
                weight: 1,
                budget: None,
                shadowed: false,
            })
            .unwrap()
    };

    let permit = admit(t0).decision.expect("closed");
    let recorded = state
        .record(&Record {
            partition: None,
            permit,
            outcome: Outcome::Failure,
            duration: Duration::ZERO,
            retry_after: None,
            now: t0,
        })
        .unwrap();
    assert_eq!(
        recorded.transition,
        Some(CircuitTransition::Opened {
            cooldown: Duration::from_secs(30)
        })
    );
    let refused = admit(s(29.5)).decision.expect_err("open");
    assert_eq!(refused.retry_after, Some(Duration::from_millis(500)));
    let m = state.circuit_metrics(None, s(10.0)).unwrap();
    assert_eq!(
        (m.state, m.time_in_state),
        (CircuitState::Open, Duration::from_secs(10))
    );
    let probe = admit(s(30.0));
    assert_eq!(probe.transition, Some(CircuitTransition::HalfOpened));
    assert!(probe.decision.expect("a probe").probe);
    let m = state.circuit_metrics(None, s(31.0)).unwrap();
    assert_eq!(
        (m.state, m.time_in_state),
        (CircuitState::HalfOpen, Duration::from_secs(1))
    );
    state
        .control_circuit(None, CircuitControl::Isolate, s(40.0))
        .unwrap();
    let m = state.circuit_metrics(None, s(42.0)).unwrap();
    assert_eq!(
        (m.state, m.time_in_state),
        (CircuitState::Isolated, Duration::from_secs(2))
    );
}
