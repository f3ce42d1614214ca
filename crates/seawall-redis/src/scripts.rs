//! The Lua scripts, their keys and their arguments.
//!
//! Every script starts with `lua/prelude.lua` and sees the same layout:
//!
//! - `KEYS`: the state hash (circuit and cooldown), the count-window ring
//!   (a string of two-bit codes), the time-window buckets (hash) and their
//!   index (sorted set), the bulkhead leases (sorted set), the rate
//!   limiter's state, the retry budget's bucket. All seven share one hash tag,
//!   `{prefix:resource[:partition]}`, hence one cluster slot.
//! - `ARGV[1]`: the caller's time as `microseconds:nanoseconds` (the
//!   nanoseconds 0..999, which only GCRA uses; the lean success script
//!   takes the microseconds alone), or empty for the server's `TIME` (the
//!   default).
//! - `ARGV[2..=27]`: the resource's spec, encoded once at bind time
//!   ([`SpecArgs`]).
//! - `ARGV[28..]`: the operation's own arguments; an admission that carries
//!   successes (`admit_carrying`) has the records it carries before them:
//!   how many, then the seven arguments of each (see `lua/carry.lua`).
//!
//! Each script runs as a function where the server allows (Redis 7 and
//! later): one library holds them all ([`Scripts::library_load`]), whose
//! definitions run once, when it is loaded; a function sets the prelude's
//! variables for its call (`begin`) and runs its script's body. Else by
//! `EVALSHA`, and then the admission scripts, the most frequent calls, are
//! compiled for each spec ([`SpecScripts`]): the spec is in their text,
//! and the call sends `ARGV[1]` and the operation's arguments only (which
//! the scripts still read as `A[28..]`, `A` standing for `ARGV`).

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::Script;
use seawall::breaker::BreakerMode;
use seawall::rate_limit::RateAlgorithm;
use seawall::store::ResourceSpec;

use crate::script_text::{compiled, library, script};

const PRELUDE: &str = include_str!("lua/prelude.lua");
/// The rule of a silent success, as the Lua function `success(K, A, o)`.
const SUCCESS: &str = include_str!("lua/success.lua");
/// The successes an admission carries, applied by `success`.
const CARRY: &str = include_str!("lua/carry.lua");
/// The admission script.
const ADMIT: &str = include_str!("lua/admit.lua");

/// One script as the server runs it: by `EVALSHA` of its text, or by
/// `FCALL` of its function in the store's library (Redis 7 and later, see
/// [`Scripts::library_load`]). The same Lua either way: the function calls
/// the prelude's `begin` with its keys and arguments, as the script does
/// at its start, and runs the same body; the library's definitions run
/// once, when it is loaded, instead of on every call.
pub(crate) struct Lua {
    script: Script,
    /// Its function's name in the store's library: the library's name and
    /// the script's (see [`Scripts::get`]); empty for a script no library
    /// holds (those compiled for a spec, run by `EVALSHA` only).
    function: String,
    /// `SCRIPT LOAD` of the text.
    pub(crate) script_load: redis::Cmd,
    /// It starts with the prelude (and calls `begin`).
    prelude: bool,
    /// What runs after the definitions.
    body: Vec<&'static str>,
}

