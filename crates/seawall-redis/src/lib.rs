//! A [`StateStore`](seawall::StateStore) on Redis: many processes calling
//! the same dependency see one circuit breaker, one bulkhead, one rate
//! limit and one cooldown.
//!
//! ```no_run
//! use std::time::Duration;
//! use seawall::{Bulkhead, CircuitBreaker, Cooldown, Pipeline, RateLimiter, Retry};
//! use seawall_redis::RedisStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .prefix("shop")
//!     .timeout(Duration::from_millis(250))
//!     .fail_open()
//!     .build()?;
//!
//! let inventory = Pipeline::builder("inventory-api")
//!     .retry(Retry::exponential(Duration::from_millis(100)).max_attempts(3))
//!     .circuit_breaker(CircuitBreaker::failure_rate(0.5).minimum_calls(20))
//!     .timeout(Duration::from_secs(2))
//!     .bulkhead(Bulkhead::new(50).lease(Duration::from_secs(10)))
//!     .cooldown(Cooldown::new())
//!     .rate_limiter(RateLimiter::gcra(1000, Duration::from_secs(1)))
//!     .store(store)
//!     .build()?;
//!
//! let stock = inventory.run(|_ctx| async { Ok::<_, std::io::Error>(42) }).await?;
//! # let _ = stock;
//! # Ok(())
//! # }
//! ```
//!
//! # How it works
//! - **One script call per successful attempt.** An attempt is admitted
//!   through circuit, bulkhead, cooldown and rate limit by one Lua script,
//!   a single call, atomic on the server: on Redis 7 and later, `FCALL` of
//!   a function of the store's library, whose definitions ran once when
//!   the library was loaded (by `EVALSHA`, they run on every call); by
//!   `EVALSHA` on an earlier server or for a user without the right to
//!   load or call functions. The same Lua either way. Nothing is read,
//!   changed and written back from the client. The scripts and the library
//!   are loaded when a pipeline binds the store and reloaded automatically
//!   when missing (`NOSCRIPT`, or a function not found: a server restart,
//!   `SCRIPT FLUSH`, `FUNCTION FLUSH`). A failure, a probe, a slow call or an
//!   outcome with a retry-after hint is recorded by a script call of its
//!   own; a success that can change nothing the caller is told (see [The
//!   success path](#the-success-path)) costs none. A
//!   cancelled attempt gives its permit back with one more script call, in
//!   the background on a multi-thread runtime (elsewhere its slot waits to
//!   be carried, as an ignored outcome: see [The success
//!   path](#the-success-path)) (on the blocking path when its runtime shuts down
//!   before that call is sent: an attempt that panics inside `block_on` of
//!   a runtime dropped at once,
//!   `carried::a_panicked_attempt_frees_its_slot_when_its_runtime_shuts_down`).
//!   So does a call dropped while its admission is on its way to Redis (a
//!   timeout or a `select!` around `Pipeline::run`): the admission is
//!   finished in a task of the runtime, and the bulkhead slot, the probe or
//!   the reserved rate-limit permit it took is given back
//!   (`carried::a_slot_taken_by_an_admission_dropped_in_flight_is_given_back`,
//!   `carried::a_permit_reserved_by_an_admission_dropped_in_flight_is_given_back`);
//!   only a runtime shut down meanwhile leaves them to their lease (a
//!   reservation to its instant).
//!   A refusal with a known end (a circuit open until T, a
//!   cooldown, an exhausted rate limit) is answered without a round trip
//!   until T after the first: see [Refusals answered
//!   locally](#refusals-answered-locally).
//! - **The server's clock decides** windows, leases and open periods (the
//!   scripts read `TIME`), so processes on hosts with skewed clocks agree.
//!   The `now` a pipeline passes is ignored, except with
//!   [`RedisStoreBuilder::caller_clock`] ([`TimeSource::Caller`]), meant for
//!   single-process tests with a virtual clock and for comparing the store
//!   with the reference models exactly.
//! - **Keys** are `{prefix:resource}:suffix`, or
//!   `{prefix:resource:s:key}:suffix` / `{prefix:resource:i:7}:suffix` for
//!   a partition: one hash tag, so a resource's keys share a cluster slot.
//!   A resource has at most seven keys: its state hash (circuit and cooldown),
//!   its count-window ring or time-window buckets, its bulkhead leases, its
//!   rate limiter and its retry budget's bucket (`:rb`). Every key written
//!   has a TTL: circuit state lives for the resource's `partition_idle`
//!   (plus what is left of an open period) but has none while the circuit
//!   is isolated or disabled (as in memory, an isolated circuit stays so
//!   until reset, a disabled one until enabled or reset, however long no
//!   call comes; the usual TTL is set again when it leaves that state),
//!   a cooldown for its pause plus
//!   `grace`, leases and rate state for their lease or period, the retry
//!   budget's bucket for `partition_idle` from its last change (then it is
//!   full again).
//! - **Bulkhead slots are leases**: a sorted set of slot ids (named after
//!   the microsecond they were taken in) scored by their expiry
//!   (`Bulkhead::lease`); an admission that carries a success may hold the
//!   success's slot again, its lease renewed (see *The success path*).
//!   A process killed while holding a slot loses it
//!   when the lease ends; give attempts a timeout shorter than the lease
//!   (the pipeline checks this). A round of half-open probes that a dead
//!   process left unfinished gives way too: after the breaker's
//!   `max_half_open`, or for a breaker without one, after
//!   [`RedisStoreBuilder::probe_lease`].
//! - **A retry budget kept in the store** (`RetryBudget::shared`): one
//!   bucket per resource (and partition) for every process, in thousandths
//!   of a token. The admission script deposits a call's share with its first
//!   admission and withdraws a retry's token with the retry's admission,
//!   after the cooldown and before the rate limiter, taken only if every
//!   check admits: no round trip of its own. A pipeline with no other
//!   stateful policy after its retry pays one script call per attempt and no
//!   record. The script restates the rule of `seawall::retry::BudgetRule`;
//!   the model test (`tests/redis/budget.rs`) runs random sequences on Redis,
//!   on the memory store and on `seawall::model::budget` and requires the
//!   same answers. Four processes against an always-failing dependency stay
//!   within `ratio x calls + max_tokens` retries in all
//!   (`cross_process::four_processes_retry_within_one_shared_budget`). While
//!   Redis is down the fail mode decides: fail-open answers from a bucket of
//!   the process (full at first), fail-closed ends the call with
//!   `Error::Store` (`budget::a_store_down_follows_the_fail_mode`). A server
//!   restarted empty starts every bucket full again (at most `max_tokens`
//!   more retries per resource and restart; admissions are not held for it).
//! - **Shadow mode** (`seawall::shadow`) and the breaker's other states
//!   (`open_for`, `max_half_open`, disabled) follow the same rules as in
//!   memory: the scripts restate them (an admission of a call shadowed
//!   already, `AdmitRequest::shadowed`, included), and the model tests
//!   check them on a real server.
//! - **Same semantics as the in-memory store**: the store passes the
//!   contract suite `seawall::store::contract` both with the server's clock
//!   and with a caller's clock (where every wait is checked exactly), and
//!   its circuit agrees with the reference model `seawall::model::breaker`
//!   on random sequences of calls, step by step. Resolutions: times are
//!   kept in microseconds, the rate limiters' to the nanosecond of the
//!   caller's clock as in memory (GCRA's arrival time, the fixed window's
//!   windows, aligned on multiples of its period to the nanosecond
//!   whatever the period, and its waits, the sliding log's entries: scored
//!   by their whole microsecond, named after their nanoseconds); the end
//!   of a circuit's cooldown in whole milliseconds, rounded up, as in
//!   memory. Lua numbers are doubles: times are exact up to 2^53 us (about
//!   285 years of a caller's clock), and a fixed window's index (the clock
//!   over the period) up to 2^53, which a period of 1 us or more never
//!   reaches.
//! - **Rate-limit reservations** as in memory: a call that may wait for
//!   a permit (`RateLimiter::max_wait`) reserves it in the admission
//!   script, so that concurrent callers, in every process, queue behind it
//!   or are refused at once; a reservation its call does not use is given
//!   back by the release script, where the state can tell it apart (as
//!   the in-memory rules say: GCRA's TAT, kept to the nanosecond, or the
//!   fixed window's last window still the one it set; a sliding log's
//!   entry). While Redis is down (fail-open), the local answer reserves
//!   nothing.
//!
//! # The success path
//! A *silent* success is the record of a success (or an ignored outcome)
//! that is not a half-open probe, not a slow call (for a breaker that
//! judges slow calls) and carries no retry-after hint: it never moves the
//! circuit nor opens a cooldown, so its answer tells the caller nothing.
//! On every path (`Pipeline::call`, `Pipeline::run` on a multi-thread or a
//! current-thread runtime), such a record is not sent on its own:
//! - it waits in the store, and the **next admission of the same resource
//!   and partition** through the store, blocking or async, carries it: that
//!   admission's script first applies each success it carries (the rule of
//!   `success.lua`, one Lua function shared by both scripts), then admits.
//!   A resource's keys, and a partition's, share one hash tag, so on a
//!   Redis Cluster the carried records are in the admission's slot;
//!   records of other resources or partitions are never carried;
//! - a success that no admission carries within
//!   [`success_delay`](RedisStoreBuilder::success_delay) (1 ms by default)
//!   is sent on its own by a timer: a task on the multi-thread runtime
//!   that recorded it (one script call, its answer not awaited), or,
//!   recorded outside one, the store's timer thread (started by the first
//!   such success, parked while nothing waits, ended with the store; one
//!   blocking script call, which the next admission, blocking or async,
//!   waits for rather than overtake it:
//!   `carried::an_admission_never_overtakes_a_success_the_timer_thread_sends`);
//! - it is sent before anything of the store that must see it: the
//!   circuit's metrics and controls and a blocking record that is not
//!   silent send every success waiting first; an async record that is not
//!   silent queues them on the connection before itself. The slots in flight
//!   (`Pipeline::in_flight`) do not count the slots of the successes
//!   waiting in the store asked (their attempts have ended); another
//!   store, or another process, counts them until they reach Redis.
//!
//! A silent success with nothing to change on the server (no bulkhead
//! slot to free, no circuit to count it) is not sent at all, on either
//! path (`carried::a_success_with_nothing_to_change_is_not_sent`).
//!
//! What holds:
//! - **Cost**: a call that succeeds at its first attempt costs one script
//!   call (its admission), one round trip of latency, blocking or async; a
//!   success sent on its own after its delay costs one more script call
//!   (`carried::a_successful_attempt_costs_one_script_call`, on both
//!   paths: at most 1.05 script calls per attempt, counted by `INFO
//!   commandstats`; the `redis_bench` example measures it with the default
//!   delay). On the
//!   server, that script call is Lua work: each `redis.call`, each
//!   argument, each number converted and each Lua function the script
//!   makes costs. An admission carrying successes reads the state hash
//!   once for them and for itself, and of a closed circuit only the fields
//!   a closed circuit uses; a count-window success writes only the counts
//!   it changes, and writes the window's ring only while the window holds
//!   a failure or a slow call (a success written over a success changes
//!   nothing); a script holds only the functions it calls; and the spec's
//!   numbers are converted only where used. An admission carrying a
//!   success takes over that success's bulkhead slot: the slot's lease is
//!   renewed (`ZADD XX`) and the admission holds it under the same id,
//!   rather than freeing it and taking another; a slot whose lease was
//!   dropped meanwhile is not taken over, and an admission that is refused
//!   frees it
//!   (`carried::an_admission_takes_over_the_slot_of_the_success_it_carries`).
//!   By `EVALSHA`, the admission
//!   scripts are compiled for each spec: the spec is in their text (two
//!   scripts per distinct spec, loaded when a pipeline binds), so an
//!   admission sends the time and its own arguments only, not the spec's
//!   26 values. As a function, the admission is one for every spec: a
//!   pipeline's first admission sends its spec in full with its id (the
//!   SHA-1 of its values), which the library keeps, typed as a compiled
//!   script has it (at most 1,024 specs: past that it forgets them and is
//!   sent them again); every later admission names the spec by its id, one
//!   argument instead of 26. A library that does not hold the spec (loaded
//!   again, a server restarted from disk, another node) answers with the
//!   error `SEAWALLSPEC`, and the call goes again with its spec in full: one
//!   more round trip, once per spec and server
//!   (`round_trips::a_library_that_lost_the_specs_is_sent_them_again`). For
//!   the chain of the `redis_bench` example (count-window breaker,
//!   bulkhead, GCRA limiter, cooldown), counted with callgrind on
//!   `redis-server` 7.0 (`--toggle-collect=fcallCommand`, the
//!   `script_breakdown` example's `--only "by its id"` row): an admission
//!   carrying a success takes about 208k instructions as a function with
//!   the spec by its id (289k by `EVALSHA`, compiled for its spec), about
//!   28 us of the server's time on a loaded 2-core machine (`INFO
//!   commandstats`; the `script_breakdown` example sets these side by side
//!   with a `PING` and an empty script). Its nine `redis.call`s, their
//!   arguments and the Lua around them, not the round trip, bound a single
//!   process's latency and throughput.
//! - **A slot is freed on the server** by the next admission of its
//!   partition through the same store, or once its success's delay has
//!   passed (plus the timer's resolution, about 1 ms, and the scheduling
//!   of the task), whichever comes first, while Redis answers. Another
//!   store sees it free without any further admission by the first
//!   (`carried::a_slot_freed_by_a_waiting_success_is_seen_free_within_the_delay`).
//!   Meanwhile a bulkhead may refuse an admission of another process that
//!   it would have let through had the success been sent at once: the
//!   bulkhead errs towards fewer calls, never more.
//! - **Transitions made by another process** are seen at the next
//!   admission, as before: an admission always reads the state on Redis
//!   (the successes it carries only add this process's own outcomes).
//! - **A store dropped** with successes waiting: its timer keeps what it
//!   needs and sends them after their delay; outside a multi-thread
//!   runtime, a resource dropped (its last pipeline dropped) sends its
//!   own at once, so that a blocking program that drops its pipelines
//!   before it exits leaves no slot taken
//!   (`carried::a_blocking_success_waiting_outlives_its_store`). A process
//!   that exits without dropping them loses them as a crash would: the
//!   slots come back when their leases end. **A runtime shut down**
//!   with successes waiting: the timer task is dropped with its runtime,
//!   and the slots of the successes waiting are given back on the blocking
//!   path (the release script; the successes themselves are lost, which
//!   for a closed circuit is immaterial)
//!   (`carried::a_waiting_success_survives_the_store_and_its_runtime`: both
//!   at once).
//! - **A carrying admission that fails**: after `NOSCRIPT` (or a function
//!   not found) the scripts are loaded again and the admission sent once more with what it carries
//!   (`carried::a_carried_success_survives_a_script_reload`); an admission
//!   that fails otherwise (a timeout, a lost connection, a hold after a
//!   restart) or is cancelled may or may not have run, so its successes
//!   are not sent again (a success must not count twice): their slots are
//!   given back by the release script, which is idempotent
//!   (`carried::a_cancelled_admission_carrying_a_success_frees_its_slot`).
//!   While Redis is skipped after a failure nothing is sent: as for any
//!   record that cannot be made, the slot comes back with its lease.
//! - **The same semantics as the in-memory store**: the model tests
//!   (`tests/redis/models.rs`) drive their async runs through
//!   `admit_async` / `record_async`, where successes are carried, and
//!   compare every answer and the slots in flight with the reference
//!   models.
//!
//! Outside a multi-thread runtime (blocking, or on a current-thread
//! runtime, which runs a spawned task only when its caller lets it), the
//! slot of an attempt given back without an outcome (a hedge's loser, a
//! cancelled call; not a probe) waits in the store the same way, as an
//! ignored outcome (its slot freed, nothing recorded): the next admission
//! of its partition frees it in the same script, or the timer thread after
//! the delay. The slots in flight read through the store do not count it.
//! [`success_delay`](RedisStoreBuilder::success_delay) zero sends every
//! silent success on its own at once: on a multi-thread runtime queued on
//! the connection before the call returns and not awaited (one round trip
//! of latency, two script calls per attempt), elsewhere awaited (two round
//! trips).
//!
//! # Refusals answered locally
//! A refusal whose end Redis gives, and which nothing but a manual control
//! or a restart can bring forward, costs no round trip after the first:
//! the store keeps it, per resource and partition, and refuses the
//! admissions of that partition in this process until its end, with the
//! same reason and a `retry_after` counted down on the store's clock (the
//! caller's `now` with [`TimeSource::Caller`]; otherwise a monotonic clock
//! of the process, from the instant the admission that brought the refusal
//! was sent, so that the entry ends no later than the state on the server
//! does). The rules of when a call is refused stay in the scripts: the
//! store only replays an answer Redis gave, until the instant Redis gave as
//! its end. Three refusals are kept:
//! - **a circuit open until T** (`circuit_open` with a `retry_after`):
//!   until T the circuit admits no call, in any process; at T the first
//!   admission goes to Redis, which starts the half-open round. A circuit
//!   that is half-open with every probe taken, isolated, or open without
//!   end is not kept (those end at any time, or only by a control);
//! - **a cooldown active until T**: its end only ever moves later;
//! - **a rate limit exhausted until T**, for a limiter whose calls never
//!   wait (`max_wait` zero): without reservations its state only moves
//!   towards refusing longer. A limiter whose calls may wait is always
//!   asked (a call may reserve a permit, and a reservation given back
//!   frees one sooner), and a call that presents a due reservation always
//!   goes to Redis.
//!
//! Nothing is kept for a resource whose circuit runs in shadow mode: an
//! admission may move such a circuit (half-open it, start a new round of
//! probes) while the cooldown or the rate limit refuses the call.
//!
//! An entry answers only calls of the weight that was refused (a lighter
//! call may fit the rate limit). It ends at T; before T it goes when this
//! store sees an answer from Redis to a later admission of the partition
//! that is not such a refusal, when a record made through this store may
//! have moved the circuit or the cooldown (a failure, a probe, a slow
//! call, a retry-after hint), when a control of the circuit is made
//! through this store (then answers to admissions sent before the
//! control are not kept either), and when Redis fails or is seen to have
//! restarted. While Redis is skipped after a failure nothing is replayed:
//! the [`FailMode`] answers. At most
//! [`local_refusals`](RedisStoreBuilder::local_refusals) partitions per
//! resource are kept (4096 by default; 0 turns the replay off); past that,
//! expired entries go first, then any.
//!
//! What holds, exactly:
//! - **No call is admitted locally.** An entry only refuses.
//! - **Another process's trip is seen at the next admission**: a process
//!   with no entry for the partition asks Redis, which refuses.
//!   Meanwhile a process that replays an earlier refusal (a rate limit
//!   until T, a cooldown until T) refuses all the same, under the older
//!   reason, until T; it reports the trip from T on.
//! - **Until T nobody can be admitted** on Redis either, except through:
//!   - a manual control made by another process (or another pipeline
//!     bound to the same resource): `reset`, `disable`, `enable`, or
//!     `open_for` with an end earlier than T. This process sees it at T
//!     at the latest; an `isolate` or a longer `open_for` refuses anyway.
//!     Where a manual control must be seen by every process at its next
//!     admission, turn the replay off (`local_refusals(0)`);
//!   - a restart of the server that this process has not yet noticed (an
//!     open circuit and a cooldown are lost in a restart, see [When
//!     Redis restarts empty](#when-redis-restarts-empty)): the refusal is
//!     replayed until T. A restart noticed, or an outage, ends every
//!     entry of the store.
//! - **A refusal for another reason made since by another process** (a
//!   full bulkhead, a longer cooldown, a later next permit) is reported
//!   once the entry ends; the call is refused meanwhile, with the
//!   `retry_after` of the entry, which may be shorter than Redis's new
//!   one.
//! - On the server's clock, the entry ends up to one network latency
//!   before the state does: the next admission then asks Redis, which
//!   refuses once more, with the rest of the wait.
//!
//! A refusal replayed costs a read lock and a hash lookup (none at all
//! when the resource has no entry): see the `redis_bench` example for
//! figures.
//!
//! # Leased mode
//! Exact mode (the default) costs one round trip per admission: every
//! process asks Redis, and Redis decides, atomically. For a rate limit or
//! a bulkhead shared by many processes at rates where that is too much, a
//! resource can be admitted in **leased mode** instead
//! ([`RedisStoreBuilder::leased`] with a [`Leasing`]): each process leases
//! a batch of permits (or slots) from Redis, admits from it locally, gives
//! back what it does not use, and leases again in the background before
//! the batch runs out.
//!
//! ```no_run
//! use std::time::Duration;
//! use seawall::{Pipeline, RateLimiter};
//! use seawall_redis::{Leasing, RedisStore};
//!
//! let store = RedisStore::builder("redis://127.0.0.1:6379")
//!     .leased("search-api", Leasing::batch(1000).ttl(Duration::from_secs(1)))
//!     .build()?;
//! let search = Pipeline::builder("search-api")
//!     .rate_limiter(RateLimiter::gcra(150_000, Duration::from_secs(1)).burst(5000))
//!     .store(store)
//!     .build()?;
//! # let _ = search;
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! ```
//!
//! For a rate limit:
//! - **A lease is a weighted admission.** Each process leases a batch of
//!   `b` permits at a time: the admission script's own rule admits a call
//!   of weight `b` (`lua/lease.lua` runs `admit.lua` unchanged, then reads
//!   the instant to give the batch back with). The rule is not written
//!   again.
//! - **Admitted locally.** The batch is an atomic counter in the process
//!   and the instant it expires (`ttl` after the lease was sent, on the
//!   store's clock): a call of weight `w` takes `w` permits with a
//!   compare-and-swap, without a lock, an allocation or a round trip.
//!   Calls of a partition, calls that move a shared retry budget and calls
//!   heavier than a batch are admitted exactly.
//! - **Renewed before it runs out.** The admission that leaves at most the
//!   low-water mark (half the batch by default) starts the next lease in
//!   the background: a spawned task inside a multi-thread tokio runtime,
//!   the resource's renewal thread otherwise (started at the first renewal of a blocking
//!   caller, parked while idle, ended with the resource; one lease at a
//!   time; the batch it brings is added to what is left). A call that
//!   finds the batch empty waits for the lease under way (at most connect
//!   timeout + timeout), or leases for itself when none is.
//! - **Refused by Redis.** When Redis refuses a lease (the limit is
//!   exhausted for a batch), the call is refused with the rate limiter's
//!   reason and Redis's `retry_after` (when a batch is free again), and the
//!   calls of this process are refused locally, the wait counted down,
//!   until then. A lighter call that the limiter could still admit is
//!   refused meanwhile: the limit's unit of sharing is the batch.
//! - **Unused permits are given back** when the batch expires (at the
//!   first admission after its TTL) and when the resource is dropped, at
//!   most one batch, by the release script's give-back of a reservation
//!   (`rgive`): for GCRA, the TAT moves back by the unused permits if it
//!   is still the one the last lease left (no other process leased or was
//!   admitted since; otherwise nothing is given back: permits are lost,
//!   never created); for a fixed window, the window's count goes down by
//!   them if it is still the window of the last lease. Moving a TAT back
//!   that others have moved since could erase their permits, so it is not
//!   done.
//! - **A dead process's batch is not given back**: it is spent, as if its
//!   calls were admitted, and comes back as the limiter refills (GCRA:
//!   within `b` emission intervals of the lease; fixed window: at the next
//!   window) (`cross_process::a_killed_process_s_batch_comes_back_as_the_limit_refills`).
//!   The TTL bounds how long a live process may spend a permit after its
//!   lease: a process paused (SIGSTOP, a long pause) gives its batch back
//!   when it wakes instead of spending permits of the past.
//! - **Redis failing**: the batch in hand is still admitted from; once it
//!   is spent, the [`FailMode`] answers as in exact mode (fail-open:
//!   process-local state, degraded; fail-closed: `Error::Store`)
//!   (`leased::a_stopped_redis_follows_the_fail_mode_once_the_batch_is_spent`).
//!   A lease is an admission: after a restart of the server it waits as
//!   admissions do, while the batch in hand (granted before the restart,
//!   within the bound below) is spent
//!   (`restart::a_restarted_empty_redis_lets_a_leased_rate_limit_spend_its_batch_and_no_second_quota`).
//!
//! **The overshoot bound.** Let `N` processes lease batches of `b` with a
//! low-water mark `l` from a limiter whose exact mode admits fewer than
//! `E(W)` calls in any span of length `W` (GCRA with emission interval
//! `I` and burst `B`: `E(W) = B + W / I`; a fixed window of `limit`: `limit`
//! per window). Then in any span of length `W` (any window), leased mode
//! admits fewer than `E(W) + N × (b + l)` calls. Why: a call admitted in
//! the span takes a permit that Redis granted either before the span, and
//! then the permit was held by its process at the span's start (a process
//! holds at most `b + l`: a lease starts at `l` or below, one at a time,
//! and adds `b`), or within the span, and Redis grants, net of what is
//! given back, fewer than `E(W)` in it (the lease is an admission by the
//! exact rule; a permit given back is never admitted). Permits given back
//! only lower the count. `cross_process::four_leasing_processes_stay_within_the_stated_overshoot`
//! runs four processes (two sync, two async) on a GCRA of 2000 per second,
//! burst 100, batches of 50 renewed at 25: each leases a batch, all wait
//! while the burst refills, then call as fast as they can; it checks fewer
//! than `2100 + 4 × (50 + 25 + 1)` admissions in every span of one second
//! (the `+ 1`: the call under way between its admission and the instant
//! it is counted). Measured: 2148 to 2151 in the densest second (an
//! overshoot of 49 to 52 over the exact bound's 2099, of the 304 allowed).
//!
//! The `leased_bench` example (four processes of one thread each, sync
//! calls, one shared GCRA limit, 3 s; on a shared 2-core machine under
//! other load, so the figures are indicative) measured: with a limit of
//! 150,000/s (burst 5000, batches of 1000): 151,000 admissions/s in all
//! (the limit), 0.005 script calls per admission, the densest second
//! 154,155 admissions, under the exact bound (155,000; the stated bound
//! allows 6004 more); with 1,000,000/s (burst 20,000, batches of 5000):
//! 1,003,333/s, the densest second 1,015,470 (exact bound 1,020,000);
//! with a limit that never binds (batches of 20,000): 3.5 million
//! admissions/s. Exact mode on the 150,000/s limit: about 20,000/s. One
//! admission from the batch, on the store's state directly: 40 to 50 ns;
//! it allocates nothing, on the blocking path or the async one
//! (`tests/lease_alloc.rs`).
//!
//! The bound is also the price: the more permits a process holds, the
//! fewer round trips, and the larger the overshoot. A batch of about
//! 10 ms of a process's share of the rate (with the low-water mark at
//! half) keeps renewals in the background while a round trip is under a
//! few milliseconds.
//!
//! For a bulkhead:
//! - **A pool of slots.** A process leases a batch of `b` slots in one
//!   script call (`lua/lease.lua`: each slot an admission by `admit.lua`'s
//!   rule, taken one after the other until the batch is full or the
//!   bulkhead refuses), keeps them in a pool, and admits from it locally
//!   (an atomic counter of free slots); a call's slot goes back to the
//!   pool when it ends, without a round trip. The admission that leaves
//!   at most the low-water mark free leases the next batch in the
//!   background (the resource's keeper thread); a call that finds the pool
//!   empty waits for the lease under way or leases for itself; when no
//!   slot is free on Redis, the call is refused with `bulkhead_full`.
//! - **Kept alive while held.** Every TTL / 2 the keeper extends the
//!   leases of the pool's slots to the bulkhead's lease from then
//!   (`lua/extend.lua`; a slot whose lease has already ended is counted
//!   free by the others and leaves the pool), and gives back idle slots
//!   beyond one batch (the release script's); dropping the resource gives
//!   back the idle ones. The pool is admitted from only until TTL after
//!   its last lease or extension: keep TTL plus the attempt timeout within
//!   the bulkhead's lease (a TTL not below the lease is refused).
//! - **No over-concurrency.** A call admitted locally runs on a slot its
//!   process holds on Redis, whose lease then lasts at least the
//!   bulkhead's lease minus the TTL more: every other process counts it
//!   (`leased::leased_bulkhead_slots_never_exceed_the_capacity`,
//!   `leased::leased_bulkhead_slots_outlive_the_lease_while_held`; four
//!   processes of two callers each on a bulkhead of 6, batches of 2:
//!   `cross_process::four_processes_on_a_leased_bulkhead_never_exceed_its_capacity`).
//!   The price is the other way: a process's idle slots (up to a batch,
//!   plus the low-water mark) are not free to the others, so fewer calls
//!   may run at once than the capacity (at most 4 of 6 at once in that
//!   test).
//! - **A dead process's slots** (in use and idle) come back when their
//!   leases end, at most the bulkhead's lease after the keeper last
//!   extended them
//!   (`cross_process::a_killed_process_s_leased_slots_come_back_with_their_lease`).
//! - **Redis failing**: the pool's free slots are admitted from; once none
//!   is free, the [`FailMode`] answers
//!   (`leased::a_stopped_redis_leaves_the_pool_then_follows_the_fail_mode`).
//!   A pool whose TTL passed without an extension is not admitted from,
//!   nor grown: calls are admitted exactly (or by the fail mode) until the
//!   keeper extends it again, and the slots whose leases ended leave it.
//!   After a restart of the server the keeper's next extension finds the
//!   pool's slots gone and drops them (a slot in use is paid back when its
//!   call ends); more slots are leased only once the restart is one
//!   bulkhead lease old, as admissions wait, so no call in use at the
//!   restart runs beside more than the capacity
//!   (`restart::a_restarted_empty_redis_never_puts_a_leased_bulkhead_over_capacity`).
//!
//! **Scope.** A resource in leased mode has either a GCRA or fixed-window
//! rate limiter whose calls never wait (`max_wait` zero, not in shadow
//! mode), or a bulkhead (not in shadow mode), and no circuit breaker,
//! cooldown or shared retry budget: those are asked on every call, one
//! round trip each, which leasing would not save. Anything else, a batch
//! larger than the limiter's burst (GCRA), its limit (fixed window) or the
//! bulkhead's `max_concurrent`, and a TTL not below the bulkhead's lease,
//! are refused when the pipeline is built (a `ConfigError` of the store's
//! bind naming `leased.resource`, `leased.batch` or `leased.ttl` and the
//! rule); a batch of 0, a TTL of 0 or a low-water mark not below the batch
//! by [`RedisStoreBuilder::build`] ([`RedisStoreError::InvalidConfig`]).
//! Calls of a partition are admitted exactly.
//!
//! # When Redis fails
//! Every command has a timeout ([`RedisStoreBuilder::timeout`]; connecting
//! has [`RedisStoreBuilder::connect_timeout`]), on the async path and the
//! blocking one. After a connection failure or a timeout, Redis is
//! skipped, and a background thread reconnects every
//! [`reconnect_interval`](RedisStoreBuilder::reconnect_interval): an outage
//! costs the timeout once, not on every call. Meanwhile:
//! - [`FailMode::Open`] (default): calls are admitted on process-local
//!   state (a [`seawall::MemoryStore`] resource with the same policies;
//!   such permits carry `Permit::local` and are recorded locally), and the
//!   pipeline emits `StoreUnavailable { degraded: true }`. Limits then hold
//!   per process.
//! - [`FailMode::Closed`]: calls fail with `Error::Store` and the operation
//!   is not called; a call whose weight the rate limiter can never grant is
//!   still refused as such (`rate_limited`, no `retry_after`,
//!   `outage::a_weight_over_the_burst_is_refused_as_such_while_redis_is_gone`).
//!
//! An outcome that cannot be recorded is lost (fail-open) or reported as
//! an error event (fail-closed); its slot comes back with its lease. An
//! admission that timed out may still have been executed by a slow server:
//! its slot, too, comes back with its lease. A
//! wrong password or a user without the `@scripting` commands is a
//! [`StoreError::Refused`](seawall::StoreError::Refused), reported when the
//! pipeline is built; an unreachable server at that time is not an error.
//!
//! # When Redis restarts empty
//! A server restarted without persistence (or failed over to a fresh one)
//! has forgotten the windows and the bulkhead leases: left alone, a second
//! full quota would pass in the window of the restart and slots still in
//! use would be given out again. So the store identifies the server (its
//! `run_id` and its replication history, `master_replid` and
//! `master_replid2`, in `INFO`) on every new connection, before anything
//! is sent on it, and again when the scripts are missing (`NOSCRIPT`, or
//! a function not found). A
//! server whose data is not the one seen before is a restart: another
//! process (`run_id`) that does not continue the history seen before. A
//! replica promoted since continues it (its `master_replid2` is the old
//! master's `master_replid`): it has the data, and is not a restart. A
//! server that lost the scripts is a restart when its identity cannot be
//! read (a user without `INFO`); one that lost its scripts but kept its
//! identity had them flushed, and its state is intact. On a cluster this
//! is judged per slot, for the master that serves it (see [Redis
//! Cluster](#redis-cluster)). After a restart, the admissions of a
//! resource wait until
//! what was lost can no longer matter: until the restarted server is as
//! old as the resource's longest rate window (for GCRA, its burst) or
//! bulkhead lease (its uptime, which Redis counts in whole seconds, taken
//! a second short so that it is never more than the time it has run: up
//! to two seconds longer), or, on the caller's clock ([`TimeSource::Caller`]), for that
//! long from the first admission that saw the restart. Meanwhile
//! [`FailMode::Closed`] refuses with `Error::Store` and [`FailMode::Open`]
//! answers locally, as in an outage. Since the default lease is 60 s, a
//! bulkhead waits that long: a shorter lease shortens the wait.
//!
//! What a restart still loses:
//! - circuit state and cooldowns are not waited for: an open circuit is
//!   closed again, a cooldown ends early;
//! - a process that first connects after the restart has no identity to
//!   compare with: it admits at once (its admissions are counted, those
//!   lost before the restart are not);
//! - a failover to a replica of the server is not waited for: what the old
//!   master wrote and had not yet replicated is lost (replication is
//!   asynchronous);
//! - with a user without `INFO`, only the first process to find the
//!   scripts missing sees the restart (it reloads them for all);
//! - a server restarted with its data (RDB, AOF) is waited for all the
//!   same.
//!
//! Re-registering the slots each process still holds would shorten a
//! bulkhead's wait, but only the lease bounds when every process has done
//! so: the wait is the lease.
//!
//! # Redis Cluster
//! [`RedisStore::cluster`] takes some or all of a cluster's nodes; the
//! others are found through them. Every resource's keys (and each
//! partition's) share one hash tag, so each script runs on the master of
//! one slot, atomically, as on a single server: no script ever touches two
//! slots (the cluster would refuse it with `CROSSSLOT`). The cluster
//! connections of the `redis` client route each call to the master of its
//! slot and follow `MOVED` and `ASK`; the blocking path has a pool of
//! blocking cluster connections, the async path one cluster connection per
//! runtime, as on a single server.
//!
//! - **The node list** is checked at `build()` (one URL per node, each
//!   with the same user, password and protocol, database 0, no unix
//!   socket: [`RedisStoreError::InvalidUrl`] naming the node) and when a
//!   pipeline first binds the store, on connections of its own: each node
//!   that answers must be a cluster node, of the same cluster as the first
//!   one, a master that serves slots or a replica
//!   ([`StoreError::Refused`](seawall::StoreError::Refused) naming the
//!   node). A listed replica is a node like any other: after a failover
//!   the old master is one.
//! - **Leased mode** runs on a cluster as on a single server: the lease,
//!   extension, give-back and release scripts of a resource run on the
//!   master of its slot, the background renewal and the bulkhead's keeper
//!   on the store's cluster connections
//!   (`cluster::leased_mode_runs_on_the_master_of_the_resource_s_slot`);
//!   through a failover, see the leased table under [Stated
//!   guarantees](#stated-guarantees).
//! - **A cluster that cannot serve every slot** (`cluster_state:fail`) is
//!   an outage naming the node that reports it: the store follows its
//!   [`FailMode`], reconnects in the background and checks the state of
//!   every master before it is used again.
//! - **Outages are the store's, not a slot's**: a master that fails or
//!   hangs makes the store skip Redis for all its resources until every
//!   master answers again (with the default `cluster-require-full-coverage`
//!   the cluster refuses every slot meanwhile anyway).
//! - **A failover** (a master killed, its replica promoted): calls on its
//!   slots fail with the connection, and the store follows its
//!   [`FailMode`] until the promoted replica answers; it is then used
//!   without a restart of the process. The promoted replica continues the
//!   old master's data, so admissions are not held as after a restart;
//!   what the old master had not yet replicated is lost.
//! - **A master restarted empty** before its replica took over has lost
//!   its slots' windows and leases: admissions on those slots (and only
//!   those) wait as after a single server's restart.
//! - **While a slot migrates** (resharding), a master serves a command on
//!   several keys only when all of them exist, and a resource never has
//!   all six: calls on the resources of that slot get `TRYAGAIN` and
//!   follow the [`FailMode`] (fail-open answers locally, fail-closed with
//!   `Error::Store`), without marking Redis as down for the others; once
//!   the slot has moved, `MOVED` is followed and the state moved with its
//!   keys.
//! - **Timeouts**: the client tries a command once more after a
//!   redirection or a failed connection, so a blocking call takes at most
//!   2 × (C + T) on a cluster (C + T on a single server); an async call
//!   stays within C + T.
//! - The user needs, besides the scripting commands, `INFO`, `PING` and
//!   `CLUSTER SLOTS`, `CLUSTER INFO`, `CLUSTER NODES`, `CLUSTER MYID`.
//!
//! # Stated guarantees
//! Exact mode (one admission = one atomic script on one server), with
//! `timeout` T and `connect_timeout` C. Every cell names the tests (in
//! `tests/redis/`) that back it; nothing else is claimed.
//!
//! | Redis is… | fail-closed | fail-open |
//! |---|---|---|
//! | **slow** (answers after T) | over-admission: none; a late admission is counted once and never handed out (`outage::a_slow_redis_costs_the_timeout_and_admits_nothing_over_the_limits`) | the caller is admitted locally, reported degraded; the late admission is counted once on Redis (same test) |
//! | | over-concurrency: none; the late admission's slot stays taken until its lease (same test) | same |
//! | | stall: one call, at most C + T (same test) | same |
//! | **stopped** (SIGSTOP) | over-admission and over-concurrency: none; every call is `Error::Store`, the operation is not called (`outage::a_paused_redis_costs_the_timeout_once_then_is_skipped`) | every call is admitted on process-local state and reports `StoreUnavailable { degraded: true }` (same test) |
//! | | stall: the first call at most C + T, later calls skip Redis while it is reconnected to (same test) | same |
//! | | recovery: through Redis again after SIGCONT, once the background reconnection succeeds (same test; within 5 s with `reconnect_interval` 100 ms) | same |
//! | **killed** | over-admission and over-concurrency: none; `Error::Store`, the operation never called (`outage::killed_and_restarted_redis_under_fail_closed`) | admitted on process-local state, each call degraded (`outage::killed_and_restarted_redis_under_fail_open`); at most one local quota per process and window (`restart::a_restarted_empty_redis_under_fail_open_admits_at_most_one_local_quota`) |
//! | | stall: every call at most C + T (same tests) | same |
//! | **killed and restarted empty** | over-admission: none in the window of the restart (`restart::a_restarted_empty_redis_does_not_admit_a_second_quota_in_the_window`, `restart::a_restarted_empty_redis_does_not_admit_a_second_quota_async`, `restart::on_the_server_clock_the_window_of_the_restart_admits_no_second_quota`, `restart::a_restart_is_seen_through_noscript_by_a_user_without_info`); also for two stores with connections of their own, as two processes have (`restart::two_stores_each_see_the_restart`) | at most one local quota per process in that window, on top of what Redis admitted before the restart (`restart::a_restarted_empty_redis_under_fail_open_admits_at_most_one_local_quota`) |
//! | | over-concurrency: none; slots in use at the restart are waited for (`restart::a_restarted_empty_redis_never_puts_the_bulkhead_over_capacity`) | slots in use on Redis plus the local bulkhead: at most twice the capacity per process (same test) |
//! | | recovery: admissions through Redis resume one window (or lease) after the server started; on the caller's clock exactly one window after the first admission that saw the restart (`restart::a_restarted_empty_redis_holds_for_exactly_one_window_on_the_store_clock`, `outage::killed_and_restarted_redis_under_fail_closed`) | back on shared state likewise (`outage::killed_and_restarted_redis_under_fail_open`) |
//!
//! Leased mode ([Leased mode](#leased-mode)), with the same `timeout` T and
//! `connect_timeout` C, in either fail mode; `N` processes with batches of
//! `b` and low-water mark `l`:
//!
//! | Redis is… | leased rate limit | leased bulkhead |
//! |---|---|---|
//! | **answering** | over-admission: fewer than `N × (b + l)` over the exact bound in any span (`cross_process::four_leasing_processes_stay_within_the_stated_overshoot`; the `leased_bench` figures above); at one instant on the caller's clock, exactly the limit, one script call per batch (`leased::leased_admissions_take_the_limit_exactly_in_one_call_per_batch`); renewal in the background at the low-water mark, about one script call per batch (`leased::renewal_runs_in_the_background_before_the_batch_runs_out`) | over-concurrency: none (`cross_process::four_processes_on_a_leased_bulkhead_never_exceed_its_capacity`, `leased::leased_bulkhead_slots_never_exceed_the_capacity`); slots held past the bulkhead's lease while in a pool (`leased::leased_bulkhead_slots_outlive_the_lease_while_held`) |
//! | **slow** (answers after T) | over-admission: none beyond the bound; the batch in hand is admitted from without waiting; the renewal under way times out, and a late one the server runs is counted there and never admitted (under-admission of at most one batch); once the batch is spent, the fail mode answers (`leased::a_slow_redis_admits_from_the_batch_and_nothing_over_the_limit`) | over-concurrency: none; the pool's free slots are admitted from without waiting; the growth under way times out, and a late one the server runs holds its slots on Redis for no process until their lease ends (under-admission of at most one batch, for one lease); once the pool is spent, the fail mode answers (`leased::a_slow_redis_admits_from_the_pool_and_nothing_over_the_capacity`) |
//! | **stopped** (SIGSTOP) | over-admission: none beyond the bound; the batch in hand is admitted from, without a round trip; once it is spent, fail-closed: `Error::Store`, fail-open: process-local state, degraded (`leased::a_stopped_redis_follows_the_fail_mode_once_the_batch_is_spent`) | the pool's free slots are admitted from; then the fail mode answers; the pool's slots stay held on Redis (`leased::a_stopped_redis_leaves_the_pool_then_follows_the_fail_mode`) |
//! | | stall: none while the batch lasts; the call that finds it spent waits for the lease under way, then asks once (at most 2 × (C + T), by construction, not timed in the test); later calls skip Redis while it is reconnected to | the same, by construction |
//! | | recovery: leases again after SIGCONT, once the background reconnection succeeds (same test; within 5 s with `reconnect_interval` 100 ms) | back on Redis after SIGCONT (same test) |
//! | **a process is killed** | its batch is not given back: its permits come back as the limiter refills (`cross_process::a_killed_process_s_batch_comes_back_as_the_limit_refills`) | its slots come back when their leases end (`cross_process::a_killed_process_s_leased_slots_come_back_with_their_lease`) |
//! | **killed and restarted empty** | over-admission: the batch in hand at the restart (at most `b + l` per process, granted before it) is spent; the next lease waits as an exact admission does (fail-closed: `Error::Store` naming the restart; fail-open: process-local state, at most one local quota per process), so no second quota passes in the window of the restart (`restart::a_restarted_empty_redis_lets_a_leased_rate_limit_spend_its_batch_and_no_second_quota`, sync and async; fail-open: `restart::a_restarted_empty_redis_under_fail_open_admits_the_leased_batch_and_one_local_quota`) | over-concurrency: none; the keeper's next extension finds the pool's slots gone and drops them (those in use are paid back as their calls end), and no slot is leased until the restart is one bulkhead lease old, so the calls in use at the restart are waited for; fail-open: slots in use plus the local bulkhead, at most twice the capacity per process (`restart::a_restarted_empty_redis_never_puts_a_leased_bulkhead_over_capacity`) |
//! | | recovery: leases again once the window of the restart has passed (on the caller's clock, one window after the first lease that saw the restart), one quota then, exactly (same tests) | exactly the capacity again one bulkhead lease after the restart (same test) |
//! | **failed over** (Redis Cluster: the master of the resource's slot killed, its replica promoted; node timeout 2 s, T = 250 ms; three stores with connections of their own, as three processes) | the batch in hand is spent (at most `b + l` per process; 6 to 15 of `b + l` = 15 in the runs measured), then the fail mode answers; leases resume on the promoted replica without a restart of the process and without a hold (no call is held as after a restart); over-admission: within the stated bound outside the failover (0 to 24 over the limit in a window, of the 45 allowed), within it plus what the old master had not replicated during it (0 to 27 over in the runs measured) (`failover::leased_mode_spends_the_batch_follows_the_fail_mode_then_leases_on_the_promoted_replica`) | the pool's free slots are admitted from until TTL after their last extension, then the fail mode answers; the keeper extends the pool on the promoted replica (slots the old master had not replicated leave it) and leasing resumes; over-concurrency: none measured (at most the capacity in use through Redis; what the old master had not replicated could add to it) (same test) |
//! | | recovery: every store answers through Redis again 3.4 to 4.3 s after the kill, as soon as the promoted replica serves the slot; until every node reports the cluster ok, a store's new connection may still find one reporting `cluster_state:fail` and follow the fail mode once more; after that, nothing falls back (same test) | same |
//!
//! On a Redis Cluster (three masters with one replica each, node timeout
//! 2 s, `timeout` T = 250 ms, `reconnect_interval` 100 ms), with four
//! processes on one resource, two failing open and two failing closed, on
//! the sync and the async path:
//!
//! | the master of a resource's slot is… | fail-closed | fail-open |
//! |---|---|---|
//! | **killed, its replica promoted** | every call answers within C + T on the async path, 2 × (C + T) on the blocking path (plus scheduling slack): `Error::Store`, the operation not called, while the slot has no master; over-admission: what the old master had not replicated (0 in most runs, at most 3 over the windows of the failover in the runs measured, counting calls that straddle two windows in both) (`failover::a_killed_master_s_slots_follow_the_fail_mode_then_resume_on_the_promoted_replica`) | every call answers within the same bounds, admitted on process-local state (degraded): at most one local quota per process and window on top of the shared one (same test) |
//! | | recovery: through Redis again, on the promoted replica, without a restart of the process and without a hold (the replica continues the old master's data) (same test) | same |
//! | **restarted empty** (before a failover) | over-admission: none; admissions on its slots wait one window, those on other masters' slots do not (`cluster::a_master_restarted_empty_is_waited_for_on_its_slots_only`) | admissions on its slots answered on process-local state (degraded) until it is one window old, never through Redis before; then one quota through Redis (same test) |
//! | **migrating a slot** | calls on that slot's resources: `Error::Store`; Redis not marked down, other slots served; after the move `MOVED` is followed, the state moved with the keys: no over-admission; in leased mode the batch in hand is spent, then the fail mode answers, then leases go to the new master (`cluster::moved_and_ask_are_followed_while_a_slot_migrates`) | calls on that slot's resources answered on process-local state (degraded), Redis not marked down; answered by Redis again after the move (same test) |
//!
//! Not covered by a test, hence not stated: separate OS processes through
//! one restart of a single server (tested with two stores in one process),
//! a proxy between the store and Redis, a cluster whose nodes have
//! passwords (the same code path as a single server's authentication).
//!
//! # Requirements
//! Redis 6.2 or later, or Valkey, a single server or a Redis Cluster. The
//! user needs the `@scripting` commands (`EVALSHA`, `SCRIPT LOAD`; where
//! allowed, `FUNCTION LOAD` and `FCALL`) and the store's keys. The store
//! connects over plain TCP
//! (`redis://[user:password@]host[:port][/db]`, `valkey://…`) or a unix
//! socket (`redis+unix://`, `valkey+unix://`, `unix://`). **TLS is not
//! supported** by this build: a `rediss://` or `valkeys://` URL is refused
//! by [`RedisStoreBuilder::build`] ([`RedisStoreError::InvalidUrl`]); reach
//! a TLS-only server through a local TLS proxy (stunnel, a sidecar).
//! The server's script cache holds the
//! store's eight scripts, of about 12 KiB, and, where the scripts run by
//! `EVALSHA` (a server before Redis 7, a user without functions), two
//! admission scripts of about 15 KiB per distinct spec (resource
//! configuration) bound, which the server compiles when a pipeline of
//! that spec first binds (about 1 ms each). On Redis 7 and later the
//! server also keeps the store's library (about 36 KiB), which holds every
//! script as a function (the admission for every spec: as a function, the
//! spec is an argument, so binding a pipeline compiles nothing on the
//! server and nothing per spec in the process), named `seawall_` and the
//! SHA-1 of its text, its functions after it. The server compiles it once, when
//! the first process loads it (about 1.4 ms); a store that finds it there
//! loads nothing (the server answers that it exists, counted once per
//! store in its error statistics). Unlike the script cache, a library is
//! data: saved and replicated with the keys, and kept after a restart from
//! disk. A version of the store whose scripts changed loads a library of
//! another name beside it (processes of both versions run side by side);
//! the old one stays, called by nothing once no process of that version
//! runs, until `FUNCTION DELETE` removes it. The
//! async path (`Pipeline::run`) needs a tokio runtime with timers enabled;
//! the blocking path (`Pipeline::call`) needs no runtime.
//!
//! # Features
//! - `tracing`: outages and recoveries are logged as `tracing` events
//!   (target `seawall_redis`).
//!
//! Cluster support is always built: the `redis` client's `cluster` and
//! `cluster-async` features add one small crate (`crc16`) to the
//! dependencies.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cluster;
mod config;
mod error;
mod lease;
mod link;
mod refusals;
mod script_text;
mod scripts;
mod slots;
mod store;

pub use config::{FailMode, RedisStoreBuilder, TimeSource};
pub use error::RedisStoreError;
pub use lease::Leasing;
pub use store::RedisStore;
