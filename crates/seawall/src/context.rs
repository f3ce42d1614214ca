//! The per-call context handed to operations: attempt number, deadline,
//! resource name and partition.

use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::clock::ClockHandle;

/// What an operation knows about the attempt it runs in.
///
/// Feed [`Context::remaining`] to client timeouts so that one budget spans
/// every retry:
///
/// ```
/// # use seawall::Pipeline;
/// # use std::time::Duration;
/// let pipeline = Pipeline::builder("db").timeout(Duration::from_secs(2)).build().unwrap();
/// let rows = pipeline.call(|ctx| {
///     let budget = ctx.remaining().unwrap_or(Duration::from_secs(30));
///     assert!(budget <= Duration::from_secs(2));
///     Ok::<_, std::io::Error>(42)
/// });
/// assert_eq!(rows.unwrap(), 42);
/// ```
#[derive(Clone)]
pub struct Context {
    resource: &'static str,
    attempt: u32,
    /// The deadline, in nanoseconds on `clock`.
    deadline: Option<u64>,
    // The fields that may own a reference count are released by hand (see
    // `Drop`), so that dropping a context that owns none, the common case,
    // is free and inlined.
    clock: ManuallyDrop<ClockHandle>,
    partition: ManuallyDrop<Option<PartitionKey>>,
}

impl Drop for Context {
    #[inline(always)]
    fn drop(&mut self) {
        // The system clock and integer or static keys own nothing.
        let owns = !matches!(*self.clock, ClockHandle::System)
            || matches!(*self.partition, Some(PartitionKey::Shared(_)));
        if owns {
            // Moved out here, dropped out of line: the context itself never
            // has its address taken, so a context that owns nothing costs
            // nothing to build and drop.
            release(
                std::mem::take(&mut *self.clock),
                std::mem::take(&mut *self.partition),
            );
        }
    }
}

/// Drops what a context owned (a clock, a shared partition key).
#[cold]
#[inline(never)]
fn release(clock: ClockHandle, partition: Option<PartitionKey>) {
    drop(clock);
    drop(partition);
}

impl Context {
    /// The context of a first attempt with no deadline and no partition.
    #[inline]
    pub(crate) fn bare(resource: &'static str) -> Self {
        Context {
            resource,
            attempt: 1,
            deadline: None,
            clock: ManuallyDrop::new(ClockHandle::System),
            partition: ManuallyDrop::new(None),
        }
    }

    /// The context of attempt `attempt`, its deadline (if any) on `clock`.
    #[inline(always)]
    pub(crate) fn new(
        resource: &'static str,
        attempt: u32,
        deadline: Option<u64>,
        clock: &ClockHandle,
        partition: Option<&PartitionKey>,
    ) -> Self {
        Context {
            resource,
            attempt,
            deadline,
            clock: ManuallyDrop::new(match deadline {
                Some(_) => clock.clone(),
                None => ClockHandle::System,
            }),
            partition: ManuallyDrop::new(partition.cloned()),
        }
    }

    /// The resource name of the pipeline.
    pub fn resource(&self) -> &str {
        self.resource
    }

    /// The attempt number, starting at 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// `true` on the first attempt.
    pub fn is_first_attempt(&self) -> bool {
        self.attempt <= 1
    }

    /// The partition key the call was made with, if any.
    pub fn partition(&self) -> Option<&PartitionKey> {
        self.partition.as_ref()
    }

    /// The deadline of this attempt on the pipeline's clock, if any.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline.map(Duration::from_nanos)
    }

    /// Time left before the deadline (zero once it has passed), or `None`
    /// when the call has no deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|d| Duration::from_nanos(d.saturating_sub(self.clock.now_nanos())))
    }

    /// `true` once the deadline has passed: a result returned now would be
    /// late. At the deadline itself it is not yet (a result at the deadline
    /// is on time, see [`crate::timeout`]), though
    /// [`remaining`](Self::remaining) is zero then.
    pub fn is_expired(&self) -> bool {
        self.deadline
            .is_some_and(|d| crate::timeout::late_by(self.clock.now_nanos(), d).is_some())
    }
}

