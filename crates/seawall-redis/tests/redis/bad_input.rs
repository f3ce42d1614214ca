//! Bad input: a malformed URL, a wrong password, a user without scripting
//! rights. Each is a typed error with a clear message, never a panic.

use std::time::Duration;

use seawall::store::ResourceSpec;
use seawall::{Bulkhead, Pipeline, StateStore, StoreError};
use seawall_redis::{FailMode, RedisStore, RedisStoreError};

use crate::support::{unique, RedisServer};

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
    let mut admin = server.conn();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "noscript",
                "on",
                ">pw",
                "~*",
                "&*",
                "+@all",
                "-@scripting",
            ][..],
        )
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://noscript:pw@127.0.0.1:{}", server.port());
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
