//! The registry of configured pipelines, and its reloading.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::named::{Named, Typed};
use super::raw::Resolved;
use super::{source, validate_by, Config, Format, LoadError, LookupError, UnknownPipeline};
use crate::adaptive::machine::Learned;
use crate::breaker::{CircuitState, CircuitTransition};
use crate::classify::Verdict;
use crate::clock::{Clock, Random};
use crate::context::Context;
use crate::error::Error;
use crate::event::EventKind;
use crate::pipeline::{Kind, PipelineBuilder};
use crate::retry::RetryBudget;
use crate::store::StateStore;
use crate::Pipeline;

type Step = Arc<dyn Fn(&str, PipelineBuilder) -> PipelineBuilder + Send + Sync>;

/// Sets up a [`Registry`]: the store, clock and random source of its
/// pipelines, and any code-only setting, then loads a configuration.
///
/// # Default
/// The process-wide [`MemoryStore::global`](crate::MemoryStore::global)
/// store, the system clock and random source, no listener; a configuration
/// without pipelines is refused (see [`allow_empty`](Self::allow_empty)).
#[derive(Clone, Default)]
pub struct RegistryBuilder {
    steps: Vec<Step>,
    allow_empty: bool,
    named: Named,
}

impl fmt::Debug for RegistryBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryBuilder")
            .field("steps", &self.steps.len())
            .field("allow_empty", &self.allow_empty)
            .field("named", &self.named)
            .finish()
    }
}

impl RegistryBuilder {
    fn step(
        mut self,
        step: impl Fn(&str, PipelineBuilder) -> PipelineBuilder + Send + Sync + 'static,
    ) -> Self {
        self.steps.push(Arc::new(step));
        self
    }

    /// Accepts a configuration that configures no pipeline, on load and on
    /// every reload. By default it is refused with [`LoadError::Empty`]: an
    /// empty or truncated file (a deployment that wrote nothing, a watched
    /// file caught while it is being replaced) would otherwise remove every
    /// pipeline without a word; a refused reload keeps the old pipelines.
    ///
    /// ```
    /// use seawall::config::{Format, LoadError, Registry};
    ///
    /// let refused = Registry::builder().load_str(Format::Yaml, "# nothing yet\n");
    /// assert!(matches!(refused, Err(LoadError::Empty { .. })));
    ///
    /// let registry = Registry::builder()
    ///     .allow_empty()
    ///     .load_str(Format::Yaml, "# nothing yet\n")?;
    /// assert!(registry.names().is_empty());
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn allow_empty(mut self) -> Self {
        self.allow_empty = true;
        self
    }

    /// Registers a classifier of errors of type `E` under `name`, for the
    /// pipelines whose entry says `classifier = "name"`. Such a pipeline is
    /// looked up with [`Registry::typed`] as a
    /// `Pipeline<ErrorType<E>>` (or, with a fallback, as the fallback's
    /// kind). A name registered again replaces the earlier registration.
    ///
    /// ```
    /// use seawall::config::{Format, Registry};
    /// use seawall::pipeline::ErrorType;
    /// use seawall::{Error, Verdict};
    ///
    /// #[derive(Debug)]
    /// struct HttpError(u16);
    ///
    /// let registry = Registry::builder()
    ///     .classifier("http", |e: &HttpError| match e.0 {
    ///         500.. => Verdict::retry(),
    ///         _ => Verdict::abort(),
    ///     })
    ///     .load_str(Format::Toml, r#"
    /// [pipelines.users]
    /// retry = { max_attempts = 3, delay = "1ms" }
    /// classifier = "http"
    /// "#)?;
    /// let users = registry.typed::<ErrorType<HttpError>>("users")?;
    /// let mut attempts = 0;
    /// let r = users.call(|_| {
    ///     attempts += 1;
    ///     Err::<(), _>(HttpError(404))
    /// });
    /// assert!(matches!(r, Err(Error::Operation(HttpError(404)))));
    /// assert_eq!(attempts, 1, "an aborted error is not retried");
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn classifier<E, F>(mut self, name: &str, classify: F) -> Self
    where
        E: 'static,
        F: Fn(&E) -> Verdict + Send + Sync + 'static,
    {
        self.named.add_classifier(name, classify);
        self
    }