impl Lua {
    /// `defs` (the prelude first, if `prelude`, then the functions the
    /// body calls), then `body`, run with the keys and arguments of the
    /// call (see [`script`]).
    fn new(prelude: bool, defs: &[&str], body: &[&'static str]) -> Lua {
        let text = script(prelude, defs, body);
        Lua {
            script: Script::new(&text),
            function: String::new(),
            script_load: script_load(text),
            prelude,
            body: body.to_vec(),
        }
    }

    /// The script's hash (`EVALSHA`).
    pub(crate) fn hash(&self) -> &str {
        self.script.get_hash()
    }
}

/// The scripts that take the spec as arguments, compiled (hashed) once per
/// process; the admission scripts are also compiled for each spec
/// ([`SpecScripts`]), which `EVALSHA` runs: as functions, the spec is an
/// argument (one library for every spec).
pub(crate) struct Scripts {
    pub(crate) record: Lua,
    pub(crate) release: Lua,
    pub(crate) metrics: Lua,
    pub(crate) control: Lua,
    pub(crate) in_flight: Lua,
    /// The lean record of a success that can report nothing (self-contained:
    /// no prelude, see [`SuccessArgs`]).
    pub(crate) success: Lua,
    /// The lease of a batch of rate-limit permits (leased mode): the
    /// admission rule of `admit.lua`, run as a function, and the instant
    /// to give the batch back with (`lua/lease.lua`).
    pub(crate) lease: Lua,
    /// The extension of the bulkhead slots a process holds in leased mode
    /// (`lua/extend.lua`).
    pub(crate) extend: Lua,
    /// The admission, with the spec as arguments.
    pub(crate) admit: Lua,
    /// The admission carrying silent successes, with the spec as
    /// arguments (see [`SpecScripts::admit_carrying`]).
    pub(crate) admit_carrying: Lua,
    /// `SCRIPT LOAD` of every script but the last two (which run as
    /// functions only: by `EVALSHA`, an admission runs its spec's own
    /// script): commands of their own, which a cluster connection routes to
    /// the masters.
    script_loads: Vec<redis::Cmd>,
    /// `FUNCTION LOAD` of the library.
    library_load: redis::Cmd,
}

impl Scripts {
    pub(crate) fn get() -> &'static Scripts {
        static SCRIPTS: OnceLock<Scripts> = OnceLock::new();
        SCRIPTS.get_or_init(|| {
            let with_prelude = |body: &'static str| Lua::new(true, &[PRELUDE], &[body]);
            let mut scripts = Scripts {
                record: with_prelude(include_str!("lua/record.lua")),
                release: with_prelude(include_str!("lua/release.lua")),
                metrics: with_prelude(include_str!("lua/metrics.lua")),
                control: with_prelude(include_str!("lua/control.lua")),
                in_flight: with_prelude(include_str!("lua/in_flight.lua")),
                success: Lua::new(false, &[SUCCESS], &["return success(KEYS, ARGV, 0)\n"]),
                lease: Lua::new(true, &[PRELUDE], &LEASE_BODY),
                extend: with_prelude(include_str!("lua/extend.lua")),
                admit: with_prelude(ADMIT),
                admit_carrying: Lua::new(true, &[PRELUDE, SUCCESS], &[CARRY, ADMIT]),
                script_loads: Vec::new(),
                library_load: redis::Cmd::new(),
            };
            let mut all = [
                ("record", &mut scripts.record),
                ("release", &mut scripts.release),
                ("metrics", &mut scripts.metrics),
                ("control", &mut scripts.control),
                ("in_flight", &mut scripts.in_flight),
                ("success", &mut scripts.success),
                ("lease", &mut scripts.lease),
                ("extend", &mut scripts.extend),
                ("admit", &mut scripts.admit),
                ("admit_carrying", &mut scripts.admit_carrying),
            ];
            // The library is named after the hash of its text, and its
            // functions after the library: a library of that name is this
            // one, and another version's library, holding some of the same
            // scripts, names its functions apart (function names are the
            // server's, across libraries).
            let text = |name: &str, all: &[(&str, &mut Lua)], named: bool| {
                let functions: Vec<(&str, bool, &[&str])> = all
                    .iter()
                    .map(|(n, s)| {
                        let f = if named { s.function.as_str() } else { *n };
                        (f, s.prelude, s.body.as_slice())
                    })
                    .collect();
                library(name, &[PRELUDE, SUCCESS], &functions)
            };
            let hash = Script::new(&text("seawall", &all, false))
                .get_hash()
                .to_owned();
            let name = format!("seawall_{hash}");
            for (n, s) in all.iter_mut() {
                s.function = format!("{name}_{n}");
            }
            let mut library_load = redis::cmd("FUNCTION");
            library_load.arg("LOAD").arg(text(&name, &all, true));
            // All but the admissions (the last two): by `EVALSHA`, an
            // admission runs its spec's own script.
            let script_loads = all[..8]
                .iter()
                .map(|(_, s)| s.script_load.clone())
                .collect();
            scripts.script_loads = script_loads;
            scripts.library_load = library_load;
            scripts
        })
    }

    /// Every script the library holds, by name.
    #[cfg(test)]
    fn all(&self) -> [(&'static str, &Lua); 10] {
        [
            ("record", &self.record),
            ("release", &self.release),
            ("metrics", &self.metrics),
            ("control", &self.control),
            ("in_flight", &self.in_flight),
            ("success", &self.success),
            ("lease", &self.lease),
            ("extend", &self.extend),
            ("admit", &self.admit),
            ("admit_carrying", &self.admit_carrying),
        ]
    }

    /// `SCRIPT LOAD` of every script run by `EVALSHA`.
    pub(crate) fn script_loads(&self) -> &[redis::Cmd] {
        &self.script_loads
    }

    /// `FUNCTION LOAD` of the library that holds every script as a
    /// function: compiled by the server once, when it first gets it (a
    /// library of its name already there is the same text: see
    /// `Link::functions_loaded`).
    pub(crate) fn library_load(&self) -> &redis::Cmd {
        &self.library_load
    }
}

/// The admission scripts of one spec, run by `EVALSHA`: `admit.lua` (and
/// the admission that carries successes) with the spec compiled in as
/// constants, so that an admission sends only the time and its own
/// arguments (`ARGV[2..]`, which the scripts see at `ARGV[28..]` as usual):
/// the same Lua, the same rules, without the 26 spec arguments to send,
/// parse and convert on every call. Loaded when a pipeline binds, and with
/// every script after `NOSCRIPT` (see `Link::register`).
pub(crate) struct SpecScripts {
    pub(crate) admit: Lua,
    /// The admission carrying silent successes of the same keys, applied
    /// first by the same rule as `success` (see `lua/carry.lua`): the
    /// admission's arguments, then the carried records as one more.
    pub(crate) admit_carrying: Lua,
}

impl SpecScripts {
    pub(crate) fn new(args: &SpecArgs) -> SpecScripts {
        let prelude = compiled_prelude(args);
        SpecScripts {
            admit: Lua::new(true, &[&prelude], &[ADMIT]),
            admit_carrying: Lua::new(true, &[&prelude, SUCCESS], &[CARRY, ADMIT]),
        }
    }

