//! The runtime's tick: a timer kept due before the calls' deadlines while calls keep coming.
//!
//! Tokio's timer wakes its thread (a write to an event descriptor, then an empty turn of its
//! loop) whenever a timer is set earlier than every timer already set. Every call sets one, its
//! command timeout, so on an otherwise idle runtime each call would pay that wake-up. While
//! calls keep coming, the tick keeps a timer due within [`PERIOD`], earlier than a call's
//! deadline (the command timeout, 2 s unless configured lower), so setting theirs wakes
//! nothing. It stops after a period without calls: an idle process's runtime sleeps
//! undisturbed. Only the cost of a call depends on it, never its outcome.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const PERIOD: Duration = Duration::from_millis(100);

/// A tick is running (or being started).
static RUNNING: AtomicBool = AtomicBool::new(false);
/// A call came since the tick last looked.
static CALLED: AtomicBool = AtomicBool::new(false);

/// On the runtime, before a call sets its timer: starts the tick unless it runs.
pub(super) fn keep() {
    CALLED.store(true, Ordering::Relaxed);
    if RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async {
        // Stopped with its runtime, too: the next call starts another.
        let _running = Running;
        loop {
            tokio::time::sleep(PERIOD).await;
            if !CALLED.swap(false, Ordering::AcqRel) {
                break;
            }
        }
    });
}

struct Running;

impl Drop for Running {
    fn drop(&mut self) {
        RUNNING.store(false, Ordering::Release);
    }
}
