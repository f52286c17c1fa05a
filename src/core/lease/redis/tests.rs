//! The Redis store against a real `redis-server` each test starts on its own unix socket.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Delivery, RedisOptions, RedisStore};
use crate::core::connection::{ConnectionOptions, Keyspace};
use crate::core::lease::keys::Layout;
use crate::core::lease::{Grant, Holder, Lease};
use crate::core::test_redis::Server;
use crate::core::{Answer, Call};

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

/// A fenced acquire (`acquireFencedLease`).
fn acquire(key: &str, owner: &str, ttl_ms: u64) -> Call {
    Call::Acquire {
        key: key.into(),
        holder: Holder::new(owner),
        ttl_ms,
        fenced: true,
    }
}

/// A plain acquire (`acquireLease`), with or without metadata.
fn plain(key: &str, holder: Holder, ttl_ms: u64) -> Call {
    Call::Acquire {
        key: key.into(),
        holder,
        ttl_ms,
        fenced: false,
    }
}

fn grant(acquired: bool, owner: &str, token: Option<u64>) -> Answer {
    Answer::Grant(Grant {
        acquired,
        owner: Some(owner.into()),
        token,
        fenced: true,
    })
}

fn plain_grant(acquired: bool, owner: &str) -> Answer {
    Answer::Grant(Grant {
        acquired,
        owner: Some(owner.into()),
        token: None,
        fenced: false,
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

/// A lease key's companion keys under the tests' prefix, as text for redis-cli: its
/// companion key (token, transfer id, holder, metadata), the slot's counter.
fn companions(key: &str) -> [String; 2] {
    let keys = Layout::new("t", Keyspace::Single)
        .unwrap()
        .keys_of(key.as_bytes());
    [keys.companion, keys.counter].map(|bytes| String::from_utf8(bytes).unwrap())
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
        holder: Holder::new("a"),
        ttl_ms: 10_000,
    };
    let answers = store.execute(vec![renew, acquire("j", "b", 500)]).await;
    assert_eq!(answers[0].as_ref().unwrap(), &Answer::Renewed(true));
    assert!(matches!(
        answers[1].as_ref().unwrap(),
        Answer::Grant(Grant { acquired: true, owner: Some(o), token: Some(_), .. }) if o == "b"
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
async fn the_same_transfer_run_twice_answers_true_twice_by_its_id_and_one_sent_again_knowingly_moves_a_lease_still_with_its_old_holder_or_says_it_cannot_know(
) {
    // (A cluster's send made again knowingly carries both: "again:<id>", below.)
    let server = Server::start("lease-transfer-again");
    let script = crate::core::scripts::TRANSFER.source;
    let [token, counter] = companions("k");
    let run = |how: &[&str]| {
        let keys = ["t:lease:k", &token, &counter];
        let mut args = vec!["EVAL", script, "3", keys[0], keys[1], keys[2]];
        args.extend(["a", "b", "5000"]);
        args.extend(how);
        (server.cli(&args), server.cli(&["GET", "t:lease:k"]))
    };
    let holding = |owner: &str| server.cli(&["SET", "t:lease:k", owner, "PX", "60000"]);
    // By the id kept (2 s, as on a cluster): the same transfer again (its reply lost with a
    // connection) still answers 1; another from a, finding b holding the lease, 0; a third
    // owner holding it is never taken over.
    let kept = |id| vec![id, "2000"];
    holding("a");
    assert_eq!(run(&kept("t1")), ("1".into(), "b".into()));
    assert_eq!(run(&kept("t1")), ("1".into(), "b".into()));
    assert_eq!(run(&kept("t2")), ("0".into(), "b".into()));
    holding("c");
    assert_eq!(run(&kept("t1")), ("0".into(), "c".into()));
    server.cli(&["DEL", "t:lease:k", &token]);
    // Told it is sent again (as on one server, where no id is kept): a lease still with a
    // moves (the first send never ran); one with b or anyone else cannot say whether the
    // first send moved it, and answers -1, where a first send answers 0.
    holding("a");
    assert_eq!(run(&["again"]), ("1".into(), "b".into()));
    assert_eq!(run(&["again"]), ("-1".into(), "b".into()));
    assert_eq!(run(&[]), ("0".into(), "b".into()));
    holding("c");
    assert_eq!(run(&["again"]), ("-1".into(), "c".into()));
    server.cli(&["DEL", "t:lease:k"]);
    assert_eq!(run(&["again"]), ("-1".into(), "".into()));
    // Both (a cluster's send made again knowingly, whose first send went without the id on a
    // link that sends nothing again, or with it): a lease still with a moves, keeping the id,
    // so the same send run again unseen answers 1; one its first send moved without the id
    // cannot say, and answers -1; one its first send moved with the id answers 1.
    holding("a");
    assert_eq!(run(&kept("again:t3")), ("1".into(), "b".into()));
    assert_eq!(run(&kept("again:t3")), ("1".into(), "b".into()));
    assert_eq!(run(&kept("again:t4")), ("-1".into(), "b".into()));
    server.cli(&["DEL", "t:lease:k", &token]);
    holding("a");
    assert_eq!(run(&kept("t5")), ("1".into(), "b".into()));
    assert_eq!(run(&kept("again:t5")), ("1".into(), "b".into()));
}

#[tokio::test]
async fn a_transfer_carries_its_id_only_where_it_may_reach_redis_twice_unseen_and_on_a_send_made_again(
) {
    let server = Server::start("lease-transfer-forms");
    let store = store(&server, Duration::from_secs(2));
    let transfer = || Call::Transfer {
        key: "k".into(),
        from: Holder::new("a"),
        to: Holder::new("b"),
        ttl_ms: 60_000,
    };
    // ARGV[4] of the transfer script as `delivery` sends it (EVALSHA, its SHA, the key
    // count, 3 keys, from, to, ttl come first), and ARGV[5].
    let argv4 = |sent: &super::Sent, delivery| {
        let mut pipe = redis::pipe();
        store.encode(sent, super::How::Script, delivery, &mut pipe);
        let cmd = pipe.cmd_iter().next().expect("one command");
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect();
        (args.get(9).cloned(), args.get(10).cloned())
    };
    let (once, repeatable) = (Delivery::AtMostOnce, Delivery::AtLeastOnce);
    // On a cluster: its id only where it may run twice unseen; on a send made again in
    // either form, with the id, so an unseen second run of it answers as the first.
    let clusters = super::Sent::new(transfer(), true);
    let id = clusters.id.clone();
    assert!(!id.is_empty() && !id.contains(':'), "{id}");
    assert_eq!(argv4(&clusters, once), (None, None));
    assert_eq!(
        argv4(&clusters, repeatable),
        (Some(id.clone()), Some("2000".into()))
    );
    clusters.again.store(true, Ordering::Relaxed);
    let both = (Some(format!("again:{id}")), Some("2000".into()));
    assert_eq!(argv4(&clusters, once), both);
    assert_eq!(argv4(&clusters, repeatable), both);
    // On one server, no id in either form: "again" on a send made again.
    let ones = super::Sent::new(transfer(), false);
    assert_eq!(argv4(&ones, repeatable), (None, None));
    ones.again.store(true, Ordering::Relaxed);
    assert_eq!(argv4(&ones, once), (Some("again".into()), None));
}

#[tokio::test]
async fn a_plain_lease_handed_over_on_one_server_is_its_key_alone_and_a_fenced_one_keeps_its_token()
{
    let server = Server::start("lease-transfer-id-life");
    let store = store(&server, Duration::from_millis(1500));
    let run = |call: Call| store.execute_one(call);
    let [token_key, _] = companions("k");
    let pttl = |key: &str| server.cli(&["PTTL", key]).parse::<i64>().unwrap();
    let transfer = |key: &str, from: &str, to: &str| Call::Transfer {
        key: key.into(),
        from: Holder::new(from),
        to: Holder::new(to),
        ttl_ms: 60_000,
    };
    let renew = |owner: &str| Call::Renew {
        key: "k".into(),
        holder: Holder::new(owner),
        ttl_ms: 60_000,
    };
    // A plain lease handed over: only this client sends a transfer again here, and says so,
    // so no id is kept; the lease is one key, as Mastra's own backend writes it.
    assert_eq!(
        run(plain("k", Holder::new("a"), 60_000)).await.unwrap(),
        plain_grant(true, "a")
    );
    assert_eq!(
        run(transfer("k", "a", "b")).await.unwrap(),
        Answer::Transferred(true)
    );
    assert_eq!(server.cli(&["EXISTS", &token_key]), "0");
    assert_eq!(run(renew("b")).await.unwrap(), Answer::Renewed(true));
    assert!(pttl("t:lease:k") > 59_000);
    // A fenced lease's token key lives as long as the lease, through transfers and renewals.
    let Answer::Grant(Grant { token: Some(_), .. }) = run(acquire("f", "a", 60_000)).await.unwrap()
    else {
        panic!("no token")
    };
    let [fence_key, _] = companions("f");
    assert_eq!(
        run(transfer("f", "a", "b")).await.unwrap(),
        Answer::Transferred(true)
    );
    assert!(pttl(&fence_key) > 59_000, "{}", pttl(&fence_key));
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
        holder: Holder::new("a"),
        ttl_ms: 60_000,
    };
    assert_eq!(run(renew).await.unwrap(), Answer::Renewed(true));
    let read = run(lease("k")).await.unwrap();
    assert!(
        matches!(&read, Answer::Lease(Some(Lease { owner, token: Some(t), ttl_ms: Some(ttl), .. }))
        if owner == "a" && *t == first && *ttl > 59_000 && *ttl <= 60_000),
        "{read:?}"
    );
    // A transfer hands the new holder a greater token.
    let transfer = Call::Transfer {
        key: "k".into(),
        from: Holder::new("a"),
        to: Holder::new("b"),
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
        holder: Holder::new("b"),
    };
    assert_eq!(run(release).await.unwrap(), Answer::Released(true));
    assert_eq!(run(lease("k")).await.unwrap(), Answer::Lease(None));
    let after_release = token_of(run(acquire("k", "c", 50)).await.unwrap());
    assert!(after_release > moved.token.unwrap());
    tokio::time::sleep(Duration::from_millis(80)).await;
    let after_expiry = token_of(run(acquire("k", "d", 60_000)).await.unwrap());
    assert!(after_expiry > after_release);
    // A key in another slot counts on its own counter, so tokens are per key, not global.
    let [_, counter] = companions("k");
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
        .map(|n| crate::core::connection::slot(format!("t:lease:k{n}").as_bytes()))
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
    assert!(left <= usize::from(crate::core::connection::SLOTS));
}

/// A store whose grants wait for one replica's confirmation, `replica_timeout` at most.
fn confirming(server: &Server, replica_timeout: Duration) -> RedisStore {
    let mut store = store(server, Duration::from_secs(3));
    store.set_replication(Some(super::Replication {
        replicas: 1,
        timeout: replica_timeout,
    }));
    store
}

#[tokio::test]
async fn a_grant_its_replica_confirms_only_after_its_ttl_ran_out_is_not_answered_as_held() {
    let (master, replica) = Server::start_with_replica("lease-late-confirmation");
    let a = confirming(&master, Duration::from_secs(2));
    let b = confirming(&master, Duration::from_secs(2));
    // Connected, the scripts loaded, before the replica stops answering.
    a.execute_one(lease("k")).await.unwrap();
    b.execute_one(lease("k")).await.unwrap();
    replica.signal("-STOP");
    let first = async {
        let started = Instant::now();
        let answer = a.execute_one(acquire("k", "a", 200)).await;
        (answer, started.elapsed())
    };
    // Once a's lease expired on the master, b claims the key; its grant waits for the same
    // replica, and both confirmations arrive together when it answers again.
    let second = async {
        tokio::time::sleep(Duration::from_millis(350)).await;
        b.execute_one(acquire("k", "b", 10_000)).await
    };
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        replica.signal("-CONT");
    };
    let ((first, took), second, ()) = tokio::join!(first, second, thaw);
    assert_eq!(token_of(second.unwrap()), 2, "b holds the key now");
    // Answered as granted, a would believe it holds the key b holds (with an older token).
    let err = first.unwrap_err();
    assert_eq!(err.code(), "ERR_LEASE_REPLICATION", "{err}");
    // When its TTL runs out, well before the replica thaws (with room for a busy machine).
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(500),
        "a's grant rejects when its TTL runs out, not at the confirmation: {took:?}"
    );
}

#[tokio::test]
async fn in_one_pipeline_a_grant_with_a_short_ttl_rejects_when_it_ends_and_a_longer_one_waits_on() {
    let (master, replica) = Server::start_with_replica("lease-late-confirmation-batch");
    let store = confirming(&master, Duration::from_secs(2));
    store.execute_one(lease("short")).await.unwrap();
    replica.signal("-STOP");
    let started = Instant::now();
    let answers = std::sync::Mutex::new(Vec::new());
    let record = |answered: Vec<(usize, crate::core::Result<Answer>)>| {
        let at = started.elapsed();
        let mut answers = answers.lock().unwrap();
        answers.extend(answered.into_iter().map(|(i, answer)| (i, answer, at)));
    };
    let batch = store.execute_each(
        vec![acquire("short", "a", 200), acquire("long", "a", 10_000)],
        &record,
    );
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        replica.signal("-CONT");
    };
    tokio::join!(batch, thaw);
    let mut answers = answers.into_inner().unwrap();
    answers.sort_by_key(|(i, _, _)| *i);
    let [(_, short, short_at), (_, long, long_at)] = &answers[..] else {
        panic!("two answers expected: {answers:?}");
    };
    assert_eq!(short.as_ref().unwrap_err().code(), "ERR_LEASE_REPLICATION");
    assert!(
        *short_at >= Duration::from_millis(200) && *short_at < Duration::from_millis(500),
        "the short lease's grant rejects when its TTL runs out: {short_at:?}"
    );
    assert_eq!(long.as_ref().unwrap(), &grant(true, "a", Some(1)));
    assert!(
        *long_at >= Duration::from_millis(600),
        "the long lease's grant waits for the replica: {long_at:?}"
    );
}

#[tokio::test]
async fn a_server_that_refuses_set_nx_get_turns_plain_acquires_into_the_script_for_good() {
    let server = Server::start("lease-plain-fallback");
    let store = store(&server, Duration::from_secs(2));
    let a = |key: &str, owner: &str| plain(key, Holder::new(owner), 10_000);
    assert_eq!(
        store.execute_one(a("k", "a")).await.unwrap(),
        plain_grant(true, "a")
    );
    assert_eq!(server.calls("evalsha"), 0, "a claim is one plain SET");
    // What a server before Redis 7.0 answers to SET with both NX and GET.
    let refused = redis::parse_redis_value(b"-ERR syntax error\r\n").unwrap();
    assert!(store.acquire_again(&a("j", "b"), &refused));
    assert_eq!(
        store.execute_one(a("j", "b")).await.unwrap(),
        plain_grant(true, "b")
    );
    assert_eq!(
        store.execute_one(a("j", "c")).await.unwrap(),
        plain_grant(false, "b")
    );
    // Every acquire now goes as the script (the first met NOSCRIPT and went again).
    assert_eq!(server.calls("evalsha"), 3);
    assert_eq!(server.calls("set"), 1 + 2);
    // Any other error is the call's own, and changes nothing.
    let wrong_type = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n").unwrap();
    let fresh = store_with_prefix(&server, "u");
    assert!(!fresh.acquire_again(&a("j", "b"), &wrong_type));
}

#[tokio::test]
async fn under_maxmemory_a_plain_refresh_or_refusal_goes_as_the_script_and_tells_the_truth() {
    let server = Server::start("lease-plain-oom");
    let store = store(&server, Duration::from_secs(2));
    let a = |key: &str, owner: &str| plain(key, Holder::new(owner), 10_000);
    assert_eq!(
        store.execute_one(a("k", "a")).await.unwrap(),
        plain_grant(true, "a")
    );
    server.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    // Redis refuses any SET when out of memory, before it looks at the key.
    let oom =
        redis::parse_redis_value(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n")
            .unwrap();
    assert!(store.acquire_again(&a("k", "b"), &oom));
    let refresh = store.execute_one(a("k", "a")).await;
    let refusal = store.execute_one(a("k", "b")).await;
    let claim = store.execute_one(a("fresh", "c")).await;
    server.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(refresh.unwrap(), plain_grant(true, "a"));
    assert_eq!(refusal.unwrap(), plain_grant(false, "a"));
    // A claim needs memory: the script cannot write it either, and says so.
    assert_eq!(claim.unwrap_err().code(), "ERR_LEASE_REDIS");
    // Memory is back: plain acquires were not given up for good.
    let before = server.calls("evalsha");
    assert_eq!(
        store.execute_one(a("fresh", "c")).await.unwrap(),
        plain_grant(true, "c")
    );
    assert_eq!(
        server.calls("evalsha"),
        before,
        "a claim is one plain SET again"
    );
}

fn store_with_prefix(server: &Server, prefix: &str) -> RedisStore {
    RedisStore::new(RedisOptions {
        connection: ConnectionOptions {
            url: server.url(),
            ..ConnectionOptions::default()
        },
        key_prefix: prefix.into(),
        ..RedisOptions::default()
    })
    .unwrap()
}

#[tokio::test]
async fn a_plain_acquire_is_one_set_and_a_fenced_one_on_the_same_lease_still_gets_a_greater_token()
{
    let server = Server::start("lease-plain-then-fenced");
    let store = store(&server, Duration::from_secs(2));
    let first = token_of(store.execute_one(acquire("k", "a", 60_000)).await.unwrap());
    let release = Call::Release {
        key: "k".into(),
        holder: Holder::new("a"),
    };
    store.execute_one(release.clone()).await.unwrap();
    // Claims and refusals without a token: one SET each, no script, no token key.
    let claimed = store
        .execute_one(plain("k", Holder::new("b"), 60_000))
        .await;
    assert_eq!(claimed.unwrap(), plain_grant(true, "b"));
    let refused = store
        .execute_one(plain("k", Holder::new("c"), 60_000))
        .await;
    assert_eq!(refused.unwrap(), plain_grant(false, "b"));
    let [token_key, _] = companions("k");
    assert_eq!(server.cli(&["EXISTS", &token_key]), "0");
    // The holder's fenced refresh takes a token greater than every earlier one; a plain
    // refresh keeps it and does not tell it.
    let fenced = token_of(store.execute_one(acquire("k", "b", 60_000)).await.unwrap());
    assert!(fenced > first);
    let refreshed = store
        .execute_one(plain("k", Holder::new("b"), 60_000))
        .await;
    assert_eq!(refreshed.unwrap(), plain_grant(true, "b"));
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(matches!(read, Answer::Lease(Some(Lease { token: Some(t), .. })) if t == fenced));
    // A transfer of a fenced lease hands the new holder a greater token; of a plain one, none.
    let moved = Call::Transfer {
        key: "k".into(),
        from: Holder::new("b"),
        to: Holder::new("d"),
        ttl_ms: 60_000,
    };
    assert_eq!(
        store.execute_one(moved).await.unwrap(),
        Answer::Transferred(true)
    );
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(matches!(read, Answer::Lease(Some(Lease { token: Some(t), .. })) if t > fenced));
}

#[tokio::test]
async fn the_holder_is_the_owner_with_its_metadata_in_its_companion_key() {
    let server = Server::start("lease-metadata");
    let [companion, _] = companions("k");
    let store = store(&server, Duration::from_secs(2));
    let run = |n: &str| Holder::with("o", n);
    let claim = |holder| plain("k", holder, 60_000);
    assert_eq!(
        store.execute_one(claim(run("1"))).await.unwrap(),
        plain_grant(true, "o")
    );
    // Mastra's layout for the owner, plain; the metadata in the companion key, after the
    // holder it belongs to, with the same expiry.
    assert_eq!(server.cli(&["GET", "t:lease:k"]), "o");
    assert_eq!(server.cli(&["GET", &companion]), "::1:o1");
    let ttl: u64 = server.cli(&["PTTL", &companion]).parse().unwrap();
    assert!(ttl > 59_000);
    // The same owner id for another run, or with none, is another holder.
    let other = store.execute_one(claim(run("2"))).await.unwrap();
    assert_eq!(other, plain_grant(false, "o"));
    let none = store.execute_one(claim(Holder::new("o"))).await.unwrap();
    assert_eq!(none, plain_grant(false, "o"));
    let renew = |holder| Call::Renew {
        key: "k".into(),
        holder,
        ttl_ms: 60_000,
    };
    let release = |holder| Call::Release {
        key: "k".into(),
        holder,
    };
    let answers = store
        .execute(vec![
            renew(run("2")),
            release(run("2")),
            release(Holder::new("o")),
            renew(run("1")),
            Call::Record { key: "k".into() },
        ])
        .await;
    let answers: Vec<Answer> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        answers,
        [
            Answer::Renewed(false),
            Answer::Released(false),
            Answer::Released(false),
            Answer::Renewed(true),
            Answer::Record(Some(run("1"))),
        ]
    );
    // A transfer stores the new holder's metadata, or removes the old one's for none.
    let transfer = |from, to| Call::Transfer {
        key: "k".into(),
        from,
        to,
        ttl_ms: 60_000,
    };
    let moved = store
        .execute_one(transfer(run("1"), Holder::with("p", "3")))
        .await;
    assert_eq!(moved.unwrap(), Answer::Transferred(true));
    assert_eq!(server.cli(&["GET", &companion]), "::1:p3");
    let moved = store
        .execute_one(transfer(Holder::with("p", "3"), Holder::new("q")))
        .await;
    assert_eq!(moved.unwrap(), Answer::Transferred(true));
    assert_eq!(server.cli(&["EXISTS", &companion]), "0");
    assert_eq!(
        store
            .execute_one(Call::Record { key: "k".into() })
            .await
            .unwrap(),
        Answer::Record(Some(Holder::new("q")))
    );
    // A release takes every key of the lease with it.
    store.execute_one(claim(Holder::new("q"))).await.unwrap();
    assert_eq!(
        store.execute_one(release(Holder::new("q"))).await.unwrap(),
        Answer::Released(true)
    );
    assert_eq!(server.cli(&["KEYS", "t:lease*"]), "");
    assert_eq!(server.cli(&["KEYS", "t:fence*"]), "");
}

#[tokio::test]
async fn an_owner_and_metadata_of_any_bytes_read_back_whole_from_the_companion_key() {
    let server = Server::start("lease-companion-bytes");
    let store = store(&server, Duration::from_secs(2));
    // Colons, digits and NULs where the format has its fields: only the holder's length
    // tells where the owner ends and its metadata begins.
    let owner = "1:2:3:o\0:";
    let holder = |metadata: &str| Holder::with(owner, metadata);
    let record = Call::Record { key: "k".into() };
    let granted = store
        .execute_one(acquire("k", owner, 60_000))
        .await
        .unwrap();
    assert!(matches!(
        granted,
        Answer::Grant(Grant {
            acquired: true,
            token: Some(_),
            ..
        })
    ));
    // A fenced holder with no metadata: the companion key names it; with metadata, another
    // holder, refused.
    assert_eq!(
        store.execute_one(record.clone()).await.unwrap(),
        Answer::Record(Some(Holder::new(owner)))
    );
    let meta = ":4:\0x:";
    let refused = store.execute_one(plain("k", holder(meta), 60_000)).await;
    assert_eq!(refused.unwrap(), plain_grant(false, owner));
    let release = |holder| Call::Release {
        key: "k".into(),
        holder,
    };
    assert_eq!(
        store
            .execute_one(release(Holder::new(owner)))
            .await
            .unwrap(),
        Answer::Released(true)
    );
    // Metadata that starts as another's, or ends as it: a holder of its own.
    let claimed = store.execute_one(plain("k", holder(meta), 60_000)).await;
    assert_eq!(claimed.unwrap(), plain_grant(true, owner));
    for other in [":4:", "x:", &format!("{meta}x")[..], &meta[1..]] {
        let answers = store
            .execute(vec![
                plain("k", holder(other), 60_000),
                Call::Renew {
                    key: "k".into(),
                    holder: holder(other),
                    ttl_ms: 60_000,
                },
                release(holder(other)),
            ])
            .await;
        let answers: Vec<Answer> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            answers,
            [
                plain_grant(false, owner),
                Answer::Renewed(false),
                Answer::Released(false)
            ],
            "{other:?}"
        );
    }
    assert_eq!(
        store.execute_one(record.clone()).await.unwrap(),
        Answer::Record(Some(holder(meta)))
    );
    // A fenced refresh of the holder takes a token and keeps the metadata.
    let fenced = Call::Acquire {
        key: "k".into(),
        holder: holder(meta),
        ttl_ms: 60_000,
        fenced: true,
    };
    let token = token_of(store.execute_one(fenced).await.unwrap());
    assert_eq!(
        store.execute_one(record.clone()).await.unwrap(),
        Answer::Record(Some(holder(meta)))
    );
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(matches!(read, Answer::Lease(Some(Lease { token: Some(t), .. })) if t == token));
    // Moved to the same owner with other metadata: a new holder, a greater token.
    let moved = Call::Transfer {
        key: "k".into(),
        from: holder(meta),
        to: holder("\0"),
        ttl_ms: 60_000,
    };
    assert_eq!(
        store.execute_one(moved).await.unwrap(),
        Answer::Transferred(true)
    );
    assert_eq!(
        store.execute_one(record.clone()).await.unwrap(),
        Answer::Record(Some(holder("\0")))
    );
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(matches!(read, Answer::Lease(Some(Lease { token: Some(t), .. })) if t > token));
    assert_eq!(
        store.execute_one(release(holder("\0"))).await.unwrap(),
        Answer::Released(true)
    );
    let [companion, _] = companions("k");
    assert_eq!(server.cli(&["EXISTS", "t:lease:k", &companion]), "0");
}

