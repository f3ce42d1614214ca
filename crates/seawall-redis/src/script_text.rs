//! The text of a script as it is sent to the server. A file of its own, with
//! no dependency, so that the `script_breakdown` example replays exactly
//! what the crate sends.

/// The text of a script sent to the server: `parts` without their comment
/// lines, blank lines and indentation (the scripts have no multi-line
/// strings). Kept short because a server that requires a
/// password refuses an argument over 16 KiB from a client that has not
/// authenticated yet with a protocol error, before it can say that the
/// password is missing (a test holds every script under that).
pub(crate) fn source(parts: &[&str]) -> String {
    let mut out = String::new();
    for line in parts.iter().flat_map(|p| p.lines()) {
        let code = line.trim_start();
        if code.is_empty() || code.starts_with("--") {
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}
