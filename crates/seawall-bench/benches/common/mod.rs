//! The contenders of every scenario, seawall and its peers, built so that
//! each pair does the same work: the same protected operation (a ready
//! `Ok(u64)`), the outcome recorded where the policy records outcomes, the
//! clock read where the policy needs it. Shared by the timing benchmark
//! (`peers`) and the allocation counter (`memory`).
//!
//! A sync contender is a closure making one call; an async one is an
//! [`AsyncCase`], cloned once per thread (clones share the policy's state,
//! as they do in a real service).

// Each benchmark binary uses a part of these.
#![allow(dead_code)]

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use failsafe::CircuitBreaker as _;
use seawall::pipeline::{AnyResult, Kind};
use seawall::Pipeline;
use seawall_bench::{failing_op, op, pipelines, Oops, UNREACHABLE_RATE};
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

// ------------------------------------------------------------------ shapes

/// One async call of a contender; clones share the contender's state.
pub(crate) trait AsyncCase: Clone + Send + 'static {
    /// Makes one call; `true` when it returned the operation's own value
    /// (not an error, not a fallback value).
    fn call(&mut self) -> impl Future<Output = bool>;
}

/// A seawall pipeline called with `run`.
pub(crate) struct SeawallAsync<K: Kind = AnyResult>(pub(crate) Pipeline<K>);

impl<K: Kind> Clone for SeawallAsync<K> {
    fn clone(&self) -> Self {
        SeawallAsync(self.0.clone())
    }
}

impl AsyncCase for SeawallAsync<AnyResult> {
    async fn call(&mut self) -> bool {
        matches!(self.0.run(|_| async { op(black_box(1)) }).await, Ok(1))
    }
}

impl AsyncCase for SeawallAsync<seawall::pipeline::WithFallback<u64, Oops>> {
    async fn call(&mut self) -> bool {
        matches!(self.0.run(|_| async { op(black_box(1)) }).await, Ok(1))
    }
}

/// A seawall pipeline called with `weighted(weight)?.run`: each call takes
/// `weight` rate-limit permits.
#[derive(Clone)]
pub(crate) struct SeawallWeighted(pub(crate) Pipeline, pub(crate) u32);

impl AsyncCase for SeawallWeighted {
    async fn call(&mut self) -> bool {
        let weighted = self.0.weighted(self.1).expect("a weight of at least 1");
        matches!(weighted.run(|_| async { op(black_box(1)) }).await, Ok(1))
    }
}

/// A tower service driven as tower services are: `ready()`, then `call`.
#[derive(Clone)]
pub(crate) struct Tower<S>(pub(crate) S);

impl<S> AsyncCase for Tower<S>
where
    S: Service<u64, Response = u64> + Clone + Send + 'static,
{
    async fn call(&mut self) -> bool {
        let ready = match self.0.ready().await {
            Ok(s) => s,
            Err(_) => return false,
        };
        matches!(ready.call(black_box(1)).await, Ok(1))
    }
}

/// A seatbelt stack (`layered::Service::execute`).
pub(crate) struct Seatbelt<S>(pub(crate) Arc<S>);

impl<S> Clone for Seatbelt<S> {
    fn clone(&self) -> Self {
        Seatbelt(Arc::clone(&self.0))
    }
}

impl<S> AsyncCase for Seatbelt<S>
where
    S: layered::Service<u64, Out = Result<u64, Oops>> + 'static,
{
    async fn call(&mut self) -> bool {
        matches!(self.0.execute(black_box(1)).await, Ok(1))
    }
}

/// A plain async closure.
#[derive(Clone)]
pub(crate) struct Closure<F>(pub(crate) F);

impl<F, Fut> AsyncCase for Closure<F>
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = bool>,
{
    async fn call(&mut self) -> bool {
        (self.0)().await
    }
}

/// The inner tower service every tower stack wraps: the protected operation.
pub(crate) fn tower_op() -> tower::util::ServiceFn<
    impl FnMut(u64) -> std::future::Ready<Result<u64, Oops>> + Clone + Send + 'static,
> {
    tower::service_fn(|x: u64| std::future::ready(op(x)))
}

