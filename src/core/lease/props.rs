//! Property tests of the lease core.
//!
//! - `MemoryStore` against a reference model: random sequences of acquire (fenced or not),
//!   renew, release, transfer, the reads, sweeps and clock steps on a few keys that are
//!   prefixes of one another, by owners holding with or without metadata, with time injected,
//!   must answer exactly as a plain map of `key -> (holder, deadline, token)`.
//! - Validation: any key, owner, metadata or TTL outside the limits is rejected with the variant,
//!   code and class of the first bad argument, and a rejected call changes nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::memory::MemoryStore;
use super::{Answer, Call, Grant, Holder, Lease, Limits};
use crate::core::error::{Argument, Error, ErrorClass, InputErrorKind};

/// Keys that are prefixes of one another (Mastra's `resource\0thread` shape), plus two
/// spellings of "é": a store that truncated, normalised or compared prefixes would show.
const KEYS: [&str; 5] = ["k", "k\0", "k\0t", "\u{e9}", "e\u{301}"];
/// Owners that differ only by case, a NUL or an astral character.
const OWNERS: [&str; 4] = ["a", "A", "a\0", "a\u{1F600}"];

#[derive(Debug, Clone)]
enum Step {
    /// One lease call on the shared keys and owners.
    Call(Call),
    /// Acquire `count` other keys at once with one TTL, so more deadlines fall due together
    /// than a call's on-the-way reclaim handles, and a call meets an unreclaimed deadline.
    Burst { count: usize, ttl: u64 },
    /// Move the injected clock forward (0 keeps the same instant: deadlines land exactly).
    Advance(u64),
    /// Sweep expired leases with a budget, as the periodic sweep does.
    Sweep(usize),
}

/// A holder: one of the owners, with no metadata or one of two runs' (so one owner id often
/// holds for another run than the caller's).
fn holder() -> impl Strategy<Value = Holder> {
    let owner = proptest::sample::select(OWNERS.to_vec());
    let metadata = proptest::sample::select(vec![None, Some("r1"), Some("r2")]);
    (owner, metadata).prop_map(|(owner, metadata)| Holder {
        owner: owner.into(),
        metadata: metadata.map(String::from),
    })
}

fn step() -> impl Strategy<Value = Step> {
    let key = || proptest::sample::select(KEYS.to_vec()).prop_map(String::from);
    // Short TTLs and clock steps of the same size, so leases often expire mid-sequence and
    // calls often land exactly on a deadline.
    let ttl = || 1u64..=40;
    prop_oneof![
        3 => (key(), holder(), ttl(), any::<bool>()).prop_map(|(key, holder, ttl_ms, fenced)| {
            Step::Call(Call::Acquire { key, holder, ttl_ms, fenced })
        }),
        2 => key().prop_map(|key| Step::Call(Call::Owner { key })),
        1 => key().prop_map(|key| Step::Call(Call::Lease { key })),
        1 => key().prop_map(|key| Step::Call(Call::Record { key })),
        2 => (key(), holder()).prop_map(|(key, holder)| Step::Call(Call::Release { key, holder })),
        2 => (key(), holder(), ttl())
            .prop_map(|(key, holder, ttl_ms)| Step::Call(Call::Renew { key, holder, ttl_ms })),
        2 => (key(), holder(), holder(), ttl())
            .prop_map(|(key, from, to, ttl_ms)| Step::Call(Call::Transfer { key, from, to, ttl_ms })),
        2 => (0u64..=30).prop_map(Step::Advance),
        1 => (0usize..=4).prop_map(Step::Sweep),
        1 => (0usize..=80, ttl()).prop_map(|(count, ttl)| Step::Burst { count, ttl }),
    ]
}

/// The reference: what a lease store means, with nothing else in it. The holder is the
/// pair (owner, metadata). Tokens come from one counter: a fenced claim takes the next, a
/// fenced refresh of a lease without one too, a transfer of a lease with one too; a plain
/// claim takes none, a refresh or a renew keeps the lease's.
#[derive(Default)]
struct Model {
    /// key -> (holder, expires, token)
    leases: HashMap<String, (Holder, u64, Option<u64>)>,
    last_token: u64,
}

impl Model {
    fn live(&self, key: &str, now: u64) -> Option<&Holder> {
        self.lease(key, now).map(|(holder, _, _)| holder)
    }

