//! `trimTopic`: dropping one finished run's entries from a topic several runs share, so the
//! stream does not keep them until length trimming or the idle TTL gets there.
//!
//! The stream is read in pages (XRANGE with COUNT), from its first entry to the one that was
//! last when the trim began (what is appended meanwhile belongs to later trims); the entries
//! of the run are picked out here, and each page's picks are deleted by `trim_topic.lua`,
//! which spares any entry a consumer group holds unsettled. A page bounds how long one step
//! holds Redis, and each step is bounded by the command timeout. Best effort, as Mastra's
//! backend: a failure stops the trim and is logged; nothing is retried.
//!
//! An entry belongs to the run when its event's `runId` (the field every Mastra event has) is
//! the run's. With `producedBefore`, only entries whose `data.producedAt` is a number (epoch
//! milliseconds, as Mastra stamps it) no later than it, and whose `data.pinned` is not set
//! (as JavaScript reads it: anything but `false`, `0`, `""` or `null`): an entry without a
//! `producedAt` is not known to be old enough, and a pinned one (a run's start, its approval
//! and suspension prompts) must outlive the trims made while its run goes on. Mastra's own
//! backend picks the same entries.

use serde_json::Value as Json;

use super::event::{self, EntryId};
use super::Shared;
use crate::core::error::{Error, InputErrorKind, Result};
use crate::core::log::Level;
use crate::core::scripts;

/// Most entries one page reads, and so most ids one script call checks and deletes.
pub(crate) const PAGE: usize = 500;

/// Which entries a trim removes.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEntries {
    /// The run whose entries go. Must not be empty.
    pub run_id: String,
    /// Only entries whose `data.producedAt` is at most this (epoch milliseconds). Finite.
    pub produced_before: Option<f64>,
}

impl RunEntries {
    /// Checks the ranges the types do not express.
    pub fn check(&self) -> Result<()> {
        if self.run_id.is_empty() {
            return Err(Error::streams_argument(
                InputErrorKind::Range,
                "runId must not be empty",
            ));
        }
        if self.produced_before.is_some_and(|at| !at.is_finite()) {
            return Err(Error::streams_argument(
                InputErrorKind::Range,
                "producedBefore must be a finite number of milliseconds (or a valid Date)",
            ));
        }
        Ok(())
    }

    /// Whether the entry's event is one of these.
    fn holds(&self, json: &[u8]) -> bool {
        let Ok(Json::Object(event)) = serde_json::from_slice::<Json>(json) else {
            return false;
        };
        if event.get("runId").and_then(Json::as_str) != Some(self.run_id.as_str()) {
            return false;
        }
        let Some(before) = self.produced_before else {
            return true;
        };
        let data = event.get("data");
        let field = |name| data.and_then(|data| data.get(name));
        field("producedAt")
            .and_then(Json::as_f64)
            .is_some_and(|at| at <= before)
            && !field("pinned").is_some_and(truthy)
    }
}

/// Whether JavaScript counts the value as true (`if (value)`).
fn truthy(value: &Json) -> bool {
    match value {
        Json::Null => false,
        Json::Bool(b) => *b,
        Json::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
        Json::String(s) => !s.is_empty(),
        Json::Array(_) | Json::Object(_) => true,
    }
}

/// What one trim did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Trimmed {
    /// Entries of the run deleted.
    pub deleted: u64,
    /// Entries of the run left because a consumer group holds them unsettled.
    pub spared: u64,
    /// Pages read.
    pub pages: u64,
}

/// Deletes the run's entries from the stream at `key`, page by page.
pub(crate) async fn trim(shared: &Shared, key: &str, run: &RunEntries) -> Result<Trimmed> {
    let mut done = Trimmed::default();
    let Some(last) = super::last_entry(shared, key, "+").await? else {
        return Ok(done);
    };
    let mut start = "-".to_owned();
    loop {
        let mut range = redis::cmd("XRANGE");
        range
            .arg(key)
            .arg(&start)
            .arg(&last.id)
            .arg("COUNT")
            .arg(PAGE);
        let reply = shared
            .writer
            .run(|mut c| async move { range.query_async::<redis::Value>(&mut c).await })
            .await?;
        let page = event::range_reply(reply);
        done.pages += 1;
        let ids: Vec<&str> = page
            .iter()
            .filter(|entry| entry.event.as_deref().is_some_and(|json| run.holds(json)))
            .map(|entry| entry.id.as_str())
            .collect();
        if !ids.is_empty() {
            let mut invocation = scripts::TRIM_TOPIC.script().prepare_invoke();
            invocation.key(key);
            for id in &ids {
                invocation.arg(*id);
            }
            let (deleted, spared) = shared
                .writer
                .run(|mut c| async move { invocation.invoke_async::<(u64, u64)>(&mut c).await })
                .await?;
            done.deleted += deleted;
            done.spared += spared;
        }
        let next = page.last().and_then(|entry| EntryId::parse(&entry.id));
        match next {
            Some(id) if page.len() == PAGE => start = id.next().to_string(),
            _ => return Ok(done),
        }
    }
}

