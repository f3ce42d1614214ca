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
use crate::adaptive::machine::Learned;
use crate::classify::Verdict;
use crate::context::{intern, Context};
use crate::custom::{Policy, Position};
use crate::error::{ConfigError, Error, RejectionReason};
use crate::pipeline::{
    AnyResult, Kind, OutcomeKind, PipelineBuilder, ValueType, WithAsyncFallback, WithFallback,
};
use crate::Pipeline;

/// A built pipeline of some kind, with the name of its kind.
#[derive(Clone)]
pub(crate) struct Typed {
    pipeline: Arc<dyn Any + Send + Sync>,
    kind: &'static str,
    /// What the pipeline's adaptive limit found so far.
    learned: fn(&(dyn Any + Send + Sync)) -> Option<Learned>,
}

impl Typed {
    fn new<K: Kind>(pipeline: Pipeline<K>) -> Typed {
        Typed {
            pipeline: Arc::new(pipeline),
            kind: type_name::<K>(),
            learned: |p| {
                p.downcast_ref::<Pipeline<K>>()
                    .and_then(Pipeline::learned_limit)
            },
        }
    }

    /// What the pipeline's adaptive limit found so far (`None` without
    /// one).
    pub(crate) fn learned_limit(&self) -> Option<Learned> {
        (self.learned)(&*self.pipeline)
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
/// error type and policies written in code of the same types.
type FallbackBuild = Arc<
    dyn Fn(
            PipelineBuilder,
            Option<&Arc<dyn Any + Send + Sync>>,
            Option<&[FallbackOn]>,
            &[Binding<'_>],
        ) -> Result<Typed, ConfigError>
        + Send
        + Sync,
>;

/// Builds a pipeline with policies written in code (no fallback) and,
/// maybe, a classifier of the same error type.
type PoliciesBuild = Arc<
    dyn Fn(
            PipelineBuilder,
            Option<&Arc<dyn Any + Send + Sync>>,
            &[Binding<'_>],
        ) -> Result<Typed, ConfigError>
        + Send
        + Sync,
>;

/// A policy written in code, erased: a `CustomPolicy<T, E>` for its `T`
/// and `E`.
#[derive(Clone)]
struct NamedPolicy {
    /// Its name, kept for the pipelines that declare it.
    name: &'static str,
    position: Position,
    value: TypeId,
    error: TypeId,
    /// `Result<T, E>`, for messages.
    result_name: &'static str,
    policy: Arc<dyn Any + Send + Sync>,
    /// Builds the pipeline whose first listed policy written in code is
    /// this one, when it has no fallback.
    build: PoliciesBuild,
}

/// A policy written in code listed by a pipeline, to declare at its place.
pub(crate) struct Binding<'a> {
    name: &'static str,
    position: Position,
    policy: &'a Arc<dyn Any + Send + Sync>,
}

/// Binds the policies written in code of `bindings` into a builder that
/// knows their `T` and `E` (checked by [`Named::lookup`]).
fn bind<K, T, E>(mut builder: PipelineBuilder<K>, bindings: &[Binding<'_>]) -> PipelineBuilder<K>
where
    K: OutcomeKind<T, E, Out = K>,
    T: 'static,
    E: 'static,
{
    for b in bindings {
        if let Some(p) = b.policy.downcast_ref::<CustomPolicy<T, E>>() {
            builder = builder.bind_policy(b.name, b.position, Arc::clone(p));
        }
    }
    builder
}

type CustomPolicy<T, E> = Arc<dyn Policy<T, E>>;

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
    value: TypeId,
    error: TypeId,
    error_name: &'static str,
    /// `Result<T, E>`, for messages.
    result_name: &'static str,
    build: FallbackBuild,
}

/// The classifiers, fallbacks and policies written in code of a registry,
/// by name.
#[derive(Clone, Default)]
pub(crate) struct Named {
    classifiers: BTreeMap<String, Classifier>,
    fallbacks: BTreeMap<String, Fallback>,
    policies: BTreeMap<String, NamedPolicy>,
}

impl fmt::Debug for Named {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Named")
            .field("classifiers", &self.classifiers.keys().collect::<Vec<_>>())
            .field("fallbacks", &self.fallbacks.keys().collect::<Vec<_>>())
            .field("policies", &self.policies.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `Result<T, E>`, named.
fn result_name<T, E>() -> &'static str {
    type_name::<Result<T, E>>()
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
        self.add_fallback::<T, E>(
            name,
            Arc::new(move |b, classify, on, bindings| {
                let f = Arc::clone(&fallback);
                let b = b.fallback_sync(move |e: Error<E>, ctx| f(e, ctx));
                let b = bind(b, bindings);
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
        self.add_fallback::<T, E>(
            name,
            Arc::new(move |b, classify, on, bindings| {
                let f = Arc::clone(&fallback);
                let b = b.fallback(move |e: Error<E>, ctx| f(e, ctx));
                let b = bind(b, bindings);
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

    fn add_fallback<T: 'static, E: 'static>(&mut self, name: &str, build: FallbackBuild) {
        self.fallbacks.insert(
            name.to_owned(),
            Fallback {
                value: TypeId::of::<T>(),
                error: TypeId::of::<E>(),
                error_name: type_name::<E>(),
                result_name: result_name::<T, E>(),
                build,
            },
        );
    }

    pub(crate) fn add_policy<T, E, P>(&mut self, policy: P)
    where
        T: Send + 'static,
        E: Send + 'static,
        P: Policy<T, E> + 'static,
    {
        let name = intern(policy.name());
        let position = policy.position();
        let policy: CustomPolicy<T, E> = Arc::new(policy);
        self.policies.insert(
            name.to_owned(),
            NamedPolicy {
                name,
                position,
                value: TypeId::of::<T>(),
                error: TypeId::of::<E>(),
                result_name: result_name::<T, E>(),
                policy: Arc::new(policy),
                build: Arc::new(|b, classify, bindings| {
                    let b = bind(b.value_type::<T, E>(), bindings);
                    let b = match classify_of::<E>(classify) {
                        Some(c) => b.classify(move |e: &E| c(e)),
                        None => b,
                    };
                    b.build().map(Typed::new::<ValueType<T, E>>)
                }),
            },
        );
    }

    /// The name (as kept) and the position of the policy written in code
    /// registered as `name`.
    pub(crate) fn position(&self, name: &str) -> Option<(&'static str, Position)> {
        self.policies.get(name).map(|p| (p.name, p.position))
    }

    /// Checks that the names exist and that the handlers named together
    /// handle the same types: a classifier's errors those of the fallback
    /// and of the policies written in code, whose results are the
    /// fallback's.
    pub(crate) fn check<'a>(
        &self,
        classifier: Option<&str>,
        fallback: Option<&str>,
        policies: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ConfigError> {
        self.lookup(classifier, fallback, policies).map(drop)
    }

    #[allow(clippy::type_complexity)]
    fn lookup<'a>(
        &self,
        classifier: Option<&str>,
        fallback: Option<&str>,
        policies: impl IntoIterator<Item = &'a str>,
    ) -> Result<
        (
            Option<&Classifier>,
            Option<&Fallback>,
            Vec<(&'a str, &NamedPolicy)>,
        ),
        ConfigError,
    > {
        let (c, f) = self.lookup_handlers(classifier, fallback)?;
        let mut listed: Vec<(&'a str, &NamedPolicy)> = Vec::new();
        for name in policies {
            let Some(p) = self.policies.get(name) else {
                let known: Vec<String> = self.policies.keys().map(|n| format!("`{n}`")).collect();
                let known = if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                };
                return Err(ConfigError::new(
                    "pipeline",
                    "policies",
                    format!(
                        "lists `{name}`, which is neither a policy of the file nor a policy registered in code (registered policies: {known}); register it with `RegistryBuilder::policy`"
                    ),
                ));
            };
            // One `Result<T, E>` for every handler of the pipeline.
            let other = match (listed.first(), f) {
                (_, Some(f)) if (f.value, f.error) != (p.value, p.error) => Some(format!(
                    "fallback `{}` handles `{}`",
                    fallback.unwrap_or_default(),
                    f.result_name
                )),
                (Some((first, q)), _) if (q.value, q.error) != (p.value, p.error) => {
                    Some(format!("policy `{first}` handles `{}`", q.result_name))
                }
                _ => match (c, classifier) {
                    (Some(c), Some(cn)) if c.error != p.error => {
                        Some(format!("classifier `{cn}` handles `{}`", c.error_name))
                    }
                    _ => None,
                },
            };
            if let Some(other) = other {
                return Err(ConfigError::new(
                    "pipeline",
                    "policies",
                    format!(
                        "`{name}` handles `{}`, but {other}: name handlers of the same types",
                        p.result_name
                    ),
                ));
            }
            listed.push((name, p));
        }
        Ok((c, f, listed))
    }

    fn lookup_handlers(
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

    /// Builds the pipeline of `builder` with the named handlers (the
    /// policies written in code at the places `builder` declares them);
    /// `None` when it names none.
    pub(crate) fn build<'a>(
        &self,
        builder: PipelineBuilder,
        classifier: Option<&str>,
        fallback: Option<&str>,
        fallback_on: Option<&[FallbackOn]>,
        policies: impl IntoIterator<Item = &'a str>,
    ) -> Result<Option<Typed>, ConfigError> {
        let (c, f, listed) = self.lookup(classifier, fallback, policies)?;
        let bindings: Vec<Binding<'_>> = listed
            .iter()
            .map(|(_, p)| Binding {
                name: p.name,
                position: p.position,
                policy: &p.policy,
            })
            .collect();
        let classify = c.map(|c| &c.classify);
        match (c, f, listed.first()) {
            (None, None, None) => Ok(None),
            (_, Some(f), _) => (f.build)(builder, classify, fallback_on, &bindings).map(Some),
            (_, None, Some((_, p))) => (p.build)(builder, classify, &bindings).map(Some),
            (Some(c), None, None) => (c.build)(builder).map(Some),
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
