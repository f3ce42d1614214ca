//! Behaviour of `#[resilient(...)]`: what the wrapped functions do at run
//! time. Compile errors are in `ui.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use seawall::store::{ResourceSpec, ResourceState};
use seawall::testing::VirtualClock;
use seawall::{
    resilient, Clock, Error, Event, EventKind, Rejection, RejectionReason, StateStore, StoreError,
    TimeoutError, Verdict,
};

/// The error of the functions under test; it can hold seawall's
/// rejections, timeouts and store failures.
#[derive(Debug, Clone, PartialEq)]
enum ApiError {
    Flaky(u32),
    Rejected(RejectionReason),
    TimedOut(Duration),
    Store,
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        ApiError::Rejected(r.reason)
    }
}

impl From<TimeoutError> for ApiError {
    fn from(t: TimeoutError) -> Self {
        ApiError::TimedOut(t.after)
    }
}

impl From<StoreError> for ApiError {
    fn from(_: StoreError) -> Self {
        ApiError::Store
    }
}

macro_rules! clock {
    ($name:ident) => {
        fn $name() -> VirtualClock {
            static CLOCK: LazyLock<VirtualClock> = LazyLock::new(VirtualClock::new);
            CLOCK.clone()
        }
    };
}

/// Events seen by `record`, as (resource, kind name).
static EVENTS: LazyLock<Mutex<Vec<(String, &'static str)>>> = LazyLock::new(Mutex::default);

fn record(event: &Event<'_>) {
    EVENTS
        .lock()
        .unwrap()
        .push((event.resource.to_owned(), kind_name(&event.kind)));
}

fn kind_name(kind: &EventKind) -> &'static str {
    match kind {
        EventKind::RetryScheduled { .. } => "retry_scheduled",
        EventKind::Rejected { .. } => "rejected",
        EventKind::CircuitOpened { .. } => "circuit_opened",
        EventKind::ShadowRejected { .. } => "shadow_rejected",
        _ => "other",
    }
}

fn events_of(resource: &str) -> Vec<&'static str> {
    EVENTS
        .lock()
        .unwrap()
        .iter()
        .filter(|(r, _)| r == resource)
        .map(|(_, k)| *k)
        .collect()
}

/// Fails its first `failures` calls.
#[derive(Default)]
struct Flaky {
    calls: AtomicU32,
    failures: u32,
}

impl Flaky {
    fn failing(failures: u32) -> Self {
        Flaky {
            calls: AtomicU32::new(0),
            failures,
        }
    }

    fn next(&self) -> Result<u32, ApiError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if n <= self.failures {
            Err(ApiError::Flaky(n))
        } else {
            Ok(n)
        }
    }

    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

clock!(async_clock);

struct Inventory {
    backend: Flaky,
}

impl Inventory {
    #[resilient(
        retry(max_attempts = 3, backoff = "constant", backoff_ms = 10),
        clock = async_clock
    )]
    async fn stock(&self, sku: &str) -> Result<String, ApiError> {
        let n = self.backend.next()?;
        Ok(format!("{sku}: {n}"))
    }
}

#[tokio::test]
async fn async_method_is_retried_until_it_succeeds() {
    let inventory = Inventory {
        backend: Flaky::failing(2),
    };
    assert_eq!(inventory.stock("apple").await.unwrap(), "apple: 3");
    assert_eq!(inventory.backend.calls(), 3);
    // Two constant waits of 10 ms, on the virtual clock.
    assert_eq!(async_clock().now(), Duration::from_millis(20));

    // When the attempts run out, the caller gets the last error as is.
    let inventory = Inventory {
        backend: Flaky::failing(10),
    };
    assert_eq!(inventory.stock("pear").await, Err(ApiError::Flaky(3)));
    assert_eq!(inventory.backend.calls(), 3);
    assert_eq!(async_clock().now(), Duration::from_millis(40));
}

#[test]
fn the_future_of_an_async_method_is_send() {
    fn send<T: Send>(_: &T) {}
    let inventory = Inventory {
        backend: Flaky::failing(0),
    };
    send(&inventory.stock("fig"));
}

clock!(sync_clock);

struct Counter {
    seen: Vec<u32>,
}

impl Counter {
    /// `&mut self` and `&mut` arguments work in sync methods: each attempt
    /// reborrows them.
    #[resilient(
        retry(max_attempts = 4, backoff = "linear", backoff_ms = 100),
        clock = sync_clock
    )]
    fn bump(&mut self, log: &mut Vec<u32>) -> Result<usize, ApiError> {
        let attempt = self.seen.len() as u32 + 1;
        self.seen.push(attempt);
        log.push(attempt);
        if attempt < 3 {
            return Err(ApiError::Flaky(attempt));
        }
        Ok(self.seen.len())
    }
}

