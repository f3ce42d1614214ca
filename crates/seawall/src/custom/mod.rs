//! Policies written in code: a [`Policy`] takes part in a pipeline like the
//! built-in ones, at the position it declares, under the same order rules,
//! with the same [`Context`]. It may answer without running what it wraps
//! (short-circuit), run it more than once (its own retry, a hedge), or run
//! code before and after it.
//!
//! A policy is one `async` function over a [`Next`] handle: `next.run()`
//! runs the layers inside the policy once and gives their result,
//! `next.sleep(d)` waits on the pipeline's clock. The same function serves
//! `run` (async) and `call` (blocking): the pipeline's drivers run the inner
//! layers and the sleeps the policy asks for, the async one concurrently
//! when the policy waits for several at once, the blocking one on the
//! calling thread, one after the other. So a policy's logic is written once.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use seawall::custom::{Next, Policy, PolicyFuture, Position};
//! use seawall::{Context, Pipeline};
//!
//! /// Counts the attempts that reach the operation.
//! #[derive(Default)]
//! struct CountCalls(AtomicU32);
//!
//! impl<T: Send + 'static, E: Send + 'static> Policy<T, E> for CountCalls {
//!     fn name(&self) -> &str {
//!         "count_calls"
//!     }
//!     fn position(&self) -> Position {
//!         Position::Attempt
//!     }
//!     fn call<'a>(&'a self, _ctx: Context, next: Next<'a, T, E>) -> PolicyFuture<'a, T, E> {
//!         Box::pin(async move {
//!             self.0.fetch_add(1, Ordering::Relaxed);
//!             next.run().await
//!         })
//!     }
//! }
//!
//! let counter = Arc::new(CountCalls::default());
//! let pipeline = Pipeline::builder("inventory")
//!     .retry(seawall::Retry::constant(std::time::Duration::ZERO).max_attempts(3))
//!     .policy(Arc::clone(&counter))
//!     .build()?;
//! let mut tries = 0;
//! let n = pipeline.call(|_ctx| {
//!     tries += 1;
//!     if tries < 3 { Err(std::io::Error::other("flaky")) } else { Ok(7) }
//! })?;
//! assert_eq!((n, counter.0.load(Ordering::Relaxed)), (7, 3));
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! A policy that adds a header to every response, and one that answers from
//! its own state without running the call while a switch is on (its
//! short-circuit is reported by a
//! [`ShortCircuited`](crate::EventKind::ShortCircuited) event):
//!
//! ```
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::sync::Arc;
//! use seawall::custom::{Next, Policy, PolicyFuture, Position};
//! use seawall::{Context, Error, Pipeline, Rejection, RejectionReason};
//!
//! #[derive(Debug, Default)]
//! struct Response {
//!     headers: Vec<(String, String)>,
//!     body: String,
//! }
//!
//! /// Stamps each response with the resource and the attempt that made it.
//! struct ServedBy;
//!
//! impl<E: Send + 'static> Policy<Response, E> for ServedBy {
//!     fn name(&self) -> &str {
//!         "served_by"
//!     }
//!     fn position(&self) -> Position {
//!         Position::Attempt
//!     }
//!     fn call<'a>(&'a self, ctx: Context, next: Next<'a, Response, E>) -> PolicyFuture<'a, Response, E> {
//!         Box::pin(async move {
//!             let mut response = next.run().await?;
//!             let value = format!("{}; attempt={}", ctx.resource(), ctx.attempt());
//!             response.headers.push(("x-served-by".into(), value));
//!             Ok(response)
//!         })
//!     }
//! }
//!
//! /// Refuses every call while in maintenance, without running it.
//! struct Maintenance(Arc<AtomicBool>);
//!
//! impl<T: Send + 'static, E: Send + 'static> Policy<T, E> for Maintenance {
//!     fn name(&self) -> &str {
//!         "maintenance"
//!     }
//!     fn position(&self) -> Position {
//!         Position::Call
//!     }
//!     fn call<'a>(&'a self, _ctx: Context, next: Next<'a, T, E>) -> PolicyFuture<'a, T, E> {
//!         Box::pin(async move {
//!             if self.0.load(Ordering::Relaxed) {
//!                 let refusal = Rejection::new(RejectionReason::PolicyRefused, None);
//!                 return Err(Error::Rejected(refusal));
//!             }
//!             next.run().await
//!         })
//!     }
//! }
//!
//! let down = Arc::new(AtomicBool::new(false));
//! let pipeline = Pipeline::builder("catalog")
//!     .policy(Maintenance(Arc::clone(&down)))
//!     .policy(ServedBy)
//!     .build()?;
//! let fetch = |_ctx: Context| Ok::<_, std::io::Error>(Response { body: "ok".into(), ..Default::default() });
//! let response = pipeline.call(fetch)?;
//! assert_eq!(response.headers[0].1, "catalog; attempt=1");
//!
//! down.store(true, Ordering::Relaxed);
//! let refused = pipeline.call(fetch).unwrap_err();
//! assert_eq!(refused.rejection().map(|r| r.reason), Some(RejectionReason::PolicyRefused));
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! # Position
//! A policy declares where it stands ([`Policy::position`]) and is declared
//! on the builder ([`PipelineBuilder::policy`](crate::PipelineBuilder::policy))
//! at that place in the chain; `build()` checks the order with the rules
//! of every other policy, and refuses a policy declared where its position
//! cannot be, with a [`ConfigError`](crate::ConfigError) naming the policy,
//! the field `position` and the rule:
//!
//! - [`Position::Call`], around the whole call: declared before `retry`,
//!   and before every other policy of the call but a timeout of the whole
//!   call. A timeout declared before the policy bounds the policy and every
//!   pass it makes through the rest of the call with one deadline (its
//!   context has it); one declared after it gives each pass the whole
//!   timeout. Each pass (each `next.run()`) is a call through the rest of
//!   the pipeline: admitted by the stateful policies, retried, timed out as
//!   such; the fallback stays outermost and takes the policy's result.
//! - [`Position::Attempt`], around each attempt: declared after `retry` (a
//!   pipeline without one has one attempt), after the timeouts and the
//!   stateful policies that cover the attempt, before chaos. It runs inside
//!   the attempt's admission and deadline; chaos acts on each of its inner
//!   runs. The attempt's outcome is the policy's result: an error of the
//!   operation (however the policy returns it) is classified, recorded and
//!   retried as usual, a [`Error::Timeout`] is the attempt's timeout, and a
//!   rejection ([`Error::Rejected`]) or a store error ends the call at
//!   once, not retried and not recorded by the circuit breaker (the
//!   attempt's permit is given back).
//!
//! Several policies on one side nest in declaration order, outermost first.
//!
//! # Context and deadline
//! The policy gets the [`Context`] of what it wraps: the attempt's around an
//! attempt (its number, its deadline, the partition), and around the call
//! a context of attempt 1 with the call's deadline when a timeout of the
//! whole call is declared before the policy. `next.run()` once the
//! deadline has passed gives an [`Error::Timeout`] at once without running
//! anything, and `next.sleep(d)` never sleeps past it: one budget spans
//! the policy's own retries as it spans the pipeline's. In async code an
//! attempt's deadline also drops the policy's pass with the attempt.
//!
//! # Async and blocking
//! A policy's future awaits what [`Next`] gives (`run`, `sleep`); in a
//! blocking `call` the driver runs each on the calling thread when the
//! policy waits for it, so a policy that waits for several at once (a hedge
//! with `select`) sees them complete one after the other. A policy that
//! awaits anything else (a channel, a timer of a runtime) is polled to
//! completion on the calling thread, which sleeps until it is woken; a
//! runtime's timer needs that runtime.
//!
//! # Cost
//! A pipeline without policies written in code takes none of this path: its
//! calls run exactly as before. With one, every call takes the engine's
//! general loop and each pass boxes the policy's future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use crate::context::Context;
use crate::error::Error;

