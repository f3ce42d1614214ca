//! The file's structure as serde reads it (every field optional, so that
//! `default` can fill the gaps), and its resolution with `default` into the
//! policies the builder declares.
//!
//! A pipeline entry's sections and their keys are `seawall_order`'s table:
//! each registered policy is a section named after it (a timeout after the
//! retry: `attempt_timeout`), whose keys and value kinds are the policy's
//! registered settings. Each policy's own words (defaults, required keys,
//! keys that go together) are in `policies.rs`, reached through an
//! exhaustive match on [`PolicyKind`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use seawall_order::{check, scope, Misplaced, Place, PolicyKind, Rule, Scope, Setting, Value};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::named::FallbackOn;
use super::policies::{resolve, Layers};
use crate::custom::Position;
use crate::error::ConfigError;
use crate::pipeline::{Declared, PipelineBuilder};
use crate::retry::{Jitter, RetryBudget};

/// A whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    #[serde(default)]
    pub(crate) default: Option<RawPipeline>,
    // `Option`s so that an empty YAML key (`pipelines:`, `users:`) reads
    // as nothing configured rather than as a type error.
    #[serde(default)]
    pipelines: Option<Pipelines>,
}

/// The `pipelines` table: each name once (a YAML mapping may repeat a key,
/// which would otherwise drop the first entry without a word).
#[derive(Debug, Default)]
struct Pipelines(BTreeMap<String, Option<RawPipeline>>);

impl<'de> Deserialize<'de> for Pipelines {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Pipelines;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of pipelines by name")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pipelines, A::Error> {
                let mut pipelines = BTreeMap::new();
                while let Some(name) = map.next_key_seed(NewName(&pipelines))? {
                    let entry = map.next_value()?;
                    pipelines.insert(name, entry);
                }
                Ok(Pipelines(pipelines))
            }
        }
        d.deserialize_map(V)
    }
}

/// The name of a pipeline not named before: refused while the key is read,
/// so that the error points at the second entry.
struct NewName<'a>(&'a BTreeMap<String, Option<RawPipeline>>);

impl<'de> DeserializeSeed<'de> for NewName<'_> {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_string(self)
    }
}

impl Visitor<'_> for NewName<'_> {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a pipeline name")
    }
    fn visit_str<E: de::Error>(self, name: &str) -> Result<String, E> {
        if self.0.contains_key(name) {
            return Err(E::custom(format_args!(
                "duplicate pipeline `{name}`: each pipeline is configured once"
            )));
        }
        Ok(name.to_owned())
    }
}

impl RawFile {
    /// Every pipeline entry, an empty one as the default entry.
    pub(crate) fn pipelines(&self) -> impl Iterator<Item = (&str, RawPipeline)> + '_ {
        self.pipelines
            .iter()
            .flat_map(|p| &p.0)
            .map(|(name, p)| (name.as_str(), p.clone().unwrap_or_default()))
    }
}

/// One pipeline entry (or `default`): `policies`, `partition_idle` and a
/// section per registered policy.
#[derive(Debug, Default, Clone)]
pub(crate) struct RawPipeline {
    policies: Option<Vec<Listed>>,
    sections: Vec<(PolicyName, Section)>,
    partition_idle: Option<Dur>,
    classifier: Option<String>,
    fallback: Option<String>,
    fallback_on: Option<Vec<FallbackOn>>,
}

impl RawPipeline {
    fn section(&self, name: PolicyName) -> Option<&Section> {
        self.sections
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
    }
}

const POLICIES: &str = "policies";
const PARTITION_IDLE: &str = "partition_idle";
const CLASSIFIER: &str = "classifier";
const FALLBACK: &str = "fallback";
const FALLBACK_ON: &str = "fallback_on";

/// The keys of a pipeline entry, in the order they are documented.
fn entry_keys() -> Vec<&'static str> {
    let mut keys = vec![POLICIES];
    keys.extend(PolicyName::all().map(PolicyName::as_str));
    keys.extend([PARTITION_IDLE, CLASSIFIER, FALLBACK, FALLBACK_ON]);
    keys
}

/// serde's wording of a list of expected names.
pub(super) fn one_of(names: &[&str]) -> String {
    match names {
        [] => "there are no fields".to_owned(),
        [one] => format!("expected `{one}`"),
        [a, b] => format!("expected `{a}` or `{b}`"),
        _ => {
            let quoted: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            format!("expected one of {}", quoted.join(", "))
        }
    }
}

