//! No password ever shows: not in the builder's or the store's `Debug`, not
//! in an error (`Display`, `Debug`, any `source()`), not in an event, for
//! well-formed URLs and for mangled ones, alone or in a cluster's list.

use std::error::Error as _;
use std::time::Duration;

use proptest::prelude::*;
use seawall::{Bulkhead, Pipeline};
use seawall_redis::{RedisStore, RedisStoreBuilder};

use crate::support::{unique, Events};

/// Where a password may sit in a URL, well-formed or not (`{}` is the
/// password).
const TEMPLATES: &[&str] = &[
    "redis://ada:{}@127.0.0.1:6379/0",
    "redis://:{}@127.0.0.1:6379",
    "redis://{}@127.0.0.1",
    "redis:/ada:{}@127.0.0.1",
    "redis:ada:{}@127.0.0.1",
    "redis:///ada:{}@127.0.0.1",
    "redis:\\\\ada:{}@127.0.0.1",
    "rediss://ada:{}@127.0.0.1:6380",
    "valkey://ada:{}@127.0.0.1",
    "REDIS://ada:{}@127.0.0.1",
    "http://ada:{}@127.0.0.1",
    "//ada:{}@127.0.0.1",
    "ada:{}@127.0.0.1:6379",
    "redis+unix:///tmp/redis.sock?db=0&pass={}",
    "unix:///tmp/redis.sock?user=ada&pass={}",
    "redis+unix://ada:{}@/tmp/redis.sock",
    "redis://ada:{}@[::1]:6379",
    "redis://ada:{}@[::1",
    "redis://:{}@[fe80::1%25eth0]:6379",
    "redis://127.0.0.1:6379/0?password={}",
    "redis://127.0.0.1/?protocol=resp3&password={}",
    "redis://127.0.0.1/?pass={}&db=2",
    "redis://ada:{}@127.0.0.1:notaport",
    "redis://ada:{}@127.0.0.1/notadb",
    "redis://ada:{}@127.0.0.1/0#fragment",
    "redis://127.0.0.1/0#{}",
    "redis://ada:{}@",
    "redis://ada:{}@:6379",
    " redis://ada:{}@127.0.0.1 ",
];

