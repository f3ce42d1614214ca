//! Fallback: the outermost policy. When everything else failed, it receives
//! the final [`Error`] and the [`Context`] and produces the call's result;
//! a filter ([`PipelineBuilder::fallback_when`](crate::PipelineBuilder::fallback_when))
//! lets other errors through unchanged.
//!
//! ```
//! use seawall::{Error, Pipeline, Retry};
//! use std::time::Duration;
//!
//! let prices = Pipeline::builder("prices")
//!     .retry(Retry::constant(Duration::from_millis(1)).max_attempts(2))
//!     .fallback_sync(|_err: Error<std::io::Error>, _ctx| Ok(vec![42]))
//!     .build()?;
//! let list = prices.call(|_| Err(std::io::Error::other("down")))?;
//! assert_eq!(list, vec![42]);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::context::Context;
use crate::error::Error;
use crate::pipeline::ErrorHandlers;

pub(crate) type ErrorFilter<E> = Arc<dyn Fn(&Error<E>) -> bool + Send + Sync>;
/// A boxed future returned by an async fallback.
pub type BoxFallbackFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;
pub(crate) type AsyncFallbackFn<T, E> =
    Arc<dyn Fn(Error<E>, Context) -> BoxFallbackFuture<T, E> + Send + Sync>;
pub(crate) type SyncFallbackFn<T, E> = Arc<dyn Fn(Error<E>, Context) -> Result<T, E> + Send + Sync>;

/// The handlers of a pipeline with a fallback.
pub struct FallbackHandlers<F, E> {
    pub(crate) errors: ErrorHandlers<E>,
    pub(crate) fallback: F,
    pub(crate) when: Option<ErrorFilter<E>>,
}

impl<F: Clone, E> Clone for FallbackHandlers<F, E> {
    fn clone(&self) -> Self {
        FallbackHandlers {
            errors: self.errors.clone(),
            fallback: self.fallback.clone(),
            when: self.when.clone(),
        }
    }
}

impl<F, E> fmt::Debug for FallbackHandlers<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FallbackHandlers")
            .field("errors", &self.errors)
            .field("filtered", &self.when.is_some())
            .finish()
    }
}

impl<F, E> FallbackHandlers<F, E> {
    pub(crate) fn applies(&self, e: &Error<E>) -> bool {
        self.when.as_ref().is_none_or(|w| w(e))
    }
}

pub(crate) fn sync_fallback<T, E, F>(f: F) -> SyncFallbackFn<T, E>
where
    F: Fn(Error<E>, Context) -> Result<T, E> + Send + Sync + 'static,
{
    Arc::new(f)
}

pub(crate) fn async_fallback<T, E, F, Fut>(f: F) -> AsyncFallbackFn<T, E>
where
    F: Fn(Error<E>, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, E>> + Send + 'static,
{
    Arc::new(move |e, c| Box::pin(f(e, c)))
}

pub(crate) fn filter<E, P>(p: P) -> ErrorFilter<E>
where
    P: Fn(&Error<E>) -> bool + Send + Sync + 'static,
{
    Arc::new(p)
}