/// A seatbelt context on a clock driven by the current tokio runtime.
/// Must be called inside a runtime.
pub(crate) fn seatbelt_context() -> seatbelt::ResilienceContext<u64, Result<u64, Oops>> {
    seatbelt::ResilienceContext::new(tick::Clock::new_tokio()).name("bench")
}

fn seatbelt_op() -> layered::Execute<
    impl Fn(u64) -> std::future::Ready<Result<u64, Oops>> + Send + Sync + Clone + 'static,
> {
    layered::Execute::new(|x: u64| std::future::ready(op(x)))
}

fn seatbelt_recovery(
    r: &Result<u64, Oops>,
    _: seatbelt::retry::RecoveryArgs,
) -> seatbelt::RecoveryInfo {
    match r {
        Ok(_) => seatbelt::RecoveryInfo::never(),
        Err(_) => seatbelt::RecoveryInfo::retry(),
    }
}

fn seatbelt_breaker_recovery(
    r: &Result<u64, Oops>,
    _: seatbelt::breaker::RecoveryArgs,
) -> seatbelt::RecoveryInfo {
    match r {
        Ok(_) => seatbelt::RecoveryInfo::never(),
        Err(_) => seatbelt::RecoveryInfo::retry(),
    }
}

// ------------------------------------------------------------------- retry

/// backon's blocking retry: exponential from 10 ms, 2 retries (3 attempts), jitter.
pub(crate) fn backon_builder() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(10))
        .with_max_times(2)
        .with_jitter()
}

/// backon, blocking: one call.
pub(crate) fn backon_sync() -> impl Fn() -> bool + Clone + Send + Sync {
    let builder = backon_builder();
    move || {
        use backon::BlockingRetryable;
        matches!((|| op(black_box(1))).retry(builder).call(), Ok(1))
    }
}

/// backon, async (tokio sleeper).
pub(crate) fn backon_async() -> impl AsyncCase {
    let builder = backon_builder();
    Closure(move || async move {
        use backon::Retryable;
        matches!((|| async { op(black_box(1)) }).retry(builder).await, Ok(1))
    })
}

/// A tower retry policy: never retries a success; up to 2 retries after
/// 10 ms on an error.
#[derive(Clone)]
pub(crate) struct Attempts(pub(crate) usize);

impl tower::retry::Policy<u64, u64, Oops> for Attempts {
    type Future = tokio::time::Sleep;

    fn retry(&mut self, _req: &mut u64, result: &mut Result<u64, Oops>) -> Option<Self::Future> {
        match result {
            Ok(_) => None,
            Err(_) if self.0 > 0 => {
                self.0 -= 1;
                Some(tokio::time::sleep(Duration::from_millis(10)))
            }
            Err(_) => None,
        }
    }

    fn clone_request(&mut self, req: &u64) -> Option<u64> {
        Some(*req)
    }
}

/// tower's retry middleware.
pub(crate) fn tower_retry() -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    Tower(tower::retry::Retry::new(Attempts(2), tower_op()))
}

/// tower-resilience's retry: 3 attempts, exponential from 10 ms.
pub(crate) fn tower_resilience_retry(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::retry::RetryLayer::<u64, u64, Oops>::builder()
        .max_attempts(3)
        .exponential_backoff(Duration::from_millis(10))
        .build();
    Tower(layer.layer(tower_op()))
}

// ----------------------------------------------------------------- breaker

/// recloser: failure rate 50 % over the last 100 calls.
pub(crate) fn recloser() -> Arc<recloser::Recloser> {
    Arc::new(
        recloser::Recloser::custom()
            .error_rate(0.5)
            .closed_len(100)
            .half_open_len(1)
            .open_wait(Duration::from_secs(3600))
            .build(),
    )
}

/// recloser, one call.
pub(crate) fn recloser_call(r: &recloser::Recloser) -> bool {
    matches!(r.call(|| op(black_box(1))), Ok(1))
}

/// recloser, tripped open.
pub(crate) fn recloser_open() -> Arc<recloser::Recloser> {
    let r = recloser();
    for _ in 0..200 {
        let _ = r.call(|| failing_op(1));
    }
    assert!(matches!(r.call(|| op(1)), Err(recloser::Error::Rejected)));
    r
}

/// failsafe with its default policy (success rate over a time window, or
/// consecutive failures).
pub(crate) fn failsafe() -> Arc<impl failsafe::CircuitBreaker + Send + Sync> {
    Arc::new(failsafe::Config::new().build())
}

