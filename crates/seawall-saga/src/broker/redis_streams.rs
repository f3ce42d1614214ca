//! [`Broker`] on Redis Streams (feature `redis-streams`).
//!
//! | operation | command |
//! |---|---|
//! | [`publish`](Broker::publish) | `XADD stream * event_id .. aggregate .. type .. payload .. created_ms ..` (one pipeline per batch) |
//! | [`create_group`](Broker::create_group) | `XGROUP CREATE stream group 0 MKSTREAM` (an existing group is kept) |
//! | [`read`](Broker::read) | `XREADGROUP GROUP group consumer COUNT n [BLOCK ms] STREAMS stream >` |
//! | [`ack`](Broker::ack) | `XACK stream group id...` |
//! | [`claim_stale`](Broker::claim_stale) | `XAUTOCLAIM stream group consumer min-idle-ms 0-0 COUNT n` |
//! | [`dead_letter`](Broker::dead_letter) | `XADD {stream}:dead-letter * ...` then `XACK` |
//!
//! The connection is made on first use and made again after a failure: a
//! server that is down when the broker is created, or that goes away, gives
//! [`BrokerError::Unavailable`] until it is back. A blocking `read` holds the
//! connection for its duration, so give each consumer its own `RedisStreams`.

use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};

use super::{
    dead_letter_stream, Broker, BrokerError, BrokerFuture, Delivery, Envelope, Subscription,
};

/// A [`Broker`] on Redis Streams.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), seawall_saga::broker::BrokerError> {
/// use seawall_saga::broker::redis_streams::RedisStreams;
/// let broker = RedisStreams::open("redis://127.0.0.1:6379")?;
/// # Ok(()) }
/// ```
pub struct RedisStreams {
    client: Client,
    connection: Mutex<Option<MultiplexedConnection>>,
    timeout: Duration,
}

