//! Bad input: a malformed URL, a wrong password, a user without scripting
//! rights. Each is a typed error with a clear message, never a panic.

use std::time::Duration;

use seawall::store::ResourceSpec;
use seawall::{Bulkhead, Pipeline, StateStore, StoreError};
use seawall_redis::{FailMode, RedisStore, RedisStoreError};

use crate::support::{unique, user_url, RedisServer};

fn spec() -> ResourceSpec {
    ResourceSpec::new("guarded").with_bulkhead(Bulkhead::new(1))
}

#[test]
fn malformed_urls_are_refused_at_build() {
    for url in [
        "",
        "127.0.0.1:6379",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis://:pw@[::1",
    ] {
        match RedisStore::builder(url).build() {
            Err(RedisStoreError::InvalidUrl { url: shown, reason }) => {
                assert!(!reason.is_empty());
                assert!(!shown.contains("pw@"), "password shown: {shown}");
            }
            other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
        }
    }
}

#[test]
fn a_wrong_or_missing_password_is_refused_at_bind_in_both_modes() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = server.port();
    for mode in [FailMode::Open, FailMode::Closed] {
        for url in [
            format!("redis://:wrong@127.0.0.1:{port}"),
            format!("redis://127.0.0.1:{port}"),
        ] {
            let store = RedisStore::builder(url.as_str())
                .fail_mode(mode)
                .prefix(unique("auth"))
                .build()
                .unwrap();
            match store.bind(&spec()) {
                Err(StoreError::Refused(msg)) => assert!(msg.contains("authentication"), "{msg}"),
                other => panic!("{url} {mode:?}: expected Refused, got {other:?}"),
            }
            let e = Pipeline::builder("guarded")
                .bulkhead(Bulkhead::new(1))
                .store(store)
                .build()
                .unwrap_err();
            assert_eq!((e.policy, e.field), ("store", "bind"));
            assert!(e.to_string().contains("authentication failed"), "{e}");
            assert!(!e.to_string().contains("wrong"), "password leaked: {e}");
        }
    }
    let good = RedisStore::builder(format!("redis://:s3cret@127.0.0.1:{port}"))
        .prefix(unique("auth"))
        .build()
        .unwrap();
    let p = Pipeline::builder("guarded")
        .bulkhead(Bulkhead::new(1))
        .store(good)
        .build()
        .unwrap();
    p.call(|_| Ok::<_, std::io::Error>(())).unwrap();
}

#[test]
fn a_user_without_scripting_rights_is_refused_at_bind() {
    let server = RedisServer::start();
    let url = user_url(&server, "noscript", &["-@scripting"]);
    for mode in [FailMode::Open, FailMode::Closed] {
        let store = RedisStore::builder(url.as_str())
            .fail_mode(mode)
            .timeout(Duration::from_millis(500))
            .prefix(unique("acl"))
            .build()
            .unwrap();
        match store.bind(&spec()) {
            Err(StoreError::Refused(msg)) => assert!(msg.contains("permission"), "{msg}"),
            other => panic!("{mode:?}: expected Refused, got {other:?}"),
        }
        let e = Pipeline::builder("guarded")
            .bulkhead(Bulkhead::new(1))
            .store(store)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("permission denied"), "{e}");
    }
}

/// Each malformed URL is refused with a reason that names its problem.
#[test]
fn malformed_urls_name_their_problem() {
    for (url, problem) in [
        ("", "empty"),
        ("127.0.0.1:6379", "no scheme"),
        ("localhost", "no scheme"),
        ("http://127.0.0.1:6379", "unsupported scheme `http`"),
        ("redis://127.0.0.1:notaport", "invalid port number"),
        ("redis://127.0.0.1:99999", "invalid port number"),
        ("redis://:pw@[::1", "invalid IPv6 address"),
        ("redis://", "Missing hostname"),
        ("redis://0.0.0.0:6379", "wildcard address"),
        ("redis://host/abc", "Invalid database number"),
        ("redis://host/0?protocol=9", "Invalid protocol version"),
        ("rediss://host", "TLS (`rediss://`) is not supported"),
        ("redis+unix://", "Missing path"),
        ("redis://a:6379,b:6379", "list"),
        ("redis://a:6379 redis://b:6379", "list"),
        ("redis://user:%FF@host", "Password is not valid UTF-8"),
    ] {
        match RedisStore::builder(url).build() {
            Err(RedisStoreError::InvalidUrl { reason, .. }) => {
                assert!(reason.contains(problem), "{url:?}: {reason}")
            }
            other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
        }
    }
}

