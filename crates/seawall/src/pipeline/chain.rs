//! Policies written in code ([`crate::custom`]) in a call: the passes of
//! each policy, and the inner runs and sleeps they ask for through their
//! [`Next`] handle, for both drivers.
//!
//! A policy's pass is a future. When it awaits `next.run()` or
//! `next.sleep(d)` it leaves the job in its [`Exchange`] and waits; the
//! [`Runner`] takes the job, runs it (the next policy's pass, or the layers
//! inside the innermost policy), and hands the result back. The async
//! driver runs every job a policy asked for at once (a hedge races its
//! runs) and drops those whose future the policy dropped; the blocking
//! driver runs one job at a time on the calling thread, the first asked
//! first, and polls the policies between jobs, so a policy that no longer
//! waits for a job never has it run. Either way the policy's code is the
//! same, and so is every decision of the engine: the layers inside the
//! policies are the engine's own steps.
//!
//! - Around the whole call, each inner run is a call through the rest of
//!   the pipeline ([`Call::start_within`]), with the deadline of a timeout
//!   of the whole call declared around the policy (a new one for the
//!   policies inside that timeout, when the policy just outside it makes a
//!   pass); the call the caller sees only ends, with the fallback.
//! - Around each attempt, each inner run is the operation with the chaos
//!   policies' injection, in the attempt's context; the attempt ends with
//!   the policies' result ([`Call::ended_through`]).
//!
//! A run asked once the pass's deadline has passed is a timeout at once; a
//! sleep is cut at the deadline. A pass that ends without having asked for
//! a run is reported ([`EventKind::ShortCircuited`]), and so is a refusal
//! made by a policy ([`EventKind::Rejected`], stamped with the resource).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;

use super::builder::declare::Custom;
use super::drive::{
    async_attempts, finish_sync, hedged_loop, operate_async, operate_sync, AttemptOutput,
};
use super::engine::{Call, Deadline, Driver, Finish, Owned};
use super::kind::{Handles, HandlesSync};
use super::{Kind, Pipeline};
use crate::classify::Verdict;
use crate::context::{Context, PartitionKey};
use crate::custom::{Done, Exchange, Job, Next, Policy, PolicyFuture, Position};
use crate::error::Error;
use crate::event::EventKind;
use crate::timeout::WithDeadline;

/// The policies written in code of a pipeline, as declared.
#[derive(Debug, Default)]
pub(crate) struct Customs {
    /// Around the whole call, outermost first.
    call: Box<[Layer]>,
    /// How many of `call` stand outside the timeout of the whole call,
    /// when it is declared among them.
    outside_timeout: Option<usize>,
    /// Around each attempt, outermost first.
    attempt: Box<[Layer]>,
}

/// One policy written in code: its name and where the pipeline's handlers
/// keep it.
#[derive(Debug, Clone, Copy)]
struct Layer {
    name: &'static str,
    slot: usize,
}

impl Customs {
    /// The policies of a validated declaration (every one bound).
    pub(crate) fn new(
        call: Vec<Custom>,
        outside_timeout: Option<usize>,
        attempt: Vec<Custom>,
    ) -> Self {
        let layers = |list: Vec<Custom>| -> Box<[Layer]> {
            list.into_iter()
                .filter_map(|c| c.slot.map(|slot| Layer { name: c.name, slot }))
                .collect()
        };
        Customs {
            call: layers(call),
            outside_timeout,
            attempt: layers(attempt),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.call.is_empty() && self.attempt.is_empty()
    }

    /// Policies wrap the whole call.
    #[inline(always)]
    pub(crate) fn around_call(&self) -> bool {
        !self.call.is_empty()
    }

    /// Policies wrap each attempt.
    #[inline(always)]
    pub(crate) fn around_attempt(&self) -> bool {
        !self.attempt.is_empty()
    }
}

/// The result of the policies of one side, and the operation's own verdict
/// on the last error.
type Through<T, E> = (Result<T, Error<E>>, Option<Verdict>);

/// What one inner run gave: its result, the operation's own verdict on its
/// error (an adapter's), and the attempts it made (around the call).
struct Ran<T, E> {
    result: Result<T, Error<E>>,
    judged: Option<Verdict>,
    attempts: u32,
}

/// A job under way for a pass: an inner run or a sleep.
struct Task<J, Z> {
    work: Work<J, Z>,
    /// The pass and the slot of its exchange the job answers.
    parent: (usize, usize),
    wake: Wakeup,
    /// Polled in the current poll of the runner.
    polled: bool,
}

/// The task's waker, as the runner last saw it.
#[derive(Default)]
struct TaskWaker(Mutex<Option<Waker>>);

impl TaskWaker {
    fn set(&self, waker: &Waker) {
        let mut w = lock(&self.0);
        if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
            *w = Some(waker.clone());
        }
    }
}

