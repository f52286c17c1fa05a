//! What a fresh connection gets once, after a first call on it succeeded: its name
//! (`CLIENT SETNAME`, so operators find it in `CLIENT LIST`), and, when someone listens, a
//! look at the server's eviction policy (`INFO memory`), with a warning when it may evict
//! leases. Both are advice: refused by an ACL or failed, they are skipped with a debug note,
//! and the call that got here is never delayed or failed by either.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redis::Value;
use serde_json::Value as Json;

use super::{parse, Link};
use crate::core::error::Error;
use crate::core::lock;
use crate::core::log::{Level, Logger, Notice};

/// The `code` field of the eviction-policy warning (and of Node's `process.emitWarning`).
pub const EVICTION_WARNING_CODE: &str = "MASTRA_LEASE_EVICTION_POLICY";

const SKIPPED: &str = "mastra-lease: could not name the connection (CLIENT SETNAME) or read the \
                       Redis eviction policy (INFO memory); skipped";

pub(super) struct Setup {
    /// Where notices go, shared with the connections opened beside this one.
    warnings: Arc<Warnings>,
    /// Set while the connection in use has not been set up: at first, and whenever an
    /// error means the manager replaces the connection.
    pub(super) fresh: AtomicBool,
}

/// The logger, and the policies already warned about (one warning per policy value), of a
/// connection and of those opened beside it ([`Setup::beside`]): one server, one warning.
#[derive(Default)]
struct Warnings {
    logger: OnceLock<Arc<dyn Logger>>,
    warned: Mutex<Vec<String>>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            warnings: Arc::default(),
            fresh: AtomicBool::new(true),
        }
    }
}

impl Setup {
    /// The setup of another connection to the same server: its own to do, the logger and the
    /// warnings already given shared with this one.
    pub(super) fn beside(&self) -> Self {
        Self {
            warnings: self.warnings.clone(),
            fresh: AtomicBool::new(true),
        }
    }

    /// Where notices go from now on; the first logger set stays.
    pub(super) fn set_logger(&self, logger: Arc<dyn Logger>) {
        let _ = self.warnings.logger.set(logger);
    }

    fn logger(&self) -> Option<&Arc<dyn Logger>> {
        self.warnings.logger.get()
    }

    /// Whether the connection in use still needs setting up, claimed by the caller that
    /// gets `true`. A plain load first: calls on a set-up connection only read the flag.
    pub(super) fn claim(&self, named: bool) -> bool {
        if !self.fresh.load(Ordering::Relaxed) {
            return false;
        }
        (named || self.logger().is_some()) && self.fresh.swap(false, Ordering::Relaxed)
    }

    /// Reports `notice` to the logger, if one is set.
    pub(super) fn notice(&self, notice: Notice) {
        if let Some(logger) = self.logger() {
            logger.log(notice);
        }
    }

    /// The connection in use is being replaced: set up the next one.
    pub(super) fn renew(&self) {
        self.fresh.store(true, Ordering::Relaxed);
    }

    /// Names `link` and reads the eviction policy, in a task of its own: on a cluster, on
    /// every master.
    pub(super) fn spawn(self: &Arc<Self>, mut link: Link, name: Option<&str>, timeout: Duration) {
        let logger = self.logger().cloned();
        let name = name.map(str::to_owned);
        let setup = Arc::clone(self);
        tokio::spawn(async move {
            let replies = async {
                let mut named = Vec::new();
                if let Some(name) = &name {
                    let mut setname = redis::cmd("CLIENT");
                    setname.arg("SETNAME").arg(name);
                    named = link.on_every_master(&setname).await?;
                }
                let mut policies = Vec::new();
                if logger.is_some() {
                    policies = link
                        .on_every_master(redis::cmd("INFO").arg("memory"))
                        .await?;
                }
                Ok::<_, redis::RedisError>((named, policies))
            };
            let error = match tokio::time::timeout(timeout, replies).await {
                Ok(Ok((named, policies))) => {
                    // Each reply answers for itself: a refused name leaves the check standing.
                    let failed = named.iter().chain(&policies).find_map(|reply| match reply {
                        Value::ServerError(err) => Some(err.to_string()),
                        _ => None,
                    });
                    if let Some(logger) = &logger {
                        for text in policies.into_iter().filter_map(|r| parse::<String>(r).ok()) {
                            setup.judge(&text, &**logger);
                        }
                    }
                    match failed {
                        Some(error) => error,
                        None => return,
                    }
                }
                Ok(Err(err)) => {
                    if err.is_unrecoverable_error() || err.is_io_error() {
                        setup.renew();
                    }
                    Error::from_redis(err, timeout).to_string()
                }
                Err(_) => {
                    setup.renew();
                    Error::timeout(timeout).to_string()
                }
            };
            if let Some(logger) = logger {
                logger.log(Notice::new(
                    Level::Debug,
                    SKIPPED,
                    &[("error", Json::from(error))],
                ));
            }
        });
    }

