//! The Redis store against a real `redis-server` each test starts on its own unix socket.

use std::time::{Duration, Instant};

use super::{RedisOptions, RedisStore};
use crate::core::connection::ConnectionOptions;
use crate::core::lease::Grant;
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

fn grant(acquired: bool, owner: &str) -> Answer {
    Answer::Grant(Grant {
        acquired,
        owner: Some(owner.into()),
    })
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
    assert_eq!(answers[0].as_ref().unwrap(), &grant(true, "a"));
    assert_eq!(answers[1].as_ref().unwrap(), &grant(false, "a"));
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
        "1",
        "only the good acquire wrote a key"
    );
}

#[tokio::test]
async fn script_flush_is_invisible_to_callers() {
    let server = Server::start("lease-noscript");
    let store = store(&server, Duration::from_secs(2));
    assert_eq!(
        store.execute_one(acquire("k", "a", 10_000)).await.unwrap(),
        grant(true, "a")
    );
    server.cli(&["SCRIPT", "FLUSH"]);
    let renew = Call::Renew {
        key: "k".into(),
        owner: "a".into(),
        ttl_ms: 10_000,
    };
    let answers = store.execute(vec![renew, acquire("j", "b", 500)]).await;
    assert_eq!(answers[0].as_ref().unwrap(), &Answer::Renewed(true));
    assert_eq!(answers[1].as_ref().unwrap(), &grant(true, "b"));
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
async fn a_transfer_sent_again_answers_true_only_when_the_lease_is_already_with_its_new_owner() {
    let server = Server::start("lease-transfer-again");
    let store = store(&server, Duration::from_secs(2));
    let script = crate::core::scripts::TRANSFER.source;
    let run = |holder: &str, again: bool| {
        server.cli(&["SET", "t:lease:k", holder, "PX", "60000"]);
        let mut args = vec!["EVAL", script, "1", "t:lease:k", "a", "b", "5000"];
        if again {
            args.push("1");
        }
        (server.cli(&args), server.cli(&["GET", "t:lease:k"]))
    };
    // A first send: only fromOwner may hand the lease over.
    assert_eq!(run("a", false), ("1".into(), "b".into()));
    assert_eq!(run("b", false), ("0".into(), "b".into()));
    assert_eq!(run("c", false), ("0".into(), "c".into()));
    // A second send also succeeds when the first went through; a third owner still wins.
    assert_eq!(run("a", true), ("1".into(), "b".into()));
    assert_eq!(run("b", true), ("1".into(), "b".into()));
    assert_eq!(run("c", true), ("0".into(), "c".into()));
    // Through the store, a first send never takes that shortcut.
    server.cli(&["SET", "t:lease:k", "b", "PX", "60000"]);
    let answers = store
        .execute(vec![Call::Transfer {
            key: "k".into(),
            from: "a".into(),
            to: "b".into(),
            ttl_ms: 5000,
        }])
        .await;
    assert_eq!(answers[0].as_ref().unwrap(), &Answer::Transferred(false));
}
