//! Classifiers and fallbacks registered in code under a name, and the
//! typed pipelines a configuration builds with them.

use std::any::{type_name, Any, TypeId};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::raw::one_of;
use crate::classify::Verdict;
use crate::context::Context;
use crate::error::{ConfigError, Error, RejectionReason};
use crate::pipeline::{AnyResult, Kind, PipelineBuilder, WithAsyncFallback, WithFallback};
use crate::Pipeline;

/// A built pipeline of some kind, with the name of its kind.
#[derive(Clone)]
pub(crate) struct Typed {
    pipeline: Arc<dyn Any + Send + Sync>,
    kind: &'static str,
}

impl Typed {
    fn new<K: Kind>(pipeline: Pipeline<K>) -> Typed {
        Typed {
            pipeline: Arc::new(pipeline),
            kind: type_name::<K>(),
        }
    }

    /// A pipeline without named handlers, when `K` is its kind; else the
    /// name of its kind.
    pub(crate) fn untyped<K: Kind>(pipeline: &Pipeline) -> Result<Pipeline<K>, &'static str> {
        (pipeline as &dyn Any)
            .downcast_ref::<Pipeline<K>>()
            .cloned()
            .ok_or(type_name::<AnyResult>())
    }

    /// The pipeline, when it is of kind `K`.
    pub(crate) fn get<K: Kind>(&self) -> Option<Pipeline<K>> {
        self.pipeline.downcast_ref::<Pipeline<K>>().cloned()
    }

    /// The name of the pipeline's kind, e.g.
    /// `seawall::pipeline::kind::ErrorType<my::HttpError>`.
    pub(crate) fn kind(&self) -> &'static str {
        self.kind
    }
}

/// A classifier, erased: an `Arc<dyn Fn(&E) -> Verdict>` for its `E`.
#[derive(Clone)]
struct Classifier {
    error: TypeId,
    error_name: &'static str,
    classify: Arc<dyn Any + Send + Sync>,
    /// Builds the pipeline of this classifier alone.
    build: Arc<dyn Fn(PipelineBuilder) -> Result<Typed, ConfigError> + Send + Sync>,
}

type ClassifyFn<E> = Arc<dyn Fn(&E) -> Verdict + Send + Sync>;

/// Builds a pipeline with a fallback and, maybe, a classifier of the same
/// error type.
type FallbackBuild = Arc<
    dyn Fn(
            PipelineBuilder,
            Option<&Arc<dyn Any + Send + Sync>>,
            Option<&[FallbackOn]>,
        ) -> Result<Typed, ConfigError>
        + Send
        + Sync,
>;

/// A kind of final error a configured fallback takes (`fallback_on`): a
/// variant of [`Error`], or a rejection of one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FallbackOn {
    Operation,
    RetryExhausted,
    Timeout,
    Rejected,
    Store,
    Reason(RejectionReason),
}

impl FallbackOn {
    const VARIANTS: [(&'static str, FallbackOn); 5] = [
        ("operation", FallbackOn::Operation),
        ("retry_exhausted", FallbackOn::RetryExhausted),
        ("timeout", FallbackOn::Timeout),
        ("rejected", FallbackOn::Rejected),
        ("store", FallbackOn::Store),
    ];

    /// Every name, the variants of `Error` first, then the rejection
    /// reasons.
    fn names() -> Vec<&'static str> {
        Self::VARIANTS
            .iter()
            .map(|(n, _)| *n)
            .chain(RejectionReason::ALL.iter().map(|r| r.as_str()))
            .collect()
    }

    fn from_str(s: &str) -> Option<FallbackOn> {
        Self::VARIANTS
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, k)| *k)
            .or_else(|| {
                RejectionReason::ALL
                    .into_iter()
                    .find(|r| r.as_str() == s)
                    .map(FallbackOn::Reason)
            })
    }

    fn matches<E>(self, e: &Error<E>) -> bool {
        match (self, e) {
            (FallbackOn::Operation, Error::Operation(_))
            | (FallbackOn::RetryExhausted, Error::RetryExhausted { .. })
            | (FallbackOn::Timeout, Error::Timeout(_))
            | (FallbackOn::Rejected, Error::Rejected(_))
            | (FallbackOn::Store, Error::Store(_)) => true,
            (FallbackOn::Reason(reason), Error::Rejected(r)) => r.reason == reason,
            _ => false,
        }
    }
}

