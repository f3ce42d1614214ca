//! The configuration loader never panics: valid TOML and YAML files are
//! mutated (numbers to extremes, durations such as "584942417355y", negative
//! values, huge strings, lines dropped, doubled, swapped or cut) and loaded
//! through `Config::parse` and the registry; each load returns a
//! configuration or a typed `LoadError`, and the pipelines of a file that
//! loads run a call. The mutations are drawn from a fixed seed, so a failure
//! names a mutant that can be replayed.
#![cfg(feature = "serde")]

use std::time::Duration;

use seawall::config::{Config, Format, LoadError, Registry};
use seawall::testing::{SeededRandom, VirtualClock};
use seawall::{MemoryStore, Random};

const FIXTURE_TOML: &str = include_str!("fixtures/seawall.toml");
const FIXTURE_YAML: &str = include_str!("fixtures/seawall.yaml");

/// A file that sets every other field the fixtures leave out.
const MORE_TOML: &str = r#"
[default.circuit_breaker]
consecutive_failures = 3
cooldown = "10s"

[pipelines.a]
policies = ["retry", "circuit_breaker", "bulkhead"]
retry = { backoff = "exponential", delay = "1ms", multiplier = 1.5, cap = "1s", jitter = "100%" }
circuit_breaker = { count_window = 10, failure_rate = 1.0, minimum_calls = 1, half_open_calls = 3 }
bulkhead = { max_concurrent = 1, max_queued = 1, max_wait = "1ns", lease = "2h" }

[pipelines.b]
timeout = { duration = "1ns", strict = false }
rate_limiter = { algorithm = "gcra", limit = 4294967295, period = "5s", burst = 1 }
cooldown = {}
"#;

const MORE_YAML: &str = r#"
default:
  circuit_breaker: { consecutive_failures: 3, cooldown: 10s }
pipelines:
  a:
    policies: [retry, circuit_breaker, bulkhead]
    retry: { backoff: exponential, delay: 1ms, multiplier: 1.5, cap: 1s, jitter: "100%" }
    circuit_breaker: { count_window: 10, failure_rate: 1.0, minimum_calls: 1, half_open_calls: 3 }
    bulkhead: { max_concurrent: 1, max_queued: 1, max_wait: 1ns, lease: 2h }
  b:
    timeout: { duration: 1ns, strict: false }
    rate_limiter: { algorithm: gcra, limit: 4294967295, period: 5s, burst: 1 }
    cooldown: {}
"#;

const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1",
    "2",
    "4294967295",
    "4294967296",
    "-4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "99999999999999999999999999999999999999",
    "1e309",
    "-1e309",
    "1e-320",
    "1.7976931348623157e308",
    "nan",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    ".nan",
    ".inf",
    "-.inf",
    "0.0",
    "-0.0",
    "0.5",
    "1.0000000000000002",
    "100.0",
    "1000.5",
    "1000000",
    "1000001",
    "3600",
    "3601",
    "0x10",
    "0o7",
    "1_000",
    "1e3",
    "true",
];

const DURATIONS: &[&str] = &[
    "0s",
    "0ns",
    "1ns",
    "999ms",
    "1s",
    "3600s",
    "3601s",
    "1h 1s",
    "584942417355y",
    "584942417354y",
    "584y",
    "18446744073709551615ns",
    "18446744073709551616ns",
    "18446744073709551615s",
    "18446744073709551615us",
    "213503982334d",
    "2562047788015215h",
    "1000000000000000000000h",
    "-1s",
    "-0s",
    "1.5s",
    "1s1ns",
    "5",
    "s",
    "",
    " ",
    "1 fortnight",
    "nan s",
];

fn pick<'a>(r: &SeededRandom, from: &[&'a str]) -> &'a str {
    from[(r.next_u64() % from.len() as u64) as usize]
}

fn below(r: &SeededRandom, n: usize) -> usize {
    (r.next_u64() % n.max(1) as u64) as usize
}

/// The words of `text`: maximal runs of characters that make up numbers,
/// durations, names and keys, with their byte ranges.
fn words(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        let part = c.is_ascii_alphanumeric() || "._%+-".contains(c);
        match (part, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, text.len()));
    }
    out
}

