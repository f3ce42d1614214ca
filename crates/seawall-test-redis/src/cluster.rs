//! A real Redis Cluster on loopback: six `redis-server --cluster-enabled
//! yes` nodes on free ports, each in its own directory of one temporary
//! directory, joined by `redis-cli --cluster create … --cluster-replicas 1`
//! into three masters with one replica each.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{answers, binary, note_running, note_stopped, program};

/// The `redis-cli` binary: `$REDIS_CLI`, or `redis-cli` on the PATH (Debian's
/// `redis-tools`, a dependency of `redis-server`).
fn cli() -> PathBuf {
    program("REDIS_CLI", "redis-cli", "redis-tools")
}

/// A free loopback port whose cluster bus port (the port + 10000) is free
/// too.
fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let port = crate::free_port();
        let Some(bus) = port.checked_add(10_000) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port with a free cluster bus port");
}

/// One node of a [`RedisCluster`].
#[derive(Debug)]
pub struct ClusterNode {
    port: u16,
    child: Option<Child>,
}

impl ClusterNode {
    /// The node's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `true` while the node's process runs (it was not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// A Redis Cluster of three masters with one replica each, on 127.0.0.1,
/// in a temporary directory; every node is killed on drop.
///
/// Nodes save nothing (`--save ""`, no AOF): a node killed and started again
/// comes back empty, with its cluster configuration (`nodes.conf`, kept in
/// its directory). Every node's process id is listed in
/// `$SEAWALL_TEST_SERVERS` while it runs (as [`RedisServer`](crate::RedisServer)
/// does), and a watcher process kills the nodes if the test process ends
/// without dropping the cluster (a cluster held in a `static`).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<ClusterNode>,
    args: Vec<String>,
    dir: tempfile::TempDir,
    watcher: Option<Child>,
}