#[test]
fn sync_method_is_retried_with_its_backoff() {
    let mut counter = Counter { seen: Vec::new() };
    let mut log = Vec::new();
    assert_eq!(counter.bump(&mut log), Ok(3));
    assert_eq!(log, [1, 2, 3]);
    // Linear backoff: 100 ms then 200 ms.
    assert_eq!(sync_clock().now(), Duration::from_millis(300));
}

static TAGS: AtomicU32 = AtomicU32::new(0);

/// Owned arguments are cloned for each attempt: the body may consume or
/// change its copy, the next attempt starts from the caller's value.
#[resilient(retry(max_attempts = 3, backoff = "constant", backoff_ms = 1))]
fn label(mut words: Vec<String>, (prefix, width): (String, usize)) -> Result<String, ApiError> {
    words.push(format!("{prefix}{width}"));
    let n = TAGS.fetch_add(1, Ordering::SeqCst) + 1;
    if n < 3 {
        return Err(ApiError::Flaky(n));
    }
    Ok(words.join(" "))
}

/// `_` arguments are accepted and passed on to the fallback.
#[resilient(retry(max_attempts = 2, backoff_ms = 1), fallback = count_tags)]
fn ignores(_: String, tag: &str) -> Result<usize, ApiError> {
    Err(ApiError::Flaky(tag.len() as u32))
}

fn count_tags(dropped: String, tag: &str, err: Error<ApiError>) -> Result<usize, ApiError> {
    assert!(matches!(err, Error::RetryExhausted { attempts: 2, .. }));
    Ok(dropped.len() + tag.len())
}

#[test]
fn free_function_clones_owned_arguments_for_each_attempt() {
    assert_eq!(ignores("abc".into(), "de"), Ok(5));
    let got = label(vec!["a".into(), "b".into()], ("w".into(), 4));
    assert_eq!(got.unwrap(), "a b w4");
    assert_eq!(TAGS.load(Ordering::SeqCst), 3);
}

/// What the fallback of `Mailer` saw.
#[derive(Debug, PartialEq)]
enum Fell {
    Exhausted {
        to: String,
        attempts: u32,
        last: ApiError,
    },
    Other(String),
}

struct Mailer {
    backend: Flaky,
    fell: Mutex<Vec<Fell>>,
}

impl Mailer {
    #[resilient(
        retry(max_attempts = 2, backoff = "constant", backoff_ms = 5),
        fallback = Self::queue_for_later
    )]
    async fn send(&self, to: &str, body: String) -> Result<&'static str, ApiError> {
        let _ = (to, body);
        self.backend.next().map(|_| "sent")
    }

    async fn queue_for_later(
        &self,
        to: &str,
        body: String,
        err: Error<ApiError>,
    ) -> Result<&'static str, ApiError> {
        assert_eq!(body, "hello");
        let fell = match err {
            Error::RetryExhausted { attempts, last } => Fell::Exhausted {
                to: to.to_owned(),
                attempts,
                last,
            },
            other => Fell::Other(format!("{other:?}")),
        };
        self.fell.lock().unwrap().push(fell);
        Ok("queued")
    }

    #[resilient(retry(max_attempts = 2, backoff_ms = 1), fallback = Self::draft)]
    fn save(&self, text: &str) -> Result<usize, ApiError> {
        self.backend.next().map(|_| text.len())
    }

    fn draft(&self, text: &str, err: Error<ApiError>) -> Result<usize, ApiError> {
        match err {
            Error::RetryExhausted { last, .. } => Err(last),
            _ => Ok(text.len() * 100),
        }
    }
}

#[tokio::test]
async fn fallback_gets_the_arguments_and_the_error() {
    let mailer = Mailer {
        backend: Flaky::failing(5),
        fell: Mutex::default(),
    };
    assert_eq!(
        mailer.send("ada@example.org", "hello".into()).await,
        Ok("queued")
    );
    assert_eq!(
        *mailer.fell.lock().unwrap(),
        [Fell::Exhausted {
            to: "ada@example.org".into(),
            attempts: 2,
            last: ApiError::Flaky(2),
        }]
    );
    // No fallback on success.
    let mailer = Mailer {
        backend: Flaky::failing(0),
        fell: Mutex::default(),
    };
    assert_eq!(
        mailer.send("bob@example.org", "hello".into()).await,
        Ok("sent")
    );
    assert!(mailer.fell.lock().unwrap().is_empty());
}

#[test]
fn sync_fallback_decides_the_result() {
    let mailer = Mailer {
        backend: Flaky::failing(5),
        fell: Mutex::default(),
    };
    assert_eq!(mailer.save("draft"), Err(ApiError::Flaky(2)));
    assert_eq!(mailer.backend.calls(), 2);
}