/// Whether a pass or a job was woken since it was last polled; waking it
/// wakes the task.
struct Flag {
    woken: AtomicBool,
    task: Arc<TaskWaker>,
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        let task = lock(&self.task.0).clone();
        if let Some(w) = task {
            w.wake();
        }
    }
}

/// A pass's or a job's own waker: it is polled only when woken (first when
/// it starts), as an executor polls its tasks.
struct Wakeup {
    flag: Arc<Flag>,
    waker: Waker,
}

impl Wakeup {
    fn new(task: &Arc<TaskWaker>) -> Self {
        let flag = Arc::new(Flag {
            woken: AtomicBool::new(true),
            task: Arc::clone(task),
        });
        Wakeup {
            waker: Waker::from(Arc::clone(&flag)),
            flag,
        }
    }

    fn is_woken(&self) -> bool {
        self.flag.woken.load(Ordering::SeqCst)
    }

    /// Clears the flag before a poll: a wake during the poll sets it again.
    fn take(&self) -> bool {
        self.flag.woken.swap(false, Ordering::SeqCst)
    }
}

enum Work<J, Z> {
    Run(Pin<Box<J>>),
    Sleep(Pin<Box<Z>>),
}

/// What runs for a slot of a pass.
#[derive(Debug, Clone, Copy)]
enum Child {
    Pass(usize),
    Job(usize),
}

/// One pass of a policy.
struct Pass<'p, T, E> {
    /// The policy's index in the chain.
    level: usize,
    /// `None` once the pass ended or was cancelled.
    future: Option<PolicyFuture<'p, T, E>>,
    exchange: Arc<Exchange<T, E>>,
    /// The pass and the slot this one answers (none for the outermost).
    parent: Option<(usize, usize)>,
    /// The deadline of the pass's context.
    bound: Option<Deadline>,
    /// The policy asked for an inner run.
    ran: bool,
    /// What runs for each slot of its exchange.
    children: Vec<Option<Child>>,
    wake: Wakeup,
}

/// The passes of the policies of one side of a call and their jobs. See
/// the [module docs](self).
struct Runner<'p, K: Kind, T, E, L, J, S, Z> {
    pipeline: &'p Pipeline<K>,
    partition: Option<&'p PartitionKey>,
    policies: Vec<(&'static str, &'p dyn Policy<T, E>)>,
    position: Position,
    /// Around the call: the first policy inside the timeout of the whole
    /// call, whose pass starts a new deadline.
    timeout_from: Option<usize>,
    /// Around an attempt: the attempt's context.
    attempt: Option<Context>,
    listening: bool,
    /// The blocking driver: one job at a time.
    sequential: bool,
    passes: Vec<Pass<'p, T, E>>,
    /// The inner runs and sleeps, in the order they started.
    jobs: Vec<Option<Task<J, Z>>>,
    task: Arc<TaskWaker>,
    run: L,
    sleep: S,
    /// Attempts made by the inner runs (around the call).
    attempts: u32,
    /// The operation's own verdict on the last inner run's error.
    judged: Option<Verdict>,
}

