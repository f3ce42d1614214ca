//! The adaptive limit's rules, as pure functions: the limit after one
//! sample (`update(spec, state, sample) -> state'`), the limit a call is
//! admitted against, a partition's share of it. No atomics, no clock, no
//! random source of their own: the cell ([`machine`](super::machine))
//! reads the time and draws the jitter and hands them in with the sample.
//!
//! Samples are gathered in **update windows**, as Netflix's windowed limit
//! and Envoy's `concurrency_update_interval` do: a window closes with the
//! first sample that ends `update_interval` after it opened, and the
//! algorithm then runs once on the window as one sample (the mean latency,
//! the most calls in flight, a drop if any call dropped). A limit updated
//! on every sample moves by more in one round trip than the latency can
//! tell, and swings around the capacity instead of settling.
//!
//! Each algorithm is stated once here:
//!
//! - **AIMD**: a drop (an error or a timeout) or a latency above
//!   `rtt_timeout` multiplies the limit by `backoff_ratio`; a success while
//!   the limit is at least half used adds one.
//! - **Vegas**: the queue at the dependency is estimated as
//!   `limit x (1 - baseline / rtt)`; at most `log10(limit)`, the limit
//!   grows by `3 log10(limit)`, above `3 log10(limit)` it shrinks by
//!   `log10(limit)`, a drop shrinks it by `log10(limit)`; the new limit is
//!   smoothed. (Brakmo and Peterson's `alpha = 1`, `beta = 3`, scaled by
//!   `log10(limit)` as Netflix scales its `3` and `6`.)
//! - **Gradient2**: the gradient `baseline x (1 + buffer) / rtt`, clamped
//!   to `[0.5, 1]` (0.5 for a drop), scales the limit, `queue_size` is
//!   added as headroom while the gradient is 1 (the latency within the
//!   buffer), and the result is smoothed.
//!
//! Vegas and Gradient2 compare each latency with a **baseline**, the
//! latency of the dependency without load. It is measured as Envoy's
//! gradient controller does: the limit is pinned to a low concurrency
//! (`min_rtt_concurrency`, at most `max_limit`) until `min_rtt_samples`
//! calls admitted at that concurrency ended, their mean latency is the
//! baseline, and it is measured again every `min_rtt_interval` (plus a
//! random jitter, so processes do not pin at the same time). A lower
//! latency seen between measurements lowers the baseline at once
//! (Vegas). As in Envoy, a limit left at `min_limit` by
//! [`MIN_LIMIT_WINDOWS`] update windows in a row measures its baseline
//! again at once, without waiting for the interval; a window far from the
//! limit (see `far_from_limit`) does not count.

use std::time::Duration;

/// Nanoseconds.
type Nanos = u64;

/// The settings the rules read, fixed at build time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Spec {
    pub(crate) algorithm: Algorithm,
    /// The length of an update window.
    pub(crate) update_interval: Nanos,
    pub(crate) min_limit: u32,
    pub(crate) max_limit: u32,
    pub(crate) initial_limit: u32,
}

/// An algorithm and its own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Algorithm {
    Aimd {
        backoff_ratio: f64,
        rtt_timeout: Nanos,
    },
    Vegas {
        smoothing: f64,
        baseline: Measure,
    },
    Gradient2 {
        smoothing: f64,
        queue_size: u32,
        buffer: f64,
        baseline: Measure,
    },
}

/// How the baseline latency is measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Measure {
    /// The limit while measuring.
    pub(crate) concurrency: u32,
    /// Samples of calls admitted while measuring that make a baseline.
    pub(crate) samples: u32,
    /// Time between two measurements.
    pub(crate) interval: Nanos,
    /// The share of `interval` added at random to it.
    pub(crate) jitter: f64,
}

/// How a call ended, for the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// The dependency answered: its latency is a sample.
    Success,
    /// An error counted against the dependency, or a timeout: overload.
    Dropped,
    /// Says nothing of the dependency's load (an ignored error, a call
    /// dropped by its caller): no sample.
    Ignored,
}

/// One ended call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// How long it ran.
    pub(crate) rtt: Nanos,
    /// Calls in flight when it was admitted, itself included.
    pub(crate) in_flight: u32,
    pub(crate) signal: Signal,
    /// The measurement window it was admitted in (0: none).
    pub(crate) window: u32,
    /// When it ended.
    pub(crate) now: Nanos,
    /// A random number in `[0, 1)`, for the jitter of the next
    /// measurement (read only while the baseline is measured: see
    /// [`draws`]).
    pub(crate) draw: f64,
}

