//! The event transport against real `redis-server` processes, one per test, each on its own
//! unix socket. Peers that "crash" or write the layout by hand use `redis-cli`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

use super::delivery::Settled;
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

#[tokio::test]
async fn events_are_written_in_the_mastra_layout_and_delivered_as_they_were_stamped() {
    let server = Server::start("streams-publish");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "topic", fan_out(StartFrom::Earliest)).await;
    let (id, entry) = publish(&ps, "topic", ev(1)).await;

    let d = next(&mut sub).await;
    assert_eq!(d.event()["id"], json!(id));
    assert_eq!(d.entry_id(), entry);
    assert_eq!(d.delivery_attempt(), 1);
    assert_eq!(d.event()["type"], "step");
    assert_eq!(n(&d), 1);
    assert_eq!(d.ack().await, Settled::Acked);
    assert_eq!(d.nack().await, Settled::Already);

    // A plain XRANGE sees one field, `event`, holding the JSON.
    let raw = server.cli(&["XRANGE", "t:topic", "-", "+"]);
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines[0], entry);
    assert_eq!(lines[1], "event");
    let stored: Json = serde_json::from_str(lines[2]).unwrap();
    assert_eq!(stored["id"], json!(id));
    assert_eq!(lines.len(), 3);
}

#[tokio::test]
async fn an_entry_written_with_plain_xadd_is_delivered_and_a_malformed_one_is_dropped() {
    let server = Server::start("streams-interop");
    let (ps, logger) = pubsub(&server);
    let mut sub = subscribe(&ps, "x", group("g", StartFrom::Earliest)).await;
    server.cli(&["XADD", "t:x", "*", "other", "1"]);
    let foreign = r#"{"type":"ping","id":"foreign-1","runId":"r","data":{"n":7},"createdAt":"2024-01-01T00:00:00.000Z"}"#;
    server.cli(&["XADD", "t:x", "*", "event", foreign]);

    let d = next(&mut sub).await;
    assert_eq!(d.event()["id"], "foreign-1");
    assert_eq!(
        d.delivery_attempt(),
        1,
        "a missing deliveryAttempt counts as 1"
    );
    assert_eq!(d.json(), foreign);
    assert_eq!(d.ack().await, Settled::Acked);
    assert!(logger.warned("malformed entry"));
    assert_eq!(pending(&server, "t:x", "g"), "0", "both entries settled");
}

#[tokio::test]
async fn fan_out_gives_every_subscriber_every_event_in_order_through_one_reader() {
    let server = Server::start("streams-fanout");
    let (ps, _) = pubsub(&server);
    let mut a = subscribe(&ps, "f", fan_out(StartFrom::Earliest)).await;
    let mut b = subscribe(&ps, "f", fan_out(StartFrom::Latest)).await;
    let mut other = subscribe(&ps, "g", fan_out(StartFrom::Earliest)).await;
    for i in 0..5 {
        publish(&ps, "f", ev(i)).await;
    }
    publish(&ps, "g", ev(9)).await;
    for sub in [&mut a, &mut b] {
        for i in 0..5 {
            let d = next(sub).await;
            assert_eq!(n(&d), i);
            d.ack().await;
        }
        nothing_within(sub, 200).await;
    }
    assert_eq!(n(&next(&mut other).await), 9);
    assert_eq!(
        server.cli(&["XINFO", "GROUPS", "t:f"]),
        "",
        "fan-out leaves no groups"
    );
    // The shared connection and one fan-out reader, whatever the subscriptions.
    assert_eq!(clients(&server), 2, "{}", server.cli(&["CLIENT", "LIST"]));
}

#[tokio::test]
async fn a_fan_out_subscriber_joining_a_topic_being_read_gets_the_backlog_the_others_not_twice() {
    let server = Server::start("streams-fanout-join");
    let (ps, _) = pubsub(&server);
    let mut first = subscribe(&ps, "j", fan_out(StartFrom::Earliest)).await;
    for i in 0..3 {
        publish(&ps, "j", ev(i)).await;
    }
    for i in 0..3 {
        assert_eq!(n(&next(&mut first).await), i);
    }
    let mut late = subscribe(&ps, "j", fan_out(StartFrom::Earliest)).await;
    let mut latest = subscribe(&ps, "j", fan_out(StartFrom::Latest)).await;
    for i in 0..3 {
        assert_eq!(n(&next(&mut late).await), i);
    }
    nothing_within(&mut first, 300).await;
    publish(&ps, "j", ev(3)).await;
    for sub in [&mut first, &mut late, &mut latest] {
        assert_eq!(n(&next(sub).await), 3);
        nothing_within(sub, 100).await;
    }
}

