//! The event transport against real `redis-server` processes, one per test, each on its own
//! unix socket. Peers that "crash" or write the layout by hand use `redis-cli`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

use super::*;
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
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|n| n.level == Level::Warn && n.message.contains(needle))
    }
}

fn options(server: &Server) -> StreamsOptions {
    StreamsOptions {
        url: server.url(),
        key_prefix: "t".into(),
        command_timeout: Duration::from_secs(1),
        block: Duration::from_millis(100),
        reclaim_interval: Some(Duration::from_millis(100)),
        reclaim_idle: Duration::from_millis(300),
        ..StreamsOptions::default()
    }
}

fn pubsub(server: &Server) -> (StreamsPubSub, Arc<Collect>) {
    let logger = Arc::new(Collect::default());
    let options = StreamsOptions {
        logger: Some(logger.clone()),
        ..options(server)
    };
    (StreamsPubSub::new(options).unwrap(), logger)
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

#[tokio::test]
async fn publish_stamps_the_event_and_writes_the_mastra_layout() {
    let server = Server::start("streams-publish");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "topic", fan_out(StartFrom::Earliest)).await;
    let published = ps.publish("topic", ev(1)).await.unwrap();

    let d = next(&mut sub).await;
    assert_eq!(d.event()["id"], json!(published.id));
    assert_eq!(d.entry_id(), published.entry_id);
    assert_eq!(d.delivery_attempt(), 1);
    assert_eq!(d.event()["deliveryAttempt"], json!(1));
    assert_eq!(d.event()["type"], "step");
    assert_eq!(n(&d), 1);
    let event = d.event();
    let created = event["createdAt"].as_str().unwrap();
    assert_eq!(created.len(), 24, "{created}");
    assert!(created.ends_with('Z') && created.as_bytes()[10] == b'T');
    assert_eq!(d.ack().await.unwrap(), Settled::Acked);
    assert_eq!(d.nack().await.unwrap(), Settled::AlreadySettled);

    // A plain XRANGE sees one field, `event`, holding the JSON.
    let raw = server.cli(&["XRANGE", "t:topic", "-", "+"]);
    let lines: Vec<&str> = raw.lines().collect();
    assert_eq!(lines[0], published.entry_id);
    assert_eq!(lines[1], "event");
    let stored: Json = serde_json::from_str(lines[2]).unwrap();
    assert_eq!(stored["id"], json!(published.id));
    assert_eq!(stored["data"]["n"], 1);
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
    d.ack().await.unwrap();
    assert!(logger.warned("malformed entry"));
    assert_eq!(pending(&server, "t:x", "g"), "0", "both entries settled");
}

#[tokio::test]
async fn fan_out_gives_every_subscriber_every_event_in_order() {
    let server = Server::start("streams-fanout");
    let (ps, _) = pubsub(&server);
    let mut a = subscribe(&ps, "f", fan_out(StartFrom::Earliest)).await;
    let mut b = subscribe(&ps, "f", fan_out(StartFrom::Latest)).await;
    for i in 0..5 {
        ps.publish("f", ev(i)).await.unwrap();
    }
    for sub in [&mut a, &mut b] {
        for i in 0..5 {
            let d = next(sub).await;
            assert_eq!(n(&d), i);
            d.ack().await.unwrap();
        }
        nothing_within(sub, 200).await;
    }
    assert_eq!(
        server.cli(&["XINFO", "GROUPS", "t:f"]),
        "",
        "fan-out leaves no groups"
    );
}

