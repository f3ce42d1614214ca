//! Command-line arguments.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use lexopt::prelude::*;

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    /// The live run: flaky service, two groups of clients, summary.
    Live(LiveOptions),
    /// The thundering-herd simulation on the virtual clock.
    Herd(HerdOptions),
    /// The place-order saga, its compensations and its recovery.
    Saga(SagaOptions),
    /// The store as three services talking through Redis Streams.
    Choreography(ChoreographyOptions),
    /// The second process of `--redis`, started by the first.
    Second(SecondOptions),
    /// Print this text and exit.
    Help(&'static str),
}

/// Options of the live run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveOptions {
    /// Length of the run (the five phases share it).
    pub(crate) duration: Duration,
    /// Concurrent clients in each group.
    pub(crate) clients: usize,
    /// Keep the pipeline's state in Redis and share it with a second process.
    pub(crate) redis: Option<RedisMode>,
    /// Serve the live page on this port of 127.0.0.1 (0: any free port).
    pub(crate) web: Option<u16>,
}

/// Which Redis `--redis` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisMode {
    /// A `redis-server` of the demo's own, on a free loopback port.
    Own,
    /// The server at this URL.
    Url(String),
}

/// The port of the live page when `--web` comes without `--port`.
pub(crate) const DEFAULT_PORT: u16 = 7800;

/// Options of the second process of `--redis` (`--role second`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SecondOptions {
    /// Length of the first process's run (the timings derive from it).
    pub(crate) duration: Duration,
    /// Concurrent protected clients.
    pub(crate) clients: usize,
    /// The flaky service of the first process.
    pub(crate) service: SocketAddr,
    /// The Redis holding the shared state.
    pub(crate) redis_url: String,
    /// The key prefix of the shared state.
    pub(crate) prefix: String,
    /// When the first process's run started, in milliseconds since the Unix epoch.
    pub(crate) since_unix_ms: u64,
    /// Paint the output (the first process's stdout is a terminal).
    pub(crate) colour: bool,
}

/// Options of `herd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HerdOptions {
    /// Clients failing at the same instant.
    pub(crate) clients: usize,
    /// Seed of the random source of the jitter.
    pub(crate) seed: u64,
    /// Where the SVG chart goes.
    pub(crate) out: PathBuf,
}

/// Options of `saga`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SagaOptions {
    /// The SQLite file of the saga log and of the shop (`None`: a fresh
    /// temporary file, removed at the end).
    pub(crate) db: Option<PathBuf>,
    /// Orders in the batch.
    pub(crate) orders: u32,
    /// Kill the process right after this many effects (`None`: never).
    pub(crate) crash_after: Option<u32>,
}

/// Options of `choreography`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChoreographyOptions {
    /// Orders placed.
    pub(crate) orders: u32,
}

/// A bad command line; the message is one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageError(pub(crate) String);

impl From<lexopt::Error> for UsageError {
    fn from(e: lexopt::Error) -> Self {
        UsageError(e.to_string())
    }
}

const MAIN_HELP: &str = "\
Watch seawall protect callers from a flaky HTTP service, live.

Usage: seawall-demo [OPTIONS]
       seawall-demo --web [--port N] [OPTIONS]
       seawall-demo --redis [--redis-url URL] [OPTIONS]
       seawall-demo herd [--clients N] [--seed S] [--out FILE]
       seawall-demo saga [--db FILE] [--orders N] [--crash-after N]
       seawall-demo choreography [--orders N]

The service (on 127.0.0.1) is healthy, then fails with 503, then answers too
slowly, then throttles with 429 + Retry-After, then is healthy again. Two
groups of clients call it side by side: one plain, one through a seawall
pipeline (retry, circuit breaker, timeout, bulkhead, cooldown, fallback).

Options:
      --duration <SECS>  length of the run, 5..=3600 [default: 60]
      --clients <N>      concurrent clients per group, 1..=256 [default: 16]
      --web              also serve a live page on 127.0.0.1: requests per
                         second, the circuit, the answers, latencies, the herd
      --port <N>         the page's port, 0 for any free one [default: 7800]
      --redis            keep the pipeline's state in Redis (a redis-server of
                         its own, on a free loopback port) and, once the
                         circuit opens, start a second process with the same
                         pipeline: it is refused by the shared circuit
      --redis-url <URL>  use this Redis instead (implies --redis)
  -h, --help             print this help

Internal: `--role second --service ADDR --redis-url URL --prefix P
--since-unix-ms MS` is how --redis starts its second process.

