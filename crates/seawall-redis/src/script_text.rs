//! The text of a script as it is sent to the server. A file of its own, with
//! no dependency, so that the `script_breakdown` example replays exactly
//! what the crate sends.

/// The text of a script sent to the server: `parts` without their comment
/// lines, blank lines and indentation, and without the spaces after a
/// comma and around `=`, `==` and `~=` outside string literals (the
/// scripts have no multi-line strings nor long brackets). Kept short
/// because a server that requires a password refuses an argument over
/// 16 KiB from a client that has not authenticated yet with a protocol
/// error, before it can say that the password is missing (a test holds
/// every script under that). The functions of the shared parts that the
/// script never calls are left out (see `unused`): every function defined
/// costs the server a closure on every call of the script.
pub(crate) fn source(parts: &[&str]) -> String {
    let mut lines: Vec<&str> = parts
        .iter()
        .flat_map(|p| p.lines())
        .filter(|line| {
            let code = line.trim_start();
            !code.is_empty() && !code.starts_with("--")
        })
        .collect();
    while let Some((start, end)) = unused(&lines) {
        lines.drain(start..end);
    }
    let mut out = String::new();
    for line in lines {
        tighten(line.trim_start(), &mut out);
        out.push('\n');
    }
    out
}

/// The lines `start..end` of the first function of the script's top level
/// (`local function name(` at the start of a line, up to its own line or
/// the first `end` at the start of a line) whose name no other line names:
/// a function no code calls.
fn unused(lines: &[&str]) -> Option<(usize, usize)> {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let names = |line: &str, name: &str| {
        line.match_indices(name).any(|(i, _)| {
            let b = line.as_bytes();
            let before = i.checked_sub(1).map(|j| b[j]);
            let after = b.get(i + name.len()).copied();
            !before.is_some_and(word) && !after.is_some_and(word)
        })
    };
    lines.iter().enumerate().find_map(|(start, line)| {
        let rest = line.strip_prefix("local function ")?;
        let name = &rest[..rest.find('(')?];
        let end = if line.ends_with(" end") {
            start + 1
        } else {
            start + 1 + lines[start + 1..].iter().position(|l| *l == "end")? + 1
        };
        let called = lines[..start]
            .iter()
            .chain(&lines[end..])
            .chain(std::iter::once(&&rest[name.len()..]))
            .any(|l| names(l, name));
        (!called).then_some((start, end))
    })
}

/// Appends `line` to `out` without the spaces that separate nothing: after
/// a comma, around `=`, `==` and `~=`. Neither token can join its
/// neighbours into another (no `--` comment, no `..` or number is made),
/// and text inside a quoted string (with its escapes) is kept as it is.
fn tighten(line: &str, out: &mut String) {
    if !line.is_ascii() {
        out.push_str(line);
        return;
    }
    let bytes = line.as_bytes();
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if let Some(q) = quote {
            out.push(b as char);
            if b == b'\\' && i + 1 < bytes.len() {
                out.push(bytes[i + 1] as char);
                i += 2;
                continue;
            }
            if b == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match b {
            b'\'' | b'"' => {
                quote = Some(b);
                out.push(b as char);
                i += 1;
            }
            b',' => {
                out.push(',');
                i += 1;
                while bytes.get(i) == Some(&b' ') {
                    i += 1;
                }
            }
            b' ' => {
                // A space before `=`, `==` or `~=` (not before `<=`, whose
                // `<` stays): dropped, with the spaces after the token.
                let rest = &line[i..];
                let token = [" == ", " ~= ", " = "]
                    .into_iter()
                    .find(|t| rest.starts_with(t));
                match token {
                    Some(t) => {
                        out.push_str(t.trim());
                        i += t.len();
                        while bytes.get(i) == Some(&b' ') {
                            i += 1;
                        }
                    }
                    None => {
                        out.push(' ');
                        i += 1;
                    }
                }
            }
            _ => {
                out.push(b as char);
                i += 1;
            }
        }
    }
}