clock!(attempt_clock);
clock!(overall_clock);

/// Each attempt takes 100 ms; the first two fail.
struct Slow {
    backend: Flaky,
}

impl Slow {
    async fn attempt(&self, clock: VirtualClock) -> Result<u32, ApiError> {
        Clock::sleep(&clock, Duration::from_millis(100)).await;
        self.backend.next()
    }

    /// The timeout after the retry bounds each attempt.
    #[resilient(
        retry(max_attempts = 3, backoff = "constant", backoff_ms = 10),
        timeout_ms = 150,
        clock = attempt_clock
    )]
    async fn per_attempt(&self) -> Result<u32, ApiError> {
        self.attempt(attempt_clock()).await
    }

    /// The timeout before the retry bounds the whole call.
    #[resilient(
        timeout_ms = 150,
        retry(max_attempts = 3, backoff = "constant", backoff_ms = 10),
        clock = overall_clock
    )]
    async fn whole_call(&self) -> Result<u32, ApiError> {
        self.attempt(overall_clock()).await
    }
}

#[tokio::test]
async fn a_timeout_after_retry_bounds_each_attempt() {
    let slow = Slow {
        backend: Flaky::failing(2),
    };
    assert_eq!(slow.per_attempt().await, Ok(3));
    // Three attempts of 100 ms (each within its 150 ms) and two waits of 10 ms.
    assert_eq!(attempt_clock().now(), Duration::from_millis(320));
}

#[tokio::test]
async fn a_timeout_before_retry_bounds_the_whole_call() {
    let slow = Slow {
        backend: Flaky::failing(2),
    };
    assert_eq!(
        slow.whole_call().await,
        Err(ApiError::TimedOut(Duration::from_millis(150)))
    );
    // The second attempt (from 110 ms) was cut at the 150 ms deadline.
    assert_eq!(slow.backend.calls(), 1);
    assert_eq!(overall_clock().now(), Duration::from_millis(150));
}

clock!(breaker_clock);

struct Gateway {
    backend: Arc<Flaky>,
}

impl Gateway {
    #[resilient(
        circuit_breaker(consecutive_failures = 2, cooldown_s = 30),
        clock = breaker_clock,
        on_event = record
    )]
    async fn charge(&self, cents: u64) -> Result<u64, ApiError> {
        self.backend.next().map(|_| cents)
    }

    #[resilient(circuit_breaker(consecutive_failures = 2), clock = breaker_clock)]
    async fn refund(&self, cents: u64) -> Result<u64, ApiError> {
        self.backend.next().map(|_| cents)
    }
}

#[tokio::test]
async fn calls_share_one_circuit_keyed_by_type_and_method() {
    let backend = Arc::new(Flaky::failing(2));
    let one = Gateway {
        backend: Arc::clone(&backend),
    };
    let two = Gateway {
        backend: Arc::clone(&backend),
    };
    assert_eq!(one.charge(5).await, Err(ApiError::Flaky(1)));
    assert_eq!(two.charge(5).await, Err(ApiError::Flaky(2)));
    // Two failures in a row, through two instances: the one circuit is open,
    // and the rejection reaches the caller through `From<Rejection>`.
    assert_eq!(
        one.charge(5).await,
        Err(ApiError::Rejected(RejectionReason::CircuitOpen))
    );
    assert_eq!(backend.calls(), 2);
    // Another method has its own circuit.
    assert_eq!(two.refund(7).await, Ok(7));
    // After the cooldown, a probe closes the circuit again.
    breaker_clock().advance(Duration::from_secs(30));
    assert_eq!(two.charge(9).await, Ok(9));
    let events = events_of("Gateway::charge");
    assert!(events.contains(&"circuit_opened"), "{events:?}");
    assert!(events.contains(&"rejected"), "{events:?}");
}

clock!(shadow_clock);

/// New limits rolled out in shadow mode: reported, never enforced.
#[resilient(
    circuit_breaker(consecutive_failures = 1, cooldown_s = 60, max_half_open_s = 5, shadow),
    rate_limiter(limit = 1, per_s = 60, shadow = true),
    clock = shadow_clock,
    on_event = record
)]
fn rolled_out(fail: bool) -> Result<u32, ApiError> {
    if fail {
        Err(ApiError::Flaky(1))
    } else {
        Ok(1)
    }
}