    /// Registers an async fallback for `Result<T, E>` under `name`, for the
    /// pipelines whose entry says `fallback = "name"`: looked up with
    /// [`Registry::typed`] as a `Pipeline<WithAsyncFallback<T, E>>`. A
    /// classifier named with it must handle errors of the same type `E`.
    /// A name registered again replaces the earlier registration.
    pub fn fallback<T, E, F, Fut>(mut self, name: &str, fallback: F) -> Self
    where
        T: 'static,
        E: 'static,
        F: Fn(Error<E>, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        self.named.add_fallback_async(name, fallback);
        self
    }

    /// Registers a synchronous fallback for `Result<T, E>` under `name`
    /// (usable by `run` and `call`), for the pipelines whose entry says
    /// `fallback = "name"`: looked up with [`Registry::typed`] as a
    /// `Pipeline<WithFallback<T, E>>`. A classifier named with it must
    /// handle errors of the same type `E`. A name registered again replaces
    /// the earlier registration.
    ///
    /// ```
    /// use seawall::config::{Format, Registry};
    /// use seawall::pipeline::WithFallback;
    /// use seawall::Error;
    ///
    /// let registry = Registry::builder()
    ///     .fallback_sync("cached_quote", |_e: Error<std::io::Error>, _ctx| Ok(42_u32))
    ///     .load_str(Format::Yaml, "
    /// pipelines:
    ///   quotes:
    ///     timeout: 1s
    ///     fallback: cached_quote
    /// ")?;
    /// let quotes = registry.typed::<WithFallback<u32, std::io::Error>>("quotes")?;
    /// assert_eq!(quotes.call(|_| Err(std::io::Error::other("down")))?, 42);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn fallback_sync<T, E, F>(mut self, name: &str, fallback: F) -> Self
    where
        T: 'static,
        E: 'static,
        F: Fn(Error<E>, Context) -> Result<T, E> + Send + Sync + 'static,
    {
        self.named.add_fallback_sync(name, fallback);
        self
    }

    /// Registers a policy written in code ([`crate::custom`]) for
    /// `Result<T, E>` under its [`name`](crate::custom::Policy::name), for
    /// the pipelines whose `policies` list names it: it is declared at its
    /// place in the list, which must fit the
    /// [position](crate::custom::Policy::position) it declares (a load
    /// error at `policies` otherwise). Such a pipeline is looked up with
    /// [`Registry::typed`] as a `Pipeline<ValueType<T, E>>` (or, with a
    /// fallback, as the fallback's kind); the classifier, the fallback and
    /// the other policies it names must handle the same types. A name
    /// registered again replaces the earlier registration.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use seawall::config::{Format, Registry};
    /// use seawall::custom::{Next, Policy, PolicyFuture, Position};
    /// use seawall::pipeline::ValueType;
    /// use seawall::Context;
    ///
    /// /// Counts the calls that reach the pipeline.
    /// struct Calls(Arc<AtomicU32>);
    ///
    /// impl Policy<u32, std::io::Error> for Calls {
    ///     fn name(&self) -> &str { "calls" }
    ///     fn position(&self) -> Position { Position::Call }
    ///     fn call<'a>(&'a self, _: Context, next: Next<'a, u32, std::io::Error>)
    ///         -> PolicyFuture<'a, u32, std::io::Error>
    ///     {
    ///         self.0.fetch_add(1, Ordering::Relaxed);
    ///         Box::pin(async move { next.run().await })
    ///     }
    /// }
    ///
    /// let calls = Arc::new(AtomicU32::new(0));
    /// let registry = Registry::builder()
    ///     .policy(Calls(Arc::clone(&calls)))
    ///     .load_str(Format::Toml, r#"
    /// [pipelines.quotes]
    /// policies = ["calls", "retry"]
    /// retry = { max_attempts = 2, delay = "1ms" }
    /// "#)?;
    /// let quotes = registry.typed::<ValueType<u32, std::io::Error>>("quotes")?;
    /// assert_eq!(quotes.call(|_| Ok(7))?, 7);
    /// assert_eq!(calls.load(Ordering::Relaxed), 1);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy<T, E, P>(mut self, policy: P) -> Self
    where
        T: Send + 'static,
        E: Send + 'static,
        P: crate::custom::Policy<T, E> + 'static,
    {
        self.named.add_policy(policy);
        self
    }