/// The state of the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct State {
    /// The estimated limit (fractional: the smoothed algorithms move it
    /// by less than one).
    pub(crate) limit: f64,
    pub(crate) baseline: Baseline,
    /// The number of the latest measurement window (never 0).
    pub(crate) window: u32,
    /// The samples of the update window under way.
    pub(crate) gathered: Gathered,
    /// Update windows in a row that left the limit at `min_limit`, those
    /// far from the limit skipped (Vegas and Gradient2; see
    /// [`MIN_LIMIT_WINDOWS`]).
    pub(crate) at_min: u32,
}

/// Update windows in a row at `min_limit` after which the baseline is
/// measured again at once, as Envoy's gradient controller does: a limit
/// held at its minimum by a baseline lower than the dependency's latency
/// without load (measured while it was unusually fast, or before it
/// became slower for good) would otherwise wait for `min_rtt_interval`.
pub(crate) const MIN_LIMIT_WINDOWS: u32 = 5;

/// The samples of an update window: when it opened (`None`: no sample
/// yet), the sum and count of their latencies, the most calls in flight,
/// whether one dropped.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Gathered {
    pub(crate) opened: Option<Nanos>,
    pub(crate) sum: Nanos,
    pub(crate) samples: u32,
    pub(crate) in_flight: u32,
    pub(crate) dropped: bool,
}

impl Gathered {
    /// The window with `sample` joined: opened by its first sample, the
    /// latencies summed (saturating), one more sample, the most calls in
    /// flight, a drop if any sample dropped.
    #[inline]
    pub(crate) fn join(self, sample: &Sample) -> Gathered {
        Gathered {
            opened: Some(self.opened.unwrap_or(sample.now)),
            sum: self.sum.saturating_add(sample.rtt),
            samples: self.samples + 1,
            in_flight: self.in_flight.max(sample.in_flight),
            dropped: self.dropped || sample.signal == Signal::Dropped,
        }
    }

    /// The window with the samples of `later` joined after its own, in
    /// the order they came: the same window as joining each in turn
    /// ([`join`](Self::join): each field is a sum, a maximum or an "or",
    /// the order of the joins changes none of them; the sum saturates
    /// once, where it would have). `later.opened` is not read: the window
    /// was opened before them.
    pub(crate) fn absorb(self, later: &Gathered) -> Gathered {
        Gathered {
            opened: self.opened,
            sum: self.sum.saturating_add(later.sum),
            samples: self.samples + later.samples,
            in_flight: self.in_flight.max(later.in_flight),
            dropped: self.dropped || later.dropped,
        }
    }
}

/// The time before which a sample (not [`Signal::Ignored`]) only joins
/// the update window under way: [`update`] of a sample that ends before
/// it is `gathered.join(sample)` and changes nothing else (no
/// measurement of the baseline under way or due, the window open and not
/// closing). 0 (no sample) when no window is open, or the baseline is
/// measured. A cell may join such samples without applying [`update`],
/// in any order, and [`absorb`](Gathered::absorb) them later.
pub(crate) fn joins_until(spec: &Spec, state: &State) -> Nanos {
    let Some(opened) = state.gathered.opened else {
        return 0;
    };
    if spec.update_interval == 0 {
        // Every sample closes its window.
        return 0;
    }
    // `now - opened < update_interval` for every `now` before it (a `now`
    // before `opened` counts as `opened`).
    let closes = opened.saturating_add(spec.update_interval);
    match state.baseline {
        Baseline::Unused => closes,
        Baseline::Known { next, .. } => closes.min(next),
        Baseline::Measuring { .. } => 0,
    }
}

/// The baseline latency, for the algorithms that have one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Baseline {
    /// The algorithm needs none (AIMD).
    Unused,
    /// Measuring at the pinned concurrency: the sum and count of the
    /// latencies of calls admitted in the current window.
    Measuring { sum: Nanos, samples: u32 },
    /// Known, until `next`, when it is measured again.
    Known { rtt: Nanos, next: Nanos },
}

