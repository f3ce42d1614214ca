//! Classifiers and fallbacks registered in code and named in the
//! configuration: configured pipelines classify and fall back as built
//! ones do, and bad names are load errors with their line. Every timing
//! runs on the virtual clock.
#![cfg(feature = "serde")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use seawall::config::{Format, LoadError, LookupError, Registry, RegistryBuilder};
use seawall::pipeline::{AnyResult, ErrorType, WithAsyncFallback, WithFallback};
use seawall::testing::VirtualClock;
use seawall::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// An HTTP error: a status and, maybe, a `Retry-After` in seconds.
#[derive(Debug, Clone, PartialEq)]
struct HttpError {
    status: u16,
    retry_after: Option<u64>,
}

fn status(status: u16) -> HttpError {
    HttpError {
        status,
        retry_after: None,
    }
}

/// Server errors and 429 are retried (429 with its hint), the rest abort.
fn classify_http(e: &HttpError) -> Verdict {
    let v = match e.status {
        429 => Verdict::throttled(),
        500.. => Verdict::retry(),
        _ => Verdict::abort(),
    };
    match e.retry_after {
        Some(s) => v.with_retry_after(secs(s)),
        None => v,
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Quote(u32);

fn builder(clock: &VirtualClock) -> RegistryBuilder {
    Registry::builder()
        .store(MemoryStore::new())
        .clock(clock.clone())
        .classifier("http", classify_http)
        .fallback_sync("cached_quote", |_e: Error<HttpError>, _ctx| Ok(Quote(7)))
        .fallback("cached_quote_async", |_e: Error<HttpError>, _ctx| async {
            Ok(Quote(8))
        })
}

const QUOTES: &str = r#"
[pipelines.quotes]
policies = ["retry", "cooldown"]
retry = { max_attempts = 3, delay = "1s" }
cooldown = { max_wait = "0s" }
classifier = "http"
"#;

/// Runs the same calls on `p`: the number of attempts of each, and the
/// error of each.
fn script<K: pipeline::HandlesSync<(), HttpError>>(
    p: &Pipeline<K>,
) -> Vec<(u32, Result<(), String>)> {
    let mut out = Vec::new();
    for e in [
        status(404),
        status(503),
        HttpError {
            status: 429,
            retry_after: Some(30),
        },
        status(503),
    ] {
        let mut attempts = 0;
        let r = p.call(|_| {
            attempts += 1;
            Err::<(), _>(e.clone())
        });
        out.push((attempts, r.map_err(|e| format!("{e:?}"))));
    }
    out
}

#[test]
fn a_named_classifier_classifies_as_the_same_classifier_in_code() {
    let clock = VirtualClock::new();
    let registry = builder(&clock).load_str(Format::Toml, QUOTES).unwrap();
    let configured = registry.typed::<ErrorType<HttpError>>("quotes").unwrap();
    let configured_run = script(&configured);

    let clock = VirtualClock::new();
    let in_code = Pipeline::builder("quotes")
        .store(MemoryStore::new())
        .clock(clock.clone())
        .retry(Retry::constant(secs(1)).max_attempts(3))
        .cooldown(Cooldown::new().max_wait(Duration::ZERO))
        .classify(classify_http)
        .build()
        .unwrap();
    assert_eq!(configured_run, script(&in_code));

    // An abort is not retried; a server error is; the 429's hint opens the
    // cooldown, which refuses the next call without running it.
    assert_eq!(configured_run[0].0, 1, "{configured_run:?}");
    assert_eq!(configured_run[1].0, 3, "{configured_run:?}");
    assert_eq!(configured_run[3].0, 0, "{configured_run:?}");
    assert!(
        configured_run[3]
            .1
            .as_ref()
            .unwrap_err()
            .contains("CooldownActive"),
        "{configured_run:?}"
    );
}

#[test]
fn a_named_sync_fallback_answers_call_and_run() {
    let clock = VirtualClock::new();
    let registry = builder(&clock)
        .load_str(
            Format::Yaml,
            "
pipelines:
  quotes:
    retry: { max_attempts: 2, delay: 1s }
    classifier: http
    fallback: cached_quote
",
        )
        .unwrap();
    let quotes = registry
        .typed::<WithFallback<Quote, HttpError>>("quotes")
        .unwrap();
    let mut attempts = 0;
    let q = quotes.call(|_| {
        attempts += 1;
        Err(status(404))
    });
    assert_eq!(q.unwrap(), Quote(7));
    assert_eq!(attempts, 1, "the named classifier aborts a 404");
    assert_eq!(clock.now(), Duration::ZERO);

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let attempts = AtomicU32::new(0);
    let q = rt.block_on(quotes.run(|_| {
        attempts.fetch_add(1, Ordering::Relaxed);
        async { Err(status(503)) }
    }));
    assert_eq!(q.unwrap(), Quote(7));
    assert_eq!(attempts.load(Ordering::Relaxed), 2);
    assert_eq!(clock.now(), secs(1), "one retry wait, on the virtual clock");
}

#[test]
fn a_named_async_fallback_answers_run() {
    let clock = VirtualClock::new();
    let registry = builder(&clock)
        .load_str(
            Format::Toml,
            "[pipelines.quotes]\ntimeout = \"5s\"\nfallback = \"cached_quote_async\"\n",
        )
        .unwrap();
    let quotes = registry
        .typed::<WithAsyncFallback<Quote, HttpError>>("quotes")
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let q = rt.block_on(quotes.run(|_| async { Err(status(500)) }));
    assert_eq!(q.unwrap(), Quote(8));
    // An answer of the operation is not replaced.
    let q = rt.block_on(quotes.run(|_| async { Ok::<_, HttpError>(Quote(1)) }));
    assert_eq!(q.unwrap(), Quote(1));
}

#[test]
fn unknown_names_fail_the_load_with_their_line() {
    let clock = VirtualClock::new();
    let e = builder(&clock)
        .load_str(
            Format::Toml,
            "[pipelines.quotes]\ntimeout = \"5s\"\nclassifier = \"grpc\"\n",
        )
        .unwrap_err();
    assert!(matches!(e, LoadError::Invalid { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "<string>:3:14: pipeline `quotes`: pipeline.classifier `grpc` is not registered (registered classifiers: `http`); register it with `RegistryBuilder::classifier`"
    );

    let e = builder(&clock)
        .load_str(
            Format::Yaml,
            "default:\n  fallback: stale\npipelines:\n  quotes:\n    timeout: 5s\n",
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("<string>:2:13: pipeline `quotes`: "),
        "{msg}"
    );
    assert!(
        msg.contains("pipeline.fallback `stale` is not registered (registered fallbacks: `cached_quote`, `cached_quote_async`)"),
        "{msg}"
    );

    // Without any registration.
    let e = Registry::builder()
        .store(MemoryStore::new())
        .load_str(Format::Toml, "[pipelines.q]\nclassifier = \"http\"\n")
        .unwrap_err();
    assert!(
        e.to_string().contains("(registered classifiers: none)"),
        "{e}"
    );
    assert_eq!(e.line(), Some(2));
}

#[test]
fn a_classifier_and_a_fallback_of_other_error_types_are_refused() {
    let clock = VirtualClock::new();
    let e = builder(&clock)
        .fallback_sync("io_default", |_e: Error<std::io::Error>, _ctx| Ok(0_u8))
        .load_str(
            Format::Toml,
            "[pipelines.quotes]\nclassifier = \"http\"\nfallback = \"io_default\"\n",
        )
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("<string>:3:12: pipeline `quotes`: "),
        "{msg}"
    );
    assert!(
        msg.contains("pipeline.fallback `io_default` handles errors of type `std::io::error::Error`, but classifier `http` handles `config_named::HttpError`"),
        "{msg}"
    );
}

#[test]
fn a_lookup_of_another_kind_names_both_kinds() {
    let clock = VirtualClock::new();
    let registry = builder(&clock)
        .load_str(
            Format::Toml,
            &format!("{QUOTES}\n[pipelines.plain]\ntimeout = \"1s\"\n"),
        )
        .unwrap();
    // Wrong error type.
    let e = registry
        .typed::<ErrorType<std::io::Error>>("quotes")
        .unwrap_err();
    assert!(matches!(&e, LookupError::Kind { name, .. } if name == "quotes"));
    assert!(
        e.to_string().contains("is a `Pipeline<seawall::pipeline::kind::ErrorType<config_named::HttpError>>`, not a `Pipeline<seawall::pipeline::kind::ErrorType<std::io::error::Error>>`"),
        "{e}"
    );
    // A fallback asked of a pipeline that names none.
    assert!(matches!(
        registry.typed::<WithFallback<Quote, HttpError>>("quotes"),
        Err(LookupError::Kind { .. })
    ));
    // The untyped lookups refuse a pipeline with named handlers rather
    // than run it without them.
    assert!(registry.get("quotes").is_none());
    let e = registry.pipeline("quotes").unwrap_err();
    assert!(
        e.to_string().contains("look it up with `Registry::typed`"),
        "{e}"
    );
    assert!(registry.handle("quotes").is_err());
    // A pipeline without named handlers: untyped, or typed `AnyResult`.
    assert!(registry.typed::<AnyResult>("plain").is_ok());
    assert!(registry.get("plain").is_some());
    assert!(matches!(
        registry.typed::<ErrorType<HttpError>>("plain"),
        Err(LookupError::Kind { .. })
    ));
    assert!(matches!(
        registry.typed::<AnyResult>("missing"),
        Err(LookupError::Unknown(_))
    ));
}

#[test]
fn a_reload_that_changes_the_named_fallback_takes_effect() {
    let clock = VirtualClock::new();
    let calls = Arc::new(AtomicU32::new(0));
    let seen = calls.clone();
    let registry = builder(&clock)
        .fallback_sync("fresh_quote", move |_e: Error<HttpError>, _ctx| {
            seen.fetch_add(1, Ordering::Relaxed);
            Ok(Quote(9))
        })
        .load_str(
            Format::Toml,
            "[pipelines.quotes]\ntimeout = \"1s\"\nfallback = \"cached_quote\"\n",
        )
        .unwrap();
    let quote = || {
        registry
            .typed::<WithFallback<Quote, HttpError>>("quotes")
            .unwrap()
            .call(|_| Err(status(500)))
            .unwrap()
    };
    assert_eq!(quote(), Quote(7));

    // A reload naming an unknown fallback keeps the old pipeline.
    let e = registry
        .reload_str(
            Format::Toml,
            "[pipelines.quotes]\ntimeout = \"1s\"\nfallback = \"nope\"\n",
        )
        .unwrap_err();
    assert_eq!(e.line(), Some(3));
    assert_eq!(quote(), Quote(7));

    registry
        .reload_str(
            Format::Toml,
            "[pipelines.quotes]\ntimeout = \"1s\"\nfallback = \"fresh_quote\"\n",
        )
        .unwrap();
    assert_eq!(quote(), Quote(9));
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

/// A throttled call opens the cooldown; the next is refused by it.
fn throttle_then_call(p: &Pipeline<WithFallback<Quote, HttpError>>) -> [Result<Quote, String>; 2] {
    let call = |e: HttpError| p.call(|_| Err(e.clone())).map_err(|e| format!("{e:?}"));
    [
        call(HttpError {
            status: 429,
            retry_after: Some(30),
        }),
        call(status(500)),
    ]
}

#[test]
fn fallback_on_limits_the_named_fallback_to_kinds_of_error() {
    let clock = VirtualClock::new();
    let text = |on: &str| {
        format!(
            "[pipelines.quotes]\ncooldown = {{ max_wait = \"0s\" }}\nclassifier = \"http\"\nfallback = \"cached_quote\"\nfallback_on = {on}\n"
        )
    };
    let registry = builder(&clock)
        .load_str(Format::Toml, &text(r#"["rejected"]"#))
        .unwrap();
    let quotes = || {
        registry
            .typed::<WithFallback<Quote, HttpError>>("quotes")
            .unwrap()
    };
    let [first, second] = throttle_then_call(&quotes());
    assert!(
        first.unwrap_err().starts_with("Operation("),
        "not a rejection: propagated"
    );
    assert_eq!(second, Ok(Quote(7)), "the cooldown's rejection falls back");

    // A rejection reason: only rejections of that reason fall back. (The
    // cooldown, unchanged by the reload, keeps its state: let it end.)
    clock.advance(secs(31));
    registry
        .reload_str(Format::Toml, &text(r#"["circuit_open", "operation"]"#))
        .unwrap();
    let [first, second] = throttle_then_call(&quotes());
    assert_eq!(first, Ok(Quote(7)), "an operation error falls back");
    assert!(
        second.unwrap_err().contains("CooldownActive"),
        "not a circuit_open"
    );
}

#[test]
fn bad_fallback_on_lists_are_refused_with_their_line() {
    let clock = VirtualClock::new();
    let e = builder(&clock)
        .load_str(
            Format::Toml,
            "[pipelines.quotes]\nfallback = \"cached_quote\"\nfallback_on = [\"timeouts\"]\n",
        )
        .unwrap_err();
    assert!(matches!(e, LoadError::Parse { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.starts_with("<string>:3:"), "{msg}");
    assert!(
        msg.contains("unknown variant `timeouts`, expected one of `operation`, `retry_exhausted`, `timeout`, `rejected`, `store`, `circuit_open`"),
        "{msg}"
    );

    let e = builder(&clock)
        .load_str(
            Format::Toml,
            "[pipelines.quotes]\ntimeout = \"1s\"\nfallback_on = [\"timeout\"]\n",
        )
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "<string>:3:15: pipeline `quotes`: pipeline.fallback_on needs a `fallback`: name one, or remove `fallback_on`"
    );

    let e = builder(&clock)
        .load_str(
            Format::Yaml,
            "pipelines:\n  quotes:\n    fallback: cached_quote\n    fallback_on: []\n",
        )
        .unwrap_err();
    assert_eq!(e.line(), Some(4), "{e}");
    assert!(e.to_string().contains("lists no kind of error"), "{e}");
}