#[test]
fn policies_in_shadow_mode_report_and_never_refuse() {
    assert_eq!(rolled_out(true), Err(ApiError::Flaky(1)));
    // The circuit is open and the one permit is taken: both would refuse;
    // the circuit, first, is the refusal reported.
    for _ in 0..3 {
        assert_eq!(rolled_out(false), Ok(1));
    }
    let events = events_of("resilient::rolled_out");
    assert_eq!(
        events.iter().filter(|e| **e == "shadow_rejected").count(),
        3,
        "{events:?}"
    );
    assert!(!events.contains(&"rejected"), "{events:?}");
}

/// An adaptive limit of 1 rolled out in shadow mode: each call nested in
/// another is over it, runs anyway and is reported.
#[resilient(
    adaptive_limit(algorithm = "aimd", min_limit = 1, initial_limit = 1, max_limit = 1, shadow),
    on_event = record
)]
fn nested_in_shadow(depth: u32) -> Result<u32, ApiError> {
    if depth == 0 {
        Ok(0)
    } else {
        nested_in_shadow(depth - 1).map(|d| d + 1)
    }
}

#[test]
fn an_adaptive_limit_in_shadow_mode_reports_and_never_refuses() {
    assert_eq!(nested_in_shadow(3), Ok(3));
    let events = events_of("resilient::nested_in_shadow");
    assert_eq!(
        events.iter().filter(|e| **e == "shadow_rejected").count(),
        3,
        "{events:?}"
    );
    assert!(!events.contains(&"rejected"), "{events:?}");
}

#[resilient(circuit_breaker(consecutive_failures = 1, max_half_open_ms = 0))]
fn no_time_in_half_open() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(expected = "circuit_breaker.max_half_open must be > 0")]
fn a_zero_max_half_open_is_refused_by_the_builder() {
    let _ = no_time_in_half_open();
}

clock!(order_clock);

struct Ordered {
    backend: Flaky,
}

impl Ordered {
    /// The breaker guards the whole call: one exhausted retry is one failure.
    #[resilient(
        circuit_breaker(consecutive_failures = 2),
        retry(max_attempts = 3, backoff = "constant", backoff_ms = 10),
        clock = order_clock
    )]
    async fn outside(&self) -> Result<u32, ApiError> {
        self.backend.next()
    }

    /// The breaker guards each attempt.
    #[resilient(
        retry(max_attempts = 3, backoff = "constant", backoff_ms = 10),
        circuit_breaker(consecutive_failures = 2),
        clock = order_clock
    )]
    fn inside(&self) -> Result<u32, ApiError> {
        self.backend.next()
    }
}

#[tokio::test]
async fn a_breaker_declared_before_the_retry_guards_the_whole_call() {
    let o = Ordered {
        backend: Flaky::failing(u32::MAX),
    };
    assert_eq!(o.outside().await, Err(ApiError::Flaky(3)));
    assert_eq!(o.outside().await, Err(ApiError::Flaky(6)));
    assert_eq!(
        o.outside().await,
        Err(ApiError::Rejected(RejectionReason::CircuitOpen))
    );
    assert_eq!(o.backend.calls(), 6);

    let i = Ordered {
        backend: Flaky::failing(u32::MAX),
    };
    // Opened by the second attempt: the third is refused.
    assert_eq!(
        i.inside(),
        Err(ApiError::Rejected(RejectionReason::CircuitOpen))
    );
    assert_eq!(i.backend.calls(), 2);
}

#[resilient(
    name = "search.query",
    bulkhead(max_concurrent = 1),
    on_event = record
)]
fn search(query: &str) -> Result<usize, ApiError> {
    if query == "again" {
        // A nested call while this one holds the only slot.
        return search("inner");
    }
    Ok(query.len())
}

#[resilient(retry(max_attempts = 2, backoff_ms = 1), on_event = record)]
fn keyed_by_module_path(_: u8) -> Result<(), ApiError> {
    Err(ApiError::Flaky(0))
}

#[test]
fn names_key_the_state() {
    assert_eq!(search("rust"), Ok(4));
    assert_eq!(
        search("again"),
        Err(ApiError::Rejected(RejectionReason::BulkheadFull))
    );
    assert!(events_of("search.query").contains(&"rejected"));
    let _ = keyed_by_module_path(0);
    assert!(!events_of("resilient::keyed_by_module_path").is_empty());
}

clock!(context_clock);

#[resilient(timeout_s = 5, retry(max_attempts = 2, backoff_ms = 100), context = ctx, clock = context_clock)]
async fn remaining_budget() -> Result<(u32, Duration), ApiError> {
    if ctx.is_first_attempt() {
        return Err(ApiError::Flaky(1));
    }
    Ok((ctx.attempt(), ctx.remaining().unwrap()))
}

#[tokio::test]
async fn the_body_sees_the_attempt_context() {
    let (attempt, remaining) = remaining_budget().await.unwrap();
    assert_eq!(attempt, 2);
    assert_eq!(remaining, Duration::from_millis(4900));
}