fn unknown_field<E: de::Error>(key: &str, expected: &[&str]) -> E {
    E::custom(format_args!("unknown field `{key}`, {}", one_of(expected)))
}

/// A key of a pipeline entry.
#[derive(Clone, Copy)]
enum EntryKey {
    Policies,
    PartitionIdle,
    Classifier,
    Fallback,
    FallbackOn,
    Section(PolicyName),
}

struct EntryKeySeed;

impl<'de> DeserializeSeed<'de> for EntryKeySeed {
    type Value = EntryKey;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EntryKey, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for EntryKeySeed {
    type Value = EntryKey;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field identifier")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<EntryKey, E> {
        match s {
            POLICIES => Ok(EntryKey::Policies),
            PARTITION_IDLE => Ok(EntryKey::PartitionIdle),
            CLASSIFIER => Ok(EntryKey::Classifier),
            FALLBACK => Ok(EntryKey::Fallback),
            FALLBACK_ON => Ok(EntryKey::FallbackOn),
            _ => PolicyName::from_str(s)
                .map(EntryKey::Section)
                .ok_or_else(|| unknown_field(s, &entry_keys())),
        }
    }
}

impl<'de> Deserialize<'de> for RawPipeline {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawPipeline;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pipeline entry")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawPipeline, A::Error> {
                let mut p = RawPipeline::default();
                let mut seen: Vec<&'static str> = Vec::new();
                while let Some(key) = map.next_key_seed(EntryKeySeed)? {
                    let name = match key {
                        EntryKey::Policies => POLICIES,
                        EntryKey::PartitionIdle => PARTITION_IDLE,
                        EntryKey::Classifier => CLASSIFIER,
                        EntryKey::Fallback => FALLBACK,
                        EntryKey::FallbackOn => FALLBACK_ON,
                        EntryKey::Section(n) => n.as_str(),
                    };
                    if seen.contains(&name) {
                        return Err(de::Error::duplicate_field(name));
                    }
                    seen.push(name);
                    match key {
                        EntryKey::Policies => p.policies = map.next_value()?,
                        EntryKey::PartitionIdle => p.partition_idle = map.next_value()?,
                        EntryKey::Classifier => p.classifier = map.next_value()?,
                        EntryKey::Fallback => p.fallback = map.next_value()?,
                        EntryKey::FallbackOn => p.fallback_on = map.next_value()?,
                        EntryKey::Section(n) => {
                            let seed = Optional(SectionSeed {
                                settings: n.kind.settings(),
                                shorthand: n.kind.shorthand(),
                            });
                            if let Some(s) = map.next_value_seed(seed)? {
                                p.sections.push((n, s));
                            }
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

/// A policy, as named in `policies` and as its section is named: a
/// registered policy, or (for a policy that may stand on either side of
/// the retry) its name after the retry, `attempt_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PolicyName {
    kind: PolicyKind,
    after_retry: bool,
}

impl PolicyName {
    /// Every name, in the order used when `policies` is not given:
    /// coalescing, the policies of either side before the retry, the
    /// retry, their names after it, then the stateful policies, the
    /// adaptive limit, then chaos
    /// (each group in registration order).
    fn all() -> impl Iterator<Item = PolicyName> {
        let names = |place: Place, after_retry: bool| {
            PolicyKind::ALL
                .iter()
                .filter(move |k| k.place() == place && (!after_retry || k.attempt_name().is_some()))
                .map(move |&kind| PolicyName { kind, after_retry })
        };
        names(Place::Outermost, false)
            .chain(names(Place::EitherSide, false))
            .chain(names(Place::Retry, false))
            .chain(names(Place::EitherSide, true))
            .chain(names(Place::Stateful, false))
            .chain(names(Place::AttemptOnce, false))
            .chain(names(Place::Attempt, false))
    }

    fn from_str(s: &str) -> Option<PolicyName> {
        PolicyName::all().find(|n| n.as_str() == s)
    }

    pub(crate) fn as_str(self) -> &'static str {
        match (self.after_retry, self.kind.attempt_name()) {
            (true, Some(name)) => name,
            _ => self.kind.name(),
        }
    }

    /// The policy declared on the builder. `timeout` and `attempt_timeout`
    /// are both timeouts: their position tells the builder what they bound,
    /// and [`order`] checks that it agrees with the name.
    fn kind(self) -> PolicyKind {
        self.kind
    }

    fn configured(self, p: &RawPipeline) -> bool {
        p.section(self).is_some()
    }
}

impl<'de> Deserialize<'de> for PolicyName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = PolicyName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy name")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PolicyName, E> {
                PolicyName::from_str(s).ok_or_else(|| {
                    let names: Vec<&str> = PolicyName::all().map(PolicyName::as_str).collect();
                    E::custom(format_args!("unknown variant `{s}`, {}", one_of(&names)))
                })
            }
        }
        d.deserialize_str(V)
    }
}

