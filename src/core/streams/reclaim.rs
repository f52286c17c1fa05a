//! Entries that sit unsettled: taking over what a dead consumer left idle (XAUTOCLAIM, in a
//! consumer's reader), and keeping what a live one holds claimed so nobody takes it over.

use redis::Value;

use super::event::{self, Entry};
use super::group::Consumer;
use super::Shared;
use crate::core::connection::Connection;
use crate::core::error::{Error, Result};
use crate::core::log::Throttle;
use crate::core::scripts;

/// One XAUTOCLAIM step (`reclaim.lua`): takes over up to `count` entries of the group idle
/// for at least the reclaim threshold, starting at `cursor`, each with the number of times
/// Redis has now delivered it. One round trip, whatever the batch.
pub(super) async fn reclaim(
    shared: &Shared,
    consumer: &Consumer,
    cursor: &str,
    count: usize,
) -> Result<(String, Vec<Entry>)> {
    let mut invocation = scripts::RECLAIM.script().prepare_invoke();
    invocation
        .key(&consumer.key)
        .arg(&consumer.group)
        .arg(&consumer.name)
        .arg(shared.options.reclaim_idle_ms())
        .arg(cursor)
        .arg(count);
    let reply: Value = shared
        .writer
        .run(|mut c| async move { invocation.invoke_async(&mut c).await })
        .await?;
    Ok(event::reclaim_reply(reply))
}

/// Most entry ids one `keep.lua` call names.
const KEEP_CHUNK: usize = 500;

/// Resets the idle time of every entry this pubsub's consumers hold.
pub(super) async fn keep_claimed(shared: &Shared, failures: &Throttle) {
    let consumers: Vec<_> = shared.consumers().values().cloned().collect();
    let held: Vec<_> = consumers.iter().map(|c| (c, c.held_entries())).collect();
    let runs = held.iter().flat_map(|(consumer, ids)| {
        ids.chunks(KEEP_CHUNK)
            .map(move |ids| async move { (*consumer, keep(&shared.writer, consumer, ids).await) })
    });
    for (consumer, result) in futures::future::join_all(runs).await {
        match result {
            Ok(_) => {}
            // The stream or group is gone, and with it every pending entry.
            Err(Error::Server(err)) if err.code() == Some("NOGROUP") => {}
            Err(err) => shared.throttled(
                failures,
                "could not keep the events being handled claimed; a sibling may reclaim them",
                Some(&err),
                &[
                    ("topic", consumer.topic.clone().into()),
                    ("group", consumer.group.clone().into()),
                ],
            ),
        }
    }
}

/// Resets the idle time of those of `ids` (at most `KEEP_CHUNK`) the consumer still owns
/// (`keep.lua`), on `via`; answers how many it owned.
pub(super) async fn keep(via: &Connection, consumer: &Consumer, ids: &[String]) -> Result<i64> {
    let mut invocation = scripts::KEEP.script().prepare_invoke();
    invocation
        .key(&consumer.key)
        .arg(&consumer.group)
        .arg(&consumer.name)
        .arg(ids);
    via.run(|mut c| async move { invocation.invoke_async::<i64>(&mut c).await })
        .await
}
