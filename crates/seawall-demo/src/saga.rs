//! `saga`: a place-order saga (reserve stock, charge payment, schedule
//! shipping) with compensations, a process killed halfway through the batch,
//! and the recovery that finishes it.
//!
//! The saga log and the shop live in one SQLite file. The shop stands for the
//! external systems (stock, payments, couriers): one table of effects whose
//! primary key is the saga's idempotency key, so that a step run again after
//! a crash is recognised and not applied twice. That is the contract of
//! `seawall-saga`: effects run at least once, and take effect exactly once
//! when the system they touch deduplicates by the key.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use seawall_saga::{
    Orchestrator, Saga, SagaEvent, SagaId, SagaStatus, SqliteLog, StartOptions, Step, StepContext,
    Transition,
};
use serde::{Deserialize, Serialize};

use crate::cli::SagaOptions;
use crate::{say, Failure};

/// Where orders go; nobody delivers to Atlantis, so those orders compensate.
const DESTINATIONS: [&str; 6] = ["Lisbon", "Oslo", "Atlantis", "Kyoto", "Lima", "Atlantis"];
const UNDELIVERABLE: &str = "Atlantis";
const PRODUCTS: [(&str, u64); 3] = [("tea", 600), ("coffee", 900), ("cocoa", 750)];

/// One order: the input of one saga, stored in the log with it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    id: String,
    product: String,
    quantity: u32,
    cents: u64,
    destination: String,
}

impl Order {
    /// The `n`-th order of the batch (1-based), the same in every run.
    fn nth(n: u32) -> Self {
        let (product, unit) = PRODUCTS[n as usize % PRODUCTS.len()];
        let quantity = 1 + n % 3;
        Order {
            id: format!("order-{n:03}"),
            product: product.to_owned(),
            quantity,
            cents: unit * u64::from(quantity),
            destination: DESTINATIONS[(n as usize - 1) % DESTINATIONS.len()].to_owned(),
        }
    }

    fn ships(&self) -> bool {
        self.destination != UNDELIVERABLE
    }

    /// The effects its saga applies: reserve, charge, ship; or reserve,
    /// charge, refund, release.
    fn effects(&self) -> &'static [&'static str] {
        if self.ships() {
            &["reserved", "charged", "shipped"]
        } else {
            &["reserved", "charged", "refunded", "released"]
        }
    }
}

fn euros(cents: u64) -> String {
    format!("EUR {}.{:02}", cents / 100, cents % 100)
}

/// Kills the process right after its `after`-th effect, before the saga log
/// records that the step is done: the worst moment to die.
#[derive(Debug)]
struct CrashPlan {
    after: Option<u32>,
    applied: AtomicU32,
}

impl CrashPlan {
    fn effect_applied(&self, key: &str) {
        let n = self.applied.fetch_add(1, Ordering::SeqCst) + 1;
        if self.after == Some(n) {
            say(&format!(
                "  *** killing this process now (std::process::abort): effect {n} ({key}) is applied, \
                 the saga log does not know it yet ***\n"
            ));
            std::process::abort();
        }
    }
}

/// The shop's table of effects, one row per idempotency key.
#[derive(Debug, Clone)]
struct Shop {
    db: Arc<Mutex<Connection>>,
    crash: Arc<CrashPlan>,
    repeats: Arc<AtomicU32>,
}

