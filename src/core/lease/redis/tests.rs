//! The Redis store against a real `redis-server` each test starts on its own unix socket.

use std::time::{Duration, Instant};

use super::{RedisOptions, RedisStore};
use crate::core::connection::ConnectionOptions;
use crate::core::lease::keys::Layout;
use crate::core::lease::{Grant, Lease};
use crate::core::test_redis::Server;
use crate::core::{Answer, Call, LeaseStore};

fn store(server: &Server, command_timeout: Duration) -> RedisStore {
    RedisStore::new(RedisOptions {
        connection: ConnectionOptions {
            url: server.url(),
            command_timeout,
            ..ConnectionOptions::default()
        },
        key_prefix: "t".into(),
        ..RedisOptions::default()
    })
    .unwrap()
}

fn acquire(key: &str, owner: &str, ttl_ms: u64) -> Call {
    Call::Acquire {
        key: key.into(),
        owner: owner.into(),
        ttl_ms,
    }
}

fn grant(acquired: bool, owner: &str, token: Option<u64>) -> Answer {
    Answer::Grant(Grant {
        acquired,
        owner: Some(owner.into()),
        token,
    })
}

/// The token an acquire answered; panics on anything but a grant.
fn token_of(answer: Answer) -> u64 {
    match answer {
        Answer::Grant(Grant {
            acquired: true,
            token: Some(token),
            ..
        }) => token,
        other => panic!("not a grant with a token: {other:?}"),
    }
}

fn lease(key: &str) -> Call {
    Call::Lease { key: key.into() }
}

/// A lease key's companion keys under the tests' prefix, as text for redis-cli.
fn companions(key: &str) -> (String, String) {
    let keys = Layout::new("t").keys(key);
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (text(keys.token), text(keys.counter))
}

#[tokio::test]
async fn a_batch_answers_each_call_in_order_and_bad_calls_never_reach_redis() {
    let server = Server::start("lease-batch");
    let store = store(&server, Duration::from_secs(2));
    let answers = store
        .execute(vec![
            acquire("k", "a", 10_000),
            acquire("k", "b", 10_000),
            acquire("k", "", 10_000),
            Call::Owner { key: "k".into() },
            acquire("k\0x", "b", 0),
        ])
        .await;
    assert_eq!(answers[0].as_ref().unwrap(), &grant(true, "a", Some(1)));
    assert_eq!(answers[1].as_ref().unwrap(), &grant(false, "a", None));
    assert_eq!(
        answers[2].as_ref().unwrap_err().code(),
        "ERR_LEASE_INVALID_OWNER"
    );
    assert_eq!(
        answers[3].as_ref().unwrap(),
        &Answer::Owner(Some("a".into()))
    );
    assert_eq!(
        answers[4].as_ref().unwrap_err().code(),
        "ERR_LEASE_INVALID_TTL"
    );
    assert_eq!(server.cli(&["GET", "t:lease:k"]), "a");
    assert_eq!(
        server.cli(&["DBSIZE"]),
        "3",
        "only the good acquire wrote keys: the lease, its token, the slot's counter"
    );
}

#[tokio::test]
async fn script_flush_is_invisible_to_callers() {
    let server = Server::start("lease-noscript");
    let store = store(&server, Duration::from_secs(2));
    assert_eq!(
        store.execute_one(acquire("k", "a", 10_000)).await.unwrap(),
        grant(true, "a", Some(1))
    );
    server.cli(&["SCRIPT", "FLUSH"]);
    let renew = Call::Renew {
        key: "k".into(),
        owner: "a".into(),
        ttl_ms: 10_000,
    };
    let answers = store.execute(vec![renew, acquire("j", "b", 500)]).await;
    assert_eq!(answers[0].as_ref().unwrap(), &Answer::Renewed(true));
    assert!(matches!(
        answers[1].as_ref().unwrap(),
        Answer::Grant(Grant { acquired: true, owner: Some(o), token: Some(_) }) if o == "b"
    ));
}

