//! MemoryStore's unit tests (the model-based ones are in `props.rs`).

use super::*;

fn at(base: Instant, ms: u64) -> Instant {
    base + Duration::from_millis(ms)
}

fn acquire(key: &str, owner: &str, ttl_ms: u64) -> Call {
    Call::Acquire {
        key: key.into(),
        holder: Holder::new(owner),
        ttl_ms,
        fenced: true,
    }
}

fn renew(key: &str, owner: &str, ttl_ms: u64) -> Call {
    Call::Renew {
        key: key.into(),
        holder: Holder::new(owner),
        ttl_ms,
    }
}

fn owner(key: &str) -> Call {
    Call::Owner { key: key.into() }
}

fn holder(s: &MemoryStore, now: Instant, key: &str) -> Option<String> {
    match s.apply_at(now, owner(key)).unwrap() {
        Answer::Owner(owner) => owner,
        other => panic!("unexpected {other:?}"),
    }
}

fn granted(answer: Answer) -> Grant {
    match answer {
        Answer::Grant(grant) => grant,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn every_claim_and_transfer_takes_a_greater_token_and_a_refresh_or_renew_keeps_it() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    let token = |answer: Answer| granted(answer).token.unwrap();
    let first = token(s.apply_at(t0, acquire("k", "a", 100)).unwrap());
    assert_eq!(
        token(s.apply_at(t0, acquire("k", "a", 100)).unwrap()),
        first
    );
    s.apply_at(t0, renew("k", "a", 100)).unwrap();
    let moved = Call::Transfer {
        key: "k".into(),
        from: Holder::new("a"),
        to: Holder::new("b"),
        ttl_ms: 100,
    };
    assert_eq!(s.apply_at(t0, moved).unwrap(), Answer::Transferred(true));
    let Answer::Lease(Some(lease)) = s
        .apply_at(at(t0, 40), Call::Lease { key: "k".into() })
        .unwrap()
    else {
        panic!("no lease")
    };
    assert_eq!((lease.owner.as_str(), lease.ttl_ms), ("b", Some(60)));
    assert!(lease.token.unwrap() > first);
    let after_expiry = token(s.apply_at(at(t0, 100), acquire("k", "c", 100)).unwrap());
    assert!(after_expiry > lease.token.unwrap());
}

#[test]
fn an_unfenced_grant_takes_no_token_and_a_fenced_one_on_the_same_lease_takes_one_it_keeps() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    let plain = |owner: &str| Call::Acquire {
        key: "k".into(),
        holder: Holder::new(owner),
        ttl_ms: 100,
        fenced: false,
    };
    assert_eq!(granted(s.apply_at(t0, plain("a")).unwrap()).token, None);
    let fenced = granted(s.apply_at(t0, acquire("k", "a", 100)).unwrap()).token;
    assert!(fenced.is_some());
    // A plain refresh keeps the token (and does not tell it); the fenced one still finds it.
    assert_eq!(granted(s.apply_at(t0, plain("a")).unwrap()).token, None);
    let again = granted(s.apply_at(t0, acquire("k", "a", 100)).unwrap()).token;
    assert_eq!(again, fenced);
}

#[test]
fn the_holder_is_the_owner_and_its_metadata_together() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    let run = |n: &str| Holder::with("o", n);
    let claim = |holder: Holder| Call::Acquire {
        key: "k".into(),
        holder,
        ttl_ms: 100,
        fenced: false,
    };
    assert!(granted(s.apply_at(t0, claim(run("1"))).unwrap()).acquired);
    let other_run = granted(s.apply_at(t0, claim(run("2"))).unwrap());
    assert_eq!(
        (other_run.acquired, other_run.owner.as_deref()),
        (false, Some("o"))
    );
    let no_metadata = granted(s.apply_at(t0, claim(Holder::new("o"))).unwrap());
    assert!(!no_metadata.acquired);
    let renew = |holder| Call::Renew {
        key: "k".into(),
        holder,
        ttl_ms: 100,
    };
    assert_eq!(
        s.apply_at(t0, renew(run("2"))).unwrap(),
        Answer::Renewed(false)
    );
    assert_eq!(
        s.apply_at(t0, renew(run("1"))).unwrap(),
        Answer::Renewed(true)
    );
    let release = |holder| Call::Release {
        key: "k".into(),
        holder,
    };
    assert_eq!(
        s.apply_at(t0, release(run("2"))).unwrap(),
        Answer::Released(false)
    );
    let moved = Call::Transfer {
        key: "k".into(),
        from: run("1"),
        to: Holder::with("p", "3"),
        ttl_ms: 100,
    };
    assert_eq!(s.apply_at(t0, moved).unwrap(), Answer::Transferred(true));
    let record = s.apply_at(t0, Call::Record { key: "k".into() }).unwrap();
    assert_eq!(record, Answer::Record(Some(Holder::with("p", "3"))));
    assert_eq!(
        s.apply_at(t0, release(Holder::new("p"))).unwrap(),
        Answer::Released(false)
    );
    assert_eq!(
        s.apply_at(t0, release(Holder::with("p", "3"))).unwrap(),
        Answer::Released(true)
    );
}