impl Shop {
    fn open(path: &Path, crash_after: Option<u32>) -> rusqlite::Result<Self> {
        let db = Connection::open(path)?;
        db.busy_timeout(std::time::Duration::from_secs(10))?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS shop_effects (
                 idempotency_key TEXT PRIMARY KEY,
                 order_id        TEXT NOT NULL,
                 effect          TEXT NOT NULL,
                 detail          TEXT NOT NULL
             )",
        )?;
        Ok(Shop {
            db: Arc::new(Mutex::new(db)),
            crash: Arc::new(CrashPlan {
                after: crash_after,
                applied: AtomicU32::new(0),
            }),
            repeats: Arc::new(AtomicU32::new(0)),
        })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `effect` once per idempotency key of `ctx`: a repeat (the same
    /// step run again after a crash) is recognised and skipped.
    fn apply(&self, ctx: &StepContext<Order>, effect: &str, detail: &str) -> Result<(), String> {
        let key = ctx.idempotency_key().as_str();
        let order = &ctx.input().id;
        let inserted = self
            .db()
            .execute(
                "INSERT OR IGNORE INTO shop_effects (idempotency_key, order_id, effect, detail)
                 VALUES (?1, ?2, ?3, ?4)",
                [key, order, effect, detail],
            )
            .map_err(|e| format!("the shop is unavailable: {e}"))?;
        if inserted == 1 {
            say(&format!("  {order}  {:<18} {detail}\n", ctx.step_name()));
            self.crash.effect_applied(key);
        } else {
            self.repeats.fetch_add(1, Ordering::Relaxed);
            say(&format!(
                "  {order}  {:<18} {detail}: already done under key {key}, not applied again\n",
                ctx.step_name()
            ));
        }
        Ok(())
    }

    /// The effects applied to `order`, in the order they were applied.
    fn effects_of(&self, order: &str) -> rusqlite::Result<Vec<String>> {
        let db = self.db();
        let mut query =
            db.prepare("SELECT effect FROM shop_effects WHERE order_id = ?1 ORDER BY rowid")?;
        let rows = query.query_map([order], |row| row.get(0))?;
        rows.collect()
    }
}

/// The saga: reserve stock, charge the payment, schedule shipping. The first
/// two have compensations (release, refund); shipping is the last step, so
/// it needs none.
fn place_order(shop: &Shop) -> Result<Saga<Order>, seawall_saga::DefinitionError> {
    let (reserve, release, charge, refund, ship) = (
        shop.clone(),
        shop.clone(),
        shop.clone(),
        shop.clone(),
        shop.clone(),
    );
    Saga::builder("place-order")
        .step(
            Step::new("reserve_stock", move |ctx: StepContext<Order>| {
                let shop = reserve.clone();
                async move {
                    let order = ctx.input();
                    let reserved = format!("{} x {}", order.quantity, order.product);
                    shop.apply(&ctx, "reserved", &format!("reserved {reserved}"))?;
                    Ok::<_, String>(reserved)
                }
            })
            .compensate(move |ctx, reserved: String| {
                let shop = release.clone();
                async move {
                    shop.apply(
                        &ctx,
                        "released",
                        &format!("compensated: released {reserved}"),
                    )
                }
            }),
        )
        .step(
            Step::new("charge_payment", move |ctx: StepContext<Order>| {
                let shop = charge.clone();
                async move {
                    let cents = ctx.input().cents;
                    shop.apply(&ctx, "charged", &format!("charged {}", euros(cents)))?;
                    Ok::<_, String>(cents)
                }
            })
            .compensate(move |ctx, cents: u64| {
                let shop = refund.clone();
                async move {
                    shop.apply(
                        &ctx,
                        "refunded",
                        &format!("compensated: refunded {}", euros(cents)),
                    )
                }
            }),
        )
        .step(Step::new(
            "schedule_shipping",
            move |ctx: StepContext<Order>| {
                let shop = ship.clone();
                async move {
                    let order = ctx.input();
                    if !order.ships() {
                        return Err(format!("no courier delivers to {}", order.destination));
                    }
                    shop.apply(
                        &ctx,
                        "shipped",
                        &format!("courier booked to {}", order.destination),
                    )
                }
            },
        ))
        .build()
}

/// Prints the transitions that tell the story (effects are printed by the shop).
fn print_event(event: &SagaEvent) {
    let id = &event.saga_id;
    let line = match &event.transition {
        Transition::StepFailed { step, error } => format!(
            "  {id}  {:<18} FAILED: {error}; compensating the completed steps, last first",
            step.name
        ),
        Transition::CompensationFailed {
            step,
            attempt,
            error,
        } => {
            format!(
                "  {id}  {:<18} compensation attempt {attempt} failed: {error}",
                step.name
            )
        }
        Transition::SagaCompleted => format!("  {id}  completed"),
        Transition::SagaCompensated => format!("  {id}  compensated"),
        Transition::SagaStuck { step, error } => {
            format!(
                "  {id}  STUCK: the compensation of {} keeps failing: {error}",
                step.name
            )
        }
        Transition::Claimed { .. } => format!("  {id}  picked up from the log ({})", event.status),
        _ => return,
    };
    say(&format!("{line}\n"));
}

/// Runs the saga demo.
///
/// # Errors
/// When the log cannot be opened (`BadInput`), or the batch cannot run.
pub(crate) fn run(options: &SagaOptions) -> Result<(), Failure> {
    let (db, temporary) = match &options.db {
        Some(path) => (path.clone(), false),
        None => (
            std::env::temp_dir().join(format!("seawall-demo-saga-{}.db", std::process::id())),
            true,
        ),
    };
    if !db.exists() && options.crash_after.is_none() {
        // Refuse a bad path here, not in the child.
        drop(open_log(&db)?);
        crash_a_first_run(&db, options.orders)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the async runtime: {e}")))?;
    let result = runtime.block_on(run_batch(&db, options.orders, options.crash_after));
    if temporary {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
        }
    }
    result
}

/// Act one: this same program, as a child process, places the batch and
/// kills itself halfway.
fn crash_a_first_run(db: &Path, orders: u32) -> Result<(), Failure> {
    let effects: usize = (1..=orders).map(|n| Order::nth(n).effects().len()).sum();
    let crash_after = effects.div_ceil(2).max(1);
    say(&format!(
        "placing {orders} orders, each a saga: reserve_stock, charge_payment, schedule_shipping \
         (log and shop in {})\nthe process placing them kills itself after {crash_after} of the \
         batch's {effects} effects\n\n",
        db.display()
    ));
    let program = std::env::current_exe()
        .map_err(|e| Failure::Runtime(format!("cannot find this program to run it again: {e}")))?;
    let status = Command::new(program)
        .arg("saga")
        .arg("--db")
        .arg(db)
        .args([
            "--orders",
            &orders.to_string(),
            "--crash-after",
            &crash_after.to_string(),
        ])
        .status()
        .map_err(|e| Failure::Runtime(format!("cannot start the first run: {e}")))?;
    if status.success() {
        say("\nthe first run finished without being killed\n");
    } else {
        say(&format!("\nthe first run died ({status})\n"));
    }
    say("\n--- running again on the same log: recover what was left unfinished, then finish the batch ---\n\n");
    Ok(())
}

fn open_log(db: &Path) -> Result<SqliteLog, Failure> {
    SqliteLog::open(db).map_err(|e| {
        let mut message = format!("cannot open the saga log {}: {e}", db.display());
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message += &format!(": {cause}");
            source = cause.source();
        }
        Failure::BadInput(message)
    })
}

