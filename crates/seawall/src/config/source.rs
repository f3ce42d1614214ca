//! Reading the file, parsing it with field paths and positions, and finding
//! the position of a key for errors found after parsing.

use std::fmt;
use std::path::Path;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::raw::RawFile;
use super::{limits, Format, LoadError, Location};
use crate::error::ConfigError;

/// Reads a configuration file and tells its format by its extension; a
/// file larger than [`limits::MAX_BYTES`] is refused without being read
/// whole.
pub(crate) fn read(path: &Path) -> Result<(Format, String), LoadError> {
    use std::io::Read;

    let format = Format::from_path(path).ok_or_else(|| LoadError::UnknownFormat {
        path: path.to_owned(),
    })?;
    let io = |source| LoadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut text = String::new();
    file.take(limits::MAX_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() > limits::MAX_BYTES {
        let size = std::fs::metadata(path).map_or(text.len() as u64, |m| m.len());
        return Err(limits::too_large(&path.display().to_string(), size));
    }
    Ok((format, text))
}

/// Parses a whole file, with the path of the failing field and its
/// position in errors.
///
/// A text larger than [`limits::MAX_BYTES`] or nesting deeper than
/// [`limits::MAX_DEPTH`] is refused before it is parsed.
pub(crate) fn parse(origin: &str, format: Format, text: &str) -> Result<RawFile, LoadError> {
    limits::check(origin, format, text)?;
    match format {
        Format::Toml => {
            let de = toml::de::Deserializer::parse(text)
                .map_err(|e| toml_error(origin, text, String::new(), &e))?;
            serde_path_to_error::deserialize(de).map_err(|e| {
                let field = field_path(e.path());
                toml_error(origin, text, field, e.inner())
            })
        }
        Format::Yaml => {
            if is_blank_yaml(text) {
                return Ok(RawFile::default());
            }
            let de = serde_norway::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                let field = field_path(e.path());
                yaml_error(origin, text, field, e.inner())
            })
        }
    }
}

/// A YAML document with nothing but blank lines and comments: no pipelines.
fn is_blank_yaml(text: &str) -> bool {
    text.lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#') || l == "---"
    })
}

fn field_path(path: &serde_path_to_error::Path) -> String {
    let s = path.to_string();
    if s == "." {
        String::new()
    } else {
        s
    }
}

fn toml_error(origin: &str, text: &str, field: String, e: &toml::de::Error) -> LoadError {
    LoadError::Parse {
        location: Location::new(
            origin.to_owned(),
            e.span().map(|s| line_column(text, s.start)),
        ),
        field,
        message: e.message().trim_end().to_owned(),
    }
}

fn yaml_error(origin: &str, text: &str, field: String, e: &serde_norway::Error) -> LoadError {
    // An error at the end of a text without a final newline is placed by
    // the parser on the line after the last one: report the end itself.
    let position = e.location().map(|l| {
        let (line, column) = (l.line(), l.column());
        let end = line_column(text, text.len());
        if line > end.0 {
            end
        } else {
            (line, column)
        }
    });
    LoadError::Parse {
        location: Location::new(origin.to_owned(), position),
        message: yaml_message(e, &field),
        field,
    }
}

/// The YAML parser's message without the position (reported apart) and without
/// its own, shorter field path (ours is more precise).
fn yaml_message(e: &serde_norway::Error, field: &str) -> String {
    let mut msg = e.to_string();
    if let Some(l) = e.location() {
        let suffix = format!(" at line {} column {}", l.line(), l.column());
        if let Some(stripped) = msg.strip_suffix(&suffix) {
            msg = stripped.to_owned();
        }
    }
    if let Some((prefix, rest)) = msg.split_once(": ") {
        if !prefix.is_empty() && !prefix.contains(' ') && field.starts_with(prefix) {
            msg = rest.to_owned();
        }
    }
    msg
}

/// The 1-based line and column (in characters) of a byte offset.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let mut start = offset;
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let before = &text[..start];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

// ------------------------------------------------------------------ locate

/// Where the key a builder error names is: in the pipeline's entry, else in
/// `default` (inherited), else the section, else the pipeline's entry.
pub(crate) fn locate_config_error(
    format: Format,
    text: &str,
    pipeline: &str,
    error: &ConfigError,
    overall_timeout_invalid: bool,
) -> Option<(usize, usize)> {
    let keys = error_keys(error, overall_timeout_invalid);
    let own = ["pipelines", pipeline];
    for candidate in &keys {
        for prefix in [&own[..], &["default"][..]] {
            let path: Vec<&str> = prefix
                .iter()
                .copied()
                .chain(candidate.iter().copied())
                .collect();
            if let Some(p) = locate(format, text, &path) {
                return Some(p);
            }
        }
    }
    locate(format, text, &own)
}

