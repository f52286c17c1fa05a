//! Settling: nack and the attempt cap, deliveries held until settled, the in-flight
//! timeout, settles retried until they land, acks in bulk.

use super::*;

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
async fn fan_out_subscribers_that_all_nack_an_event_cause_one_redelivery() {
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
async fn fan_out_subscribers_that_nack_an_event_after_their_callbacks_returned_cause_one_redelivery(
) {
    let server = Server::start("streams-fanout-late-nack");
    let (ps, _) = pubsub(&server);
    let mut a = subscribe(&ps, "fl", fan_out(StartFrom::Earliest)).await;
    let mut b = subscribe(&ps, "fl", fan_out(StartFrom::Earliest)).await;
    publish(&ps, "fl", ev(1)).await;
    let (da, db) = (next(&mut a).await, next(&mut b).await);
    da.returned();
    db.returned();
    assert!(ps.delivery(da.id()).is_none(), "no longer held");
    let nack = |d: &Delivery| ps.nack_returned("fl", d.shared_json());
    assert_eq!(nack(&da).await, Settled::Redelivered { attempt: 2 });
    assert_eq!(nack(&db).await, Settled::Redelivered { attempt: 2 });
    for sub in [&mut a, &mut b] {
        let again = next(sub).await;
        assert_eq!((n(&again), again.delivery_attempt()), (1, 2));
        again.ack().await;
        nothing_within(sub, 200).await;
    }
    assert_eq!(server.cli(&["XLEN", "t:fl"]), "2");
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
async fn extend_pushes_back_the_in_flight_timeout_and_keeps_only_an_entry_still_owned() {
    let server = Server::start("streams-extend");
    let ps = StreamsPubSub::new(StreamsOptions {
        in_flight_timeout: Some(Duration::from_millis(300)),
        ..options(&server)
    })
    .unwrap();
    let mut sub = subscribe(&ps, "x", group("g", StartFrom::Earliest)).await;
    publish(&ps, "x", ev(1)).await;
    let working = next(&mut sub).await;
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(working.extend().await, Extended::Kept);
    }
    nothing_within(&mut sub, 50).await;
    assert_eq!(working.ack().await, Settled::Acked);
    assert_eq!(
        working.extend().await,
        Extended::NotHeld,
        "settled: nothing to extend"
    );

    publish(&ps, "x", ev(2)).await;
    let taken_over = next(&mut sub).await;
    let id = taken_over.entry_id().to_owned();
    server.cli(&["XCLAIM", "t:x", "g", "sibling", "0", &id, "JUSTID"]);
    assert_eq!(taken_over.extend().await, Extended::NotOwned);
    let detail = server.cli(&["XPENDING", "t:x", "g", "-", "+", "10"]);
    assert!(detail.contains("sibling"), "still the sibling's: {detail}");
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

#[tokio::test]
async fn close_sends_a_settle_retrying_in_the_background_once_more_and_waits_for_it() {
    let server = Server::start("streams-retry-close");
    let (ps, logger) = with_logger(StreamsOptions {
        connection: ConnectionOptions {
            command_timeout: Duration::from_millis(500),
            ..options(&server).connection
        },
        ..options(&server)
    });
    let mut sub = subscribe(&ps, "d", group("g", StartFrom::Earliest)).await;
    publish(&ps, "d", ev(1)).await;
    publish(&ps, "d", ev(2)).await;
    let (landing, refused) = (next(&mut sub).await, next(&mut sub).await);
    server.cli(&["ACL", "SETUSER", "default", "-xack", "-evalsha"]);
    assert_eq!(landing.ack().await, Settled::Retrying);
    assert_eq!(refused.nack().await, Settled::Retrying);
    // Redis takes XACK again but not the nack's script: the ack lands in close's last send,
    // before close returns; the nack fails for good, is reported, and stays pending.
    server.cli(&["ACL", "SETUSER", "default", "+xack"]);
    let started = std::time::Instant::now();
    ps.close().await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "close is bounded"
    );
    let pending_ids = server.cli(&["XPENDING", "t:d", "g", "-", "+", "10"]);
    assert!(!pending_ids.contains(landing.entry_id()), "the ack landed");
    assert!(pending_ids.contains(refused.entry_id()), "the nack did not");
    assert!(logger.warned("closed before a settle could reach Redis"));
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
    let before = server.calls("xack");
    let answers = Delivery::ack_all(&batch).await;
    assert_eq!(server.calls("xack") - before, 2, "one XACK per group");
    assert_eq!(answers[0], Settled::Already);
    assert!(
        answers[1..].iter().all(|a| *a == Settled::Acked),
        "{answers:?}"
    );
    assert_eq!(pending(&server, "t:b", "g1"), "0");
    assert_eq!(pending(&server, "t:b", "g2"), "0");
}
