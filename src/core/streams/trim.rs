//! Trimming streams to about `maxStreamLength` entries without cutting an entry a consumer
//! group has not settled (`trim.lua`): a consumer that dies holding entries, or a slow one,
//! loses nothing to trimming before a sibling reclaims or it settles them. Past
//! `hardMaxStreamLength` entries are cut all the same (a group nobody reads any more would
//! otherwise keep a stream growing for ever), and every one lost is counted in a warning.
//!
//! Appends are plain XADDs (no `MAXLEN`, which cuts blindly): every so many appends to a
//! stream, this process runs one trim of it, in a task of its own.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use redis::Script;

use super::{lock, Shared};
use crate::core::log::{Level, Throttle};

static TRIM: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("trim.lua")));

/// Most entries one trim removes: a bound on how long it holds Redis. A stream further over
/// its limit is trimmed again at once.
const TRIM_BUDGET: u64 = 1_000;
/// Most streams whose appends are counted; past it the counts start over (trims are then
/// only later).
const MAX_COUNTED: usize = 10_000;

/// Appends per stream since its last trim.
#[derive(Default)]
pub(crate) struct Trimmer {
    /// Stream key → appends since its last trim, and whether a trim of it runs.
    streams: Mutex<HashMap<String, (u64, bool)>>,
    failures: Throttle,
}

impl Shared {
    /// Counts `count` appends to `key`; every `maxStreamLength / 100` appends (at most 100),
    /// trims the stream, one trim per stream at a time.
    pub fn appended(self: &Arc<Self>, key: &str, count: u64) {
        if self.tuning.max_len == 0 {
            return;
        }
        let step = self.trim_step();
        {
            let mut streams = lock(&self.trim.streams);
            if streams.len() >= MAX_COUNTED && !streams.contains_key(key) {
                streams.retain(|_, (_, running)| *running);
            }
            let (appends, running) = streams.entry(key.to_owned()).or_default();
            *appends += count;
            if *appends < step || *running {
                return;
            }
            *appends = 0;
            *running = true;
        }
        self.runtime.spawn(trim(Arc::clone(self), key.to_owned()));
    }

    /// Appends between two trims of a stream.
    fn trim_step(&self) -> u64 {
        (self.tuning.max_len / 100).clamp(1, 100)
    }

    /// Forgets a stream's count (its stream was deleted).
    pub fn forget_appends(&self, key: &str) {
        lock(&self.trim.streams).remove(key);
    }
}

/// Trims one stream until it is within its limit (or the rest is unsettled).
async fn trim(shared: Arc<Shared>, key: String) {
    let tuning = &shared.tuning;
    loop {
        let mut invocation = TRIM.prepare_invoke();
        invocation
            .key(&key)
            .arg(tuning.max_len)
            .arg(tuning.hard_max_len)
            .arg(TRIM_BUDGET);
        let result = shared
            .writer
            .run(|mut c| async move { invocation.invoke_async::<(u64, u64)>(&mut c).await })
            .await;
        let again = match result {
            Ok((trimmed, lost)) => {
                if lost > 0 {
                    shared.notice(
                        Level::Warn,
                        "the stream passed hardMaxStreamLength: trimming cut entries a consumer \
                         group had not settled",
                        &[
                            ("topic", shared.topic_of(&key).into()),
                            ("lost", lost.into()),
                            ("hardMaxStreamLength", tuning.hard_max_len.into()),
                        ],
                    );
                }
                trimmed >= TRIM_BUDGET
            }
            Err(err) => {
                shared.throttled(
                    &shared.trim.failures,
                    "could not trim a stream",
                    Some(&err),
                    &[("topic", shared.topic_of(&key).into())],
                );
                false
            }
        };
        if again {
            continue;
        }
        // Appends made while it ran are trimmed by another round, not left for the next one.
        let mut streams = lock(&shared.trim.streams);
        let Some((count, running)) = streams.get_mut(&key) else {
            return;
        };
        if *count < shared.trim_step() {
            *running = false;
            return;
        }
        *count = 0;
    }
}
