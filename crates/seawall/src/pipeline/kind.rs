//! What a pipeline knows of the operation's result type.
//!
//! A pipeline with no classifier and no fallback runs any
//! `Result<T, E>` ([`AnyResult`]). A classifier, predicate or typed hook fixes
//! the error type ([`ErrorType<E>`]); a chaos outcome or a policy written
//! in code ([`crate::custom`]) fixes both ([`ValueType<T, E>`]), and so
//! does a fallback
//! ([`WithFallback<T, E>`], [`WithAsyncFallback<T, E>`]). The handlers are
//! stored type-erased, so these names are all a struct field needs:
//!
//! ```
//! use seawall::pipeline::WithFallback;
//! use seawall::Pipeline;
//!
//! struct Client {
//!     users: Pipeline<WithFallback<String, std::io::Error>>,
//! }
//! ```

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use std::any::Any;

use crate::chaos::{FaultFn, OutcomeFn};
use crate::classify::Verdict;
use crate::context::Context;
use crate::error::Error;
pub use crate::fallback::BoxFallbackFuture;
pub use crate::fallback::FallbackHandlers;
use crate::fallback::{AsyncFallbackFn, SyncFallbackFn};

use super::nested::{self, Noted};

type Classifier<E> = Arc<dyn Fn(&E) -> Verdict + Send + Sync>;
type Predicate<E> = Arc<dyn Fn(&E) -> bool + Send + Sync>;
type RetryHook<E> = Arc<dyn Fn(&E, u32, Duration) + Send + Sync>;

mod sealed {
    pub trait Sealed {}
}

/// The kind of a pipeline: what it knows of `T` and `E`. Sealed.
pub trait Kind: sealed::Sealed + Send + Sync + 'static {
    /// The type-erased handlers stored in the pipeline.
    type Handlers: Clone + Send + Sync + 'static;
    /// `true` when the kind carries a fallback: without one, a final error
    /// is returned as is without building a fallback context.
    #[doc(hidden)]
    const HAS_FALLBACK: bool;
}

/// A pipeline that runs any `Result<T, E>`; every error is a retryable failure.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnyResult;

/// A pipeline whose operations fail with `E` (a classifier, predicate or
/// typed hook was given); any `T`.
pub struct ErrorType<E>(PhantomData<fn(E)>);

/// A pipeline whose operations return `Result<T, E>` (a chaos outcome or a
/// policy written in code fixed the value type); usable with both `run` and
/// `call`.
pub struct ValueType<T, E>(PhantomData<fn() -> (T, E)>);

/// A pipeline with a synchronous fallback producing `Result<T, E>`; usable
/// with both `run` and `call`.
pub struct WithFallback<T, E>(PhantomData<fn() -> (T, E)>);

/// A pipeline with an async fallback producing `Result<T, E>`; usable with
/// `run` only.
pub struct WithAsyncFallback<T, E>(PhantomData<fn() -> (T, E)>);

macro_rules! debug_marker {
    ($($name:ident<$($p:ident),*>),*) => {$(
        impl<$($p),*> fmt::Debug for $name<$($p),*> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(stringify!($name))
            }
        }
    )*};
}
debug_marker!(ErrorType<E>, ValueType<T, E>, WithFallback<T, E>, WithAsyncFallback<T, E>);

/// The error-side handlers: classifier, retry/abort predicates, retry hook.
pub struct ErrorHandlers<E> {
    pub(crate) classify: Option<Classifier<E>>,
    pub(crate) retry_if: Option<Predicate<E>>,
    pub(crate) abort_if: Option<Predicate<E>>,
    pub(crate) on_retry: Option<RetryHook<E>>,
    /// Narrows the errors hedging answers with a further attempt.
    pub(crate) hedge_if: Option<Predicate<E>>,
    /// The fault generators of the pipeline's chaos policies, in
    /// declaration order ([`Action::Fault`](crate::chaos::Action) is an
    /// index into it).
    pub(crate) faults: Vec<FaultFn<E>>,
    /// The outcome generators of the chaos policies, each an
    /// `OutcomeFn<T>` of the pipeline's value type: only a kind that fixes
    /// `T` ([`ValueType`], a fallback) carries any, and reads them back as
    /// that `T`.
    pub(crate) outcomes: Vec<Arc<dyn Any + Send + Sync>>,
    /// The policies written in code, each a [`CustomPolicy<T, E>`] of the
    /// pipeline's value type (only a kind that fixes `T` carries any), in
    /// declaration order (their declarations hold an index into it).
    pub(crate) policies: Vec<Arc<dyn Any + Send + Sync>>,
}