#[tokio::test]
async fn competing_consumers_in_a_group_each_get_a_share_and_no_event_twice() {
    let server = Server::start("streams-compete");
    let (ps, _) = pubsub(&server);
    let mut a = subscribe(&ps, "work", group("workers", StartFrom::Latest)).await;
    let mut b = subscribe(&ps, "work", group("workers", StartFrom::Latest)).await;
    assert_ne!(a.consumer(), b.consumer());
    for i in 0..40 {
        ps.publish("work", ev(i)).await.unwrap();
    }
    let mut seen_a = Vec::new();
    let mut seen_b = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen_a.len() + seen_b.len() < 40 {
        assert!(
            Instant::now() < deadline,
            "only {} delivered",
            seen_a.len() + seen_b.len()
        );
        tokio::select! {
            Some(d) = a.recv() => { seen_a.push(n(&d)); d.ack().await.unwrap(); }
            Some(d) = b.recv() => { seen_b.push(n(&d)); d.ack().await.unwrap(); }
        }
    }
    nothing_within(&mut a, 200).await;
    nothing_within(&mut b, 1).await;
    assert!(
        !seen_a.is_empty() && !seen_b.is_empty(),
        "{seen_a:?} {seen_b:?}"
    );
    let mut all: Vec<u64> = seen_a.iter().chain(&seen_b).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (0..40).collect::<Vec<_>>());
    assert_eq!(pending(&server, "t:work", "workers"), "0");
}

#[tokio::test]
async fn a_late_group_gets_the_backlog_and_latest_only_what_follows() {
    let server = Server::start("streams-late");
    let (ps, _) = pubsub(&server);
    for i in 0..3 {
        ps.publish("late", ev(i)).await.unwrap();
    }
    let mut backlog = subscribe(&ps, "late", group("g1", StartFrom::Earliest)).await;
    let mut latest = subscribe(&ps, "late", group("g2", StartFrom::Latest)).await;
    let mut latest_fan = subscribe(&ps, "late", fan_out(StartFrom::Latest)).await;
    let mut earliest_fan = subscribe(&ps, "late", fan_out(StartFrom::Earliest)).await;
    ps.publish("late", ev(3)).await.unwrap();
    for sub in [&mut backlog, &mut earliest_fan] {
        for i in 0..4 {
            let d = next(sub).await;
            assert_eq!(n(&d), i);
            d.ack().await.unwrap();
        }
    }
    for sub in [&mut latest, &mut latest_fan] {
        let d = next(sub).await;
        assert_eq!(n(&d), 3);
        d.ack().await.unwrap();
        nothing_within(sub, 200).await;
    }
    // An existing group keeps its position whatever a new subscriber asks for.
    let mut again = subscribe(&ps, "late", group("g1", StartFrom::Earliest)).await;
    nothing_within(&mut again, 300).await;
}

#[tokio::test]
async fn nack_redelivers_with_the_next_attempt_and_drops_at_the_cap() {
    let server = Server::start("streams-nack");
    let logger = Arc::new(Collect::default());
    let ps = StreamsPubSub::new(StreamsOptions {
        max_delivery_attempts: Some(3),
        logger: Some(logger.clone()),
        ..options(&server)
    })
    .unwrap();
    let mut sub = subscribe(&ps, "n", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "n", fan_out(StartFrom::Earliest)).await;
    let published = ps.publish("n", ev(1)).await.unwrap();

    for attempt in 1..=2 {
        let d = next(&mut sub).await;
        assert_eq!(d.delivery_attempt(), attempt);
        assert_eq!(
            d.event()["id"],
            json!(published.id),
            "the event keeps its id"
        );
        assert_eq!(
            d.nack().await.unwrap(),
            Settled::Redelivered {
                attempt: attempt + 1
            }
        );
    }
    let last = next(&mut sub).await;
    assert_eq!(last.delivery_attempt(), 3);
    assert!(!logger.warned("max delivery attempts"));
    assert_eq!(last.nack().await.unwrap(), Settled::Dropped);
    assert!(logger.warned("max delivery attempts"));
    nothing_within(&mut sub, 300).await;
    assert_eq!(pending(&server, "t:n", "g"), "0");

    // The fan-out subscriber saw the original and both redeliveries.
    let attempts: Vec<u64> = [
        next(&mut fan).await,
        next(&mut fan).await,
        next(&mut fan).await,
    ]
    .iter()
    .map(Delivery::delivery_attempt)
    .collect();
    assert_eq!(attempts, [1, 2, 3]);
}