    /// The store of every pipeline of the registry.
    pub fn store(self, store: impl StateStore) -> Self {
        let store = Arc::new(store);
        self.step(move |_, b| b.store(Arc::clone(&store)))
    }

    /// The clock of every pipeline of the registry.
    pub fn clock<C: Clock + Clone>(self, clock: C) -> Self {
        self.step(move |_, b| b.clock(clock.clone()))
    }

    /// The random source of every pipeline of the registry.
    pub fn random<R: Random + Clone>(self, random: R) -> Self {
        self.step(move |_, b| b.random(random.clone()))
    }

    /// Adjusts the builder of every pipeline (given its name) after its
    /// configured policies are declared: add listeners, metrics, a store of
    /// your own. Called on every (re)load, once to check the result and once
    /// to build it, so it should only configure the builder.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use std::sync::Arc;
    /// use seawall::config::{Format, Registry};
    ///
    /// let events = Arc::new(AtomicU32::new(0));
    /// let seen = events.clone();
    /// let registry = Registry::builder()
    ///     .configure(move |_name, b| {
    ///         let seen = seen.clone();
    ///         b.on_event(move |_e| {
    ///             seen.fetch_add(1, Ordering::Relaxed);
    ///         })
    ///     })
    ///     .load_str(Format::Toml, "[pipelines.a]\ntimeout = \"1s\"\n")?;
    /// registry.pipeline("a")?.call(|_| Ok::<_, std::io::Error>(()))?;
    /// assert!(events.load(Ordering::Relaxed) > 0);
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    pub fn configure(
        self,
        f: impl Fn(&str, PipelineBuilder) -> PipelineBuilder + Send + Sync + 'static,
    ) -> Self {
        self.step(f)
    }

    /// Builds the registry from a parsed configuration.
    ///
    /// # Errors
    /// [`LoadError::Invalid`] when a pipeline cannot be built with the
    /// settings of this builder (a store that cannot bind, say);
    /// [`LoadError::Empty`] when it configures no pipeline (unless
    /// [`allow_empty`](Self::allow_empty)).
    pub fn load(self, config: Config) -> Result<Registry, LoadError> {
        let registry = self.empty(None);
        registry.apply(config)?;
        Ok(registry)
    }

    /// Builds the registry from a configuration in a string.
    ///
    /// # Errors
    /// As for [`Config::parse`] and [`load`](Self::load).
    pub fn load_str(self, format: Format, text: &str) -> Result<Registry, LoadError> {
        self.load(Config::parse(format, text)?)
    }

    /// Builds the registry from a file (`.toml`, `.yaml` or `.yml`);
    /// [`Registry::reload`] and [`Registry::reload_if_changed`] read it
    /// again.
    ///
    /// # Errors
    /// As for [`Config::from_file`] and [`load`](Self::load).
    pub fn load_file(self, path: impl AsRef<Path>) -> Result<Registry, LoadError> {
        let path = path.as_ref();
        let (format, text) = source::read(path)?;
        let config = Config::parse_from(&path.display().to_string(), format, &text)?;
        let registry = self.empty(Some(path.to_owned()));
        registry.apply(config)?;
        registry.inner.lock_file().seen = Some(text);
        Ok(registry)
    }