/// The future of one pass through a [`Policy`]: boxed, so that policies of
/// any type sit in one pipeline.
pub type PolicyFuture<'a, T, E> = Pin<Box<dyn Future<Output = Result<T, Error<E>>> + Send + 'a>>;

/// A policy written in code, for operations returning `Result<T, E>`. See
/// the [module docs](self).
///
/// A policy that works for any `T` and `E` implements it for all of them
/// (`impl<T: Send + 'static, E: Send + 'static> Policy<T, E> for MyPolicy`);
/// declaring it on a pipeline fixes the pipeline's value and error types,
/// as a fallback does ([`ValueType`](crate::pipeline::ValueType)).
pub trait Policy<T, E>: Send + Sync {
    /// The policy's name: in configuration errors, events, metrics, and as
    /// the name a configuration file refers to it by.
    fn name(&self) -> &str;

    /// Where the policy stands in a pipeline.
    fn position(&self) -> Position;

    /// One pass through the policy: `ctx` is the context of what it wraps,
    /// `next` runs the layers inside it ([`Next::run`]), as many times as
    /// the policy wants, or never.
    fn call<'a>(&'a self, ctx: Context, next: Next<'a, T, E>) -> PolicyFuture<'a, T, E>;
}

impl<T, E, P: Policy<T, E>> Policy<T, E> for Arc<P> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn position(&self) -> Position {
        (**self).position()
    }
    fn call<'a>(&'a self, ctx: Context, next: Next<'a, T, E>) -> PolicyFuture<'a, T, E> {
        (**self).call(ctx, next)
    }
}

