//! Errors of the Redis store, and how Redis errors become
//! [`StoreError`]s.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use seawall::StoreError;

/// An invalid [`RedisStore`](crate::RedisStore) configuration, reported by
/// [`RedisStoreBuilder::build`](crate::RedisStoreBuilder::build).
///
/// Nothing is sent to Redis before `build` succeeds; connection, password
/// and permission problems are reported as [`StoreError`]s by
/// [`StateStore::bind`](seawall::StateStore::bind) or by the first call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// The connection URL cannot be parsed or names an unsupported scheme.
    #[error("invalid redis url `{url}`: {reason}")]
    InvalidUrl {
        /// The URL, with any password replaced by `***`.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// A setting is out of range; the message names the field and the rule.
    #[error("redis_store.{field} {rule}")]
    InvalidConfig {
        /// The offending setting.
        field: &'static str,
        /// The rule it breaks, with the value given.
        rule: String,
    },
}

/// The URL with the password (if any) replaced by `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = match userinfo.find(':') {
        Some(colon) => format!("{}:***", &userinfo[..colon]),
        None => "***".to_owned(),
    };
    format!("{}{}{}", &url[..scheme_end + 3], user, &rest[at..])
}

/// `true` for errors that say the server cannot be used right now
/// (as opposed to a refusal or a reply seawall cannot read).
pub(crate) fn is_outage(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(_) | StoreError::Timeout(_))
}

/// Classifies a Redis error.
pub(crate) fn store_error(e: &RedisError, timeout: Duration) -> StoreError {
    if e.is_timeout() {
        return StoreError::Timeout(timeout);
    }
    let code = e.code().unwrap_or_default();
    match code {
        "NOAUTH" | "WRONGPASS" => {
            return StoreError::Refused(format!(
                "authentication failed (check the user and password of the redis url): {e}"
            ))
        }
        "NOPERM" => {
            return StoreError::Refused(format!(
                "permission denied (the redis user needs EVALSHA, EVAL and SCRIPT LOAD, \
                 i.e. the @scripting category, and access to the store's keys): {e}"
            ))
        }
        "BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY" => {
            return StoreError::Unavailable(e.to_string())
        }
        _ => {}
    }
    match e.kind() {
        ErrorKind::AuthenticationFailed => StoreError::Refused(format!(
            "authentication failed (check the user and password of the redis url): {e}"
        )),
        ErrorKind::Server(ServerErrorKind::NoPerm) => StoreError::Refused(format!(
            "permission denied (the redis user needs the @scripting commands): {e}"
        )),
        ErrorKind::InvalidClientConfig => StoreError::Refused(e.to_string()),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly,
        ) => StoreError::Unavailable(e.to_string()),
        ErrorKind::Server(_) | ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            StoreError::Protocol(e.to_string())
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://:hunter2@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://ada:hunter2@host/"), "redis://ada:***@host/");
        assert_eq!(redact("redis://token@host"), "redis://***@host");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "not a url");
    }
}
