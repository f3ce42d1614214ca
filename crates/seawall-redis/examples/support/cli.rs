//! The command line of the examples, parsed with `lexopt`: a bad argument
//! is reported with the usage (exit status 2), `-h`/`--help` prints it.

pub(crate) use lexopt::prelude::*;
pub(crate) use lexopt::{Error, Parser};

/// Prints the usage and exits (for `-h`/`--help`).
pub(crate) fn help(name: &str, usage: &str) -> ! {
    println!("usage: {name} {usage}");
    std::process::exit(0)
}

/// What parsing gave, or the error with the usage and exit status 2.
pub(crate) fn or_usage<T>(name: &str, usage: &str, parsed: Result<T, Error>) -> T {
    parsed.unwrap_or_else(|e| {
        eprintln!("{name}: {e}\nusage: {name} {usage}");
        std::process::exit(2)
    })
}
