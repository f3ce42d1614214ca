//! Errors of configuration loading.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::error::ConfigError;

/// Where in a configuration an error is: the file (or `<string>`), and the
/// line and column when known (1-based). Displays as `file:line:column`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Location {
    /// The file's path as given, or `<string>`.
    pub origin: String,
    /// The line, from 1.
    pub line: Option<u32>,
    /// The column, from 1, in characters.
    pub column: Option<u32>,
}

impl Location {
    pub(crate) fn new(origin: String, position: Option<(usize, usize)>) -> Self {
        let narrow = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        Location {
            origin,
            line: position.map(|p| narrow(p.0)),
            column: position.map(|p| narrow(p.1)),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.origin)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The error of the file system.
        #[source]
        source: io::Error,
    },
    /// The file's extension is none of `.toml`, `.yaml`, `.yml`.
    #[error("{}: unknown configuration format: expected a .toml, .yaml or .yml file", .path.display())]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },
    /// Bad syntax, an unknown field, a value of the wrong type, a bad
    /// duration or an unknown policy name.
    #[error("{location}: {}{message}", field_prefix(.field))]
    Parse {
        /// Where.
        location: Location,
        /// The dotted path of the field, e.g. `pipelines.payments.retry.delay`
        /// (empty when the error is not inside a field).
        field: String,
        /// What is wrong, as the parser says it.
        message: String,
    },
    /// The pipeline builder refused a value, or the `policies` list does not
    /// match the sections.
    #[error("{location}: pipeline `{pipeline}`: {error}")]
    Invalid {
        /// Where: the offending key, in the pipeline's entry or in `default`.
        location: Location,
        /// The pipeline.
        pipeline: String,
        /// The builder's error, naming the policy, the field and the rule.
        error: ConfigError,
    },
    /// The configuration has no pipeline, and the registry was not told to
    /// accept that ([`RegistryBuilder::allow_empty`](super::RegistryBuilder::allow_empty)).
    #[error("{location}: no pipeline is configured: an empty configuration is refused (the registry keeps its pipelines; `RegistryBuilder::allow_empty` accepts it)")]
    Empty {
        /// The file (or `<string>`), without a line.
        location: Location,
    },
    /// The file is larger than a configuration file may be.
    #[error(
        "{location}: the file has {size} bytes; a configuration file may have at most {limit}"
    )]
    TooLarge {
        /// The file (or `<string>`), without a line.
        location: Location,
        /// Its size in bytes (at least; reading stops past the limit).
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// Collections nest deeper than a configuration file may, found by a
    /// scan of the text before it is parsed.
    #[error("{location}: collections nest more than {limit} deep; a configuration file may nest at most {limit} deep")]
    TooDeep {
        /// Where the limit is crossed.
        location: Location,
        /// The deepest nesting allowed.
        limit: u32,
    },
}

fn field_prefix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

impl LoadError {
    /// Where the error is, for every error but [`Io`](Self::Io) and
    /// [`UnknownFormat`](Self::UnknownFormat).
    pub fn location(&self) -> Option<&Location> {
        match self {
            LoadError::Parse { location, .. }
            | LoadError::Invalid { location, .. }
            | LoadError::Empty { location }
            | LoadError::TooLarge { location, .. }
            | LoadError::TooDeep { location, .. } => Some(location),
            LoadError::Io { .. } | LoadError::UnknownFormat { .. } => None,
        }
    }

    /// The line of the error, when known (1-based).
    pub fn line(&self) -> Option<u32> {
        self.location().and_then(|l| l.line)
    }
}

/// No pipeline of the name asked for is configured, or (for an untyped
/// lookup) it is configured with a classifier or a fallback, and is only
/// handed out typed by [`Registry::typed`](super::Registry::typed).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnknownPipeline {
    /// The name asked for.
    pub name: String,
    /// The names that are configured, sorted.
    pub configured: Vec<String>,
    /// The kind of the pipeline when it is configured with named handlers
    /// (the untyped lookup is refused): e.g.
    /// `seawall::pipeline::kind::ErrorType<my::HttpError>`.
    pub typed: Option<String>,
}

impl fmt::Display for UnknownPipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.typed {
            Some(kind) => write!(
                f,
                "pipeline `{}` names handlers registered in code (a classifier, a fallback or a policy): it is a `Pipeline<{kind}>`, look it up with `Registry::typed`",
                self.name
            ),
            None => write!(
                f,
                "no pipeline named `{}` is configured (configured: {})",
                self.name,
                list(&self.configured)
            ),
        }
    }
}

impl std::error::Error for UnknownPipeline {}

/// Why [`Registry::typed`](super::Registry::typed) could not hand out a
/// pipeline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// No pipeline of that name is configured.
    #[error(transparent)]
    Unknown(UnknownPipeline),
    /// The pipeline is of another kind than the one asked for: its entry
    /// names other handlers (or none), or handlers of other types.
    #[error("pipeline `{name}` is a `Pipeline<{configured}>`, not a `Pipeline<{asked}>`: its configured classifier and fallback decide its kind")]
    Kind {
        /// The pipeline.
        name: String,
        /// The kind it is configured as (a type name).
        configured: String,
        /// The kind asked for (a type name).
        asked: String,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