    fn empty(self, file: Option<PathBuf>) -> Registry {
        Registry {
            inner: Arc::new(Inner {
                steps: self.steps,
                allow_empty: self.allow_empty,
                named: self.named,
                slots: RwLock::new(HashMap::new()),
                config: RwLock::new(Arc::new(Config::empty())),
                reload: Mutex::new(()),
                file: Mutex::new(FileState {
                    path: file,
                    seen: None,
                    pending: None,
                }),
            }),
        }
    }
}

/// Named pipelines built from a configuration, reloadable at run time.
///
/// Cheap to clone (clones share the pipelines). See the [module
/// docs](crate::config) for the file format and the reload semantics.
///
/// ```
/// use seawall::config::{Format, Registry};
/// use seawall::MemoryStore;
///
/// let registry = Registry::builder()
///     .store(MemoryStore::new())
///     .load_str(Format::Toml, "[pipelines.users.retry]\ndelay = \"10ms\"\nmax_attempts = 2\n")?;
/// let users = registry.handle("users")?;
///
/// registry.reload_str(Format::Toml, "[pipelines.users.retry]\ndelay = \"10ms\"\nmax_attempts = 0\n")
///     .expect_err("max_attempts 0 is refused; the old pipeline stays");
/// registry.reload_str(Format::Toml, "[pipelines.users.retry]\ndelay = \"10ms\"\nmax_attempts = 4\n")?;
/// // The handle serves the new settings.
/// let mut attempts = 0;
/// let _ = users.call(|_| {
///     attempts += 1;
///     Err::<(), _>("down")
/// });
/// assert_eq!(attempts, 4);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    steps: Vec<Step>,
    /// A configuration without pipelines is loaded, not refused.
    allow_empty: bool,
    /// The classifiers and fallbacks registered in code.
    named: Named,
    slots: RwLock<HashMap<String, Arc<Slot>>>,
    config: RwLock<Arc<Config>>,
    /// Serializes reloads.
    reload: Mutex<()>,
    file: Mutex<FileState>,
}

struct FileState {
    /// The file the registry was loaded from or last reloaded from.
    path: Option<PathBuf>,
    /// The text last read from it, loaded or not.
    seen: Option<String>,
    /// A changed text read once by the watcher, loaded when read again.
    pending: Option<String>,
}

/// The current pipeline of one name; shared with its handles.
struct Slot {
    entry: RwLock<Entry>,
    /// `false` once a reload removed the name.
    live: AtomicBool,
}

/// What a reload keeps or compares of the pipeline it replaces.
struct Previous {
    /// Its retry (or hedging) budget, whose tokens an unchanged budget
    /// keeps.
    budget: Option<RetryBudget>,
    /// The state of its circuit, if it has a circuit breaker.
    circuit: Option<CircuitState>,
    /// What its adaptive limit found, if it has one.
    limit: Option<Learned>,
}

#[derive(Clone)]
struct Entry {
    /// The pipeline without the named handlers (what a handle taken
    /// before they were named keeps serving).
    pipeline: Pipeline,
    /// The pipeline with the named classifier and fallback, if the entry
    /// names any.
    typed: Option<Typed>,
    budget: Option<RetryBudget>,
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // Every write replaces a value whole: a panic cannot leave it half-done.
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

impl Inner {
    fn lock_file(&self) -> MutexGuard<'_, FileState> {
        lock(&self.file)
    }

    /// The builder of pipeline `name`, with the policies written in code
    /// it lists (to be bound by [`Named::build`]) or without them (the
    /// untyped pipeline a [`PipelineHandle`] serves).
    fn builder(
        &self,
        name: &str,
        resolved: &Resolved,
        budget: Option<&RetryBudget>,
        code: bool,
    ) -> PipelineBuilder {
        let named = &self.named;
        let known = |policy: &str| named.position(policy);
        let mut b = resolved.apply(
            Pipeline::builder(name),
            budget,
            code.then_some(&known as super::raw::Code<'_>),
        );
        for step in &self.steps {
            b = step(name, b);
        }
        b
    }
}

impl Registry {
    /// Starts setting up a registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// A registry of the pipelines of a file (`.toml`, `.yaml` or `.yml`),
    /// on the default store and clock.
    ///
    /// # Errors
    /// As for [`RegistryBuilder::load_file`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Registry, LoadError> {
        Self::builder().load_file(path)
    }