/// A policy written in code, as the pipeline keeps it.
pub(crate) type CustomPolicy<T, E> = Arc<dyn crate::custom::Policy<T, E>>;

impl<E> Clone for ErrorHandlers<E> {
    fn clone(&self) -> Self {
        ErrorHandlers {
            classify: self.classify.clone(),
            retry_if: self.retry_if.clone(),
            abort_if: self.abort_if.clone(),
            on_retry: self.on_retry.clone(),
            hedge_if: self.hedge_if.clone(),
            faults: self.faults.clone(),
            outcomes: self.outcomes.clone(),
            policies: self.policies.clone(),
        }
    }
}

impl<E> Default for ErrorHandlers<E> {
    fn default() -> Self {
        ErrorHandlers {
            classify: None,
            retry_if: None,
            abort_if: None,
            on_retry: None,
            hedge_if: None,
            faults: Vec::new(),
            outcomes: Vec::new(),
            policies: Vec::new(),
        }
    }
}

impl<E> fmt::Debug for ErrorHandlers<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ErrorHandlers")
            .field("classify", &self.classify.is_some())
            .field("retry_if", &self.retry_if.is_some())
            .field("abort_if", &self.abort_if.is_some())
            .field("on_retry", &self.on_retry.is_some())
            .field("hedge_if", &self.hedge_if.is_some())
            .field("faults", &self.faults.len())
            .field("policies", &self.policies.len())
            .finish()
    }
}

impl<E> ErrorHandlers<E> {
    /// `v` narrowed by the predicates: `abort_if` wins over everything,
    /// `retry_if` only narrows.
    fn narrow(&self, e: &E, v: Verdict) -> Verdict {
        if self.abort_if.as_ref().is_some_and(|p| p(e)) {
            return keep_hint(Verdict::abort(), v);
        }
        if v.is_retryable() && self.retry_if.as_ref().is_some_and(|p| !p(e)) {
            return keep_hint(Verdict::failure(), v);
        }
        v
    }

    pub(crate) fn on_retry(&self, e: &E, attempt: u32, delay: Duration) {
        if let Some(h) = &self.on_retry {
            h(e, attempt, delay)
        }
    }

    fn hedges(&self, e: &E) -> bool {
        self.hedge_if.as_ref().is_none_or(|p| p(e))
    }

    /// The error of the chaos fault generator `slot` for the attempt `ctx`.
    pub(crate) fn fault(&self, slot: usize, ctx: &Context) -> Option<E> {
        self.faults.get(slot).map(|f| f(ctx))
    }

    /// The value of the chaos outcome generator `slot` for the attempt
    /// `ctx`; the kind that asks fixes `T`, the type it was declared with.
    fn outcome<T: 'static>(&self, slot: usize, ctx: &Context) -> Option<T> {
        let f = self.outcomes.get(slot)?.downcast_ref::<OutcomeFn<T>>()?;
        Some(f(ctx))
    }

    /// The policy written in code at `slot`, of the pipeline's value type.
    fn policy<T: 'static>(&self, slot: usize) -> Option<&dyn crate::custom::Policy<T, E>>
    where
        E: 'static,
    {
        let p = self
            .policies
            .get(slot)?
            .downcast_ref::<CustomPolicy<T, E>>()?;
        Some(&**p)
    }
}

fn keep_hint(v: Verdict, from: Verdict) -> Verdict {
    match from.retry_after() {
        Some(d) => v.with_retry_after(d),
        None => v,
    }
}

impl sealed::Sealed for AnyResult {}
impl<E: 'static> sealed::Sealed for ErrorType<E> {}
impl<T: 'static, E: 'static> sealed::Sealed for ValueType<T, E> {}
impl<T: 'static, E: 'static> sealed::Sealed for WithFallback<T, E> {}
impl<T: 'static, E: 'static> sealed::Sealed for WithAsyncFallback<T, E> {}

