//! Subscribing and unsubscribing: which reader serves a subscription (its group's consumer,
//! or the fan-out reader), and what leaving gives back.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Semaphore};

use super::delivery::Delivery;
use super::event::EntryId;
use super::group::{self, Consumer};
use super::member::Member;
use super::reader::{self, MIN_BUFFER};
use super::settle::{self, Settle};
use super::{Shared, StartFrom, SubscribeOptions};
use crate::core::error::{Error, Result, Subject};

/// A subscription to one topic. Deliveries arrive through [`Subscription::recv`]. Dropping
/// it (or [`Subscription::unsubscribe`]) stops its deliveries; those read but not yet taken
/// are handed back to the group, unchanged. Deliveries already taken stay held until they
/// are settled.
pub struct Subscription {
    topic: String,
    /// The group and this process's consumer name in it, for a grouped subscription.
    group: Option<(String, String)>,
    /// `None` once the subscription was left.
    live: Option<Live>,
}

/// What a subscription holds while it lives.
struct Live {
    shared: Arc<Shared>,
    /// This subscription among its reader's (which holds the sending side of `rx`).
    member: u64,
    served_by: ServedBy,
    rx: mpsc::Receiver<Delivery>,
}

/// Which reader serves a subscription.
enum ServedBy {
    Group(Arc<Consumer>),
    Fanout { key: String },
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("topic", &self.topic)
            .field("group", &self.group())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The next delivery; `None` once the subscription was stopped (unsubscribe or the
    /// pubsub's close) and everything already read was taken.
    #[cfg(test)]
    pub async fn recv(&mut self) -> Option<Delivery> {
        let rx = &mut self.live.as_mut()?.rx;
        loop {
            let delivery = rx.recv().await?;
            if delivery.state.take() {
                return Some(delivery);
            }
        }
    }

    /// Takes up to `limit` deliveries at once, waiting for at least one; 0 means stopped.
    /// For a caller that forwards deliveries in batches.
    pub async fn recv_many(&mut self, buffer: &mut Vec<Delivery>, limit: usize) -> usize {
        let Some(live) = self.live.as_mut() else {
            return 0;
        };
        let start = buffer.len();
        loop {
            if live.rx.recv_many(buffer, limit).await == 0 {
                return 0;
            }
            // Keep those still to be handed out (an unsubscribe may have released some).
            let mut kept = start;
            for i in start..buffer.len() {
                if buffer[i].state.take() {
                    buffer.swap(kept, i);
                    kept += 1;
                }
            }
            buffer.truncate(kept);
            if kept > start {
                return kept - start;
            }
        }
    }

    /// The consumer group, for a grouped subscription.
    pub fn group(&self) -> Option<&str> {
        self.group.as_ref().map(|(group, _)| group.as_str())
    }

    /// This process's consumer name in the group (`<group>-<uuid>`).
    #[cfg(test)]
    pub fn consumer(&self) -> Option<&str> {
        self.group.as_ref().map(|(_, consumer)| consumer.as_str())
    }

    /// Stops the subscription's deliveries and hands those read but not yet taken back to
    /// the group (appended again unchanged, for any consumer), bounded by BLOCK and the
    /// command timeout. Deliveries already taken stay held and can still be acked or nacked.
    pub async fn unsubscribe(mut self) {
        if let Some(live) = self.live.take() {
            live.leave().await;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(live) = self.live.take() {
            let runtime = live.shared.runtime.clone();
            runtime.spawn(live.leave());
        }
    }
}

impl Live {
    async fn leave(mut self) {
        // A close waits for the hand-back below before it closes the connection.
        let _leaving = self.shared.readers.try_read();
        // No delivery reaches this subscription any more: the reader hands it to another.
        self.rx.close();
        match &self.served_by {
            ServedBy::Group(consumer) => consumer.leave(&self.shared, self.member).await,
            ServedBy::Fanout { key } => self.shared.fanout.remove(&self.shared, key, self.member),
        }
        let mut buffered = Vec::new();
        while let Ok(delivery) = self.rx.try_recv() {
            buffered.push(delivery);
        }
        let releases = buffered
            .iter()
            .map(|delivery| settle::settle_unread(delivery, Settle::Release));
        let bound = self.shared.options.connection.command_timeout;
        let _ = tokio::time::timeout(bound, futures::future::join_all(releases)).await;
    }
}

/// Creates the group (or resolves the fan-out position) and joins the reader that serves
/// the subscription.
pub(super) async fn open(
    shared: Arc<Shared>,
    id: u64,
    topic: &str,
    options: SubscribeOptions,
) -> Result<Subscription> {
    let key = shared.stream_key(topic);
    let (tx, rx) = mpsc::channel((shared.options.batch_count * 4).max(MIN_BUFFER));
    shared.start_keeper();
    let (served_by, member) = match options.group {
        Some(group) => {
            let anchor = match options.start_from {
                StartFrom::Earliest => "0",
                StartFrom::Latest => "$",
            };
            group::create_group(&shared, &key, &group, anchor).await?;
            let pair = (key.clone(), group);
            let existing = shared.consumers().get(&pair).cloned();
            let consumer = match existing {
                Some(consumer) => consumer,
                None => {
                    let fresh = Consumer::new(&shared, topic, key.clone(), pair.1.clone(), anchor)?;
                    Arc::clone(shared.consumers().entry(pair).or_insert(Arc::new(fresh)))
                }
            };
            let member = Arc::new(Member {
                id,
                tx,
                position: Mutex::new(EntryId::ZERO),
                room: None,
            });
            consumer.join(Arc::clone(&member), |generation| {
                let reader =
                    reader::read_loop(Arc::clone(&shared), Arc::clone(&consumer), generation);
                shared.runtime.spawn(reader)
            });
            (ServedBy::Group(consumer), member)
        }
        None => {
            let position = match options.start_from {
                StartFrom::Earliest => EntryId::ZERO,
                // Pinned now, so what is appended after subscribe returns is delivered.
                StartFrom::Latest => super::last_entry(&shared, &key, "+")
                    .await?
                    .and_then(|entry| EntryId::parse(&entry.id))
                    .unwrap_or_default(),
            };
            let member = Arc::new(Member {
                id,
                tx,
                position: Mutex::new(position),
                room: shared
                    .options
                    .max_in_flight
                    .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))),
            });
            shared
                .fanout
                .add(&shared, key.clone(), topic, Arc::clone(&member));
            (ServedBy::Fanout { key }, member)
        }
    };
    let group = match &served_by {
        ServedBy::Group(consumer) => Some((consumer.group.clone(), consumer.name.clone())),
        ServedBy::Fanout { .. } => None,
    };
    let live = Live {
        shared,
        member: member.id,
        served_by,
        rx,
    };
    // close() may have run between the check in subscribe and joining the reader.
    if live.shared.closed.load(Ordering::Acquire) {
        live.leave().await;
        return Err(Error::Closed(Subject::StreamsSubscribe));
    }
    Ok(Subscription {
        topic: topic.to_owned(),
        group,
        live: Some(live),
    })
}