    /// Warns, once per policy value, when `INFO memory` shows a policy that may evict leases.
    fn judge(&self, info: &str, logger: &dyn Logger) {
        let field = |name: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let maxmemory = field("maxmemory").and_then(|v| v.parse::<u64>().ok());
        let (Some(maxmemory), Some(policy)) = (maxmemory, field("maxmemory_policy")) else {
            return;
        };
        let Some(message) = eviction_warning(maxmemory, policy) else {
            return;
        };
        {
            let mut warned = lock(&self.warnings.warned);
            if warned.iter().any(|p| p == policy) {
                return;
            }
            warned.push(policy.to_owned());
        }
        let fields = [
            ("code", Json::from(EVICTION_WARNING_CODE)),
            ("maxmemory", Json::from(maxmemory)),
            ("maxmemoryPolicy", Json::from(policy)),
        ];
        logger.log(Notice::new(Level::Warn, message, &fields));
    }
}

/// The warning for a server that may evict lease keys, or `None` when it never does: only
/// `noeviction` is safe once `maxmemory` is set (0 means no limit).
pub fn eviction_warning(maxmemory: u64, policy: &str) -> Option<String> {
    if maxmemory == 0 || policy == "noeviction" {
        return None;
    }
    let why = if policy.starts_with("volatile-") {
        " (volatile-* policies evict keys that have a TTL, and every lease has one)"
    } else {
        ""
    };
    Some(format!(
        "mastra-lease: Redis may evict lease keys under memory pressure: maxmemory-policy is \
         {policy}{why} with maxmemory {maxmemory}. An evicted lease is free for another owner \
         while its holder still believes it holds it. Set maxmemory-policy noeviction, or keep \
         leases on a Redis of their own."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Collect(Mutex<Vec<Notice>>);

    impl Logger for Collect {
        fn log(&self, notice: Notice) {
            self.0.lock().unwrap().push(notice);
        }
    }

    fn info(maxmemory: u64, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:1024\r\nmaxmemory:{maxmemory}\r\nmaxmemory_human:x\r\n\
             maxmemory_policy:{policy}\r\nmem_allocator:jemalloc\r\n"
        )
    }

    #[test]
    fn only_noeviction_or_no_limit_is_safe() {
        assert_eq!(eviction_warning(0, "allkeys-lru"), None);
        assert_eq!(eviction_warning(1 << 20, "noeviction"), None);
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-ttl",
        ] {
            let message = eviction_warning(1 << 20, policy).unwrap();
            assert!(message.contains(policy), "{message}");
        }
        assert!(eviction_warning(1, "volatile-lru")
            .unwrap()
            .contains("every lease has one"));
        assert!(!eviction_warning(1, "allkeys-lru")
            .unwrap()
            .contains("every lease has one"));
    }

    #[test]
    fn warns_once_per_policy_from_info_memory() {
        let check = Setup::default();
        let logger = Collect::default();
        check.judge(&info(0, "allkeys-lru"), &logger);
        check.judge(&info(100, "noeviction"), &logger);
        check.judge("# Memory\r\nmaxmemory_human:0B\r\n", &logger);
        assert!(logger.0.lock().unwrap().is_empty());
        check.judge(&info(100, "allkeys-lru"), &logger);
        check.judge(&info(200, "allkeys-lru"), &logger);
        check.judge(&info(100, "volatile-lru"), &logger);
        let notices = logger.0.lock().unwrap();
        let policies: Vec<_> = notices
            .iter()
            .map(|n| (n.level, n.fields["maxmemoryPolicy"].clone()))
            .collect();
        assert_eq!(
            policies,
            [
                (Level::Warn, Json::from("allkeys-lru")),
                (Level::Warn, Json::from("volatile-lru"))
            ]
        );
        assert_eq!(notices[0].fields["maxmemory"], Json::from(100));
        assert_eq!(notices[0].fields["code"], Json::from(EVICTION_WARNING_CODE));
    }

    #[test]
    fn a_connection_beside_another_shares_its_logger_and_warns_about_a_policy_only_once() {
        let first = Setup::default();
        let beside = first.beside();
        let logger = Arc::new(Collect::default());
        first.set_logger(logger.clone());
        assert!(
            beside.logger().is_some(),
            "the logger set on one is the other's"
        );
        // Each has its own connection to set up.
        assert!(first.claim(false));
        assert!(beside.claim(false));
        beside.judge(&info(100, "allkeys-lru"), &*logger);
        first.judge(&info(100, "allkeys-lru"), &*logger);
        first.judge(&info(100, "volatile-lru"), &*logger);
        beside.judge(&info(100, "volatile-lru"), &*logger);
        assert_eq!(logger.0.lock().unwrap().len(), 2);
    }
}