impl<'p, K, T, E, L, J, S, Z> Runner<'p, K, T, E, L, J, S, Z>
where
    K: Handles<T, E>,
    L: FnMut(Context, Option<Deadline>) -> J,
    J: Future<Output = Ran<T, E>>,
    S: FnMut(Duration) -> Z,
    Z: Future<Output = ()>,
{
    #[allow(clippy::too_many_arguments)]
    fn new(
        pipeline: &'p Pipeline<K>,
        partition: Option<&'p PartitionKey>,
        position: Position,
        attempt: Option<Context>,
        bound: Option<Deadline>,
        sequential: bool,
        run: L,
        sleep: S,
    ) -> Self {
        let shared = &*pipeline.shared;
        let (layers, timeout_from) = match position {
            Position::Call => (&shared.custom.call, shared.custom.outside_timeout),
            Position::Attempt => (&shared.custom.attempt, None),
        };
        let policies = layers
            .iter()
            .map(|l| {
                let policy = K::policy(&shared.handlers, l.slot)
                    .expect("a policy written in code is kept by the kind that declared it");
                (l.name, policy)
            })
            .collect();
        let mut runner = Runner {
            pipeline,
            partition,
            policies,
            position,
            timeout_from,
            attempt,
            listening: shared.listeners.enabled(),
            sequential,
            passes: Vec::new(),
            jobs: Vec::new(),
            task: Arc::default(),
            run,
            sleep,
            attempts: 0,
            judged: None,
        };
        let bound = match timeout_from {
            Some(0) => Deadline::overall(pipeline, runner.now()),
            _ => bound,
        };
        runner.open(0, None, bound);
        runner
    }

    fn now(&self) -> u64 {
        self.pipeline.shared.clock.now_nanos()
    }

    fn emit(&self, kind: impl FnOnce() -> EventKind) {
        if self.listening {
            self.pipeline.emit(self.partition, kind);
        }
    }

    /// The context of a pass bound by `bound`: the attempt's around an
    /// attempt, a context of attempt 1 with the deadline around the call.
    fn context(&self, bound: Option<Deadline>) -> Context {
        match &self.attempt {
            Some(ctx) => ctx.clone(),
            None => self
                .pipeline
                .context(self.partition, 1, bound.map(|b| b.at())),
        }
    }

    /// The attempt a pass's context and its events speak of.
    fn attempt_number(&self) -> u32 {
        self.attempt.as_ref().map_or(1, Context::attempt)
    }

    /// Starts a pass of the policy at `level`.
    fn open(&mut self, level: usize, parent: Option<(usize, usize)>, bound: Option<Deadline>) {
        let exchange = Arc::new(Exchange::new());
        let ctx = self.context(bound);
        let policy = self.policies[level].1;
        let future = policy.call(ctx, Next::new(Arc::clone(&exchange)));
        let index = self.passes.len();
        self.passes.push(Pass {
            level,
            future: Some(future),
            exchange,
            parent,
            bound,
            ran: false,
            children: Vec::new(),
            wake: Wakeup::new(&self.task),
        });
        if let Some((p, slot)) = parent {
            self.set_child(p, slot, Child::Pass(index));
        }
    }

    fn set_child(&mut self, pass: usize, slot: usize, child: Child) {
        let children = &mut self.passes[pass].children;
        if children.len() <= slot {
            children.resize(slot + 1, None);
        }
        children[slot] = Some(child);
    }

    /// Polls the passes and jobs that were woken until nothing moves: the
    /// result of the outermost pass and the operation's verdict on the last
    /// error, once it ended.
    ///
    /// A pass is polled whenever it was woken (a job it waits for ended). A
    /// job is polled at most once per poll of the runner, the latest
    /// started first, and once one ends no other job is polled before its
    /// pass: a job that wakes itself to yield (a virtual clock's sleep
    /// registering before time moves) is not polled again at once, and a
    /// policy that no longer waits for a job (a hedge's loser) drops it
    /// before it is polled again.
    fn poll_run(&mut self, cx: &mut TaskContext<'_>) -> Poll<Through<T, E>> {
        self.task.set(cx.waker());
        for task in self.jobs.iter_mut().flatten() {
            task.polled = false;
        }
        loop {
            let mut moved = false;
            // The blocking driver runs one job per round.
            let mut blocked = false;
            let mut p = 0;
            while p < self.passes.len() {
                if let Some(result) = self.poll_pass(p, &mut moved, &mut blocked) {
                    return Poll::Ready((result, self.judged));
                }
                p += 1;
            }
            moved |= self.poll_jobs();
            if !moved {
                return Poll::Pending;
            }
        }
    }

    /// Polls pass `p` if it was woken: its end (the outermost's is the
    /// result); then starts the jobs it asked for and drops those it no
    /// longer waits for.
    fn poll_pass(
        &mut self,
        p: usize,
        moved: &mut bool,
        blocked: &mut bool,
    ) -> Option<Result<T, Error<E>>> {
        let pass = &mut self.passes[p];
        let future = pass.future.as_mut()?;
        if pass.wake.take() {
            let mut cx = TaskContext::from_waker(&pass.wake.waker);
            if let Poll::Ready(result) = future.as_mut().poll(&mut cx) {
                *moved = true;
                pass.future = None;
                let result = self.ended(p, result);
                self.cancel_children(p);
                match self.passes[p].parent {
                    None => return Some(result),
                    Some((parent, slot)) => {
                        self.passes[parent].children[slot] = None;
                        self.passes[parent]
                            .exchange
                            .deliver(slot, Done::Ran(result));
                    }
                }
                return None;
            }
        }
        let exchange = Arc::clone(&self.passes[p].exchange);
        for slot in exchange.forgotten() {
            if let Some(child) = self.passes[p].children.get_mut(slot).and_then(Option::take) {
                *moved = true;
                self.cancel(child);
            }
        }
        while let Some((slot, job)) = exchange.asked() {
            let innermost = self.passes[p].level + 1 == self.policies.len();
            let blocking = self.sequential && (innermost || matches!(job, Job::Sleep(_)));
            if blocking && *blocked {
                break;
            }
            *blocked |= blocking;
            *moved = true;
            exchange.start(slot);
            self.start(p, slot, job);
        }
        None
    }

    /// Starts the job `job` that pass `p` asked for in `slot`.
    fn start(&mut self, p: usize, slot: usize, job: Job) {
        let (level, bound) = (self.passes[p].level, self.passes[p].bound);
        let now = bound.map(|_| self.now());
        let left = match (bound, now) {
            (Some(b), Some(now)) => Some(Duration::from_nanos(b.at().saturating_sub(now))),
            _ => None,
        };
        match job {
            Job::Sleep(d) => {
                let d = left.map_or(d, |left| d.min(left));
                let work = Work::Sleep(Box::pin((self.sleep)(d)));
                self.push_job(p, slot, work);
            }
            Job::Run => {
                self.passes[p].ran = true;
                if let (Some(b), Some(Duration::ZERO)) = (bound, left) {
                    let attempts = self.attempts.max(self.attempt_number());
                    let timeout = b.error(attempts, self.pipeline.shared.name);
                    self.passes[p]
                        .exchange
                        .deliver(slot, Done::Ran(Err(Error::Timeout(timeout))));
                    return;
                }
                let next = level + 1;
                let bound = match (self.timeout_from, now) {
                    (Some(from), _) if from == next => {
                        let now = now.unwrap_or_else(|| self.now());
                        Deadline::overall(self.pipeline, now)
                    }
                    _ => bound,
                };
                if next < self.policies.len() {
                    self.open(next, Some((p, slot)), bound);
                } else {
                    let ctx = self.context(bound);
                    let work = Work::Run(Box::pin((self.run)(ctx, bound)));
                    self.push_job(p, slot, work);
                }
            }
        }
    }

    fn push_job(&mut self, p: usize, slot: usize, work: Work<J, Z>) {
        let index = self.jobs.len();
        self.jobs.push(Some(Task {
            work,
            parent: (p, slot),
            wake: Wakeup::new(&self.task),
            polled: false,
        }));
        self.set_child(p, slot, Child::Job(index));
    }

    /// Polls the inner runs and sleeps that were woken and not yet polled
    /// in this poll of the runner, the latest started first, until one
    /// ends (`true`). (A virtual clock moves time to the earliest sleep
    /// registered when a sleeper is polled: a job just started registers
    /// its own before older ones move the time.)
    fn poll_jobs(&mut self) -> bool {
        for i in (0..self.jobs.len()).rev() {
            let Some(task) = self.jobs[i].as_mut() else {
                continue;
            };
            if task.polled || !task.wake.is_woken() {
                continue;
            }
            task.polled = true;
            task.wake.take();
            let mut cx = TaskContext::from_waker(&task.wake.waker);
            let (p, slot) = task.parent;
            let done = match &mut task.work {
                Work::Run(future) => match future.as_mut().poll(&mut cx) {
                    Poll::Ready(ran) => {
                        self.attempts = self.attempts.saturating_add(ran.attempts);
                        self.judged = ran.judged;
                        Done::Ran(ran.result)
                    }
                    Poll::Pending => continue,
                },
                Work::Sleep(future) => match future.as_mut().poll(&mut cx) {
                    Poll::Ready(()) => Done::Slept,
                    Poll::Pending => continue,
                },
            };
            self.jobs[i] = None;
            self.passes[p].children[slot] = None;
            self.passes[p].exchange.deliver(slot, done);
            return true;
        }
        false
    }

    /// The end of pass `p`: reported when it ran nothing, and a refusal of
    /// its own is stamped with the resource and reported.
    fn ended(&self, p: usize, result: Result<T, Error<E>>) -> Result<T, Error<E>> {
        let pass = &self.passes[p];
        let policy = self.policies[pass.level].0;
        if !pass.ran {
            let (position, attempt) = (self.position, self.attempt_number());
            self.emit(|| EventKind::ShortCircuited {
                policy,
                position,
                attempt,
            });
        }
        match result {
            // A refusal by the pipeline's own policies names the resource
            // already.
            Err(Error::Rejected(r)) if r.resource().is_empty() => {
                let r = r.for_resource(self.pipeline.shared.name);
                self.emit(|| EventKind::Rejected {
                    reason: r.reason,
                    retry_after: r.retry_after,
                });
                Err(Error::Rejected(r))
            }
            other => other,
        }
    }

    /// Drops what runs for the slots of pass `p`.
    fn cancel_children(&mut self, p: usize) {
        let children = std::mem::take(&mut self.passes[p].children);
        for child in children.into_iter().flatten() {
            self.cancel(child);
        }
    }

    /// Drops a job the policy no longer waits for: an inner run (the
    /// engine gives back what it held), a sleep, or a pass and its own.
    fn cancel(&mut self, child: Child) {
        match child {
            Child::Job(i) => self.jobs[i] = None,
            Child::Pass(q) => {
                self.passes[q].future = None;
                self.cancel_children(q);
            }
        }
    }

    /// The attempts the inner runs made.
    fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The deadline of the outermost pass when a timeout of the whole call
    /// stands before every policy (it bounds them all, with one deadline).
    fn outermost_bound(&self) -> Option<Deadline> {
        match self.timeout_from {
            Some(0) => self.passes.first().and_then(|p| p.bound),
            _ => None,
        }
    }
}