#[tokio::test]
async fn a_companion_key_naming_another_holder_gives_the_lease_neither_token_nor_metadata() {
    let server = Server::start("lease-companion-leftover");
    let store = store(&server, Duration::from_secs(2));
    let [companion, _] = companions("k");
    // A grant with token and metadata, then another client moves the lease key alone, as
    // Mastra's own backend's transfer does.
    let first = Call::Acquire {
        key: "k".into(),
        holder: Holder::with("a", "run-1"),
        ttl_ms: 60_000,
        fenced: true,
    };
    let first = token_of(store.execute_one(first).await.unwrap());
    server.cli(&["SET", "t:lease:k", "b", "PX", "60000"]);
    assert_eq!(
        store
            .execute_one(Call::Record { key: "k".into() })
            .await
            .unwrap(),
        Answer::Record(Some(Holder::new("b")))
    );
    let read = store.execute_one(lease("k")).await.unwrap();
    assert!(matches!(
        read,
        Answer::Lease(Some(Lease { token: None, .. }))
    ));
    // b renews as the plain holder it is; its fenced refresh takes a greater token.
    let renew = Call::Renew {
        key: "k".into(),
        holder: Holder::new("b"),
        ttl_ms: 60_000,
    };
    assert_eq!(
        store.execute_one(renew).await.unwrap(),
        Answer::Renewed(true)
    );
    let b = token_of(store.execute_one(acquire("k", "b", 60_000)).await.unwrap());
    assert!(b > first);
    assert_eq!(server.cli(&["GET", &companion]), format!("{b}::1:b"));
}

