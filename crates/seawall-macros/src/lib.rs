//! The `#[resilient(...)]` attribute of seawall.
#![forbid(unsafe_code)]

mod attr;
mod expand;
mod sig;

use proc_macro::TokenStream;
use quote::ToTokens;

/// Runs a function through a seawall pipeline.
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