/// failsafe opening after 5 failures in a row.
pub(crate) fn failsafe_consecutive() -> Arc<impl failsafe::CircuitBreaker + Send + Sync> {
    let backoff = failsafe::backoff::constant(Duration::from_secs(60));
    Arc::new(
        failsafe::Config::new()
            .failure_policy(failsafe::failure_policy::consecutive_failures(5, backoff))
            .build(),
    )
}

/// failsafe, one call.
pub(crate) fn failsafe_call(cb: &impl failsafe::CircuitBreaker) -> bool {
    matches!(cb.call(|| op(black_box(1))), Ok(1))
}

/// failsafe, tripped open (a one-hour backoff).
pub(crate) fn failsafe_open() -> Arc<impl failsafe::CircuitBreaker + Send + Sync> {
    let backoff = failsafe::backoff::constant(Duration::from_secs(3600));
    let cb = Arc::new(
        failsafe::Config::new()
            .failure_policy(failsafe::failure_policy::consecutive_failures(1, backoff))
            .build(),
    );
    let _ = cb.call(|| failing_op(1));
    assert!(matches!(cb.call(|| op(1)), Err(failsafe::Error::Rejected)));
    cb
}

fn tower_resilience_breaker_layer() -> tower_resilience::circuitbreaker::CircuitBreakerLayer<
    tower_resilience::circuitbreaker::DefaultClassifier,
> {
    tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .failure_rate_threshold(0.5)
        .sliding_window_size(100)
        .minimum_number_of_calls(100)
        .wait_duration_in_open(Duration::from_secs(3600))
        .build()
        .expect("valid breaker")
}

/// tower-resilience's circuit breaker: failure rate 50 % over 100 calls.
pub(crate) fn tower_resilience_breaker(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    Tower(tower_resilience_breaker_layer().layer(tower_op()))
}

/// tower-resilience's circuit breaker opening after 5 failures in a row.
pub(crate) fn tower_resilience_consecutive(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
        .consecutive_failures(5)
        .wait_duration_in_open(Duration::from_secs(60))
        .build()
        .expect("valid breaker");
    Tower(layer.layer(tower_op()))
}

/// tower-resilience's circuit breaker, tripped open. The service fails
/// while `fail` is set.
pub(crate) fn tower_resilience_open(
    rt: &tokio::runtime::Runtime,
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = Arc::clone(&fail);
    let svc = tower::service_fn(move |x: u64| {
        std::future::ready(if flag.load(std::sync::atomic::Ordering::Relaxed) {
            failing_op(x)
        } else {
            op(x)
        })
    });
    let mut svc = tower_resilience_breaker_layer().layer(svc);
    rt.block_on(async {
        for _ in 0..100 {
            if let Ok(s) = svc.ready().await {
                let _ = s.call(1).await;
            }
        }
    });
    fail.store(false, std::sync::atomic::Ordering::Relaxed);
    assert!(svc.is_open(), "the breaker must be open");
    Tower(svc)
}

/// seatbelt's circuit breaker (defaults: failure threshold over a sampling window).
pub(crate) fn seatbelt_breaker(
    rt: &tokio::runtime::Runtime,
) -> Seatbelt<impl layered::Service<u64, Out = Result<u64, Oops>> + 'static> {
    use layered::Stack;
    let _enter = rt.enter();
    let context = seatbelt_context();
    let stack = (
        seatbelt::breaker::Breaker::layer("breaker", &context)
            .recovery_with(seatbelt_breaker_recovery)
            .rejected_input_error(|_, _| Oops)
            .failure_threshold(0.5)
            .min_throughput(100)
            .break_duration(Duration::from_secs(3600)),
        seatbelt_op(),
    );
    Seatbelt(Arc::new(stack.into_service()))
}