impl Shared {
    /// Trims the run's entries from the topic and reports how it went: a debug note when it
    /// finished, a warning when Redis failed it part way.
    pub(crate) async fn trim_topic(&self, topic: &str, run: &RunEntries) {
        let key = self.stream_key(topic);
        match trim(self, &key, run).await {
            Ok(done) => {
                if done.deleted > 0 {
                    // Length trimming places its cut from the entries appended since; with
                    // entries deleted, it must count them again.
                    self.forget_appends(&key);
                }
                self.notice(
                    Level::Debug,
                    "trimTopic removed a run's entries",
                    &[
                        ("topic", topic.into()),
                        ("runId", run.run_id.as_str().into()),
                        ("deleted", done.deleted.into()),
                        ("spared", done.spared.into()),
                        ("pages", done.pages.into()),
                        ("pageSize", PAGE.into()),
                    ],
                );
            }
            Err(err) => self.notice(
                Level::Warn,
                "trimTopic failed; the run's entries were not all removed",
                &[
                    ("topic", topic.into()),
                    ("runId", run.run_id.as_str().into()),
                    ("code", err.code().into()),
                    ("err", err.full_message().into()),
                ],
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(produced_before: Option<f64>) -> RunEntries {
        RunEntries {
            run_id: "run-a".into(),
            produced_before,
        }
    }

    #[test]
    fn an_entry_belongs_to_the_run_whose_run_id_it_carries() {
        assert!(run(None).holds(br#"{"runId":"run-a","data":{}}"#));
        assert!(!run(None).holds(br#"{"runId":"run-b","data":{}}"#));
        assert!(!run(None).holds(br#"{"data":{"runId":"run-a"}}"#));
        assert!(!run(None).holds(b"not json"));
    }

    #[test]
    fn with_produced_before_only_entries_produced_no_later_stay_picked() {
        let before = run(Some(1_000.0));
        assert!(before.holds(br#"{"runId":"run-a","data":{"producedAt":1000}}"#));
        assert!(before.holds(br#"{"runId":"run-a","data":{"producedAt":999.5}}"#));
        assert!(!before.holds(br#"{"runId":"run-a","data":{"producedAt":1001}}"#));
        assert!(!before.holds(br#"{"runId":"run-a","data":{}}"#));
        assert!(!before.holds(br#"{"runId":"run-a","data":{"producedAt":"1970-01-01T00:00:00Z"}}"#));
    }

    #[test]
    fn with_produced_before_a_pinned_entry_stays_as_javascript_reads_pinned() {
        let before = run(Some(1_000.0));
        let entry = |pinned: &str| {
            format!(r#"{{"runId":"run-a","data":{{"producedAt":5,"pinned":{pinned}}}}}"#)
        };
        for pinned in ["true", "1", "-2.5", r#""yes""#, "{}", "[]"] {
            assert!(!before.holds(entry(pinned).as_bytes()), "pinned: {pinned}");
        }
        for unpinned in ["false", "0", "0.0", r#""""#, "null"] {
            assert!(
                before.holds(entry(unpinned).as_bytes()),
                "pinned: {unpinned}"
            );
        }
        // Without producedBefore the whole run goes, pinned entries included.
        assert!(run(None).holds(entry("true").as_bytes()));
    }

    #[test]
    fn an_empty_run_id_and_a_produced_before_that_is_not_finite_are_refused() {
        let empty = RunEntries {
            run_id: String::new(),
            produced_before: None,
        };
        assert_eq!(
            empty.check().unwrap_err().code(),
            "ERR_STREAMS_INVALID_ARGUMENT"
        );
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(run(Some(bad)).check().is_err(), "{bad}");
        }
        assert!(run(Some(-5.0)).check().is_ok());
    }
}