/// An entry of `policies`: a policy of the file, or a policy written in
/// code ([`crate::custom`]) by the name it is registered under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Listed {
    Policy(PolicyName),
    Code(Arc<str>),
}

impl Listed {
    fn as_str(&self) -> &str {
        match self {
            Listed::Policy(p) => p.as_str(),
            Listed::Code(name) => name,
        }
    }

    fn policy(&self) -> Option<PolicyName> {
        match self {
            Listed::Policy(p) => Some(*p),
            Listed::Code(_) => None,
        }
    }
}

/// A name a policy written in code may be listed under: a snake_case
/// word that is no key of a pipeline entry (`fallback` is always
/// outermost and is not listed).
fn code_name(s: &str) -> bool {
    let word = s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    word && !entry_keys().contains(&s)
}

impl<'de> Deserialize<'de> for Listed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Listed;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a policy name")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Listed, E> {
                if let Some(p) = PolicyName::from_str(s) {
                    return Ok(Listed::Policy(p));
                }
                if code_name(s) {
                    return Ok(Listed::Code(s.into()));
                }
                let names: Vec<&str> = PolicyName::all().map(PolicyName::as_str).collect();
                Err(E::custom(format_args!(
                    "unknown variant `{s}`, {}, or the snake_case name of a policy registered in code",
                    one_of(&names)
                )))
            }
        }
        d.deserialize_str(V)
    }
}

/// A value of a section, of the kind its setting registers.
#[derive(Debug, Clone, PartialEq)]
enum Given {
    Count(u32),
    Number(f64),
    Flag(bool),
    Duration(Dur),
    Choice(&'static str),
    Jitter(Jitter),
    Table(Section),
    Shares(Vec<(String, f64)>),
}

/// A policy's section: its settings as given, each read by the kind its
/// registered setting names.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Section {
    /// The registered settings of the section.
    settings: &'static [Setting],
    given: Vec<(&'static str, Given)>,
}

impl Section {
    fn new(settings: &'static [Setting]) -> Section {
        Section {
            settings,
            given: Vec::new(),
        }
    }

    /// `true` when the section gives `key`.
    pub(super) fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    fn get(&self, key: &str) -> Option<&Given> {
        debug_assert!(
            self.settings.iter().any(|s| s.key == key),
            "`{key}` is not a registered setting of this section"
        );
        self.given.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub(super) fn count(&self, key: &str) -> Option<u32> {
        match self.get(key)? {
            Given::Count(n) => Some(*n),
            _ => None,
        }
    }

    pub(super) fn number(&self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Given::Number(v) => Some(*v),
            _ => None,
        }
    }