#[tokio::test]
async fn competing_consumers_in_a_group_each_get_a_share_and_no_event_twice() {
    let server = Server::start("streams-compete");
    let (ps, _) = pubsub(&server);
    let (other, _) = pubsub(&server);
    let mut a = subscribe(&ps, "work", group("workers", StartFrom::Latest)).await;
    let mut b = subscribe(&other, "work", group("workers", StartFrom::Latest)).await;
    let mut c = subscribe(&other, "work", group("workers", StartFrom::Latest)).await;
    assert_ne!(a.consumer(), b.consumer());
    assert_eq!(
        b.consumer(),
        c.consumer(),
        "one consumer per process and topic"
    );
    for i in 0..60 {
        publish(&ps, "work", ev(i)).await;
    }
    let mut seen = [Vec::new(), Vec::new(), Vec::new()];
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.iter().map(Vec::len).sum::<usize>() < 60 {
        assert!(Instant::now() < deadline, "only {:?} delivered", seen);
        tokio::select! {
            Some(d) = a.recv() => { seen[0].push(n(&d)); d.ack().await; }
            Some(d) = b.recv() => { seen[1].push(n(&d)); d.ack().await; }
            Some(d) = c.recv() => { seen[2].push(n(&d)); d.ack().await; }
        }
    }
    nothing_within(&mut a, 200).await;
    assert!(seen.iter().all(|s| !s.is_empty()), "{seen:?}");
    let mut all: Vec<u64> = seen.concat();
    all.sort_unstable();
    assert_eq!(all, (0..60).collect::<Vec<_>>());
    assert_eq!(pending(&server, "t:work", "workers"), "0");
}

#[tokio::test]
async fn a_late_group_gets_the_backlog_and_latest_only_what_follows() {
    let server = Server::start("streams-late");
    let (ps, _) = pubsub(&server);
    for i in 0..3 {
        publish(&ps, "late", ev(i)).await;
    }
    let mut backlog = subscribe(&ps, "late", group("g1", StartFrom::Earliest)).await;
    let mut latest = subscribe(&ps, "late", group("g2", StartFrom::Latest)).await;
    let mut latest_fan = subscribe(&ps, "late", fan_out(StartFrom::Latest)).await;
    let mut earliest_fan = subscribe(&ps, "late", fan_out(StartFrom::Earliest)).await;
    publish(&ps, "late", ev(3)).await;
    for sub in [&mut backlog, &mut earliest_fan] {
        for i in 0..4 {
            let d = next(sub).await;
            assert_eq!(n(&d), i);
            d.ack().await;
        }
    }
    for sub in [&mut latest, &mut latest_fan] {
        let d = next(sub).await;
        assert_eq!(n(&d), 3);
        d.ack().await;
        nothing_within(sub, 200).await;
    }
    // An existing group keeps its position whatever a new subscriber asks for.
    let (other, _) = pubsub(&server);
    let mut again = subscribe(&other, "late", group("g1", StartFrom::Earliest)).await;
    nothing_within(&mut again, 300).await;
}

#[tokio::test]
async fn nack_redelivers_with_the_next_attempt_and_drops_at_the_cap() {
    let server = Server::start("streams-nack");
    let (ps, logger) = with_logger(StreamsOptions {
        max_delivery_attempts: Some(3),
        ..options(&server)
    });
    let mut sub = subscribe(&ps, "n", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "n", fan_out(StartFrom::Earliest)).await;
    let (id, _) = publish(&ps, "n", ev(1)).await;

    for attempt in 1..=2 {
        let d = next(&mut sub).await;
        assert_eq!(d.delivery_attempt(), attempt);
        assert_eq!(d.event()["id"], json!(id), "the event keeps its id");
        assert_eq!(
            d.nack().await,
            Settled::Redelivered {
                attempt: attempt + 1
            }
        );
    }
    let last = next(&mut sub).await;
    assert_eq!(last.delivery_attempt(), 3);
    assert!(!logger.warned("max delivery attempts"));
    assert_eq!(last.nack().await, Settled::Dropped);
    assert!(logger.warned("max delivery attempts"));
    nothing_within(&mut sub, 300).await;
    assert_eq!(pending(&server, "t:n", "g"), "0");

    // The fan-out subscriber saw the original and both redeliveries.
    let mut attempts = Vec::new();
    for _ in 0..3 {
        let d = next(&mut fan).await;
        attempts.push(d.delivery_attempt());
        d.ack().await;
    }
    assert_eq!(attempts, [1, 2, 3]);
}

