//! The harness starts a server that accepts AMQP, through a proxy too.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use seawall_test_rabbitmq::{Proxy, RabbitServer};

fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(b"AMQP\x00\x00\x09\x01").unwrap();
    let mut b = [0u8; 1];
    matches!(s.read(&mut b), Ok(1) if b[0] == 1)
}

#[test]
fn a_server_starts_answers_through_a_proxy_and_stops() {
    let started = Instant::now();
    let mut server = RabbitServer::start();
    eprintln!("started in {:?}", started.elapsed());
    assert!(answers(server.port()));
    let proxy = Proxy::start(server.port());
    assert!(answers(proxy.port()));
    proxy.cut();
    assert!(!answers(proxy.port()));
    proxy.restore();
    assert!(answers(proxy.port()));
    let port = server.port();
    server.stop();
    assert!(!answers(port));
}