/// One mutation of `text`.
fn mutate(r: &SeededRandom, text: &str) -> String {
    let ws = words(text);
    let lines: Vec<&str> = text.lines().collect();
    match below(r, 12) {
        // A value replaced by an extreme of its kind (or of another kind).
        0..=6 if !ws.is_empty() => {
            let (s, e) = ws[below(r, ws.len())];
            let word = &text[s..e];
            let starts_with_digit = word.starts_with(|c: char| c.is_ascii_digit());
            let is_number = word.parse::<f64>().is_ok();
            let replacement: String = match below(r, 10) {
                0 => "9".repeat(1 + below(r, 20_000)),
                1 => format!("{}s", "9".repeat(1 + below(r, 5_000))),
                2 => "x".repeat(below(r, 100_000)),
                3 => pick(r, NUMBERS).to_owned(),
                4 => pick(r, DURATIONS).to_owned(),
                _ if is_number => pick(r, NUMBERS).to_owned(),
                _ if starts_with_digit => pick(r, DURATIONS).to_owned(),
                _ => match below(r, 3) {
                    0 => word.to_uppercase(),
                    1 => format!("{word}_"),
                    _ => "\u{1F30A}".repeat(1 + below(r, 50)),
                },
            };
            format!("{}{}{}", &text[..s], replacement, &text[e..])
        }
        // A line dropped.
        7 if !lines.is_empty() => {
            let i = below(r, lines.len());
            let mut l = lines.clone();
            l.remove(i);
            l.join("\n")
        }
        // A line doubled (a duplicate key or table).
        8 if !lines.is_empty() => {
            let i = below(r, lines.len());
            let mut l = lines.clone();
            l.insert(i, lines[i]);
            l.join("\n")
        }
        // Two lines swapped.
        9 if lines.len() > 1 => {
            let (i, j) = (below(r, lines.len()), below(r, lines.len()));
            let mut l = lines.clone();
            l.swap(i, j);
            l.join("\n")
        }
        // The file cut short.
        10 => {
            let mut at = below(r, text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text[..at].to_owned()
        }
        // Stray syntax inserted.
        _ => {
            const STRAY: &[&str] = &[
                "[",
                "]",
                "{",
                "}",
                "[[",
                "]]",
                ":",
                "- ",
                "\t",
                "=",
                "\"",
                "'",
                "&a ",
                "*a",
                "<<: ",
                "!!binary ",
                "---\n",
                "...\n",
                "#",
                "\0",
                "\r",
                "\\u{0}",
                "? ",
            ];
            let mut at = below(r, text.len() + 1);
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            format!("{}{}{}", &text[..at], pick(r, STRAY), &text[at..])
        }
    }
}

/// Loads `text` both ways and, when it loads, runs a call on every pipeline.
/// Returns whether it loaded.
fn load(format: Format, text: &str) -> bool {
    let parsed = Config::parse(format, text);
    let clock = VirtualClock::starting_at(Duration::from_secs(1_000_000));
    let registry = Registry::builder()
        .store(MemoryStore::new())
        .clock(clock.clone())
        .random(SeededRandom::new(1))
        .load_str(format, text);
    match (&parsed, &registry) {
        (Ok(_), Ok(_)) => {}
        // A registry refuses a configuration without pipelines.
        (Ok(config), Err(LoadError::Empty { .. })) if config.names().next().is_none() => {
            return false;
        }
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string());
            check_error(a, text);
        }
        // A mutated name in `policies` may name a policy written in code:
        // the file parses, and a registry that registers none refuses it at
        // the list.
        (Ok(_), Err(e @ LoadError::Invalid { error, .. }))
            if error.field == "policies"
                && error.rule.contains(
                    "which is neither a policy of the file nor a policy registered in code",
                ) =>
        {
            check_error(e, text);
            return false;
        }
        (a, b) => panic!(
            "Config::parse and the registry disagree: {:?} / {:?}",
            a.as_ref().err(),
            b.as_ref().err()
        ),
    }
    let Ok(registry) = registry else {
        return false;
    };
    for name in registry.names() {
        let p = registry.pipeline(&name).unwrap();
        let mut n = 0;
        let _ = p.call(|_| {
            n += 1;
            if n < 2 {
                Err("down")
            } else {
                Ok(n)
            }
        });
    }
    // A reload with the same text is accepted, one with garbage refused.
    assert!(registry.reload_str(format, text).is_ok());
    true
}

