//! The `redis-server` the examples start when no `--url` is given.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of our own, on a free loopback port.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
    _dir: tempfile::TempDir,
}

impl Server {
    pub(crate) fn start() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on the PATH (apt-get install redis-server)");
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while client
            .get_connection_with_timeout(Duration::from_millis(100))
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server {
            child,
            url,
            _dir: dir,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