/// The state of a new limit: the initial limit, and for Vegas and
/// Gradient2 the first measurement of the baseline under way.
pub(crate) fn initial(spec: &Spec) -> State {
    State {
        limit: f64::from(spec.initial_limit),
        baseline: match spec.algorithm {
            Algorithm::Aimd { .. } => Baseline::Unused,
            _ => Baseline::Measuring { sum: 0, samples: 0 },
        },
        window: 1,
        gathered: Gathered::default(),
        at_min: 0,
    }
}

/// The limit calls are admitted against: the pinned concurrency (never
/// above `max_limit`) while the baseline is measured, the estimated limit
/// (rounded down) otherwise.
pub(crate) fn admitted_limit(spec: &Spec, state: &State) -> u32 {
    match (state.baseline, measure(spec)) {
        (Baseline::Measuring { .. }, Some(m)) => m.concurrency.min(spec.max_limit),
        _ => whole(state.limit),
    }
}

/// The measurement window a call admitted now belongs to (0 when the
/// baseline is not being measured).
pub(crate) fn window(state: &State) -> u32 {
    match state.baseline {
        Baseline::Measuring { .. } => state.window,
        _ => 0,
    }
}

/// A limit as a whole number of calls (at least 1): rounded down.
pub(crate) fn whole(limit: f64) -> u32 {
    // `as` rounds toward zero (down, for a limit, which is never
    // negative), saturates, and maps NaN to 0.
    (limit as u32).max(1)
}

/// The calls a partition with `share` of the limit may always have in
/// flight: `ceil(limit x share)`, at least 1; 0 for calls of no partition
/// (they use only what the others leave).
pub(crate) fn share_limit(limit: u32, share: Option<f64>) -> u32 {
    match share {
        // The product is at most `u32::MAX`: `as` is exact after `ceil`.
        Some(s) => ((f64::from(limit) * s).ceil() as u32).max(1),
        None => 0,
    }
}

fn measure(spec: &Spec) -> Option<Measure> {
    match spec.algorithm {
        Algorithm::Aimd { .. } => None,
        Algorithm::Vegas { baseline, .. } | Algorithm::Gradient2 { baseline, .. } => Some(baseline),
    }
}

/// `max(1, floor(log10(n)))`, the step of Vegas.
fn log10(limit: f64) -> f64 {
    let n = whole(limit);
    f64::from(n.ilog10().max(1))
}

/// `true` when `s`, a success with fewer than half of `limit` in flight,
/// was measured too far from the limit for its latency to say anything of
/// it: Vegas and Gradient2 leave the limit as it is (Netflix's "app
/// limited"), and the window does not count towards
/// [`MIN_LIMIT_WINDOWS`]. A drop always speaks.
fn far_from_limit(limit: f64, s: &Sample) -> bool {
    s.signal != Signal::Dropped && f64::from(s.in_flight) * 2.0 < limit
}

fn clamp(spec: &Spec, limit: f64) -> f64 {
    limit.clamp(f64::from(spec.min_limit), f64::from(spec.max_limit))
}

