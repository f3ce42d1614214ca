//! Rejections of a nested pipeline. An operation that calls another
//! pipeline and returns its [`Error`] as its own error hands the outer
//! pipeline a refusal by seawall itself (the inner circuit is open, its
//! bulkhead full): the outer pipeline must not retry it, nor count it as a
//! failure of its dependency.
//!
//! `E` is any type, so the outer pipeline cannot name `Error<X>` for the
//! inner `X`. Instead, a pipeline that ends a call with a rejection notes
//! its error type here (once per pipeline and type, out of line), with a
//! function that tells a rejection of that type; an outer pipeline whose
//! operation failed looks its own `E` up (only when anything was noted).

use std::any::{Any, TypeId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{OnceLock, RwLock};

use crate::error::{Error, Rejection};

type Detector = fn(&dyn Any) -> bool;

static KNOWN: RwLock<Vec<(TypeId, Detector)>> = RwLock::new(Vec::new());
static ANY_KNOWN: AtomicBool = AtomicBool::new(false);

/// The error type a pipeline noted last, so that noting it again costs one
/// comparison.
#[derive(Debug, Default)]
pub(crate) struct Noted(OnceLock<TypeId>);

/// Notes that calls may end with a rejection in `Error<E>`.
#[inline]
pub(crate) fn note<E: 'static>(noted: &Noted) {
    let id = TypeId::of::<Error<E>>();
    if noted.0.get() != Some(&id) {
        note_type::<E>(id);
        let _ = noted.0.set(id);
    }
}

#[cold]
fn note_type<E: 'static>(id: TypeId) {
    let known = |list: &[(TypeId, Detector)]| list.iter().any(|(k, _)| *k == id);
    if known(&KNOWN.read().unwrap_or_else(|e| e.into_inner())) {
        return;
    }
    let mut list = KNOWN.write().unwrap_or_else(|e| e.into_inner());
    if !known(&list) {
        list.push((id, |any| {
            any.downcast_ref::<Error<E>>()
                .is_some_and(Error::is_rejected)
        }));
    }
    ANY_KNOWN.store(true, Ordering::Release);
}

/// `true` when `e` is a refusal by seawall itself: a [`Rejection`], or an
/// `Error::Rejected` of a pipeline that noted its type.
pub(crate) fn is_rejection<E: 'static>(e: &E) -> bool {
    let any: &dyn Any = e;
    if any.is::<Rejection>() {
        return true;
    }
    if !ANY_KNOWN.load(Ordering::Acquire) {
        return false;
    }
    let id = TypeId::of::<E>();
    let list = KNOWN.read().unwrap_or_else(|e| e.into_inner());
    list.iter()
        .find(|(k, _)| *k == id)
        .is_some_and(|(_, detect)| detect(any))
}