    fn lease(&self, key: &str, now: u64) -> Option<&(Holder, u64, Option<u64>)> {
        self.leases
            .get(key)
            .filter(|(_, expires, _)| *expires > now)
    }

    fn token(&self, key: &str, now: u64) -> Option<u64> {
        self.lease(key, now).and_then(|(_, _, token)| *token)
    }

    fn next_token(&mut self) -> u64 {
        self.last_token += 1;
        self.last_token
    }

    fn holds(&self, key: &str, holder: &Holder, now: u64) -> bool {
        self.live(key, now) == Some(holder)
    }

    fn live_count(&self, now: u64) -> usize {
        self.leases.values().filter(|(_, e, _)| *e > now).count()
    }

    fn put(&mut self, key: &str, holder: &Holder, expires: u64, token: Option<u64>) {
        self.leases
            .insert(key.to_owned(), (holder.clone(), expires, token));
    }

    fn apply(&mut self, call: &Call, now: u64) -> Answer {
        match call {
            Call::Acquire {
                key,
                holder,
                ttl_ms,
                fenced,
            } => match self.live(key, now) {
                Some(held) if held != holder => Answer::Grant(Grant {
                    acquired: false,
                    owner: Some(held.owner.clone()),
                    token: None,
                    fenced: *fenced,
                }),
                _ => {
                    let token = match self.token(key, now) {
                        None if *fenced => Some(self.next_token()),
                        token => token,
                    };
                    self.put(key, holder, now + ttl_ms, token);
                    Answer::Grant(Grant {
                        acquired: true,
                        owner: Some(holder.owner.clone()),
                        token: token.filter(|_| *fenced),
                        fenced: *fenced,
                    })
                }
            },
            Call::Owner { key } => Answer::Owner(self.live(key, now).map(|h| h.owner.clone())),
            Call::Lease { key } => {
                Answer::Lease(self.lease(key, now).map(|(holder, expires, token)| Lease {
                    owner: holder.owner.clone(),
                    token: *token,
                    ttl_ms: Some(expires - now),
                    raw_owner: None,
                }))
            }
            Call::Record { key } => Answer::Record(self.live(key, now).cloned()),
            Call::Release { key, holder } => {
                let held = self.holds(key, holder, now);
                if held {
                    self.leases.remove(key);
                }
                Answer::Released(held)
            }
            Call::Renew {
                key,
                holder,
                ttl_ms,
            } => {
                let held = self.holds(key, holder, now);
                if held {
                    let token = self.token(key, now);
                    self.put(key, holder, now + ttl_ms, token);
                }
                Answer::Renewed(held)
            }
            Call::Transfer {
                key,
                from,
                to,
                ttl_ms,
            } => {
                let held = self.holds(key, from, now);
                if held {
                    let token = self.token(key, now).map(|_| self.next_token());
                    self.put(key, to, now + ttl_ms, token);
                }
                Answer::Transferred(held)
            }
        }
    }
}

/// Text of 0 to 24 characters from every UTF-8 width, NUL and astral characters included.
fn text() -> impl Strategy<Value = String> {
    let ch = prop_oneof![
        Just('\0'),
        Just('k'),
        Just('\u{e9}'),
        Just('\u{20ac}'),
        Just('\u{1F600}'),
        any::<char>(),
    ];
    proptest::collection::vec(ch, 0..24).prop_map(|cs| cs.into_iter().collect())
}

/// TTLs around every boundary: 0, 1, the cap, one past it, 2^53, 2^60, u64::MAX.
fn ttl(max: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(max),
        Just(max + 1),
        Just(1 << 53),
        Just(1 << 60),
        Just(u64::MAX),
        0..=max + 2,
        any::<u64>(),
    ]
}

fn limits() -> impl Strategy<Value = Limits> {
    (1usize..=40, 1usize..=20, 1usize..=20, 1u64..=100_000).prop_map(
        |(max_key_bytes, max_owner_bytes, max_metadata_bytes, max_ttl_ms)| Limits {
            max_key_bytes,
            max_owner_bytes,
            max_metadata_bytes,
            max_ttl_ms,
        },
    )
}

fn text_ok(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max
}