/// Where a [`Policy`] stands; see the [module docs](self#position).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Position {
    /// Around the whole call, retries included: declared before `retry`.
    Call,
    /// Around each attempt: declared after `retry`.
    Attempt,
}

impl Position {
    /// `call` or `attempt`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Position::Call => "call",
            Position::Attempt => "attempt",
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Runs the layers inside a policy, for one pass of [`Policy::call`]. Cheap
/// to clone; it cannot outlive the pass.
pub struct Next<'a, T, E> {
    exchange: Arc<Exchange<T, E>>,
    _pass: PhantomData<&'a ()>,
}

impl<T, E> Clone for Next<'_, T, E> {
    fn clone(&self) -> Self {
        Next {
            exchange: Arc::clone(&self.exchange),
            _pass: PhantomData,
        }
    }
}

impl<T, E> fmt::Debug for Next<'_, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Next")
    }
}

impl<'a, T, E> Next<'a, T, E> {
    pub(crate) fn new(exchange: Arc<Exchange<T, E>>) -> Self {
        Next {
            exchange,
            _pass: PhantomData,
        }
    }

    /// Runs the layers inside the policy once (around the call: the rest of
    /// the call, retries included; around an attempt: the operation, after
    /// the policies declared after this one) and gives their result. Several
    /// runs may be awaited at once (a hedge): in async code they run
    /// concurrently, and dropping a run's future cancels it. Once the
    /// deadline of the policy's context has passed, the result is an
    /// [`Error::Timeout`] and nothing runs.
    pub fn run(&self) -> Run<'_, T, E> {
        Run {
            exchange: &self.exchange,
            slot: None,
        }
    }

    /// Waits `duration` on the pipeline's clock (a virtual clock in tests),
    /// never past the deadline of the policy's context.
    pub fn sleep(&self, duration: Duration) -> Sleep<'_, T, E> {
        Sleep {
            exchange: &self.exchange,
            duration,
            slot: None,
        }
    }
}

/// The future of [`Next::run`].
#[must_use = "a run does nothing until it is awaited"]
pub struct Run<'n, T, E> {
    exchange: &'n Exchange<T, E>,
    slot: Option<usize>,
}

impl<T, E> fmt::Debug for Run<'_, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").field("slot", &self.slot).finish()
    }
}

impl<T, E> Future for Run<'_, T, E> {
    type Output = Result<T, Error<E>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.exchange.poll(&mut this.slot, Job::Run, cx.waker()) {
            Some(Done::Ran(result)) => Poll::Ready(result),
            // A run's slot only ever holds a run's result.
            Some(Done::Slept) | None => Poll::Pending,
        }
    }
}

impl<T, E> Drop for Run<'_, T, E> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.exchange.forget(slot);
        }
    }
}

/// The future of [`Next::sleep`].
#[must_use = "a sleep does nothing until it is awaited"]
pub struct Sleep<'n, T, E> {
    exchange: &'n Exchange<T, E>,
    duration: Duration,
    slot: Option<usize>,
}