    pub(super) fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            Given::Flag(b) => Some(*b),
            _ => None,
        }
    }

    pub(super) fn duration(&self, key: &str) -> Option<Dur> {
        match self.get(key)? {
            Given::Duration(d) => Some(*d),
            _ => None,
        }
    }

    pub(super) fn choice(&self, key: &str) -> Option<&'static str> {
        match self.get(key)? {
            Given::Choice(c) => Some(*c),
            _ => None,
        }
    }

    pub(super) fn jitter(&self, key: &str) -> Option<Jitter> {
        match self.get(key)? {
            Given::Jitter(j) => Some(*j),
            _ => None,
        }
    }

    pub(super) fn shares(&self, key: &str) -> Option<&[(String, f64)]> {
        match self.get(key)? {
            Given::Shares(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn table(&self, key: &str) -> Option<&Section> {
        match self.get(key)? {
            Given::Table(t) => Some(t),
            _ => None,
        }
    }
}

/// A value that may be null (an empty YAML key): read as absent.
struct Optional<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Optional<S> {
    type Value = Option<S::Value>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Optional<S> {
    type Value = Option<S::Value>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an optional value")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

/// Reads a section by its registered settings.
#[derive(Clone, Copy)]
struct SectionSeed {
    settings: &'static [Setting],
    /// The setting the section may be written as alone (`timeout = "5s"`).
    shorthand: Option<&'static Setting>,
}

impl<'de> DeserializeSeed<'de> for SectionSeed {
    type Value = Section;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Section, D::Error> {
        match self.shorthand {
            Some(_) => d.deserialize_any(self),
            None => d.deserialize_map(self),
        }
    }
}

impl<'de> Visitor<'de> for SectionSeed {
    type Value = Section;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self
            .settings
            .iter()
            .map(|s| format!("`{}`", s.key))
            .collect();
        let table = match keys.split_last() {
            Some((last, others)) if !others.is_empty() => {
                format!("a table with {} and {last}", others.join(", "))
            }
            _ => format!("a table with {}", keys.concat()),
        };
        match self.shorthand.map(|s| s.value) {
            Some(Value::Duration(_)) => {
                write!(f, "a duration string such as \"5s\", or {table}")
            }
            _ => f.write_str(&table),
        }
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<Section, E> {
        match self.shorthand {
            Some(
                setting @ Setting {
                    value: Value::Duration(_),
                    ..
                },
            ) => {
                let d = parse_duration(s).map_err(E::custom)?;
                let mut section = Section::new(self.settings);
                section.given.push((setting.key, Given::Duration(Dur(d))));
                Ok(section)
            }
            _ => Err(E::invalid_type(de::Unexpected::Str(s), &self)),
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Section, A::Error> {
        let mut section = Section::new(self.settings);
        while let Some(setting) = map.next_key_seed(SettingKeySeed(self.settings))? {
            if section.get(setting.key).is_some() {
                return Err(de::Error::duplicate_field(setting.key));
            }
            let value = match setting.value {
                Value::Count => map.next_value::<Option<u32>>()?.map(Given::Count),
                Value::Number => map.next_value::<Option<f64>>()?.map(Given::Number),
                Value::Flag => map.next_value::<Option<bool>>()?.map(Given::Flag),
                Value::Duration(_) => map.next_value::<Option<Dur>>()?.map(Given::Duration),
                Value::Choice(choices) => map
                    .next_value_seed(Optional(ChoiceSeed(choices)))?
                    .map(Given::Choice),
                Value::Jitter => map
                    .next_value::<Option<JitterValue>>()?
                    .map(|j| Given::Jitter(j.0)),
                Value::Table(settings) => map
                    .next_value_seed(Optional(SectionSeed {
                        settings,
                        shorthand: None,
                    }))?
                    .map(Given::Table),
                Value::Shares => map
                    .next_value::<Option<Shares>>()?
                    .map(|s| Given::Shares(s.0)),
            };
            if let Some(value) = value {
                section.given.push((setting.key, value));
            }
        }
        Ok(section)
    }
}

/// Names with their shares, in the order written: `{ live = 0.9, batch =
/// 0.1 }`.
struct Shares(Vec<(String, f64)>);

impl<'de> Deserialize<'de> for Shares {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shares;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of names with their shares, e.g. { live = 0.9, batch = 0.1 }")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shares, A::Error> {
                let mut out = Vec::new();
                while let Some((name, share)) = map.next_entry::<String, f64>()? {
                    out.push((name, share));
                }
                Ok(Shares(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A key of a section: one of its registered settings.
struct SettingKeySeed(&'static [Setting]);

impl<'de> DeserializeSeed<'de> for SettingKeySeed {
    type Value = &'static Setting;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'static Setting, D::Error> {
        d.deserialize_identifier(self)
    }
}

impl Visitor<'_> for SettingKeySeed {
    type Value = &'static Setting;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field identifier")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<&'static Setting, E> {
        self.0.iter().find(|k| k.key == s).ok_or_else(|| {
            let keys: Vec<&str> = self.0.iter().map(|k| k.key).collect();
            unknown_field(s, &keys)
        })
    }
}

/// One of a setting's registered words.
struct ChoiceSeed(&'static [&'static str]);

impl<'de> DeserializeSeed<'de> for ChoiceSeed {
    type Value = &'static str;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<&'static str, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for ChoiceSeed {
    type Value = &'static str;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("variant identifier")
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<&'static str, E> {
        self.0
            .iter()
            .find(|c| **c == s)
            .copied()
            .ok_or_else(|| E::custom(format_args!("unknown variant `{s}`, {}", one_of(self.0))))
    }
}

/// A duration written as a string: `"200ms"`, `"30s"`, `"1m"`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Dur(pub(crate) Duration);

/// Parses a human-readable duration.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| {
        format!("invalid duration `{s}`: {e}; expected e.g. \"200ms\", \"30s\" or \"1m\"")
    })
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Dur;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as \"200ms\", \"30s\" or \"1m\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// Parses a jitter: `none`, `full`, `equal` or a percentage `20%`.
pub(crate) fn parse_jitter(s: &str) -> Result<Jitter, String> {
    let t = s.trim();
    match t {
        "none" => Ok(Jitter::None),
        "full" => Ok(Jitter::Full),
        "equal" => Ok(Jitter::Equal),
        _ => t
            .strip_suffix('%')
            .and_then(|p| p.trim().parse::<f64>().ok())
            .map(Jitter::Proportional)
            .ok_or_else(|| {
                format!(
                    "invalid jitter `{s}`: expected \"none\", \"full\", \"equal\" or a percentage such as \"20%\""
                )
            }),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct JitterValue(Jitter);

impl<'de> Deserialize<'de> for JitterValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = JitterValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"none\", \"full\", \"equal\" or a percentage such as \"20%\"")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<JitterValue, E> {
                parse_jitter(s).map(JitterValue).map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

// ---------------------------------------------------------------- resolution

/// A pipeline's configuration with `default` applied: the policies to
/// declare, in order, each with the name it was configured under.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    policies: Vec<(PolicyName, Declared)>,
    /// The policies written in code listed in `policies`, by name, each
    /// with how many policies of the file are listed before it.
    code: Vec<(Arc<str>, usize)>,
    partition_idle: Option<Duration>,
    /// The name of the classifier registered in code, if one is named.
    pub(crate) classifier: Option<String>,
    /// The name of the fallback registered in code, if one is named.
    pub(crate) fallback: Option<String>,
    /// The kinds of final error the fallback takes (all when `None`).
    pub(crate) fallback_on: Option<Vec<FallbackOn>>,
}

impl Resolved {
    pub(crate) fn new(
        own: &RawPipeline,
        base: Option<&RawPipeline>,
    ) -> Result<Resolved, ConfigError> {
        let listed = order(own, base)?;
        let mut policies = Vec::with_capacity(listed.len());
        let mut code = Vec::new();
        for entry in listed {
            let p = match entry {
                Listed::Policy(p) => p,
                Listed::Code(name) => {
                    code.push((name, policies.len()));
                    continue;
                }
            };
            let missing = || {
                ConfigError::new(
                    "pipeline",
                    "policies",
                    format!(
                        "lists `{0}`, which has no `{0}` section here or in `default`",
                        p.as_str()
                    ),
                )
            };
            let layers = Layers::of(own.section(p), base.and_then(|b| b.section(p)));
            policies.push((p, resolve(p.kind(), layers, missing)?));
        }
        let partition_idle = own
            .partition_idle
            .or_else(|| base.and_then(|b| b.partition_idle))
            .map(|d| d.0);
        fn inherit<T: Clone>(own: &Option<T>, base: Option<&Option<T>>) -> Option<T> {
            own.clone().or_else(|| base.cloned().flatten())
        }
        let fallback = inherit(&own.fallback, base.map(|b| &b.fallback));
        let fallback_on = inherit(&own.fallback_on, base.map(|b| &b.fallback_on));
        match &fallback_on {
            Some(_) if fallback.is_none() => {
                return Err(ConfigError::new(
                    "pipeline",
                    FALLBACK_ON,
                    "needs a `fallback`: name one, or remove `fallback_on`",
                ))
            }
            Some(on) if on.is_empty() => {
                return Err(ConfigError::new(
                    "pipeline",
                    FALLBACK_ON,
                    "lists no kind of error: the fallback would never run; remove `fallback_on` to take every error",
                ))
            }
            _ => {}
        }
        Ok(Resolved {
            policies,
            code,
            partition_idle,
            classifier: inherit(&own.classifier, base.map(|b| &b.classifier)),
            fallback,
            fallback_on,
        })
    }

    /// Declares the policies on `builder`, in order. `budget` replaces the
    /// retry budget (to keep the tokens of an unchanged budget on reload).
    /// The policies written in code are left out without `code`; with it,
    /// each is declared at its place, under the name and at the position
    /// `code` gives for it, to be bound by the registry (one `code` does not
    /// know makes `build()` fail).
    pub(crate) fn apply(
        &self,
        mut builder: PipelineBuilder,
        budget: Option<&RetryBudget>,
        code: Option<Code<'_>>,
    ) -> PipelineBuilder {
        let mut listed = self.code.iter().peekable();
        for (i, (_, p)) in self.policies.iter().enumerate() {
            builder = declare_code(builder, &mut listed, i, code);
            builder = builder.declare(match (p, budget) {
                (Declared::Retry(r), Some(b)) => Declared::Retry(r.clone().budget(b.clone())),
                (Declared::Hedging(h), Some(b)) => Declared::Hedging(h.clone().budget(b.clone())),
                _ => p.clone(),
            });
        }
        builder = declare_code(builder, &mut listed, self.policies.len(), code);
        if let Some(idle) = self.partition_idle {
            builder = builder.partition_idle(idle);
        }
        builder
    }

    /// The names of the policies written in code listed in `policies`.
    pub(crate) fn code(&self) -> impl Iterator<Item = &str> + '_ {
        self.code.iter().map(|(name, _)| &**name)
    }

    /// The budget of the retry or of hedging (a pipeline has at most one
    /// of them), if it has one.
    pub(crate) fn budget(&self) -> Option<&RetryBudget> {
        self.policies.iter().find_map(|(_, p)| match p {
            Declared::Retry(r) => r.budget.as_ref(),
            Declared::Hedging(h) => h.budget.as_ref(),
            _ => None,
        })
    }

    /// `true` when the overall timeout is the one at fault for a
    /// `timeout.*` error of the builder (it checks the overall one first).
    pub(crate) fn overall_timeout_invalid(&self) -> bool {
        self.policies.iter().any(|(name, p)| match p {
            Declared::Timeout(t) => !name.after_retry && t.duration.is_zero(),
            _ => false,
        })
    }
}

/// What the registry knows of a policy written in code listed by name: the
/// name it keeps and its position.
pub(crate) type Code<'a> = &'a dyn Fn(&str) -> Option<(&'static str, Position)>;

/// Declares the policies written in code listed before the policy of the
/// file at `before` (all the rest when it is the last).
fn declare_code<'a>(
    mut builder: PipelineBuilder,
    listed: &mut std::iter::Peekable<impl Iterator<Item = &'a (Arc<str>, usize)>>,
    before: usize,
    code: Option<Code<'_>>,
) -> PipelineBuilder {
    while let Some((name, _)) = listed.next_if(|(_, at)| *at <= before) {
        let Some(known) = code else { continue };
        builder =
            match known(name) {
                Some((name, position)) => builder.declare(Declared::custom(name, position, None)),
                None => builder.refuse(ConfigError::new(
                    "pipeline",
                    "policies",
                    format!(
                    "lists `{name}`, which is not a policy of the file ({}): a policy written in \
                     code is declared by a `Registry` that registers it \
                     (`RegistryBuilder::policy`)",
                    one_of(&PolicyName::all().map(PolicyName::as_str).collect::<Vec<_>>())
                ),
                )),
            };
    }
    builder
}

/// The policies in force, in declaration order. The order rules are
/// [`seawall_order::check`]'s (applied again by the builder); here they are
/// only worded for the `policies` list, and the name of a policy that may
/// stand on either side of the retry is held to the side its position puts
/// it on ([`seawall_order::scope`]). A policy written in code is listed by
/// name, once; where it may stand is the builder's to check, once the
/// registry knows its position.
fn order(own: &RawPipeline, base: Option<&RawPipeline>) -> Result<Vec<Listed>, ConfigError> {
    let err = |rule: String| ConfigError::new("pipeline", "policies", rule);
    let listed = own
        .policies
        .as_ref()
        .or_else(|| base.and_then(|b| b.policies.as_ref()));
    let listed: Vec<Listed> = match listed {
        Some(list) => {
            for (i, entry) in list.iter().enumerate() {
                if let Listed::Code(_) = entry {
                    if list[..i].contains(entry) {
                        return Err(err(format!("lists `{}` twice", entry.as_str())));
                    }
                }
            }
            let files: Vec<PolicyName> = list.iter().filter_map(Listed::policy).collect();
            let kinds: Vec<PolicyKind> = files.iter().map(|p| p.kind()).collect();
            if let Err(Misplaced {
                at,
                rule: Rule::Twice { first } | Rule::SecondOnSide { first, .. },
                ..
            }) = check(&kinds)
            {
                if files[first] == files[at] {
                    return Err(err(format!("lists `{}` twice", files[at].as_str())));
                }
            }
            if let Some(p) = PolicyName::all().find(|p| p.configured(own) && !files.contains(p)) {
                return Err(err(format!(
                    "does not list `{0}`, which this pipeline configures: add it to `policies` or remove the `{0}` section",
                    p.as_str()
                )));
            }
            list.clone()
        }
        None => PolicyName::all()
            .filter(|p| p.configured(own) || base.is_some_and(|b| p.configured(b)))
            .map(Listed::Policy)
            .collect(),
    };
    let order: Vec<PolicyName> = listed.iter().filter_map(Listed::policy).collect();
    let kinds: Vec<PolicyKind> = order.iter().map(|p| p.kind()).collect();
    let has_retry = kinds.iter().any(|k| k.place() == Place::Retry);
    // The policy that makes the attempts: the retry, or hedging.
    let retry = seawall_order::attempts_by(&kinds).map_or("retry", PolicyKind::name);
    for (i, name) in order.iter().enumerate() {
        let Some(attempt) = name.kind.attempt_name() else {
            continue;
        };
        let call = name.kind.name();
        match (name.after_retry, scope(&kinds, i)) {
            (false, Scope::Attempt) => {
                return Err(err(format!(
                    "lists `{call}` after `{retry}`: `{call}` bounds the whole call and comes before `{retry}`; use `{attempt}` to bound each attempt"
                )))
            }
            (true, Scope::Call) if !has_retry => {
                return Err(ConfigError::new(
                    "pipeline",
                    attempt,
                    format!(
                        "needs a `retry` or `hedging` policy; without either use `{call}`"
                    ),
                ))
            }
            (true, Scope::Call) => {
                return Err(err(format!(
                    "lists `{attempt}` before `{retry}`: it bounds each attempt and comes after `{retry}`"
                )))
            }
            _ => {}
        }
    }
    Ok(listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration(" 1h 30m "), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        let e = parse_duration("200").unwrap_err();
        assert!(e.starts_with("invalid duration `200`: "), "{e}");
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn policy_names_are_the_registered_names() {
        use serde::de::value::{Error, StrDeserializer};
        let all: Vec<&str> = PolicyName::all().map(PolicyName::as_str).collect();
        assert_eq!(
            all,
            [
                "coalesce",
                "timeout",
                "retry",
                "hedging",
                "attempt_timeout",
                "circuit_breaker",
                "bulkhead",
                "cooldown",
                "rate_limiter",
                "adaptive_limit",
                "chaos"
            ]
        );
        for p in PolicyName::all() {
            let read = PolicyName::deserialize(StrDeserializer::<Error>::new(p.as_str()));
            assert_eq!(read, Ok(p));
        }
        for k in PolicyKind::ALL {
            let read = PolicyName::deserialize(StrDeserializer::<Error>::new(k.name()));
            assert_eq!(read.map(PolicyName::kind), Ok(*k), "{k:?}");
        }
    }

    /// Every policy of `seawall_order`'s table is a section of the files
    /// (read by the table's keys), a declaration of the builder, and the
    /// same declaration either way.
    #[test]
    fn every_registered_policy_is_configured_and_declared() {
        use crate::config::{Config, Format};
        use crate::{Bulkhead, CircuitBreaker, Cooldown, Pipeline, RateLimiter, Retry};
        for &kind in PolicyKind::ALL {
            // The smallest section of each policy and its builder call; a
            // new policy fails to compile here until it is given both.
            let ms = Duration::from_millis;
            let (section, builder) = match kind {
                PolicyKind::Timeout => {
                    ("timeout = \"1s\"", Pipeline::builder("a").timeout(ms(1000)))
                }
                PolicyKind::Retry => (
                    "retry = { delay = \"1ms\" }",
                    Pipeline::builder("a").retry(Retry::exponential(ms(1))),
                ),
                PolicyKind::CircuitBreaker => (
                    "circuit_breaker = { consecutive_failures = 3 }",
                    Pipeline::builder("a").circuit_breaker(CircuitBreaker::consecutive_failures(3)),
                ),
                PolicyKind::Bulkhead => (
                    "bulkhead = { max_concurrent = 1 }",
                    Pipeline::builder("a").bulkhead(Bulkhead::new(1)),
                ),
                PolicyKind::Cooldown => (
                    "cooldown = {}",
                    Pipeline::builder("a").cooldown(Cooldown::new()),
                ),
                PolicyKind::RateLimiter => (
                    "rate_limiter = { limit = 1, period = \"1s\" }",
                    Pipeline::builder("a").rate_limiter(RateLimiter::gcra(1, ms(1000))),
                ),
                PolicyKind::Hedging => (
                    "hedging = { delay = \"1s\" }",
                    Pipeline::builder("a").hedging(crate::Hedging::latency(ms(1000))),
                ),
                PolicyKind::Chaos => (
                    "chaos = { rate = 0.5, latency = \"1s\" }",
                    Pipeline::builder("a").chaos(crate::Chaos::latency(0.5, ms(1000))),
                ),
                PolicyKind::AdaptiveLimit => (
                    "adaptive_limit = {}",
                    Pipeline::builder("a").adaptive_limit(crate::AdaptiveLimit::gradient2()),
                ),
                PolicyKind::Coalesce => (
                    "coalesce = { ttl = \"1s\", max_entries = 8 }",
                    Pipeline::builder("a")
                        .coalesce(crate::Coalesce::new().ttl(ms(1000)).max_entries(8)),
                ),
                // Not in the table: a policy written in code is listed by
                // its name (`tests/custom_policy.rs`).
                PolicyKind::CustomCall | PolicyKind::CustomAttempt => continue,
            };
            let config = Config::parse(Format::Toml, &format!("[pipelines.a]\n{section}\n"))
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            let from_file = config.builder("a").expect("configured");
            assert_eq!(from_file.declared_kinds(), [kind]);
            assert_eq!(builder.declared_kinds(), [kind]);
            assert_eq!(format!("{from_file:?}"), format!("{builder:?}"));

            let text = format!("[pipelines.a.{}]\nx = 1\n", kind.name());
            let e = Config::parse(Format::Toml, &text).unwrap_err().to_string();
            let keys: Vec<&str> = kind.settings().iter().map(|s| s.key).collect();
            let expected = format!("unknown field `x`, {}", one_of(&keys));
            assert!(e.contains(&expected), "{e}\nshould contain: {expected}");
        }
    }

    /// The file's documentation names every registered section and key.
    #[test]
    fn every_registered_key_is_documented() {
        let docs = include_str!("mod.rs");
        for name in PolicyName::all() {
            let section = format!("`{}`", name.as_str());
            assert!(docs.contains(&section), "{section} is not documented");
        }
        for kind in PolicyKind::ALL {
            for s in kind.settings() {
                let keys: Vec<&str> = match s.value {
                    Value::Table(nested) => nested.iter().map(|n| n.key).collect(),
                    _ => vec![s.key],
                };
                for key in keys {
                    let quoted = format!("`{key}`");
                    let inline = format!("{key} = ");
                    assert!(
                        docs.contains(&quoted) || docs.contains(&inline),
                        "{kind:?}.{key} is not documented"
                    );
                }
            }
        }
    }

    #[test]
    fn serde_wording_of_expected_names() {
        assert_eq!(one_of(&[]), "there are no fields");
        assert_eq!(one_of(&["a"]), "expected `a`");
        assert_eq!(one_of(&["a", "b"]), "expected `a` or `b`");
        assert_eq!(one_of(&["a", "b", "c"]), "expected one of `a`, `b`, `c`");
    }

    #[test]
    fn jitters() {
        assert_eq!(parse_jitter("none"), Ok(Jitter::None));
        assert_eq!(parse_jitter("full"), Ok(Jitter::Full));
        assert_eq!(parse_jitter("equal"), Ok(Jitter::Equal));
        assert_eq!(parse_jitter("20%"), Ok(Jitter::Proportional(20.0)));
        assert_eq!(parse_jitter("12.5 %"), Ok(Jitter::Proportional(12.5)));
        assert!(parse_jitter("20").is_err());
        assert!(parse_jitter("lots").is_err());
    }
}
