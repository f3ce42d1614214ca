//! A throw-away `redis-server` of the demo's own, for `choreography` and
//! `--redis`: a free loopback port, a directory of its own, no persistence.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Failure;

/// A running `redis-server` and its directory, both gone on drop.
#[derive(Debug)]
pub(crate) struct RedisServer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port in `dir` (created if
    /// needed, removed on drop); `what` names the part of the demo that
    /// needs it, for the error.
    ///
    /// # Errors
    /// [`Failure::BadInput`] when `redis-server` is not on the PATH;
    /// [`Failure::Runtime`] when it does not answer within 5 s.
    pub(crate) fn start(dir: &Path, what: &str) -> Result<RedisServer, Failure> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::Runtime(format!("cannot create {}: {e}", dir.display())))?;
        let started = Self::spawn(dir, what);
        if started.is_err() {
            let _ = std::fs::remove_dir_all(dir);
        }
        started
    }

    fn spawn(dir: &Path, what: &str) -> Result<RedisServer, Failure> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Failure::Runtime(format!("no free loopback port: {e}")))?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Failure::BadInput(format!("{what} needs redis-server on PATH ({e})")))?;
        let redis = RedisServer {
            child,
            dir: dir.to_owned(),
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !redis.answers() {
            if Instant::now() > deadline {
                return Err(Failure::Runtime(
                    "redis-server did not answer PING within 5 s".to_owned(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(redis)
    }

    /// Whether the server answers PING.
    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
        let mut reply = [0u8; 5];
        stream.write_all(b"PING\r\n").is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && &reply == b"+PONG"
    }

    /// The URL of the server.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