/// Builds the [`Context`] an operation receives, to unit-test the operation
/// without a pipeline (feature `test-util`).
///
/// # Default
/// Attempt 1, no deadline, no partition, the system clock.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use seawall::testing::VirtualClock;
/// use seawall::Context;
///
/// /// The operation under test: gives up when less than 100 ms are left.
/// fn fetch(ctx: &Context) -> Result<String, String> {
///     match ctx.remaining() {
///         Some(left) if left < Duration::from_millis(100) => {
///             Err(format!("{}: no time left", ctx.resource()))
///         }
///         _ => Ok(format!("attempt {} for {}", ctx.attempt(), ctx.partition().unwrap())),
///     }
/// }
///
/// let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
/// let ctx = Context::builder("users-api")
///     .attempt(2)
///     .deadline_in(Duration::from_secs(1))
///     .partition("t1")
///     .clock(clock.clone())
///     .build();
/// assert_eq!(fetch(&ctx).unwrap(), "attempt 2 for t1");
/// clock.advance(Duration::from_millis(950));
/// assert_eq!(fetch(&ctx).unwrap_err(), "users-api: no time left");
/// ```
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Clone)]
#[must_use]
pub struct ContextBuilder {
    resource: &'static str,
    attempt: u32,
    deadline: Option<BuilderDeadline>,
    clock: ClockHandle,
    partition: Option<PartitionKey>,
}

#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Clone, Copy)]
enum BuilderDeadline {
    /// This long after the clock's time when the context is built.
    In(Duration),
    /// At this time of the clock.
    At(Duration),
}

#[cfg(any(test, feature = "test-util"))]
impl Context {
    /// A builder of the context an operation receives, for resource
    /// `resource` (feature `test-util`); see [`ContextBuilder`]. Each
    /// distinct resource name is kept for the life of the process, as the
    /// names of pipelines are.
    pub fn builder(resource: &str) -> ContextBuilder {
        ContextBuilder {
            resource: intern(resource),
            attempt: 1,
            deadline: None,
            clock: ClockHandle::System,
            partition: None,
        }
    }
}

#[cfg(any(test, feature = "test-util"))]
impl ContextBuilder {
    /// The attempt number: 1 for the first attempt, as pipelines count.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// A deadline `after` the clock's time when [`build`](Self::build) is
    /// called (the maximum instant if that overflows).
    pub fn deadline_in(mut self, after: Duration) -> Self {
        self.deadline = Some(BuilderDeadline::In(after));
        self
    }

    /// A deadline at `at` on the clock (the time its `now` returns).
    pub fn deadline_at(mut self, at: Duration) -> Self {
        self.deadline = Some(BuilderDeadline::At(at));
        self
    }

    /// The partition key the call was made with.
    pub fn partition(mut self, key: impl Into<PartitionKey>) -> Self {
        self.partition = Some(key.into());
        self
    }

    /// The clock the deadline is on, e.g. a
    /// [`VirtualClock`](crate::testing::VirtualClock) the test advances.
    pub fn clock(mut self, clock: impl crate::clock::Clock) -> Self {
        self.clock = ClockHandle::from_clock(clock);
        self
    }

    /// The context.
    pub fn build(self) -> Context {
        let deadline = self.deadline.map(|d| match d {
            BuilderDeadline::In(after) => self
                .clock
                .now_nanos()
                .saturating_add(crate::clock::duration_nanos(after)),
            BuilderDeadline::At(at) => crate::clock::duration_nanos(at),
        });
        Context::new(
            self.resource,
            self.attempt,
            deadline,
            &self.clock,
            self.partition.as_ref(),
        )
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("resource", &self.resource)
            .field("attempt", &self.attempt)
            .field("deadline", &self.deadline())
            .field("partition", &*self.partition)
            .finish()
    }
}