/// `%XX` decoded, as the redis client decodes a password.
fn decoded(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Asserts that nothing the store shows for `url` contains `password`.
fn assert_hidden(url: &str, password: &str) {
    assert_built_hidden(RedisStore::builder(url), url, password);
}

/// Asserts that nothing the builder, its `build` or the store it builds
/// shows contains `password` (`url`: what it was given, for the message).
fn assert_built_hidden(builder: RedisStoreBuilder, url: &str, password: &str) {
    let secrets = [password.to_owned(), decoded(password)];
    let check = |what: &str, text: &str| {
        for s in &secrets {
            assert!(
                !text.contains(s.as_str()),
                "{what} of {url:?} shows the password {s:?}: {text}"
            );
        }
    };
    check("the builder's Debug", &format!("{builder:?}"));
    match builder.build() {
        Ok(store) => check("the store's Debug", &format!("{store:?}")),
        Err(e) => {
            check("the error's Display", &e.to_string());
            check("the error's Debug", &format!("{e:?}"));
            let mut source = e.source();
            while let Some(s) = source {
                check("a source's Display", &s.to_string());
                check("a source's Debug", &format!("{s:?}"));
                source = s.source();
            }
        }
    }
}

/// Passwords with every character that confuses a URL parser.
const PASSWORDS: &[&str] = &[
    "s3cr3t-Zq",
    "p@ss@wordZq",
    "pa:ss:wdZq",
    "pa/ss/wdZq",
    "p%40ss%2Fw0rdZq",
    "pa?ss#wdZq",
    "pa&ss=wdZq",
    "[::1]pwZq",
    "pw%zzZq",
    "Zq%C3%A9t%C3%A9",
    "Zq ss wd",
];

#[test]
fn passwords_never_show_for_a_list_of_mangled_urls() {
    let mut checked = 0;
    for template in TEMPLATES {
        for password in PASSWORDS {
            assert_hidden(&template.replace("{}", password), password);
            checked += 1;
        }
    }
    assert_eq!(checked, TEMPLATES.len() * PASSWORDS.len());
}

/// The password of the other node in [`cluster_lists`].
const OTHER: &str = "0ther-Zq-pw";

/// The cluster lists a URL with `password` may be in: first, last, with
/// a node without password (build refuses the mix), with the same password
/// (build may accept), with another password.
fn cluster_lists(url: &str) -> Vec<Vec<String>> {
    let plain = "redis://127.0.0.1:7001".to_owned();
    let other = format!("redis://ada:{OTHER}@127.0.0.1:7002");
    vec![
        vec![url.to_owned()],
        vec![url.to_owned(), plain.clone()],
        vec![plain, url.to_owned()],
        vec![url.to_owned(), url.replace("127.0.0.1", "127.0.0.2")],
        vec![other.clone(), url.to_owned()],
        vec![url.to_owned(), other],
    ]
}

#[test]
fn passwords_never_show_for_cluster_lists_of_mangled_urls() {
    let mut checked = 0;
    for template in TEMPLATES {
        for password in PASSWORDS {
            let url = template.replace("{}", password);
            for list in cluster_lists(&url) {
                let shown = format!("{list:?}");
                let builder = RedisStore::cluster(list);
                assert_built_hidden(builder.clone(), &shown, password);
                assert_built_hidden(builder, &shown, OTHER);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, TEMPLATES.len() * PASSWORDS.len() * 6);
}

#[test]
fn the_reported_bug_redis_single_slash() {
    let e = RedisStore::builder("redis:/user:secret@host")
        .build()
        .unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
    assert!(!format!("{e:?}").contains("secret"), "{e:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn passwords_never_show_for_random_passwords(
        password in "Zq[a-zA-Z0-9@:/?#%&=+!$;.,~\\[\\]-]{2,14}",
        template in proptest::sample::select(TEMPLATES),
    ) {
        assert_hidden(&template.replace("{}", &password), &password);
    }

    #[test]
    fn passwords_never_show_for_random_passwords_in_cluster_lists(
        password in "Zq[a-zA-Z0-9@:/?#%&=+!$;.,~\\[\\]-]{2,14}",
        template in proptest::sample::select(TEMPLATES),
        which in 0usize..6,
    ) {
        let list = cluster_lists(&template.replace("{}", &password)).swap_remove(which);
        let shown = format!("{list:?}");
        let builder = RedisStore::cluster(list);
        assert_built_hidden(builder.clone(), &shown, &password);
        assert_built_hidden(builder, &shown, OTHER);
    }
}

#[test]
fn passwords_never_show_in_errors_or_events_at_run_time() {
    // Nothing listens on this port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let password = "runtime-Zq-secret";
    let url = format!("redis://ada:{password}@127.0.0.1:{port}");
    for open in [true, false] {
        let events = Events::default();
        let b = RedisStore::builder(url.as_str())
            .prefix(unique("redaction"))
            .timeout(Duration::from_millis(100));
        let store = if open { b.fail_open() } else { b.fail_closed() }
            .build()
            .unwrap();
        let p = Pipeline::builder("guarded")
            .bulkhead(Bulkhead::new(1))
            .on_event(events.listener())
            .store(store.clone())
            .build()
            .unwrap();
        for _ in 0..3 {
            let r = p.call(|_| Ok::<_, std::io::Error>(()));
            if let Err(e) = r {
                assert!(!e.to_string().contains(password), "{e}");
                assert!(!format!("{e:?}").contains(password), "{e:?}");
            }
        }
        let seen = events.take();
        assert!(!seen.is_empty());
        let shown = format!("{seen:?}");
        assert!(!shown.contains(password), "{shown}");
        assert!(!format!("{store:?}").contains(password));
        assert!(!format!("{:?}", store.ping()).contains(password));
    }
}

#[test]
fn passwords_never_show_in_errors_or_events_of_a_cluster_at_run_time() {
    // Nothing listens on these ports.
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let password = "cluster-runtime-Zq-secret";
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://ada:{password}@127.0.0.1:{p}"))
        .collect();
    let rt = crate::support::rt();
    for open in [true, false] {
        let events = Events::default();
        let b = RedisStore::cluster(urls.clone())
            .prefix(unique("redaction"))
            .timeout(Duration::from_millis(100));
        let store = if open { b.fail_open() } else { b.fail_closed() }
            .build()
            .unwrap();
        let p = Pipeline::builder("guarded")
            .bulkhead(Bulkhead::new(1))
            .on_event(events.listener())
            .store(store.clone())
            .build()
            .unwrap();
        for _ in 0..3 {
            let sync = p.call(|_| Ok::<_, std::io::Error>(()));
            let run = rt.block_on(p.run(|_| async { Ok::<_, std::io::Error>(()) }));
            for r in [sync, run] {
                if let Err(e) = r {
                    assert!(!e.to_string().contains(password), "{e}");
                    assert!(!format!("{e:?}").contains(password), "{e:?}");
                }
            }
        }
        let seen = events.take();
        assert!(!seen.is_empty());
        let shown = format!("{seen:?}");
        assert!(!shown.contains(password), "{shown}");
        assert!(shown.contains("127.0.0.1"), "the nodes are named: {shown}");
        assert!(!format!("{store:?}").contains(password));
        assert!(!format!("{:?}", store.ping()).contains(password));
        assert!(!format!("{:?}", rt.block_on(store.ping_async())).contains(password));
    }
}
