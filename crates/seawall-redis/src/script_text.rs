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
/// every script under that).
pub(crate) fn source(parts: &[&str]) -> String {
    let mut out = String::new();
    for line in parts.iter().flat_map(|p| p.lines()) {
        let code = line.trim_start();
        if code.is_empty() || code.starts_with("--") {
            continue;
        }
        tighten(code, &mut out);
        out.push('\n');
    }
    out
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
