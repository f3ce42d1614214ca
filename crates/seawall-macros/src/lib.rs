//! The `#[resilient(...)]` attribute of [seawall](https://crates.io/crates/seawall):
//! retry, circuit breaker, timeout, bulkhead, rate limiter, cooldown, chaos
//! latency, request coalescing and fallback declared on a function or method.
//!
//! Use it through `seawall` with the `macros` feature, which re-exports it as
//! `seawall::resilient`; the generated code refers to the `seawall` crate.
//! See [`macro@resilient`] for the settings, the order of policies, how errors
//! reach the caller and how state is keyed.
#![forbid(unsafe_code)]

mod attr;
mod expand;
mod policies;
mod sig;

use proc_macro::TokenStream;
use quote::ToTokens;

#[doc = include_str!("resilient.md")]
#[proc_macro_attribute]
pub fn resilient(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = syn::parse_macro_input!(item as syn::ItemFn);
    match attr::parse(args.into()).and_then(|config| expand::expand(config, item.clone())) {
        Ok(tokens) => tokens.into(),
        // Keep the function as written so that its callers still compile
        // and the only error is the one above.
        Err(e) => {
            let mut tokens = e.into_compile_error();
            item.to_tokens(&mut tokens);
            tokens.into()
        }
    }
}