impl std::fmt::Debug for RedisStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStreams")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// The fields of a stream entry carrying `e`.
fn fields_of(e: &Envelope) -> [(&'static str, String); 5] {
    [
        ("event_id", e.event_id.clone()),
        ("aggregate", e.aggregate.clone()),
        ("type", e.event_type.clone()),
        ("payload", e.payload.clone()),
        ("created_ms", e.created_at_ms.to_string()),
    ]
}

impl RedisStreams {
    /// A broker on the server at `url` (`redis://host:port/db`), with a 2 s
    /// timeout per operation (plus the blocking time of a `read`). No
    /// connection is made yet.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] when the URL is invalid.
    pub fn open(url: &str) -> Result<Self, BrokerError> {
        let client = Client::open(url)
            .map_err(|e| BrokerError::Config(format!("redis url refused: {e}")))?;
        Ok(RedisStreams {
            client,
            connection: Mutex::new(None),
            timeout: Duration::from_secs(2),
        })
    }

    /// The timeout of each operation (connecting included), at least 1 ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    async fn connection(&self, operation: &str) -> Result<MultiplexedConnection, BrokerError> {
        if let Some(c) = self.lock().clone() {
            return Ok(c);
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(None);
        let c = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| unavailable(operation, &e))?;
        *self.lock() = Some(c.clone());
        Ok(c)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.connection.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `pipe` with the operation timeout plus `extra`; a connection
    /// failure drops the connection (the next operation makes a new one).
    async fn query(
        &self,
        operation: &str,
        pipe: &redis::Pipeline,
        extra: Duration,
    ) -> Result<Vec<Value>, BrokerError> {
        let mut c = self.connection(operation).await?;
        let outcome =
            tokio::time::timeout(self.timeout + extra, pipe.query_async::<Vec<Value>>(&mut c))
                .await;
        match outcome {
            Ok(Ok(values)) => Ok(values),
            Ok(Err(e)) if is_refusal(&e) => Err(BrokerError::Refused {
                operation: operation.to_owned(),
                detail: e.to_string(),
            }),
            Ok(Err(e)) => {
                *self.lock() = None;
                Err(unavailable(operation, &e))
            }
            Err(_) => {
                *self.lock() = None;
                Err(BrokerError::Unavailable {
                    operation: operation.to_owned(),
                    detail: format!("no answer within {:?}", self.timeout + extra),
                })
            }
        }
    }

    /// Decodes `entries` (`[[id, [field, value, ...]], ...]`); the malformed
    /// ones are parked in the dead-letter stream and acknowledged.
    async fn decode(
        &self,
        subscription: &Subscription,
        entries: &[Value],
    ) -> Result<Vec<Delivery>, BrokerError> {
        let mut deliveries = Vec::new();
        let mut parked = redis::pipe();
        let mut any_parked = false;
        for entry in entries {
            // A claimed entry whose data was deleted (XDEL, MAXLEN) is nil.
            let Value::Array(parts) = entry else { continue };
            let [id, fields] = parts.as_slice() else {
                continue;
            };
            let Some(id) = text(id) else { continue };
            let fields = pairs(fields);
            match envelope(&fields) {
                Ok(envelope) => deliveries.push(Delivery { id, envelope }),
                Err(reason) => {
                    tracing::warn!(
                        target: "seawall_saga",
                        stream = %subscription.stream,
                        message = %id,
                        %reason,
                        "malformed message parked in the dead-letter stream"
                    );
                    park(&mut parked, subscription, &id, &reason, &fields);
                    any_parked = true;
                }
            }
        }
        if any_parked {
            self.query("parking malformed messages", &parked, Duration::ZERO)
                .await?;
        }
        Ok(deliveries)
    }
}

/// Adds to `pipe` the parking of message `id` (with its raw `fields`) in the
/// dead-letter stream, with `reason`, and its acknowledgement.
fn park(
    pipe: &mut redis::Pipeline,
    subscription: &Subscription,
    id: &str,
    reason: &str,
    fields: &[(Vec<u8>, Vec<u8>)],
) {
    let mut add = redis::cmd("XADD");
    add.arg(dead_letter_stream(&subscription.stream))
        .arg("*")
        .arg("original_id")
        .arg(id)
        .arg("group")
        .arg(&subscription.group)
        .arg("consumer")
        .arg(&subscription.consumer)
        .arg("reason")
        .arg(reason);
    for (field, value) in fields {
        let mut name = b"field.".to_vec();
        name.extend_from_slice(field);
        add.arg(name).arg(value);
    }
    pipe.add_command(add);
    pipe.cmd("XACK")
        .arg(&subscription.stream)
        .arg(&subscription.group)
        .arg(id);
}

fn unavailable(operation: &str, error: &redis::RedisError) -> BrokerError {
    BrokerError::Unavailable {
        operation: operation.to_owned(),
        detail: error.to_string(),
    }
}

/// An error the server answered with (the connection is fine).
fn is_refusal(error: &redis::RedisError) -> bool {
    !(error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_unrecoverable_error())
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

fn bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes.clone(),
        Value::SimpleString(s) => s.as_bytes().to_vec(),
        Value::Int(n) => n.to_string().into_bytes(),
        _ => Vec::new(),
    }
}

/// The field/value pairs of an entry (RESP2 flat array or RESP3 map).
fn pairs(fields: &Value) -> Vec<(Vec<u8>, Vec<u8>)> {
    match fields {
        Value::Array(flat) => flat
            .chunks(2)
            .map(|kv| (bytes(&kv[0]), kv.get(1).map(bytes).unwrap_or_default()))
            .collect(),
        Value::Map(map) => map.iter().map(|(k, v)| (bytes(k), bytes(v))).collect(),
        _ => Vec::new(),
    }
}