/// Recovers what an earlier run left unfinished, places the orders not yet
/// placed, and reports.
async fn run_batch(db: &Path, orders: u32, crash_after: Option<u32>) -> Result<(), Failure> {
    let log = open_log(db)?;
    let shop = Shop::open(db, crash_after)
        .map_err(|e| Failure::BadInput(format!("cannot open the shop in {}: {e}", db.display())))?;
    let saga = place_order(&shop).map_err(|e| Failure::Runtime(format!("invalid saga: {e}")))?;
    let orchestrator = Orchestrator::builder(log)
        .saga(&saga)
        .on_event(print_event)
        .build()
        .map_err(|e| Failure::Runtime(format!("invalid orchestrator: {e}")))?;
    let failed = |e: seawall_saga::SagaError| Failure::Runtime(format!("the saga log failed: {e}"));

    let recovery = orchestrator.recover().await.map_err(failed)?;
    let recovered = recovery.outcomes.len();
    if recovered > 0 {
        say(&format!(
            "recovery finished {recovered} saga(s) that the earlier run left unfinished\n"
        ));
    }
    for failure in &recovery.failures {
        say(&format!(
            "  {}  could not be recovered: {}\n",
            failure.saga_id, failure.error
        ));
    }

    let mut remaining = Vec::new();
    for n in 1..=orders {
        let order = Order::nth(n);
        if orchestrator
            .get(&SagaId::new(&order.id))
            .await
            .map_err(failed)?
            .is_none()
        {
            remaining.push(order);
        }
    }
    if let (Some(first), Some(last)) = (remaining.first(), remaining.last()) {
        say(&format!("placing {} to {}\n", first.id, last.id));
    }
    for order in remaining {
        let options = StartOptions::new().id(order.id.clone());
        orchestrator
            .start_with(&saga, order, options)
            .await
            .map_err(failed)?;
    }
    report(&orchestrator, &shop, orders, recovered).await
}

