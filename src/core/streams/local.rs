//! Events published `localOnly`: never written to Redis, delivered by this process to its own
//! subscriptions of the topic by the rules every delivery follows. Each fan-out subscription
//! gets the event; each group, the member whose turn it is (the turn events read from the
//! stream take too, `member.rs`); a nacked one is delivered again with `deliveryAttempt + 1`
//! until `maxDeliveryAttempts`, then dropped with the warning any event gets (`settle.rs`).
//!
//! The caller carries the event itself, a live object that is never encoded, and calls the
//! callbacks: this decides who gets it and whether it goes again. `live` names the
//! subscriptions the caller still serves, so an event never goes to one it is leaving.

use std::sync::atomic::Ordering;

use serde_json::Value as Json;

use super::settle::{self, Dropped};
use super::StreamsPubSub;
use crate::core::lock;

impl StreamsPubSub {
    /// Who gets an event published `localOnly` now: every fan-out subscription of the topic,
    /// then, for each group this process reads the topic in, the member whose turn it is.
    /// Nobody once the pubsub is closed.
    pub fn local_recipients(&self, topic: &str, live: impl Fn(u64) -> bool) -> Vec<u64> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Vec::new();
        }
        let key = shared.stream_key(topic);
        let mut recipients = shared.fanout.subscriptions(shared, &key);
        recipients.retain(|&id| live(id));
        let consumers: Vec<_> = shared
            .consumers()
            .values()
            .filter(|consumer| consumer.key == key)
            .cloned()
            .collect();
        for consumer in consumers {
            if let Some(member) = lock(&consumer.members).turn(|m| live(m.id)) {
                recipients.push(member.id);
            }
        }
        recipients
    }

    /// A `localOnly` event nacked at `attempt`: the attempt its redelivery carries, or `None`
    /// when it used up its attempts and was dropped, with the warning any event gets.
    pub fn local_nacked(&self, topic: &str, id: Json, kind: Json, attempt: u64) -> Option<u64> {
        if !settle::used_up(&self.shared, attempt) {
            return Some(attempt.saturating_add(1));
        }
        let dropped = Dropped {
            topic,
            id,
            kind,
            attempt,
            reason: "nacked",
            local_only: true,
        };
        settle::warn_dropped(&self.shared, dropped);
        None
    }

    /// Who gets a nacked `localOnly` event again: for fan-out, the subscription that nacked it
    /// while it lasts; for a group, the member whose turn it is. `None` when nobody is left
    /// (or the pubsub is closed).
    pub fn local_redelivery(
        &self,
        topic: &str,
        group: Option<&str>,
        subscription: u64,
        live: impl Fn(u64) -> bool,
    ) -> Option<u64> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return None;
        }
        let key = shared.stream_key(topic);
        match group {
            None => shared
                .fanout
                .subscriptions(shared, &key)
                .into_iter()
                .find(|&id| id == subscription && live(id)),
            Some(group) => {
                let consumer = shared.consumers().get(&(key, group.to_owned())).cloned()?;
                let member = lock(&consumer.members).turn(|m| live(m.id));
                member.map(|member| member.id)
            }
        }
    }
}
