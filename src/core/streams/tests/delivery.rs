//! Publishing and delivery: the layout, fan-out, groups, where a subscription starts,
//! per-event answers, options refused.

use super::*;

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
