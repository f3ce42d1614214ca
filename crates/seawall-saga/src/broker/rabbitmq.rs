//! [`Broker`] on RabbitMQ (feature `rabbitmq`), through `lapin` (AMQP 0-9-1)
//! on tokio.
//!
//! | operation | AMQP |
//! |---|---|
//! | [`publish`](Broker::publish) | `basic.publish` to the durable fanout exchange named after the stream, persistent, `mandatory`, on a channel in confirm mode; returns once the broker confirmed every event |
//! | [`create_group`](Broker::create_group) | `exchange.declare {stream}` (durable fanout), `queue.declare {stream}:{group}` (durable), `queue.bind`, `queue.declare {stream}:dead-letter` (durable) |
//! | [`read`](Broker::read) | `basic.get {stream}:{group}` (manual acknowledgement), one per message, until `count` messages, the queue is empty or half the timeout has passed; an empty queue is polled until `block` runs out |
//! | [`ack`](Broker::ack) | `basic.ack` of the delivery tags on the channel that read them |
//! | [`claim_stale`](Broker::claim_stale) | nothing: the broker gives a dead consumer's messages back by itself (below) |
//! | [`dead_letter`](Broker::dead_letter) | `basic.publish` to the queue `{stream}:dead-letter` (confirmed), then `basic.ack` |
//!
//! # Mapping
//!
//! - **Stream**: a durable fanout exchange named after the stream. An
//!   exchange keeps nothing: a message reaches the groups bound when it is
//!   published. A publication that no group receives is returned by the
//!   broker (`mandatory`) and [`publish`](Broker::publish) fails with
//!   [`BrokerError::Refused`]: a relay keeps such events in its outbox until a
//!   group exists, so create the groups (consumers' start-up) before relying
//!   on delivery. A group created later does not receive what was published
//!   before it (Redis Streams would: "from the start of the stream").
//! - **Group**: a durable queue `{stream}:{group}` bound to the exchange; the
//!   consumers of a group compete for the messages of that queue. The
//!   consumer's name is only reported in the dead-letter queue.
//! - **Message**: the body is [`Envelope::payload`]; the headers `event_id`,
//!   `aggregate`, `type` (strings) and `created_ms` (a 64-bit integer) carry
//!   the rest; delivery mode 2 (persistent). A message that lacks one of them,
//!   or whose body or headers are not UTF-8 text, is malformed: it is parked
//!   in the dead-letter queue with the reason, acknowledged, and never
//!   returned by `read`.
//! - **Ids**: [`Delivery::id`] is `{channel}-{delivery tag}`, where
//!   `{channel}` numbers the channel that read the message, unique in the
//!   process. Acknowledge through the `RabbitMq` that read the message: a
//!   delivery tag means something only on its channel.
//! - **Dead letters**: the queue `{stream}:dead-letter`
//!   ([`dead_letter_stream`]); a parked message keeps its body, its headers
//!   prefixed with `field.`, and gains the headers `reason`, `original_id`,
//!   `group` and `consumer`, as on Redis Streams.
//!
//! # Messages of a consumer that died
//!
//! RabbitMQ gives the unacknowledged messages of a channel back to their
//! queue as soon as the channel or its connection closes (the process died,
//! the network failed): they are read again by the group's consumers (with
//! AMQP's `redelivered` flag; the broker puts them back at their place in
//! the queue when it can). So
//! [`claim_stale`](Broker::claim_stale) has nothing to take over and
//! returns no message; a consumer that is alive but holds messages without
//! acknowledging them keeps them until the broker's `consumer_timeout`
//! closes its channel.
//!
//! # Failures
//!
//! The connection (and its two channels, one for publishing in confirm
//! mode, one for reading) is made on first use and made again after any
//! failure: a broker that is down when the `RabbitMq` is created, or that
//! goes away, gives [`BrokerError::Unavailable`] until it is back; an
//! operation the broker refuses (a queue missing, an argument it rejects)
//! gives [`BrokerError::Refused`]. Either way the connection is closed and
//! the messages read through it and not yet acknowledged go back to their
//! queue, to be read again (the inbox drops the ones already handled); their
//! ids are then stale, and acknowledging them does nothing. (A publication
//! that no group receives is refused too, but keeps the connection.) An
//! acknowledgement written just as the connection drops may report success
//! and never arrive: its messages come back all the same.
//!
//! A blocking [`read`](Broker::read) polls an empty queue (every 1 ms at
//! first, backing off to 25 ms) until a message comes or `block` runs out.
//! Operations of one `RabbitMq` share its connection and may run
//! concurrently.