proptest::proptest! {
    /// Whatever the string, building a store answers (a store or a typed
    /// error), never panics, and shows no more than the redaction allows.
    #[test]
    fn any_url_gives_a_store_or_a_typed_error(url in "\\PC{0,40}") {
        let b = RedisStore::builder(url.as_str());
        let _ = format!("{b:?}");
        match b.build() {
            Ok(store) => { let _ = format!("{store:?}"); }
            Err(RedisStoreError::InvalidUrl { reason, .. }) => proptest::prop_assert!(!reason.is_empty()),
            Err(e) => proptest::prop_assert!(false, "{url:?}: {e}"),
        }
    }

    /// Likewise for strings that look like redis URLs.
    #[test]
    fn any_redis_like_url_gives_a_store_or_a_typed_error(
        url in "(redis|rediss|unix|redis\\+unix|valkey|http)?:?/{0,3}([a-z:@%]{0,8}@)?(\\[[0-9a-f:]{0,8}\\]?|[a-z0-9.]{0,10})(:[0-9a-z-]{0,6})?(/[0-9a-z/]{0,4})?(\\?[a-z=&0-9]{0,12})?(#[a-z]{0,8})?",
    ) {
        match RedisStore::builder(url.as_str()).build() {
            Ok(_) => {}
            Err(RedisStoreError::InvalidUrl { reason, .. }) => proptest::prop_assert!(!reason.is_empty()),
            Err(e) => proptest::prop_assert!(false, "{url:?}: {e}"),
        }
    }
}

#[test]
fn the_longest_timeouts_never_overflow_on_either_path() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for (label, builder) in [
        (
            "timeout",
            RedisStore::builder(server.url()).timeout(Duration::MAX),
        ),
        (
            "connect_timeout",
            RedisStore::builder(server.url()).connect_timeout(Duration::MAX),
        ),
        (
            "both",
            RedisStore::builder(server.url())
                .timeout(Duration::MAX)
                .connect_timeout(Duration::MAX),
        ),
    ] {
        let store = builder.prefix(unique("longest")).build().unwrap();
        let p = Pipeline::builder("longest")
            .circuit_breaker(seawall::CircuitBreaker::failure_rate(0.5).minimum_calls(100))
            .bulkhead(Bulkhead::new(2))
            .store(store.clone())
            .build()
            .unwrap();
        rt.block_on(async {
            store.ping_async().await.expect(label);
            for _ in 0..3 {
                p.run(|_| async { Ok::<_, std::io::Error>(()) })
                    .await
                    .expect(label);
            }
        });
        // The blocking path first waits for the records the async path
        // sent without awaiting them.
        p.call(|_| Ok::<_, std::io::Error>(())).expect(label);
        store.ping().expect(label);
        assert_eq!(p.circuit_metrics().expect(label).calls, 4, "{label}");
    }
}

#[test]
fn tls_urls_are_refused_at_build_as_not_supported() {
    let says_not_supported = |url: &str, e: RedisStoreError| match e {
        RedisStoreError::InvalidUrl { url: shown, reason } => {
            assert!(
                reason.contains("TLS") && reason.contains("is not supported by this build"),
                "{url:?}: {reason}"
            );
            // What the message offers instead takes no TLS.
            let offered = reason.split_once("expected").map_or("", |(_, o)| o);
            assert!(
                !offered.contains("rediss") && !offered.contains("valkeys"),
                "{url:?}: {reason}"
            );
            assert!(!shown.contains("pw"), "password shown: {shown}");
        }
        other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
    };
    for url in [
        "rediss://127.0.0.1:6380",
        "rediss://:pw@127.0.0.1:6380/0",
        "valkeys://127.0.0.1:6380",
        "REDISS://127.0.0.1:6380",
        " rediss://127.0.0.1:6380",
    ] {
        says_not_supported(url, RedisStore::builder(url).build().unwrap_err());
    }
    for nodes in [
        vec!["rediss://127.0.0.1:7000", "rediss://127.0.0.1:7001"],
        vec!["redis://127.0.0.1:7000", "valkeys://127.0.0.1:7001"],
    ] {
        let e = RedisStore::cluster(nodes.clone()).build().unwrap_err();
        says_not_supported(&nodes.join(" "), e);
    }
}