/// A store whose `bind` fails, like a remote store that cannot be reached.
#[derive(Debug)]
struct Unreachable;

impl StateStore for Unreachable {
    fn bind(&self, _: &ResourceSpec) -> Result<Arc<dyn ResourceState>, StoreError> {
        Err(StoreError::Unavailable("connection refused".into()))
    }
}

fn unreachable_store() -> Unreachable {
    Unreachable
}

struct Ledger;

impl Ledger {
    #[resilient(
        circuit_breaker(consecutive_failures = 3),
        store = unreachable_store
    )]
    fn post(&self) -> Result<(), ApiError> {
        unreachable!("the store cannot bind, so the body never runs")
    }

    #[resilient(
        circuit_breaker(consecutive_failures = 3),
        store = unreachable_store,
        fallback = Self::explain
    )]
    async fn post_async(&self, amount: i64) -> Result<String, ApiError> {
        Ok(amount.to_string())
    }

    async fn explain(&self, _: i64, err: Error<ApiError>) -> Result<String, ApiError> {
        Ok(format!("{err:?}"))
    }
}

#[tokio::test]
async fn a_store_that_cannot_bind_fails_the_call_as_a_store_error() {
    assert_eq!(Ledger.post(), Err(ApiError::Store));
    // Not cached: the next call tries to bind again.
    assert_eq!(Ledger.post(), Err(ApiError::Store));
    let message = Ledger.post_async(5).await.unwrap();
    assert!(message.contains("connection refused"), "{message}");
}

/// Generic functions and trait methods.
trait Fetch {
    fn fetch(&self, key: u32) -> Result<String, ApiError>;
}

struct Cache<T> {
    value: T,
}

impl<T: std::fmt::Display + Sync> Fetch for Cache<T> {
    #[resilient(retry(max_attempts = 2, backoff_ms = 1), on_event = record)]
    fn fetch(&self, key: u32) -> Result<String, ApiError> {
        if key == 0 {
            return Err(ApiError::Flaky(0));
        }
        Ok(format!("{}#{key}", self.value))
    }
}

#[resilient(retry(max_attempts = 2, backoff_ms = 1))]
fn first<T: Clone + std::fmt::Debug>(items: Vec<T>) -> std::result::Result<T, ApiError> {
    items.first().cloned().ok_or(ApiError::Flaky(0))
}

#[test]
fn generic_functions_and_trait_methods() {
    let cache = Cache { value: 'x' };
    assert_eq!(cache.fetch(1), Ok("x#1".to_owned()));
    assert_eq!(Cache { value: 2.5 }.fetch(0), Err(ApiError::Flaky(0)));
    // Generic arguments are not part of the key.
    assert!(events_of("Cache::fetch").contains(&"retry_scheduled"));
    assert_eq!(first(vec![3, 4]), Ok(3));
    assert_eq!(first::<u8>(vec![]), Err(ApiError::Flaky(0)));
}

/// `Flaky(n)` with an even `n` is permanent.
fn transient(e: &ApiError) -> bool {
    matches!(e, ApiError::Flaky(n) if n % 2 == 1)
}

fn judge(e: &ApiError) -> Verdict {
    match e {
        ApiError::Flaky(0) => Verdict::ignore(),
        _ => Verdict::retry(),
    }
}

struct Judged {
    backend: Flaky,
}

impl Judged {
    #[resilient(retry(max_attempts = 5, backoff_ms = 1), retry_if = transient)]
    fn until_permanent(&self) -> Result<u32, ApiError> {
        self.backend.next()
    }

    #[resilient(
        retry(max_attempts = 5, backoff_ms = 1),
        circuit_breaker(consecutive_failures = 1),
        classify = judge
    )]
    fn ignored(&self, fail: bool) -> Result<u32, ApiError> {
        if fail {
            return Err(ApiError::Flaky(0));
        }
        self.backend.next()
    }
}

#[test]
fn classifier_and_predicates_judge_the_errors() {
    let judged = Judged {
        backend: Flaky::failing(10),
    };
    // Flaky(1) is retried, Flaky(2) is not.
    assert_eq!(judged.until_permanent(), Err(ApiError::Flaky(2)));
    assert_eq!(judged.backend.calls(), 2);
    // An ignored error is neither retried nor counted by the breaker.
    let judged = Judged {
        backend: Flaky::failing(0),
    };
    assert_eq!(judged.ignored(true), Err(ApiError::Flaky(0)));
    assert_eq!(judged.ignored(true), Err(ApiError::Flaky(0)));
    assert_eq!(judged.ignored(false), Ok(1));
}