/// seatbelt's circuit breaker, tripped open.
pub(crate) fn seatbelt_open(
    rt: &tokio::runtime::Runtime,
) -> Seatbelt<impl layered::Service<u64, Out = Result<u64, Oops>> + 'static> {
    use layered::{Service as _, Stack};
    let _enter = rt.enter();
    let context = seatbelt_context();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = Arc::clone(&fail);
    let stack = (
        seatbelt::breaker::Breaker::layer("breaker", &context)
            .recovery_with(seatbelt_breaker_recovery)
            .rejected_input_error(|_, _| Oops)
            .min_throughput(10)
            .break_duration(Duration::from_secs(3600)),
        layered::Execute::new(move |x: u64| {
            std::future::ready(if flag.load(std::sync::atomic::Ordering::Relaxed) {
                failing_op(x)
            } else {
                op(x)
            })
        }),
    );
    let svc = stack.into_service();
    rt.block_on(async {
        for _ in 0..1000 {
            let _ = svc.execute(1).await;
        }
    });
    fail.store(false, std::sync::atomic::Ordering::Relaxed);
    let rejected = rt.block_on(svc.execute(1));
    assert_eq!(rejected, Err(Oops), "the breaker must be open");
    Seatbelt(Arc::new(svc))
}

// ------------------------------------------------------------ rate limiter

/// governor's direct limiter: 10^9 per second, bursts of 10^6 (quanta clock).
pub(crate) fn governor() -> Arc<governor::DefaultDirectRateLimiter> {
    let quota = governor::Quota::per_second(NonZeroU32::new(UNREACHABLE_RATE).expect("> 0"))
        .allow_burst(NonZeroU32::new(1_000_000).expect("> 0"));
    Arc::new(governor::RateLimiter::direct(quota))
}

/// governor, one `check()`.
pub(crate) fn governor_check(l: &governor::DefaultDirectRateLimiter) -> bool {
    l.check().is_ok() && op(black_box(1)) == Ok(1)
}

/// governor's keyed limiter on its `HashMap` store (the store it has
/// without the `dashmap` feature): 10^9 per second per key, bursts of 10^6.
pub(crate) fn governor_keyed() -> Arc<
    governor::RateLimiter<
        u64,
        governor::state::keyed::HashMapStateStore<u64>,
        governor::clock::DefaultClock,
    >,
> {
    let quota = governor::Quota::per_second(NonZeroU32::new(UNREACHABLE_RATE).expect("> 0"))
        .allow_burst(NonZeroU32::new(1_000_000).expect("> 0"));
    Arc::new(governor::RateLimiter::hashmap(quota))
}

/// tower-resilience's token bucket (its GCRA equivalent): 10^9 per second,
/// bursts of 10^6.
pub(crate) fn tower_resilience_token_bucket(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::ratelimiter::RateLimiterLayer::burst(
        UNREACHABLE_RATE as usize,
        1_000_000,
    )
    .timeout_duration(Duration::ZERO)
    .build()
    .expect("valid limiter");
    Tower(layer.layer(tower_op()))
}

/// tower-resilience's fixed window: `u32::MAX` per second.
pub(crate) fn tower_resilience_fixed_window(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::ratelimiter::RateLimiterLayer::builder()
        .limit_for_period(u32::MAX as usize)
        .refresh_period(Duration::from_secs(1))
        .timeout_duration(Duration::ZERO)
        .build()
        .expect("valid limiter");
    Tower(layer.layer(tower_op()))
}

/// tower-resilience's sliding log (exact, like seawall's sliding window).
pub(crate) fn tower_resilience_sliding_log(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let (limit, period) = pipelines::SLIDING;
    let layer = tower_resilience::ratelimiter::RateLimiterLayer::builder()
        .window_type(tower_resilience::ratelimiter::WindowType::SlidingLog)
        .limit_for_period(limit as usize)
        .refresh_period(period)
        .timeout_duration(Duration::ZERO)
        .build()
        .expect("valid limiter");
    Tower(layer.layer(tower_op()))
}

// ---------------------------------------------------------------- bulkhead

/// The floor of a bulkhead: a tokio semaphore of 64 permits.
pub(crate) fn semaphore() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(64))
}

/// One sync bulkhead round on the semaphore: `try_acquire`, the operation,
/// drop of the permit.
pub(crate) fn semaphore_call(s: &tokio::sync::Semaphore) -> bool {
    let permit = s.try_acquire();
    permit.is_ok() && op(black_box(1)) == Ok(1)
}