#[tokio::test]
async fn fan_out_subscribers_sharing_a_read_that_all_nack_it_cause_one_redelivery() {
    let server = Server::start("streams-fanout-nack");
    let (ps, _) = pubsub(&server);
    let mut a = subscribe(&ps, "fn", fan_out(StartFrom::Earliest)).await;
    let mut b = subscribe(&ps, "fn", fan_out(StartFrom::Earliest)).await;
    publish(&ps, "fn", ev(1)).await;
    let (da, db) = (next(&mut a).await, next(&mut b).await);
    assert_eq!(da.nack().await, Settled::Redelivered { attempt: 2 });
    assert_eq!(db.nack().await, Settled::Redelivered { attempt: 2 });
    for sub in [&mut a, &mut b] {
        let again = next(sub).await;
        assert_eq!(again.delivery_attempt(), 2);
        again.ack().await;
        nothing_within(sub, 200).await;
    }
    assert_eq!(server.cli(&["XLEN", "t:fn"]), "2");
}

#[tokio::test]
async fn a_delivery_is_held_until_settled_whatever_its_handler_does_meanwhile() {
    let server = Server::start("streams-held");
    let (ps, _) = pubsub(&server);
    let (sibling, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "k", group("g", StartFrom::Earliest)).await;
    publish(&ps, "k", ev(1)).await;
    let held = next(&mut sub).await;
    held.returned(); // its callback returned, as Mastra's worker callback does at once
    let mut other = subscribe(&sibling, "k", group("g", StartFrom::Earliest)).await;
    // Four times the 300 ms threshold, a dozen reclaim passes of each consumer's.
    nothing_within(&mut other, 1_200).await;
    nothing_within(&mut sub, 1).await;
    let detail = server.cli(&["XPENDING", "t:k", "g", "-", "+", "10"]);
    let fields: Vec<&str> = detail.lines().collect();
    assert_eq!(fields.len(), 4, "one pending entry: {detail}");
    assert_eq!(fields[1], sub.consumer().unwrap(), "still ours");
    assert_eq!(fields[3], "1", "Redis counted one delivery: {detail}");
    assert!(
        fields[2].parse::<u64>().unwrap() < 300,
        "kept claimed: {detail}"
    );

    // The late ack settles it, once.
    assert_eq!(held.ack().await, Settled::Acked);
    assert_eq!(pending(&server, "t:k", "g"), "0");
    nothing_within(&mut other, 500).await;
}

#[tokio::test]
async fn a_delivery_held_past_the_in_flight_timeout_is_nacked_on_its_behalf() {
    let server = Server::start("streams-in-flight");
    let (ps, logger) = with_logger(StreamsOptions {
        in_flight_timeout: Some(Duration::from_millis(400)),
        ..options(&server)
    });
    let mut sub = subscribe(&ps, "t", group("g", StartFrom::Earliest)).await;
    let (id, _) = publish(&ps, "t", ev(1)).await;
    let stalled = next(&mut sub).await;
    let taken = Instant::now();
    let again = next(&mut sub).await;
    assert!(
        taken.elapsed() >= Duration::from_millis(350),
        "{:?}",
        taken.elapsed()
    );
    assert_eq!(again.event()["id"], json!(id));
    assert_eq!(again.delivery_attempt(), 2);
    let warning = logger.find("inFlightTimeoutMs").expect("a warning");
    assert_eq!(warning.fields["eventId"], json!(id));
    // The stalled handler's late settles change nothing.
    assert_eq!(stalled.ack().await, Settled::Already);
    assert_eq!(stalled.nack().await, Settled::Already);
    assert_eq!(again.ack().await, Settled::Acked);
    assert_eq!(pending(&server, "t:t", "g"), "0");
}