/// Wakes the blocked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls on the calling thread until ready, sleeping until woken.
fn block_on<R>(mut poll: impl FnMut(&mut TaskContext<'_>) -> Poll<R>) -> R {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = TaskContext::from_waker(&waker);
    loop {
        if let Poll::Ready(r) = poll(&mut cx) {
            return r;
        }
        std::thread::park();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A blocking call of a pipeline whose policies written in code wrap the
/// whole call: `outer`, the call the caller sees (it credited the retry
/// budget), ends with the result of the outermost policy.
#[cold]
#[inline(never)]
pub(super) fn call_around<K, T, E, Op>(outer: &mut Call<'_, K>, mut op: Op) -> Result<T, Error<E>>
where
    K: HandlesSync<T, E>,
    Op: FnMut(Context) -> Result<T, E>,
{
    let (pipeline, partition, weight) = (outer.pipeline(), outer.partition(), outer.weight());
    let clock = &pipeline.shared.clock;
    // Only the first pass deposits to a retry budget kept in the store.
    let first = AtomicBool::new(true);
    let run = |_ctx: Context, bound: Option<Deadline>| {
        let call = Call::start_within(pipeline, partition, Driver::Sync, bound);
        let earned = !first.swap(false, Ordering::Relaxed);
        let mut call = Owned(call.weighted(weight).earned(earned));
        let result = super::drive::sync_attempts(&mut call, &mut op, None);
        std::future::ready(Ran {
            result,
            judged: None,
            attempts: call.attempts(),
        })
    };
    let sleep = |d: Duration| {
        clock.sleep_blocking(d);
        std::future::ready(())
    };
    let mut runner = Runner::new(
        pipeline,
        partition,
        Position::Call,
        None,
        None,
        true,
        run,
        sleep,
    );
    let (result, _) = block_on(|cx| runner.poll_run(cx));
    outer.ran(runner.attempts());
    drop(runner);
    finish_sync(outer, result)
}

/// An async call of a pipeline whose policies written in code wrap the
/// whole call; see [`call_around`].
pub(super) async fn run_around<K, T, E, Op, Fut>(
    outer: &mut Call<'_, K>,
    op: Op,
) -> Result<T, Error<E>>
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    let (pipeline, partition, weight) = (outer.pipeline(), outer.partition(), outer.weight());
    let clock = &pipeline.shared.clock;
    // Concurrent passes (a hedge) share the operation: each attempt holds
    // it only to call it.
    let op = Mutex::new(op);
    let op = &op;
    // Only the first pass deposits to a retry budget kept in the store.
    let first = AtomicBool::new(true);
    let first = &first;
    // The attempts of inner runs the deadline cut.
    let cut = AtomicU32::new(0);
    let cut = &cut;
    let run = move |_ctx: Context, bound: Option<Deadline>| {
        let call = Call::start_within(pipeline, partition, Driver::Async, bound);
        let earned = !first.swap(false, Ordering::Relaxed);
        let mut run = InnerRun {
            call: Owned(call.weighted(weight).earned(earned)),
            cut,
            ended: false,
        };
        async move {
            let call = &mut run.call;
            let result = if pipeline.shared.hedging.is_some() {
                hedged_loop(call, &mut |ctx| (lock(op))(ctx), false).await
            } else {
                async_attempts(call, |ctx| (lock(op))(ctx), None).await
            };
            let attempts = call.attempts();
            run.end();
            Ran {
                result,
                judged: None,
                attempts,
            }
        }
    };
    let sleep = |d: Duration| clock.sleep(d);
    let mut runner = Runner::new(
        pipeline,
        partition,
        Position::Call,
        None,
        None,
        false,
        run,
        sleep,
    );
    // A timeout of the whole call declared before the policies bounds them
    // too: a policy still busy at the deadline (on anything but its inner
    // runs, which the deadline bounds already) is dropped with its pass.
    let bound = runner.outermost_bound();
    let passes = std::future::poll_fn(|cx| runner.poll_run(cx));
    let through = WithDeadline::new(passes, clock, bound.map(|b| b.at())).await;
    let (result, _) = match through {
        Some(through) => through,
        None => {
            let b = bound.expect("only a deadline expires");
            // The runs under way end here: their attempts count.
            runner.jobs.clear();
            let attempts = runner
                .attempts()
                .saturating_add(cut.load(Ordering::Relaxed));
            let after = b.error(attempts, pipeline.shared.name);
            runner.emit(|| EventKind::TimedOut {
                attempt: attempts.max(1),
                after: after.after,
            });
            (Err(Error::Timeout(after)), None)
        }
    };
    outer.ran(runner.attempts());
    drop(runner);
    match outer.finish(result) {
        Finish::Done(result) => result,
        Finish::Fallback(fallback) => {
            let result = fallback.await;
            outer.fell_back(result)
        }
    }
}

/// An inner run of an async call through the policies written in code
/// around it: a run whose future is dropped before it ends (a timeout of
/// the whole call cut it) adds the attempts it made to `cut`.
struct InnerRun<'a, 'g, K: Kind> {
    call: Owned<'g, K>,
    cut: &'a AtomicU32,
    ended: bool,
}

impl<K: Kind> InnerRun<'_, '_, K> {
    /// The run ended: its attempts are in its result.
    fn end(&mut self) {
        self.ended = true;
    }
}

impl<K: Kind> Drop for InnerRun<'_, '_, K> {
    fn drop(&mut self) {
        if !self.ended {
            self.cut.fetch_add(self.call.attempts(), Ordering::Relaxed);
        }
    }
}

/// The attempt under way of a blocking call, through the policies written
/// in code around it: their result and the operation's verdict on the last
/// error.
pub(super) fn attempt_sync<K, T, E, Op>(
    call: &Call<'_, K>,
    ctx: Context,
    op: &mut Op,
) -> (Result<T, Error<E>>, Option<Verdict>)
where
    K: HandlesSync<T, E>,
    Op: FnMut(Context) -> Result<T, E>,
{
    let clock = call.clock();
    let run = |ctx: Context, _: Option<Deadline>| {
        let result = operate_sync(call, ctx, &mut *op);
        std::future::ready(Ran {
            result: result.map_err(Error::Operation),
            judged: None,
            attempts: 0,
        })
    };
    let sleep = |d: Duration| {
        clock.sleep_blocking(d);
        std::future::ready(())
    };
    let (pipeline, partition, bound) = (call.pipeline(), call.partition(), call.bound());
    let mut runner = Runner::new(
        pipeline,
        partition,
        Position::Attempt,
        Some(ctx),
        bound,
        true,
        run,
        sleep,
    );
    block_on(|cx| runner.poll_run(cx))
}

/// The attempt under way of an async call, through the policies written in
/// code around it; see [`attempt_sync`]. The driver bounds it with the
/// attempt's deadline.
pub(super) async fn attempt_async<K, T, E, Op, Fut>(
    call: &Call<'_, K>,
    ctx: Context,
    op: &mut Op,
) -> (Result<T, Error<E>>, Option<Verdict>)
where
    K: Handles<T, E>,
    Op: FnMut(Context) -> Fut,
    Fut: Future,
    Fut::Output: AttemptOutput<T, E>,
{
    let clock = call.clock();
    // Concurrent runs (a hedge) share the operation: each holds it only to
    // call it.
    let op = Mutex::new(op);
    let op = &op;
    let run = move |ctx: Context, _: Option<Deadline>| {
        let attempt = operate_async(call, ctx, move |ctx| (lock(op))(ctx));
        async move {
            let (result, judged) = attempt.await;
            Ran {
                result: result.map_err(Error::Operation),
                judged,
                attempts: 0,
            }
        }
    };
    let sleep = |d: Duration| clock.sleep(d);
    let (pipeline, partition, bound) = (call.pipeline(), call.partition(), call.bound());
    let mut runner = Runner::new(
        pipeline,
        partition,
        Position::Attempt,
        Some(ctx),
        bound,
        false,
        run,
        sleep,
    );
    std::future::poll_fn(|cx| runner.poll_run(cx)).await
}