/// A load error is typed, displays, and points inside the file.
fn check_error(e: &LoadError, text: &str) {
    assert!(matches!(
        e,
        LoadError::Parse { .. } | LoadError::Invalid { .. } | LoadError::TooDeep { .. }
    ));
    assert!(!e.to_string().is_empty());
    if let Some(line) = e.line() {
        // The end of the text is on the line after its last newline.
        let last = text.matches('\n').count() as u32 + 1;
        assert!(line >= 1 && line <= last, "line {line} of {last}: {e}");
    }
}

/// Mutants of `base`, each 1 to 3 mutations deep, loaded one by one; any
/// panic is collected with the mutant's number and a prefix of its text.
fn fuzz(format: Format, base: &str, seed: u64, mutants: usize) {
    assert!(load(format, base), "the base file must load");
    let r = SeededRandom::new(seed);
    let mut panics = Vec::new();
    let mut loaded = 0;
    for i in 0..mutants {
        let mut text = base.to_owned();
        for _ in 0..1 + below(&r, 3) {
            text = mutate(&r, &text);
        }
        match std::panic::catch_unwind(|| load(format, &text)) {
            Ok(true) => loaded += 1,
            Ok(false) => {}
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let shown: String = text.chars().take(2000).collect();
                panics.push(format!("mutant {i} (seed {seed}): {msg}\n{shown}\n"));
            }
        }
    }
    assert!(
        panics.is_empty(),
        "{} of {mutants} {format} mutants panicked:\n{}",
        panics.len(),
        panics.join("\n-----\n")
    );
    // Mutants that still load are exercised too.
    assert!(loaded > mutants / 50, "{loaded} of {mutants} loaded");
}

#[test]
fn mutated_toml_fixture_loads_or_is_refused() {
    fuzz(Format::Toml, FIXTURE_TOML, 1, 4000);
}

#[test]
fn mutated_yaml_fixture_loads_or_is_refused() {
    fuzz(Format::Yaml, FIXTURE_YAML, 2, 4000);
}

#[test]
fn mutated_toml_of_the_other_fields_loads_or_is_refused() {
    fuzz(Format::Toml, MORE_TOML, 3, 3000);
}

#[test]
fn mutated_yaml_of_the_other_fields_loads_or_is_refused() {
    fuzz(Format::Yaml, MORE_YAML, 4, 3000);
}

/// Every numeric and duration value of every field, set to every extreme
/// on its own: the exhaustive counterpart of the random mutants.
#[test]
fn every_field_at_every_extreme_loads_or_is_refused() {
    for (format, base) in [
        (Format::Toml, FIXTURE_TOML),
        (Format::Toml, MORE_TOML),
        (Format::Yaml, FIXTURE_YAML),
        (Format::Yaml, MORE_YAML),
    ] {
        let mut panics = Vec::new();
        for (s, e) in words(base) {
            let word = &base[s..e];
            let extremes: &[&str] = if word.parse::<f64>().is_ok() {
                NUMBERS
            } else if word.starts_with(|c: char| c.is_ascii_digit()) {
                DURATIONS
            } else {
                continue;
            };
            for x in extremes {
                let text = format!("{}{}{}", &base[..s], x, &base[e..]);
                if let Err(p) = std::panic::catch_unwind(|| load(format, &text)) {
                    let msg = p.downcast_ref::<String>().cloned().unwrap_or_default();
                    panics.push(format!("{word} -> {x}: {msg}"));
                }
            }
        }
        assert!(panics.is_empty(), "{format}:\n{}", panics.join("\n"));
    }
}