Commands:
  herd   N clients fail at once and retry: no jitter vs +/-20 % vs full jitter
  saga   a place-order saga with compensations, killed halfway and recovered
  choreography  stock, payment and shipping as services over Redis Streams
";

const HERD_HELP: &str = "\
N clients fail at the same instant and retry with exponential backoff
(1 s, 2 s, 4 s) on seawall's virtual clock, three ways: no jitter, +/-20 %
jitter, full jitter. Prints the peak of retries per 100 ms and draws them.

Usage: seawall-demo herd [OPTIONS]

Options:
      --clients <N>  clients that fail at once, 1..=1000000 [default: 1000]
      --seed <S>     seed of the jitter's random source [default: 42]
      --out <FILE>   where to write the SVG chart [default: herd.svg]
  -h, --help         print this help
";

const SAGA_HELP: &str = "\
Places a batch of orders, each a saga (reserve stock, charge payment,
schedule shipping) logged in a SQLite file, next to the shop's own table of
effects. Shipping fails for some orders: their payment and reservation are
compensated, in reverse order.

On a new log, the batch first runs in a child process that kills itself
halfway (std::process::abort, right after an effect and before the log
records it); then this process recovers the log and finishes the batch,
and no effect is applied twice. By hand: run with --db and --crash-after,
then again with the same --db.

Usage: seawall-demo saga [OPTIONS]

Options:
      --db <FILE>          the SQLite file [default: a temporary file]
      --orders <N>         orders in the batch, 1..=1000 [default: 6]
      --crash-after <N>    abort right after the N-th effect of this process
  -h, --help               print this help
";

const CHOREOGRAPHY_HELP: &str = "\
The store as three services (stock, payment, shipping), each with its own
SQLite database, outbox relay and inbox, talking only through Redis Streams:
stock reserves, payment charges, shipping ships or cancels; on a
cancellation payment refunds and stock releases, each on its own. Prints a
line per effect per service and a CHOREOGRAPHY summary line (JSON).

Needs redis-server on PATH: starts its own on a free loopback port.

Usage: seawall-demo choreography [OPTIONS]

Options:
      --orders <N>  orders placed, 1..=1000 [default: 10]
  -h, --help        print this help
";

/// Parses the arguments of the process.
///
/// # Errors
/// An unknown option, a missing or malformed value, a value out of range.
pub(crate) fn parse() -> Result<Command, UsageError> {
    parse_from(std::env::args_os().skip(1))
}