impl Kind for AnyResult {
    const HAS_FALLBACK: bool = false;
    type Handlers = ();
}
impl<E: 'static> Kind for ErrorType<E> {
    const HAS_FALLBACK: bool = false;
    type Handlers = ErrorHandlers<E>;
}
impl<T: 'static, E: 'static> Kind for ValueType<T, E> {
    const HAS_FALLBACK: bool = false;
    type Handlers = ErrorHandlers<E>;
}
impl<T: 'static, E: 'static> Kind for WithFallback<T, E> {
    const HAS_FALLBACK: bool = true;
    type Handlers = FallbackHandlers<SyncFallbackFn<T, E>, E>;
}
impl<T: 'static, E: 'static> Kind for WithAsyncFallback<T, E> {
    const HAS_FALLBACK: bool = true;
    type Handlers = FallbackHandlers<AsyncFallbackFn<T, E>, E>;
}

/// What the fallback made of an error.
pub(crate) enum Fallen<T, E> {
    /// No fallback, or its filter declined: the error propagates unchanged.
    NotApplied(Error<E>),
    /// The fallback's result.
    Done(Result<T, E>),
    /// An async fallback still to await.
    Pending(BoxFallbackFuture<T, E>),
}

/// A pipeline kind that can run operations returning `Result<T, E>`
/// (async `run`). Sealed.
pub trait Handles<T, E>: Kind {
    /// The verdict on an error of the operation: the classifier's (narrowed
    /// by the predicates); without a classifier, `judged` (the operation's
    /// own verdict, when an adapter gives one) or a retryable failure. A
    /// refusal by a nested seawall pipeline is never retried nor recorded.
    #[doc(hidden)]
    fn verdict_or(h: &Self::Handlers, e: &E, judged: Option<Verdict>) -> Verdict;
    #[doc(hidden)]
    fn on_retry(h: &Self::Handlers, e: &E, attempt: u32, delay: Duration);
    /// `false` when `hedge_if` declines this error: hedging does not answer
    /// it with a further attempt.
    #[doc(hidden)]
    fn hedges(h: &Self::Handlers, e: &E) -> bool;
    /// The error of the chaos fault generator `slot` (none for a kind
    /// that does not know `E`: it has no fault generator).
    #[doc(hidden)]
    fn chaos_fault(h: &Self::Handlers, slot: usize, ctx: &Context) -> Option<E>;
    /// The value of the chaos outcome generator `slot` (none for a kind
    /// that does not know `T`: it has no outcome generator).
    #[doc(hidden)]
    fn chaos_outcome(h: &Self::Handlers, slot: usize, ctx: &Context) -> Option<T>;
    /// The policy written in code at `slot` (none for a kind that does not
    /// know `T`: it has none).
    #[doc(hidden)]
    fn policy(h: &Self::Handlers, slot: usize) -> Option<&dyn crate::custom::Policy<T, E>>;
    /// `true` when the fallback takes this final error.
    #[doc(hidden)]
    fn falls_back_on(h: &Self::Handlers, err: &Error<E>) -> bool;
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn fall_back(h: &Self::Handlers, err: Error<E>, ctx: Context) -> Fallen<T, E>;
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn note_rejection(noted: &Noted);
}

/// A pipeline kind that can run blocking operations returning
/// `Result<T, E>` (sync `call`): every kind but [`WithAsyncFallback`]. Sealed.
pub trait HandlesSync<T, E>: Handles<T, E> {}

/// The verdict without a classifier: the operation's own, or a retryable
/// failure; a nested rejection is ignored.
fn default_verdict<E: 'static>(e: &E, judged: Option<Verdict>) -> Verdict {
    if nested::is_rejection(e) {
        return Verdict::ignore();
    }
    judged.unwrap_or_default()
}

impl<E: 'static> ErrorHandlers<E> {
    fn verdict_or(&self, e: &E, judged: Option<Verdict>) -> Verdict {
        if nested::is_rejection(e) {
            return Verdict::ignore();
        }
        let v = match &self.classify {
            Some(c) => c(e),
            None => judged.unwrap_or_default(),
        };
        // The operation's hint stands when the classifier gives none.
        let v = match (v.retry_after(), judged.and_then(|j| j.retry_after())) {
            (None, Some(hint)) => v.with_retry_after(hint),
            _ => v,
        };
        self.narrow(e, v)
    }
}