    /// The pipeline `name`, as currently configured; `None` when no such
    /// pipeline is configured, or when its entry names a classifier, a
    /// fallback or a policy written in code (look it up with
    /// [`typed`](Self::typed)).
    pub fn get(&self, name: &str) -> Option<Pipeline> {
        self.typed(name).ok()
    }

    /// The pipeline `name`, as currently configured.
    ///
    /// # Errors
    /// [`UnknownPipeline`], naming the pipeline and those configured; a
    /// pipeline whose entry names a classifier, a fallback or a policy
    /// written in code is not handed out untyped (it would run without
    /// them): look it up with
    /// [`typed`](Self::typed).
    pub fn pipeline(&self, name: &str) -> Result<Pipeline, UnknownPipeline> {
        self.typed(name).map_err(|e| match e {
            LookupError::Unknown(u) => u,
            LookupError::Kind { configured, .. } => UnknownPipeline {
                typed: Some(configured),
                ..self.unknown(name)
            },
        })
    }

    /// The pipeline `name`, as currently configured, of kind `K`: the kind
    /// its named handlers make it (`ErrorType<E>` for a classifier of `E`,
    /// `ValueType<T, E>` for policies written in code registered with
    /// [`policy`](RegistryBuilder::policy), `WithFallback<T, E>` for a
    /// fallback registered with
    /// [`fallback_sync`](RegistryBuilder::fallback_sync),
    /// `WithAsyncFallback<T, E>` for one registered with
    /// [`fallback`](RegistryBuilder::fallback)), or [`AnyResult`] when its
    /// entry names none. Look it up again after a reload to follow it.
    ///
    /// # Errors
    /// [`LookupError::Unknown`] when no such pipeline is configured,
    /// [`LookupError::Kind`] when the pipeline is of another kind (naming
    /// both).
    ///
    /// [`AnyResult`]: crate::pipeline::AnyResult
    pub fn typed<K: Kind>(&self, name: &str) -> Result<Pipeline<K>, LookupError> {
        let slots = read(&self.inner.slots);
        let Some(slot) = slots.get(name).filter(|s| s.live.load(Ordering::Acquire)) else {
            drop(slots);
            return Err(LookupError::Unknown(self.unknown(name)));
        };
        let entry = read(&slot.entry);
        let found = match &entry.typed {
            Some(t) => t.get::<K>().ok_or(t.kind()),
            None => Typed::untyped::<K>(&entry.pipeline),
        };
        found.map_err(|configured| LookupError::Kind {
            name: name.to_owned(),
            configured: configured.to_owned(),
            asked: std::any::type_name::<K>().to_owned(),
        })
    }

    /// A handle that always serves the latest configuration of pipeline
    /// `name`. If a reload removes the name, the handle keeps serving the
    /// last pipeline it had; if a reload names a classifier, a fallback or
    /// policies written in code in its entry, the handle serves its other
    /// policies without them (look the pipeline up with
    /// [`typed`](Self::typed)).
    ///
    /// # Errors
    /// [`UnknownPipeline`] when no such pipeline is configured, or when its
    /// entry names a classifier, a fallback or a policy written in code.
    pub fn handle(&self, name: &str) -> Result<PipelineHandle, UnknownPipeline> {
        // A pipeline with named handlers is refused, as by `pipeline`.
        self.pipeline(name)?;
        let slots = read(&self.inner.slots);
        match slots.get(name).filter(|s| s.live.load(Ordering::Acquire)) {
            Some(slot) => Ok(PipelineHandle {
                slot: Arc::clone(slot),
            }),
            None => {
                drop(slots);
                Err(self.unknown(name))
            }
        }
    }

    fn unknown(&self, name: &str) -> UnknownPipeline {
        UnknownPipeline {
            name: name.to_owned(),
            configured: self.names(),
            typed: None,
        }
    }