/// The key of a partition: a tenant, an endpoint, a customer id. Each
/// partition of a resource gets its own circuit, bulkhead, rate limit and
/// cooldown.
///
/// Integers and `&'static str` keys cost no allocation; a `String` is moved
/// into a shared `Arc<str>`.
#[derive(Clone)]
pub enum PartitionKey {
    /// A static string key.
    Static(&'static str),
    /// An integer key.
    Int(u64),
    /// A shared string key.
    Shared(Arc<str>),
}

impl PartitionKey {
    /// The key as a string, when it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PartitionKey::Static(s) => Some(s),
            PartitionKey::Shared(s) => Some(s),
            PartitionKey::Int(_) => None,
        }
    }
}

impl PartialEq for PartitionKey {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PartitionKey::Int(a), PartitionKey::Int(b)) => a == b,
            (PartitionKey::Int(_), _) | (_, PartitionKey::Int(_)) => false,
            (a, b) => a.as_str() == b.as_str(),
        }
    }
}

impl Eq for PartitionKey {}

impl Hash for PartitionKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            PartitionKey::Int(i) => {
                state.write_u8(0);
                i.hash(state)
            }
            other => {
                state.write_u8(1);
                other.as_str().hash(state)
            }
        }
    }
}

impl fmt::Display for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionKey::Static(s) => f.write_str(s),
            PartitionKey::Shared(s) => f.write_str(s),
            PartitionKey::Int(i) => write!(f, "{i}"),
        }
    }
}

impl fmt::Debug for PartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartitionKey::Int(i) => write!(f, "{i}"),
            other => write!(f, "{:?}", other.as_str().unwrap_or_default()),
        }
    }
}

impl From<&'static str> for PartitionKey {
    fn from(s: &'static str) -> Self {
        PartitionKey::Static(s)
    }
}
impl From<String> for PartitionKey {
    fn from(s: String) -> Self {
        PartitionKey::Shared(s.into())
    }
}
impl From<Arc<str>> for PartitionKey {
    fn from(s: Arc<str>) -> Self {
        PartitionKey::Shared(s)
    }
}
impl From<u64> for PartitionKey {
    fn from(i: u64) -> Self {
        PartitionKey::Int(i)
    }
}
impl From<u32> for PartitionKey {
    fn from(i: u32) -> Self {
        PartitionKey::Int(i.into())
    }
}
impl From<usize> for PartitionKey {
    fn from(i: usize) -> Self {
        PartitionKey::Int(i as u64)
    }
}