impl<'de> Deserialize<'de> for FallbackOn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = FallbackOn;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a kind of error")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<FallbackOn, E> {
                FallbackOn::from_str(s).ok_or_else(|| {
                    E::custom(format_args!(
                        "unknown variant `{s}`, {}",
                        one_of(&FallbackOn::names())
                    ))
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// The filter of a fallback limited to the kinds of `on`.
fn filter<E>(on: &[FallbackOn]) -> impl Fn(&Error<E>) -> bool + Send + Sync + 'static {
    let on = on.to_vec();
    move |e| on.iter().any(|k| k.matches(e))
}

#[derive(Clone)]
struct Fallback {
    error: TypeId,
    error_name: &'static str,
    build: FallbackBuild,
}

/// The classifiers and fallbacks of a registry, by name.
#[derive(Clone, Default)]
pub(crate) struct Named {
    classifiers: BTreeMap<String, Classifier>,
    fallbacks: BTreeMap<String, Fallback>,
}

impl fmt::Debug for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Named")
            .field("classifiers", &self.classifiers.keys().collect::<Vec<_>>())
            .field("fallbacks", &self.fallbacks.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Named {
    pub(crate) fn add_classifier<E, F>(&mut self, name: &str, classify: F)
    where
        E: 'static,
        F: Fn(&E) -> Verdict + Send + Sync + 'static,
    {
        let classify: ClassifyFn<E> = Arc::new(classify);
        let own = Arc::clone(&classify);
        self.classifiers.insert(
            name.to_owned(),
            Classifier {
                error: TypeId::of::<E>(),
                error_name: type_name::<E>(),
                classify: Arc::new(classify),
                build: Arc::new(move |b: PipelineBuilder| {
                    let c = Arc::clone(&own);
                    b.classify(move |e: &E| c(e)).build().map(Typed::new)
                }),
            },
        );
    }

    pub(crate) fn add_fallback_sync<T, E, F>(&mut self, name: &str, fallback: F)
    where
        T: 'static,
        E: 'static,
        F: Fn(Error<E>, Context) -> Result<T, E> + Send + Sync + 'static,
    {
        let fallback = Arc::new(fallback);
        self.add_fallback::<E>(
            name,
            Arc::new(move |b, classify, on| {
                let f = Arc::clone(&fallback);
                let b = b.fallback_sync(move |e: Error<E>, ctx| f(e, ctx));
                let b = match on {
                    Some(on) => b.fallback_when(filter(on)),
                    None => b,
                };
                let b = match classify_of::<E>(classify) {
                    Some(c) => b.classify(move |e: &E| c(e)),
                    None => b,
                };
                b.build().map(Typed::new::<WithFallback<T, E>>)
            }),
        );
    }

    pub(crate) fn add_fallback_async<T, E, F, Fut>(&mut self, name: &str, fallback: F)
    where
        T: 'static,
        E: 'static,
        F: Fn(Error<E>, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let fallback = Arc::new(fallback);
        self.add_fallback::<E>(
            name,
            Arc::new(move |b, classify, on| {
                let f = Arc::clone(&fallback);
                let b = b.fallback(move |e: Error<E>, ctx| f(e, ctx));
                let b = match on {
                    Some(on) => b.fallback_when(filter(on)),
                    None => b,
                };
                let b = match classify_of::<E>(classify) {
                    Some(c) => b.classify(move |e: &E| c(e)),
                    None => b,
                };
                b.build().map(Typed::new::<WithAsyncFallback<T, E>>)
            }),
        );
    }

    fn add_fallback<E: 'static>(&mut self, name: &str, build: FallbackBuild) {
        self.fallbacks.insert(
            name.to_owned(),
            Fallback {
                error: TypeId::of::<E>(),
                error_name: type_name::<E>(),
                build,
            },
        );
    }

    /// Checks that the names exist and that a classifier and a fallback
    /// named together handle the same error type.
    pub(crate) fn check(
        &self,
        classifier: Option<&str>,
        fallback: Option<&str>,
    ) -> Result<(), ConfigError> {
        self.lookup(classifier, fallback).map(drop)
    }

    fn lookup(
        &self,
        classifier: Option<&str>,
        fallback: Option<&str>,
    ) -> Result<(Option<&Classifier>, Option<&Fallback>), ConfigError> {
        let c = classifier
            .map(|n| {
                self.classifiers
                    .get(n)
                    .ok_or_else(|| unknown("classifier", n, self.classifiers.keys()))
            })
            .transpose()?;
        let f = fallback
            .map(|n| {
                self.fallbacks
                    .get(n)
                    .ok_or_else(|| unknown("fallback", n, self.fallbacks.keys()))
            })
            .transpose()?;
        if let (Some(c), Some(f), Some(cn), Some(fname)) = (c, f, classifier, fallback) {
            if c.error != f.error {
                return Err(ConfigError::new(
                    "pipeline",
                    "fallback",
                    format!(
                        "`{fname}` handles errors of type `{}`, but classifier `{cn}` handles `{}`: name a classifier and a fallback of the same error type",
                        f.error_name, c.error_name
                    ),
                ));
            }
        }
        Ok((c, f))
    }

    /// Builds the pipeline of `builder` with the named handlers; `None`
    /// when it names none.
    pub(crate) fn build(
        &self,
        builder: PipelineBuilder,
        classifier: Option<&str>,
        fallback: Option<&str>,
        fallback_on: Option<&[FallbackOn]>,
    ) -> Result<Option<Typed>, ConfigError> {
        match self.lookup(classifier, fallback)? {
            (None, None) => Ok(None),
            (Some(c), None) => (c.build)(builder).map(Some),
            (c, Some(f)) => (f.build)(builder, c.map(|c| &c.classify), fallback_on).map(Some),
        }
    }
}

fn classify_of<E: 'static>(c: Option<&Arc<dyn Any + Send + Sync>>) -> Option<ClassifyFn<E>> {
    // `check` has matched the error types: the downcast cannot fail.
    c.and_then(|c| c.downcast_ref::<ClassifyFn<E>>()).cloned()
}

fn unknown<'a>(
    what: &'static str,
    name: &str,
    known: impl Iterator<Item = &'a String>,
) -> ConfigError {
    let known: Vec<String> = known.map(|n| format!("`{n}`")).collect();
    let known = if known.is_empty() {
        "none".to_owned()
    } else {
        known.join(", ")
    };
    ConfigError::new(
        "pipeline",
        what,
        format!("`{name}` is not registered (registered {what}s: {known}); register it with `RegistryBuilder::{what}`"),
    )
}