/// The envelope in `fields`, or why there is none.
fn envelope(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Envelope, String> {
    let field = |name: &str| -> Result<String, String> {
        let (_, value) = fields
            .iter()
            .find(|(k, _)| k == name.as_bytes())
            .ok_or_else(|| format!("field `{name}` is missing"))?;
        String::from_utf8(value.clone()).map_err(|_| format!("field `{name}` is not UTF-8"))
    };
    let event_id = field("event_id")?;
    if event_id.is_empty() {
        return Err("field `event_id` is empty".to_owned());
    }
    let created = field("created_ms")?;
    let created_at_ms = created
        .parse()
        .map_err(|_| format!("field `created_ms` is not an integer: {created:?}"))?;
    Ok(Envelope {
        event_id,
        aggregate: field("aggregate")?,
        event_type: field("type")?,
        payload: field("payload")?,
        created_at_ms,
    })
}

/// The entries of the one stream in an `XREADGROUP` reply (nil: none).
fn read_entries(reply: &Value) -> Vec<Value> {
    let streams: Vec<&Value> = match reply {
        Value::Array(streams) => streams.iter().collect(),
        Value::Map(map) => map.iter().map(|(_, v)| v).collect(),
        _ => return Vec::new(),
    };
    let mut entries = Vec::new();
    for stream in streams {
        match stream {
            Value::Array(parts) if parts.len() == 2 => {
                if let Value::Array(list) = &parts[1] {
                    entries.extend(list.iter().cloned());
                }
            }
            // RESP3 map: the value is the entry list itself.
            Value::Array(list) => entries.extend(list.iter().cloned()),
            _ => {}
        }
    }
    entries
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Broker for RedisStreams {
    fn publish<'a>(&'a self, stream: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            if events.is_empty() {
                return Ok(());
            }
            let mut pipe = redis::pipe();
            for e in events {
                let add = pipe.cmd("XADD").arg(stream).arg("*");
                for (field, value) in fields_of(e) {
                    add.arg(field).arg(value);
                }
            }
            self.query(&format!("publishing to {stream}"), &pipe, Duration::ZERO)
                .await
                .map(drop)
        })
    }

    fn create_group<'a>(&'a self, subscription: &'a Subscription) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.cmd("XGROUP")
                .arg("CREATE")
                .arg(&subscription.stream)
                .arg(&subscription.group)
                .arg("0")
                .arg("MKSTREAM");
            let operation = format!(
                "creating group {} on {}",
                subscription.group, subscription.stream
            );
            match self.query(&operation, &pipe, Duration::ZERO).await {
                Err(BrokerError::Refused { detail, .. }) if detail.contains("BUSYGROUP") => Ok(()),
                other => other.map(drop),
            }
        })
    }

    fn read<'a>(
        &'a self,
        subscription: &'a Subscription,
        count: usize,
        block: Duration,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            let read = pipe
                .cmd("XREADGROUP")
                .arg("GROUP")
                .arg(&subscription.group)
                .arg(&subscription.consumer)
                .arg("COUNT")
                .arg(count.max(1));
            if !block.is_zero() {
                read.arg("BLOCK").arg(millis(block).max(1));
            }
            read.arg("STREAMS").arg(&subscription.stream).arg(">");
            let operation = format!("reading {}", subscription.stream);
            let reply = self.query(&operation, &pipe, block).await?;
            let entries = reply.first().map(read_entries).unwrap_or_default();
            self.decode(subscription, &entries).await
        })
    }

    fn ack<'a>(
        &'a self,
        subscription: &'a Subscription,
        ids: &'a [String],
    ) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            if ids.is_empty() {
                return Ok(());
            }
            let mut pipe = redis::pipe();
            pipe.cmd("XACK")
                .arg(&subscription.stream)
                .arg(&subscription.group)
                .arg(ids);
            let operation = format!("acknowledging on {}", subscription.stream);
            self.query(&operation, &pipe, Duration::ZERO)
                .await
                .map(drop)
        })
    }

    fn claim_stale<'a>(
        &'a self,
        subscription: &'a Subscription,
        min_idle: Duration,
        count: usize,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.cmd("XAUTOCLAIM")
                .arg(&subscription.stream)
                .arg(&subscription.group)
                .arg(&subscription.consumer)
                .arg(millis(min_idle))
                .arg("0-0")
                .arg("COUNT")
                .arg(count.max(1));
            let operation = format!("claiming stale messages on {}", subscription.stream);
            let reply = self.query(&operation, &pipe, Duration::ZERO).await?;
            let entries = match reply.first() {
                Some(Value::Array(parts)) => match parts.get(1) {
                    Some(Value::Array(entries)) => entries.clone(),
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            self.decode(subscription, &entries).await
        })
    }

    fn dead_letter<'a>(
        &'a self,
        subscription: &'a Subscription,
        delivery: &'a Delivery,
        reason: &'a str,
    ) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            let fields: Vec<(Vec<u8>, Vec<u8>)> = fields_of(&delivery.envelope)
                .into_iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.into_bytes()))
                .collect();
            let mut pipe = redis::pipe();
            park(&mut pipe, subscription, &delivery.id, reason, &fields);
            let operation = format!("parking a message of {}", subscription.stream);
            self.query(&operation, &pipe, Duration::ZERO)
                .await
                .map(drop)
        })
    }
}