/// Interns a resource name so that contexts can carry it without reference
/// counting. Each distinct name is stored once per process.
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn h(k: &PartitionKey) -> u64 {
        let mut s = DefaultHasher::new();
        k.hash(&mut s);
        s.finish()
    }

    #[test]
    fn a_context_gives_back_what_it_owns() {
        let name: Arc<str> = Arc::from("tenant");
        let key = PartitionKey::from(Arc::clone(&name));
        let clock = crate::testing::VirtualClock::new();
        let handle = ClockHandle::from_clock(clock.clone());
        let before = (Arc::strong_count(&name), clock.handles());
        {
            let ctx = Context::new("r", 2, Some(5), &handle, Some(&key));
            let copy = ctx.clone();
            assert_eq!(Arc::strong_count(&name), before.0 + 2);
            assert_eq!(clock.handles(), before.1 + 2);
            assert_eq!(copy.partition(), Some(&key));
            assert_eq!(copy.deadline(), Some(Duration::from_nanos(5)));
            assert_eq!(copy.remaining(), Some(Duration::from_nanos(5)));
            // Without a deadline the clock is not kept.
            let plain = Context::new("r", 1, None, &handle, None);
            assert_eq!(clock.handles(), before.1 + 2);
            drop(plain);
        }
        assert_eq!((Arc::strong_count(&name), clock.handles()), before);
        // Static and integer keys own nothing.
        let ctx = Context::new(
            "r",
            1,
            None,
            &ClockHandle::System,
            Some(&PartitionKey::Int(7)),
        );
        assert_eq!(ctx.partition(), Some(&PartitionKey::Int(7)));
    }

    #[test]
    fn a_built_context_reads_its_deadline_on_its_clock() {
        for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            let clock = crate::testing::VirtualClock::starting_at(start);
            let ctx = Context::builder("users-api")
                .attempt(3)
                .deadline_in(Duration::from_secs(2))
                .partition(7u64)
                .clock(clock.clone())
                .build();
            assert_eq!(ctx.resource(), "users-api");
            assert_eq!(ctx.attempt(), 3);
            assert!(!ctx.is_first_attempt());
            assert_eq!(ctx.partition(), Some(&PartitionKey::Int(7)));
            assert_eq!(ctx.deadline(), Some(start + Duration::from_secs(2)));
            assert_eq!(ctx.remaining(), Some(Duration::from_secs(2)));
            clock.advance(Duration::from_millis(1500));
            assert_eq!(ctx.remaining(), Some(Duration::from_millis(500)));
            assert!(!ctx.is_expired());
            clock.advance(Duration::from_secs(1));
            assert_eq!(ctx.remaining(), Some(Duration::ZERO));
            assert!(ctx.is_expired());
        }
    }

    #[test]
    fn a_context_at_its_deadline_is_not_expired_yet() {
        for start in [Duration::ZERO, Duration::from_secs(1_000_000)] {
            let clock = crate::testing::VirtualClock::starting_at(start);
            let ctx = Context::builder("users-api")
                .deadline_in(Duration::from_millis(100))
                .clock(clock.clone())
                .build();
            clock.advance(Duration::from_millis(100));
            assert_eq!(ctx.remaining(), Some(Duration::ZERO));
            assert!(!ctx.is_expired(), "a result now is on time");
            clock.advance(Duration::from_nanos(1));
            assert!(ctx.is_expired());
        }
    }

    #[test]
    fn a_built_context_has_the_defaults_of_a_first_attempt() {
        let ctx = Context::builder("db").build();
        assert_eq!(ctx.attempt(), 1);
        assert!(ctx.is_first_attempt());
        assert_eq!(ctx.deadline(), None);
        assert_eq!(ctx.remaining(), None);
        assert_eq!(ctx.partition(), None);
        assert!(std::ptr::eq(ctx.resource(), intern("db")));
    }

    #[test]
    fn a_built_deadline_saturates_and_may_be_absolute() {
        let clock = crate::testing::VirtualClock::starting_at(Duration::from_secs(10));
        let ctx = Context::builder("r")
            .deadline_in(Duration::MAX)
            .clock(clock.clone())
            .build();
        assert_eq!(ctx.deadline(), Some(Duration::from_nanos(u64::MAX)));
        let ctx = Context::builder("r")
            .deadline_at(Duration::from_secs(4))
            .clock(clock.clone())
            .build();
        // Already past.
        assert!(ctx.is_expired());
        // The deadline is taken when the context is built, on the last clock given.
        let later = crate::testing::VirtualClock::starting_at(Duration::from_secs(100));
        let ctx = Context::builder("r")
            .clock(clock)
            .deadline_in(Duration::from_secs(1))
            .clock(later)
            .build();
        assert_eq!(ctx.deadline(), Some(Duration::from_secs(101)));
    }

    #[test]
    fn string_keys_compare_by_content() {
        let a = PartitionKey::from("tenant-1");
        let b = PartitionKey::from(String::from("tenant-1"));
        assert_eq!(a, b);
        assert_eq!(h(&a), h(&b));
        assert_ne!(PartitionKey::from(1u64), PartitionKey::from("1"));
        assert_eq!(PartitionKey::from(7u32).to_string(), "7");
    }

    #[test]
    fn interning_returns_one_copy() {
        let a = intern("users-api");
        let b = intern(&String::from("users-api"));
        assert!(std::ptr::eq(a, b));
    }
}
