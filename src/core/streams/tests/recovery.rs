//! What goes wrong and is recovered from: a consumer that died, a deleted or re-created
//! stream, clearTopic, an outage at close, trimming, a Redis restart, unsubscribing.

use super::*;

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
async fn close_leaves_no_read_blocked_even_while_an_unsubscribe_stops_the_reader() {
    let server = Server::start("streams-close-unblock");
    let long = StreamsOptions {
        block: Duration::from_secs(30),
        reclaim_idle: Duration::from_secs(30),
        ..options(&server)
    };
    let (closing, _) = with_logger(long.clone());
    let (live, _) = with_logger(long);
    let leaving = subscribe(&closing, "z", group("g", StartFrom::Earliest)).await;
    // The closing consumer's read on "z" blocks first, so it would get the next entry.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut sibling = subscribe(&live, "z", group("g", StartFrom::Earliest)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let unsubscribing = tokio::spawn(leaving.unsubscribe());
    tokio::task::yield_now().await;
    let started = Instant::now();
    closing.close().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let blocked = server
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.contains("cmd=xreadgroup") && line.contains("flags=b"))
        .count();
    assert_eq!(blocked, 1, "only the sibling's read is blocked");
    publish(&live, "z", ev(1)).await;
    let delivery = tokio::time::timeout(Duration::from_millis(500), sibling.recv())
        .await
        .expect("the sibling got the entry at once")
        .expect("subscription ended");
    assert_eq!(n(&delivery), 1);
    unsubscribing.await.unwrap();
}