impl<T, E> fmt::Debug for Sleep<'_, T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("duration", &self.duration)
            .finish()
    }
}

impl<T, E> Future for Sleep<'_, T, E> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<()> {
        let this = self.get_mut();
        let job = Job::Sleep(this.duration);
        match this.exchange.poll(&mut this.slot, job, cx.waker()) {
            Some(_) => Poll::Ready(()),
            None => Poll::Pending,
        }
    }
}

impl<T, E> Drop for Sleep<'_, T, E> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.exchange.forget(slot);
        }
    }
}

/// What a policy asked of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Job {
    Run,
    Sleep(Duration),
}

/// What the driver did for a policy.
pub(crate) enum Done<T, E> {
    Ran(Result<T, Error<E>>),
    Slept,
}

/// Where one job of a pass stands.
enum State<T, E> {
    /// Asked by the policy, not yet started by the driver.
    Asked(Job),
    /// Started by the driver.
    Started,
    /// Done, its result not yet taken by the policy's future.
    Done(Done<T, E>),
    /// Taken by the policy's future, or dropped: nothing more to do.
    Closed,
    /// The policy's future was dropped before the job was done: the driver
    /// cancels it.
    Forgotten,
}

struct Slot<T, E> {
    state: State<T, E>,
    waker: Option<Waker>,
}

/// The jobs a pass of a policy asked of the driver, and their results: what
/// [`Run`] and [`Sleep`] talk to (`pipeline::chain` is the other side).
pub(crate) struct Exchange<T, E> {
    slots: Mutex<Vec<Slot<T, E>>>,
}

impl<T, E> Exchange<T, E> {
    pub(crate) fn new() -> Self {
        Exchange {
            slots: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Slot<T, E>>> {
        // Every change is one assignment: a panic cannot leave it half-done.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A policy's future polls its job: asks for it the first time, takes
    /// its result when it is done.
    fn poll(&self, slot: &mut Option<usize>, job: Job, waker: &Waker) -> Option<Done<T, E>> {
        let mut slots = self.lock();
        let Some(i) = *slot else {
            slots.push(Slot {
                state: State::Asked(job),
                waker: Some(waker.clone()),
            });
            *slot = Some(slots.len() - 1);
            return None;
        };
        let s = &mut slots[i];
        match std::mem::replace(&mut s.state, State::Closed) {
            State::Done(done) => Some(done),
            other => {
                s.state = other;
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                    s.waker = Some(waker.clone());
                }
                None
            }
        }
    }

    /// A policy's future for job `slot` was dropped.
    fn forget(&self, slot: usize) {
        let mut slots = self.lock();
        let s = &mut slots[slot];
        s.state = match std::mem::replace(&mut s.state, State::Closed) {
            State::Started => State::Forgotten,
            _ => State::Closed,
        };
        s.waker = None;
    }

    /// The first job asked and not yet started, if any.
    pub(crate) fn asked(&self) -> Option<(usize, Job)> {
        self.lock()
            .iter()
            .enumerate()
            .find_map(|(i, s)| match s.state {
                State::Asked(job) => Some((i, job)),
                _ => None,
            })
    }

    /// The driver starts job `slot`.
    pub(crate) fn start(&self, slot: usize) {
        self.lock()[slot].state = State::Started;
    }

    /// The jobs whose future was dropped while they ran (each reported
    /// once).
    pub(crate) fn forgotten(&self) -> Vec<usize> {
        let mut slots = self.lock();
        let mut gone = Vec::new();
        for (i, s) in slots.iter_mut().enumerate() {
            if let State::Forgotten = s.state {
                s.state = State::Closed;
                gone.push(i);
            }
        }
        gone
    }

    /// Job `slot` is done: its result waits for the policy's future, which
    /// is woken.
    pub(crate) fn deliver(&self, slot: usize, done: Done<T, E>) {
        let waker = {
            let mut slots = self.lock();
            let s = &mut slots[slot];
            match s.state {
                State::Started | State::Asked(_) => {
                    s.state = State::Done(done);
                    s.waker.take()
                }
                _ => None,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}