struct Names {
    names: Vec<String>,
}

impl Names {
    /// Results may borrow from `self` and the arguments.
    #[resilient(retry(max_attempts = 2, backoff_ms = 1))]
    fn find(&self, prefix: &str) -> Result<&str, ApiError> {
        self.names
            .iter()
            .find(|n| n.starts_with(prefix))
            .map(String::as_str)
            .ok_or(ApiError::Flaky(0))
    }

    #[resilient(retry(max_attempts = 2, backoff_ms = 1))]
    async fn longest<'a>(&'a self, other: &'a str) -> Result<&'a str, ApiError> {
        let mine = self
            .names
            .iter()
            .max_by_key(|n| n.len())
            .ok_or(ApiError::Flaky(0))?;
        Ok(if mine.len() >= other.len() {
            mine
        } else {
            other
        })
    }
}

/// One attempt at a time: a call made while another runs is refused by
/// the adaptive limit (a limit fixed at 1), and the refusal converts into
/// the function's error.
#[resilient(
    retry(max_attempts = 2, backoff_ms = 1),
    adaptive_limit(
        algorithm = "aimd",
        min_limit = 1,
        initial_limit = 1,
        max_limit = 1,
        update_interval_ms = 10,
        rtt_timeout_ms = 100,
        partitions = "live=0.9,batch=0.1",
    ),
    clock = adaptive_clock,
)]
fn one_at_a_time(depth: u32) -> Result<u32, ApiError> {
    if depth == 0 {
        return Ok(0);
    }
    match one_at_a_time(depth - 1) {
        // The inner call, refused while this one runs.
        Err(ApiError::Rejected(RejectionReason::ConcurrencyLimited)) => Ok(99),
        other => other,
    }
}

clock!(adaptive_clock);

#[test]
fn an_adaptive_limit_refuses_what_it_cannot_admit() {
    assert_eq!(one_at_a_time(0), Ok(0));
    assert_eq!(one_at_a_time(1), Ok(99));
    assert_eq!(one_at_a_time(0), Ok(0));
}

#[tokio::test]
async fn results_may_borrow_from_the_arguments() {
    let names = Names {
        names: vec!["ada".into(), "grace".into()],
    };
    assert_eq!(names.find("gr"), Ok("grace"));
    assert_eq!(names.find("x"), Err(ApiError::Flaky(0)));
    assert_eq!(names.longest("barbara").await, Ok("barbara"));
}

// Values are judged by `PipelineBuilder::build` when the pipeline is built,
// at the first call: a refused value panics there with the builder's
// message, which names the policy, the field and the rule.

#[resilient(retry(max_attempts = 0))]
fn no_attempts() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(
    expected = "seawall: invalid #[resilient] settings on `no_attempts`: retry.max_attempts must be >= 1, got 0"
)]
fn zero_attempts_are_refused_by_the_builder() {
    let _ = no_attempts();
}

#[resilient(retry(backoff_ms = 500, cap_ms = 100))]
fn cap_below_backoff() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(expected = "retry.cap must be >= base (500ms), got 100ms")]
fn a_cap_below_the_backoff_is_refused_by_the_builder() {
    let _ = cap_below_backoff();
}

#[resilient(circuit_breaker(failure_rate = 1.5))]
async fn rate_above_one() -> Result<(), ApiError> {
    Ok(())
}

#[tokio::test]
#[should_panic(expected = "circuit_breaker.failure_rate must be in (0, 1], got 1.5")]
async fn a_rate_above_one_is_refused_by_the_builder() {
    let _ = rate_above_one().await;
}

#[resilient(timeout_s = 60, bulkhead(max_concurrent = 4))]
fn lease_shorter_than_timeout() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(
    expected = "bulkhead.lease must exceed the attempt timeout (60s) by more than 1s, got 60s"
)]
fn a_lease_within_the_attempt_timeout_is_refused_by_the_builder() {
    let _ = lease_shorter_than_timeout();
}

#[resilient(adaptive_limit(algorithm = "aimd", min_limit = 10, max_limit = 5))]
fn inverted_limits() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(expected = "adaptive_limit.max_limit must be >= min_limit (10), got 5")]
fn inverted_adaptive_limits_are_refused_by_the_builder() {
    let _ = inverted_limits();
}

#[resilient(adaptive_limit(partitions = "live=0.9,batch=0.2"))]
fn shares_over_one() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(expected = "adaptive_limit.partitions must have shares that add up to 1")]
fn shares_that_do_not_add_up_are_refused_by_the_builder() {
    let _ = shares_over_one();
}

