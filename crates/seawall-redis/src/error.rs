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

/// A connection URL as it may be shown, and the secrets it holds.
///
/// The one place that decides what of a URL is shown: the builder's and
/// the store's `Debug`, [`RedisStoreError::InvalidUrl`], every error
/// message and log line that names the server. Well-formed or not, the
/// URL is read as `scheme:` (if any), slashes, then everything up to the
/// **last** `@` as credentials (a password may hold `@`, `:`, `/`, `?`
/// or `#` unencoded), then host, path, query and fragment. Shown are the
/// scheme, the user name (when it is plain: no `@`, `/`, `?`, `#`), the
/// host, port and path, the query parameters `db` and `protocol`; every
/// other credential, query value or fragment (but `#insecure`) becomes
/// `***`.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Redacted {
    shown: String,
    /// The hidden parts, as written and percent-decoded; at least
    /// [`Redacted::SHORTEST`] characters each.
    secrets: Vec<String>,
}

impl Redacted {
    /// Secrets shorter than this are not looked for in messages (a
    /// one-letter password would blank out every such letter, and tells
    /// nothing where it shows).
    const SHORTEST: usize = 3;

    pub(crate) fn new(url: &str) -> Redacted {
        let mut secrets = Vec::new();
        let (scheme, rest) = split_scheme(url);
        let body = rest.trim_start_matches(['/', '\\']);
        let slashes = &rest[..rest.len() - body.len()];
        let mut shown = String::with_capacity(url.len());
        shown.push_str(scheme);
        shown.push_str(slashes);
        let after = match body.rfind('@') {
            Some(at) => {
                let userinfo = &body[..at];
                match userinfo.split_once(':') {
                    // (An empty password: the whole user part may be a
                    // token that holds a `:`, so it is not shown.)
                    Some((user, password))
                        if !user.contains(['@', '/', '?', '#']) && !password.is_empty() =>
                    {
                        shown.push_str(user);
                        shown.push_str(":***");
                        secrets.push(password.to_owned());
                    }
                    _ => {
                        // A user alone may be a token; an odd one is not shown.
                        shown.push_str("***");
                        secrets.push(userinfo.to_owned());
                        if let Some((user, password)) = userinfo.split_once(':') {
                            secrets.push(user.to_owned());
                            secrets.push(password.to_owned());
                        }
                    }
                }
                &body[at..]
            }
            None => body,
        };
        let (before_fragment, fragment) = match after.split_once('#') {
            Some((b, f)) => (b, Some(f)),
            None => (after, None),
        };
        let (address, query) = match before_fragment.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (before_fragment, None),
        };
        shown.push_str(address);
        if let Some(query) = query {
            shown.push('?');
            for (i, pair) in query.split(['&', ';']).enumerate() {
                if i > 0 {
                    shown.push('&');
                }
                let (key, value) = match pair.split_once('=') {
                    Some((k, v)) => (k, Some(v)),
                    None => (pair, None),
                };
                let plain = ["db", "protocol"].contains(&key.to_ascii_lowercase().as_str());
                match value {
                    Some(v) if plain => {
                        shown.push_str(key);
                        shown.push('=');
                        shown.push_str(v);
                    }
                    Some(v) => {
                        shown.push_str(key);
                        shown.push_str("=***");
                        secrets.push(v.to_owned());
                    }
                    None if plain => shown.push_str(key),
                    None => {
                        shown.push_str("***");
                        secrets.push(pair.to_owned());
                    }
                }
            }
        }
        match fragment {
            Some("insecure") => shown.push_str("#insecure"),
            Some(f) => {
                shown.push_str("#***");
                secrets.push(f.to_owned());
            }
            None => {}
        }
        let decoded: Vec<String> = secrets.iter().map(|s| percent_decode(s)).collect();
        secrets.extend(decoded);
        secrets.retain(|s| s.chars().count() >= Self::SHORTEST);
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redacted { shown, secrets }
    }

    /// The URLs of a cluster's nodes: shown as `cluster [url, …]`, each
    /// as [`Redacted::new`] shows it, every one's secrets kept out.
    pub(crate) fn list(urls: &[String]) -> Redacted {
        let parts: Vec<Redacted> = urls.iter().map(|u| Redacted::new(u)).collect();
        let shown = format!(
            "cluster [{}]",
            parts
                .iter()
                .map(Redacted::shown)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let mut secrets: Vec<String> = parts.into_iter().flat_map(|p| p.secrets).collect();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets.dedup();
        Redacted { shown, secrets }
    }

    /// The URL as it may be shown.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with every secret of the URL replaced by `***`: for messages
    /// of other libraries, which may quote what they were given.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), "***");
            }
        }
        out
    }

    /// [`scrub`](Self::scrub) for the message of a [`StoreError`].
    pub(crate) fn scrub_error(&self, e: StoreError) -> StoreError {
        if self.secrets.is_empty() {
            return e;
        }
        match e {
            StoreError::Unavailable(m) => StoreError::Unavailable(self.scrub(&m)),
            StoreError::Refused(m) => StoreError::Refused(self.scrub(&m)),
            StoreError::Protocol(m) => StoreError::Protocol(self.scrub(&m)),
            other => other,
        }
    }
}

/// Shows only what [`Redacted::shown`] does.
impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.shown, f)
    }
}

impl std::fmt::Display for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// `scheme:` and the rest, when the URL starts with a scheme
/// (`ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":"`).
fn split_scheme(url: &str) -> (&str, &str) {
    if let Some(colon) = url.find(':') {
        let scheme = &url[..colon];
        let mut chars = scheme.chars();
        if chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            return url.split_at(colon + 1);
        }
    }
    ("", url)
}

/// `%XX` sequences decoded (invalid ones and invalid UTF-8 kept as they are).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
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
                 i.e. the @scripting category, which also holds FUNCTION LOAD and FCALL, \
                 and access to the store's keys): {e}"
            ))
        }
        // `MOVED` and `ASK` reach here only once the cluster client's own
        // redirections are spent: the cluster is changing hands (a
        // failover), as much an outage as a node that is down.
        "BUSY" | "LOADING" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN" | "READONLY" | "MOVED"
        | "ASK" => return StoreError::Unavailable(e.to_string()),
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
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
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

    fn redact(url: &str) -> String {
        Redacted::new(url).shown
    }

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://:hunter2@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(redact("redis://ada:hunter2@host/"), "redis://ada:***@host/");
        assert_eq!(redact("redis://token@host"), "redis://***@host");
        assert_eq!(redact("redis://tok:@host"), "redis://***@host");
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "not a url");
        assert_eq!(redact("redis:/ada:secret@host"), "redis:/ada:***@host");
        assert_eq!(
            redact("redis://ada:p@ss/w@rd@host:1/0"),
            "redis://ada:***@host:1/0"
        );
        assert_eq!(
            redact("redis+unix:///tmp/r.sock?db=1&pass=secret"),
            "redis+unix:///tmp/r.sock?db=1&pass=***"
        );
        assert_eq!(
            redact("rediss://h/?protocol=3#insecure"),
            "rediss://h/?protocol=3#insecure"
        );
        assert_eq!(redact("redis://h/#secret"), "redis://h/#***");
        assert_eq!(redact("ada:secret@host:6379"), "ada:***@host:6379");
    }

    #[test]
    fn scrub_finds_the_password_as_written_and_decoded() {
        let r = Redacted::new("redis://ada:p%40ss%2Fword@host");
        assert_eq!(r.scrub("x p%40ss%2Fword y p@ss/word z"), "x *** y *** z");
        assert_eq!(r.shown(), "redis://ada:***@host");
    }
}