/// What `Call::check` must answer: the first bad argument in the order key, owner, metadata
/// (or fromOwner, fromMetadata, toOwner, toMetadata), ttlMs; each a RangeError (types are the
/// glue's business).
fn expected_rejection(call: &Call, l: &Limits) -> Option<Argument> {
    let key = |k: &str| (!text_ok(k, l.max_key_bytes)).then_some(Argument::Key);
    let holder = |h: &Holder| {
        let metadata = h.metadata.as_deref();
        (!text_ok(&h.owner, l.max_owner_bytes))
            .then_some(Argument::Owner)
            .or_else(|| {
                metadata
                    .is_some_and(|m| !text_ok(m, l.max_metadata_bytes))
                    .then_some(Argument::Metadata)
            })
    };
    let ttl = |t: u64| (t == 0 || t > l.max_ttl_ms).then_some(Argument::Ttl);
    match call {
        Call::Acquire {
            key: k,
            holder: h,
            ttl_ms,
            ..
        }
        | Call::Renew {
            key: k,
            holder: h,
            ttl_ms,
        } => key(k).or_else(|| holder(h)).or_else(|| ttl(*ttl_ms)),
        Call::Owner { key: k } | Call::Lease { key: k } | Call::Record { key: k } => key(k),
        Call::Release { key: k, holder: h } => key(k).or_else(|| holder(h)),
        Call::Transfer {
            key: k,
            from,
            to,
            ttl_ms,
        } => key(k)
            .or_else(|| holder(from))
            .or_else(|| holder(to))
            .or_else(|| ttl(*ttl_ms)),
    }
}

/// A holder of any text, with or without metadata.
fn any_holder() -> impl Strategy<Value = Holder> {
    (text(), proptest::option::of(text())).prop_map(|(owner, metadata)| Holder { owner, metadata })
}

fn any_call() -> impl Strategy<Value = (Limits, Call)> {
    limits().prop_flat_map(|l| {
        let t = || ttl(l.max_ttl_ms);
        let call = prop_oneof![
            (text(), any_holder(), t(), any::<bool>()).prop_map(|(key, holder, ttl_ms, fenced)| {
                Call::Acquire {
                    key,
                    holder,
                    ttl_ms,
                    fenced,
                }
            }),
            text().prop_map(|key| Call::Owner { key }),
            (text(), any_holder()).prop_map(|(key, holder)| Call::Release { key, holder }),
            (text(), any_holder(), t()).prop_map(|(key, holder, ttl_ms)| Call::Renew {
                key,
                holder,
                ttl_ms
            }),
            (text(), any_holder(), any_holder(), t()).prop_map(|(key, from, to, ttl_ms)| {
                Call::Transfer {
                    key,
                    from,
                    to,
                    ttl_ms,
                }
            }),
        ];
        (Just(l), call)
    })
}

fn code_of(argument: Argument) -> &'static str {
    match argument {
        Argument::Key => "ERR_LEASE_INVALID_KEY",
        Argument::Owner => "ERR_LEASE_INVALID_OWNER",
        Argument::Metadata => "ERR_LEASE_INVALID_METADATA",
        Argument::Ttl => "ERR_LEASE_INVALID_TTL",
    }
}

