//! Events published `localOnly`: never written to Redis, delivered by this process to its own
//! subscriptions of the topic by the rules every delivery follows. Each fan-out subscription
//! gets the event; each group, the member whose turn it is (the turn events read from the
//! stream take too, `member.rs`); a nacked one is delivered again with `deliveryAttempt + 1`
//! until `maxDeliveryAttempts`, then dropped with the warning any event gets (`settle.rs`).
//!
//! A subscription takes part from the moment it is numbered (`subscription_id`), as in an
//! in-process pubsub, not only once it has opened: Mastra's `run.watch()` subscribes without
//! awaiting. While it opens, a fan-out one gets every event, and a group member gets them
//! while no member of its group has opened yet.
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
    /// then, for each group of this process on it, the member whose turn it is. Nobody once
    /// the pubsub is closed.
    pub fn local_recipients(&self, topic: &str, live: impl Fn(u64) -> bool) -> Vec<u64> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Vec::new();
        }
        let key = shared.stream_key(topic);
        let opening = self.opening(&key);
        let mut recipients = shared.fanout.subscriptions(shared, &key);
        for (id, group) in &opening {
            if group.is_none() && !recipients.contains(id) {
                recipients.push(*id);
            }
        }
        recipients.retain(|&id| live(id));
        let mut groups = Vec::new();
        for consumer in self.consumers_of(&key) {
            if let Some(member) = lock(&consumer.members).turn(|m| live(m.id)) {
                recipients.push(member.id);
                groups.push(consumer.group.clone());
            }
        }
        for (id, group) in opening {
            if let Some(group) = group.filter(|g| !groups.contains(g) && live(id)) {
                recipients.push(id);
                groups.push(group);
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
        let opening = self.opening(&key);
        let Some(group) = group else {
            let open = shared.fanout.subscriptions(shared, &key);
            let still =
                open.contains(&subscription) || opening.iter().any(|(id, _)| *id == subscription);
            return (still && live(subscription)).then_some(subscription);
        };
        let consumer = self
            .consumers_of(&key)
            .into_iter()
            .find(|c| c.group == group);
        let member = consumer.and_then(|c| lock(&c.members).turn(|m| live(m.id)));
        member.map(|m| m.id).or_else(|| {
            let mut members = opening
                .into_iter()
                .filter(|(_, g)| g.as_deref() == Some(group));
            members.find(|&(id, _)| live(id)).map(|(id, _)| id)
        })
    }

    /// The subscriptions to the stream `key` numbered and not yet open, oldest first.
    fn opening(&self, key: &str) -> Vec<(u64, Option<String>)> {
        let opening = lock(&self.shared.opening);
        let mut found: Vec<_> = opening
            .iter()
            .filter(|(_, (k, _))| k == key)
            .map(|(id, (_, group))| (*id, group.clone()))
            .collect();
        found.sort_unstable_by_key(|(id, _)| *id);
        found
    }

    /// This process's consumers of groups on the stream `key`.
    fn consumers_of(&self, key: &str) -> Vec<std::sync::Arc<super::group::Consumer>> {
        let consumers = self.shared.consumers();
        let on_key = consumers.values().filter(|consumer| consumer.key == key);
        on_key.cloned().collect()
    }
}
