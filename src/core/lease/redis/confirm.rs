//! Grants confirmed by replicas (`minReplicas`): written and confirmed with `WAIT` on a link
//! lent to their pipeline alone, so a confirmation holds up nothing else.
//!
//! A grant is answered only while the lease it wrote is surely still alive: its TTL began on
//! the master no earlier than the pipeline was sent, so it lives at least until then plus its
//! TTL. A confirmation that comes later (a replica that was away: the old master resyncing
//! after a failover) would answer a lease that may have expired already, and that another
//! owner may have claimed meanwhile, its grant waiting for the same acknowledgement: both
//! would be told they hold the key at once. So no `WAIT` runs past the shortest TTL it
//! confirms, and a grant not confirmed within its TTL rejects as unconfirmed.

use std::time::{Duration, Instant};

use super::parts::Part;
use super::{parse, Answer, Call, Error, RedisStore, Replication, Result, Sent, Timing};

/// A grant waiting for its confirmation, and until when the lease it wrote surely lives.
struct Pending {
    at: usize,
    answer: Result<Answer>,
    lives_until: Instant,
}

impl RedisStore {
    /// Sends a pipeline of calls on keys one of them may grant, on a link lent to it alone:
    /// the calls that did not grant (refusals, releases, reads, errors) are answered as soon
    /// as their replies are in; then a `WAIT` for the grants, with what is left of
    /// `replicaTimeoutMs` since the batch began, so a grant answers within it whatever was
    /// sent again on the way, and never past the shortest TTL among them (see the module's
    /// header). Fails (for [`RedisStore::send`] to send again) only before any call was
    /// answered.
    pub(super) async fn confirmed(
        &self,
        calls: &[Sent],
        pipeline: &Part,
        timing: Timing,
        wanted: Replication,
        answered: &(dyn Fn(Vec<(usize, Result<Answer>)>) + Sync),
    ) -> Result<Vec<(usize, Result<Answer>)>> {
        let deadline = tokio::time::Instant::from_std(timing.deadline);
        let timeout = self.connection.timed_out(self.connection.timeout());
        let key = self.layout.lease(calls[pipeline.sent[0]].call.key());
        let Ok(lent) = tokio::time::timeout_at(deadline, self.connection.lend(&key)).await else {
            return Err(timeout);
        };
        let mut lent = lent?;
        let sent_at = Instant::now();
        let replies = match tokio::time::timeout_at(
            deadline,
            self.passes(lent.link(), calls, pipeline),
        )
        .await
        {
            Ok(Ok(replies)) => replies,
            Ok(Err(err)) => return Err(self.connection.classify(err)),
            Err(_) => return Err(timeout),
        };
        let (granted, now): (Vec<_>, Vec<_>) = self
            .decode_all(calls, &pipeline.sent, replies)
            .into_iter()
            .partition(|(_, answer)| answer.as_ref().is_ok_and(Answer::granted));
        if granted.is_empty() {
            lent.keep();
            return Ok(now);
        }
        answered(now);
        let mut pending: Vec<Pending> = granted
            .into_iter()
            .map(|(at, answer)| Pending {
                lives_until: sent_at + ttl(&calls[at].call),
                at,
                answer,
            })
            .collect();
        let replicas_until = timing.started + wanted.timeout;
        // Each round waits until the replicas confirm or the first of these bounds passes: the
        // grants whose lease ends then are answered unconfirmed, and the others wait on.
        loop {
            let first_end = pending.iter().map(|p| p.lives_until).min();
            let until = first_end.map_or(replicas_until, |end| end.min(replicas_until));
            let mut wait = redis::cmd("WAIT");
            wait.arg(wanted.replicas).arg(wait_ms(until));
            let confirmed = tokio::time::timeout_at(deadline, lent.link().on_node_of(&key, &wait));
            let failure = match confirmed.await {
                Ok(Ok(reply)) => match parse::<u32>(reply) {
                    Ok(confirmed) if confirmed >= wanted.replicas => {
                        lent.keep();
                        // The reply can still come after a lease's end (a slow link, a busy
                        // process): only a lease still alive is answered as granted.
                        let now = Instant::now();
                        return Ok(pending
                            .into_iter()
                            .map(|p| match p.lives_until > now {
                                true => (p.at, p.answer),
                                false => (p.at, Err(unconfirmed(wanted, 0))),
                            })
                            .collect());
                    }
                    Ok(confirmed) if until < replicas_until => {
                        // The wait ended with the shortest lease: those leases were not
                        // confirmed while they lived; the rest wait on, on the same link.
                        let (ended, left): (Vec<_>, Vec<_>) =
                            pending.into_iter().partition(|p| p.lives_until <= until);
                        let failed = unconfirmed(wanted, confirmed);
                        answered(
                            ended
                                .into_iter()
                                .map(|p| (p.at, Err(failed.clone())))
                                .collect(),
                        );
                        pending = left;
                        if pending.is_empty() {
                            lent.keep();
                            return Ok(Vec::new());
                        }
                        continue;
                    }
                    Ok(confirmed) => {
                        lent.keep();
                        unconfirmed(wanted, confirmed)
                    }
                    Err(err) => self.wait_failed(err),
                },
                Ok(Err(err)) => self.wait_failed(err),
                Err(_) => timeout,
            };
            return Ok(pending
                .into_iter()
                .map(|p| (p.at, Err(failure.clone())))
                .collect());
        }
    }

    /// What a failed `WAIT` means for the grants it was to confirm. A server that does not
    /// run it (renamed away, a managed service without it, an ACL user refused it) is
    /// remembered: every later grant is refused so before anything is sent.
    fn wait_failed(&self, err: redis::RedisError) -> Error {
        let refused = err.code() == Some("NOPERM") || Error::is_unknown_command(&err).is_some();
        if refused {
            let err = Error::Unsupported {
                command: "WAIT".to_owned(),
                source: err,
            };
            return self.no_wait.get_or_init(|| err).clone();
        }
        self.connection.classify(err)
    }
}

/// A grant fewer replicas than wanted confirmed in time.
fn unconfirmed(wanted: Replication, confirmed: u32) -> Error {
    Error::Replication {
        wanted: wanted.replicas,
        confirmed,
    }
}

/// The TTL a grant wrote (every call that grants carries one).
fn ttl(call: &Call) -> Duration {
    match call {
        Call::Acquire { ttl_ms, .. }
        | Call::Renew { ttl_ms, .. }
        | Call::Transfer { ttl_ms, .. } => Duration::from_millis(*ttl_ms),
        Call::Owner { .. } | Call::Lease { .. } | Call::Record { .. } | Call::Release { .. } => {
            Duration::ZERO
        }
    }
}

/// `WAIT`'s timeout for a wait that must end at `until`: in whole milliseconds, rounded up
/// so the wait does not end before it, and never 0 (which would wait forever).
fn wait_ms(until: Instant) -> u64 {
    let left = until.saturating_duration_since(Instant::now());
    let ms = left.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}