    /// The hash and `SCRIPT LOAD` of both.
    pub(crate) fn loads(&self) -> [(String, redis::Cmd); 2] {
        [&self.admit, &self.admit_carrying].map(|s| (s.hash().to_owned(), s.script_load.clone()))
    }
}

/// `SCRIPT LOAD` of the script `source`.
fn script_load(source: String) -> redis::Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(source);
    cmd
}

/// `prelude.lua` with the spec `args` compiled in (see
/// [`script_text::compiled`](crate::script_text::compiled)).
fn compiled_prelude(args: &SpecArgs) -> String {
    compiled(PRELUDE, &args.values)
}

/// The body of the lease script (after the prelude): `admit.lua`
/// unchanged as the body of a function (its `return`s return from it),
/// then `lease.lua`.
const LEASE_BODY: [&str; 4] = [
    "local function admit_rule()\n",
    ADMIT,
    "\nend\n",
    include_str!("lua/lease.lua"),
];

/// One call of a script: `EVALSHA sha 7 keys… args…` or `FCALL function 7
/// keys… args…`, built once and sent as it is. The link sends it itself
/// (rather than through the client's script helper) so that it sees a
/// `NOSCRIPT` or a missing function: a server that lost its scripts may
/// have lost its state too (see `Link::invoke_sync`).
pub(crate) struct Invocation {
    pub(crate) cmd: redis::Cmd,
    keys: usize,
    /// The spec the call names by its id, and where in `cmd` (see
    /// [`spec_by_id`](Self::spec_by_id)).
    by_id: Option<(usize, Arc<SpecArgs>)>,
}

impl Invocation {
    /// Every script takes the seven keys of one resource.
    pub(crate) const KEYS: usize = 7;
    /// The arguments of an admission carrying two successes (the command,
    /// the script, the keys and their number, the time, the spec by id,
    /// the admission's own and the records').
    const ARGS: usize = 32;
    /// Their bytes (seven keys of a name of 32 bytes, the rest).
    const BYTES: usize = 512;

    /// A call of `script`: by `FCALL` of its function when `functions`,
    /// else by `EVALSHA`.
    pub(crate) fn new(script: &Lua, functions: bool) -> Invocation {
        debug_assert!(
            !functions || !script.function.is_empty(),
            "a script no library holds runs by EVALSHA"
        );
        // Room for an admission's arguments, so that they are not moved
        // as they are added.
        let mut cmd = redis::Cmd::with_capacity(Self::ARGS, Self::BYTES);
        if functions {
            cmd.arg("FCALL").arg(&script.function);
        } else {
            cmd.arg("EVALSHA").arg(script.hash());
        }
        cmd.arg(Self::KEYS);
        Invocation {
            cmd,
            keys: 0,
            by_id: None,
        }
    }

    /// Adds a key (`KEYS[i]`); keys come before arguments.
    pub(crate) fn key(&mut self, key: impl redis::ToRedisArgs) -> &mut Self {
        debug_assert!(self.keys < Self::KEYS, "a script takes seven keys");
        self.keys += 1;
        self.cmd.arg(key);
        self
    }

    /// The first key: every key of an invocation shares its hash tag, so
    /// this key's slot is the invocation's.
    pub(crate) fn first_key(&self) -> &[u8] {
        // EVALSHA and the hash (FCALL and the function), the number of
        // keys, then the keys.
        match self.cmd.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => key,
            _ => &[],
        }
    }

    /// The cluster slot of the invocation's keys.
    pub(crate) fn slot(&self) -> u16 {
        key_slot(self.first_key())
    }

    /// Adds an argument (`ARGV[i]`).
    pub(crate) fn arg(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys, Self::KEYS, "keys come first");
        self.cmd.arg(arg);
        self
    }

    /// Adds the spec by its id (`ARGV[2]`, a function's admission): one
    /// argument instead of 26, the library keeping the specs it was sent in
    /// full (see `call_args` in `lua/prelude.lua`).
    pub(crate) fn spec_by_id(&mut self, spec: &Arc<SpecArgs>) -> &mut Self {
        let at = self.cmd.args_iter().count();
        self.arg(spec.id.as_str());
        self.by_id = Some((at, Arc::clone(spec)));
        self
    }

    /// Adds the spec in full with its id (`=` and the id, then its 26
    /// values), which the library keeps.
    pub(crate) fn spec_in_full(&mut self, spec: &SpecArgs) -> &mut Self {
        debug_assert_eq!(self.keys, Self::KEYS, "keys come first");
        spec.in_full(&mut self.cmd);
        self
    }

    /// The same call with its spec in full (`=` and its id, then its 26
    /// values), for a server whose library answered that it does not hold
    /// it ([`SPEC_MISSING`](crate::script_text::SPEC_MISSING)); `None` for
    /// a call that names no spec by id.
    pub(crate) fn in_full(&self) -> Option<redis::Cmd> {
        let (at, spec) = self.by_id.as_ref()?;
        let mut cmd = redis::Cmd::new();
        for (i, arg) in self.cmd.args_iter().enumerate() {
            let redis::Arg::Simple(arg) = arg else {
                continue;
            };
            if i == *at {
                spec.in_full(&mut cmd);
            } else {
                cmd.arg(arg);
            }
        }
        Some(cmd)
    }
}

