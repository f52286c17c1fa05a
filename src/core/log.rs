//! What the core reports when it has no caller to answer: notices for a logger, and a
//! throttle that keeps a lasting failure from flooding it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Map, Value as Json};

/// How much a [`Notice`] matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Expected trouble that was recovered from (a group that already existed, a retried
    /// read). Mastra's backend logs these at `debug`.
    Debug,
    /// Something an operator should see: a dropped event, a connection that keeps failing.
    Warn,
}

/// One message for the [`Logger`]: a sentence and structured fields (topic, group, event
/// id, error, code), shaped like the `(message, fields)` pair Mastra's logger takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// Debug or warn.
    pub level: Level,
    /// A sentence, prefixed `mastra-lease:` or `mastra-lease streams:`.
    pub message: String,
    /// Context as JSON fields.
    pub fields: Map<String, Json>,
}

impl Notice {
    /// A notice from a message and its fields.
    pub fn new(level: Level, message: impl Into<String>, fields: &[(&str, Json)]) -> Self {
        Self {
            level,
            message: message.into(),
            fields: fields
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect(),
        }
    }
}

/// Where the core reports what it cannot report as an error to a caller.
pub trait Logger: Send + Sync {
    /// Called from Tokio tasks; must not block.
    fn log(&self, notice: Notice);
}

/// How often a lasting kind of trouble is reported at `warn`; every occurrence in between
/// is reported at `debug`. An outage otherwise floods the log.
pub const WARN_INTERVAL: Duration = Duration::from_secs(30);

/// Rate-limits one kind of warning: the first occurrence, then at most one per
/// [`WARN_INTERVAL`], is a warning; the rest are debug notes. Counts what it turned down,
/// so the next warning can say how many there were.
#[derive(Debug, Default)]
pub struct Throttle(Mutex<ThrottleState>);

#[derive(Debug, Default)]
struct ThrottleState {
    last_warning: Option<Instant>,
    since: u64,
}

impl Throttle {
    /// The level this occurrence gets, and how many occurrences the warning stands for
    /// (itself and those since the last warning).
    pub fn level(&self) -> (Level, u64) {
        self.level_of(1)
    }

    /// [`Throttle::level`] for `n` occurrences at once.
    pub fn level_of(&self, n: u64) -> (Level, u64) {
        let mut state = crate::core::lock(&self.0);
        let now = Instant::now();
        state.since += n;
        let warn = state
            .last_warning
            .is_none_or(|last| now.duration_since(last) >= WARN_INTERVAL);
        if !warn {
            return (Level::Debug, state.since);
        }
        state.last_warning = Some(now);
        let count = std::mem::take(&mut state.since);
        (Level::Warn, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_warns_once_then_takes_notes_and_counts_them() {
        let throttle = Throttle::default();
        assert_eq!(throttle.level(), (Level::Warn, 1));
        assert_eq!(throttle.level(), (Level::Debug, 1));
        assert_eq!(throttle.level(), (Level::Debug, 2));
        throttle.0.lock().unwrap().last_warning = Some(Instant::now() - WARN_INTERVAL);
        assert_eq!(throttle.level(), (Level::Warn, 3));
    }
}