impl<T, E: 'static> Handles<T, E> for AnyResult {
    fn verdict_or(_: &(), e: &E, judged: Option<Verdict>) -> Verdict {
        default_verdict(e, judged)
    }
    fn on_retry(_: &(), _: &E, _: u32, _: Duration) {}
    fn hedges(_: &(), _: &E) -> bool {
        true
    }
    fn chaos_fault(_: &(), _: usize, _: &Context) -> Option<E> {
        None
    }
    fn chaos_outcome(_: &(), _: usize, _: &Context) -> Option<T> {
        None
    }
    fn policy(_: &(), _: usize) -> Option<&dyn crate::custom::Policy<T, E>> {
        None
    }
    fn falls_back_on(_: &(), _: &Error<E>) -> bool {
        false
    }
    #[allow(private_interfaces)]
    fn fall_back(_: &(), err: Error<E>, _: Context) -> Fallen<T, E> {
        Fallen::NotApplied(err)
    }
    #[allow(private_interfaces)]
    fn note_rejection(noted: &Noted) {
        nested::note::<E>(noted)
    }
}
impl<T, E: 'static> HandlesSync<T, E> for AnyResult {}

impl<T, E: 'static> Handles<T, E> for ErrorType<E> {
    fn verdict_or(h: &ErrorHandlers<E>, e: &E, judged: Option<Verdict>) -> Verdict {
        h.verdict_or(e, judged)
    }
    fn on_retry(h: &ErrorHandlers<E>, e: &E, attempt: u32, delay: Duration) {
        h.on_retry(e, attempt, delay)
    }
    fn hedges(h: &ErrorHandlers<E>, e: &E) -> bool {
        h.hedges(e)
    }
    fn chaos_fault(h: &ErrorHandlers<E>, slot: usize, ctx: &Context) -> Option<E> {
        h.fault(slot, ctx)
    }
    fn chaos_outcome(_: &ErrorHandlers<E>, _: usize, _: &Context) -> Option<T> {
        None
    }
    fn policy(_: &ErrorHandlers<E>, _: usize) -> Option<&dyn crate::custom::Policy<T, E>> {
        None
    }
    fn falls_back_on(_: &ErrorHandlers<E>, _: &Error<E>) -> bool {
        false
    }
    #[allow(private_interfaces)]
    fn fall_back(_: &ErrorHandlers<E>, err: Error<E>, _: Context) -> Fallen<T, E> {
        Fallen::NotApplied(err)
    }
    #[allow(private_interfaces)]
    fn note_rejection(noted: &Noted) {
        nested::note::<E>(noted)
    }
}
impl<T, E: 'static> HandlesSync<T, E> for ErrorType<E> {}

impl<T: 'static, E: 'static> Handles<T, E> for ValueType<T, E> {
    fn verdict_or(h: &ErrorHandlers<E>, e: &E, judged: Option<Verdict>) -> Verdict {
        h.verdict_or(e, judged)
    }
    fn on_retry(h: &ErrorHandlers<E>, e: &E, attempt: u32, delay: Duration) {
        h.on_retry(e, attempt, delay)
    }
    fn hedges(h: &ErrorHandlers<E>, e: &E) -> bool {
        h.hedges(e)
    }
    fn chaos_fault(h: &ErrorHandlers<E>, slot: usize, ctx: &Context) -> Option<E> {
        h.fault(slot, ctx)
    }
    fn chaos_outcome(h: &ErrorHandlers<E>, slot: usize, ctx: &Context) -> Option<T> {
        h.outcome(slot, ctx)
    }
    fn policy(h: &ErrorHandlers<E>, slot: usize) -> Option<&dyn crate::custom::Policy<T, E>> {
        h.policy(slot)
    }
    fn falls_back_on(_: &ErrorHandlers<E>, _: &Error<E>) -> bool {
        false
    }
    #[allow(private_interfaces)]
    fn fall_back(_: &ErrorHandlers<E>, err: Error<E>, _: Context) -> Fallen<T, E> {
        Fallen::NotApplied(err)
    }
    #[allow(private_interfaces)]
    fn note_rejection(noted: &Noted) {
        nested::note::<E>(noted)
    }
}
impl<T: 'static, E: 'static> HandlesSync<T, E> for ValueType<T, E> {}