/// Suffixes of the seven keys, in `KEYS` order. The rate limiter's key
/// names its algorithm, so that changing the algorithm never meets a key of
/// the wrong type.
fn suffixes(spec: &ResourceSpec) -> [&'static str; 7] {
    let rate = match spec.rate_limit.as_ref().map(|r| r.algorithm) {
        Some(RateAlgorithm::FixedWindow) => "rf",
        Some(RateAlgorithm::SlidingWindow) => "rs",
        _ => "rg",
    };
    ["s", "cw", "tw", "tz", "b", rate, "rb"]
}

/// Escapes the characters that would make two names share keys or break
/// the hash tag (`%`, `:`, `{`, `}`).
fn escape(out: &mut String, s: &str) {
    for ch in s.chars() {
        match ch {
            '%' => out.push_str("%25"),
            ':' => out.push_str("%3A"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// The seven keys of one resource (and partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys(pub(crate) [String; 7]);

impl Keys {
    /// `{prefix:resource}:suffix`, or `{prefix:resource:i:7}:suffix` /
    /// `{prefix:resource:s:tenant}:suffix` for a partition.
    pub(crate) fn new(
        prefix: &str,
        spec: &ResourceSpec,
        partition: Option<&seawall::PartitionKey>,
    ) -> Keys {
        let mut tag = String::with_capacity(prefix.len() + spec.name.len() + 24);
        tag.push('{');
        tag.push_str(prefix);
        tag.push(':');
        escape(&mut tag, &spec.name);
        match partition {
            None => {}
            Some(p) => match p.as_str() {
                Some(s) => {
                    tag.push_str(":s:");
                    escape(&mut tag, s);
                }
                None => {
                    let _ = write!(tag, ":i:{p}");
                }
            },
        }
        tag.push('}');
        Keys(suffixes(spec).map(|s| format!("{tag}:{s}")))
    }
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (what
/// is between the first `{` and the next `}`, when not empty) or of the
/// whole key, modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(key) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 == 0 {
                crc << 1
            } else {
                (crc << 1) ^ 0x1021
            };
        }
    }
    crc % 16384
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// `microseconds:nanoseconds` (nanoseconds 0..999) of `ns` nanoseconds.
fn nanos_pair(ns: u64) -> String {
    format!("{}:{}", ns / 1000, ns % 1000)
}

fn flag(b: bool) -> String {
    if b { "1" } else { "0" }.to_owned()
}

/// `ARGV[2..=27]`: the spec, as the scripts read it, and its id.
#[derive(Debug, Clone)]
pub(crate) struct SpecArgs {
    pub(crate) values: Vec<String>,
    /// What an admission as a function names the spec by, once the
    /// library holds it (see `call_args` in `lua/prelude.lua`): `#` and the
    /// SHA-1 of the values.
    pub(crate) id: String,
}

/// The bits of the policies in shadow mode (`ARGV[27]`, `SHADOW` in the
/// scripts).
const SHADOW_CIRCUIT: u8 = 1;
const SHADOW_BULKHEAD: u8 = 2;
const SHADOW_COOLDOWN: u8 = 4;
const SHADOW_RATE: u8 = 8;

/// `true` when a policy of `spec` runs in shadow mode.
pub(crate) fn any_in_shadow(spec: &ResourceSpec) -> bool {
    circuit_in_shadow(spec)
        || spec.bulkhead.as_ref().is_some_and(|b| b.shadow)
        || spec.cooldown.as_ref().is_some_and(|c| c.shadow)
        || spec.rate_limit.as_ref().is_some_and(|r| r.shadow)
}

/// `true` when the circuit of `spec` runs in shadow mode.
pub(crate) fn circuit_in_shadow(spec: &ResourceSpec) -> bool {
    spec.circuit.as_ref().is_some_and(|c| c.shadow)
}

impl SpecArgs {
    /// `probe_lease`: the longest a round of probes blocks the next one for
    /// a breaker that does not say ([`CircuitBreaker::max_half_open`]).
    ///
    /// [`CircuitBreaker::max_half_open`]: seawall::CircuitBreaker::max_half_open
    pub(crate) fn new(spec: &ResourceSpec, probe_lease: Duration) -> SpecArgs {
        let mut a: Vec<String> = Vec::with_capacity(26);
        let mut half_max = probe_lease;
        let idle = micros(spec.partition_idle);
        match &spec.circuit {
            Some(c) => {
                let (mode, n) = match c.mode {
                    BreakerMode::ConsecutiveFailures(n) => (1, n),
                    BreakerMode::CountWindow(n) => (2, n),
                    BreakerMode::TimeWindow(n) => (3, n),
                    // A mode unknown to this version: judge the last 100 calls.
                    _ => (2, 100),
                };
                a.push(flag(true));
                a.push(mode.to_string());
                a.push(n.to_string());
                a.push(c.failure_rate.to_string());
                a.push(c.slow_call_rate.unwrap_or(0.0).to_string());
                a.push(micros(c.slow_call_duration).to_string());
                // A count window never holds more than its size.
                let minimum = match c.mode {
                    BreakerMode::CountWindow(n) => c.minimum_calls.min(n),
                    _ => c.minimum_calls,
                };
                a.push(minimum.to_string());
                a.push(micros(c.cooldown).to_string());
                a.push(c.cooldown_growth.to_string());
                a.push(micros(c.max_cooldown).to_string());
                a.push(c.half_open_calls.to_string());
                if let Some(max) = c.max_half_open {
                    half_max = max;
                }
            }
            None => {
                a.push(flag(false));
                a.extend(["1", "1", "1", "0", "0", "1", "0", "1", "0", "1"].map(String::from));
            }
        }
        // At least 1 us: zero would mean no limit to the scripts.
        a.push(micros(half_max).max(1).to_string());
        a.push(idle.to_string());
        match &spec.bulkhead {
            Some(b) => {
                a.push(flag(true));
                a.push(b.max_concurrent.to_string());
                a.push(micros(b.lease).to_string());
            }
            None => a.extend(["0", "0", "0"].map(String::from)),
        }
        match &spec.cooldown {
            Some(c) => {
                a.push(flag(true));
                a.push(micros(c.max_pause).to_string());
                a.push(micros(c.grace).to_string());
            }
            None => a.extend(["0", "0", "0"].map(String::from)),
        }
        match &spec.rate_limit {
            Some(r) => {
                let alg = match r.algorithm {
                    RateAlgorithm::FixedWindow => 2,
                    RateAlgorithm::SlidingWindow => 3,
                    _ => 1,
                };
                // GCRA's interval and tolerance to the nanosecond, as the
                // in-memory rule has them (`period / limit` rounded up, at
                // least 1 ns; `burst - 1` intervals), written
                // `microseconds:nanoseconds` so that the script's
                // arithmetic is exact.
                let interval_ns = u64::try_from(r.emission_interval().as_nanos())
                    .unwrap_or(u64::MAX)
                    .max(1);
                let tolerance_ns = interval_ns.saturating_mul(u64::from(r.burst.max(1) - 1));
                // The windows keep their times to the nanosecond, as in
                // memory: their period as a pair in the tolerance's place
                // (a window has none).
                let period_ns = u64::try_from(r.period.as_nanos()).unwrap_or(u64::MAX);
                let fine = if alg == 1 { tolerance_ns } else { period_ns };
                a.push(flag(true));
                a.push(alg.to_string());
                a.push(r.limit.to_string());
                a.push(micros(r.period).to_string());
                a.push(nanos_pair(fine));
                a.push(nanos_pair(interval_ns));
            }
            None => a.extend(["0", "1", "1", "1", "0", "1"].map(String::from)),
        }
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        let shadow = bit(circuit_in_shadow(spec), SHADOW_CIRCUIT)
            | bit(
                spec.bulkhead.as_ref().is_some_and(|b| b.shadow),
                SHADOW_BULKHEAD,
            )
            | bit(
                spec.cooldown.as_ref().is_some_and(|c| c.shadow),
                SHADOW_COOLDOWN,
            )
            | bit(
                spec.rate_limit.as_ref().is_some_and(|r| r.shadow),
                SHADOW_RATE,
            );
        a.push(shadow.to_string());
        debug_assert_eq!(a.len(), 26);
        let id = format!("#{}", Script::new(&a.join("\n")).get_hash());
        SpecArgs { values: a, id }
    }

    /// Adds the spec to `cmd` in full with its id: `=` and the id's hash,
    /// then the 26 values (see `call_args` in `lua/prelude.lua`).
    fn in_full(&self, cmd: &mut redis::Cmd) {
        cmd.arg(format!("={}", &self.id[1..])).arg(&self.values);
    }
}

/// The spec part of the lean success record's arguments (`ARGV[5..=7]`:
/// window size, idle time, cooldown grace) and its circuit mode
/// (`ARGV[4]`, 0 without a circuit).
#[derive(Debug, Clone)]
pub(crate) struct SuccessArgs {
    pub(crate) mode: &'static str,
    pub(crate) rest: [String; 3],
}

impl SuccessArgs {
    pub(crate) fn new(spec: &ResourceSpec) -> SuccessArgs {
        let (mode, n) = match spec.circuit.as_ref().map(|c| c.mode) {
            None => ("0", 1),
            Some(BreakerMode::ConsecutiveFailures(n)) => ("1", n),
            Some(BreakerMode::TimeWindow(n)) => ("3", n),
            Some(BreakerMode::CountWindow(n)) => ("2", n),
            Some(_) => ("2", 100),
        };
        let grace = spec
            .cooldown
            .as_ref()
            .map_or_else(|| "-1".to_owned(), |c| micros(c.grace).to_string());
        SuccessArgs {
            mode,
            rest: [
                n.to_string(),
                micros(spec.partition_idle).to_string(),
                grace,
            ],
        }
    }
}

/// Reason codes of the admit script.
pub(crate) const ADMITTED: i64 = 0;
pub(crate) const CIRCUIT_OPEN: i64 = 1;
pub(crate) const BULKHEAD_FULL: i64 = 2;
pub(crate) const COOLDOWN_ACTIVE: i64 = 3;
pub(crate) const RATE_LIMITED: i64 = 4;
pub(crate) const RETRY_BUDGET_EXHAUSTED: i64 = 5;

/// The last eight values of an admission's reply (`admit.lua`) that it
/// leaves out when they are these: no transition, no trips, no wait under
/// the microsecond, no reservation, no shadow refusal.
pub(crate) const ADMIT_TAIL: [i64; 8] = [0, 0, 0, -1, 0, 0, -1, 0];

/// An admission's reply in full (its 13 values; see [`ADMIT_TAIL`]), or
/// `None` for a reply of another length.
pub(crate) fn admit_reply(reply: &[i64]) -> Option<[i64; 13]> {
    let mut full = [0; 13];
    match reply.len() {
        13 => full.copy_from_slice(reply),
        5 => {
            full[..5].copy_from_slice(reply);
            full[5..].copy_from_slice(&ADMIT_TAIL);
        }
        _ => return None,
    }
    Some(full)
}

/// `retry_after` codes of the admit script: the cooldown of the current
/// trip (half-open, every probe slot taken), "open until the latest
/// instant", and from `RETRY_OPENED_FOR` down, `RETRY_OPENED_FOR - d`: the
/// `d` microseconds of the explicit open the circuit is half-open after
/// (every probe slot taken).
pub(crate) const RETRY_COOLDOWN: i64 = -2;
pub(crate) const RETRY_FOREVER: i64 = -3;
pub(crate) const RETRY_OPENED_FOR: i64 = -4;

/// Transition codes.
pub(crate) const HALF_OPENED: i64 = 1;
pub(crate) const OPENED: i64 = 2;
pub(crate) const CLOSED: i64 = 3;
pub(crate) const PROBES_EXPIRED: i64 = 4;

/// Control operations of the control script.
pub(crate) const CONTROL_ISOLATE: i64 = 1;
pub(crate) const CONTROL_DISABLE: i64 = 2;
pub(crate) const CONTROL_RESET: i64 = 3;
pub(crate) const CONTROL_OPEN_FOR: i64 = 4;
pub(crate) const CONTROL_ENABLE: i64 = 5;

/// Circuit state codes.
pub(crate) const ST_CLOSED: i64 = 0;
pub(crate) const ST_OPEN: i64 = 1;
pub(crate) const ST_HALF_OPEN: i64 = 2;
pub(crate) const ST_ISOLATED: i64 = 3;
pub(crate) const ST_DISABLED: i64 = 4;

#[cfg(test)]
mod tests {
    /// The longest script text a server that requires a password reads
    /// from a client that has not authenticated (Redis's limit on an
    /// unauthenticated client's bulk length): above it, loading the
    /// scripts with a wrong or missing password fails with a protocol error
    /// instead of `NOAUTH`.
    const MAX_SCRIPT_LEN: usize = 16 * 1024;

    /// The text a load sends (its last argument).
    fn sent(load: &redis::Cmd) -> usize {
        match load.args_iter().last() {
            Some(redis::Arg::Simple(text)) => text.len(),
            _ => 0,
        }
    }

    #[test]
    fn every_script_is_read_before_authentication() {
        let s = Scripts::get();
        // Compiled for a spec with every policy, the longest spec text.
        let full = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::failure_rate(0.5).cooldown_growth(2.5, Duration::MAX))
            .with_bulkhead(Bulkhead::new(u32::MAX))
            .with_cooldown(seawall::Cooldown::new())
            .with_rate_limit(RateLimiter::gcra(3, Duration::from_secs(1)));
        let compiled = SpecScripts::new(&SpecArgs::new(&full, Duration::MAX));
        // Every `SCRIPT LOAD`: the store's scripts (the admissions for
        // every spec run as functions only) and the admission scripts
        // compiled for a spec.
        let compiled = compiled.loads().map(|(_, load)| load);
        let mut count = 0;
        for load in s.script_loads().iter().chain(&compiled) {
            let len = sent(load);
            assert!(len > 0 && len <= MAX_SCRIPT_LEN, "{load:?}: {len} bytes");
            count += 1;
        }
        assert_eq!(count, 8 + 2);
        // The library is longer: it is sent after the scripts, once they
        // were taken (see `Link::load_these_sync`).
        assert!(sent(s.library_load()) > MAX_SCRIPT_LEN);
        // Comments, blank lines and indentation go; code stays, a trailing
        // comment too; the spaces after a comma and around the operators
        // go, except in strings, and where they keep two tokens apart.
        assert_eq!(
            source(&["-- a\n\n  -- b\nlocal x = 1 -- c\n", "  return x"]),
            "local x=1 -- c\nreturn x\n"
        );
        assert_eq!(
            source(&["if a == b or c ~= d then f(a, b,  'x, = y', \"p == \\\" q\") end\n"]),
            "if a==b or c~=d then f(a,b,'x, = y',\"p == \\\" q\") end\n"
        );
        assert_eq!(
            source(&["local y = x <= 1 and x >= -1 and a - -b or c - d\n"]),
            "local y=x<=1 and x>=-1 and a - -b or c-d\n"
        );
        assert_eq!(
            source(&["return 1 .. x, y .. 'z', a + b * c / d % e ^ f, g < h, i > j, k('a - b')\n"]),
            "return 1 .. x,y..'z',a+b*c/d%e^f,g<h,i>j,k('a - b')\n"
        );
    }

    /// Every function is named after the library that holds it, which is
    /// named after its text: two versions of the library (whose scripts
    /// differ in one place) hold functions of different names, so that
    /// both load on one server (a function's name is the server's, across
    /// libraries). Every script's function is in the library, once.
    #[test]
    fn functions_are_named_after_their_library() {
        let s = Scripts::get();
        let text = match s.library_load().args_iter().last() {
            Some(redis::Arg::Simple(t)) => String::from_utf8(t.to_vec()).unwrap(),
            _ => panic!("the library's text"),
        };
        let name = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("#!lua name="))
            .expect("the library's name")
            .to_owned();
        assert!(name.starts_with("seawall_") && name.len() == "seawall_".len() + 40);
        let all = s.all();
        let mut names: Vec<&str> = all.iter().map(|(_, l)| l.function.as_str()).collect();
        for f in &names {
            assert!(f.starts_with(&format!("{name}_")), "{f}");
            assert_eq!(
                text.matches(&format!("register_function('{f}',")).count(),
                1
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert_eq!(text.matches("register_function(").count(), all.len());
    }

    /// A function of the shared parts that nothing calls is left out, also
    /// one called only by such a function; one called elsewhere stays, and
    /// so does every other line.
    #[test]
    fn functions_no_code_calls_are_left_out() {
        let text = source(&[
            "local function used(x) return x end\n\
             local function dead(x)\n  if x then\n    return lone(x)\n  end\nend\n\
             local function lone(x) return x + 1 end\n\
             local function used_later(x)\n  return x\nend\n\
             local k = 1\n",
            "return used(k) + used_later(k)\n",
        ]);
        assert_eq!(
            text,
            "local function used(x) return x end\n\
             local function used_later(x)\nreturn x\nend\n\
             local k=1\nreturn used(k)+used_later(k)\n"
        );
        // The admission never opens nor closes a circuit; the record does.
        let admit = source(&[PRELUDE, SUCCESS, CARRY, ADMIT]);
        let record = source(&[PRELUDE, include_str!("lua/record.lua")]);
        for name in ["copen", "cclose", "cooldown_for"] {
            assert!(!admit.contains(&format!("function {name}(")), "{name}");
            assert!(record.contains(&format!("function {name}(")), "{name}");
        }
        assert!(admit.contains("function hload_admit("));
        assert!(!record.contains("function hload_admit("));
    }

    use super::*;
    use crate::script_text::{is_plain_decimal, lua_escaped, source, ARGS_LINE};
    use seawall::{Bulkhead, CircuitBreaker, RateLimiter};

    #[test]
    fn compiled_scripts_hold_the_spec_as_arguments_would() {
        let spec = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::failure_rate(0.5).count_window(100))
            .with_bulkhead(Bulkhead::new(64))
            .with_rate_limit(RateLimiter::gcra(3, Duration::from_secs(1)));
        let args = SpecArgs::new(&spec, Duration::from_secs(60));
        let prelude = compiled_prelude(&args);
        let header = prelude
            .lines()
            .find(|l| l.starts_with("  A = {"))
            .expect("the spec's table");
        // Flags and shadow bits as strings; numbers as numbers; GCRA's
        // pairs split; the call's own arguments after the spec.
        assert!(
            header.starts_with("  A = {ARGV[1], '1', 2, 100, 0.5, 0, "),
            "{header}"
        );
        assert!(
            header.ends_with(", {666666, 668}, {333333, 334}, '0', unpack(ARGV, 2)}"),
            "{header}"
        );
        assert_eq!(header.matches(", ").count(), 30, "{header}");
        assert!(!prelude.contains(ARGS_LINE));
        // Two specs, two scripts; the same spec, the same script.
        let other = SpecArgs::new(&spec, Duration::from_secs(61));
        assert_ne!(
            SpecScripts::new(&args).admit.hash(),
            SpecScripts::new(&other).admit.hash()
        );
        assert_eq!(
            SpecScripts::new(&args).admit_carrying.hash(),
            SpecScripts::new(&args).admit_carrying.hash()
        );
    }

    #[test]
    fn only_plain_decimals_are_written_as_numbers() {
        for v in ["0", "12", "-3", "0.5", "18446744073709551615"] {
            assert!(is_plain_decimal(v), "{v}");
        }
        for v in ["", "-", "inf", "NaN", "1e5", ".5", "5.", "1:2", "0x10"] {
            assert!(!is_plain_decimal(v), "{v}");
        }
        assert_eq!(lua_escaped("a'b\\c"), "a\\'b\\\\c");
    }

    #[test]
    fn keys_share_one_hash_tag_and_escape_names() {
        let spec = ResourceSpec::new("users:api{x}")
            .with_rate_limit(RateLimiter::sliding_window(5, Duration::from_secs(1)));
        let k = Keys::new("sw", &spec, None);
        assert_eq!(k.0[0], "{sw:users%3Aapi%7Bx%7D}:s");
        assert_eq!(k.0[5], "{sw:users%3Aapi%7Bx%7D}:rs");
        let p = seawall::PartitionKey::from(7u64);
        assert_eq!(
            Keys::new("sw", &spec, Some(&p)).0[4],
            "{sw:users%3Aapi%7Bx%7D:i:7}:b"
        );
        let p = seawall::PartitionKey::from("7");
        assert_eq!(
            Keys::new("sw", &spec, Some(&p)).0[4],
            "{sw:users%3Aapi%7Bx%7D:s:7}:b"
        );
    }

    #[test]
    fn key_slots_are_the_cluster_s() {
        // The examples of the Redis Cluster specification.
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        // As `CLUSTER KEYSLOT` of Redis 7 answers.
        for (key, slot) in [
            ("{sw:users%3Aapi%7Bx%7D}:s", 780),
            ("{shop:inventory}:rg", 6959),
            ("{seawall:payments:s:tenant-7}:b", 9304),
            ("a{}b", 13694),
            ("éclair", 9615),
        ] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag hashes the whole key.
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        // Every key of a resource, partitioned or not, in the slot of the
        // first one.
        let spec = ResourceSpec::new("a{b}:c")
            .with_rate_limit(RateLimiter::gcra(5, Duration::from_secs(1)));
        for partition in [
            None,
            Some(seawall::PartitionKey::from(7u64)),
            Some(seawall::PartitionKey::from("t}{x")),
        ] {
            let keys = Keys::new("sw", &spec, partition.as_ref()).0;
            let first = key_slot(keys[0].as_bytes());
            assert!(
                keys.iter().all(|k| key_slot(k.as_bytes()) == first),
                "{keys:?}"
            );
        }
    }

    #[test]
    fn spec_args_have_a_fixed_length() {
        let full = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::failure_rate(0.5))
            .with_bulkhead(Bulkhead::new(3))
            .with_cooldown(seawall::Cooldown::new())
            .with_rate_limit(RateLimiter::gcra(10, Duration::from_secs(1)));
        assert_eq!(
            SpecArgs::new(&full, Duration::from_secs(60)).values.len(),
            26
        );
        let empty = ResourceSpec::new("r");
        assert_eq!(
            SpecArgs::new(&empty, Duration::from_secs(60)).values.len(),
            26
        );
        let a = SpecArgs::new(&full, Duration::from_secs(60)).values;
        // GCRA interval: 100 ms = 100000 us; tolerance: 9 intervals.
        assert_eq!((a[23].as_str(), a[24].as_str()), ("900000:0", "100000:0"));
        // 1/3 s: to the nanosecond, rounded up, as the in-memory rule has it.
        let third = ResourceSpec::new("r")
            .with_rate_limit(RateLimiter::gcra(3, Duration::from_secs(1)).burst(2));
        let a = SpecArgs::new(&third, Duration::from_secs(60)).values;
        assert_eq!(
            (a[23].as_str(), a[24].as_str()),
            ("333333:334", "333333:334")
        );
        // A fixed window's period, to the nanosecond, in the tolerance's
        // place: its windows are aligned on it.
        let fixed = ResourceSpec::new("r").with_rate_limit(RateLimiter::fixed_window(
            3,
            Duration::from_nanos(333_333_334),
        ));
        let a = SpecArgs::new(&fixed, Duration::from_secs(60)).values;
        assert_eq!(a[23].as_str(), "333333:334");
    }

    #[test]
    fn spec_args_carry_the_shadow_modes_and_the_longest_round_of_probes() {
        let lease = Duration::from_secs(60);
        let plain = ResourceSpec::new("r")
            .with_circuit(CircuitBreaker::consecutive_failures(1))
            .with_rate_limit(RateLimiter::gcra(10, Duration::from_secs(1)));
        let a = SpecArgs::new(&plain, lease).values;
        // ARGV[13] is a[11]; ARGV[27] is a[25].
        assert_eq!((a[11].as_str(), a[25].as_str()), ("60000000", "0"));
        let shadowed = ResourceSpec::new("r")
            .with_circuit(
                CircuitBreaker::consecutive_failures(1)
                    .max_half_open(Duration::from_millis(1500))
                    .shadow(true),
            )
            .with_bulkhead(Bulkhead::new(1))
            .with_cooldown(seawall::Cooldown::new().shadow(true))
            .with_rate_limit(RateLimiter::gcra(10, Duration::from_secs(1)).shadow(true));
        let a = SpecArgs::new(&shadowed, lease).values;
        assert_eq!((a[11].as_str(), a[25].as_str()), ("1500000", "13"));
        assert!(circuit_in_shadow(&shadowed) && !circuit_in_shadow(&plain));
    }
}