#[tokio::test]
async fn a_delivery_held_unusually_long_is_warned_about() {
    let server = Server::start("streams-long-hold");
    let (ps, logger) = with_logger(StreamsOptions {
        reclaim_idle: Duration::from_millis(60),
        ..options(&server)
    });
    let mut sub = subscribe(&ps, "h", group("g", StartFrom::Earliest)).await;
    publish(&ps, "h", ev(1)).await;
    let held = next(&mut sub).await;
    eventually(3_000, "a warning about the long hold", || {
        logger.warned("held unsettled for a long time")
    })
    .await;
    let warning = logger.find("held unsettled").unwrap();
    assert_eq!(warning.fields["held"], json!(1));
    assert!(warning.fields["oldestMs"].as_u64().unwrap() >= 300);
    held.ack().await;
}

#[tokio::test]
async fn a_settle_redis_refuses_is_retried_in_the_background_until_it_lands() {
    let server = Server::start("streams-retry");
    let (ps, logger) = pubsub(&server);
    let mut sub = subscribe(&ps, "d", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "f", fan_out(StartFrom::Earliest)).await;
    publish(&ps, "d", ev(1)).await;
    publish(&ps, "d", ev(2)).await;
    publish(&ps, "f", ev(3)).await;
    let (first, second) = (next(&mut sub).await, next(&mut sub).await);
    let heard = next(&mut fan).await;
    server.cli(&["ACL", "SETUSER", "default", "-xack", "-evalsha", "-xadd"]);
    assert_eq!(first.ack().await, Settled::Retrying);
    assert_eq!(second.nack().await, Settled::Retrying);
    assert_eq!(heard.nack().await, Settled::Retrying);
    assert_eq!(first.ack().await, Settled::Already);
    assert!(logger.warned("could not settle an event"));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(pending(&server, "t:d", "g"), "2", "nothing landed yet");
    server.cli(&["ACL", "SETUSER", "default", "+xack", "+evalsha", "+xadd"]);
    // The nacked events come back, each once.
    let again = next(&mut sub).await;
    assert_eq!((n(&again), again.delivery_attempt()), (2, 2));
    let heard_again = next(&mut fan).await;
    assert_eq!((n(&heard_again), heard_again.delivery_attempt()), (3, 2));
    assert_eq!(again.ack().await, Settled::Acked);
    assert_eq!(pending(&server, "t:d", "g"), "0");
    nothing_within(&mut sub, 300).await;
    nothing_within(&mut fan, 1).await;
    assert_eq!(server.cli(&["XLEN", "t:d"]), "3");
    assert_eq!(server.cli(&["XLEN", "t:f"]), "2");
}