/// A semaphore round that also measures the call's latency, as any
/// adaptive limit must: two readings of the time-stamp counter (`quanta`,
/// the clock seawall's system clock reads) and their distance scaled to
/// nanoseconds. The floor of a latency-measuring limit built on the same
/// atomics; nothing else is done with the latency.
pub(crate) fn semaphore_timed_call(s: &tokio::sync::Semaphore, clock: &quanta::Clock) -> bool {
    let start = clock.raw();
    let permit = s.try_acquire();
    let ok = permit.is_ok() && op(black_box(1)) == Ok(1);
    let end = clock.raw();
    drop(permit);
    black_box(clock.delta_as_nanos(start, end));
    ok
}

/// One async bulkhead round on the semaphore: `acquire().await`, the
/// operation, drop of the permit.
pub(crate) fn semaphore_async() -> impl AsyncCase {
    let s = semaphore();
    Closure(move || {
        let s = Arc::clone(&s);
        async move {
            let permit = s.acquire().await;
            permit.is_ok() && op(black_box(1)) == Ok(1)
        }
    })
}

/// [`semaphore_timed_call`] in async code: `acquire().await` between the
/// two readings.
pub(crate) fn semaphore_timed_async() -> impl AsyncCase {
    let (s, clock) = (semaphore(), quanta::Clock::new());
    Closure(move || {
        let (s, clock) = (Arc::clone(&s), clock.clone());
        async move {
            let start = clock.raw();
            let permit = s.acquire().await;
            let ok = permit.is_ok() && op(black_box(1)) == Ok(1);
            let end = clock.raw();
            drop(permit);
            black_box(clock.delta_as_nanos(start, end));
            ok
        }
    })
}

/// tower-resilience's bulkhead: 64 concurrent calls.
pub(crate) fn tower_resilience_bulkhead(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::bulkhead::BulkheadLayer::builder()
        .max_concurrent_calls(64)
        .build()
        .expect("valid bulkhead");
    Tower(layer.layer(tower_op()))
}

/// tower-resilience's adaptive limiter: AIMD with seawall's AIMD defaults
/// (limits 20 to 200, starting at 20).
pub(crate) fn tower_resilience_adaptive(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let algorithm = tower_resilience::adaptive::Aimd::builder()
        .initial_limit(20)
        .min_limit(20)
        .max_limit(200)
        .build()
        .expect("valid AIMD");
    let layer = tower_resilience::adaptive::AdaptiveLimiterLayer::new(algorithm);
    Tower(layer.layer(tower_op()))
}

// ----------------------------------------------------------------- timeout

/// `tokio::time::timeout` around the operation (1 s).
pub(crate) fn tokio_timeout() -> impl AsyncCase {
    Closure(|| async {
        tokio::time::timeout(Duration::from_secs(1), async { op(black_box(1)) })
            .await
            .is_ok_and(|r| r == Ok(1))
    })
}

/// tower's timeout middleware (1 s).
pub(crate) fn tower_timeout() -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    Tower(tower::timeout::Timeout::new(
        tower_op(),
        Duration::from_secs(1),
    ))
}

/// tower-resilience's time limiter (1 s).
pub(crate) fn tower_resilience_time_limiter(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::timelimiter::TimeLimiterLayer::builder()
        .timeout_duration(Duration::from_secs(1))
        .build();
    Tower(layer.layer(tower_op()))
}

/// seatbelt's timeout (1 s).
pub(crate) fn seatbelt_timeout(
    rt: &tokio::runtime::Runtime,
) -> Seatbelt<impl layered::Service<u64, Out = Result<u64, Oops>> + 'static> {
    use layered::Stack;
    let _enter = rt.enter();
    let context = seatbelt_context();
    let stack = (
        seatbelt::timeout::Timeout::layer("timeout", &context)
            .timeout(Duration::from_secs(1))
            .timeout_error(|_| Oops),
        seatbelt_op(),
    );
    Seatbelt(Arc::new(stack.into_service()))
}

// -------------------------------------------------------------- full chain

