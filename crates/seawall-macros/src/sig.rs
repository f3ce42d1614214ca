//! What the macro needs to know of the function it wraps.

use proc_macro2::Span;
use quote::format_ident;
use syn::spanned::Spanned;
use syn::{
    FnArg, GenericArgument, Ident, Pat, PatIdent, PatType, PathArguments, ReturnType, Signature,
    Token, Type,
};

/// How an argument reaches each attempt.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Passing {
    /// `&T`: copied into each attempt.
    Shared,
    /// `&mut T`: reborrowed by each attempt (sync functions only).
    Exclusive,
    /// Anything else: cloned for each attempt.
    Owned,
}

/// An argument other than `self`.
pub(crate) struct Arg {
    /// The name it has in the generated signature (the user's name for a
    /// plain `name: T` argument).
    pub(crate) outer: Ident,
    /// The pattern each attempt binds, `None` for `_`.
    pub(crate) pattern: Option<Pat>,
    pub(crate) passing: Passing,
    /// The argument's type (errors about it point here).
    pub(crate) ty: Type,
}

/// The function's signature, as the expansion uses it.
pub(crate) struct Analysis {
    /// The signature to emit: the user's, with argument patterns replaced
    /// by plain names (`mut` and destructuring move into each attempt).
    pub(crate) outer: Signature,
    /// The `self` token, for methods.
    pub(crate) receiver: Option<Token![self]>,
    pub(crate) args: Vec<Arg>,
    /// The declared return type, `Result<T, E>` (or an alias named `Result`).
    pub(crate) output: Type,
    /// `E`, when the return type is spelled `Result<T, E>`.
    pub(crate) error: Option<Type>,
    /// `T`, when the return type is spelled `Result<T, E>`.
    pub(crate) value: Option<Type>,
    pub(crate) is_async: bool,
}

fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, msg))
}

fn strip(ty: &Type) -> &Type {
    match ty {
        Type::Paren(p) => strip(&p.elem),
        Type::Group(g) => strip(&g.elem),
        other => other,
    }
}

fn passing(ty: &Type) -> Passing {
    match strip(ty) {
        Type::Reference(r) if r.mutability.is_some() => Passing::Exclusive,
        Type::Reference(_) => Passing::Shared,
        _ => Passing::Owned,
    }
}