#[tokio::test]
async fn a_delivery_dropped_unsettled_counts_as_a_nack() {
    let server = Server::start("streams-dropnack");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "d", group("g", StartFrom::Earliest)).await;
    ps.publish("d", ev(1)).await.unwrap();
    let first = next(&mut sub).await;
    let acker = first.acker();
    drop(first);
    // Still held through the acker: not settled yet.
    nothing_within(&mut sub, 200).await;
    drop(acker);
    let again = next(&mut sub).await;
    assert_eq!(again.delivery_attempt(), 2);
    again.ack().await.unwrap();
}

#[tokio::test]
async fn a_delivery_whose_ack_was_lost_is_acked_again_when_dropped_not_redelivered() {
    let server = Server::start("streams-lostack");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "d", group("g", StartFrom::Earliest)).await;
    ps.publish("d", ev(1)).await.unwrap();
    let first = next(&mut sub).await;
    // Refused outright, not merely unanswered (an unanswered XACK may still run later):
    // XACK is forbidden for a moment.
    server.cli(&["ACL", "SETUSER", "default", "-xack"]);
    assert!(
        first.ack().await.is_err(),
        "the ack must fail while XACK is forbidden"
    );
    server.cli(&["ACL", "SETUSER", "default", "+xack"]);
    assert_eq!(pending(&server, "t:d", "g"), "1");
    drop(first);
    // The event was handled: no redelivery with attempt 2, and nothing left pending.
    nothing_within(&mut sub, 500).await;
    let deadline = Instant::now() + Duration::from_secs(3);
    while pending(&server, "t:d", "g") != "0" {
        assert!(
            Instant::now() < deadline,
            "the dropped delivery was never acked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
async fn ack_all_sends_one_xack_per_subscription_and_a_refused_one_fails_its_deliveries_only_pending(
) {
    let server = Server::start("streams-ackall");
    let (ps, _) = pubsub(&server);
    let mut one = subscribe(&ps, "b", group("g1", StartFrom::Earliest)).await;
    let mut two = subscribe(&ps, "b", group("g2", StartFrom::Earliest)).await;
    let mut all = subscribe(&ps, "b", fan_out(StartFrom::Earliest)).await;
    for i in 1..=5 {
        ps.publish("b", ev(i)).await.unwrap();
    }
    let mut batch = Vec::new();
    for sub in [&mut one, &mut two, &mut all] {
        for _ in 0..5 {
            batch.push(next(sub).await);
        }
    }
    batch[0].ack().await.unwrap(); // settled before the batch: the first settlement counts

    server.cli(&["ACL", "SETUSER", "default", "-xack"]);
    let refused = Delivery::ack_all(&batch).await;
    server.cli(&["ACL", "SETUSER", "default", "+xack"]);
    assert_eq!(refused[0].as_ref().ok(), Some(&Settled::AlreadySettled));
    assert!(refused[1..10].iter().all(Result::is_err), "{refused:?}");
    // Fan-out holds nothing in Redis: acked whatever happened to the XACKs.
    assert!(refused[10..]
        .iter()
        .all(|a| a.as_ref().ok() == Some(&Settled::Acked)));
    assert_eq!(pending(&server, "t:b", "g1"), "4");
    assert_eq!(pending(&server, "t:b", "g2"), "5");

    let before = calls(&server, "xack");
    let answers = Delivery::ack_all(&batch).await;
    assert_eq!(calls(&server, "xack") - before, 2, "one XACK per group");
    assert_eq!(answers[0].as_ref().ok(), Some(&Settled::AlreadySettled));
    assert!(answers[1..10]
        .iter()
        .all(|a| a.as_ref().ok() == Some(&Settled::Acked)));
    assert!(answers[10..]
        .iter()
        .all(|a| a.as_ref().ok() == Some(&Settled::AlreadySettled)));
    assert_eq!(pending(&server, "t:b", "g1"), "0");
    assert_eq!(pending(&server, "t:b", "g2"), "0");
}

#[tokio::test]
async fn an_entry_a_crashed_consumer_never_acked_is_reclaimed_after_the_idle_threshold() {
    let server = Server::start("streams-reclaim");
    let (ps, _) = pubsub(&server);
    server.cli(&["XGROUP", "CREATE", "t:r", "workers", "0", "MKSTREAM"]);
    let published = ps.publish("r", ev(9)).await.unwrap();
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
    assert!(read.contains(&published.entry_id), "{read}");

    let mut sub = subscribe(&ps, "r", group("workers", StartFrom::Earliest)).await;
    let d = next(&mut sub).await;
    assert!(
        crashed_at.elapsed() >= Duration::from_millis(250),
        "claimed before it was idle"
    );
    assert_eq!(d.entry_id(), published.entry_id);
    assert_eq!(n(&d), 9);
    // Reclaim passes keep running; the entry this consumer holds is not handed out twice.
    nothing_within(&mut sub, 600).await;
    assert_eq!(d.ack().await.unwrap(), Settled::Acked);
    assert_eq!(pending(&server, "t:r", "workers"), "0");
}

#[tokio::test]
async fn an_entry_is_kept_claimed_while_its_handler_runs_and_reclaimed_once_handled_unsettled() {
    let server = Server::start("streams-keep");
    let (ps, _) = pubsub(&server);
    let (sibling, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "k", group("g", StartFrom::Earliest)).await;
    ps.publish("k", ev(1)).await.unwrap();
    let held = next(&mut sub).await;
    let mut other = subscribe(&sibling, "k", group("g", StartFrom::Earliest)).await;
    // Four times the 300 ms threshold, a dozen reclaim passes of the sibling's.
    nothing_within(&mut other, 1_200).await;
    let detail = server.cli(&["XPENDING", "t:k", "g", "-", "+", "10"]);
    let deliveries: Vec<&str> = detail.lines().collect();
    assert_eq!(deliveries.len(), 4, "one pending entry: {detail}");
    assert_eq!(deliveries[3], "1", "Redis counted one delivery: {detail}");

    held.handled(); // returned without settling: left to the reclaim passes
    let again = tokio::select! {
        d = next(&mut other) => d,
        d = next(&mut sub) => d,
    };
    assert_eq!(n(&again), 1);
    assert_eq!(again.delivery_attempt(), 2);
    again.ack().await.unwrap();
    drop(held);
    assert_eq!(pending(&server, "t:k", "g"), "0");
}

#[tokio::test]
async fn a_delivery_its_handler_let_go_stays_pending_when_dropped_and_is_not_nacked() {
    let server = Server::start("streams-letgo");
    let ps = StreamsPubSub::new(StreamsOptions {
        reclaim_interval: None,
        ..options(&server)
    })
    .unwrap();
    let mut sub = subscribe(&ps, "l", group("g", StartFrom::Earliest)).await;
    ps.publish("l", ev(1)).await.unwrap();
    let d = next(&mut sub).await;
    d.handled();
    drop(d);
    nothing_within(&mut sub, 500).await;
    assert_eq!(
        pending(&server, "t:l", "g"),
        "1",
        "left pending, for a reclaim"
    );
    assert_eq!(server.cli(&["XLEN", "t:l"]), "1", "not appended again");
}

#[tokio::test]
async fn a_late_nack_of_a_delivery_this_consumer_handed_out_again_appends_no_duplicate() {
    let server = Server::start("streams-superseded");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "s", group("g", StartFrom::Earliest)).await;
    ps.publish("s", ev(1)).await.unwrap();
    let first = next(&mut sub).await;
    first.handled(); // returned without settling: left to the reclaim passes
    let again = next(&mut sub).await; // this consumer's own reclaim, past 300 ms idle
    assert_eq!(again.entry_id(), first.entry_id());
    assert_eq!(again.delivery_attempt(), 2);

    assert_eq!(first.nack().await.unwrap(), Settled::NotOwned);
    assert_eq!(server.cli(&["XLEN", "t:s"]), "1", "no duplicate appended");
    assert_eq!(
        pending(&server, "t:s", "g"),
        "1",
        "still held by the newer delivery"
    );
    nothing_within(&mut sub, 500).await;
    assert_eq!(again.ack().await.unwrap(), Settled::Acked);
    assert_eq!(pending(&server, "t:s", "g"), "0");
}

#[tokio::test]
async fn each_reclaim_counts_as_a_delivery_and_past_the_cap_the_entry_is_dropped_not_handed_out() {
    let server = Server::start("streams-reclaim-cap");
    let logger = Arc::new(Collect::default());
    let ps = StreamsPubSub::new(StreamsOptions {
        max_delivery_attempts: Some(3),
        logger: Some(logger.clone()),
        ..options(&server)
    })
    .unwrap();
    server.cli(&["XGROUP", "CREATE", "t:p", "workers", "0", "MKSTREAM"]);
    let published = ps.publish("p", ev(1)).await.unwrap();
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
    assert!(read.contains(&published.entry_id), "{read}");
    // Attempts 2 and 3: consumers of ours reclaim it and crash too (the delivery is leaked,
    // so nothing settles it, and the subscription is gone).
    for attempt in 2..=3 {
        let mut sub = subscribe(&ps, "p", group("workers", StartFrom::Earliest)).await;
        let d = next(&mut sub).await;
        assert_eq!(d.entry_id(), published.entry_id);
        assert_eq!(d.delivery_attempt(), attempt);
        assert_eq!(d.event()["deliveryAttempt"], json!(attempt));
        let carried: Json = serde_json::from_str(d.json()).unwrap();
        assert_eq!(
            carried["deliveryAttempt"],
            json!(attempt),
            "the JSON handed out"
        );
        assert_eq!(carried["id"], json!(published.id));
        std::mem::forget(d);
        drop(sub);
    }
    assert!(!logger.warned("max delivery attempts"));
    // The fourth delivery would exceed the cap: dropped with the nack cap's warning, acked.
    let mut sub = subscribe(&ps, "p", group("workers", StartFrom::Earliest)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !logger.warned("max delivery attempts") {
        assert!(Instant::now() < deadline, "never dropped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nothing_within(&mut sub, 500).await;
    assert_eq!(pending(&server, "t:p", "workers"), "0");
    let notices = logger.0.lock().unwrap().clone();
    let drop = notices
        .iter()
        .find(|n| n.message.contains("max delivery attempts"))
        .unwrap();
    assert_eq!(drop.fields["eventId"], json!(published.id));
    assert_eq!(drop.fields["attempt"], json!(4));
    assert_eq!(drop.fields["reason"], json!("reclaimed"));
}

#[tokio::test]
async fn a_nack_after_another_consumer_reclaimed_the_entry_changes_nothing() {
    let server = Server::start("streams-notowned");
    let (ps, _) = pubsub(&server);
    let mut slow = subscribe(&ps, "o", group("g", StartFrom::Earliest)).await;
    ps.publish("o", ev(1)).await.unwrap();
    let d = next(&mut slow).await;
    // A sibling's reclaim pass takes the entry over (forced here: a live consumer keeps
    // the entry it is handling claimed, so it never sits idle long enough).
    let claimed = server.cli(&["XCLAIM", "t:o", "g", "sibling", "0", d.entry_id(), "JUSTID"]);
    assert_eq!(claimed, d.entry_id());
    assert_eq!(d.nack().await.unwrap(), Settled::NotOwned);
    assert_eq!(server.cli(&["XLEN", "t:o"]), "1", "no duplicate appended");
    drop(slow);
}

#[tokio::test]
async fn delivery_resumes_after_the_stream_is_deleted_under_a_group() {
    let server = Server::start("streams-nogroup");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "ng", group("g", StartFrom::Earliest)).await;
    ps.publish("ng", ev(1)).await.unwrap();
    next(&mut sub).await.ack().await.unwrap();
    server.cli(&["DEL", "t:ng"]);
    tokio::time::sleep(Duration::from_millis(250)).await; // the reader meets NOGROUP
    ps.publish("ng", ev(2)).await.unwrap();
    let d = next(&mut sub).await;
    assert_eq!(n(&d), 2);
    d.ack().await.unwrap();
}

#[tokio::test]
async fn a_group_reads_a_stream_re_created_at_or_below_its_position_from_the_start() {
    let server = Server::start("streams-recreated");
    let (ps, _) = pubsub(&server);
    let mut sub = subscribe(&ps, "rc", group("g", StartFrom::Earliest)).await;
    let first = ps.publish("rc", ev(1)).await.unwrap();
    next(&mut sub).await.ack().await.unwrap();
    // Another process deletes the stream and re-creates it within the same millisecond: the
    // new stream's first entry takes the very id this group last read.
    server.cli(&["DEL", "t:rc"]);
    let peer = r#"{"type":"step","id":"peer-2","runId":"run-1","data":{"n":2},"createdAt":"2024-01-01T00:00:00.000Z"}"#;
    let added = server.cli(&["XADD", "t:rc", &first.entry_id, "event", peer]);
    assert_eq!(added, first.entry_id);
    tokio::time::sleep(Duration::from_millis(250)).await; // the reader meets NOGROUP
    ps.publish("rc", ev(3)).await.unwrap();
    for expected in [2, 3] {
        let d = next(&mut sub).await;
        assert_eq!(n(&d), expected);
        d.ack().await.unwrap();
    }
    nothing_within(&mut sub, 300).await;
}

#[tokio::test]
async fn clear_topic_deletes_the_stream_and_subscribers_carry_on() {
    let server = Server::start("streams-clear");
    let (ps, logger) = pubsub(&server);
    let mut grouped = subscribe(&ps, "c", group("g", StartFrom::Earliest)).await;
    let mut fan = subscribe(&ps, "c", fan_out(StartFrom::Earliest)).await;
    ps.publish("c", ev(1)).await.unwrap();
    next(&mut grouped).await.ack().await.unwrap();
    next(&mut fan).await.ack().await.unwrap();

    ps.publish("c", ev(9)).await.unwrap();
    let held = next(&mut grouped).await;
    ps.clear_topic("c").await;
    assert_eq!(server.cli(&["EXISTS", "t:c"]), "0");
    // A delivery of the deleted stream has nothing left to settle.
    assert_eq!(held.nack().await.unwrap(), Settled::NotOwned);
    next(&mut fan).await.ack().await.unwrap();
    ps.publish("c", ev(2)).await.unwrap();
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
async fn close_during_an_outage_settles_within_the_timeout() {
    let server = Server::start("streams-close");
    let ps = Arc::new(
        StreamsPubSub::new(StreamsOptions {
            command_timeout: Duration::from_millis(300),
            ..options(&server)
        })
        .unwrap(),
    );
    let mut sub = subscribe(&ps, "z", group("g", StartFrom::Earliest)).await;
    ps.publish("z", ev(1)).await.unwrap();
    let held = next(&mut sub).await;
    server.signal("-STOP");

    let publisher = {
        let ps = Arc::clone(&ps);
        tokio::spawn(async move { ps.publish("z", ev(2)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let started = Instant::now();
    ps.close().await;
    assert!(
        started.elapsed() < Duration::from_millis(800),
        "{:?}",
        started.elapsed()
    );
    let err = publisher.await.unwrap().unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_TIMEOUT");
    // An ack of a delivery handed out before close is still bounded.
    assert_eq!(held.ack().await.unwrap_err().code(), "ERR_LEASE_TIMEOUT");

    let again = Instant::now();
    ps.close().await;
    assert!(again.elapsed() < Duration::from_millis(100));
    assert!(ps.is_closed());
    assert_eq!(
        ps.publish("z", ev(3)).await.unwrap_err().code(),
        "ERR_LEASE_CLOSED"
    );
    let err = ps
        .subscribe("z", SubscribeOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_CLOSED");
    assert!(tokio::time::timeout(Duration::from_secs(1), sub.recv())
        .await
        .unwrap()
        .is_none());
    server.signal("-CONT");
}

#[tokio::test]
async fn streams_are_trimmed_and_expire_when_idle() {
    let server = Server::start("streams-trim");
    let ps = StreamsPubSub::new(StreamsOptions {
        max_len: 10,
        idle_ttl: Some(Duration::from_secs(60)),
        ..options(&server)
    })
    .unwrap();
    let batch: Vec<(String, Json)> = (0..400).map(|i| ("trim".to_owned(), ev(i))).collect();
    for answer in ps.publish_batch(batch).await {
        answer.unwrap();
    }
    let len: u64 = server.cli(&["XLEN", "t:trim"]).parse().unwrap();
    assert!(len < 250, "MAXLEN ~ 10 left {len} entries");
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
    while ps.publish("re", ev(5)).await.is_err() {
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
        ps.publish("u", ev(i)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // read into the buffer, never taken
    sub.unsubscribe().await;
    assert_eq!(
        pending(&server, "t:u", "g"),
        "0",
        "nothing left owned by the gone consumer"
    );

    let mut next_one = subscribe(&ps, "u", group("g", StartFrom::Earliest)).await;
    let mut got: Vec<u64> = Vec::new();
    for _ in 0..3 {
        let d = next(&mut next_one).await;
        assert_eq!(d.delivery_attempt(), 1, "a hand-back is not an attempt");
        got.push(n(&d));
        d.ack().await.unwrap();
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
        .publish_batch(vec![
            ("ok".into(), ev(1)),
            ("string".into(), ev(2)),
            ("ok".into(), json!(42)),
            ("ok".into(), ev(3)),
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
    let published = ps
        .publish_json("ok", r#"{"type":"j","data":null}"#)
        .await
        .unwrap();
    assert!(server
        .cli(&["XRANGE", "t:ok", "-", "+"])
        .contains(&published.id));
}

#[tokio::test]
async fn bad_input_is_rejected_before_any_io() {
    let bad = |options: StreamsOptions| StreamsPubSub::new(options).unwrap_err().code();
    assert_eq!(
        bad(StreamsOptions {
            batch_count: 0,
            ..StreamsOptions::default()
        }),
        "ERR_LEASE_INVALID_OPTION"
    );
    assert_eq!(
        bad(StreamsOptions {
            block: Duration::ZERO,
            ..StreamsOptions::default()
        }),
        "ERR_LEASE_INVALID_OPTION"
    );
    assert_eq!(
        bad(StreamsOptions {
            max_in_flight: Some(0),
            ..StreamsOptions::default()
        }),
        "ERR_LEASE_INVALID_OPTION"
    );
    assert_eq!(
        bad(StreamsOptions {
            url: "http://x".into(),
            ..StreamsOptions::default()
        }),
        "ERR_LEASE_INVALID_OPTION"
    );
    let ps = StreamsPubSub::new(StreamsOptions {
        url: "redis+unix:///nonexistent/mastra-streams.sock".into(),
        ..StreamsOptions::default()
    })
    .unwrap();
    let err = ps.publish("t", json!("not an object")).await.unwrap_err();
    assert_eq!(err.code(), "ERR_STREAMS_INVALID_ARGUMENT");
    assert_eq!(err.class(), crate::core::ErrorClass::Type);
    let err = ps
        .subscribe("t", group("", StartFrom::Earliest))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_STREAMS_INVALID_ARGUMENT");
    let err = ps.publish("t", ev(1)).await.unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_CONNECTION");
}