/// The keys (relative to a pipeline entry) a builder error may refer to,
/// most precise first.
fn error_keys(error: &ConfigError, overall_timeout_invalid: bool) -> Vec<Vec<&'static str>> {
    let field: Vec<&'static str> = error.field.split('.').collect();
    match error.policy {
        "pipeline" => match error.field {
            "partition_idle" => vec![vec!["partition_idle"]],
            "name" => vec![],
            // A handler registered in code, named in the entry.
            named @ ("classifier" | "fallback" | "fallback_on") => vec![vec![named]],
            // `policies` itself, or a policy named by an ordering rule.
            other => vec![vec!["policies"], vec![other]],
        },
        "timeout" => {
            let key = if overall_timeout_invalid {
                "timeout"
            } else {
                "attempt_timeout"
            };
            vec![vec![key, "duration"], vec![key]]
        }
        "store" => vec![],
        // A policy written in code, listed in `policies`: its position or
        // its name.
        _ if matches!(error.field, "position" | "name") => vec![vec!["policies"]],
        policy => {
            let mut full = vec![policy];
            full.extend(field);
            let mut keys = Vec::new();
            while full.len() > 1 {
                keys.push(full.clone());
                full.pop();
            }
            keys.push(full);
            keys
        }
    }
}

/// The position of the value at `path` (map keys from the root), or `None`
/// when there is no such key.
pub(crate) fn locate(format: Format, text: &str, path: &[&str]) -> Option<(usize, usize)> {
    match format {
        Format::Toml => {
            let de = toml::de::Deserializer::parse(text).ok()?;
            let e = Probe { path }.deserialize(de).err()?;
            if !e.message().contains(FOUND) {
                return None;
            }
            e.span().map(|s| line_column(text, s.start))
        }
        Format::Yaml => {
            let de = serde_norway::Deserializer::from_str(text);
            let e = Probe { path }.deserialize(de).err()?;
            if !e.to_string().contains(FOUND) {
                return None;
            }
            e.location().map(|l| (l.line(), l.column()))
        }
    }
}

/// The text of the error a probe raises when it reaches its target.
const FOUND: &str = "<seawall: key found>";

/// Walks maps along a path and fails, with the parser's position, on the
/// value at its end.
struct Probe<'p> {
    path: &'p [&'p str],
}

impl<'de> DeserializeSeed<'de> for Probe<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.path {
            [] => d.deserialize_any(Found),
            _ => d.deserialize_map(self),
        }
    }
}

impl<'de> Visitor<'de> for Probe<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((first, rest)) = self.path.split_first() else {
            return Ok(());
        };
        while let Some(key) = map.next_key::<String>()? {
            if key == *first {
                return map.next_value_seed(Probe { path: rest });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }
}

/// Refuses every value: each `visit_*` fails with [`FOUND`], raised while
/// the parser still holds the value's position.
struct Found;

impl Visitor<'_> for Found {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(FOUND)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column() {
        let t = "a\nbc\n\u{e9}d";
        assert_eq!(line_column(t, 0), (1, 1));
        assert_eq!(line_column(t, 3), (2, 2));
        assert_eq!(line_column(t, 7), (3, 2));
        assert_eq!(line_column(t, 99), (3, 3));
    }

    #[test]
    fn a_yaml_error_at_the_end_is_placed_at_the_end() {
        let text = "pipelines:\n  a:\n    retry: { delay: 1s";
        let e = parse("<string>", Format::Yaml, text).unwrap_err();
        assert_eq!(e.line(), Some(3), "{e}");
        assert_eq!(e.location().unwrap().column, Some(23), "{e}");
    }

    #[test]
    fn locates_keys_in_both_formats() {
        let toml = "[pipelines.a]\ntimeout = \"1s\"\n\n[pipelines.a.retry]\nmax_attempts = 0\n";
        assert_eq!(
            locate(
                Format::Toml,
                toml,
                &["pipelines", "a", "retry", "max_attempts"]
            ),
            Some((5, 16))
        );
        assert_eq!(
            locate(Format::Toml, toml, &["pipelines", "a", "bulkhead"]),
            None
        );
        assert_eq!(
            locate(Format::Toml, toml, &["pipelines", "a", "timeout", "x"]),
            None
        );
        let yaml = "pipelines:\n  a:\n    timeout: 1s\n    retry:\n      max_attempts: 0\n";
        assert_eq!(
            locate(
                Format::Yaml,
                yaml,
                &["pipelines", "a", "retry", "max_attempts"]
            ),
            Some((5, 21))
        );
        assert_eq!(locate(Format::Yaml, yaml, &["pipelines", "b"]), None);
    }
}