/// Calls of `command` so far, from `INFO commandstats`.
fn calls(server: &Server, command: &str) -> u64 {
    let stats = server.cli(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn ack_all_sends_one_xack_per_consumer() {
    let server = Server::start("streams-ackall");
    let (ps, _) = pubsub(&server);
    let mut one = subscribe(&ps, "b", group("g1", StartFrom::Earliest)).await;
    let mut two = subscribe(&ps, "b", group("g2", StartFrom::Earliest)).await;
    let mut all = subscribe(&ps, "b", fan_out(StartFrom::Earliest)).await;
    for i in 1..=5 {
        publish(&ps, "b", ev(i)).await;
    }
    let mut batch = Vec::new();
    for sub in [&mut one, &mut two, &mut all] {
        for _ in 0..5 {
            batch.push(next(sub).await);
        }
    }
    assert_eq!(batch[0].ack().await, Settled::Acked); // the first settle counts
    let before = calls(&server, "xack");
    let answers = Delivery::ack_all(&batch).await;
    assert_eq!(calls(&server, "xack") - before, 2, "one XACK per group");
    assert_eq!(answers[0], Settled::Already);
    assert!(
        answers[1..].iter().all(|a| *a == Settled::Acked),
        "{answers:?}"
    );
    assert_eq!(pending(&server, "t:b", "g1"), "0");
    assert_eq!(pending(&server, "t:b", "g2"), "0");
}

#[tokio::test]
async fn an_entry_a_crashed_consumer_never_acked_is_reclaimed_after_the_idle_threshold() {
    let server = Server::start("streams-reclaim");
    let (ps, _) = pubsub(&server);
    server.cli(&["XGROUP", "CREATE", "t:r", "workers", "0", "MKSTREAM"]);
    let (_, entry) = publish(&ps, "r", ev(9)).await;
    // The crashed consumer: reads the entry and is never heard from again.
    let read = server.cli(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "crashed",
        "COUNT",
        "1",
        "STREAMS",
        "t:r",
        ">",
    ]);
    let crashed_at = Instant::now();
    assert!(read.contains(&entry), "{read}");

    let mut sub = subscribe(&ps, "r", group("workers", StartFrom::Earliest)).await;
    let d = next(&mut sub).await;
    assert!(
        crashed_at.elapsed() >= Duration::from_millis(250),
        "claimed before it was idle"
    );
    assert_eq!(d.entry_id(), entry);
    assert_eq!(n(&d), 9);
    // Reclaim passes keep running; the entry this consumer holds is not handed out twice.
    nothing_within(&mut sub, 600).await;
    assert_eq!(d.ack().await, Settled::Acked);
    assert_eq!(pending(&server, "t:r", "workers"), "0");
}

#[tokio::test]
async fn each_reclaim_counts_as_a_delivery_and_past_the_cap_the_entry_is_dropped_not_handed_out() {
    let server = Server::start("streams-reclaim-cap");
    let (ps, logger) = with_logger(StreamsOptions {
        max_delivery_attempts: Some(3),
        ..options(&server)
    });
    server.cli(&["XGROUP", "CREATE", "t:p", "workers", "0", "MKSTREAM"]);
    let (id, entry) = publish(&ps, "p", ev(1)).await;
    // Attempt 1: a consumer reads it and crashes (never settles, never comes back).
    let read = server.cli(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "crashed",
        "COUNT",
        "1",
        "STREAMS",
        "t:p",
        ">",
    ]);
    assert!(read.contains(&entry), "{read}");
    // Attempts 2 and 3: processes of ours reclaim it and die too (closed without settling:
    // the entry stays pending, unclaimed).
    for attempt in 2..=3 {
        let (victim, _) = pubsub(&server);
        let mut sub = subscribe(&victim, "p", group("workers", StartFrom::Earliest)).await;
        let d = next(&mut sub).await;
        assert_eq!(d.entry_id(), entry);
        assert_eq!(d.delivery_attempt(), attempt);
        let carried: Json = serde_json::from_str(d.json()).unwrap();
        assert_eq!(
            carried["deliveryAttempt"],
            json!(attempt),
            "the JSON handed out"
        );
        assert_eq!(carried["id"], json!(id));
        victim.close().await;
    }
    assert!(!logger.warned("max delivery attempts"));
    // The fourth delivery would exceed the cap: dropped with the nack cap's warning, acked.
    let mut sub = subscribe(&ps, "p", group("workers", StartFrom::Earliest)).await;
    eventually(5_000, "dropped", || logger.warned("max delivery attempts")).await;
    nothing_within(&mut sub, 500).await;
    assert_eq!(pending(&server, "t:p", "workers"), "0");
    let drop = logger.find("max delivery attempts").unwrap();
    assert_eq!(drop.fields["eventId"], json!(id));
    assert_eq!(drop.fields["attempt"], json!(4));
    assert_eq!(drop.fields["reason"], json!("reclaimed"));
}

#[tokio::test]
async fn a_nack_after_another_consumer_reclaimed_the_entry_changes_nothing() {
    let server = Server::start("streams-notowned");
    let (ps, _) = pubsub(&server);
    let mut slow = subscribe(&ps, "o", group("g", StartFrom::Earliest)).await;
    publish(&ps, "o", ev(1)).await;
    let d = next(&mut slow).await;
    // A sibling's reclaim pass takes the entry over (forced here: a live consumer keeps
    // the entry it holds claimed, so it never sits idle long enough).
    let claimed = server.cli(&["XCLAIM", "t:o", "g", "sibling", "0", d.entry_id(), "JUSTID"]);
    assert_eq!(claimed, d.entry_id());
    assert_eq!(d.nack().await, Settled::NotOwned);
    assert_eq!(server.cli(&["XLEN", "t:o"]), "1", "no duplicate appended");
}

#[tokio::test]
async fn delivery_resumes_after_the_stream_is_deleted_under_a_group() {
    let server = Server::start("streams-nogroup");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "ng", group("g", StartFrom::Earliest)).await;
    publish(&ps, "ng", ev(1)).await;
    next(&mut sub).await.ack().await;
    server.cli(&["DEL", "t:ng"]);
    tokio::time::sleep(Duration::from_millis(250)).await; // the reader meets NOGROUP
    publish(&ps, "ng", ev(2)).await;
    let d = next(&mut sub).await;
    assert_eq!(n(&d), 2);
    d.ack().await;
}

