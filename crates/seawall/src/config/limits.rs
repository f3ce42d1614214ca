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
/// one line. In YAML a quote or a bracket opens a string or a collection
/// only where a node starts (after an anchor or a tag, if any), or anywhere
/// inside a flow collection: inside a plain scalar (`it's`, `see [1]`) it
/// is text. Block scalars (`|`, `>`) are skipped.
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
        // YAML outside flow collections: whether a node starts here (at the
        // start of the line, after `- `, `key: ` or `? `), whether only `- `
        // indicators came before on this line, and the sequences they open.
        let mut node_starts = true;
        let mut indicators = true;
        let mut dashes: u32 = 0;
        let mut previous: Option<u8> = None;
        let mut j = 0;
        while j < line.len() {
            let c = line[j];
            let at = start + j;
            let next = line.get(j + 1).copied();
            let separated = |n: Option<u8>| matches!(n, None | Some(b' ' | b'\t' | b'\r'));
            if let Some(q) = quote {
                let closes = |s: &[u8]| line[j..].starts_with(s);
                match q {
                    Quote::Double | Quote::TripleDouble if c == b'\\' => j += 1,
                    Quote::Double if c == b'"' => quote = None,
                    Quote::Single if c == b'\'' => {
                        if yaml && next == Some(b'\'') {
                            j += 1;
                        } else {
                            quote = None;
                        }
                    }
                    Quote::TripleDouble if closes(b"\"\"\"") => {
                        quote = None;
                        j += 2;
                    }
                    Quote::TripleSingle if closes(b"\'\'\'") => {
                        quote = None;
                        j += 2;
                    }
                    _ => {}
                }
                previous = Some(c);
                j += 1;
                continue;
            }
            if c == b'#' && (j == 0 || matches!(previous, Some(b' ' | b'\t'))) {
                break;
            }
            let token_start = separated(previous)
                || (flow > 0 && matches!(previous, Some(b'[' | b'{' | b',' | b':')));
            let mut opens = |q: Quote| quote = Some(q);
            if !yaml {
                match c {
                    b'"' if line[j..].starts_with(b"\"\"\"") => {
                        opens(Quote::TripleDouble);
                        j += 2;
                    }
                    b'\'' if line[j..].starts_with(b"\'\'\'") => {
                        opens(Quote::TripleSingle);
                        j += 2;
                    }
                    b'"' => opens(Quote::Double),
                    b'\'' => opens(Quote::Single),
                    b'[' | b'{' => {
                        flow += 1;
                        if flow > MAX_DEPTH {
                            return Some(at);
                        }
                    }
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    _ => {}
                }
            } else if flow > 0 {
                // Inside a flow collection brackets are always structure.
                match c {
                    b'[' | b'{' => {
                        flow += 1;
                        if block + dashes + flow > MAX_DEPTH {
                            return Some(at);
                        }
                    }
                    b']' | b'}' => {
                        flow -= 1;
                        node_starts = false;
                    }
                    b'"' if token_start => opens(Quote::Double),
                    b'\'' if token_start => opens(Quote::Single),
                    _ => {}
                }
            } else if c == b' ' || c == b'\t' || c == b'\r' {
                // Separation.
            } else if indicators && c == b'-' && separated(next) {
                dashes += 1;
                if block + dashes > MAX_DEPTH {
                    return Some(at);
                }
                node_starts = true;
            } else {
                indicators = false;
                if node_starts && token_start {
                    match c {
                        // An anchor or a tag: the node follows.
                        b'&' | b'!' => {
                            while j + 1 < line.len() && !separated(line.get(j + 1).copied()) {
                                j += 1;
                            }
                        }
                        b'[' | b'{' => {
                            flow += 1;
                            if block + dashes + flow > MAX_DEPTH {
                                return Some(at);
                            }
                        }
                        b'"' => {
                            opens(Quote::Double);
                            node_starts = false;
                        }
                        b'\'' => {
                            opens(Quote::Single);
                            node_starts = false;
                        }
                        // A complex key or its value: the node follows.
                        b'?' | b':' if separated(next) => {}
                        // The start of a document: its node may follow.
                        b'-' if j == 0
                            && line.starts_with(b"---")
                            && separated(line.get(3).copied()) =>
                        {
                            j += 2;
                        }
                        // A plain scalar (a key, or a value).
                        _ => node_starts = false,
                    }
                } else if c == b':' && separated(next) {
                    node_starts = true;
                }
            }
            previous = line.get(j).copied();
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
    fn brackets_after_anchors_and_tags_count_and_those_in_plain_scalars_do_not() {
        let deep = MAX_DEPTH as usize;
        let anchored = format!("x: {}", "&a [".repeat(deep + 1));
        assert!(too_deep(Format::Yaml, &anchored).is_some());
        let tagged = format!("x: !!seq {}", "[".repeat(deep + 1));
        assert!(too_deep(Format::Yaml, &tagged).is_some());
        let document = format!("--- {}", "[".repeat(deep + 1));
        assert!(too_deep(Format::Yaml, &document).is_some());
        let explicit = format!("? a\n: {}", "[".repeat(deep + 1));
        assert!(too_deep(Format::Yaml, &explicit).is_some());
        assert!(too_deep(Format::Yaml, &tagged).is_some());
        let keyed = format!("- \"k\": {}", "{a: ".repeat(deep + 1));
        assert!(too_deep(Format::Yaml, &keyed).is_some());
        let plain = "a: see [1 and [2 and [3\n".repeat(deep + 1);
        assert!(depth_ok(Format::Yaml, &plain));
        let quotes = "a: don't 'quote [[[[\nb: 'it''s [[['\n".repeat(deep + 1);
        assert!(depth_ok(Format::Yaml, &quotes));
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