/// A key and an owner that are valid under every limit `limits()` makes.
const HELD_KEY: &str = "h";
const HOLDER: &str = "o";

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_answers_every_sequence_as_the_reference_model_does(
        steps in proptest::collection::vec(step(), 1..100),
    ) {
        let store = MemoryStore::new(Limits::default());
        let mut model = Model::default();
        let t0 = Instant::now();
        let mut now = 0u64;
        for (i, step) in steps.iter().enumerate() {
            let at = t0 + Duration::from_millis(now);
            match step {
                Step::Advance(ms) => now += ms,
                Step::Sweep(budget) => {
                    store.reclaim_expired_at(at, *budget);
                }
                Step::Call(call) => {
                    let got = store.apply_at(at, call.clone());
                    let want = model.apply(call, now);
                    prop_assert_eq!(got.ok(), Some(want), "step {} {:?} at {} ms", i, call, now);
                }
                Step::Burst { count, ttl } => {
                    for n in 0..*count {
                        // "f…" sorts before every shared key, so at one deadline a burst's
                        // entries come out of the heap first and use up the budget.
                        let call = Call::Acquire { key: format!("f{n}"), holder: Holder::new("a"), ttl_ms: *ttl, fenced: n % 2 == 0 };
                        prop_assert_eq!(store.apply_at(at, call.clone()).ok(), Some(model.apply(&call, now)));
                    }
                }
            }
            // The store never holds fewer entries than there are live leases, and a full
            // sweep leaves exactly the live ones (an expired lease never stays resident,
            // a live one is never reclaimed).
            prop_assert!(store.resident() >= model.live_count(now));
        }
        let end = t0 + Duration::from_millis(now);
        while store.reclaim_expired_at(end, 64) > 0 {}
        prop_assert_eq!(store.resident(), model.live_count(now));
        for key in KEYS.iter().copied().chain(["f0", "f79"]) {
            let got = store.apply_at(end, Call::Owner { key: key.into() }).ok();
            prop_assert_eq!(got, Some(Answer::Owner(model.live(key, now).map(|h| h.owner.clone()))));
        }
    }

    #[test]
    fn any_call_outside_the_limits_is_rejected_with_the_first_bad_argument_s_code(
        (limits, call) in any_call(),
    ) {
        let result = call.check(&limits);
        match expected_rejection(&call, &limits) {
            None => prop_assert!(result.is_ok(), "{:?} under {:?}: {:?}", call, limits, result),
            Some(argument) => {
                let err = result.err().ok_or_else(|| TestCaseError::fail(format!("{call:?} passed under {limits:?}")))?;
                prop_assert_eq!(err.code(), code_of(argument));
                prop_assert_eq!(err.class(), ErrorClass::Range);
                let is_range_error_on_argument = matches!(
                    err,
                    Error::InvalidArgument { argument: a, kind: InputErrorKind::Range, .. } if a == argument
                );
                prop_assert!(is_range_error_on_argument, "{:?}", err);
            }
        }
    }

    #[test]
    fn a_rejected_call_changes_nothing_in_the_memory_store(
        (limits, call) in any_call(),
    ) {
        prop_assume!(expected_rejection(&call, &limits).is_some());
        let store = MemoryStore::new(limits);
        let t0 = Instant::now();
        let held = Call::Acquire { key: HELD_KEY.into(), holder: Holder::new(HOLDER), ttl_ms: 1, fenced: true };
        prop_assert!(store.apply_at(t0, held).is_ok());
        prop_assert!(store.apply_at(t0, call).is_err());
        prop_assert_eq!(store.resident(), 1);
        // Still held at the same deadline: not released, renewed, transferred or replaced.
        let owner = store.apply_at(t0, Call::Owner { key: HELD_KEY.into() }).ok();
        prop_assert_eq!(owner, Some(Answer::Owner(Some(HOLDER.into()))));
        let later = t0 + Duration::from_millis(1);
        let owner = store.apply_at(later, Call::Owner { key: HELD_KEY.into() }).ok();
        prop_assert_eq!(owner, Some(Answer::Owner(None)));
    }

    #[test]
    fn text_is_accepted_exactly_when_it_is_non_empty_and_within_the_byte_cap(
        s in text(),
        max in 1usize..=48,
    ) {
        let limits = Limits { max_key_bytes: max, max_owner_bytes: max, max_metadata_bytes: max, max_ttl_ms: 1 };
        let ok = text_ok(&s, max);
        prop_assert_eq!(limits.check_key(&s).is_ok(), ok);
        for name in ["owner", "fromOwner", "toOwner"] {
            let checked = limits.check_owner(&s, name);
            prop_assert_eq!(checked.is_ok(), ok);
            if let Err(err) = checked {
                prop_assert_eq!(err.code(), "ERR_LEASE_INVALID_OWNER");
                // The message names the argument the caller passed.
                prop_assert!(err.to_string().starts_with(name), "{}", err);
            }
        }
        for name in ["metadata", "fromMetadata", "toMetadata"] {
            let checked = limits.check_metadata(&s, name);
            prop_assert_eq!(checked.is_ok(), ok);
            if let Err(err) = checked {
                prop_assert_eq!(err.code(), "ERR_LEASE_INVALID_METADATA");
                prop_assert!(err.to_string().starts_with(name), "{}", err);
            }
        }
    }

    #[test]
    fn a_ttl_is_accepted_exactly_when_it_is_from_1_to_max_ttl_ms(
        (max, t) in (1u64..=super::TTL_CEILING_MS).prop_flat_map(|max| (Just(max), ttl(max))),
    ) {
        let limits = Limits { max_ttl_ms: max, ..Limits::default() };
        let checked = limits.check_ttl(t);
        prop_assert_eq!(checked.is_ok(), (1..=max).contains(&t));
        if let Err(err) = checked {
            prop_assert_eq!(err.code(), "ERR_LEASE_INVALID_TTL");
            prop_assert_eq!(err.class(), ErrorClass::Range);
        }
    }
}