use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};

use super::{
    dead_letter_stream, Broker, BrokerError, BrokerFuture, Delivery, Envelope, Subscription,
};

/// A [`Broker`] on RabbitMQ (see the [module documentation](self) for the
/// mapping of streams, groups and messages).
///
/// # Examples
///
/// ```no_run
/// # fn main() -> Result<(), seawall_saga::broker::BrokerError> {
/// use seawall_saga::broker::rabbitmq::RabbitMq;
/// let broker = RabbitMq::open("amqp://guest:guest@127.0.0.1:5672/%2f")?;
/// # Ok(()) }
/// ```
pub struct RabbitMq {
    url: String,
    timeout: Duration,
    session: Mutex<Option<Arc<Session>>>,
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for RabbitMq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitMq")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Numbers the channels that read messages, in the whole process: an id of
/// one channel is never taken for an id of another.
static CHANNELS: AtomicU64 = AtomicU64::new(1);

/// A connection with its channels.
struct Session {
    /// The number of the reading channel (the first part of the ids).
    number: u64,
    /// Kept for its lifetime: dropping the last handle closes the connection.
    _connection: Connection,
    /// In confirm mode.
    publish: Channel,
    /// `basic.get` and `basic.ack`.
    get: Channel,
    /// Delivery tags read on `get` and not acknowledged yet: acknowledging
    /// a tag twice would make the broker close the channel.
    outstanding: Mutex<HashSet<u64>>,
    /// The exchanges (`exchange {name}`) and queues (`queue {name}`) declared on
    /// this connection.
    declared: Mutex<HashSet<String>>,
}

/// Why an operation failed: the client's error, or one decided here.
enum Failure {
    Amqp(lapin::Error),
    Broker(BrokerError),
}

impl From<lapin::Error> for Failure {
    fn from(e: lapin::Error) -> Self {
        Failure::Amqp(e)
    }
}

impl From<BrokerError> for Failure {
    fn from(e: BrokerError) -> Self {
        Failure::Broker(e)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An AMQP short string (names, header keys: 255 bytes at most).
fn short(s: &str) -> Result<ShortString, BrokerError> {
    ShortString::try_new(s).map_err(|e| BrokerError::Refused {
        operation: format!("naming {s:?}"),
        detail: e.to_string(),
    })
}

/// The queue of a group.
fn group_queue(subscription: &Subscription) -> String {
    format!("{}:{}", subscription.stream, subscription.group)
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s.as_bytes()))
}

/// The properties of a message carrying `e`.
fn properties_of(e: &Envelope) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert("event_id".into(), text(&e.event_id));
    headers.insert("aggregate".into(), text(&e.aggregate));
    headers.insert("type".into(), text(&e.event_type));
    headers.insert("created_ms".into(), AMQPValue::LongLongInt(e.created_at_ms));
    persistent().with_headers(headers)
}

fn persistent() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

/// The text of a header value, or why there is none.
fn header_text(name: &str, value: &AMQPValue) -> Result<String, String> {
    let bytes = match value {
        AMQPValue::LongString(s) => s.as_bytes().to_vec(),
        AMQPValue::ShortString(s) => s.as_str().as_bytes().to_vec(),
        AMQPValue::ByteArray(b) => b.as_slice().to_vec(),
        other => return Err(format!("header `{name}` is not a string: {other:?}")),
    };
    String::from_utf8(bytes).map_err(|_| format!("header `{name}` is not UTF-8"))
}

