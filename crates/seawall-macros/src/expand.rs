//! Code generation: the wrapped function.
//!
//! ```text
//! fn charge(&self, order: &Order) -> Result<Receipt, GatewayError> {
//!     static PIPELINE: OnceLock<Pipeline> = OnceLock::new();   // built on first call
//!     let outcome = PIPELINE.get_or_init(build).run(|ctx| {
//!         let order = order;                                  // per attempt: copy / clone
//!         typed::<Result<Receipt, GatewayError>>(async move { /* the body */ })
//!     }).await;
//!     match outcome {
//!         Ok(v) => Ok(v),
//!         Err(err) => Self::queue_for_later(self, order, err).await,  // or into E
//!     }
//! }
//! ```

use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned;
use syn::{Ident, ItemFn};

use seawall_order::PolicyKind;

use crate::attr::{Config, Step};
use crate::sig::{analyse, Analysis, Passing};

/// Expands `#[resilient(..)]` on `item`.
pub(crate) fn expand(config: Config, item: ItemFn) -> syn::Result<TokenStream> {
    let sig = analyse(&item.sig)?;
    if let Some(step) = config.steps.iter().find(|s| s.kind == PolicyKind::Hedging) {
        if !sig.is_async {
            return Err(syn::Error::new(
                step.key.span(),
                "`hedging` needs an async fn: hedged attempts run concurrently and the losers \
                 are dropped, which a blocking call cannot do",
            ));
        }
    }
    let ItemFn {
        attrs, vis, block, ..
    } = item;
    let outer_sig = &sig.outer;

    let internal = |name: &str| Ident::new(name, Span::mixed_site());
    let pipeline_static = internal("__SEAWALL_PIPELINE");
    let pipeline = internal("__seawall_pipeline");
    let outcome = internal("__seawall_outcome");
    let error = internal("__seawall_error");
    let ctx = internal("__seawall_ctx");
    let typed = internal("__seawall_typed");
    let per_attempt = internal("__seawall_per_attempt");

    let name = resource_name(&config, &sig);
    let build = builder(&config, &name);
    // A classifier or predicate fixes the pipeline's error type, which the
    // static must then name.
    let custom = config.steps.iter().find(|s| s.kind.is_custom());
    let pipeline_ty = match (custom, &sig.value, &sig.error) {
        // A policy written in code fixes both types of the pipeline.
        (Some(_), Some(t), Some(e)) => {
            quote!(::seawall::Pipeline<::seawall::pipeline::ValueType<#t, #e>>)
        }
        (Some(step), _, _) => {
            return Err(syn::Error::new(
                step.key.span(),
                "`policy` needs the return type spelled `Result<T, E>` (not an alias), so \
                 that the pipeline can name the types its policy handles",
            ))
        }
        (None, _, _) => match (config.judges.first(), &sig.error) {
            (None, _) => quote!(::seawall::Pipeline),
            (Some(_), Some(e)) => quote!(::seawall::Pipeline<::seawall::pipeline::ErrorType<#e>>),
            (Some((key, _)), None) => {
                return Err(syn::Error::new(
                    key.span(),
                    format!(
                        "`{key}` needs the return type spelled `Result<T, E>` (not an alias), \
                     so that the pipeline can name the error type `E`"
                    ),
                ))
            }
        },
    };

    // Each attempt binds the arguments anew: references are copied (or
    // reborrowed), owned values cloned, so the outer values stay for the
    // fallback.
    let rebinds = sig.args.iter().filter_map(|a| {
        let pattern = a.pattern.as_ref()?;
        let outer = &a.outer;
        let value = match a.passing {
            Passing::Shared => quote!(#outer),
            Passing::Exclusive => quote!(&mut *#outer),
            Passing::Owned => {
                quote_spanned!(a.ty.span()=> #per_attempt(&#outer))
            }
        };
        Some(quote!(let #pattern = #value;))
    });
    // `_` arguments are only passed on to the fallback, if any.
    let wildcards = sig.args.iter().filter(|a| a.pattern.is_none()).map(|a| {
        let outer = &a.outer;
        quote!(let _ = &#outer;)
    });
    let context_bind = match &config.context {
        Some(user) => quote!(let #user: ::seawall::Context = #ctx;),
        None => quote!(let _ = #ctx;),
    };
    let output = &sig.output;
    // A coalesced function runs through `coalesce_key(..)` (or
    // `coalesced()`, for a function without arguments): its calls with the
    // same key share one execution.
    let coalesce = config.steps.iter().find(|s| s.kind == PolicyKind::Coalesce);
    let runner = match (coalesce, &config.coalesce_key) {
        (None, _) => quote!(#pipeline),
        (Some(_), Some((_, key))) => {
            quote!(#pipeline.coalesce_key(::seawall::PartitionKey::from(#key)))
        }
        (Some(step), None) if sig.receiver.is_some() || !sig.args.is_empty() => {
            return Err(syn::Error::new(
                step.key.span(),
                "`coalesce` shares one execution among concurrent calls with the same key, \
                 and this function's calls differ by their arguments: give the key, \
                 e.g. `coalesce_key = *user_id` (an expression of the arguments, \
                 `Into<seawall::PartitionKey>`)",
            ))
        }
        (Some(_), None) => quote!(#pipeline.coalesced()),
    };
    let run = if sig.is_async {
        quote! {
            #runner.run(|#ctx: ::seawall::Context| {
                #context_bind
                #(#rebinds)*
                #typed::<#output, _>(async move #block)
            }).await
        }
    } else {
        // The body's statements go straight into the closure's body, whose
        // braces are the body's own: nested as a block of its own, a body
        // written on one line (`{ Ok(3) }`) would be the closure's tail
        // expression in redundant braces, which rustc lints (`unused_braces`)
        // in the user's crate.
        let stmts = &block.stmts;
        let mut body = Group::new(
            Delimiter::Brace,
            quote! {
                #context_bind
                #(#rebinds)*
                #(#stmts)*
            },
        );
        body.set_span(block.brace_token.span.join());
        quote! {
            #runner.call(|#ctx: ::seawall::Context| -> #output #body)
        }
    };
    let typed_helper = if sig.is_async {
        quote! {
            #[inline(always)]
            fn #typed<R, F: ::core::future::Future<Output = R>>(f: F) -> F {
                f
            }
        }
    } else {
        quote!()
    };
    let clone_helper = if sig.args.iter().any(|a| a.passing == Passing::Owned) {
        quote! {
            #[diagnostic::on_unimplemented(
                message = "`{Self}` must be `Clone` to be an owned argument of a #[resilient] function",
                label = "cloned for each attempt",
                note = "the body runs once per attempt, each with its own copy of the owned arguments; take the argument by reference or implement `Clone` for it"
            )]
            trait SeawallPerAttempt: ::core::clone::Clone {}
            impl<T: ::core::clone::Clone> SeawallPerAttempt for T {}
            #[inline(always)]
            fn #per_attempt<T: SeawallPerAttempt>(value: &T) -> T {
                ::core::clone::Clone::clone(value)
            }
        }
    } else {
        quote!()
    };

    // The pipeline, built once, at the first call. `build()` checks the
    // values with the builder's rules: a refused value is a bug of the
    // attribute's arguments and panics with the builder's message. A store
    // that cannot bind the resource surfaces as `Error::Store` (handled like
    // any other error of the call), and the next call tries again.
    let fn_name = sig.outer.ident.to_string();
    let invalid = quote! {
        ::core::panic!(
            "seawall: invalid #[resilient] settings on `{}`: {}",
            #fn_name,
            e
        )
    };
    let (get_pipeline, run_or_fail) = if config.store.is_some() {
        (
            quote! {
                let #pipeline: ::core::result::Result<&'static #pipeline_ty, ::seawall::StoreError> =
                    match #pipeline_static.get() {
                        ::core::option::Option::Some(p) => ::core::result::Result::Ok(p),
                        ::core::option::Option::None => match #build {
                            ::core::result::Result::Ok(p) => ::core::result::Result::Ok(#pipeline_static.get_or_init(move || p)),
                            ::core::result::Result::Err(e) if e.policy == "store" => ::core::result::Result::Err(::seawall::StoreError::Unavailable(e.rule)),
                            ::core::result::Result::Err(e) => #invalid,
                        },
                    };
            },
            quote! {
                match #pipeline {
                    ::core::result::Result::Ok(#pipeline) => #run,
                    ::core::result::Result::Err(e) => ::core::result::Result::Err(::seawall::Error::Store(e)),
                }
            },
        )
    } else {
        (
            quote! {
                let #pipeline: &'static #pipeline_ty = #pipeline_static.get_or_init(|| {
                    // The in-memory store always binds.
                    match #build {
                        ::core::result::Result::Ok(p) => p,
                        ::core::result::Result::Err(e) => #invalid,
                    }
                });
            },
            run,
        )
    };

    let on_error = on_error(&config, &sig, &error)?;

    Ok(quote! {
        #(#attrs)*
        #vis #outer_sig {
            static #pipeline_static: ::std::sync::OnceLock<#pipeline_ty> = ::std::sync::OnceLock::new();
            #(#wildcards)*
            #typed_helper
            #clone_helper
            #get_pipeline
            let #outcome = {
                #run_or_fail
            };
            match #outcome {
                ::core::result::Result::Ok(value) => ::core::result::Result::Ok(value),
                ::core::result::Result::Err(#error) => #on_error,
            }
        }
    })
}

/// The resource name keying the pipeline's state.
fn resource_name(config: &Config, sig: &Analysis) -> TokenStream {
    let fn_name = sig.outer.ident.to_string();
    if let Some(name) = &config.name {
        return quote!(::std::string::String::from(#name));
    }
    if sig.receiver.is_some() {
        // `Type::method`: the last segment of the type's path, without
        // generic arguments.
        return quote! {{
            let full = ::core::any::type_name::<Self>();
            let path = full.split('<').next().unwrap_or(full);
            let short = path.rsplit("::").next().unwrap_or(path);
            ::std::format!("{}::{}", short, #fn_name)
        }};
    }
    quote!(::std::string::String::from(
        ::core::concat!(::core::module_path!(), "::", #fn_name)
    ))
}

/// What the function returns when the pipeline fails with `error`.
fn on_error(config: &Config, sig: &Analysis, error: &Ident) -> syn::Result<TokenStream> {
    if let Some(fallback) = &config.fallback {
        // Every token of the call is located at the fallback's path, so that
        // a signature mismatch is reported there.
        let span = fallback.span();
        let receiver = sig.receiver.iter().map(|r| {
            let mut r = *r;
            r.span = r.span.located_at(span);
            r.to_token_stream()
        });
        let args = sig.args.iter().map(|a| {
            let mut outer = a.outer.clone();
            outer.set_span(outer.span().located_at(span));
            outer.to_token_stream()
        });
        let all = receiver.chain(args);
        let mut error = error.clone();
        error.set_span(error.span().located_at(span));
        let call = quote_spanned!(span=> #fallback(#(#all,)* #error));
        return Ok(if sig.is_async {
            quote_spanned!(span=> #call.await)
        } else {
            call
        });
    }
    // Without a fallback the caller gets the body's own error back; the
    // errors of seawall's policies go through `E: From<..>`, required only
    // for the policies declared.
    let first = |pred: &dyn Fn(&Step) -> bool| config.steps.iter().find(|s| pred(s));
    let rejecting = first(&|s| s.policy.rejects);
    let timing = first(&|s| s.kind == PolicyKind::Timeout);

    let rejected = match rejecting {
        Some(step) => convert(
            step.key.span(),
            ("HoldsRejections", "hold_rejection"),
            quote!(::seawall::Rejection),
            "cannot hold seawall's rejections",
            "this policy can reject calls",
            "implement `From<seawall::Rejection>` for `{Self}`, or add `fallback = ...` to handle every `seawall::Error`",
        ),
        None => quote!(|_| ::core::unreachable!(
            "seawall: a call was rejected although no policy of this function rejects"
        )),
    };
    let timed_out = match timing {
        Some(step) => convert(
            step.key.span(),
            ("HoldsTimeouts", "hold_timeout"),
            quote!(::seawall::TimeoutError),
            "cannot hold seawall's timeouts",
            "this timeout can expire",
            "implement `From<seawall::TimeoutError>` for `{Self}`, or add `fallback = ...` to handle every `seawall::Error`",
        ),
        None => quote!(|_| ::core::unreachable!(
            "seawall: a call timed out although this function declares no timeout"
        )),
    };
    let stored = match &config.store {
        Some(path) => convert(
            path.span(),
            ("HoldsStoreErrors", "hold_store_error"),
            quote!(::seawall::StoreError),
            "cannot hold seawall's store errors",
            "this store can fail",
            "implement `From<seawall::StoreError>` for `{Self}`, or add `fallback = ...` to handle every `seawall::Error`",
        ),
        None => quote!(|_| ::core::unreachable!(
            "seawall: the in-memory store failed, which it never does"
        )),
    };
    Ok(quote! {
        ::core::result::Result::Err(match #error {
            ::seawall::Error::Operation(e)
            | ::seawall::Error::RetryExhausted { last: e, .. }
            | ::seawall::Error::Fallback(e) => e,
            ::seawall::Error::Rejected(r) => (#rejected)(r),
            ::seawall::Error::Timeout(t) => (#timed_out)(t),
            ::seawall::Error::Store(s) => (#stored)(s),
            // `Error` is non-exhaustive; the variants above are all it
            // returns here (`Error::Config` comes only from a blocking call
            // with hedging, which does not compile).
            _ => ::core::unreachable!("seawall: unknown error variant"),
        })
    })
}

/// A conversion `X -> E` through `From`, whose failure to compile names the
/// policy that needs it.
fn convert(
    span: Span,
    names: (&str, &str),
    from: TokenStream,
    message: &str,
    label: &str,
    note: &str,
) -> TokenStream {
    // Hygienic names, located at the user's key so that the error points there.
    let here = Span::mixed_site().located_at(span);
    let tr = Ident::new(names.0, here);
    let helper = Ident::new(names.1, here);
    let message = format!("`{{Self}}` {message}");
    quote! {{
        #[diagnostic::on_unimplemented(message = #message, label = #label, note = #note)]
        trait #tr: ::core::convert::From<#from> {}
        impl<E: ::core::convert::From<#from>> #tr for E {}
        #[inline(always)]
        fn #helper<E: #tr>(x: #from) -> E {
            <E as ::core::convert::From<#from>>::from(x)
        }
        #helper
    }}
}

/// The expression building the pipeline (a `Result<Pipeline, ConfigError>`).
fn builder(config: &Config, name: &TokenStream) -> TokenStream {
    let mut chain = TokenStream::new();
    for step in &config.steps {
        // Each policy is declared by the builder method of its name; a
        // policy written in code by `policy`.
        let method = match step.kind.is_custom() {
            true => Ident::new("policy", Span::call_site()),
            false => Ident::new(step.kind.name(), Span::call_site()),
        };
        let value = &step.policy.value;
        chain.extend(quote!(.#method(#value)));
    }
    for (key, judge) in &config.judges {
        let method = Ident::new(&key.to_string(), judge.span());
        chain.extend(quote_spanned!(judge.span()=> .#method(#judge)));
    }
    if let Some(store) = &config.store {
        chain.extend(quote!(.store(#store())));
    }
    if let Some(clock) = &config.clock {
        chain.extend(quote!(.clock(#clock())));
    }
    if let Some(on_event) = &config.on_event {
        chain.extend(quote!(.on_event(#on_event)));
    }
    quote!(::seawall::Pipeline::builder(#name)#chain.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(args: &str, item: &str) -> syn::Result<TokenStream> {
        let config = crate::attr::parse(args.parse().expect("tokens"))?;
        expand(config, syn::parse_str(item).expect("a function"))
    }

    #[test]
    fn expands_to_one_function_with_the_same_signature() {
        let out = expand_str(
            "retry(max_attempts = 3), circuit_breaker(failure_rate = 0.5), fallback = Self::later",
            "async fn charge(&self, order: &Order, mut n: u32) -> Result<Receipt, GatewayError> { Ok(todo!()) }",
        )
        .unwrap();
        let f: ItemFn = syn::parse2(out).expect("a function");
        assert_eq!(f.sig.ident, "charge");
        assert!(f.sig.asyncness.is_some());
        let inputs = f.sig.inputs.to_token_stream().to_string();
        // `mut` moved into each attempt; names and types unchanged.
        assert_eq!(inputs, "& self , order : & Order , n : u32");
        let out = f.block.to_token_stream().to_string();
        assert!(
            out.contains("Self :: later (self , order , n , __seawall_error) . await"),
            "{out}"
        );
        assert!(out.contains("__seawall_per_attempt (& n)"), "{out}");
    }

    #[test]
    fn a_classifier_needs_the_error_type_spelled_out() {
        let e = expand_str(
            "retry, classify = judge",
            "fn f() -> io::Result<u32> { Ok(1) }",
        )
        .unwrap_err();
        assert!(e.to_string().contains("spelled `Result<T, E>`"), "{e}");
        assert!(expand_str(
            "retry, classify = judge",
            "fn f() -> Result<u32, E> { Ok(1) }"
        )
        .is_ok());
    }
}