#[resilient(rate_limiter(limit = 0, per_s = 1), store = unreachable_store)]
fn no_permits_on_a_store() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(expected = "rate_limiter.limit must be >= 1, got 0")]
fn an_invalid_value_is_not_reported_as_a_store_error() {
    let _ = no_permits_on_a_store();
}

#[resilient(retry(max_attempts = 2), timeout_ms = 0)]
fn zero_timeout() -> Result<(), ApiError> {
    Ok(())
}

#[test]
#[should_panic(expected = "timeout.duration must be > 0")]
fn a_zero_timeout_is_refused_by_the_builder() {
    let _ = zero_timeout();
}

clock!(chaos_clock);

/// A latency injection written in the attribute: rate 1 adds the latency
/// to every attempt on the pipeline's clock.
#[resilient(retry(max_attempts = 2), chaos(rate = 1.0, latency_ms = 40), clock = chaos_clock)]
fn slowed() -> Result<u32, ApiError> {
    Ok(7)
}

#[test]
fn a_chaos_latency_is_injected() {
    assert_eq!(slowed(), Ok(7));
    assert_eq!(chaos_clock().now(), Duration::from_millis(40));
}

clock!(coalesce_clock);
static LOOKUPS: AtomicU32 = AtomicU32::new(0);

/// Concurrent lookups of one id run once; a found name is kept 10 s on
/// the virtual clock.
#[resilient(
    coalesce(ttl_s = 10, max_entries = 4),
    retry(max_attempts = 2, backoff = "constant", backoff_ms = 1),
    coalesce_key = *id,
    clock = coalesce_clock
)]
async fn user_name(id: &u64, wait_for: u32) -> Result<String, ApiError> {
    let n = LOOKUPS.fetch_add(1, Ordering::SeqCst) + 1;
    // The first lookup holds the execution open until `wait_for` others
    // wait for it (a bounded number of turns).
    for _ in 0..1_000_000u32 {
        if WAITING.load(Ordering::SeqCst) >= wait_for {
            break;
        }
        tokio::task::yield_now().await;
    }
    Ok(format!("user {id} #{n}"))
}

static WAITING: AtomicU32 = AtomicU32::new(0);

#[test]
fn coalesced_calls_of_a_function_share_one_execution_and_its_cache() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        // Eight concurrent lookups of id 1: the body runs once. The
        // followers are counted as they are polled into the wait.
        let leader = tokio::spawn(user_name_owned(1, 7));
        let followers: Vec<_> = (0..7)
            .map(|_| {
                tokio::spawn(async {
                    WAITING.fetch_add(1, Ordering::SeqCst);
                    user_name_owned(1, 0).await
                })
            })
            .collect();
        assert_eq!(leader.await.unwrap(), Ok(String::from("user 1 #1")));
        for f in followers {
            assert_eq!(f.await.unwrap(), Ok(String::from("user 1 #1")));
        }
        assert_eq!(LOOKUPS.load(Ordering::SeqCst), 1);
        // Another id runs; id 1 is answered from the cache until its ttl.
        assert_eq!(user_name(&2, 0).await, Ok(String::from("user 2 #2")));
        coalesce_clock().advance(Duration::from_millis(9_999));
        assert_eq!(user_name(&1, 0).await, Ok(String::from("user 1 #1")));
        coalesce_clock().advance(Duration::from_millis(1));
        assert_eq!(user_name(&1, 0).await, Ok(String::from("user 1 #3")));
        assert_eq!(LOOKUPS.load(Ordering::SeqCst), 3);
    });
}

async fn user_name_owned(id: u64, wait_for: u32) -> Result<String, ApiError> {
    user_name(&id, wait_for).await
}

clock!(hedging_clock);

/// Hedging written in the attribute: the first attempt is slow, the hedge
/// started after the delay answers first; each attempt sees its number.
#[resilient(timeout_s = 5, hedging(delay_ms = 20, max_hedged_attempts = 2), timeout_ms = 500, clock = hedging_clock, context = ctx)]
async fn hedged() -> Result<u32, ApiError> {
    let wait = if ctx.attempt() == 1 { 100 } else { 5 };
    seawall::Clock::sleep(&hedging_clock(), Duration::from_millis(wait)).await;
    Ok(ctx.attempt())
}

#[test]
fn a_hedge_answers_first() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(hedged()), Ok(2));
    assert_eq!(hedging_clock().now(), Duration::from_millis(25));
}

static SHARED_BUDGET_ATTEMPTS: AtomicU32 = AtomicU32::new(0);

/// A retry budget kept in the store (the global memory store here): one
/// token to start, half a token per call.
#[resilient(retry(
    max_attempts = 3,
    backoff = "constant",
    backoff_ms = 0,
    budget(ratio = 0.5, max_tokens = 1, shared)
))]
fn spends_a_shared_budget() -> Result<(), ApiError> {
    SHARED_BUDGET_ATTEMPTS.fetch_add(1, Ordering::SeqCst);
    Err(ApiError::Flaky(0))
}

