//! Lock-free circuit state machine used by the memory store.
