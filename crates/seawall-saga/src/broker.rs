//! The message broker between services: a small [`Broker`] trait and, with the
//! feature `redis-streams`, `redis_streams::RedisStreams` on
//! Redis Streams; with the feature `rabbitmq`, `rabbitmq::RabbitMq` on
//! RabbitMQ (a stream is a fanout exchange, a group a queue bound to it, and
//! a dead consumer's messages come back to the queue by themselves: see its
//! module for the mapping).
//!
//! A broker carries [`Envelope`]s on named streams. Consumers read a stream
//! through a consumer group ([`Subscription`]): each message goes to one
//! consumer of the group and stays pending until that consumer acknowledges
//! it; the pending messages of a consumer that died are taken over by another
//! one with [`Broker::claim_stale`]. Delivery is therefore *at least once*;
//! an [`Inbox`](crate::outbox::Inbox) makes the effect of a message happen once.
//!
//! A message that cannot be decoded into an [`Envelope`] (a field missing,
//! not UTF-8, ...) is never handed to a consumer: the broker parks it in the
//! stream's dead-letter stream ([`dead_letter_stream`]) with the reason and
//! acknowledges it, and the consumer goes on with the next message. A consumer
//! that refuses a well-formed message parks it there with
//! [`Broker::dead_letter`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::BoxFuture;

#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis-streams")]
pub mod redis_streams;

/// The future returned by [`Broker`] operations.
pub type BrokerFuture<'a, T> = BoxFuture<'a, Result<T, BrokerError>>;

/// An event as it travels between services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// The event's identity, the same on every publication of the event
    /// (`{source}:{outbox row id}`): what an [`Inbox`](crate::outbox::Inbox)
    /// de-duplicates by.
    pub event_id: String,
    /// The entity the event is about (an order id, ...). Events of one
    /// aggregate are published in the order they were enqueued.
    pub aggregate: String,
    /// The kind of event (`order_placed`, ...).
    pub event_type: String,
    /// The event's body, as enqueued (typically JSON).
    pub payload: String,
    /// When the enqueuing transaction wrote the event, in milliseconds since
    /// the Unix epoch.
    pub created_at_ms: i64,
}

/// A message read from a stream by a consumer of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// The broker's id of this message (a Redis stream id; on RabbitMQ, the
    /// reading channel and the delivery tag). A re-published
    /// event has a new one: de-duplicate by [`Envelope::event_id`].
    pub id: String,
    /// The event.
    pub envelope: Envelope,
}

/// A consumer's place in a consumer group of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// The stream.
    pub stream: String,
    /// The consumer group: each message goes to one consumer of the group.
    pub group: String,
    /// This consumer's name within the group.
    pub consumer: String,
}

impl Subscription {
    /// The consumer `consumer` of the group `group` on `stream`.
    pub fn new(
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        Subscription {
            stream: stream.into(),
            group: group.into(),
            consumer: consumer.into(),
        }
    }
}

/// The stream where the messages of `stream` that could not be handled are
/// parked: `{stream}:dead-letter`.
pub fn dead_letter_stream(stream: &str) -> String {
    format!("{stream}:dead-letter")
}

/// A message broker with consumer groups.
pub trait Broker: Send + Sync {
    /// Appends `events` to `stream`, in order. When it fails, some of them may
    /// have been appended all the same (at least once: the caller publishes
    /// them again).
    fn publish<'a>(&'a self, stream: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()>;

    /// Creates the subscription's group if it does not exist, reading from the
    /// start of the stream (which is created if needed).
    fn create_group<'a>(&'a self, subscription: &'a Subscription) -> BrokerFuture<'a, ()>;

    /// Up to `count` messages never delivered to the group, waiting up to
    /// `block` for one to arrive (no wait when zero). Malformed messages are
    /// parked in the dead-letter stream and not returned.
    fn read<'a>(
        &'a self,
        subscription: &'a Subscription,
        count: usize,
        block: Duration,
    ) -> BrokerFuture<'a, Vec<Delivery>>;

    /// Acknowledges messages: they are no longer pending.
    fn ack<'a>(&'a self, subscription: &'a Subscription, ids: &'a [String])
        -> BrokerFuture<'a, ()>;

    /// Takes over up to `count` messages pending for at least `min_idle` in
    /// the group (delivered to a consumer that did not acknowledge them:
    /// typically a consumer that died) and delivers them to this subscription's
    /// consumer. (RabbitMQ needs no claim: the broker gives the messages of a
    /// closed channel back to the queue, and `read` returns them.)
    fn claim_stale<'a>(
        &'a self,
        subscription: &'a Subscription,
        min_idle: Duration,
        count: usize,
    ) -> BrokerFuture<'a, Vec<Delivery>>;

    /// Parks a delivered message in the dead-letter stream with `reason` and
    /// acknowledges it.
    fn dead_letter<'a>(
        &'a self,
        subscription: &'a Subscription,
        delivery: &'a Delivery,
        reason: &'a str,
    ) -> BrokerFuture<'a, ()>;
}

impl<B: Broker + ?Sized> Broker for Arc<B> {
    fn publish<'a>(&'a self, stream: &'a str, events: &'a [Envelope]) -> BrokerFuture<'a, ()> {
        (**self).publish(stream, events)
    }
    fn create_group<'a>(&'a self, subscription: &'a Subscription) -> BrokerFuture<'a, ()> {
        (**self).create_group(subscription)
    }
    fn read<'a>(
        &'a self,
        subscription: &'a Subscription,
        count: usize,
        block: Duration,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        (**self).read(subscription, count, block)
    }
    fn ack<'a>(
        &'a self,
        subscription: &'a Subscription,
        ids: &'a [String],
    ) -> BrokerFuture<'a, ()> {
        (**self).ack(subscription, ids)
    }
    fn claim_stale<'a>(
        &'a self,
        subscription: &'a Subscription,
        min_idle: Duration,
        count: usize,
    ) -> BrokerFuture<'a, Vec<Delivery>> {
        (**self).claim_stale(subscription, min_idle, count)
    }
    fn dead_letter<'a>(
        &'a self,
        subscription: &'a Subscription,
        delivery: &'a Delivery,
        reason: &'a str,
    ) -> BrokerFuture<'a, ()> {
        (**self).dead_letter(subscription, delivery, reason)
    }
}

/// An error from a [`Broker`].
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The broker could not be reached, or did not answer in time. Nothing is
    /// known about the operation's effect; it can be retried.
    #[error("broker unavailable while {operation}: {detail}")]
    Unavailable {
        /// What was being done.
        operation: String,
        /// Why.
        detail: String,
    },
    /// The broker refused the operation.
    #[error("broker refused {operation}: {detail}")]
    Refused {
        /// What was being done.
        operation: String,
        /// The broker's message.
        detail: String,
    },
    /// The broker's configuration (URL, options) is invalid.
    #[error("invalid broker configuration: {0}")]
    Config(String),
}

impl fmt::Debug for BrokerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl BrokerError {
    /// True when the broker could not be reached (retry later).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, BrokerError::Unavailable { .. })
    }
}
