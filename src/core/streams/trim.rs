//! Trimming streams to about `maxStreamLength` entries without cutting an entry a consumer
//! group has not settled (`trim.lua`): a consumer that dies holding entries, or a slow one,
//! loses nothing to trimming before a sibling reclaims or it settles them. Past
//! `hardMaxStreamLength` entries are cut all the same (a group nobody reads any more would
//! otherwise keep a stream growing for ever), and every one lost is counted in a warning.
//!
//! Appends are plain XADDs (no `MAXLEN`, which cuts blindly): every so many appends to a
//! stream, this process runs one trim of it, in a task of its own. Each trim answers the
//! stream's `entries-added` and last id; from those, later trims know where the length limit
//! falls (an entry seen when `entries-added` was at least the limit behind today's) without
//! reading entries.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::Shared;
use crate::core::lock;
use crate::core::log::{Level, Throttle};
use crate::core::scripts;

/// Most entries one trim removes or reads: a bound on how long it holds Redis. A stream
/// further over its limit is trimmed again at once.
const TRIM_BUDGET: u64 = 1_000;
/// Most streams whose appends are counted; past it the counts start over (trims are then
/// only later).
const MAX_COUNTED: usize = 10_000;
/// Most earlier answers kept per stream.
const MAX_SEEN: usize = 256;

/// Appends and trims, per stream.
#[derive(Default)]
pub(crate) struct Trimmer {
    /// By stream key.
    streams: Mutex<HashMap<String, Stream>>,
    failures: Throttle,
}

#[derive(Default)]
struct Stream {
    /// Appends since its last trim.
    appends: u64,
    /// Whether a trim of it runs.
    running: bool,
    /// What earlier trims saw: `entries-added` then, and the last entry's id, oldest first.
    seen: VecDeque<(u64, String)>,
}

impl Stream {
    /// The newest entry seen at least `limit` entries ago: from it on, the stream holds at
    /// least `limit` entries. Older answers are no longer needed.
    fn cut(&mut self, limit: u64) -> Option<String> {
        let latest = self.seen.back()?.0;
        let far_enough = self
            .seen
            .iter()
            .rposition(|(added, _)| added.saturating_add(limit) <= latest)?;
        self.seen.drain(..far_enough);
        self.seen.front().map(|(_, id)| id.clone())
    }

    fn saw(&mut self, added: u64, last: String) {
        if self.seen.back().is_some_and(|(newest, _)| *newest >= added) {
            return;
        }
        if self.seen.len() == MAX_SEEN {
            self.seen.pop_front();
        }
        self.seen.push_back((added, last));
    }
}

impl Shared {
    /// Counts `count` appends to `key`; every `maxStreamLength / 100` appends (at most 100),
    /// trims the stream, one trim per stream at a time.
    pub fn appended(self: &Arc<Self>, key: &str, count: u64) {
        if self.options.max_len == 0 {
            return;
        }
        let step = self.trim_step();
        {
            let mut streams = lock(&self.trim.streams);
            if streams.len() >= MAX_COUNTED && !streams.contains_key(key) {
                streams.retain(|_, stream| stream.running);
            }
            let stream = streams.entry(key.to_owned()).or_default();
            stream.appends += count;
            if stream.appends < step || stream.running {
                return;
            }
            stream.appends = 0;
            stream.running = true;
        }
        self.runtime.spawn(trim(Arc::clone(self), key.to_owned()));
    }

    /// Appends between two trims of a stream.
    fn trim_step(&self) -> u64 {
        (self.options.max_len / 100).clamp(1, 100)
    }

    /// How far over its limit a stream may stay: a tenth of it, or a step when that is more.
    /// What earlier rounds saw places the limit within about a step's appends, but a burst
    /// between two rounds leaves it coarser: reading the entries to place it exactly costs
    /// Redis a read of each one past the limit, worth it only past this much.
    fn trim_slack(&self) -> u64 {
        (self.options.max_len / 10).max(self.trim_step())
    }

    /// Forgets a stream's count (its stream was deleted).
    pub fn forget_appends(&self, key: &str) {
        lock(&self.trim.streams).remove(key);
    }
}

/// How the next round of a trim finds where the length limit falls.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Find {
    /// From what earlier rounds saw (no entry read), when they saw far enough back.
    FromSeen,
    /// By reading the oldest entries: when what was seen is too coarse to come within
    /// `trim_slack` of the limit (a burst between two rounds).
    Exactly,
}

/// Trims one stream until it is within about its limit (or the rest is unsettled): no more
/// than a tenth over it.
async fn trim(shared: Arc<Shared>, key: String) {
    let options = &shared.options;
    let mut find = Find::FromSeen;
    loop {
        let cut = match find {
            Find::FromSeen => lock(&shared.trim.streams)
                .get_mut(&key)
                .and_then(|stream| stream.cut(options.max_len)),
            Find::Exactly => None,
        };
        let mut invocation = scripts::TRIM.script().prepare_invoke();
        invocation
            .key(&key)
            .arg(options.max_len)
            .arg(cut.as_deref().unwrap_or_default())
            .arg(options.hard_max_len)
            .arg(TRIM_BUDGET);
        let result = shared
            .writer
            .run(|mut c| async move {
                invocation
                    .invoke_async::<(u64, u64, u64, u64, String)>(&mut c)
                    .await
            })
            .await;
        let next = match result {
            Ok((trimmed, lost, left, added, last)) => {
                if lost > 0 {
                    shared.notice(
                        Level::Warn,
                        "the stream passed hardMaxStreamLength: trimming cut entries a consumer \
                         group had not settled",
                        &[
                            ("topic", shared.topic_of(&key).into()),
                            ("lost", lost.into()),
                            ("hardMaxStreamLength", options.hard_max_len.into()),
                        ],
                    );
                }
                let mut streams = lock(&shared.trim.streams);
                let Some(stream) = streams.get_mut(&key) else {
                    return;
                };
                stream.saw(added, last);
                if trimmed >= TRIM_BUDGET {
                    Some(find)
                } else if left <= options.max_len + shared.trim_slack() || find == Find::Exactly {
                    None
                } else if stream.cut(options.max_len) != cut {
                    // This round saw further than the cut it used: once more, with that.
                    Some(Find::FromSeen)
                } else {
                    Some(Find::Exactly)
                }
            }
            Err(err) => {
                shared.throttled(
                    &shared.trim.failures,
                    "could not trim a stream",
                    Some(&err),
                    &[("topic", shared.topic_of(&key).into())],
                );
                None
            }
        };
        if let Some(next) = next {
            find = next;
            continue;
        }
        // Appends made while it ran are trimmed by another round, not left for the next one.
        let mut streams = lock(&shared.trim.streams);
        let Some(stream) = streams.get_mut(&key) else {
            return;
        };
        if stream.appends < shared.trim_step() {
            stream.running = false;
            return;
        }
        stream.appends = 0;
        find = Find::FromSeen;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cut_is_the_newest_entry_seen_at_least_the_limit_ago() {
        let mut stream = Stream::default();
        assert_eq!(stream.cut(100), None);
        for added in [50, 120, 180, 260, 300] {
            stream.saw(added, format!("{added}-0"));
        }
        // 300 added now: entries seen at 180 or before are at least 100 behind.
        assert_eq!(stream.cut(100).as_deref(), Some("180-0"));
        assert_eq!(stream.seen.len(), 3, "older answers are dropped");
        assert_eq!(stream.cut(1_000), None);
        stream.saw(260, "260-0".into());
        assert_eq!(
            stream.seen.len(),
            3,
            "an answer that is not newer is ignored"
        );
    }
}
