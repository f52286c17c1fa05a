//! Grants confirmed by replicas (`minReplicas`): written and confirmed with `WAIT` on a link
//! lent to their pipeline alone, so a confirmation holds up nothing else.

use super::parts::Part;
use super::{parse, Answer, Error, RedisStore, Replication, Result, Sent, Timing};

impl RedisStore {
    /// Sends a pipeline of calls on keys one of them may grant, on a link lent to it alone:
    /// the calls that did not grant (refusals, releases, reads, errors) are answered as soon
    /// as their replies are in; then one `WAIT` for the grants, with what is left of
    /// `replicaTimeoutMs` since the batch began, so a grant answers within it whatever was
    /// sent again on the way. Fails (for [`RedisStore::send`] to send again) only before any
    /// call was answered.
    pub(super) async fn confirmed(
        &self,
        calls: &[Sent],
        pipeline: &Part,
        timing: Timing,
        wanted: Replication,
        answered: &(dyn Fn(Vec<(usize, Result<Answer>)>) + Sync),
    ) -> Result<Vec<(usize, Result<Answer>)>> {
        let deadline = tokio::time::Instant::from_std(timing.deadline);
        let timeout = Error::Timeout(self.connection.timeout());
        let key = self.layout.lease(calls[pipeline.sent[0]].call.key());
        let Ok(lent) = tokio::time::timeout_at(deadline, self.connection.lend(&key)).await else {
            return Err(timeout);
        };
        let mut lent = lent?;
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
        let left = wanted.timeout.saturating_sub(timing.started.elapsed());
        let wait_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut wait = redis::cmd("WAIT");
        wait.arg(wanted.replicas).arg(wait_ms);
        let confirmed = tokio::time::timeout_at(deadline, lent.link().on_node_of(&key, &wait));
        let failure = match confirmed.await {
            Ok(Ok(reply)) => match parse::<u32>(reply) {
                Ok(confirmed) if confirmed >= wanted.replicas => {
                    lent.keep();
                    return Ok(granted);
                }
                Ok(confirmed) => {
                    lent.keep();
                    Error::Replication {
                        wanted: wanted.replicas,
                        confirmed,
                    }
                }
                Err(err) => self.wait_failed(err),
            },
            Ok(Err(err)) => self.wait_failed(err),
            Err(_) => timeout,
        };
        Ok(granted
            .into_iter()
            .map(|(i, _)| (i, Err(failure.clone())))
            .collect())
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