/// tower-resilience's equivalent of seawall's full chain: fallback, retry
/// (3 attempts, exponential from 10 ms), circuit breaker (50 % over 100
/// calls), bulkhead (64), token bucket (10^9 per second), time limiter (1 s
/// per attempt).
pub(crate) fn tower_resilience_full_chain(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    use tower_resilience::bulkhead::BulkheadServiceError;
    use tower_resilience::circuitbreaker::CircuitBreakerError;
    use tower_resilience::ratelimiter::RateLimiterServiceError;
    use tower_resilience::timelimiter::TimeLimiterError;
    let svc = ServiceBuilder::new()
        .layer(tower_resilience::fallback::FallbackLayer::<u64, u64, Oops>::value(0))
        .layer(
            tower_resilience::retry::RetryLayer::<u64, u64, Oops>::builder()
                .max_attempts(3)
                .exponential_backoff(Duration::from_millis(10))
                .build(),
        )
        .map_err(|_: CircuitBreakerError<Oops>| Oops)
        .layer(
            tower_resilience::circuitbreaker::CircuitBreakerLayer::builder()
                .failure_rate_threshold(0.5)
                .sliding_window_size(100)
                .build()
                .expect("valid breaker"),
        )
        .map_err(|_: BulkheadServiceError<Oops>| Oops)
        .layer(
            tower_resilience::bulkhead::BulkheadLayer::builder()
                .max_concurrent_calls(64)
                .build()
                .expect("valid bulkhead"),
        )
        .map_err(|_: RateLimiterServiceError<Oops>| Oops)
        .layer(
            tower_resilience::ratelimiter::RateLimiterLayer::burst(
                UNREACHABLE_RATE as usize,
                1_000_000,
            )
            .timeout_duration(Duration::ZERO)
            .build()
            .expect("valid limiter"),
        )
        .map_err(|_: TimeLimiterError<Oops>| Oops)
        .layer(
            tower_resilience::timelimiter::TimeLimiterLayer::builder()
                .timeout_duration(Duration::from_secs(1))
                .build(),
        )
        .service(tower_op());
    Tower(svc)
}

/// seatbelt's closest stack: fallback, retry (2 retries, exponential from
/// 10 ms, jitter), circuit breaker (50 % over its sampling window), timeout
/// (1 s per attempt). seatbelt has no bulkhead and no rate limiter.
pub(crate) fn seatbelt_full_chain(
    rt: &tokio::runtime::Runtime,
) -> Seatbelt<impl layered::Service<u64, Out = Result<u64, Oops>> + 'static> {
    use layered::Stack;
    let _enter = rt.enter();
    let context = seatbelt_context();
    let stack = (
        seatbelt::fallback::Fallback::layer("fallback", &context)
            .should_fallback(|r: &Result<u64, Oops>| r.is_err())
            .fallback(|_, _| Ok(0)),
        seatbelt::retry::Retry::layer("retry", &context)
            .clone_input()
            .recovery_with(seatbelt_recovery)
            .max_retry_attempts(2)
            .base_delay(Duration::from_millis(10))
            .use_jitter(true),
        seatbelt::breaker::Breaker::layer("breaker", &context)
            .recovery_with(seatbelt_breaker_recovery)
            .rejected_input_error(|_, _| Oops)
            .failure_threshold(0.5)
            .min_throughput(100),
        seatbelt::timeout::Timeout::layer("timeout", &context)
            .timeout(Duration::from_secs(1))
            .timeout_error(|_| Oops),
        seatbelt_op(),
    );
    Seatbelt(Arc::new(stack.into_service()))
}

/// seatbelt's retry alone (2 retries, exponential from 10 ms, jitter).
pub(crate) fn seatbelt_retry(
    rt: &tokio::runtime::Runtime,
) -> Seatbelt<impl layered::Service<u64, Out = Result<u64, Oops>> + 'static> {
    use layered::Stack;
    let _enter = rt.enter();
    let context = seatbelt_context();
    let stack = (
        seatbelt::retry::Retry::layer("retry", &context)
            .clone_input()
            .recovery_with(seatbelt_recovery)
            .max_retry_attempts(2)
            .base_delay(Duration::from_millis(10))
            .use_jitter(true),
        seatbelt_op(),
    );
    Seatbelt(Arc::new(stack.into_service()))
}

/// The sync chain a user could assemble from the sync peers: backon's
/// blocking retry around recloser's breaker around governor's check and a
/// semaphore slot, then a fallback value. (No timeout: none of them has a
/// sync one.)
#[derive(Clone)]
pub(crate) struct AssembledSyncChain {
    breaker: Arc<recloser::Recloser>,
    limiter: Arc<governor::DefaultDirectRateLimiter>,
    slots: Arc<tokio::sync::Semaphore>,
    retry: backon::ExponentialBuilder,
}

