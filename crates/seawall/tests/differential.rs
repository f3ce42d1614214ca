//! The differential corpus (`seawall::testing::differential`) on the
//! in-memory store: every scenario, run sync and async, with and without a
//! listener, on clocks at 0 and at 10^6 s (and, with the `tracing`
//! feature, under a subscriber), each run on a fresh `MemoryStore`, must
//! observe the same results, operation calls, sleeps, end times, nested
//! results and store state, and the results each scenario states.
//!
//! The same corpus runs on the reference model of the stateful policies
//! and must observe what it observes on the memory store; seawall-redis
//! runs it on a real Redis server and compares it with these runs.

use std::collections::HashSet;

use seawall::testing::differential::{self, corpus};
use seawall::MemoryStore;

#[test]
fn every_scenario_agrees_across_modes_on_the_memory_store() {
    let mut failures = Vec::new();
    for scenario in corpus() {
        let runs = differential::run_all(&scenario, MemoryStore::new);
        let problems = differential::check(&scenario, &runs);
        if !problems.is_empty() {
            failures.push(differential::report(&scenario, &problems, &runs));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The corpus is whole: a scenario lost in an edit fails here.
#[test]
fn the_corpus_has_every_scenario_once() {
    let names: Vec<&str> = corpus().iter().map(|s| s.name()).collect();
    let unique: HashSet<&str> = names.iter().copied().collect();
    assert_eq!(unique.len(), names.len(), "duplicate names in {names:?}");
    assert_eq!(names.len(), 58, "{names:?}");
}

/// The corpus on the reference model of the stateful policies
/// (`differential::ModelStore`): every scenario observes, mode by mode,
/// exactly what it observes on the memory store. The hedging
/// scenarios among them check that the attempts of a hedged call are
/// admitted, recorded and given back as the model says.
#[test]
fn the_memory_store_agrees_with_the_reference_model() {
    let mut failures = Vec::new();
    for scenario in corpus() {
        let memory = differential::run_all(&scenario, MemoryStore::new);
        let model = differential::run_all(&scenario, || differential::ModelStore);
        let mut problems = differential::check(&scenario, &model);
        problems.extend(
            differential::compare(&memory, &model)
                .into_iter()
                .map(|p| format!("against the memory store: {p}")),
        );
        if !problems.is_empty() {
            failures.push(differential::report(&scenario, &problems, &model));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) differ on the model:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
