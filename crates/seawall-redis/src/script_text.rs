//! The text of a script as it is sent to the server. A file of its own, with
//! no dependency, so that the `script_breakdown` example replays exactly
//! what the crate sends.

use std::fmt::Write as _;

/// The text of a script sent to the server: `parts` without their comment
/// lines, blank lines and indentation, and without the spaces after a
/// comma and around the operators (see `tighten`) outside string literals
/// (the scripts have no multi-line strings nor long brackets). Kept short
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
/// a comma, around `=`, `==`, `~=`, `<=`, `>=`, `<`, `>`, `+`, `-`, `*`,
/// `/`, `%`, `^` and `..`. No token can join its neighbours into another:
/// a `-` before another `-` keeps its spaces (else `a - -b` would become a
/// comment), so does a `..` after a digit (`1 .. x` would become a
/// malformed number), and text inside a quoted string (with its escapes)
/// is kept as it is.
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
                // A space before an operator, with the spaces after it:
                // dropped (the two-character operators first).
                let rest = &line[i..];
                let token = OPERATORS
                    .into_iter()
                    .find(|t| rest.starts_with(t))
                    .filter(|t| !(*t == " - " && rest[t.len()..].starts_with('-')))
                    .filter(|t| !(*t == " .. " && out.ends_with(|c: char| c.is_ascii_digit())));
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

/// The operators whose surrounding spaces `tighten` drops, each with its
/// spaces (the two-character ones before the one-character ones they begin
/// with).
const OPERATORS: [&str; 14] = [
    " == ", " ~= ", " <= ", " >= ", " .. ", " = ", " < ", " > ", " + ", " - ", " * ", " / ", " % ",
    " ^ ",
];

/// What a script that starts with the prelude runs first, with the keys
/// and arguments of its call (see `begin` in `lua/prelude.lua`): a call
/// that names a spec the library does not hold ends there, with the error
/// [`SPEC_MISSING`], having done nothing.
const BEGIN: &str = "if begin(KEYS, ARGV) then return redis.error_reply('SEAWALLSPEC the spec \
                     of this call is not held here: send it in full') end\n";

/// The code of the error of a call that named a spec the library does not
/// hold (see `call_args` in `lua/prelude.lua`): the caller sends the call
/// again with its spec in full.
pub(crate) const SPEC_MISSING: &str = "SEAWALLSPEC";

/// The text of a script run by `EVALSHA`: `defs` (the prelude first, when
/// `prelude`, then the functions the body calls), the call of `begin` when
/// `prelude`, then `body`.
pub(crate) fn script(prelude: bool, defs: &[&str], body: &[&str]) -> String {
    let begin: &[&str] = if prelude { &[BEGIN] } else { &[] };
    source(&[defs, begin, body].concat())
}

/// The text of the library `name` (`FUNCTION LOAD`): `defs` (the prelude,
/// and the functions the bodies call), run once, when the library is
/// loaded, then one function per `(function, prelude, body)`, which runs
/// the script [`script`] makes of the same parts: it calls `begin` with its
/// keys and arguments (when `prelude`), then runs `body`.
pub(crate) fn library(name: &str, defs: &[&str], functions: &[(&str, bool, &[&str])]) -> String {
    let heads: Vec<String> = functions
        .iter()
        .map(|(f, _, _)| format!("redis.register_function('{f}', function(KEYS, ARGV)\n"))
        .collect();
    let mut parts: Vec<&str> = defs.to_vec();
    for ((_, prelude, body), head) in functions.iter().zip(&heads) {
        parts.push(head);
        if *prelude {
            parts.push(BEGIN);
        }
        parts.extend_from_slice(body);
        parts.push("\nend)\n");
    }
    format!("#!lua name={name}\n{}", source(&parts))
}

/// What the generic prelude takes its arguments with.
pub(crate) const ARGS_LINE: &str = "  A = call_args(ARGV)\n";

/// `prelude` (the text of `prelude.lua`) with the spec (`ARGV[2..=27]` of
/// the generic scripts, `spec`) compiled in: `A` is `ARGV` as the
/// generic scripts see it, the spec's values in `A[2..=27]` written as
/// constants (plain decimal numbers as numbers, which `tonumber` returns as
/// they are; GCRA's tolerance and interval, or the sliding window's
/// period, as the pairs `upair` would
/// split them into; every other value as the string it is in `ARGV`), and
/// the call's own arguments, `ARGV[2..]`, from `A[28]`.
pub(crate) fn compiled(prelude: &str, spec: &[String]) -> String {
    let mut header = String::from("  A = {ARGV[1]");
    for (i, v) in spec.iter().enumerate() {
        // `A[i + 2]`: the flags and the shadow bits are compared as
        // strings.
        let as_string = matches!(i + 2, 2 | 15 | 18 | 21 | 27);
        let pair = matches!(i + 2, 25 | 26)
            .then(|| v.split_once(':'))
            .flatten()
            .filter(|(u, n)| {
                [u, n]
                    .iter()
                    .all(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
            });
        if let Some((u, n)) = pair {
            let _ = write!(header, ", {{{u}, {n}}}");
        } else if !as_string && is_plain_decimal(v) {
            let _ = write!(header, ", {v}");
        } else {
            let _ = write!(header, ", '{}'", lua_escaped(v));
        }
    }
    // The call's own arguments, `ARGV[2..]`, at `A[28..]`, in the same
    // constructor (one allocation, no resize).
    header.push_str(", unpack(ARGV, 2)}\n");
    assert!(
        prelude.contains(ARGS_LINE),
        "prelude.lua takes ARGV as A in `begin`"
    );
    prelude.replacen(ARGS_LINE, &header, 1)
}

/// `true` for `-?digits(.digits)?`: the same number to Lua's lexer as to
/// `tonumber` (both `strtod`), unlike `inf` or `nan`.
pub(crate) fn is_plain_decimal(v: &str) -> bool {
    let digits = v.strip_prefix('-').unwrap_or(v);
    let (int, frac) = digits.split_once('.').unwrap_or((digits, "0"));
    !int.is_empty()
        && !frac.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && frac.bytes().all(|b| b.is_ascii_digit())
}

/// `v` inside a single-quoted Lua string.
pub(crate) fn lua_escaped(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('\'', "\\'")
        .replace('\n', "\\n")
}