/// What `CLUSTER NODES` says of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// The master's id, for a replica.
    of: Option<String>,
    slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Node timeout of a cluster started by [`start`](Self::start): long
    /// enough that a loaded machine never fails a node over by mistake.
    pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(5);

    /// A cluster with the default settings (node timeout
    /// [`DEFAULT_NODE_TIMEOUT`](Self::DEFAULT_NODE_TIMEOUT)).
    pub fn start() -> RedisCluster {
        Self::start_with(&[])
    }

    /// A cluster whose nodes take extra `redis-server` arguments (e.g.
    /// `--cluster-node-timeout 2000`; later arguments win).
    pub fn start_with(args: &[&str]) -> RedisCluster {
        for _ in 0..3 {
            if let Some(cluster) = Self::try_start(args) {
                return cluster;
            }
        }
        panic!("the redis cluster did not start after 3 tries");
    }

    fn try_start(args: &[&str]) -> Option<RedisCluster> {
        let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let timeout = Self::DEFAULT_NODE_TIMEOUT.as_millis().to_string();
        args.splice(0..0, ["--cluster-node-timeout".to_owned(), timeout]);
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            args,
            dir: tempfile::tempdir().expect("temporary directory"),
            watcher: None,
        };
        cluster.watch();
        let mut ports: Vec<u16> = Vec::new();
        while ports.len() < 6 {
            let port = free_cluster_port();
            if !ports.contains(&port) && !ports.contains(&(port + 10_000)) {
                ports.push(port);
            }
        }
        for port in ports {
            let mut node = ClusterNode { port, child: None };
            if !cluster.spawn(&mut node) {
                cluster.nodes.push(node);
                return None;
            }
            cluster.nodes.push(node);
        }
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(cli())
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        if !out.status.success() {
            eprintln!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        cluster
            .wait_until_ready(Duration::from_secs(30))
            .then_some(cluster)
    }

    /// A process that kills the nodes once this test process has ended
    /// while the cluster's directory still exists (it was not dropped).
    fn watch(&mut self) {
        let script = r#"while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 0.5; done
if [ -d "$2" ]; then
  for f in "$2"/*/pid; do
    [ -e "$f" ] || continue
    p=$(cat "$f")
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = redis-server ] && kill -9 "$p" 2>/dev/null
  done
fi"#;
        let watcher = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("seawall-cluster-watcher")
            .arg(std::process::id().to_string())
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh");
        self.watcher = Some(watcher);
    }

    fn node_dir(&self, port: u16) -> PathBuf {
        self.dir.path().join(port.to_string())
    }

    /// Starts `node`'s process and waits until it answers PING (5 s at most).
    fn spawn(&self, node: &mut ClusterNode) -> bool {
        let dir = self.node_dir(node.port);
        std::fs::create_dir_all(&dir).expect("node directory");
        let child = Command::new(binary())
            .arg("--port")
            .arg(node.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes"])
            .args(["--cluster-config-file", "nodes.conf"])
            .arg("--dir")
            .arg(&dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        note_running(child.id());
        let _ = std::fs::write(dir.join("pid"), child.id().to_string());
        node.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if node
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some())
            {
                if let Some(c) = node.child.take() {
                    note_stopped(c.id());
                }
                return false;
            }
            if answers(node.port) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill(node);
        false
    }

    /// Waits until every running node reports `cluster_state:ok`, knows
    /// every other node, agrees on which node serves every slot, and every
    /// replica's link to its master is up.
    pub fn wait_until_ready(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.ready() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn ready(&self) -> bool {
        let mut views = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_running()) {
            let Some(mut c) = self.try_conn(node.port) else {
                return false;
            };
            let Ok(info) = redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut c) else {
                return false;
            };
            if field(&info, "cluster_state") != Some("ok") {
                return false;
            }
            let Ok(replication) = redis::cmd("INFO")
                .arg("replication")
                .query::<String>(&mut c)
            else {
                return false;
            };
            if field(&replication, "role") == Some("slave")
                && field(&replication, "master_link_status") != Some("up")
            {
                return false;
            }
            let Ok(nodes) = redis::cmd("CLUSTER").arg("NODES").query::<String>(&mut c) else {
                return false;
            };
            let mut owners: Vec<(u16, u16, u16)> = parse_nodes(&nodes)
                .iter()
                .filter(|n| n.master && !n.failed)
                .flat_map(|n| n.slots.iter().map(move |&(a, b)| (a, b, n.port)))
                .collect();
            owners.sort_unstable();
            views.push(owners);
        }
        views.windows(2).all(|w| w[0] == w[1])
            && views.first().is_some_and(|v| {
                v.iter().map(|(a, b, _)| u32::from(b - a) + 1).sum::<u32>() == 16384
            })
    }

    /// The ports of all six nodes, running or not.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `redis://127.0.0.1:<port>` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.ports().into_iter().map(url).collect()
    }

    /// `redis://127.0.0.1:<port>` of the masters (as one of the running nodes
    /// sees them now).
    pub fn master_urls(&self) -> Vec<String> {
        self.masters().into_iter().map(url).collect()
    }

    /// The ports of the masters that serve slots, as a running node sees
    /// them now.
    pub fn masters(&self) -> Vec<u16> {
        let mut m: Vec<u16> = self
            .view()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        m.sort_unstable();
        m
    }

    /// The port of the master that serves `slot`, as a running node sees it
    /// now.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.view()
            .into_iter()
            .find(|n| {
                n.master && !n.failed && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        let port = self.any_running();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.conn(port))
            .expect("CLUSTER KEYSLOT")
    }

    /// The port of the master that serves `key`.
    pub fn master_of(&self, key: &str) -> u16 {
        self.master_of_slot(self.keyslot(key))
    }

    /// The port of the replica of the master on `master`.
    pub fn replica_of(&self, master: u16) -> u16 {
        let view = self.view();
        let id = view
            .iter()
            .find(|n| n.port == master)
            .map(|n| n.id.clone())
            .unwrap_or_else(|| panic!("no node on port {master}"));
        view.iter()
            .find(|n| n.of.as_deref() == Some(id.as_str()) && !n.failed)
            .map(|n| n.port)
            .unwrap_or_else(|| panic!("the master on {master} has no replica"))
    }

    /// `true` when the node on `port` answers `ROLE` as a master.
    pub fn is_master(&self, port: u16) -> bool {
        self.try_conn(port).is_some_and(|mut c| {
            redis::cmd("ROLE")
                .query::<redis::Value>(&mut c)
                .ok()
                .and_then(|v| match v {
                    redis::Value::Array(items) => items.into_iter().next(),
                    _ => None,
                })
                .is_some_and(|first| matches!(first, redis::Value::BulkString(b) if b == b"master"))
        })
    }

    fn any_running(&self) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.is_running() && answers(n.port))
            .map(|n| n.port)
            .expect("no node of the cluster is running")
    }

    /// `CLUSTER NODES` of a running node.
    fn view(&self) -> Vec<NodeLine> {
        let port = self.any_running();
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut self.conn(port))
            .expect("CLUSTER NODES");
        parse_nodes(&text)
    }

    /// Kills the node on `port` with SIGKILL (no shutdown, no save).
    pub fn kill(&mut self, port: u16) {
        kill(self.node_mut(port));
    }

    /// Starts the node on `port` again: empty (nothing is saved), with its
    /// cluster configuration.
    pub fn restart(&mut self, port: u16) {
        self.kill(port);
        let index = self
            .nodes
            .iter()
            .position(|n| n.port == port)
            .expect("a node of the cluster");
        let mut node = ClusterNode { port, child: None };
        for _ in 0..50 {
            if self.spawn(&mut node) {
                self.nodes[index] = node;
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("cluster node did not restart on port {port}");
    }

    /// The process id of the node on `port`.
    pub fn pid(&self, port: u16) -> u32 {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
            .expect("a running node")
    }

    fn node_mut(&mut self, port: u16) -> &mut ClusterNode {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    fn try_conn(&self, port: u16) -> Option<redis::Connection> {
        let client = redis::Client::open(url(port)).ok()?;
        let c = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        Some(c)
    }

    /// A plain connection to one node (commands on keys it does not serve
    /// answer `MOVED`).
    pub fn conn(&self, port: u16) -> redis::Connection {
        self.try_conn(port)
            .unwrap_or_else(|| panic!("connect to cluster node {port}"))
    }

    /// The cluster's temporary directory (a directory per node, named after
    /// its port).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

fn kill(node: &mut ClusterNode) {
    if let Some(mut c) = node.child.take() {
        let _ = c.kill();
        let _ = c.wait();
        note_stopped(c.id());
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            kill(node);
        }
        if let Some(mut w) = self.watcher.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// `name:value` of an `INFO`-style text.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
    })
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
            let address = f[1].split('@').next()?;
            let port = address.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => {
                        let n = s.parse().ok()?;
                        Some((n, n))
                    }
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?"),
                of: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_are_read() {
        let text = "dd7d 127.0.0.1:17003@27003 master - 0 1 3 connected 10923-16383\n\
                    4964 127.0.0.1:17005@27005 slave dd7d 0 1 3 connected\n\
                    9ca3 127.0.0.1:17001@27001 myself,master - 0 1 1 connected 0-5460 7000 [93-<-x]\n\
                    c507 127.0.0.1:17002@27002 master,fail - 0 1 2 disconnected\n";
        let nodes = parse_nodes(text);
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[0].slots, vec![(10923, 16383)]);
        assert_eq!(nodes[1].of.as_deref(), Some("dd7d"));
        assert!(!nodes[1].master);
        assert_eq!(nodes[2].slots, vec![(0, 5460), (7000, 7000)]);
        assert!(nodes[3].failed && nodes[3].master);
    }
}
