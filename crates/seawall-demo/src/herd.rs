//! `herd`: N clients fail at the same instant and retry with exponential
//! backoff (1 s, 2 s, 4 s). Without jitter their retries land on the service
//! all at once; jitter spreads them.
//!
//! Every client is a real seawall [`Pipeline`] on its own
//! [`VirtualClock`], so the backoff, the jitter and the timing are seawall's
//! own, and minutes of waiting take microseconds. The clients share one
//! [`SeededRandom`] per strategy, so a seed gives the same chart every time.

use std::fmt::Write as _;
use std::time::Duration;

use seawall::testing::{SeededRandom, VirtualClock};
use seawall::{Jitter, Pipeline, Retry};

use crate::chart;
use crate::cli::HerdOptions;
use crate::{say, Failure};

/// Clients of the comparison, unless told otherwise.
pub(crate) const DEFAULT_CLIENTS: usize = 1000;

/// Seed of the jitter's random source, unless told otherwise.
pub(crate) const DEFAULT_SEED: u64 = 42;

/// The width of one bucket of the histogram.
pub(crate) const BUCKET: Duration = Duration::from_millis(100);

/// A way to randomise the backoff.
#[derive(Debug)]
pub(crate) struct Strategy {
    /// A stable key, for the machine-readable line.
    pub(crate) key: &'static str,
    /// What a person reads.
    pub(crate) label: &'static str,
    /// The jitter of the retry policy.
    pub(crate) jitter: Jitter,
    /// The colour of its series in the chart.
    pub(crate) colour: &'static str,
}

/// The three strategies compared.
pub(crate) const STRATEGIES: [Strategy; 3] = [
    Strategy {
        key: "none",
        label: "no jitter",
        jitter: Jitter::None,
        colour: "#d62728",
    },
    Strategy {
        key: "proportional_20",
        label: "\u{b1}20 % jitter",
        jitter: Jitter::Proportional(20.0),
        colour: "#1f77b4",
    },
    Strategy {
        key: "full",
        label: "full jitter",
        jitter: Jitter::Full,
        colour: "#2ca02c",
    },
];

/// The retries of one strategy, counted per [`BUCKET`] from the failure.
#[derive(Debug)]
pub(crate) struct Series {
    /// The strategy.
    pub(crate) strategy: &'static Strategy,
    /// Retries that arrived in each bucket.
    pub(crate) buckets: Vec<u32>,
}

impl Series {
    /// The largest bucket and when it starts.
    pub(crate) fn peak(&self) -> (u32, Duration) {
        let (i, n) = self
            .buckets
            .iter()
            .enumerate()
            .max_by_key(|(i, n)| (**n, std::cmp::Reverse(*i)))
            .map_or((0, 0), |(i, n)| (i, *n));
        (n, BUCKET * i as u32)
    }
}

/// The retry policy of every client: 4 attempts in all, waiting 1 s, 2 s
/// and 4 s between them, before jitter.
fn retry(jitter: Jitter) -> Retry {
    Retry::exponential(Duration::from_secs(1))
        .max_attempts(4)
        .jitter(jitter)
}

/// Runs `clients` clients with `strategy`, all failing at virtual time 0
/// against a service that stays down, and counts their retries.
///
/// # Errors
/// When the pipeline cannot be built.
pub(crate) fn simulate(
    strategy: &'static Strategy,
    clients: usize,
    seed: u64,
) -> Result<Series, Failure> {
    let random = SeededRandom::new(seed);
    let mut buckets: Vec<u32> = Vec::new();
    for _ in 0..clients {
        let clock = VirtualClock::new();
        let pipeline = Pipeline::builder("herd")
            .retry(retry(strategy.jitter))
            .clock(clock.clone())
            .random(random.clone())
            .build()
            .map_err(|e| Failure::Runtime(format!("cannot build the herd's pipeline: {e}")))?;
        let _gave_up = pipeline.call(|ctx| {
            if !ctx.is_first_attempt() {
                let bucket = (clock.now().as_nanos() / BUCKET.as_nanos()) as usize;
                if buckets.len() <= bucket {
                    buckets.resize(bucket + 1, 0);
                }
                buckets[bucket] += 1;
            }
            Err::<(), _>("the service is down")
        });
    }
    Ok(Series { strategy, buckets })
}

/// Runs the three strategies.
///
/// # Errors
/// When a pipeline cannot be built.
pub(crate) fn compare(clients: usize, seed: u64) -> Result<Vec<Series>, Failure> {
    STRATEGIES
        .iter()
        .map(|s| simulate(s, clients, seed))
        .collect()
}

/// The machine-readable comparison: clients, seed and each strategy's peak
/// (the `HERD` line, and the live page's `herd`).
pub(crate) fn json(series: &[Series], clients: usize, seed: u64) -> String {
    let peaks: Vec<String> = series
        .iter()
        .map(|s| format!("\"{}\":{}", s.strategy.key, s.peak().0))
        .collect();
    format!(
        "{{\"clients\":{clients},\"seed\":{seed},\"peaks\":{{{}}}}}",
        peaks.join(",")
    )
}

/// Runs the three strategies, prints their peaks and writes the chart.
///
/// # Errors
/// When the chart cannot be written (`BadInput`).
pub(crate) fn run(options: &HerdOptions) -> Result<(), Failure> {
    let series = compare(options.clients, options.seed)?;
    let svg = chart::render(&series, options.clients);
    std::fs::write(&options.out, svg).map_err(|e| {
        Failure::BadInput(format!(
            "cannot write the chart to {}: {e}",
            options.out.display()
        ))
    })?;

    let mut text = format!(
        "{} clients fail at t = 0 and retry after 1 s, 2 s and 4 s (seawall Retry::exponential \
         on a virtual clock, seed {})\n\n",
        options.clients, options.seed
    );
    let _ = writeln!(
        text,
        "{:<16}{:>24}{:>10}",
        "strategy", "peak retries in 100 ms", "at"
    );
    for s in &series {
        let (peak, at) = s.peak();
        let share = 100.0 * f64::from(peak) / options.clients as f64;
        let _ = writeln!(
            text,
            "{:<16}{:>24}{:>9.1}s   {share:.0} % of the clients at once",
            s.strategy.label,
            peak,
            at.as_secs_f64()
        );
    }
    let _ = writeln!(text, "\nchart written to {}", options.out.display());
    let _ = writeln!(
        text,
        "HERD {}",
        json(&series, options.clients, options.seed)
    );
    say(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_jitter_every_client_retries_in_the_same_bucket() {
        let series = simulate(&STRATEGIES[0], 50, 1).unwrap();
        assert_eq!(series.peak(), (50, Duration::from_secs(1)));
        // 1 s, then 1 + 2 s, then 1 + 2 + 4 s.
        let busy: Vec<usize> = (0..series.buckets.len())
            .filter(|&i| series.buckets[i] > 0)
            .collect();
        assert_eq!(busy, [10, 30, 70]);
    }

    #[test]
    fn a_seed_gives_the_same_herd() {
        let a = simulate(&STRATEGIES[2], 200, 9).unwrap();
        let b = simulate(&STRATEGIES[2], 200, 9).unwrap();
        assert_eq!(a.buckets, b.buckets);
        assert_eq!(a.buckets.iter().sum::<u32>(), 600);
    }
}