#[tokio::test]
async fn a_frozen_server_makes_calls_time_out_and_a_thawed_one_answers_again() {
    let server = Server::start("lease-frozen");
    let store = store(&server, Duration::from_millis(300));
    store.execute_one(acquire("k", "a", 10_000)).await.unwrap();
    server.signal("-STOP");
    let started = Instant::now();
    let err = store
        .execute_one(Call::Owner { key: "k".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_TIMEOUT");
    assert!(started.elapsed() < Duration::from_millis(900));
    server.signal("-CONT");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.execute_one(Call::Owner { key: "k".into() }).await {
            Ok(answer) => {
                assert_eq!(answer, Answer::Owner(Some("a".into())));
                break;
            }
            Err(err) => assert!(Instant::now() < deadline, "no recovery: {err}"),
        }
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_connection_error_not_a_lost_lease() {
    let store = RedisStore::new(RedisOptions {
        connection: ConnectionOptions {
            url: "redis+unix:///nonexistent/mastra-lease.sock".into(),
            ..ConnectionOptions::default()
        },
        ..RedisOptions::default()
    })
    .unwrap();
    let err = store
        .execute_one(acquire("k", "a", 1000))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_CONNECTION");
}

#[tokio::test]
async fn the_same_transfer_run_twice_answers_true_twice_and_another_finding_the_new_owner_false() {
    let server = Server::start("lease-transfer-again");
    let script = crate::core::scripts::TRANSFER.source;
    let (token, counter) = companions("k");
    let run = |id: &str| {
        let keys = ["t:lease:k", token.as_str(), counter.as_str()];
        let args = [
            "EVAL", script, "3", keys[0], keys[1], keys[2], "a", "b", "5000", id,
        ];
        (server.cli(&args), server.cli(&["GET", "t:lease:k"]))
    };
    server.cli(&["SET", "t:lease:k", "a", "PX", "60000"]);
    // Only fromOwner may hand the lease over.
    assert_eq!(run("t1"), ("1".into(), "b".into()));
    // The same transfer again (its reply lost, or re-sent by a cluster client): still 1.
    assert_eq!(run("t1"), ("1".into(), "b".into()));
    // Another transfer from a, finding b already holding the lease: a no longer held it.
    assert_eq!(run("t2"), ("0".into(), "b".into()));
    // A third owner holding the lease is never taken over.
    server.cli(&["SET", "t:lease:k", "c", "PX", "60000"]);
    assert_eq!(run("t1"), ("0".into(), "c".into()));
}

#[tokio::test]
async fn every_claim_and_transfer_takes_a_greater_token_and_a_refresh_or_renew_keeps_it() {
    let server = Server::start("lease-tokens");
    let store = store(&server, Duration::from_secs(2));
    let run = |call: Call| store.execute_one(call);
    let first = token_of(run(acquire("k", "a", 60_000)).await.unwrap());
    // A refresh by the holder and a renew keep the lease's token.
    assert_eq!(
        token_of(run(acquire("k", "a", 60_000)).await.unwrap()),
        first
    );
    let renew = Call::Renew {
        key: "k".into(),
        owner: "a".into(),
        ttl_ms: 60_000,
    };
    assert_eq!(run(renew).await.unwrap(), Answer::Renewed(true));
    let read = run(lease("k")).await.unwrap();
    assert!(
        matches!(&read, Answer::Lease(Some(Lease { owner, token: Some(t), ttl_ms: Some(ttl) }))
        if owner == "a" && *t == first && *ttl > 59_000 && *ttl <= 60_000),
        "{read:?}"
    );
    // A transfer hands the new holder a greater token.
    let transfer = Call::Transfer {
        key: "k".into(),
        from: "a".into(),
        to: "b".into(),
        ttl_ms: 60_000,
    };
    assert_eq!(run(transfer).await.unwrap(), Answer::Transferred(true));
    let Answer::Lease(Some(moved)) = run(lease("k")).await.unwrap() else {
        panic!("no lease")
    };
    assert!(moved.token.unwrap() > first);
    // After a release, and after an expiry, the next claim's token is greater still.
    let release = Call::Release {
        key: "k".into(),
        owner: "b".into(),
    };
    assert_eq!(run(release).await.unwrap(), Answer::Released(true));
    assert_eq!(run(lease("k")).await.unwrap(), Answer::Lease(None));
    let after_release = token_of(run(acquire("k", "c", 50)).await.unwrap());
    assert!(after_release > moved.token.unwrap());
    tokio::time::sleep(Duration::from_millis(80)).await;
    let after_expiry = token_of(run(acquire("k", "d", 60_000)).await.unwrap());
    assert!(after_expiry > after_release);
    // A key in another slot counts on its own counter, so tokens are per key, not global.
    let (_, counter) = companions("k");
    assert_eq!(server.cli(&["GET", &counter]), after_expiry.to_string());
}

#[tokio::test]
async fn a_lease_another_client_wrote_gets_a_token_when_its_holder_acquires_it_again() {
    let server = Server::start("lease-foreign");
    let store = store(&server, Duration::from_secs(2));
    // Mastra's own backend writes the lease key alone.
    server.cli(&["SET", "t:lease:k", "a", "PX", "60000"]);
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(
        matches!(&read, Answer::Lease(Some(Lease { token: None, .. }))),
        "{read:?}"
    );
    let token = token_of(store.execute_one(acquire("k", "a", 60_000)).await.unwrap());
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(matches!(&read, Answer::Lease(Some(Lease { token: Some(t), .. })) if *t == token));
}

#[tokio::test]
async fn a_lease_another_client_wrote_without_an_expiry_reads_with_no_ttl() {
    let server = Server::start("lease-no-expiry");
    let store = store(&server, Duration::from_secs(2));
    server.cli(&["SET", "t:lease:k", "a"]);
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(
        matches!(&read, Answer::Lease(Some(Lease { owner, ttl_ms: None, .. })) if owner == "a"),
        "{read:?}"
    );
}

#[tokio::test]
async fn leases_that_came_and_went_leave_only_one_counter_per_slot_behind() {
    let server = Server::start("lease-keyspace");
    let store = store(&server, Duration::from_secs(5));
    let calls: Vec<Call> = (0..3_000)
        .map(|n| acquire(&format!("k{n}"), "a", 100))
        .collect();
    for answer in store.execute(calls).await {
        token_of(answer.unwrap());
    }
    let slots: std::collections::HashSet<u16> = (0..3_000)
        .map(|n| crate::core::lease::keys::slot(format!("t:lease:k{n}").as_bytes()))
        .collect();
    // Expired keys linger until Redis' expiry cycle samples them: within seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left: usize = server.cli(&["DBSIZE"]).parse().unwrap();
        if left == slots.len() || Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        left,
        slots.len(),
        "one counter per slot used, no lease or token key"
    );
    assert!(left <= usize::from(crate::core::lease::keys::SLOTS));
}

fn untokened(server: &Server) -> RedisStore {
    let mut store = store(server, Duration::from_secs(2));
    store.set_grants(super::Grants {
        fencing_tokens: false,
        replication: None,
    });
    store
}

#[tokio::test]
async fn without_tokens_a_server_that_refuses_set_nx_get_turns_acquires_into_the_script_for_good() {
    let server = Server::start("lease-plain-fallback");
    let store = untokened(&server);
    assert_eq!(
        store.execute_one(acquire("k", "a", 10_000)).await.unwrap(),
        grant(true, "a", None)
    );
    assert_eq!(server.calls("evalsha"), 0, "a claim is one plain SET");
    // What a server before Redis 7.0 answers to SET with both NX and GET.
    let refused = redis::parse_redis_value(b"-ERR syntax error\r\n").unwrap();
    assert!(store.acquire_again(&acquire("j", "b", 10_000), &refused));
    assert_eq!(
        store.execute_one(acquire("j", "b", 10_000)).await.unwrap(),
        grant(true, "b", None)
    );
    assert_eq!(
        store.execute_one(acquire("j", "c", 10_000)).await.unwrap(),
        grant(false, "b", None)
    );
    // Every acquire now goes as the script (the first met NOSCRIPT and went again).
    assert_eq!(server.calls("evalsha"), 3);
    assert_eq!(server.calls("set"), 1 + 2);
    // Any other error is the call's own, and changes nothing.
    let wrong_type = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n").unwrap();
    assert!(!untokened(&server).acquire_again(&acquire("j", "b", 10_000), &wrong_type));
}

/// A watcher that counts its wake-ups and lets a test wait for the next one.
fn counting() -> (
    crate::core::connection::Wake,
    tokio::sync::watch::Receiver<u32>,
) {
    let (tell, heard) = tokio::sync::watch::channel(0u32);
    let wake = std::sync::Arc::new(move || tell.send_modify(|n| *n += 1));
    (wake, heard)
}

/// Waits up to a second for the count to reach `n`.
async fn woken(heard: &mut tokio::sync::watch::Receiver<u32>, n: u32) -> bool {
    let reached = heard.wait_for(|count| *count >= n);
    tokio::time::timeout(Duration::from_secs(1), reached)
        .await
        .is_ok()
}

#[tokio::test]
async fn a_watcher_is_woken_by_a_release_and_a_transfer_and_not_by_acquires_or_renewals() {
    let server = Server::start("lease-watch");
    let store = store(&server, Duration::from_secs(2));
    let (wake, mut heard) = counting();
    let id = store.watch("k", wake).await.unwrap();
    store.execute_one(acquire("k", "a", 10_000)).await.unwrap();
    store.execute_one(acquire("k", "b", 10_000)).await.unwrap();
    let renew = Call::Renew {
        key: "k".into(),
        owner: "a".into(),
        ttl_ms: 10_000,
    };
    store.execute_one(renew).await.unwrap();
    let transfer = Call::Transfer {
        key: "k".into(),
        from: "a".into(),
        to: "b".into(),
        ttl_ms: 10_000,
    };
    store.execute_one(transfer).await.unwrap();
    assert!(woken(&mut heard, 1).await, "the transfer woke the watcher");
    assert_eq!(*heard.borrow(), 1, "acquires and a renewal publish nothing");
    let not_held = Call::Release {
        key: "k".into(),
        owner: "a".into(),
    };
    store.execute_one(not_held).await.unwrap();
    let release = Call::Release {
        key: "k".into(),
        owner: "b".into(),
    };
    store.execute_one(release).await.unwrap();
    assert!(woken(&mut heard, 2).await, "the release woke the watcher");
    assert_eq!(
        *heard.borrow(),
        2,
        "a release by a non-holder publishes nothing"
    );
    let names = server.cli(&["CLIENT", "LIST"]);
    assert_eq!(
        names.matches("name=mastra-lease ").count(),
        2,
        "the listening connection is named as the calls' one is: {names}"
    );
    store.unwatch("k", id);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        server.cli(&["PUBSUB", "SHARDNUMSUB", "t:lease:k"]),
        "t:lease:k\n0"
    );
}

#[tokio::test]
async fn a_watcher_is_woken_when_the_listening_connection_is_lost_and_again_once_back() {
    let mut server = Server::start("lease-watch-restart");
    let store = store(&server, Duration::from_secs(2));
    let (wake, mut heard) = counting();
    store.watch("k", wake).await.unwrap();
    server.restart();
    assert!(
        woken(&mut heard, 1).await,
        "woken when the connection was lost"
    );
    let resubscribed = async {
        while server.cli(&["PUBSUB", "SHARDNUMSUB", "t:lease:k"]) != "t:lease:k\n1" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), resubscribed)
        .await
        .expect("subscribed again on a fresh connection");
    assert!(
        woken(&mut heard, 2).await,
        "woken again once listening again"
    );
    store.execute_one(acquire("k", "a", 10_000)).await.unwrap();
    let before = *heard.borrow();
    let release = Call::Release {
        key: "k".into(),
        owner: "a".into(),
    };
    store.execute_one(release).await.unwrap();
    assert!(
        woken(&mut heard, before + 1).await,
        "a release is heard on the fresh connection"
    );
}

#[tokio::test]
async fn watching_a_bad_key_is_refused_before_any_io_and_a_closed_connection_refuses_too() {
    let server = Server::start("lease-watch-bad");
    let store = store(&server, Duration::from_secs(2));
    let (wake, _heard) = counting();
    let err = store.watch("", wake.clone()).await.unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_INVALID_KEY");
    assert_eq!(server.cli(&["PUBSUB", "SHARDCHANNELS"]), "");
    store.connection().close();
    let err = store.watch("k", wake).await.unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_CLOSED");
}