impl<T: 'static, E: 'static> Handles<T, E> for WithFallback<T, E> {
    fn verdict_or(h: &Self::Handlers, e: &E, judged: Option<Verdict>) -> Verdict {
        h.errors.verdict_or(e, judged)
    }
    fn on_retry(h: &Self::Handlers, e: &E, attempt: u32, delay: Duration) {
        h.errors.on_retry(e, attempt, delay)
    }
    fn hedges(h: &Self::Handlers, e: &E) -> bool {
        h.errors.hedges(e)
    }
    fn chaos_fault(h: &Self::Handlers, slot: usize, ctx: &Context) -> Option<E> {
        h.errors.fault(slot, ctx)
    }
    fn chaos_outcome(h: &Self::Handlers, slot: usize, ctx: &Context) -> Option<T> {
        h.errors.outcome(slot, ctx)
    }
    fn policy(h: &Self::Handlers, slot: usize) -> Option<&dyn crate::custom::Policy<T, E>> {
        h.errors.policy(slot)
    }
    fn falls_back_on(h: &Self::Handlers, err: &Error<E>) -> bool {
        h.applies(err)
    }
    #[allow(private_interfaces)]
    fn fall_back(h: &Self::Handlers, err: Error<E>, ctx: Context) -> Fallen<T, E> {
        Fallen::Done((h.fallback)(err, ctx))
    }
    #[allow(private_interfaces)]
    fn note_rejection(noted: &Noted) {
        nested::note::<E>(noted)
    }
}
impl<T: 'static, E: 'static> HandlesSync<T, E> for WithFallback<T, E> {}

impl<T: 'static, E: 'static> Handles<T, E> for WithAsyncFallback<T, E> {
    fn verdict_or(h: &Self::Handlers, e: &E, judged: Option<Verdict>) -> Verdict {
        h.errors.verdict_or(e, judged)
    }
    fn on_retry(h: &Self::Handlers, e: &E, attempt: u32, delay: Duration) {
        h.errors.on_retry(e, attempt, delay)
    }
    fn hedges(h: &Self::Handlers, e: &E) -> bool {
        h.errors.hedges(e)
    }
    fn chaos_fault(h: &Self::Handlers, slot: usize, ctx: &Context) -> Option<E> {
        h.errors.fault(slot, ctx)
    }
    fn chaos_outcome(h: &Self::Handlers, slot: usize, ctx: &Context) -> Option<T> {
        h.errors.outcome(slot, ctx)
    }
    fn policy(h: &Self::Handlers, slot: usize) -> Option<&dyn crate::custom::Policy<T, E>> {
        h.errors.policy(slot)
    }
    fn falls_back_on(h: &Self::Handlers, err: &Error<E>) -> bool {
        h.applies(err)
    }
    #[allow(private_interfaces)]
    fn fall_back(h: &Self::Handlers, err: Error<E>, ctx: Context) -> Fallen<T, E> {
        Fallen::Pending((h.fallback)(err, ctx))
    }
    #[allow(private_interfaces)]
    fn note_rejection(noted: &Noted) {
        nested::note::<E>(noted)
    }
}

/// Kinds whose error-side handlers can be extended with a typed classifier,
/// predicate or hook for errors of type `E`. Sealed.
pub trait ErrorKind<E>: Kind {
    /// The kind after the change.
    type Out: Kind;
    #[doc(hidden)]
    fn map_errors<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: Self::Handlers,
        f: F,
    ) -> <Self::Out as Kind>::Handlers;
}