/// Parses `args` (without the program name).
pub(crate) fn parse_from(
    args: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<Command, UsageError> {
    let mut parser = lexopt::Parser::from_args(args);
    let mut live = LiveOptions {
        duration: Duration::from_secs(60),
        clients: 16,
        redis: None,
        web: None,
    };
    let (mut web, mut port, mut redis, mut redis_url) = (false, None, false, None);
    let mut second = SecondArgs::default();
    let mut first = true;
    while let Some(arg) = parser.next()? {
        match arg {
            Value(command) if first && command == "herd" => return parse_herd(parser),
            Value(command) if first && command == "saga" => return parse_saga(parser),
            Value(command) if first && command == "choreography" => {
                return parse_choreography(parser)
            }
            Short('h') | Long("help") => return Ok(Command::Help(MAIN_HELP)),
            Long("duration") => {
                live.duration = Duration::from_secs(number(&mut parser, "--duration", 5..=3600)?);
            }
            Long("clients") => live.clients = number(&mut parser, "--clients", 1..=256)?,
            Long("web") => web = true,
            Long("port") => port = Some(number(&mut parser, "--port", 0..=u16::MAX)?),
            Long("redis") => redis = true,
            Long("redis-url") => redis_url = Some(parser.value()?.string()?),
            Long("role") => second.role = Some(parser.value()?.string()?),
            Long("service") => second.service = Some(parser.value()?.string()?),
            Long("prefix") => second.prefix = Some(parser.value()?.string()?),
            Long("since-unix-ms") => {
                second.since = Some(number(&mut parser, "--since-unix-ms", 0..=u64::MAX)?);
            }
            Long("colour") => second.colour = true,
            _ => return Err(arg.unexpected().into()),
        }
        first = false;
    }
    if second.role.is_some() {
        if web || port.is_some() || redis {
            return Err(UsageError(
                "'--role second' takes no '--web', '--port' or '--redis'".to_owned(),
            ));
        }
        return second.finish(&live, redis_url).map(Command::Second);
    }
    if let Some(option) = second.stray() {
        return Err(UsageError(format!(
            "option '{option}' is only for '--role second'"
        )));
    }
    live.web = match (web, port) {
        (true, port) => Some(port.unwrap_or(DEFAULT_PORT)),
        (false, None) => None,
        (false, Some(_)) => return Err(UsageError("option '--port' needs '--web'".to_owned())),
    };
    live.redis = match (redis, redis_url) {
        (_, Some(url)) => Some(RedisMode::Url(url)),
        (true, None) => Some(RedisMode::Own),
        (false, None) => None,
    };
    Ok(Command::Live(live))
}

/// The options of `--role second`, as they come.
#[derive(Debug, Default)]
struct SecondArgs {
    role: Option<String>,
    service: Option<String>,
    prefix: Option<String>,
    since: Option<u64>,
    colour: bool,
}

impl SecondArgs {
    /// The first option given that only `--role second` takes.
    fn stray(&self) -> Option<&'static str> {
        [
            (self.service.is_some(), "--service"),
            (self.prefix.is_some(), "--prefix"),
            (self.since.is_some(), "--since-unix-ms"),
            (self.colour, "--colour"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }

    fn finish(
        self,
        live: &LiveOptions,
        redis_url: Option<String>,
    ) -> Result<SecondOptions, UsageError> {
        let role = self.role.unwrap_or_default();
        if role != "second" {
            return Err(UsageError(format!(
                "invalid value '{role}' for option '--role': expected 'second'"
            )));
        }
        let (Some(service), Some(redis_url), Some(prefix), Some(since_unix_ms)) =
            (self.service, redis_url, self.prefix, self.since)
        else {
            return Err(UsageError(
                "'--role second' needs '--service', '--redis-url', '--prefix' and '--since-unix-ms'"
                    .to_owned(),
            ));
        };
        let service = service.parse().map_err(|_| {
            UsageError(format!(
                "invalid value '{service}' for option '--service': expected IP:PORT"
            ))
        })?;
        Ok(SecondOptions {
            duration: live.duration,
            clients: live.clients,
            service,
            redis_url,
            prefix,
            since_unix_ms,
            colour: self.colour,
        })
    }
}

fn parse_herd(mut parser: lexopt::Parser) -> Result<Command, UsageError> {
    let mut herd = HerdOptions {
        clients: crate::herd::DEFAULT_CLIENTS,
        seed: crate::herd::DEFAULT_SEED,
        out: PathBuf::from("herd.svg"),
    };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(HERD_HELP)),
            Long("clients") => herd.clients = number(&mut parser, "--clients", 1..=1_000_000)?,
            Long("seed") => herd.seed = number(&mut parser, "--seed", 0..=u64::MAX)?,
            Long("out") => herd.out = parser.value()?.into(),
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Command::Herd(herd))
}

fn parse_saga(mut parser: lexopt::Parser) -> Result<Command, UsageError> {
    let mut saga = SagaOptions {
        db: None,
        orders: 6,
        crash_after: None,
    };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(SAGA_HELP)),
            Long("db") => saga.db = Some(parser.value()?.into()),
            Long("orders") => saga.orders = number(&mut parser, "--orders", 1..=1000)?,
            Long("crash-after") => {
                saga.crash_after = Some(number(&mut parser, "--crash-after", 1..=100_000)?);
            }
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Command::Saga(saga))
}

fn parse_choreography(mut parser: lexopt::Parser) -> Result<Command, UsageError> {
    let mut options = ChoreographyOptions { orders: 10 };
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help(CHOREOGRAPHY_HELP)),
            Long("orders") => options.orders = number(&mut parser, "--orders", 1..=1000)?,
            _ => return Err(arg.unexpected().into()),
        }
    }
    Ok(Command::Choreography(options))
}