#[test]
fn a_shared_budget_from_the_attribute_limits_the_retries() {
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let before = SHARED_BUDGET_ATTEMPTS.load(Ordering::SeqCst);
        let e = spends_a_shared_budget().unwrap_err();
        assert_eq!(e, ApiError::Rejected(RejectionReason::RetryBudgetExhausted));
        attempts.push(SHARED_BUDGET_ATTEMPTS.load(Ordering::SeqCst) - before);
    }
    // The token, then half a token (no retry), then a whole one again.
    assert_eq!(attempts, [2, 1, 2]);
}

/// A policy written in code that counts its passes and adds 100 to a
/// success: around the whole call or around each attempt.
struct Counting {
    name: &'static str,
    position: seawall::custom::Position,
    passes: &'static AtomicU32,
}

impl seawall::custom::Policy<u32, ApiError> for Counting {
    fn name(&self) -> &str {
        self.name
    }

    fn position(&self) -> seawall::custom::Position {
        self.position
    }

    fn call<'a>(
        &'a self,
        _ctx: seawall::Context,
        next: seawall::custom::Next<'a, u32, ApiError>,
    ) -> seawall::custom::PolicyFuture<'a, u32, ApiError> {
        self.passes.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { next.run().await.map(|v| v + 100) })
    }
}

static AROUND_CALL: AtomicU32 = AtomicU32::new(0);
static AROUND_ATTEMPT: AtomicU32 = AtomicU32::new(0);
static CUSTOM_RUNS: AtomicU32 = AtomicU32::new(0);

fn around_call() -> Counting {
    Counting {
        name: "around_call",
        position: seawall::custom::Position::Call,
        passes: &AROUND_CALL,
    }
}

fn around_attempt() -> Counting {
    Counting {
        name: "around_attempt",
        position: seawall::custom::Position::Attempt,
        passes: &AROUND_ATTEMPT,
    }
}

clock!(custom_clock);

/// Fails its first two runs: the retry makes three attempts, each through
/// the policy around the attempt, all inside one pass of the one around
/// the call.
#[resilient(
    policy = around_call,
    retry(max_attempts = 3, backoff_ms = 10),
    policy = around_attempt,
    clock = custom_clock
)]
fn with_policies_of_code() -> Result<u32, ApiError> {
    let run = CUSTOM_RUNS.fetch_add(1, Ordering::SeqCst) + 1;
    if run <= 2 {
        Err(ApiError::Flaky(run))
    } else {
        Ok(run)
    }
}

#[test]
fn policies_written_in_code_are_declared_in_list_order() {
    // The attempt's policy adds 100 to the third run, the call's another 100.
    assert_eq!(with_policies_of_code(), Ok(203));
    assert_eq!(CUSTOM_RUNS.load(Ordering::SeqCst), 3);
    assert_eq!(AROUND_CALL.load(Ordering::SeqCst), 1);
    assert_eq!(AROUND_ATTEMPT.load(Ordering::SeqCst), 3);
}

static MISPLACED: AtomicU32 = AtomicU32::new(0);

fn misplaced() -> Counting {
    Counting {
        name: "counting",
        position: seawall::custom::Position::Call,
        passes: &MISPLACED,
    }
}

/// A policy around the call declared after the retry: refused by `build()`
/// with the rule, as the builder refuses it.
#[resilient(retry(max_attempts = 2), policy = misplaced)]
fn with_a_misplaced_policy() -> Result<u32, ApiError> {
    Ok(1)
}

#[test]
#[should_panic(
    expected = "counting.position is `call` (around the whole call) but the policy is declared after `retry`"
)]
fn a_policy_of_code_in_the_wrong_place_is_refused_by_the_builder() {
    let _ = with_a_misplaced_policy();
}

static ASYNC_PASSES: AtomicU32 = AtomicU32::new(0);

fn around_async_call() -> Counting {
    Counting {
        name: "around_async_call",
        position: seawall::custom::Position::Call,
        passes: &ASYNC_PASSES,
    }
}

#[resilient(policy = around_async_call, timeout_ms = 500)]
async fn async_with_a_policy_of_code(n: u32) -> Result<u32, ApiError> {
    Ok(n)
}

#[test]
fn an_async_function_runs_through_a_policy_of_code() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(async_with_a_policy_of_code(7)), Ok(107));
    assert_eq!(rt.block_on(async_with_a_policy_of_code(8)), Ok(108));
    assert_eq!(ASYNC_PASSES.load(Ordering::SeqCst), 2);
}