#[tokio::test]
async fn an_owner_that_looks_like_json_is_an_owner_and_never_read_as_metadata() {
    let server = Server::start("lease-json-owner");
    let store = store(&server, Duration::from_secs(2));
    let owner = r#"{"owner":"o","metadata":"run-1"}"#;
    server.cli(&["SET", "t:lease:k", owner, "PX", "60000"]);
    assert_eq!(
        store
            .execute_one(Call::Record { key: "k".into() })
            .await
            .unwrap(),
        Answer::Record(Some(Holder::new(owner)))
    );
    let as_record = store
        .execute_one(plain("k", Holder::with("o", "run-1"), 60_000))
        .await;
    assert_eq!(as_record.unwrap(), plain_grant(false, owner));
    let as_owner = store
        .execute_one(plain("k", Holder::new(owner), 60_000))
        .await;
    assert_eq!(as_owner.unwrap(), plain_grant(true, owner));
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
        holder: Holder::new("a"),
        ttl_ms: 10_000,
    };
    store.execute_one(renew).await.unwrap();
    let transfer = Call::Transfer {
        key: "k".into(),
        from: Holder::new("a"),
        to: Holder::new("b"),
        ttl_ms: 10_000,
    };
    store.execute_one(transfer).await.unwrap();
    assert!(woken(&mut heard, 1).await, "the transfer woke the watcher");
    assert_eq!(*heard.borrow(), 1, "acquires and a renewal publish nothing");
    let not_held = Call::Release {
        key: "k".into(),
        holder: Holder::new("a"),
    };
    store.execute_one(not_held).await.unwrap();
    let release = Call::Release {
        key: "k".into(),
        holder: Holder::new("b"),
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
async fn a_lease_nobody_waits_for_publishes_nothing_and_a_waiters_read_marks_it_for_as_long_as_it_lives(
) {
    let server = Server::start("lease-watch-mark");
    let store = store(&server, Duration::from_secs(2));
    let (wake, mut heard) = counting();
    store.watch("k", wake).await.unwrap();
    let lifecycle = [
        plain("k", Holder::new("a"), 10_000),
        Call::Transfer {
            key: "k".into(),
            from: Holder::new("a"),
            to: Holder::new("b"),
            ttl_ms: 10_000,
        },
        Call::Release {
            key: "k".into(),
            holder: Holder::new("b"),
        },
    ];
    for call in lifecycle {
        assert!(matches!(
            store.execute_one(call).await,
            Ok(Answer::Grant(_) | Answer::Transferred(true) | Answer::Released(true))
        ));
    }
    assert!(
        !woken(&mut heard, 1).await,
        "Mastra's lifecycle, with nobody reading the lease to wait, publishes nothing"
    );
    let token_key = String::from_utf8(store.layout().keys_of(b"k").companion).unwrap();
    let token_key = token_key.as_str();
    store
        .execute_one(plain("k", Holder::new("a"), 10_000))
        .await
        .unwrap();
    // Another provider's read, listening to nothing, marks nothing.
    let other = self::store(&server, Duration::from_secs(2));
    other.execute_one(lease("k")).await.unwrap();
    assert_eq!(server.cli(&["EXISTS", token_key]), "0");
    // A waiter's read marks it with the lease's expiry: a renewal does not extend the mark.
    store.execute_one(lease("k")).await.unwrap();
    assert_eq!(server.cli(&["GET", token_key]), ":::");
    let mark = server.cli(&["PEXPIRETIME", token_key]);
    let expiry = |key: &str| server.cli(&["PEXPIRETIME", key]).parse::<i64>().unwrap();
    // To the millisecond the script's PTTL and SET PX straddle (Redis reads its clock for each).
    let apart = expiry(token_key) - expiry("t:lease:k");
    assert!(
        (-1..=1).contains(&apart),
        "the lease's expiry: {apart} ms apart"
    );
    let renew = Call::Renew {
        key: "k".into(),
        holder: Holder::new("a"),
        ttl_ms: 60_000,
    };
    assert!(matches!(
        store.execute_one(renew).await,
        Ok(Answer::Renewed(true))
    ));
    assert_eq!(
        server.cli(&["PEXPIRETIME", token_key]),
        mark,
        "not extended"
    );
    assert!(matches!(
        store.execute_one(lease("k")).await,
        Ok(Answer::Lease(Some(Lease { token: None, .. })))
    ));
    let release = Call::Release {
        key: "k".into(),
        holder: Holder::new("a"),
    };
    store.execute_one(release).await.unwrap();
    assert!(
        woken(&mut heard, 1).await,
        "the marked lease's release woke the watcher"
    );
    assert_eq!(
        server.cli(&["EXISTS", token_key]),
        "0",
        "the release took the mark"
    );
}

#[tokio::test]
async fn a_watcher_is_woken_once_listening_again_after_the_server_came_back_not_while_it_is_gone() {
    let mut server = Server::start("lease-watch-restart");
    let store = store(&server, Duration::from_secs(2));
    let (wake, mut heard) = counting();
    store.watch("k", wake).await.unwrap();
    server.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        *heard.borrow(),
        0,
        "not woken while the server is gone: a check then could only fail"
    );
    server.start_again();
    let resubscribed = async {
        while server.cli(&["PUBSUB", "SHARDNUMSUB", "t:lease:k"]) != "t:lease:k\n1" {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), resubscribed)
        .await
        .expect("subscribed again on a fresh connection");
    assert!(woken(&mut heard, 1).await, "woken once listening again");
    store.execute_one(acquire("k", "a", 10_000)).await.unwrap();
    let before = *heard.borrow();
    let release = Call::Release {
        key: "k".into(),
        holder: Holder::new("a"),
    };
    store.execute_one(release).await.unwrap();
    assert!(
        woken(&mut heard, before + 1).await,
        "a release is heard on the fresh connection"
    );
}

#[tokio::test]
async fn a_watcher_is_woken_when_a_new_watch_opened_the_fresh_connection_before_the_reconnection_did(
) {
    let mut server = Server::start("lease-watch-reopened");
    let store = store(&server, Duration::from_secs(2));
    let (wake, mut heard) = counting();
    store.watch("k", wake).await.unwrap();
    server.kill();
    // The reconnection's first try fails at once and the next comes 100 ms later, then 200 ms
    // after that: the watch below opens the fresh connection in between.
    tokio::time::sleep(Duration::from_millis(150)).await;
    server.start_again();
    let (other, _) = counting();
    store.watch("other", other).await.unwrap();
    assert!(
        woken(&mut heard, 1).await,
        "the first watcher is woken though another watch opened the connection"
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