#[test]
fn deeply_nested_and_aliased_documents_are_refused() {
    let deep = 2_000;
    for (format, text) in [
        (
            Format::Toml,
            format!("x = {}{}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (
            Format::Toml,
            format!("x = {}{}", "{ a = ".repeat(deep), "}".repeat(deep)),
        ),
        (
            Format::Yaml,
            format!("x: {}{}", "[".repeat(deep), "]".repeat(deep)),
        ),
        (Format::Yaml, "- ".repeat(deep)),
        (
            Format::Yaml,
            // Aliases that would expand to 10^9 nodes.
            (1..10).fold(
                "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned(),
                |t, i| {
                    let prev = format!("*a{}", i - 1);
                    let list = vec![prev; 10].join(", ");
                    format!("{t}a{i}: &a{i} [{list}]\n")
                },
            ),
        ),
        (Format::Toml, "a".repeat(1 << 20)),
    ] {
        assert!(!load(format, &text), "{format} loaded");
    }
    // A huge name (within the size limit of a file) is only a name (YAML
    // refuses implicit keys over 1024 characters).
    let name = "p".repeat(1 << 19);
    assert!(load(Format::Toml, &format!("[pipelines.{name}]\n")));
    assert!(!load(
        Format::Yaml,
        &format!("pipelines:\n  {name}: {{}}\n")
    ));
}

/// 200 KB of nested sequences, in each way YAML (and TOML) can nest them,
/// is refused before it is parsed, as too deep, with the position where the
/// limit is crossed.
#[test]
fn two_hundred_kilobytes_of_nesting_are_refused_before_parsing() {
    const SIZE: usize = 200 * 1024;
    let indented: String = (0..)
        .map(|i| format!("{}- \n", " ".repeat(i)))
        .scan(0, |len, line| {
            *len += line.len();
            (*len <= SIZE).then_some(line)
        })
        .collect();
    let cases = [
        (Format::Yaml, format!("x: {}", "[".repeat(SIZE))),
        (Format::Yaml, format!("x: {}", "{a: ".repeat(SIZE / 4))),
        (
            Format::Yaml,
            format!("x: {}", "&a !!seq [".repeat(SIZE / 10)),
        ),
        (Format::Yaml, format!("--- {}", "[".repeat(SIZE))),
        (Format::Yaml, "- ".repeat(SIZE / 2)),
        (Format::Yaml, format!("pipelines:\n{indented}")),
        (Format::Toml, format!("x = {}", "[".repeat(SIZE))),
        (Format::Toml, format!("x = {}", "{ a = ".repeat(SIZE / 6))),
    ];
    for (format, text) in &cases {
        let started = std::time::Instant::now();
        let e = Config::parse(*format, text).expect_err("refused");
        let took = started.elapsed();
        eprintln!("{format} {} bytes: {took:?}: {e}", text.len());
        assert!(matches!(e, LoadError::TooDeep { limit: 32, .. }), "{e:?}");
        assert!(e.to_string().contains("nest more than 32 deep"), "{e}");
        let at = e.location().unwrap();
        assert!(at.line.is_some() && at.column.is_some(), "{e}");
    }
}

/// A file over the size limit is refused without being parsed, read from a
/// string or from a file.
#[test]
fn a_file_over_one_mebibyte_is_refused() {
    let text = format!(
        "# {}\n[pipelines.a]\ntimeout = \"1s\"\n",
        "x".repeat(1 << 20)
    );
    for format in [Format::Toml, Format::Yaml] {
        let e = Config::parse(format, &text).unwrap_err();
        assert!(
            matches!(e, LoadError::TooLarge { limit: 1048576, .. }),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "<string>: the file has {} bytes; a configuration file may have at most 1048576",
                text.len()
            )
        );
    }
    let path = std::env::temp_dir().join(format!("seawall-{}-large.toml", std::process::id()));
    std::fs::write(&path, &text).unwrap();
    let e = Config::from_file(&path).unwrap_err();
    let _ = std::fs::remove_file(&path);
    assert!(
        matches!(e, LoadError::TooLarge { size, .. } if size == text.len() as u64),
        "{e:?}"
    );
}