/// The envelope in a message, or why there is none.
fn envelope(properties: &BasicProperties, body: &[u8]) -> Result<Envelope, String> {
    let empty = FieldTable::default();
    let headers = properties.headers().as_ref().unwrap_or(&empty).inner();
    let field = |name: &str| -> Result<&AMQPValue, String> {
        headers
            .get(name)
            .ok_or_else(|| format!("header `{name}` is missing"))
    };
    let event_id = header_text("event_id", field("event_id")?)?;
    if event_id.is_empty() {
        return Err("header `event_id` is empty".to_owned());
    }
    let created_at_ms = match field("created_ms")? {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::ShortUInt(n) => i64::from(*n),
        other => {
            let shown = header_text("created_ms", other).unwrap_or_else(|_| format!("{other:?}"));
            shown
                .parse()
                .map_err(|_| format!("header `created_ms` is not an integer: {shown:?}"))?
        }
    };
    let payload =
        String::from_utf8(body.to_vec()).map_err(|_| "the body is not UTF-8".to_owned())?;
    Ok(Envelope {
        event_id,
        aggregate: header_text("aggregate", field("aggregate")?)?,
        event_type: header_text("type", field("type")?)?,
        payload,
        created_at_ms,
    })
}

/// The channel number and delivery tag of an id.
fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (channel, tag) = id.split_once('-')?;
    Some((channel.parse().ok()?, tag.parse().ok()?))
}

impl RabbitMq {
    /// A broker on the server at `url` (`amqp://user:password@host:port/vhost`,
    /// the vhost URL-encoded: `%2f` for `/`), with a 2 s timeout per
    /// operation (plus the blocking time of a `read`). No connection is made
    /// yet.
    ///
    /// # Errors
    ///
    /// [`BrokerError::Config`] when the URL is invalid.
    pub fn open(url: &str) -> Result<Self, BrokerError> {
        url.parse::<lapin::uri::AMQPUri>()
            .map_err(|e| BrokerError::Config(format!("amqp url refused: {e}")))?;
        Ok(RabbitMq {
            url: url.to_owned(),
            timeout: Duration::from_secs(2),
            session: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    /// The timeout of each operation (connecting included), at least 1 ms.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    fn current(&self) -> Option<Arc<Session>> {
        lock(&self.session).clone()
    }

    /// The session, connecting when there is none.
    async fn session(&self) -> Result<Arc<Session>, Failure> {
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let _one_at_a_time = self.connecting.lock().await;
        if let Some(s) = self.current() {
            return Ok(s);
        }
        let properties =
            ConnectionProperties::default().with_connection_name("seawall-saga".into());
        let connection = Connection::connect(&self.url, properties).await?;
        let publish = connection.create_channel().await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let get = connection.create_channel().await?;
        let session = Arc::new(Session {
            number: CHANNELS.fetch_add(1, Ordering::Relaxed),
            _connection: connection,
            publish,
            get,
            outstanding: Mutex::new(HashSet::new()),
            declared: Mutex::new(HashSet::new()),
        });
        *lock(&self.session) = Some(Arc::clone(&session));
        Ok(session)
    }

    /// Forgets the session numbered `number` (if it is still the current
    /// one): dropping it closes the connection.
    fn reset(&self, number: Option<u64>) {
        let mut current = lock(&self.session);
        if current.as_ref().map(|s| s.number) == number || number.is_none() {
            *current = None;
        }
    }

    /// Runs `f` on the session within the timeout plus `extra`. A failure of
    /// the connection or a refusal by the broker drops the session (the next
    /// operation connects again).
    async fn run<'s, T, F, Fut>(
        &'s self,
        operation: &str,
        extra: Duration,
        f: F,
    ) -> Result<T, BrokerError>
    where
        F: FnOnce(Arc<Session>) -> Fut,
        Fut: Future<Output = Result<T, Failure>> + 's,
    {
        let mut number = None;
        let attempt = async {
            let session = self.session().await?;
            number = Some(session.number);
            f(session).await
        };
        let outcome = tokio::time::timeout(self.timeout + extra, attempt).await;
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(Failure::Broker(e))) => Err(e),
            Ok(Err(Failure::Amqp(e))) => {
                self.reset(number);
                Err(if e.is_amqp_soft_error() {
                    BrokerError::Refused {
                        operation: operation.to_owned(),
                        detail: e.to_string(),
                    }
                } else {
                    BrokerError::Unavailable {
                        operation: operation.to_owned(),
                        detail: e.to_string(),
                    }
                })
            }
            Err(_) => {
                self.reset(number);
                Err(BrokerError::Unavailable {
                    operation: operation.to_owned(),
                    detail: format!("no answer within {:?}", self.timeout + extra),
                })
            }
        }
    }
}