/// The state after `sample`.
pub(crate) fn update(spec: &Spec, state: State, sample: &Sample) -> State {
    if sample.signal == Signal::Ignored {
        return state;
    }
    let mut next = state;
    // The baseline first: a measurement under way takes the samples of its
    // own window; a due one begins.
    if let Some(m) = measure(spec) {
        match state.baseline {
            Baseline::Measuring { sum, samples } => {
                if sample.window == state.window && sample.signal == Signal::Success {
                    let (sum, samples) = (sum.saturating_add(sample.rtt), samples + 1);
                    next.baseline = if samples >= m.samples {
                        Baseline::Known {
                            rtt: (sum / u64::from(samples)).max(1),
                            next: sample.now.saturating_add(jittered(m, sample.draw)),
                        }
                    } else {
                        Baseline::Measuring { sum, samples }
                    };
                }
                return next;
            }
            Baseline::Known { next: due, .. } if sample.now >= due => {
                return remeasure(next);
            }
            _ => {}
        }
    }
    // The update window: the algorithm runs once it closes, on all its
    // samples as one.
    let gathered = state.gathered.join(sample);
    let opened = gathered.opened.unwrap_or(sample.now);
    if sample.now.saturating_sub(opened) < spec.update_interval {
        next.gathered = gathered;
        return next;
    }
    next.gathered = Gathered::default();
    let sample = &Sample {
        rtt: gathered.sum / u64::from(gathered.samples),
        in_flight: gathered.in_flight,
        signal: if gathered.dropped {
            Signal::Dropped
        } else {
            Signal::Success
        },
        ..*sample
    };
    next.limit = match spec.algorithm {
        Algorithm::Aimd {
            backoff_ratio,
            rtt_timeout,
        } => {
            next.limit = aimd(spec, state.limit, sample, backoff_ratio, rtt_timeout);
            return next;
        }
        Algorithm::Vegas { smoothing, .. } => {
            let Baseline::Known {
                rtt: base,
                next: due,
            } = state.baseline
            else {
                return state;
            };
            if sample.signal == Signal::Success && sample.rtt < base {
                // A lower latency is the new baseline.
                next.baseline = Baseline::Known {
                    rtt: sample.rtt.max(1),
                    next: due,
                };
                state.limit
            } else {
                vegas(spec, state.limit, sample, base, smoothing)
            }
        }
        Algorithm::Gradient2 {
            smoothing,
            queue_size,
            buffer,
            ..
        } => {
            let Baseline::Known { rtt: base, .. } = state.baseline else {
                return state;
            };
            gradient2(
                spec,
                state.limit,
                sample,
                base,
                smoothing,
                queue_size,
                buffer,
            )
        }
    };
    // Held at the minimum: the baseline may be too low for the
    // dependency's latency now; measured again after a few windows. A
    // window far from the limit says nothing of it (the limit stays where
    // it was, at its minimum or not): it does not count.
    next.at_min = if far_from_limit(state.limit, sample) {
        state.at_min
    } else if whole(next.limit) <= spec.min_limit {
        state.at_min + 1
    } else {
        0
    };
    if next.at_min >= MIN_LIMIT_WINDOWS {
        return remeasure(next);
    }
    next
}

/// `state` with a measurement of the baseline begun: in a new measurement
/// window, the update window and the count of windows at the minimum
/// starting again after it.
fn remeasure(state: State) -> State {
    State {
        baseline: Baseline::Measuring { sum: 0, samples: 0 },
        gathered: Gathered::default(),
        window: match state.window.wrapping_add(1) {
            0 => 1,
            w => w,
        },
        at_min: 0,
        ..state
    }
}

/// The sample's `draw` is read in `state`: while the baseline is measured
/// (its end schedules the next measurement). A cell draws a number only
/// then.
pub(crate) fn draws(state: &State) -> bool {
    matches!(state.baseline, Baseline::Measuring { .. })
}

/// The time until the next measurement: the interval plus up to `jitter`
/// of it.
fn jittered(m: Measure, draw: f64) -> Nanos {
    let extra = m.interval as f64 * m.jitter * draw.clamp(0.0, 1.0);
    m.interval.saturating_add(extra as Nanos)
}

fn aimd(spec: &Spec, limit: f64, s: &Sample, backoff_ratio: f64, rtt_timeout: Nanos) -> f64 {
    let next = if s.signal == Signal::Dropped || s.rtt > rtt_timeout {
        // Rounded down: `as` rounds toward zero.
        f64::from((limit * backoff_ratio) as u32)
    } else if f64::from(s.in_flight) * 2.0 >= limit {
        limit + 1.0
    } else {
        return limit;
    };
    clamp(spec, next)
}

fn vegas(spec: &Spec, limit: f64, s: &Sample, base: Nanos, smoothing: f64) -> f64 {
    let step = log10(limit);
    let target = if s.signal == Signal::Dropped {
        limit - step
    } else if far_from_limit(limit, s) {
        return limit;
    } else {
        let queue = (limit * (1.0 - base as f64 / s.rtt.max(1) as f64)).ceil();
        // The queue is kept between `alpha` and `beta`; at or below
        // `alpha` the limit grows by `beta` at once.
        let (alpha, beta) = (step, 3.0 * step);
        if queue <= alpha {
            limit + beta
        } else if queue > beta {
            limit - step
        } else {
            return limit;
        }
    };
    let target = clamp(spec, target);
    (1.0 - smoothing) * limit + smoothing * target
}