#[tokio::test]
async fn a_group_reads_a_stream_re_created_at_or_below_its_position_from_the_start() {
    let server = Server::start("streams-recreated");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "rc", group("g", StartFrom::Earliest)).await;
    let (_, first) = publish(&ps, "rc", ev(1)).await;
    next(&mut sub).await.ack().await;
    // Another process deletes the stream and re-creates it within the same millisecond: the
    // new stream's first entry takes the very id this group last read.
    server.cli(&["DEL", "t:rc"]);
    let peer = r#"{"type":"step","id":"peer-2","runId":"run-1","data":{"n":2},"createdAt":"2024-01-01T00:00:00.000Z"}"#;
    let added = server.cli(&["XADD", "t:rc", &first, "event", peer]);
    assert_eq!(added, first);
    tokio::time::sleep(Duration::from_millis(250)).await; // the reader meets NOGROUP
    publish(&ps, "rc", ev(3)).await;
    for expected in [2, 3] {
        let d = next(&mut sub).await;
        assert_eq!(n(&d), expected);
        d.ack().await;
    }
    nothing_within(&mut sub, 300).await;
}

#[tokio::test]
async fn clear_topic_deletes_the_stream_and_subscribers_carry_on() {
    let server = Server::start("streams-clear");
    let (ps, logger) = pubsub(&server);
    let mut grouped = subscribe(&ps, "c", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "c", fan_out(StartFrom::Earliest)).await;
    publish(&ps, "c", ev(1)).await;
    next(&mut grouped).await.ack().await;
    next(&mut fan).await.ack().await;

    publish(&ps, "c", ev(9)).await;
    let held = next(&mut grouped).await;
    ps.clear_topic("c").await;
    assert_eq!(server.cli(&["EXISTS", "t:c"]), "0");
    // A delivery of the deleted stream has nothing left to settle.
    assert_eq!(held.nack().await, Settled::NotOwned);
    next(&mut fan).await.ack().await;
    publish(&ps, "c", ev(2)).await;
    assert_eq!(n(&next(&mut grouped).await), 2);
    assert_eq!(n(&next(&mut fan).await), 2);

    // Never fails, even with Redis frozen: it reports, and returns within the timeout.
    server.signal("-STOP");
    let started = Instant::now();
    ps.clear_topic("c").await;
    assert!(started.elapsed() < Duration::from_millis(1500));
    assert!(logger.warned("clearTopic failed"));
    server.signal("-CONT");
}