/// Checks the signature and prepares the rewritten one.
pub(crate) fn analyse(sig: &Signature) -> syn::Result<Analysis> {
    if let Some(c) = sig.constness {
        return err(c.span, "#[resilient] cannot wrap a `const fn`");
    }
    if let Some(v) = &sig.variadic {
        return err(v.span(), "#[resilient] cannot wrap a variadic function");
    }
    let is_async = sig.asyncness.is_some();
    if let ReturnType::Type(_, ty) = &sig.output {
        if let Some(span) = impl_trait(quote::ToTokens::to_token_stream(&**ty)) {
            return err(
                span,
                "#[resilient] cannot wrap a function whose return type has `impl Trait`: \
                 each attempt runs as a closure, whose return type is written out; name the \
                 type, or box it (`Box<dyn Trait>`)",
            );
        }
    }
    let output = match &sig.output {
        ReturnType::Type(_, ty) if returns_result(ty) => (**ty).clone(),
        ReturnType::Type(_, ty) => {
            let alias = match strip(ty) {
                Type::Path(p) => p
                    .path
                    .segments
                    .last()
                    .map(|s| s.ident.to_string())
                    .filter(|name| name.ends_with("Result")),
                _ => None,
            };
            return match alias {
                Some(name) => err(
                    ty.span(),
                    format!(
                        "#[resilient] knows `Result<T, E>` and aliases named `Result`, not \
                         `{name}`: spell the type out, or name the alias `Result` (`type \
                         Result<T> = std::result::Result<T, MyError>;`)"
                    ),
                ),
                None => err(
                    ty.span(),
                    "#[resilient] needs a function returning `Result<T, E>`: the pipeline \
                     judges each attempt by its `Err`",
                ),
            };
        }
        ReturnType::Default => {
            return err(
                sig.ident.span(),
                "#[resilient] needs a function returning `Result<T, E>`: the pipeline judges \
                 each attempt by its `Err`",
            )
        }
    };
    let mut outer = sig.clone();
    let mut receiver = None;
    let mut args = Vec::new();
    for (i, input) in outer.inputs.iter_mut().enumerate() {
        match input {
            FnArg::Receiver(r) => {
                let by_reference = matches!(strip(&r.ty), Type::Reference(_));
                if !by_reference {
                    return err(
                        r.span(),
                        "#[resilient] cannot take `self` by value: the body runs once per \
                         attempt; take `&self`",
                    );
                }
                if is_async && passing(&r.ty) == Passing::Exclusive {
                    return err(
                        r.self_token.span,
                        "#[resilient] on an async fn cannot take `&mut self`: each attempt's \
                         future needs its own access to `self`; take `&self` (with interior \
                         mutability) or make the function sync",
                    );
                }
                receiver = Some(r.self_token);
            }
            FnArg::Typed(PatType { pat, ty, .. }) => {
                let passing = passing(ty);
                if is_async && passing == Passing::Exclusive {
                    return err(
                        pat.span(),
                        "#[resilient] on an async fn cannot take `&mut` arguments: each \
                         attempt's future needs its own access; take `&T` (with interior \
                         mutability), an owned `Clone` value, or make the function sync",
                    );
                }
                let (outer_ident, pattern) = match &**pat {
                    Pat::Ident(PatIdent {
                        by_ref: None,
                        subpat: None,
                        ident,
                        ..
                    }) => (ident.clone(), Some((**pat).clone())),
                    Pat::Wild(_) => (
                        format_ident!("__seawall_arg{}", i, span = Span::mixed_site()),
                        None,
                    ),
                    other => (
                        format_ident!("__seawall_arg{}", i, span = Span::mixed_site()),
                        Some(other.clone()),
                    ),
                };
                **pat = Pat::Ident(PatIdent {
                    attrs: Vec::new(),
                    by_ref: None,
                    mutability: None,
                    ident: outer_ident.clone(),
                    subpat: None,
                });
                args.push(Arg {
                    outer: outer_ident,
                    pattern,
                    passing,
                    ty: (**ty).clone(),
                });
            }
        }
    }
    let (value, error) = match result_types(&output) {
        Some((t, e)) => (Some(t), Some(e)),
        None => (None, None),
    };
    Ok(Analysis {
        outer,
        receiver,
        args,
        output,
        error,
        value,
        is_async,
    })
}

/// Where `impl` first appears in `tokens` (an `impl Trait` in a type).
fn impl_trait(tokens: proc_macro2::TokenStream) -> Option<Span> {
    tokens.into_iter().find_map(|token| match token {
        proc_macro2::TokenTree::Ident(i) if i == "impl" => Some(i.span()),
        proc_macro2::TokenTree::Group(g) => impl_trait(g.stream()),
        _ => None,
    })
}

/// `Result<..>`, `io::Result<..>`, `anyhow::Result<..>`: a path whose last
/// segment is `Result`.
fn returns_result(ty: &Type) -> bool {
    match strip(ty) {
        Type::Path(p) => p.path.segments.last().is_some_and(|s| s.ident == "Result"),
        _ => false,
    }
}

/// `T` and `E` in `Result<T, E>`.
fn result_types(ty: &Type) -> Option<(Type, Type)> {
    let Type::Path(p) = strip(ty) else {
        return None;
    };
    let last = p.path.segments.last()?;
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    let mut types = args.args.iter().filter_map(|a| match a {
        GenericArgument::Type(t) => Some(t),
        _ => None,
    });
    match (types.next(), types.next(), types.next()) {
        (Some(t), Some(e), None) => Some((t.clone(), e.clone())),
        _ => None,
    }
}
