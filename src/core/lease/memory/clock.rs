//! Time for a [`MemoryStore`](super::MemoryStore) read from a clock its embedder supplies (a
//! test's fake clock), in place of the store's own monotonic one.
//!
//! A store runs on `Instant`s: a followed clock turns readings (milliseconds, from any
//! origin) into them by counting only the clock's steps forward. A reading below the last
//! one moves nothing, and the steps forward from there count again. So a clock set back never
//! brings an expired lease back, nor keeps one beyond its TTL of the clock's forward movement,
//! however far back it was set; and a clock that stands still holds every lease where it is.

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::core::error::{Error, InputErrorKind, Result};
use crate::core::lease::TTL_CEILING_MS;

/// How far a followed clock may move forward in all: as far as a lease's TTL may reach, so
/// the instants it gives, a TTL added, stay far below where `Instant` arithmetic overflows.
const MOVE_CEILING: Duration = Duration::from_millis(TTL_CEILING_MS);

/// Instants that follow a clock's readings; for one thread, like the store.
#[derive(Debug)]
pub struct FollowedClock {
    /// The instant of the first reading.
    origin: Instant,
    /// How far the clock has moved forward in all since the first reading.
    moved: Cell<Duration>,
    /// The last reading, in milliseconds.
    last: Cell<f64>,
}

impl FollowedClock {
    /// A clock whose first reading is `reading` (milliseconds): refused unless finite.
    pub fn new(reading: f64) -> Result<Self> {
        finite(reading)?;
        Ok(Self {
            origin: Instant::now(),
            moved: Cell::new(Duration::ZERO),
            last: Cell::new(reading),
        })
    }

    /// The instant of `reading` (milliseconds): later than the last by the step forward from
    /// the last reading, or the same when the clock stood still or went back. A reading that
    /// is not finite, or one that would move the clock past [`MOVE_CEILING`] in all, is
    /// refused and changes nothing.
    pub fn at(&self, reading: f64) -> Result<Instant> {
        finite(reading)?;
        let step = reading - self.last.get();
        let moved = if step > 0.0 {
            Duration::try_from_secs_f64(step / 1000.0)
                .ok()
                .and_then(|step| self.moved.get().checked_add(step))
                .filter(|moved| *moved <= MOVE_CEILING)
                .ok_or_else(|| {
                    Error::option(
                        InputErrorKind::Range,
                        format!(
                            "MemoryLeaseProvider: the clock moved more than {TTL_CEILING_MS} ms \
                             forward in all (its last reading {reading})"
                        ),
                    )
                })?
        } else {
            self.moved.get()
        };
        self.moved.set(moved);
        self.last.set(reading);
        Ok(self.origin + moved)
    }
}

fn finite(reading: f64) -> Result<()> {
    if reading.is_finite() {
        return Ok(());
    }
    // Named as JavaScript names them.
    let got = match reading {
        f64::INFINITY => "Infinity",
        f64::NEG_INFINITY => "-Infinity",
        _ => "NaN",
    };
    Err(Error::option(
        InputErrorKind::Range,
        format!(
            "MemoryLeaseProvider: the clock must answer a finite number of milliseconds, got {got}"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(instant: Instant, clock: &FollowedClock) -> f64 {
        instant.duration_since(clock.origin).as_secs_f64() * 1000.0
    }

    #[test]
    fn instants_move_with_the_clock_from_any_origin() {
        let clock = FollowedClock::new(1_700_000_000_000.0).unwrap();
        assert_eq!(ms(clock.at(1_700_000_000_000.0).unwrap(), &clock), 0.0);
        assert_eq!(ms(clock.at(1_700_000_000_250.0).unwrap(), &clock), 250.0);
        assert_eq!(ms(clock.at(1_700_000_001_000.5).unwrap(), &clock), 1000.5);
        let negative = FollowedClock::new(-5.0).unwrap();
        assert_eq!(ms(negative.at(5.0).unwrap(), &negative), 10.0);
    }

    #[test]
    fn a_clock_set_back_stands_still_and_its_steps_forward_from_there_count() {
        let clock = FollowedClock::new(10_000.0).unwrap();
        let before = clock.at(11_000.0).unwrap();
        // A year back: time stands still, not a year of leases that cannot expire.
        assert_eq!(clock.at(11_000.0 - 3.2e10).unwrap(), before);
        assert_eq!(
            clock.at(11_000.0 - 3.2e10 + 500.0).unwrap(),
            before + Duration::from_millis(500)
        );
        // Back and forth: only the steps forward count, never one back.
        let back = 11_000.0 - 3.2e10;
        assert_eq!(clock.at(back).unwrap(), before + Duration::from_millis(500));
        assert_eq!(
            clock.at(back + 100.0).unwrap(),
            before + Duration::from_millis(600)
        );
    }

    #[test]
    fn a_reading_that_is_not_finite_is_refused_and_changes_nothing() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let error = FollowedClock::new(bad).unwrap_err();
            assert_eq!(error.code(), "ERR_LEASE_INVALID_OPTION");
            let clock = FollowedClock::new(0.0).unwrap();
            let error = clock.at(bad).unwrap_err();
            assert!(matches!(
                error,
                Error::InvalidOption {
                    kind: InputErrorKind::Range,
                    ..
                }
            ));
            assert_eq!(ms(clock.at(10.0).unwrap(), &clock), 10.0);
        }
    }

    #[test]
    fn a_clock_may_not_run_past_the_ceiling_and_a_refused_step_changes_nothing() {
        let clock = FollowedClock::new(0.0).unwrap();
        let ceiling = TTL_CEILING_MS as f64;
        assert!(clock.at(ceiling - 1_000.0).is_ok());
        assert_eq!(
            clock.at(ceiling + 1e6).unwrap_err().code(),
            "ERR_LEASE_INVALID_OPTION"
        );
        // A step back and forward again may not pass it either, however it is reached.
        assert!(clock.at(0.0).is_ok());
        assert!(clock.at(1e6).is_err());
        let huge = FollowedClock::new(-f64::MAX).unwrap();
        assert!(huge.at(f64::MAX).is_err());
        assert_eq!(ms(huge.at(-f64::MAX).unwrap(), &huge), 0.0);
    }
}