#[tokio::test]
async fn close_during_an_outage_settles_within_the_timeout_and_closes_every_connection() {
    let server = Server::start("streams-close");
    let ps = Arc::new(
        StreamsPubSub::new(StreamsOptions {
            connection: ConnectionOptions {
                url: server.url(),
                command_timeout: Duration::from_millis(300),
                ..ConnectionOptions::default()
            },
            ..options(&server)
        })
        .unwrap(),
    );
    let mut sub = subscribe(&ps, "z", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "y", fan_out(StartFrom::Earliest)).await;
    publish(&ps, "z", ev(1)).await;
    let held = next(&mut sub).await;
    assert_eq!(clients(&server), 3, "shared, group reader, fan-out reader");
    server.signal("-STOP");

    let publisher = {
        let ps = Arc::clone(&ps);
        tokio::spawn(async move {
            let (_, json) = stamped(ev(2));
            ps.publish_stamped_batch(vec![("z".into(), json)]).await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    ps.close().await;
    assert!(
        started.elapsed() < Duration::from_millis(1_200),
        "{:?}",
        started.elapsed()
    );
    let err = publisher.await.unwrap().pop().unwrap().unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_TIMEOUT");
    // A delivery handed out before close is let go: its ack sends nothing.
    assert_eq!(held.ack().await, Settled::Closed);

    let again = Instant::now();
    ps.close().await;
    assert!(again.elapsed() < Duration::from_millis(100));
    let (_, json) = stamped(ev(3));
    let answer = ps.publish_stamped_batch(vec![("z".into(), json)]).await;
    assert_eq!(answer[0].as_ref().unwrap_err().code(), "ERR_LEASE_CLOSED");
    let err = ps
        .subscribe("z", SubscribeOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_CLOSED");
    assert!(
        err.to_string().contains("streams pubsub is closed"),
        "{err}"
    );
    for sub in [&mut sub, &mut fan] {
        assert!(tokio::time::timeout(Duration::from_secs(1), sub.recv())
            .await
            .unwrap()
            .is_none());
    }
    server.signal("-CONT");
    eventually(2_000, "every connection closed", || clients(&server) == 0).await;
}

#[tokio::test]
async fn trimming_keeps_what_a_dead_consumer_holds_and_the_hard_limit_counts_what_it_cuts() {
    let server = Server::start("streams-trim");
    let (ps, logger) = with_logger(StreamsOptions {
        max_len: 10,
        hard_max_len: 100,
        // Nobody takes the dead consumer's entries over: they stay unsettled.
        reclaim_interval: None,
        ..options(&server)
    });
    server.cli(&["XGROUP", "CREATE", "t:trim", "workers", "0", "MKSTREAM"]);
    for i in 0..5 {
        publish(&ps, "trim", ev(i)).await;
    }
    // A consumer reads five entries and dies holding them.
    server.cli(&[
        "XREADGROUP",
        "GROUP",
        "workers",
        "dead",
        "COUNT",
        "5",
        "STREAMS",
        "t:trim",
        ">",
    ]);
    for i in 5..60 {
        publish(&ps, "trim", ev(i)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Nothing is cut: the dead consumer's entries are the oldest, and everything after them
    // is undelivered.
    assert_eq!(server.cli(&["XLEN", "t:trim"]), "60");
    // A live consumer reads and acks everything else: still, its oldest pending entry is
    // the floor.
    let mut sub = subscribe(&ps, "trim", group("workers", StartFrom::Earliest)).await;
    for i in 5..70 {
        if i >= 60 {
            publish(&ps, "trim", ev(i)).await;
        }
        next(&mut sub).await.ack().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.cli(&["XLEN", "t:trim"]), "70");
    assert!(!logger.warned("hardMaxStreamLength"));
    sub.unsubscribe().await;

    // Past the hard limit trimming cuts the oldest all the same, and counts the unsettled
    // among them: the dead consumer's five (the rest it cuts were acked).
    for i in 70..130 {
        publish(&ps, "trim", ev(i)).await;
    }
    let lost = || -> u64 {
        logger
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|n| n.message.contains("hardMaxStreamLength"))
            .map(|n| n.fields["lost"].as_u64().unwrap())
            .sum()
    };
    eventually(3_000, "five entries counted lost", || lost() == 5).await;
    eventually(3_000, "trimmed to the hard limit", || {
        server.cli(&["XLEN", "t:trim"]).parse::<u64>().unwrap() <= 100
    })
    .await;
    assert_eq!(
        pending(&server, "t:trim", "workers"),
        "5",
        "Redis still lists them"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(lost(), 5);
}

#[tokio::test]
async fn a_stream_without_groups_is_trimmed_and_expires_when_idle() {
    let server = Server::start("streams-expire");
    let ps = StreamsPubSub::new(StreamsOptions {
        max_len: 10,
        idle_ttl: Some(Duration::from_secs(60)),
        ..options(&server)
    })
    .unwrap();
    for i in 0..50 {
        publish(&ps, "trim", ev(i)).await;
    }
    eventually(2_000, "trimmed", || {
        server.cli(&["XLEN", "t:trim"]).parse::<u64>().unwrap() <= 11
    })
    .await;
    let ttl: i64 = server.cli(&["PTTL", "t:trim"]).parse().unwrap();
    assert!(ttl > 50_000, "{ttl}");
    // A subscribe that creates the stream sets the TTL too.
    let _sub = subscribe(&ps, "fresh", group("g", StartFrom::Earliest)).await;
    let ttl: i64 = server.cli(&["PTTL", "t:fresh"]).parse().unwrap();
    assert!(ttl > 50_000, "{ttl}");
}

#[tokio::test]
async fn readers_reconnect_after_a_redis_restart() {
    let mut server = Server::start("streams-restart");
    let (ps, _) = pubsub(&server);
    let mut grouped = subscribe(&ps, "re", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "re", fan_out(StartFrom::Earliest)).await;
    server.restart(); // everything is gone: the stream, the group
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, json) = stamped(ev(5));
        let answer = ps.publish_stamped_batch(vec![("re".into(), json)]).await;
        if answer[0].is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "publish never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(n(&next(&mut grouped).await), 5);
    assert_eq!(n(&next(&mut fan).await), 5);
}

#[tokio::test]
async fn unsubscribe_stops_delivery_and_hands_buffered_entries_back_to_the_group() {
    let server = Server::start("streams-unsub");
    let (ps, _) = pubsub(&server);
    let sub = subscribe(&ps, "u", group("g", StartFrom::Earliest)).await;
    for i in 0..3 {
        publish(&ps, "u", ev(i)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // read into the buffer, never taken
    sub.unsubscribe().await;
    assert_eq!(
        pending(&server, "t:u", "g"),
        "0",
        "nothing left owned by the gone consumer"
    );
    eventually(2_000, "the reader's connection closed", || {
        clients(&server) == 1
    })
    .await;

    let (other, _) = pubsub(&server);
    let mut next_one = subscribe(&other, "u", group("g", StartFrom::Earliest)).await;
    let mut got: Vec<u64> = Vec::new();
    for _ in 0..3 {
        let d = next(&mut next_one).await;
        assert_eq!(d.delivery_attempt(), 1, "a hand-back is not an attempt");
        got.push(n(&d));
        d.ack().await;
    }
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2]);
}

#[tokio::test]
async fn each_event_of_a_batch_gets_its_own_answer() {
    let server = Server::start("streams-batch");
    let (ps, _) = pubsub(&server);
    server.cli(&["SET", "t:string", "x"]);
    let answers = ps
        .publish_stamped_batch(vec![
            ("ok".into(), stamped(ev(1)).1),
            ("string".into(), stamped(ev(2)).1),
            ("ok".into(), "42".into()),
            ("ok".into(), stamped(ev(3)).1),
        ])
        .await;
    assert!(answers[0].is_ok());
    assert_eq!(answers[1].as_ref().unwrap_err().code(), "ERR_LEASE_REDIS");
    assert_eq!(
        answers[2].as_ref().unwrap_err().code(),
        "ERR_STREAMS_INVALID_ARGUMENT"
    );
    assert!(answers[3].is_ok());
    assert_eq!(server.cli(&["XLEN", "t:ok"]), "2");
}

#[tokio::test]
async fn bad_options_are_refused_and_bad_input_rejected_before_any_io() {
    let bad = |options: StreamsOptions| StreamsPubSub::new(options).unwrap_err().code();
    let invalid = "ERR_LEASE_INVALID_OPTION";
    assert_eq!(
        bad(StreamsOptions {
            batch_count: 0,
            ..StreamsOptions::default()
        }),
        invalid
    );
    assert_eq!(
        bad(StreamsOptions {
            block: Duration::ZERO,
            ..StreamsOptions::default()
        }),
        invalid
    );
    assert_eq!(
        bad(StreamsOptions {
            max_in_flight: Some(0),
            ..StreamsOptions::default()
        }),
        invalid
    );
    assert_eq!(
        bad(StreamsOptions {
            max_len: 100,
            hard_max_len: 50,
            ..StreamsOptions::default()
        }),
        invalid
    );
    assert_eq!(
        bad(StreamsOptions {
            connection: ConnectionOptions {
                url: "http://x".into(),
                ..ConnectionOptions::default()
            },
            ..StreamsOptions::default()
        }),
        invalid
    );
    let ps = StreamsPubSub::new(StreamsOptions {
        connection: ConnectionOptions {
            url: "redis+unix:///nonexistent/mastra-streams.sock".into(),
            ..ConnectionOptions::default()
        },
        ..StreamsOptions::default()
    })
    .unwrap();
    let answers = ps
        .publish_stamped_batch(vec![("t".into(), "\"not an object\"".into())])
        .await;
    let err = answers[0].as_ref().unwrap_err();
    assert_eq!(err.code(), "ERR_STREAMS_INVALID_ARGUMENT");
    assert_eq!(err.class(), crate::core::ErrorClass::Type);
    let err = ps
        .subscribe("t", group("", StartFrom::Earliest))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_STREAMS_INVALID_ARGUMENT");
    let answers = ps
        .publish_stamped_batch(vec![("t".into(), stamped(ev(1)).1)])
        .await;
    assert_eq!(
        answers[0].as_ref().unwrap_err().code(),
        "ERR_LEASE_CONNECTION"
    );
}