fn gradient2(
    spec: &Spec,
    limit: f64,
    s: &Sample,
    base: Nanos,
    smoothing: f64,
    queue_size: u32,
    buffer: f64,
) -> f64 {
    let gradient = if s.signal == Signal::Dropped {
        0.5
    } else if far_from_limit(limit, s) {
        return limit;
    } else {
        (base as f64 * (1.0 + buffer) / s.rtt.max(1) as f64).clamp(0.5, 1.0)
    };
    // The headroom probes for more capacity while the dependency shows no
    // queue beyond the buffer; once it does, the gradient alone sets the
    // limit, which then settles at `(1 + buffer) x capacity` rather than
    // `queue_size` calls above it.
    let headroom = if gradient >= 1.0 {
        f64::from(queue_size)
    } else {
        0.0
    };
    let target = limit * gradient + headroom;
    clamp(spec, (1.0 - smoothing) * limit + smoothing * target)
}

/// Nanoseconds of a duration, saturating.
pub(crate) fn nanos(d: Duration) -> Nanos {
    crate::clock::duration_nanos(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn measure() -> Measure {
        Measure {
            concurrency: 3,
            samples: 4,
            interval: 1_000 * MS,
            jitter: 0.1,
        }
    }

    fn spec(algorithm: Algorithm) -> Spec {
        Spec {
            algorithm,
            update_interval: 0,
            min_limit: 10,
            max_limit: 200,
            initial_limit: 20,
        }
    }

    fn sample(rtt: Nanos, in_flight: u32, signal: Signal) -> Sample {
        Sample {
            rtt,
            in_flight,
            signal,
            window: 0,
            now: 0,
            draw: 0.5,
        }
    }

    #[test]
    fn aimd_adds_one_when_used_and_backs_off_on_drops_and_slow_calls() {
        let s = spec(Algorithm::Aimd {
            backoff_ratio: 0.9,
            rtt_timeout: 100 * MS,
        });
        let st = initial(&s);
        assert_eq!(st.baseline, Baseline::Unused);
        let up = update(&s, st, &sample(10 * MS, 10, Signal::Success));
        assert_eq!(up.limit, 21.0);
        // Less than half used: unchanged.
        assert_eq!(update(&s, st, &sample(10 * MS, 9, Signal::Success)), st);
        assert_eq!(
            update(&s, st, &sample(10 * MS, 20, Signal::Dropped)).limit,
            18.0
        );
        assert_eq!(
            update(&s, st, &sample(101 * MS, 20, Signal::Success)).limit,
            18.0
        );
        assert_eq!(update(&s, st, &sample(101 * MS, 20, Signal::Ignored)), st);
        // Never below the minimum nor above the maximum.
        let low = State { limit: 10.0, ..st };
        assert_eq!(update(&s, low, &sample(1, 1, Signal::Dropped)).limit, 10.0);
        let high = State { limit: 200.0, ..st };
        assert_eq!(
            update(&s, high, &sample(1, 200, Signal::Success)).limit,
            200.0
        );
    }

    #[test]
    fn the_baseline_is_measured_at_the_pinned_concurrency_and_again_later() {
        let s = spec(Algorithm::Gradient2 {
            smoothing: 0.2,
            queue_size: 4,
            buffer: 0.1,
            baseline: measure(),
        });
        let mut st = initial(&s);
        assert_eq!(admitted_limit(&s, &st), 3);
        assert_eq!(window(&st), 1);
        // A call admitted before the window does not count.
        st = update(&s, st, &sample(500 * MS, 20, Signal::Success));
        assert_eq!(st.baseline, Baseline::Measuring { sum: 0, samples: 0 });
        for rtt in [10, 12, 8, 10] {
            let mut x = sample(rtt * MS, 3, Signal::Success);
            x.window = 1;
            x.now = 5_000 * MS;
            st = update(&s, st, &x);
        }
        assert_eq!(
            st.baseline,
            Baseline::Known {
                rtt: 10 * MS,
                next: 6_050 * MS
            }
        );
        assert_eq!((admitted_limit(&s, &st), window(&st)), (20, 0));
        // Due: the next sample begins a new window.
        let mut late = sample(10 * MS, 20, Signal::Success);
        late.now = 6_050 * MS;
        st = update(&s, st, &late);
        assert_eq!((admitted_limit(&s, &st), window(&st)), (3, 2));
        assert_eq!(st.limit, 20.0);
    }

    #[test]
    fn the_pinned_concurrency_never_exceeds_the_max_limit() {
        for algorithm in latency_algorithms() {
            let s = Spec {
                min_limit: 1,
                initial_limit: 2,
                max_limit: 2,
                ..spec(algorithm)
            };
            let st = initial(&s);
            assert!(matches!(st.baseline, Baseline::Measuring { .. }));
            assert_eq!(admitted_limit(&s, &st), 2, "{algorithm:?}");
        }
    }

    fn known(s: &Spec, limit: f64, base: Nanos) -> State {
        State {
            limit,
            baseline: Baseline::Known {
                rtt: base,
                next: u64::MAX,
            },
            ..initial(s)
        }
    }

    #[test]
    fn gradient2_grows_by_its_headroom_within_the_buffer_and_shrinks_with_latency() {
        let s = spec(Algorithm::Gradient2 {
            smoothing: 0.2,
            queue_size: 4,
            buffer: 0.1,
            baseline: measure(),
        });
        let st = known(&s, 100.0, 10 * MS);
        // No queueing: 100 x 1 + 4, smoothed by 0.2.
        let up = update(&s, st, &sample(10 * MS, 100, Signal::Success));
        assert!((up.limit - 100.8).abs() < 1e-9, "{}", up.limit);
        // Within the buffer: the same.
        let within = update(&s, st, &sample(11 * MS, 100, Signal::Success));
        assert!((within.limit - 100.8).abs() < 1e-9, "{}", within.limit);
        // Twice the latency: gradient 0.55, no headroom.
        let down = update(&s, st, &sample(20 * MS, 100, Signal::Success));
        assert!((down.limit - (0.8 * 100.0 + 0.2 * 55.0)).abs() < 1e-9);
        // Just past the buffer: the gradient alone.
        let past = update(&s, st, &sample(12 * MS, 100, Signal::Success));
        let gradient = 11.0 / 12.0;
        assert!((past.limit - (0.8 * 100.0 + 0.2 * 100.0 * gradient)).abs() < 1e-9);
        // Clamped at 0.5, also for a drop.
        let floor = 0.8 * 100.0 + 0.2 * 50.0;
        let way_down = update(&s, st, &sample(90 * MS, 100, Signal::Success));
        assert!((way_down.limit - floor).abs() < 1e-9);
        let dropped = update(&s, st, &sample(1, 10, Signal::Dropped));
        assert!((dropped.limit - floor).abs() < 1e-9);
        // App-limited: unchanged.
        assert_eq!(update(&s, st, &sample(90 * MS, 49, Signal::Success)), st);
    }

    #[test]
    fn vegas_follows_the_estimated_queue() {
        let s = spec(Algorithm::Vegas {
            smoothing: 1.0,
            baseline: measure(),
        });
        let st = known(&s, 100.0, 10 * MS);
        // log10(100) = 2: no queue grows by beta, 6.
        assert_eq!(
            update(&s, st, &sample(10 * MS, 100, Signal::Success)).limit,
            106.0
        );
        // Queue of ceil(100 x (1 - 10/10.2)) = 2: at alpha (2), +6.
        assert_eq!(
            update(&s, st, &sample(10_200_000, 100, Signal::Success)).limit,
            106.0
        );
        // Queue of ceil(100 x (1 - 10/10.4)) = 4: between alpha and beta,
        // unchanged.
        assert_eq!(
            update(&s, st, &sample(10_400_000, 100, Signal::Success)).limit,
            100.0
        );
        // Queue 9: above beta (6), -2; queue 50 too; a drop too.
        assert_eq!(
            update(&s, st, &sample(11 * MS, 100, Signal::Success)).limit,
            98.0
        );
        assert_eq!(
            update(&s, st, &sample(20 * MS, 100, Signal::Success)).limit,
            98.0
        );
        assert_eq!(update(&s, st, &sample(1, 1, Signal::Dropped)).limit, 98.0);
        // A lower latency lowers the baseline and nothing else.
        let lower = update(&s, st, &sample(5 * MS, 100, Signal::Success));
        assert_eq!(lower.limit, 100.0);
        assert!(matches!(lower.baseline, Baseline::Known { rtt, .. } if rtt == 5 * MS));
    }

    /// Vegas and Gradient2, unsmoothed, their baselines still to measure:
    /// the algorithms that judge latency against a baseline.
    fn latency_algorithms() -> [Algorithm; 2] {
        [
            Algorithm::Gradient2 {
                smoothing: 1.0,
                queue_size: 4,
                buffer: 0.1,
                baseline: measure(),
            },
            Algorithm::Vegas {
                smoothing: 1.0,
                baseline: measure(),
            },
        ]
    }

    #[test]
    fn five_windows_in_a_row_at_the_minimum_measure_the_baseline_again() {
        for algorithm in latency_algorithms() {
            let s = spec(algorithm);
            // Latencies 4 times the baseline: the limit falls to 10 and
            // stays there.
            let slow = |now| Sample {
                now,
                ..sample(40 * MS, 20, Signal::Success)
            };
            let mut st = known(&s, 11.0, 10 * MS);
            st = update(&s, st, &slow(1));
            assert_eq!((st.limit, st.at_min), (10.0, 1), "{algorithm:?}");
            for n in 2..MIN_LIMIT_WINDOWS {
                st = update(&s, st, &slow(u64::from(n)));
                assert_eq!(st.at_min, n);
                assert!(matches!(st.baseline, Baseline::Known { .. }));
            }
            let window = st.window;
            st = update(&s, st, &slow(9));
            // The fifth: measured again, long before the interval.
            assert_eq!(st.baseline, Baseline::Measuring { sum: 0, samples: 0 });
            assert_eq!((st.window, st.at_min), (window + 1, 0));
            assert_eq!((admitted_limit(&s, &st), st.limit), (3, 10.0));
            // A window that leaves the minimum starts the count again.
            let mut st = known(&s, 10.0, 10 * MS);
            st.at_min = MIN_LIMIT_WINDOWS - 1;
            let fast = Sample {
                now: 1,
                ..sample(10 * MS, 10, Signal::Success)
            };
            st = update(&s, st, &fast);
            assert!(st.limit > 10.0);
            assert_eq!(st.at_min, 0);
        }
        // AIMD has no baseline: it never counts.
        let s = spec(Algorithm::Aimd {
            backoff_ratio: 0.5,
            rtt_timeout: MS,
        });
        let mut st = initial(&s);
        for _ in 0..10 {
            st = update(&s, st, &sample(10 * MS, 20, Signal::Dropped));
            assert_eq!((st.limit, st.at_min), (10.0, 0));
        }
    }

    #[test]
    fn windows_far_from_the_limit_do_not_count_towards_the_minimum() {
        for algorithm in latency_algorithms() {
            let s = spec(algorithm);
            // At the minimum, 10, with 4 in flight at the baseline's
            // latency: the limit stays, and so does the baseline.
            let light = |now| Sample {
                now,
                ..sample(10 * MS, 4, Signal::Success)
            };
            let mut st = known(&s, 10.0, 10 * MS);
            for n in 0..(3 * MIN_LIMIT_WINDOWS) {
                st = update(&s, st, &light(u64::from(n)));
                assert_eq!((st.limit, st.at_min), (10.0, 0), "{algorithm:?}");
                assert!(matches!(st.baseline, Baseline::Known { .. }));
            }
            // Nor do they break a run of windows held at the minimum.
            st.at_min = MIN_LIMIT_WINDOWS - 2;
            st = update(&s, st, &light(100));
            assert_eq!(st.at_min, MIN_LIMIT_WINDOWS - 2, "{algorithm:?}");
            // A drop speaks, however few are in flight.
            st = update(&s, st, &sample(10 * MS, 1, Signal::Dropped));
            assert_eq!(st.at_min, MIN_LIMIT_WINDOWS - 1, "{algorithm:?}");
        }
    }

    #[test]
    fn an_update_window_is_one_sample() {
        let s = Spec {
            update_interval: 100 * MS,
            ..spec(Algorithm::Aimd {
                backoff_ratio: 0.9,
                rtt_timeout: 100 * MS,
            })
        };
        let mut st = initial(&s);
        let at = |rtt, in_flight, signal, now| Sample {
            now,
            ..sample(rtt, in_flight, signal)
        };
        // Gathered until a sample ends 100 ms after the first: no change.
        st = update(&s, st, &at(150 * MS, 5, Signal::Success, 1_000 * MS));
        st = update(&s, st, &at(10 * MS, 12, Signal::Success, 1_050 * MS));
        assert_eq!(st.limit, 20.0);
        assert_eq!(st.gathered.samples, 2);
        // The window closes: mean 70 ms (not slow), 12 in flight at most
        // (more than half of 20): one increase, not three.
        st = update(&s, st, &at(50 * MS, 1, Signal::Success, 1_100 * MS));
        assert_eq!(st.limit, 21.0);
        assert_eq!(st.gathered, Gathered::default());
        // A drop anywhere in a window is one decrease.
        st = update(&s, st, &at(MS, 20, Signal::Dropped, 2_000 * MS));
        st = update(&s, st, &at(MS, 20, Signal::Success, 2_100 * MS));
        assert_eq!(st.limit, 18.0);
    }

    /// The three algorithms, with an update window of 0 to 30 ms and the
    /// baseline measured on 2 samples every 50 ms.
    fn any_spec(which: usize, update_ms: u64) -> Spec {
        let baseline = Measure {
            concurrency: 2,
            samples: 2,
            interval: 50 * MS,
            jitter: 0.2,
        };
        let algorithm = match which {
            0 => Algorithm::Aimd {
                backoff_ratio: 0.9,
                rtt_timeout: 20 * MS,
            },
            1 => Algorithm::Vegas {
                smoothing: 0.5,
                baseline,
            },
            _ => Algorithm::Gradient2 {
                smoothing: 0.2,
                queue_size: 4,
                buffer: 0.1,
                baseline,
            },
        };
        Spec {
            algorithm,
            update_interval: update_ms * MS,
            min_limit: 2,
            max_limit: 100,
            initial_limit: 10,
        }
    }

    proptest::proptest! {
        /// Before [`joins_until`] a sample only joins the window: `update`
        /// is `join` and nothing else; and samples joined apart, then
        /// absorbed, make the window joined in turn. On random runs of the
        /// three algorithms, clocks from 0 and 10^6 s.
        #[test]
        fn before_joins_until_a_sample_only_joins_the_window(
            which in 0usize..3,
            update_ms in 0u64..30,
            base in proptest::sample::select(vec![0, 1_000_000_000 * MS]),
            steps in proptest::collection::vec(
                (0u64..8_000, 1u64..40_000, 1u32..30, 0u8..10),
                1..200,
            ),
        ) {
            let spec = any_spec(which, update_ms);
            let mut state = initial(&spec);
            let mut now = base;
            let mut last = Sample {
                rtt: 0,
                in_flight: 0,
                signal: Signal::Success,
                window: 0,
                now: base,
                draw: 0.0,
            };
            for (step_us, rtt_us, in_flight, kind) in steps {
                now += step_us * 1_000;
                let sample = Sample {
                    rtt: rtt_us * 1_000,
                    in_flight,
                    signal: match kind {
                        0 => Signal::Dropped,
                        1 => Signal::Ignored,
                        _ => Signal::Success,
                    },
                    window: if kind == 2 { 0 } else { state.window },
                    now,
                    draw: f64::from(in_flight) / 30.0,
                };
                let next = update(&spec, state, &sample);
                if sample.signal != Signal::Ignored && now < joins_until(&spec, &state) {
                    let joined = State { gathered: state.gathered.join(&sample), ..state };
                    proptest::prop_assert_eq!(next, joined);
                    // Joined apart (in a window of their own, `last` too),
                    // then absorbed: the window joined in turn.
                    let apart = Gathered::default().join(&last).join(&sample);
                    proptest::prop_assert_eq!(
                        state.gathered.absorb(&apart),
                        state.gathered.join(&last).join(&sample)
                    );
                }
                last = sample;
                state = next;
            }
        }
    }

    #[test]
    fn an_absorbed_window_saturates_where_joins_would() {
        let near = Gathered {
            opened: Some(1),
            sum: u64::MAX - 5,
            samples: 1,
            in_flight: 3,
            dropped: false,
        };
        let (a, b) = (sample(4, 7, Signal::Dropped), sample(9, 2, Signal::Success));
        let apart = Gathered::default().join(&a).join(&b);
        assert_eq!(near.absorb(&apart), near.join(&a).join(&b));
        assert_eq!(
            near.absorb(&apart),
            Gathered {
                opened: Some(1),
                sum: u64::MAX,
                samples: 3,
                in_flight: 7,
                dropped: true,
            }
        );
    }

    #[test]
    fn partition_shares_round_up() {
        assert_eq!(share_limit(100, Some(0.9)), 90);
        assert_eq!(share_limit(100, Some(0.1)), 10);
        assert_eq!(share_limit(5, Some(0.1)), 1);
        assert_eq!(share_limit(7, Some(0.5)), 4);
        assert_eq!(share_limit(100, None), 0);
        assert_eq!(whole(f64::NAN), 1);
        assert_eq!(whole(19.99), 19);
    }
}
