//! What a call through an adapter that hands back its inner service's
//! answers ends with: the tower layer and the reqwest middleware. Their
//! attempts tell the pipeline only a verdict; the failed attempt's response
//! or error waits here, and replaces the pipeline's result at the end.

use std::sync::{Mutex, PoisonError};

use crate::error::Error;

/// The answer of a call's latest failed attempt: its response judged a
/// failure (`Ok`) or its error (`Err`).
pub(crate) struct LastAnswer<T, E>(Mutex<Option<Result<T, E>>>);

impl<T, E> LastAnswer<T, E> {
    /// Nothing kept yet.
    pub(crate) fn new() -> Self {
        LastAnswer(Mutex::new(None))
    }

    /// Keeps what a failed attempt produced, in place of an earlier one.
    pub(crate) fn keep(&self, answer: Result<T, E>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
    }

    /// The call's result in the inner service's types. The last failed
    /// attempt's answer replaces the pipeline's verdict on it (the failed
    /// response comes back as a response: an adapter never turns one into
    /// an error), and the answer a response brought replaces a policy's
    /// refusal of its retry (an open circuit, a full bulkhead, the retry
    /// budget). A refusal before any answer, a timeout and the store's and
    /// configuration's errors stay the pipeline's.
    pub(crate) fn settle<F>(self, result: Result<T, Error<F>>) -> Result<T, Error<E>> {
        let error = match result {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let last = self.0.into_inner().unwrap_or_else(PoisonError::into_inner);
        let error = match error {
            Error::Operation(_) | Error::RetryExhausted { .. } | Error::Fallback(_) => {
                return match last {
                    Some(Ok(response)) => Ok(response),
                    Some(Err(e)) => Err(error.map(|_| e)),
                    None => unreachable!("a failed attempt always leaves its response or error"),
                };
            }
            Error::Rejected(r) => match last {
                Some(Ok(response)) => return Ok(response),
                _ => Error::Rejected(r),
            },
            Error::Timeout(t) => Error::Timeout(t),
            Error::Store(s) => Error::Store(s),
            Error::Config(c) => Error::Config(c),
        };
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Rejection, RejectionReason, TimeoutError, TimeoutScope};
    use std::time::Duration;

    /// The pipeline's verdict on an attempt, as the adapters give it.
    #[derive(Debug)]
    struct Failed;

    fn settle<T, E>(
        result: Result<T, Error<Failed>>,
        last: Option<Result<T, E>>,
    ) -> Result<T, Error<E>> {
        let answer = LastAnswer::new();
        if let Some(last) = last {
            answer.keep(last);
        }
        answer.settle(result)
    }

    #[test]
    fn a_failed_response_goes_back_to_the_caller() {
        let exhausted = Error::RetryExhausted {
            attempts: 3,
            last: Failed,
        };
        let r: Result<&str, Error<&str>> = settle(Err(exhausted), Some(Ok("503")));
        assert_eq!(r.unwrap(), "503");
        let r: Result<&str, Error<&str>> = settle(Err(Error::Operation(Failed)), Some(Ok("404")));
        assert_eq!(r.unwrap(), "404");
    }

    #[test]
    fn a_failed_error_keeps_its_type_and_attempts() {
        let exhausted = Error::RetryExhausted {
            attempts: 2,
            last: Failed,
        };
        let r: Result<(), Error<&str>> = settle(Err(exhausted), Some(Err("refused")));
        match r {
            Err(Error::RetryExhausted { attempts, last }) => {
                assert_eq!((attempts, last), (2, "refused"))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_refused_retry_gives_back_the_response_that_failed() {
        let rejection = || Rejection::new(RejectionReason::CircuitOpen, None);
        let r: Result<&str, Error<&str>> =
            settle(Err(Error::Rejected(rejection())), Some(Ok("503")));
        assert_eq!(r.unwrap(), "503");
        // After an error, and before any attempt, the refusal stays.
        let r: Result<&str, Error<&str>> =
            settle(Err(Error::Rejected(rejection())), Some(Err("reset")));
        assert!(r.unwrap_err().is_rejected());
        let r: Result<&str, Error<&str>> = settle(Err(Error::Rejected(rejection())), None);
        assert_eq!(r.unwrap_err().to_string(), "call rejected: circuit_open");
    }

    #[test]
    fn a_timeout_passes_through() {
        let timeout = TimeoutError::new(TimeoutScope::Attempt, Duration::from_millis(5), 1);
        let r: Result<&str, Error<&str>> = settle(Err(Error::Timeout(timeout)), Some(Ok("503")));
        assert!(r.unwrap_err().is_timeout());
    }
}