impl Session {
    /// Declares the durable fanout exchange of `stream` once per connection.
    async fn declare_stream(&self, stream: &str) -> Result<(), Failure> {
        let key = format!("exchange {stream}");
        if lock(&self.declared).contains(&key) {
            return Ok(());
        }
        self.publish
            .exchange_declare(
                short(stream)?,
                lapin::ExchangeKind::Fanout,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        lock(&self.declared).insert(key);
        Ok(())
    }

    /// Declares a durable queue (once per connection when `cached`).
    async fn declare_queue(&self, queue: &str, cached: bool) -> Result<(), Failure> {
        let key = format!("queue {queue}");
        if cached && lock(&self.declared).contains(&key) {
            return Ok(());
        }
        self.publish
            .queue_declare(
                short(queue)?,
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        lock(&self.declared).insert(key);
        Ok(())
    }

    /// Publishes messages to `exchange` with `routing_key` and waits for the
    /// broker to confirm every one.
    async fn publish_confirmed(
        &self,
        operation: &str,
        exchange: &str,
        routing_key: &str,
        messages: Vec<(BasicProperties, &[u8])>,
    ) -> Result<(), Failure> {
        let exchange = short(exchange)?;
        let routing_key = short(routing_key)?;
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let mut confirms = Vec::with_capacity(messages.len());
        for (properties, body) in messages {
            confirms.push(
                self.publish
                    .basic_publish(
                        exchange.clone(),
                        routing_key.clone(),
                        options,
                        body,
                        properties,
                    )
                    .await?,
            );
        }
        let mut unroutable = 0;
        let mut refused = 0;
        for confirm in confirms {
            match confirm.await? {
                Confirmation::Ack(None) | Confirmation::NotRequested => {}
                Confirmation::Ack(Some(_)) => unroutable += 1,
                Confirmation::Nack(_) => refused += 1,
            }
        }
        if unroutable > 0 {
            return Err(BrokerError::Refused {
                operation: operation.to_owned(),
                detail: format!(
                    "{unroutable} message(s) returned: no queue is bound to `{exchange}` \
                     (create a consumer group first)"
                ),
            }
            .into());
        }
        if refused > 0 {
            return Err(BrokerError::Unavailable {
                operation: operation.to_owned(),
                detail: format!("the broker did not take {refused} message(s) (nack)"),
            }
            .into());
        }
        Ok(())
    }

    /// The id of delivery tag `tag` of this session.
    fn id(&self, tag: u64) -> String {
        format!("{}-{tag}", self.number)
    }

    /// Acknowledges the ids read on this session and not acknowledged yet;
    /// the others (another channel's, already acknowledged) are skipped.
    async fn ack(&self, ids: &[&str]) -> Result<(), Failure> {
        let mut tags = Vec::new();
        {
            let mut outstanding = lock(&self.outstanding);
            for id in ids {
                let Some((number, tag)) = parse_id(id) else {
                    return Err(BrokerError::Refused {
                        operation: "acknowledging".to_owned(),
                        detail: format!("{id:?} is not a RabbitMQ delivery id"),
                    }
                    .into());
                };
                if number == self.number && outstanding.remove(&tag) {
                    tags.push(tag);
                }
            }
        }
        for tag in tags {
            self.get.basic_ack(tag, BasicAckOptions::default()).await?;
        }
        Ok(())
    }

    /// Parks a message in the dead-letter queue of the subscription's stream
    /// and acknowledges it.
    async fn park(
        &self,
        subscription: &Subscription,
        id: &str,
        reason: &str,
        properties: &BasicProperties,
        body: &[u8],
    ) -> Result<(), Failure> {
        let queue = dead_letter_stream(&subscription.stream);
        let mut headers = FieldTable::default();
        headers.insert("reason".into(), text(reason));
        headers.insert("original_id".into(), text(id));
        headers.insert("group".into(), text(&subscription.group));
        headers.insert("consumer".into(), text(&subscription.consumer));
        if let Some(original) = properties.headers() {
            for (name, value) in original.inner() {
                let prefixed = format!("field.{name}");
                if let Ok(key) = ShortString::try_new(prefixed) {
                    headers.insert(key, value.clone());
                }
            }
        }
        let operation = format!("parking a message of {}", subscription.stream);
        // Declared by `create_group`; again here, should another version
        // have created the group.
        self.declare_queue(&queue, true).await?;
        self.publish_confirmed(
            &operation,
            "",
            &queue,
            vec![(persistent().with_headers(headers), body)],
        )
        .await?;
        self.ack(&[id]).await
    }

    /// One `basic.get` on the group's queue: `None` when it is empty,
    /// otherwise the delivery (`None` for a malformed message, parked) and
    /// how many messages the queue still holds.
    async fn get_one(
        &self,
        subscription: &Subscription,
        queue: &ShortString,
    ) -> Result<Option<(Option<Delivery>, u32)>, Failure> {
        let Some(BasicGetMessage {
            delivery,
            message_count,
        }) = self
            .get
            .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
            .await?
        else {
            return Ok(None);
        };
        let tag = delivery.delivery_tag;
        lock(&self.outstanding).insert(tag);
        let id = self.id(tag);
        match envelope(&delivery.properties, &delivery.data) {
            Ok(envelope) => Ok(Some((Some(Delivery { id, envelope }), message_count))),
            Err(reason) => {
                tracing::warn!(
                    target: "seawall_saga",
                    stream = %subscription.stream,
                    message = %id,
                    %reason,
                    "malformed message parked in the dead-letter queue"
                );
                self.park(
                    subscription,
                    &id,
                    &reason,
                    &delivery.properties,
                    &delivery.data,
                )
                .await?;
                Ok(Some((None, message_count)))
            }
        }
    }
}

/// The first wait of a blocking read on an empty queue, and the longest.
const POLL_FIRST: Duration = Duration::from_millis(1);
const POLL_MAX: Duration = Duration::from_millis(25);

impl Broker for RabbitMq {
    fn publish<'a>(&'a self, stream: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            if events.is_empty() {
                return Ok(());
            }
            let operation = format!("publishing to {stream}");
            self.run(&operation, Duration::ZERO, |session| {
                let operation = operation.clone();
                async move {
                    session.declare_stream(stream).await?;
                    let messages = events
                        .iter()
                        .map(|e| (properties_of(e), e.payload.as_bytes()))
                        .collect();
                    session
                        .publish_confirmed(&operation, stream, "", messages)
                        .await
                }
            })
            .await
        })
    }

    fn create_group<'a>(&'a self, subscription: &'a Subscription) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            let operation = format!(
                "creating group {} on {}",
                subscription.group, subscription.stream
            );
            self.run(&operation, Duration::ZERO, |session| async move {
                let stream = &subscription.stream;
                session.declare_stream(stream).await?;
                let queue = group_queue(subscription);
                session.declare_queue(&queue, false).await?;
                session
                    .publish
                    .queue_bind(
                        short(&queue)?,
                        short(stream)?,
                        ShortString::from(""),
                        QueueBindOptions::default(),
                        FieldTable::default(),
                    )
                    .await?;
                session
                    .declare_queue(&dead_letter_stream(stream), false)
                    .await
            })
            .await
        })
    }

    fn read<'a>(
        &'a self,
        subscription: &'a Subscription,
        count: usize,
        block: Duration,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        Box::pin(async move {
            let operation = format!("reading {}", subscription.stream);
            // One `basic.get` per message: a batch is cut short after half
            // the timeout, so that a slow broker answers with fewer messages
            // rather than with none.
            let collect_for = self.timeout / 2;
            self.run(&operation, block, |session| async move {
                let queue = short(&group_queue(subscription))?;
                let started = tokio::time::Instant::now();
                let deadline = started + block;
                let mut wait = POLL_FIRST;
                let mut deliveries = Vec::new();
                loop {
                    while deliveries.len() < count.max(1)
                        && (deliveries.is_empty() || started.elapsed() < collect_for)
                    {
                        let Some((delivery, left)) = session.get_one(subscription, &queue).await?
                        else {
                            break;
                        };
                        deliveries.extend(delivery);
                        if left == 0 {
                            break;
                        }
                    }
                    let now = tokio::time::Instant::now();
                    if !deliveries.is_empty() || now >= deadline {
                        return Ok(deliveries);
                    }
                    tokio::time::sleep(wait.min(deadline - now)).await;
                    wait = (wait * 2).min(POLL_MAX);
                }
            })
            .await
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
            // No session: the ids' channel is gone, its messages went back.
            let Some(session) = self.current() else {
                return Ok(());
            };
            let operation = format!("acknowledging on {}", subscription.stream);
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            self.run(&operation, Duration::ZERO, |current| async move {
                if current.number != session.number {
                    return Ok(());
                }
                current.ack(&ids).await
            })
            .await
        })
    }

    fn claim_stale<'a>(
        &'a self,
        _subscription: &'a Subscription,
        _min_idle: Duration,
        _count: usize,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        // The broker requeues a closed channel's unacknowledged messages and
        // `read` returns them: there is nothing to take over.
        Box::pin(async move { Ok(Vec::new()) })
    }

    fn dead_letter<'a>(
        &'a self,
        subscription: &'a Subscription,
        delivery: &'a Delivery,
        reason: &'a str,
    ) -> BrokerFuture<'a, ()> {
        Box::pin(async move {
            let operation = format!("parking a message of {}", subscription.stream);
            self.run(&operation, Duration::ZERO, |session| async move {
                let properties = properties_of(&delivery.envelope);
                session
                    .park(
                        subscription,
                        &delivery.id,
                        reason,
                        &properties,
                        delivery.envelope.payload.as_bytes(),
                    )
                    .await
            })
            .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        Envelope {
            event_id: "orders:7".into(),
            aggregate: "o-1".into(),
            event_type: "placed".into(),
            payload: r#"{"total":1200}"#.into(),
            created_at_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn an_envelope_travels_in_the_headers_and_the_body() {
        let e = sample();
        let properties = properties_of(&e);
        assert_eq!(*properties.delivery_mode(), Some(2));
        assert_eq!(envelope(&properties, e.payload.as_bytes()), Ok(e));
    }

    #[test]
    fn a_malformed_message_is_told_by_its_reason() {
        let e = sample();
        let mut headers = FieldTable::default();
        headers.insert("aggregate".into(), text("a"));
        let no_id = BasicProperties::default().with_headers(headers);
        let reason = envelope(&no_id, b"x").unwrap_err();
        assert!(reason.contains("event_id"), "{reason}");
        let reason = envelope(&properties_of(&e), &[0xff, 0xfe]).unwrap_err();
        assert!(reason.contains("body"), "{reason}");
        let mut headers = properties_of(&e).headers().clone().unwrap();
        headers.insert("created_ms".into(), text("soon"));
        let late = BasicProperties::default().with_headers(headers);
        let reason = envelope(&late, b"x").unwrap_err();
        assert!(reason.contains("created_ms"), "{reason}");
    }

    #[test]
    fn ids_name_the_channel_and_the_tag() {
        assert_eq!(parse_id("12-345"), Some((12, 345)));
        assert_eq!(parse_id("1700000000000-0-1"), None);
        assert_eq!(parse_id("x"), None);
    }
}