    /// The names of the configured pipelines, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = read(&self.inner.slots)
            .iter()
            .filter(|(_, s)| s.live.load(Ordering::Acquire))
            .map(|(n, _)| n.clone())
            .collect();
        names.sort();
        names
    }

    /// The configuration in force.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&read(&self.inner.config))
    }

    /// Replaces every pipeline with those of `config`, or none.
    ///
    /// # Errors
    /// [`LoadError::Invalid`] when a pipeline cannot be built with the
    /// registry's settings, [`LoadError::Empty`] when `config` has no
    /// pipeline (unless [`allow_empty`](RegistryBuilder::allow_empty)); the
    /// old pipelines stay.
    pub fn reload(&self, config: Config) -> Result<(), LoadError> {
        self.apply(config)
    }

    /// Replaces every pipeline with those of a configuration in a string,
    /// or none.
    ///
    /// # Errors
    /// As for [`Config::parse`] and [`reload`](Self::reload); the old
    /// pipelines stay.
    pub fn reload_str(&self, format: Format, text: &str) -> Result<(), LoadError> {
        self.apply(Config::parse(format, text)?)
    }

    /// Replaces every pipeline with those of a file, or none; the file
    /// becomes the one [`reload_if_changed`](Self::reload_if_changed) reads.
    ///
    /// # Errors
    /// As for [`Config::from_file`] and [`reload`](Self::reload); the old
    /// pipelines stay.
    pub fn reload_file(&self, path: impl AsRef<Path>) -> Result<(), LoadError> {
        let path = path.as_ref();
        let (format, text) = source::read(path)?;
        {
            let mut file = self.inner.lock_file();
            file.path = Some(path.to_owned());
            file.seen = Some(text.clone());
        }
        let config = Config::parse_from(&path.display().to_string(), format, &text)?;
        self.apply(config)
    }

    /// Reads the registry's file again and reloads it if its text changed
    /// since it was last read; `Ok(false)` when it did not change (or the
    /// registry has no file). A file that failed to load is reported once,
    /// not again until it changes.
    ///
    /// # Errors
    /// As for [`reload_file`](Self::reload_file); the old pipelines stay.
    pub fn reload_if_changed(&self) -> Result<bool, LoadError> {
        self.poll_file(false)
    }

    /// With `settle`, a changed text is loaded only once two reads in a row
    /// agree on it, so that a file caught halfway through a write is not
    /// loaded.
    fn poll_file(&self, settle: bool) -> Result<bool, LoadError> {
        let Some(path) = self.inner.lock_file().path.clone() else {
            return Ok(false);
        };
        let (format, text) = source::read(&path)?;
        {
            let mut file = self.inner.lock_file();
            if file.seen.as_deref() == Some(text.as_str()) {
                file.pending = None;
                return Ok(false);
            }
            if settle && file.pending.as_deref() != Some(text.as_str()) {
                file.pending = Some(text);
                return Ok(false);
            }
            file.pending = None;
            file.seen = Some(text.clone());
        }
        let config = Config::parse_from(&path.display().to_string(), format, &text)?;
        self.apply(config).map(|()| true)
    }

    fn apply(&self, config: Config) -> Result<(), LoadError> {
        if !self.inner.allow_empty && config.names().next().is_none() {
            return Err(config.empty_error());
        }
        let reloading = lock(&self.inner.reload);
        // Check every pipeline before building any, so that a refused
        // configuration leaves no trace in the store.
        for (name, resolved) in config.resolved() {
            let named = &self.inner.named;
            let (classifier, fallback) =
                (resolved.classifier.as_deref(), resolved.fallback.as_deref());
            named
                .check(classifier, fallback, resolved.code())
                .and_then(|()| {
                    validate_by(self.inner.builder(name, resolved, None, true), |b| {
                        let on = resolved.fallback_on.as_deref();
                        match named.build(b.clone(), classifier, fallback, on, resolved.code())? {
                            Some(_) => Ok(()),
                            None => b.build().map(drop),
                        }
                    })
                })
                .map_err(|e| config.invalid(name, e))?;
        }
        let previous: HashMap<String, Previous> = read(&self.inner.slots)
            .iter()
            .map(|(n, s)| {
                let entry = read(&s.entry);
                let previous = Previous {
                    budget: entry.budget.clone(),
                    circuit: entry.pipeline.circuit_state().ok(),
                    limit: match &entry.typed {
                        Some(t) => t.learned_limit(),
                        None => entry.pipeline.learned_limit(),
                    },
                };
                (n.clone(), previous)
            })
            .collect();
        let mut built = Vec::new();
        for (name, resolved) in config.resolved() {
            // An unchanged budget keeps its tokens.
            let budget = match (
                resolved.budget(),
                previous.get(name).and_then(|p| p.budget.as_ref()),
            ) {
                (Some(new), Some(old)) if new == old => Some(old.clone()),
                (new, _) => new.cloned(),
            };
            let limit = previous.get(name).and_then(|p| p.limit);
            let builder = self
                .inner
                .builder(name, resolved, budget.as_ref(), true)
                .resume_limit(limit);
            let typed = self
                .inner
                .named
                .build(
                    builder,
                    resolved.classifier.as_deref(),
                    resolved.fallback.as_deref(),
                    resolved.fallback_on.as_deref(),
                    resolved.code(),
                )
                .map_err(|e| config.invalid(name, e))?;
            // Untyped, a pipeline runs without the handlers named in code.
            let untyped = self
                .inner
                .builder(name, resolved, budget.as_ref(), false)
                .resume_limit(limit);
            let pipeline = untyped.build().map_err(|e| config.invalid(name, e))?;
            built.push((
                name.to_owned(),
                Entry {
                    pipeline,
                    typed,
                    budget,
                },
            ));
        }
        // A circuit the reload replaced (its settings changed) starts
        // closed, and an adaptive limit of other settings from its initial
        // limit: said as a close and as a change of the limit, once the
        // new pipelines are in place, so that listeners (the gauges) do
        // not go on reading what was replaced.
        let mut reports = Vec::new();
        for (name, entry) in &built {
            let Some(before) = previous.get(name) else {
                continue;
            };
            if before.circuit.is_some_and(|s| s != CircuitState::Closed)
                && entry.pipeline.circuit_state().ok() == Some(CircuitState::Closed)
            {
                let closed = EventKind::of_transition(CircuitTransition::Closed);
                reports.push((entry.pipeline.clone(), closed));
            }
            let limits = (
                before.limit.map(|l| l.limit()),
                entry.pipeline.concurrency_limit().map(|s| s.limit),
            );
            if let (Some(previous), Some(limit)) = limits {
                if previous != limit {
                    let changed = EventKind::LimitChanged { previous, limit };
                    reports.push((entry.pipeline.clone(), changed));
                }
            }
        }
        let mut slots = write(&self.inner.slots);
        for slot in slots.values() {
            slot.live.store(false, Ordering::Release);
        }
        for (name, entry) in built {
            match slots.get(&name) {
                Some(slot) => {
                    *write(&slot.entry) = entry;
                    slot.live.store(true, Ordering::Release);
                }
                None => {
                    let slot = Slot {
                        entry: RwLock::new(entry),
                        live: AtomicBool::new(true),
                    };
                    slots.insert(name, Arc::new(slot));
                }
            }
        }
        *write(&self.inner.config) = Arc::new(config);
        drop(slots);
        drop(reloading);
        for (pipeline, kind) in reports {
            pipeline.emit(None, || kind);
        }
        Ok(())
    }

    /// Polls the registry's file every `every` on a background thread and
    /// reloads it when its text changes; `on_reload` gets the result of each
    /// reload (a failed one keeps the old pipelines). The thread stops when
    /// the [`Watcher`] is dropped, or when the registry is.
    ///
    /// A new text is loaded once two polls in a row read it, so a file
    /// caught halfway through a write is not loaded; a reload therefore
    /// follows a change within two periods. Replacing the file atomically
    /// (write a temporary file, then rename it) avoids half-written reads
    /// altogether.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use seawall::config::Registry;
    ///
    /// let registry = Registry::from_file("seawall.toml")?;
    /// let _watcher = registry.watch(Duration::from_secs(2), |result| {
    ///     if let Err(e) = result {
    ///         eprintln!("configuration not reloaded: {e}");
    ///     }
    /// })?;
    /// # Ok::<_, Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`](crate::ConfigError) (`registry.watch`) when `every`
    /// is zero: the thread would read the file without pause.
    #[cfg(feature = "watch")]
    pub fn watch(
        &self,
        every: std::time::Duration,
        on_reload: impl Fn(Result<(), &LoadError>) + Send + 'static,
    ) -> Result<Watcher, crate::ConfigError> {
        use std::sync::mpsc::{self, RecvTimeoutError};

        if every.is_zero() {
            return Err(crate::ConfigError::new(
                "registry",
                "watch",
                "period must be > 0, got 0s",
            ));
        }

        let registry = Arc::downgrade(&self.inner);
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("seawall-config-watch".into())
            .spawn(move || {
                // A file that cannot be read is reported once, not at every poll.
                let mut unreadable = false;
                loop {
                    match stopped.recv_timeout(every) {
                        Err(RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                    let Some(inner) = registry.upgrade() else {
                        return;
                    };
                    match (Registry { inner }).poll_file(true) {
                        Ok(false) => unreadable = false,
                        Ok(true) => {
                            unreadable = false;
                            on_reload(Ok(()));
                        }
                        Err(e @ LoadError::Io { .. }) => {
                            if !std::mem::replace(&mut unreadable, true) {
                                on_reload(Err(&e));
                            }
                        }
                        Err(e) => {
                            unreadable = false;
                            on_reload(Err(&e));
                        }
                    }
                }
            })
            .expect("spawning the watch thread");
        Ok(Watcher {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("pipelines", &self.names())
            .field("file", &self.inner.lock_file().path)
            .finish()
    }
}

/// Stops the watch thread of [`Registry::watch`] when dropped.
#[cfg(feature = "watch")]
#[derive(Debug)]
pub struct Watcher {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[cfg(feature = "watch")]
impl Drop for Watcher {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pipeline of a [`Registry`] that follows reloads: each call runs on the
/// latest configuration, and a call in flight finishes on the pipeline it
/// started with. Cheap to clone.
#[derive(Clone)]
pub struct PipelineHandle {
    slot: Arc<Slot>,
}

impl PipelineHandle {
    /// The pipeline as currently configured (a cheap, shared snapshot).
    pub fn pipeline(&self) -> Pipeline {
        read(&self.slot.entry).pipeline.clone()
    }

    /// `false` once a reload removed the pipeline's name; the handle then
    /// keeps serving the last pipeline it had.
    pub fn is_configured(&self) -> bool {
        self.slot.live.load(Ordering::Acquire)
    }

    /// Runs an async operation on the current pipeline; see [`Pipeline::run`].
    ///
    /// # Errors
    /// As for [`Pipeline::run`].
    pub async fn run<T, E: 'static, Op, Fut>(&self, op: Op) -> Result<T, Error<E>>
    where
        Op: FnMut(Context) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let pipeline = self.pipeline();
        pipeline.run(op).await
    }

    /// Runs a blocking operation on the current pipeline; see
    /// [`Pipeline::call`].
    ///
    /// # Errors
    /// As for [`Pipeline::call`].
    pub fn call<T, E: 'static, Op>(&self, op: Op) -> Result<T, Error<E>>
    where
        Op: FnMut(Context) -> Result<T, E>,
    {
        self.pipeline().call(op)
    }
}

impl fmt::Debug for PipelineHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PipelineHandle")
            .field("pipeline", &read(&self.slot.entry).pipeline)
            .field("configured", &self.is_configured())
            .finish()
    }
}
