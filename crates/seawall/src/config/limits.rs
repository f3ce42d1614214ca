//! Bounds on a configuration file, checked before it is parsed: its size,
//! and how deep its collections nest (a scan of the text that costs one
//! pass, where a parser given 200 KB of `[[[[...` may take minutes).

use super::source::line_column;
use super::{Format, LoadError, Location};

/// The largest configuration file, in bytes (1 MiB).
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// The deepest nesting of collections in a configuration file. A pipeline's
/// settings nest 5 deep at most (`pipelines`, the name, the policy, a
/// nested table such as `budget`, its fields).
pub(crate) const MAX_DEPTH: u32 = 32;

/// Refuses a text larger than [`MAX_BYTES`] or nesting deeper than
/// [`MAX_DEPTH`].
pub(crate) fn check(origin: &str, format: Format, text: &str) -> Result<(), LoadError> {
    if text.len() > MAX_BYTES {
        return Err(too_large(origin, text.len() as u64));
    }
    match too_deep(format, text) {
        Some(offset) => Err(LoadError::TooDeep {
            location: Location::new(origin.to_owned(), Some(line_column(text, offset))),
            limit: MAX_DEPTH,
        }),
        None => Ok(()),
    }
}

/// The refusal of a text of `size` bytes.
pub(crate) fn too_large(origin: &str, size: u64) -> LoadError {
    LoadError::TooLarge {
        location: Location::new(origin.to_owned(), None),
        size,
        limit: MAX_BYTES as u64,
    }
}

/// A quoted string the scan is inside.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    /// `"..."`: backslash escapes.
    Double,
    /// `'...'`: YAML doubles the quote to escape it, TOML has no escape.
    Single,
    /// TOML's `"""..."""`.
    TripleDouble,
    /// TOML's `'''...'''`.
    TripleSingle,
}