impl AssembledSyncChain {
    /// The chain, with the configurations of the single-policy scenarios.
    pub(crate) fn new() -> Self {
        AssembledSyncChain {
            breaker: recloser(),
            limiter: governor(),
            slots: semaphore(),
            retry: backon_builder(),
        }
    }

    /// One call; `true` when it returned the operation's value.
    pub(crate) fn call(&self) -> bool {
        use backon::BlockingRetryable;
        let attempt = || {
            self.breaker
                .call(|| {
                    self.limiter.check().map_err(|_| Oops)?;
                    let _slot = self.slots.try_acquire().map_err(|_| Oops)?;
                    op(black_box(1))
                })
                .map_err(|_| Oops)
        };
        // The fallback value, 0, is never the operation's.
        attempt.retry(self.retry).call().unwrap_or(0) == 1
    }
}

// ----------------------------------------------------------------- hedging

/// tower's hedge policy: every request may be hedged.
#[derive(Clone)]
pub(crate) struct HedgeAll;

impl tower::hedge::Policy<u64> for HedgeAll {
    fn clone_request(&self, req: &u64) -> Option<u64> {
        Some(*req)
    }
    fn can_retry(&self, _req: &u64) -> bool {
        true
    }
}

/// A tower service that is not `Clone`: each thread makes its own.
pub(crate) struct Fresh<S, F> {
    service: S,
    make: F,
}

impl<S, F: Fn() -> S + Clone> Clone for Fresh<S, F> {
    fn clone(&self) -> Self {
        Fresh {
            service: (self.make)(),
            make: self.make.clone(),
        }
    }
}

impl<S, F> AsyncCase for Fresh<S, F>
where
    S: Service<u64, Response = u64> + Send + 'static,
    F: Fn() -> S + Clone + Send + 'static,
{
    async fn call(&mut self) -> bool {
        let ready = match self.service.ready().await {
            Ok(s) => s,
            Err(_) => return false,
        };
        matches!(ready.call(black_box(1)).await, Ok(1))
    }
}

/// tower's `Hedge`: a hedge when a request runs longer than the 90th
/// percentile of the latencies of the last second, once 10 are known.
/// (tower has no fixed delay: its delay is a latency percentile.) `Hedge`
/// is not `Clone`: each thread has its own, latency histogram included.
pub(crate) fn tower_hedge() -> impl AsyncCase {
    let make = || tower::hedge::Hedge::new(tower_op(), HedgeAll, 10, 0.9, Duration::from_secs(1));
    Fresh {
        service: make(),
        make,
    }
}

/// tower-resilience's hedge: one hedge after 100 ms (2 attempts in all).
pub(crate) fn tower_resilience_hedge(
) -> Tower<impl Service<u64, Response = u64> + Clone + Send + 'static> {
    let layer = tower_resilience::hedge::HedgeLayer::builder()
        .delay(Duration::from_millis(100))
        .max_hedged_attempts(2)
        .build();
    Tower(layer.layer(tower_op()))
}

fn seatbelt_hedging_recovery(
    r: &Result<u64, Oops>,
    _: seatbelt::hedging::RecoveryArgs<'_>,
) -> seatbelt::RecoveryInfo {
    match r {
        Ok(_) => seatbelt::RecoveryInfo::never(),
        Err(_) => seatbelt::RecoveryInfo::retry(),
    }
}

/// seatbelt's hedging: one hedge after 100 ms.
pub(crate) fn seatbelt_hedging(
    rt: &tokio::runtime::Runtime,
) -> Seatbelt<impl layered::Service<u64, Out = Result<u64, Oops>> + 'static> {
    use layered::Stack;
    let _enter = rt.enter();
    let context = seatbelt_context();
    let stack = (
        seatbelt::hedging::Hedging::layer("hedging", &context)
            .clone_input()
            .recovery_with(seatbelt_hedging_recovery)
            .max_hedged_attempts(1)
            .hedging_delay(Duration::from_millis(100)),
        seatbelt_op(),
    );
    Seatbelt(Arc::new(stack.into_service()))
}
