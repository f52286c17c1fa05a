//! Waiting without polling: the release and transfer scripts publish on the lease key's
//! name (`SPUBLISH`, so on a cluster the message stays in the key's shard), and a process
//! that waits for a key listens there (see `connection/listener.rs`). They publish only for
//! a lease with a companion key: a waiter reads the lease it was refused before it waits, and
//! a `getLease` of a key this store listens to marks the lease as waited for (`lease.lua`), so
//! a lease nobody waits for (Mastra's own calls) costs Redis no publish.

use super::redis::RedisStore;
use crate::core::connection::Wake;
use crate::core::error::Result;

impl RedisStore {
    /// Calls `wake` whenever `key`'s lease may have been freed or moved: its release or
    /// transfer by a provider of this package (a publish from the script, for a lease marked
    /// as waited for: a `getLease` of `key` while it is watched marks it), or a lost
    /// listening connection once it is back (messages may have been missed). A lease that
    /// expires, or that another library deletes, publishes nothing: a waiter also sets a timer
    /// at its remaining TTL. Resolves, with the id to stop with, once Redis confirmed the
    /// subscription.
    pub async fn watch(&self, key: &str, wake: Wake) -> Result<u64> {
        self.limits().check_key(key)?;
        let channel = self.layout().lease(key);
        self.connection().listen(&channel, wake).await
    }

    /// Wakes every watcher once more (each then finds the provider closed) and forgets them
    /// all, closing the listening connection.
    pub fn unwatch_all(&self) {
        self.connection().close_listener();
    }

    /// Stops calling watcher `id` of `key`.
    pub fn unwatch(&self, key: &str, id: u64) {
        self.connection().unlisten(&self.layout().lease(key), id);
    }
}