/// The byte offset where the nesting first exceeds [`MAX_DEPTH`], if it
/// does.
///
/// The depth is over-estimated, never under: flow collections (`[`, `{`)
/// outside strings and comments, plus, in YAML, the levels of indentation
/// of the block structure and the `- ` indicators that open sequences on
/// one line. Quotes and brackets in the middle of a YAML plain scalar
/// (`it's`, `a[b`) are text, not structure; block scalars (`|`, `>`) are
/// skipped.
fn too_deep(format: Format, text: &str) -> Option<usize> {
    let yaml = format == Format::Yaml;
    let b = text.as_bytes();
    let mut flow: u32 = 0;
    let mut quote: Option<Quote> = None;
    // YAML: the indentations of the open block levels, and the indentation
    // of a line that opened a block scalar.
    let mut indents: Vec<usize> = Vec::new();
    let mut block_scalar: Option<usize> = None;
    let mut start = 0;
    while start < b.len() {
        let end = b[start..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(b.len(), |n| start + n);
        let line = &b[start..end];
        let indent = line.iter().take_while(|&&c| c == b' ').count();
        let rest = &line[indent..];
        let blank = rest.iter().all(|c| c.is_ascii_whitespace()) || rest.first() == Some(&b'#');
        let mut block: u32 = 0;
        if yaml && quote.is_none() && flow == 0 {
            if let Some(opened) = block_scalar {
                if blank || indent > opened {
                    start = end + 1;
                    continue;
                }
                block_scalar = None;
            }
            if !blank {
                while indents.last().is_some_and(|&i| i > indent) {
                    indents.pop();
                }
                if indents.last() != Some(&indent) {
                    indents.push(indent);
                }
            }
            block = indents.len() as u32;
            if block > MAX_DEPTH {
                return Some(start + indent);
            }
        }
        // The last significant byte before the current one on this line
        // (`None` at its start), whether only `- ` indicators came before,
        // and the YAML sequences they open.
        let mut previous: Option<u8> = None;
        let mut indicators = true;
        let mut dashes: u32 = 0;
        let mut j = 0;
        while j < line.len() {
            let c = line[j];
            let at = start + j;
            if let Some(q) = quote {
                let closes = |s: &[u8]| line[j..].starts_with(s);
                match q {
                    Quote::Double if c == b'\\' => j += 1,
                    Quote::Double if c == b'"' => quote = None,
                    Quote::Single if c == b'\'' => {
                        if yaml && line.get(j + 1) == Some(&b'\'') {
                            j += 1;
                        } else {
                            quote = None;
                        }
                    }
                    Quote::TripleDouble if c == b'\\' => j += 1,
                    Quote::TripleDouble if closes(b"\"\"\"") => {
                        quote = None;
                        j += 2;
                    }
                    Quote::TripleSingle if closes(b"'''") => {
                        quote = None;
                        j += 2;
                    }
                    _ => {}
                }
                if quote.is_none() {
                    previous = Some(c);
                }
                j += 1;
                continue;
            }
            if c == b' ' || c == b'\t' || c == b'\r' {
                j += 1;
                continue;
            }
            if c == b'#' && (j == 0 || matches!(line[j - 1], b' ' | b'\t')) {
                break;
            }
            // In YAML outside flow collections, a quote or a bracket is
            // structure only where a value starts.
            let starts_value = !yaml
                || flow > 0
                || matches!(
                    previous,
                    None | Some(b':' | b'-' | b'?' | b',' | b'[' | b'{')
                );
            let is_dash_indicator = yaml
                && flow == 0
                && indicators
                && c == b'-'
                && matches!(line.get(j + 1), None | Some(b' ' | b'\t' | b'\r'));
            if is_dash_indicator {
                dashes += 1;
                if block + dashes > MAX_DEPTH {
                    return Some(at);
                }
            } else {
                indicators = false;
            }
            match c {
                b'"' | b'\'' if starts_value => {
                    let triple =
                        !yaml && line[j..].starts_with(if c == b'"' { b"\"\"\"" } else { b"'''" });
                    quote = Some(match (c, triple) {
                        (b'"', false) => Quote::Double,
                        (b'"', true) => Quote::TripleDouble,
                        (_, false) => Quote::Single,
                        (_, true) => Quote::TripleSingle,
                    });
                    if triple {
                        j += 2;
                    }
                }
                b'[' | b'{' if starts_value => {
                    flow += 1;
                    if block + dashes + flow > MAX_DEPTH {
                        return Some(at);
                    }
                }
                b']' | b'}' if !yaml || flow > 0 => flow = flow.saturating_sub(1),
                _ => {}
            }
            previous = Some(c);
            j += 1;
        }
        if yaml && quote.is_none() && flow == 0 && opens_block_scalar(line) {
            block_scalar = Some(indent);
        }
        start = end + 1;
    }
    None
}

/// `true` when a YAML line ends (before any comment) with a block scalar
/// header: `|` or `>`, with chomping and indentation indicators.
fn opens_block_scalar(line: &[u8]) -> bool {
    let text = match line
        .windows(2)
        .position(|w| matches!(w[0], b' ' | b'\t') && w[1] == b'#')
    {
        Some(n) => &line[..n],
        None => line,
    };
    let last = text
        .split(|c| c.is_ascii_whitespace())
        .rfind(|t| !t.is_empty())
        .unwrap_or_default();
    matches!(last.first(), Some(b'|' | b'>'))
        && last[1..]
            .iter()
            .all(|c| matches!(c, b'-' | b'+' | b'0'..=b'9'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(format: Format, text: &str) -> bool {
        too_deep(format, text).is_none()
    }

    #[test]
    fn ordinary_files_pass() {
        let yaml = "default:\n  retry: { max_attempts: 3, delay: 100ms }\npipelines:\n  payments:\n    policies: [timeout, retry]\n    # a comment with [[[[ brackets\n    description: \"it's [[[[[[\"\n    note: it's a[b{c\n    circuit_breaker:\n      - a\n      - - b\n";
        assert!(depth_ok(Format::Yaml, yaml));
        let toml = "[default.retry]\nmax_attempts = 3 # [[[[\n[[pipelines.x]]\na = \"[[[[\\\"[[\"\nb = '''\n[[[[[[[[\n'''\nc = [[1], [2]]\n";
        assert!(depth_ok(Format::Toml, toml));
    }

    #[test]
    fn block_scalars_are_text() {
        let text = format!(
            "a: |\n{}\nb: 1\n",
            "  [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n".repeat(3)
        );
        assert!(depth_ok(Format::Yaml, &text));
    }

    #[test]
    fn nesting_past_the_limit_is_found_where_it_crosses() {
        let deep = MAX_DEPTH as usize;
        assert!(depth_ok(
            Format::Yaml,
            &format!("x: {}", "[".repeat(deep - 1))
        ));
        assert_eq!(
            too_deep(Format::Yaml, &format!("x: {}", "[".repeat(deep + 5))),
            Some(3 + deep - 1)
        );
        assert!(too_deep(Format::Toml, &format!("x = {}", "{ a = ".repeat(deep + 1))).is_some());
        assert!(too_deep(Format::Yaml, &"- ".repeat(deep + 1)).is_some());
        let indented: String = (0..=deep)
            .map(|i| format!("{}a:\n", " ".repeat(i)))
            .collect();
        assert_eq!(
            too_deep(Format::Yaml, &indented).map(|o| line_column(&indented, o)),
            Some((deep + 1, deep + 1))
        );
    }
}