/// The value of option `name`, a number in `range`.
fn number<T>(
    parser: &mut lexopt::Parser,
    name: &str,
    range: std::ops::RangeInclusive<T>,
) -> Result<T, UsageError>
where
    T: FromStr + PartialOrd + std::fmt::Display,
{
    let raw = parser.value()?.string()?;
    match raw.parse::<T>() {
        Ok(n) if range.contains(&n) => Ok(n),
        _ => Err(UsageError(format!(
            "invalid value '{raw}' for option '{name}': expected a whole number in {}..={}",
            range.start(),
            range.end()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, UsageError> {
        parse_from(args.iter().copied())
    }

    #[test]
    fn defaults() {
        let Ok(Command::Live(live)) = parse(&[]) else {
            panic!()
        };
        assert_eq!(
            (live.duration, live.clients, live.redis, live.web),
            (Duration::from_secs(60), 16, None, None)
        );
        let Ok(Command::Herd(herd)) = parse(&["herd"]) else {
            panic!()
        };
        assert_eq!(
            (herd.clients, herd.seed, herd.out),
            (1000, 42, PathBuf::from("herd.svg"))
        );
    }

    #[test]
    fn choreography_options() {
        assert_eq!(
            parse(&["choreography"]),
            Ok(Command::Choreography(ChoreographyOptions { orders: 10 }))
        );
        assert_eq!(
            parse(&["choreography", "--orders", "40"]),
            Ok(Command::Choreography(ChoreographyOptions { orders: 40 }))
        );
        assert!(parse(&["choreography", "--orders", "1001"]).is_err());
        assert!(parse(&["choreography", "--db", "x"]).is_err());
    }

    #[test]
    fn options_are_read() {
        let Ok(Command::Live(live)) =
            parse(&["--duration", "12", "--redis-url=redis://127.0.0.1/"])
        else {
            panic!()
        };
        assert_eq!(live.duration, Duration::from_secs(12));
        assert_eq!(
            live.redis,
            Some(RedisMode::Url("redis://127.0.0.1/".to_owned()))
        );
        let Ok(Command::Herd(herd)) =
            parse(&["herd", "--clients", "10", "--seed=7", "--out", "x.svg"])
        else {
            panic!()
        };
        assert_eq!(
            (herd.clients, herd.seed, herd.out),
            (10, 7, PathBuf::from("x.svg"))
        );
    }

    #[test]
    fn web_and_redis_flags() {
        let live = |args: &[&str]| match parse(args) {
            Ok(Command::Live(live)) => (live.web, live.redis),
            other => panic!("{args:?}: {other:?}"),
        };
        assert_eq!(live(&["--web"]), (Some(DEFAULT_PORT), None));
        assert_eq!(live(&["--web", "--port", "0"]), (Some(0), None));
        assert_eq!(
            live(&["--redis", "--port=9000", "--web"]),
            (Some(9000), Some(RedisMode::Own))
        );
        assert_eq!(
            live(&["--redis-url", "redis://h/", "--redis"]),
            (None, Some(RedisMode::Url("redis://h/".to_owned())))
        );
        assert_eq!(
            parse(&["--port", "9000"]).unwrap_err().0,
            "option '--port' needs '--web'"
        );
        assert!(parse(&["--web", "--port", "65536"]).is_err());
        // `--redis` takes no value: a URL after it is a stray argument.
        assert!(parse(&["--redis", "redis://h/"]).is_err());
    }

    #[test]
    fn the_second_process_is_started_with_its_role() {
        let args = [
            "--role",
            "second",
            "--service",
            "127.0.0.1:4000",
            "--redis-url",
            "redis://127.0.0.1:5000",
            "--prefix",
            "p",
            "--since-unix-ms",
            "1700000000000",
            "--duration",
            "10",
            "--clients",
            "4",
        ];
        let Ok(Command::Second(second)) = parse(&args) else {
            panic!()
        };
        assert_eq!(
            second,
            SecondOptions {
                duration: Duration::from_secs(10),
                clients: 4,
                service: "127.0.0.1:4000".parse().unwrap(),
                redis_url: "redis://127.0.0.1:5000".to_owned(),
                prefix: "p".to_owned(),
                since_unix_ms: 1_700_000_000_000,
                colour: false,
            }
        );
        assert!(parse(&args[..8]).is_err(), "no --since-unix-ms");
        assert!(parse(&["--role", "third"]).is_err());
        assert!(parse(&[&args[..], &["--web"]].concat()).is_err());
        assert_eq!(
            parse(&["--prefix", "p"]).unwrap_err().0,
            "option '--prefix' is only for '--role second'"
        );
        let mut bad = args;
        bad[3] = "localhost";
        assert!(parse(&bad).unwrap_err().0.contains("IP:PORT"));
    }

    #[test]
    fn bad_input_is_one_line() {
        for args in [
            &["--nope"][..],
            &["--duration", "0"],
            &["--duration", "ten"],
            &["--duration"],
            &["herd", "--duration", "5"],
            &["--duration", "5", "herd"],
            &["saga", "--orders", "0"],
            &["--port", "1"],
            &["--role", "second"],
            &["--service", "x"],
        ] {
            let e = parse(args).unwrap_err();
            assert!(!e.0.contains('\n') && !e.0.is_empty(), "{args:?}: {e:?}");
        }
        assert_eq!(parse(&["--nope"]).unwrap_err().0, "invalid option '--nope'");
    }
}
