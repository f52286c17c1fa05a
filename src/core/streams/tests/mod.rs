//! The event transport against real `redis-server` processes, one per test, each on its own
//! unix socket. Peers that "crash" or write the layout by hand use `redis-cli`. Here: what
//! the tests share; the tests, by what they prove, in the files beside.

mod delivery;
mod local;
mod recovery;
mod settling;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

use super::delivery::{Extended, Settled};
use super::*;
use crate::core::connection::ConnectionOptions;
use crate::core::test_redis::Server;

#[derive(Default)]
struct Collect(Mutex<Vec<Notice>>);

impl Logger for Collect {
    fn log(&self, notice: Notice) {
        self.0.lock().unwrap().push(notice);
    }
}

impl Collect {
    fn warned(&self, needle: &str) -> bool {
        self.find(needle).is_some()
    }

    fn find(&self, needle: &str) -> Option<Notice> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .find(|n| n.level == Level::Warn && n.message.contains(needle))
            .cloned()
    }
}

fn options(server: &Server) -> StreamsOptions {
    StreamsOptions {
        connection: ConnectionOptions {
            url: server.url(),
            command_timeout: Duration::from_secs(1),
            ..ConnectionOptions::default()
        },
        key_prefix: "t".into(),
        block: Duration::from_millis(100),
        reclaim_interval: Some(Duration::from_millis(100)),
        reclaim_idle: Duration::from_millis(300),
        ..StreamsOptions::default()
    }
}

fn with_logger(options: StreamsOptions) -> (StreamsPubSub, Arc<Collect>) {
    let logger = Arc::new(Collect::default());
    let options = StreamsOptions {
        logger: Some(logger.clone()),
        ..options
    };
    (StreamsPubSub::new(options).unwrap(), logger)
}

fn pubsub(server: &Server) -> (StreamsPubSub, Arc<Collect>) {
    with_logger(options(server))
}

fn group(name: &str, start_from: StartFrom) -> SubscribeOptions {
    SubscribeOptions {
        group: Some(name.into()),
        start_from,
    }
}

fn fan_out(start_from: StartFrom) -> SubscribeOptions {
    SubscribeOptions {
        group: None,
        start_from,
    }
}

fn ev(n: u64) -> Json {
    json!({ "type": "step", "runId": "run-1", "data": { "n": n } })
}

/// `event` stamped as the TypeScript shell stamps it: a fresh `id`, a `createdAt`, and
/// `deliveryAttempt` 1 unless it carries one.
fn stamped(event: Json) -> (String, String) {
    let Json::Object(mut fields) = event else {
        panic!("an event is an object")
    };
    let id = event::uuid_v4().unwrap();
    fields.insert("id".into(), json!(id));
    fields.insert("createdAt".into(), json!("2026-12-01T00:00:00.000Z"));
    fields.entry("deliveryAttempt").or_insert(json!(1));
    (id, Json::Object(fields).to_string())
}

/// Publishes one event; answers its `id` and the entry id Redis gave it.
async fn publish(ps: &StreamsPubSub, topic: &str, event: Json) -> (String, String) {
    let (id, json) = stamped(event);
    let mut answers = ps.publish_stamped_batch(vec![(topic.into(), json)]).await;
    (id, answers.pop().unwrap().unwrap())
}

fn n(delivery: &Delivery) -> u64 {
    delivery.event()["data"]["n"].as_u64().unwrap()
}

/// Subscribes, failing the test on an error.
async fn subscribe(ps: &StreamsPubSub, topic: &str, options: SubscribeOptions) -> Subscription {
    ps.subscribe(topic, options).await.unwrap()
}

async fn next(sub: &mut Subscription) -> Delivery {
    tokio::time::timeout(Duration::from_secs(5), sub.recv())
        .await
        .expect("no delivery within 5 s")
        .expect("subscription ended")
}

async fn nothing_within(sub: &mut Subscription, ms: u64) {
    if let Ok(Some(d)) = tokio::time::timeout(Duration::from_millis(ms), sub.recv()).await {
        panic!("unexpected delivery {:?} {}", d, d.json());
    }
}

fn pending(server: &Server, key: &str, group: &str) -> String {
    server
        .cli(&["XPENDING", key, group])
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until `done` holds, failing after `ms`.
async fn eventually(ms: u64, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(ms);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The clients connected to the server, but for the `redis-cli` asking.
fn clients(server: &Server) -> usize {
    server.cli(&["CLIENT", "LIST"]).lines().count() - 1
}
