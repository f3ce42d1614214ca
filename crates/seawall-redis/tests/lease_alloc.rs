//! Leased mode's local admission allocates nothing: a call admitted from
//! the batch, on the blocking path and on the async one (its future is
//! ready at once), costs no allocation, besides no round trip.
//!
//! The counting allocator delegates to the system allocator; it counts per
//! thread, so the renewals in the background are not counted.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use seawall::store::{AdmitRequest, ResourceSpec};
use seawall::{RateLimiter, StateStore};
use seawall_redis::{Leasing, RedisStore};
use seawall_test_redis::{unique, RedisServer};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every method delegates to the system allocator with the caller's
// arguments unchanged; the counter is a plain thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn an_admission_from_the_batch_allocates_nothing() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .prefix(unique("leasealloc"))
        .caller_clock()
        .fail_closed()
        .leased("api", Leasing::batch(10_000).low_water(1))
        .build()
        .unwrap();
    let spec =
        ResourceSpec::new("api").with_rate_limit(RateLimiter::gcra(10_000, Duration::from_secs(1)));
    let state = store.bind(&spec).unwrap();
    let now = Duration::from_secs(1_000);
    // The first admission leases the batch.
    assert!(state
        .admit(&AdmitRequest::new(None, now))
        .unwrap()
        .decision
        .is_ok());
    let before = allocations();
    for _ in 0..1000 {
        let a = state.admit(&AdmitRequest::new(None, now)).unwrap();
        assert!(a.decision.is_ok());
    }
    assert_eq!(allocations() - before, 0, "blocking path");
    // The async path, polled by hand: ready at the first poll.
    let mut cx = Context::from_waker(Waker::noop());
    let before = allocations();
    for _ in 0..1000 {
        let fut = pin!(state.admit_async(AdmitRequest::new(None, now).with_weight(2)));
        match fut.poll(&mut cx) {
            Poll::Ready(a) => assert!(a.unwrap().decision.is_ok()),
            Poll::Pending => panic!("an admission from the batch is ready at once"),
        }
    }
    assert_eq!(allocations() - before, 0, "async path");
}
