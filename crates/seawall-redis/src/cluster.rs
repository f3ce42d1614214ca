//! What the store reads of the servers it talks to: who serves which slots
//! (`CLUSTER SLOTS`), each master's identity and replication history
//! (`INFO`), and the check of a cluster's node list (`CLUSTER NODES`,
//! `CLUSTER INFO`) before the store first uses it.

use std::time::{Duration, Instant};

use redis::Value;
use seawall::StoreError;

use crate::error::Redacted;

/// The last slot of a cluster (slots are `0..=LAST_SLOT`); a single server
/// serves them all.
pub(crate) const LAST_SLOT: u16 = 16383;

/// The identity of one server: its process (`run_id`), when it started, and
/// the replication history its data belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeIdentity {
    pub(crate) run_id: String,
    /// When the process started, on this process's monotonic clock: when it
    /// was seen, less its uptime less a second; when it was seen if the
    /// uptime is unknown. Redis gives the uptime as the distance between
    /// two times in whole seconds (now and the start, each rounded down),
    /// up to a second more than the time the process has run: a second
    /// less is never more, so the start read is never early (up to two
    /// seconds late).
    pub(crate) started: Instant,
    /// `master_replid`: the history of the data set it serves.
    replid: String,
    /// `master_replid2`: the history it continued when it was promoted
    /// from replica to master (all zeros if it never was).
    replid2: String,
}

impl NodeIdentity {
    /// `true` when `self`'s data is `before`'s: the same process, or a
    /// replica of it promoted since (its previous history is `before`'s);
    /// what `before` wrote and had not yet replicated is lost all the same
    /// (replication is asynchronous).
    pub(crate) fn continues(&self, before: &NodeIdentity) -> bool {
        self.run_id == before.run_id
            || (!before.replid.is_empty()
                && (self.replid2 == before.replid || self.replid == before.replid))
    }
}

/// `INFO` of one server as its identity, seen at `seen`; `None` when the
/// text holds no `run_id`.
pub(crate) fn parse_info(text: &str, seen: Instant) -> Option<NodeIdentity> {
    let (mut run_id, mut uptime, mut replid, mut replid2) = (None, None, "", "");
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(id) = line.strip_prefix("run_id:") {
            run_id = Some(id.to_owned());
        } else if let Some(secs) = line.strip_prefix("uptime_in_seconds:") {
            uptime = secs.parse().ok().map(Duration::from_secs);
        } else if let Some(id) = line.strip_prefix("master_replid:") {
            replid = id;
        } else if let Some(id) = line.strip_prefix("master_replid2:") {
            replid2 = id;
        }
    }
    Some(NodeIdentity {
        run_id: run_id?,
        started: uptime
            .and_then(|u| seen.checked_sub(u.saturating_sub(Duration::from_secs(1))))
            .unwrap_or(seen),
        replid: replid.to_owned(),
        replid2: replid2.to_owned(),
    })
}

/// `name:value` of an `INFO`-style text.
pub(crate) fn info_field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// Slots `start..=end` and the master that serves them (`host`, `port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRange {
    pub(crate) start: u16,
    pub(crate) end: u16,
    pub(crate) host: String,
    pub(crate) port: u16,
}

/// A `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, …], replicas…], …]`.
pub(crate) fn parse_slots(reply: &Value) -> Result<Vec<SlotRange>, StoreError> {
    let bad = || StoreError::Protocol(format!("unexpected CLUSTER SLOTS reply: {reply:?}"));
    let Value::Array(ranges) = reply else {
        return Err(bad());
    };
    let int = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(items) = range else {
            return Err(bad());
        };
        let (Some(start), Some(end), Some(Value::Array(master))) = (
            items.first().and_then(int),
            items.get(1).and_then(int),
            items.get(2),
        ) else {
            return Err(bad());
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad()),
        };
        let port = master.get(1).and_then(int).ok_or_else(bad)?;
        out.push(SlotRange {
            start,
            end,
            host,
            port,
        });
    }
    out.sort_by_key(|r| r.start);
    Ok(out)
}