impl<E: 'static> ErrorKind<E> for AnyResult {
    type Out = ErrorType<E>;
    fn map_errors<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        _: (),
        f: F,
    ) -> ErrorHandlers<E> {
        f(ErrorHandlers::default())
    }
}
impl<E: 'static> ErrorKind<E> for ErrorType<E> {
    type Out = Self;
    fn map_errors<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: ErrorHandlers<E>,
        f: F,
    ) -> ErrorHandlers<E> {
        f(h)
    }
}
impl<T: 'static, E: 'static> ErrorKind<E> for ValueType<T, E> {
    type Out = Self;
    fn map_errors<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: ErrorHandlers<E>,
        f: F,
    ) -> ErrorHandlers<E> {
        f(h)
    }
}
impl<T: 'static, E: 'static> ErrorKind<E> for WithFallback<T, E> {
    type Out = Self;
    fn map_errors<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: Self::Handlers,
        f: F,
    ) -> Self::Handlers {
        FallbackHandlers {
            errors: f(h.errors),
            ..h
        }
    }
}
impl<T: 'static, E: 'static> ErrorKind<E> for WithAsyncFallback<T, E> {
    type Out = Self;
    fn map_errors<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: Self::Handlers,
        f: F,
    ) -> Self::Handlers {
        FallbackHandlers {
            errors: f(h.errors),
            ..h
        }
    }
}

/// Kinds that can take a fallback for `Result<T, E>`. Sealed.
pub trait FallbackKind<T, E>: Kind {
    #[doc(hidden)]
    fn into_errors(h: Self::Handlers) -> ErrorHandlers<E>;
}
impl<T, E: 'static> FallbackKind<T, E> for AnyResult {
    fn into_errors(_: ()) -> ErrorHandlers<E> {
        ErrorHandlers::default()
    }
}
impl<T, E: 'static> FallbackKind<T, E> for ErrorType<E> {
    fn into_errors(h: ErrorHandlers<E>) -> ErrorHandlers<E> {
        h
    }
}
impl<T: 'static, E: 'static> FallbackKind<T, E> for ValueType<T, E> {
    fn into_errors(h: ErrorHandlers<E>) -> ErrorHandlers<E> {
        h
    }
}
impl<T: 'static, E: 'static> FallbackKind<T, E> for WithFallback<T, E> {
    fn into_errors(h: Self::Handlers) -> ErrorHandlers<E> {
        h.errors
    }
}
impl<T: 'static, E: 'static> FallbackKind<T, E> for WithAsyncFallback<T, E> {
    fn into_errors(h: Self::Handlers) -> ErrorHandlers<E> {
        h.errors
    }
}

/// Kinds that can take a chaos outcome of type `T` for `Result<T, E>`: the
/// value type is fixed ([`ValueType`], or kept by a fallback's kind).
/// Sealed.
pub trait OutcomeKind<T, E>: Kind {
    /// The kind after the change.
    type Out: Kind;
    #[doc(hidden)]
    fn map_outcomes<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: Self::Handlers,
        f: F,
    ) -> <Self::Out as Kind>::Handlers;
}

impl<T: 'static, E: 'static> OutcomeKind<T, E> for AnyResult {
    type Out = ValueType<T, E>;
    fn map_outcomes<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        _: (),
        f: F,
    ) -> ErrorHandlers<E> {
        f(ErrorHandlers::default())
    }
}
impl<T: 'static, E: 'static> OutcomeKind<T, E> for ErrorType<E> {
    type Out = ValueType<T, E>;
    fn map_outcomes<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: ErrorHandlers<E>,
        f: F,
    ) -> ErrorHandlers<E> {
        f(h)
    }
}
impl<T: 'static, E: 'static> OutcomeKind<T, E> for ValueType<T, E> {
    type Out = Self;
    fn map_outcomes<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: ErrorHandlers<E>,
        f: F,
    ) -> ErrorHandlers<E> {
        f(h)
    }
}
impl<T: 'static, E: 'static> OutcomeKind<T, E> for WithFallback<T, E> {
    type Out = Self;
    fn map_outcomes<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: Self::Handlers,
        f: F,
    ) -> Self::Handlers {
        FallbackHandlers {
            errors: f(h.errors),
            ..h
        }
    }
}
impl<T: 'static, E: 'static> OutcomeKind<T, E> for WithAsyncFallback<T, E> {
    type Out = Self;
    fn map_outcomes<F: FnOnce(ErrorHandlers<E>) -> ErrorHandlers<E>>(
        h: Self::Handlers,
        f: F,
    ) -> Self::Handlers {
        FallbackHandlers {
            errors: f(h.errors),
            ..h
        }
    }
}