#[test]
fn a_lease_is_free_again_exactly_when_its_ttl_runs_out() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    assert!(granted(s.apply_at(t0, acquire("k", "a", 100)).unwrap()).acquired);
    let lost = granted(s.apply_at(at(t0, 99), acquire("k", "b", 100)).unwrap());
    assert_eq!((lost.acquired, lost.owner.as_deref()), (false, Some("a")));
    assert!(granted(s.apply_at(at(t0, 100), acquire("k", "b", 100)).unwrap()).acquired);
}

#[test]
fn renew_after_expiry_returns_false_and_does_not_resurrect_the_lease() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    s.apply_at(t0, acquire("k", "a", 50)).unwrap();
    let renewed = s.apply_at(at(t0, 50), renew("k", "a", 1000)).unwrap();
    assert_eq!(renewed, Answer::Renewed(false));
    assert_eq!(holder(&s, at(t0, 51), "k"), None);
}

#[test]
fn transfer_moves_the_lease_with_a_fresh_ttl_and_only_from_the_holder() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    let transfer = |from: &str| Call::Transfer {
        key: "k".into(),
        from: Holder::new(from),
        to: Holder::new("b"),
        ttl_ms: 100,
    };
    s.apply_at(t0, acquire("k", "a", 100)).unwrap();
    let by_stranger = s.apply_at(at(t0, 10), transfer("x")).unwrap();
    assert_eq!(by_stranger, Answer::Transferred(false));
    let by_holder = s.apply_at(at(t0, 90), transfer("a")).unwrap();
    assert_eq!(by_holder, Answer::Transferred(true));
    assert_eq!(holder(&s, at(t0, 180), "k").as_deref(), Some("b"));
    assert_eq!(holder(&s, at(t0, 190), "k"), None);
}

#[test]
fn release_by_another_owner_changes_nothing() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    let release = |owner: &str| Call::Release {
        key: "k".into(),
        holder: Holder::new(owner),
    };
    s.apply_at(t0, acquire("k", "a", 100)).unwrap();
    assert_eq!(
        s.apply_at(t0, release("b")).unwrap(),
        Answer::Released(false)
    );
    assert_eq!(holder(&s, t0, "k").as_deref(), Some("a"));
    assert_eq!(
        s.apply_at(t0, release("a")).unwrap(),
        Answer::Released(true)
    );
    assert_eq!(holder(&s, t0, "k"), None);
}

#[test]
fn bad_input_is_rejected_and_leaves_the_holder_in_place() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    s.apply_at(t0, acquire("k", "a", 100)).unwrap();
    assert!(s.apply_at(t0, renew("k", "a", 0)).is_err());
    assert!(s.apply_at(t0, acquire("k", "", 100)).is_err());
    assert!(s.apply_at(t0, acquire("", "b", 100)).is_err());
    assert_eq!(holder(&s, at(t0, 99), "k").as_deref(), Some("a"));
}

#[test]
fn expired_leases_are_reclaimed_and_stale_deadlines_do_not_pile_up() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    for i in 0..10_000 {
        s.apply_at(t0, acquire(&format!("k{i}"), "a", 10)).unwrap();
    }
    assert_eq!(s.resident(), 10_000);
    while s.table().reclaim(at(t0, 10), 1000) > 0 {}
    assert_eq!(s.resident(), 0);

    s.apply_at(t0, acquire("held", "a", 1_000_000)).unwrap();
    for i in 0..100_000 {
        s.apply_at(at(t0, i), renew("held", "a", 1_000_000))
            .unwrap();
    }
    assert_eq!(
        s.table().deadlines.len(),
        1,
        "a renewal that extends queues nothing"
    );
}

#[test]
fn a_lease_renewed_shorter_is_swept_at_its_new_expiry_and_one_renewed_longer_lives_on() {
    let s = MemoryStore::default();
    let t0 = Instant::now();
    s.apply_at(t0, acquire("short", "a", 1_000)).unwrap();
    s.apply_at(t0, acquire("long", "a", 10)).unwrap();
    s.apply_at(t0, renew("short", "a", 10)).unwrap();
    s.apply_at(t0, renew("long", "a", 1_000)).unwrap();
    while s.reclaim_expired_at(at(t0, 10), 64) > 0 {}
    assert_eq!(holder(&s, at(t0, 10), "long").as_deref(), Some("a"));
    assert_eq!(
        s.resident(),
        1,
        "the shortened lease is gone, the extended one is not"
    );
    while s.reclaim_expired_at(at(t0, 1_000), 64) > 0 {}
    assert_eq!(s.resident(), 0);
}
