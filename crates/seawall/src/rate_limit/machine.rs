//! Lock-free rate limiter state used by the memory store.
