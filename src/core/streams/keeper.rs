//! What runs beside the readers, one task per pubsub: it keeps the entries this process
//! holds claimed, nacks deliveries held past `inFlightTimeoutMs` on their handlers' behalf,
//! and warns about deliveries held unusually long.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::delivery;
use super::settle::{self, Settle};
use super::{reclaim, Shared};
use crate::core::log::Throttle;

/// A delivery held this many times `reclaimIdleMs` is worth a warning: where Mastra's own
/// backend would long since have handed it to a sibling.
const LONG_HOLD_FACTOR: u32 = 5;
/// The keeper's finest step, whatever the settings.
const MIN_TICK: Duration = Duration::from_millis(10);

/// Every third of `reclaimIdleMs` it resets the idle time of the entries this pubsub's
/// consumers hold (`keep.lua`, which leaves alone any entry a sibling already took over), so
/// an entry whose handler is slower than the threshold is never reclaimed and handled a
/// second time while its process lives, nor its `deliveryAttempt` raised. Only a consumer
/// that stops keeping (its process died or froze) has its entries reclaimed. More often when
/// `inFlightTimeoutMs` is set, to nack what exceeded it on time. Ends with the pubsub (closed
/// or dropped).
pub(super) async fn run(shared: Weak<Shared>) {
    let Some((keep_every, tick)) = shared.upgrade().map(|s| {
        let keep_every = Duration::from_millis((s.options.reclaim_idle_ms() / 3).max(1));
        let tick = s
            .options
            .in_flight_timeout
            .map_or(keep_every, |timeout| keep_every.min(timeout / 4))
            .max(MIN_TICK);
        (keep_every, tick)
    }) else {
        return;
    };
    let keep_failures = Throttle::default();
    let long_holds = Throttle::default();
    let mut kept_at = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        if kept_at.elapsed() >= keep_every {
            kept_at = Instant::now();
            reclaim::keep_claimed(&shared, &keep_failures).await;
        }
        look_at_holds(&shared, &long_holds).await;
    }
}

/// Nacks what was held past `inFlightTimeoutMs`, and warns (at most every 30 s) about what
/// has been held longer than `LONG_HOLD_FACTOR` times `reclaimIdleMs`.
async fn look_at_holds(shared: &Arc<Shared>, long_holds: &Throttle) {
    let now = Instant::now();
    let long = Duration::from_millis(shared.options.reclaim_idle_ms()) * LONG_HOLD_FACTOR;
    let timeout = shared.options.in_flight_timeout;
    let mut expired = Vec::new();
    let mut held_long = 0u64;
    let mut oldest: Option<(Duration, Arc<delivery::State>)> = None;
    for state in shared.deliveries().values() {
        let Some(held) = state.held_for(now) else {
            continue;
        };
        if timeout.is_some_and(|timeout| held >= timeout) {
            expired.push(Arc::clone(state));
        } else if held >= long {
            held_long += 1;
            if oldest.as_ref().is_none_or(|(age, _)| held > *age) {
                oldest = Some((held, Arc::clone(state)));
            }
        }
    }
    if let Some((age, state)) = oldest {
        shared.throttled(
            long_holds,
            "events have been held unsettled for a long time; if their handlers never settle \
             them, set inFlightTimeoutMs",
            None,
            &[
                ("held", held_long.into()),
                (
                    "oldestMs",
                    u64::try_from(age.as_millis()).unwrap_or(u64::MAX).into(),
                ),
                ("topic", state.topic().into()),
                ("entryId", state.entry_id.clone().into()),
            ],
        );
    }
    let expiries = expired.into_iter().map(|state| {
        let shared = Arc::clone(shared);
        async move { settle::settle(&shared, &shared.writer, &state, Settle::Expire).await }
    });
    futures::future::join_all(expiries).await;
}