/// A cluster node's `cluster_state`: `Err` unless it is `ok`, naming the
/// node.
pub(crate) fn check_state(node: &str, cluster_info: &str) -> Result<(), StoreError> {
    match info_field(cluster_info, "cluster_state") {
        Some("ok") => Ok(()),
        state => Err(StoreError::Unavailable(format!(
            "redis cluster node {node} reports cluster_state:{}: the cluster cannot serve every \
             slot (a master is down and not yet replaced, or slots are unassigned)",
            state.unwrap_or("unknown")
        ))),
    }
}

/// What `CLUSTER NODES` says of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    myself: bool,
    master: bool,
    serves_slots: bool,
}

/// `CLUSTER NODES` lines: `id ip:port@bus flags master ping pong epoch link
/// slots…`.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let flags: Vec<&str> = f[2].split(',').collect();
            Some(NodeLine {
                id: f[0].to_owned(),
                myself: flags.contains(&"myself"),
                master: flags.contains(&"master"),
                serves_slots: f[8..].iter().any(|s| !s.starts_with('[')),
            })
        })
        .collect()
}

/// One node of the list a cluster store was given, as it describes itself.
struct Seed {
    shown: String,
    id: String,
    members: Vec<String>,
}

/// Checks the node list of a cluster store, node by node, on connections of
/// their own: every node that answers must be a cluster node
/// (`cluster_enabled:1`), a node of the same cluster as the first one that
/// answered, and a master that serves slots or a replica (a node of one of
/// the cluster's shards); the cluster must be in state `ok`. Nodes that do
/// not answer are skipped (an outage, not a wrong list), unless none does.
///
/// # Errors
/// [`StoreError::Refused`] naming the node for a list that is not one
/// cluster's (and for a wrong password); [`StoreError::Unavailable`]
/// naming the node for a cluster in state `fail`; the last outage when no
/// node answered.
pub(crate) fn check_nodes(
    nodes: &[(redis::Client, Redacted)],
    connect_timeout: Duration,
    timeout: Duration,
    error: impl Fn(&Redacted, &redis::RedisError, Duration) -> StoreError,
) -> Result<(), StoreError> {
    let mut first: Option<Seed> = None;
    let mut last_outage = None;
    let mut unhealthy = None;
    for (client, shown) in nodes {
        let conn = client
            .get_connection_with_timeout(connect_timeout)
            .and_then(|c| {
                c.set_read_timeout(Some(timeout))?;
                c.set_write_timeout(Some(timeout))?;
                Ok(c)
            });
        let mut c = match conn {
            Ok(c) => c,
            Err(e) => {
                let e = error(shown, &e, connect_timeout);
                if crate::error::is_outage(&e) {
                    last_outage = Some(e);
                    continue;
                }
                return Err(e);
            }
        };
        let mut query = |cmd: &redis::Cmd| -> Result<String, StoreError> {
            cmd.query::<String>(&mut c)
                .map_err(|e| error(shown, &e, timeout))
        };
        let info = match query(&redis::cmd("INFO")) {
            Ok(info) => info,
            Err(e) if crate::error::is_outage(&e) => {
                last_outage = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        };
        if info_field(&info, "cluster_enabled") != Some("1") {
            return Err(StoreError::Refused(format!(
                "redis at {shown} is not a cluster node (cluster_enabled is not 1): \
                 `RedisStore::cluster` takes the nodes of one Redis Cluster; a single server \
                 is opened with `RedisStore::builder`"
            )));
        }
        let id = query(redis::cmd("CLUSTER").arg("MYID"))?;
        let view = parse_nodes(&query(redis::cmd("CLUSTER").arg("NODES"))?);
        let state = query(redis::cmd("CLUSTER").arg("INFO"))?;
        let me = view.iter().find(|n| n.myself);
        if me.is_some_and(|n| n.master && !n.serves_slots) {
            return Err(StoreError::Refused(format!(
                "redis cluster node {shown} is a master that serves no slots: it is not a node \
                 of the cluster's shards (list the cluster's masters or their replicas)"
            )));
        }
        let seed = Seed {
            shown: shown.shown().to_owned(),
            id,
            members: view.into_iter().map(|n| n.id).collect(),
        };
        match &first {
            None => first = Some(seed),
            Some(f) => {
                if !f.members.contains(&seed.id) || !seed.members.contains(&f.id) {
                    return Err(StoreError::Refused(format!(
                        "redis cluster node {} is not a node of the cluster of {}: the list \
                         must name the nodes of one cluster",
                        seed.shown, f.shown
                    )));
                }
            }
        }
        if unhealthy.is_none() {
            if let Err(e) = check_state(shown.shown(), &state) {
                unhealthy = Some(e);
            }
        }
    }
    if first.is_none() {
        return Err(last_outage.unwrap_or_else(|| {
            StoreError::Unavailable("no node of the redis cluster answered".into())
        }));
    }
    match unhealthy {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_reads_identity_and_history() {
        let seen = Instant::now() + Duration::from_secs(100);
        let a = parse_info(
            "# Server\r\nrun_id:aaa\r\nuptime_in_seconds:7\r\n# Replication\r\n\
             master_replid:r1\r\nmaster_replid2:0000\r\n",
            seen,
        )
        .unwrap();
        assert_eq!(a.run_id, "aaa");
        // Up 7 s by two readings in whole seconds: at least 6 s.
        assert_eq!(seen - a.started, Duration::from_secs(6));
        let fresh = parse_info("run_id:ddd\nuptime_in_seconds:0\n", seen).unwrap();
        assert_eq!(fresh.started, seen);
        let promoted = parse_info(
            "run_id:bbb\nuptime_in_seconds:1\nmaster_replid:r2\nmaster_replid2:r1\n",
            seen,
        )
        .unwrap();
        let restarted = parse_info(
            "run_id:ccc\nuptime_in_seconds:1\nmaster_replid:r3\nmaster_replid2:0000\n",
            seen,
        )
        .unwrap();
        assert!(a.continues(&a));
        assert!(promoted.continues(&a), "a replica of `a` promoted");
        assert!(!restarted.continues(&a), "a restart: a new history");
        assert!(!a.continues(&promoted));
        assert!(parse_info("uptime_in_seconds:1\n", seen).is_none());
    }

    #[test]
    fn slots_reply_is_read_in_slot_order() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("127.0.0.1", 7001),
                node("127.0.0.1", 7004),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7000),
            ]),
        ]);
        let ranges = parse_slots(&reply).unwrap();
        assert_eq!(ranges.len(), 2);
        assert_eq!(
            (ranges[0].start, ranges[0].end, ranges[0].port),
            (0, 5460, 7000)
        );
        assert_eq!((ranges[1].start, ranges[1].port), (5461, 7001));
        assert!(parse_slots(&Value::Int(1)).is_err());
    }

    #[test]
    fn state_names_the_node() {
        assert!(check_state("n", "cluster_state:ok\r\n").is_ok());
        let e = check_state("redis://127.0.0.1:7000", "cluster_state:fail\r\n").unwrap_err();
        assert!(
            matches!(&e, StoreError::Unavailable(m) if m.contains("127.0.0.1:7000") && m.contains("fail"))
        );
    }

    #[test]
    fn nodes_lines_tell_role_and_slots() {
        let v = parse_nodes(
            "aa 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-10\n\
             bb 127.0.0.1:3@4 slave aa 0 0 1 connected\n\
             cc 127.0.0.1:5@6 master - 0 0 1 connected\n",
        );
        assert!(v[0].myself && v[0].master && v[0].serves_slots);
        assert!(!v[1].master && !v[1].serves_slots);
        assert!(v[2].master && !v[2].serves_slots);
    }
}
