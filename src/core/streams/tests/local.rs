//! `localOnly` events: who gets one, and whether a nacked one goes again, by the rules of
//! every other delivery.

use super::*;

async fn numbered(ps: &StreamsPubSub, options: SubscribeOptions) -> (u64, Subscription) {
    let id = ps.subscription_id("work", &options);
    let subscription = ps.subscribe_as(id, "work", options).await.unwrap();
    (id.get(), subscription)
}

/// Two members of the group `g` and a fan-out subscription, all on `work`, with their ids.
async fn two_members_and_a_fan_out(ps: &StreamsPubSub) -> ([u64; 3], [Subscription; 3]) {
    let (a, first) = numbered(ps, group("g", StartFrom::Latest)).await;
    let (b, second) = numbered(ps, group("g", StartFrom::Latest)).await;
    let (f, fanned) = numbered(ps, fan_out(StartFrom::Latest)).await;
    ([a, b, f], [first, second, fanned])
}

#[tokio::test]
async fn a_local_event_goes_to_every_fan_out_subscription_and_to_the_group_member_whose_turn_it_is_after_stream_events_took_theirs(
) {
    let server = Server::start("streams-local-turns");
    let (ps, _) = pubsub(&server);
    let ([a, b, f], [mut first, mut second, _fanned]) = two_members_and_a_fan_out(&ps).await;
    let everyone = |_| true;
    // The turn starts with the first member; a local event takes it like a stream event.
    assert_eq!(ps.local_recipients("work", everyone), vec![f, a]);
    publish(&ps, "work", ev(1)).await;
    let delivered = next(&mut second).await;
    assert_eq!(
        n(&delivered),
        1,
        "the stream event took the second member's turn"
    );
    delivered.ack().await;
    nothing_within(&mut first, 100).await;
    assert_eq!(ps.local_recipients("work", everyone), vec![f, a]);
    assert_eq!(ps.local_recipients("work", everyone), vec![f, b]);
    publish(&ps, "work", ev(2)).await;
    let delivered = next(&mut first).await;
    assert_eq!(
        n(&delivered),
        2,
        "and the next stream event goes on from there"
    );
    delivered.ack().await;
    assert!(ps.local_recipients("other", everyone).is_empty());
}

#[tokio::test]
async fn a_local_event_skips_subscriptions_the_caller_no_longer_serves_and_reaches_nobody_once_closed(
) {
    let server = Server::start("streams-local-live");
    let (ps, _) = pubsub(&server);
    let ([a, b, f], _subscriptions) = two_members_and_a_fan_out(&ps).await;
    let without_a = |id| id != a;
    for _ in 0..3 {
        assert_eq!(ps.local_recipients("work", without_a), vec![f, b]);
    }
    assert_eq!(
        ps.local_redelivery("work", Some("g"), a, without_a),
        Some(b)
    );
    assert_eq!(ps.local_redelivery("work", None, f, |_| true), Some(f));
    assert_eq!(ps.local_redelivery("work", None, f, |id| id != f), None);
    assert_eq!(
        ps.local_redelivery("work", Some("nobody"), a, |_| true),
        None
    );
    ps.close().await;
    assert!(ps.local_recipients("work", |_| true).is_empty());
    assert_eq!(ps.local_redelivery("work", None, f, |_| true), None);
}

#[tokio::test]
async fn a_nacked_local_event_goes_again_with_the_next_attempt_until_the_cap_then_is_dropped_with_the_warning(
) {
    let server = Server::start("streams-local-cap");
    let (ps, log) = with_logger(StreamsOptions {
        max_delivery_attempts: Some(3),
        ..options(&server)
    });
    assert_eq!(
        ps.local_nacked("work", json!("e1"), json!("step"), 1),
        Some(2)
    );
    assert_eq!(
        ps.local_nacked("work", json!("e1"), json!("step"), 2),
        Some(3)
    );
    assert!(!log.warned("max delivery attempts"));
    assert_eq!(ps.local_nacked("work", json!("e1"), json!("step"), 3), None);
    let warning = log
        .find("max delivery attempts")
        .expect("the drop is warned");
    assert_eq!(warning.fields["eventId"], "e1");
    assert_eq!(warning.fields["localOnly"], true);
    assert_eq!(warning.fields["attempt"], 3);

    let (unlimited, _) = with_logger(StreamsOptions {
        max_delivery_attempts: None,
        ..options(&server)
    });
    assert_eq!(
        unlimited.local_nacked("work", json!("e1"), json!("step"), 1_000),
        Some(1_001)
    );
}

#[tokio::test]
async fn a_subscription_gets_local_events_from_the_moment_it_is_numbered_before_it_opens() {
    let server = Server::start("streams-local-opening");
    let (ps, _) = pubsub(&server);
    let everyone = |_| true;
    let fanned = ps.subscription_id("work", &fan_out(StartFrom::Latest));
    let member = ps.subscription_id("work", &group("g", StartFrom::Latest));
    let other_topic = ps.subscription_id("other", &fan_out(StartFrom::Latest));
    let (fanned, member) = (fanned.get(), member.get());
    assert_eq!(ps.local_recipients("work", everyone), vec![fanned, member]);
    assert_eq!(
        ps.local_redelivery("work", Some("g"), member, everyone),
        Some(member)
    );
    assert_eq!(
        ps.local_redelivery("work", None, fanned, everyone),
        Some(fanned)
    );
    assert_eq!(
        ps.local_recipients("other", everyone),
        vec![other_topic.get()]
    );
    // Opened, each is one of its reader's, in the turn, and listed once.
    let options = fan_out(StartFrom::Latest);
    let _fanned = ps
        .subscribe_as(SubscriptionId(fanned), "work", options)
        .await
        .unwrap();
    let (opened, _first) = numbered(&ps, group("g", StartFrom::Latest)).await;
    assert_eq!(ps.local_recipients("work", everyone), vec![fanned, opened]);
    assert_eq!(
        ps.local_recipients("work", |id| id != opened),
        vec![fanned, member]
    );
}