/// The final state of every order, checked against the shop's effects.
async fn report(
    orchestrator: &Orchestrator,
    shop: &Shop,
    orders: u32,
    recovered: usize,
) -> Result<(), Failure> {
    let mut statuses: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut effects: BTreeMap<String, u32> = BTreeMap::new();
    let mut consistent = 0;
    let mut problems = Vec::new();
    for n in 1..=orders {
        let order = Order::nth(n);
        let record = orchestrator
            .get(&SagaId::new(&order.id))
            .await
            .map_err(|e| Failure::Runtime(format!("the saga log failed: {e}")))?;
        let status = record.map_or("missing", |r| r.status.as_str());
        *statuses.entry(status).or_default() += 1;
        let applied = shop
            .effects_of(&order.id)
            .map_err(|e| Failure::Runtime(format!("cannot read the shop: {e}")))?;
        for effect in &applied {
            *effects.entry(effect.clone()).or_default() += 1;
        }
        let expected_status = if order.ships() {
            SagaStatus::Completed
        } else {
            SagaStatus::Compensated
        };
        if status == expected_status.as_str() && applied == order.effects() {
            consistent += 1;
        } else {
            problems.push(format!("{}: {status}, effects {applied:?}", order.id));
        }
    }
    let count = |status: SagaStatus| statuses.get(status.as_str()).copied().unwrap_or(0);
    let repeats = shop.repeats.load(Ordering::Relaxed);
    let effect_list: Vec<String> = effects.iter().map(|(e, n)| format!("{e} {n}")).collect();
    let mut text = format!(
        "\n{orders} orders: {} completed, {} compensated, {} stuck, {} unfinished\n\
         effects in the shop, one per idempotency key: {}\n\
         repeated effects recognised by their key and not applied again: {repeats}\n\
         orders whose status and effects agree (compensations in reverse order): {consistent} of {orders}\n",
        count(SagaStatus::Completed),
        count(SagaStatus::Compensated),
        count(SagaStatus::Stuck),
        orders - count(SagaStatus::Completed) - count(SagaStatus::Compensated) - count(SagaStatus::Stuck),
        effect_list.join(", "),
    );
    for problem in &problems {
        text += &format!("  not as expected: {problem}\n");
    }
    let effects_json: Vec<String> = effects
        .iter()
        .map(|(e, n)| format!("\"{e}\":{n}"))
        .collect();
    text += &format!(
        "SAGA {{\"orders\":{orders},\"completed\":{},\"compensated\":{},\"stuck\":{},\"recovered\":{recovered},\
         \"repeats\":{repeats},\"consistent\":{consistent},\"effects\":{{{}}}}}\n",
        count(SagaStatus::Completed),
        count(SagaStatus::Compensated),
        count(SagaStatus::Stuck),
        effects_json.join(","),
    );
    say(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_are_the_same_in_every_run_and_some_cannot_ship() {
        let third = Order::nth(3);
        assert_eq!(third.id, "order-003");
        assert!(!third.ships());
        assert_eq!(
            third.effects(),
            ["reserved", "charged", "refunded", "released"]
        );
        assert!(Order::nth(1).ships());
        assert_eq!(euros(Order::nth(2).cents), "EUR 22.50");
    }
}
