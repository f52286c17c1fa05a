//! The core's one error type. Each variant has a stable `code` that the Node glue puts on
//! the JavaScript error (a bad lease argument one per argument: key, owner, metadata, TTL),
//! and a kind that chooses between `TypeError`, `RangeError` and `Error`.

use std::sync::Arc;
use std::time::Duration;

/// Everything a call into the core can fail with: a lease operation, a publish, a subscribe.
///
/// "Not the owner" is never an error: it is a result (`false`, `{ acquired: false }`).
/// These are the failures: bad input, a closed object, Redis not answering or refusing
/// (credentials, a command it lacks, too few replicas confirming a grant), or a bug here.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An argument of a lease call is unusable; nothing was sent anywhere.
    #[error("{message}")]
    InvalidArgument {
        /// Which argument: `key`, an owner, a holder's metadata or `ttlMs`.
        argument: Argument,
        /// `TypeError` when the value has the wrong type, `RangeError` when it is out of range.
        kind: InputErrorKind,
        /// A sentence naming the argument and what was wrong with it.
        message: String,
    },
    /// A constructor option is unusable.
    #[error("{message}")]
    InvalidOption {
        /// `TypeError` or `RangeError`, as for arguments.
        kind: InputErrorKind,
        /// A sentence naming the option and what was wrong with it.
        message: String,
    },
    /// An argument of an event-transport call is unusable (an event that is not a JSON
    /// object, an empty group name); nothing was sent anywhere.
    #[error("{message}")]
    InvalidStreamsArgument {
        /// `TypeError` or `RangeError`, as for lease arguments.
        kind: InputErrorKind,
        /// A sentence naming the argument and what was wrong with it.
        message: String,
    },
    /// `close()` was called on the named object; it takes no more calls.
    #[error("{}", .0.closed())]
    Closed(Subject),
    /// Redis did not answer within `commandTimeoutMs`, at the place named (see [`At`]).
    #[error("Redis{} did not answer within {} ms", .1, .0.as_millis())]
    Timeout(Duration, At),
    /// [`Error::Timeout`] over TLS before anything was ever answered: a server without TLS
    /// on that port waits for a command and never answers the handshake, which redis-rs
    /// cannot tell from a slow server, so the likely cause is named.
    #[error(
        "Redis{} did not answer within {} ms, and nothing has answered over TLS yet: a \
         rediss:// URL for a server without TLS on that port waits like this (is it redis:// \
         instead?)",
        .1,
        .0.as_millis()
    )]
    TlsTimeout(Duration, At),
    /// What answered at the address is not a Redis server: its reply is not Redis protocol
    /// (RESP). The parser's own words (a byte offset, an unexpected byte) are left out: they
    /// help nobody find the wrong URL.
    #[error(
        "the server does not speak Redis protocol (RESP): whatever listens at that address is \
         not Redis, or not Redis alone"
    )]
    Protocol,
    /// Redis could not be reached, or the connection broke during the call; where it was
    /// sought, when the connection that met it is known ([`Error::at`]).
    #[error("cannot reach Redis{1}: {0}")]
    Connection(#[source] redis::RedisError, At),
    /// Redis refused the credentials or the ACL user may not run the command.
    #[error("Redis refused access: {0}")]
    Auth(#[source] redis::RedisError),
    /// A write that grants or moves a lease ran on the master, but fewer replicas than
    /// `minReplicas` confirmed it within `replicaTimeoutMs`, or before the lease's TTL ran
    /// out (`WAIT`): a failover could forget it, or it expired unconfirmed and another owner
    /// may hold the key, so it is not reported as granted.
    #[error(
        "{confirmed} of the {wanted} replicas asked for confirmed the write in time; a failover \
         could forget it"
    )]
    Replication { wanted: u32, confirmed: u32 },
    /// The server does not run a command: renamed away, left out by a managed service or a
    /// fork, older than the command, or (for `WAIT`) refused to the ACL user. What needs it
    /// cannot work on that server.
    #[error(
        "the Redis server does not run {command} (renamed, left out by the service, older than \
         the command, or refused to this user){}",
        needed_by(command)
    )]
    Unsupported {
        /// The command, as the server named it, in capitals.
        command: String,
        /// The server's own words.
        #[source]
        source: redis::RedisError,
    },
    /// The connection broke after the call was sent, so whether Redis ran it is unknown, and
    /// running it again could not answer as its first run would have: another call on its
    /// key was in flight with it (which of them ran, and in what state each found the lease,
    /// is lost with the replies), or it is a transfer whose lease is no longer with its old
    /// holder (moved by this transfer's first run, or by someone else: on one server nothing
    /// tells which). Read the lease to see where it stands.
    #[error(
        "the connection to Redis broke after the call was sent: whether it took effect is \
         unknown (read the lease to see where it stands)"
    )]
    OutcomeUnknown,
    /// Redis answered with any other error (OOM, WRONGTYPE, READONLY, ...).
    #[error("Redis returned an error: {0}")]
    Server(#[source] redis::RedisError),
    /// A bug in this library (for example a caught panic); never the caller's fault.
    #[error("internal error in mastra-lease: {0}")]
    Internal(String),
}

/// Where a connection error or a timeout happened, as its message names it: the server's host and port,
/// its unix socket, a cluster's seed nodes, the sentinels and the master's name. Never
/// credentials: it is made from addresses alone. Nothing when not known.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct At(Option<Arc<str>>);

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(place) => write!(f, " at {place}"),
            None => Ok(()),
        }
    }
}

/// What a [`Error::Closed`] says was closed, and what was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A `RedisLeaseProvider` or `MemoryLeaseProvider`.
    LeaseProvider,
    /// A `RedisStreamsPubSub`, its lease methods included.
    StreamsPubSub,
    /// A `RedisStreamsPubSub`'s `publish`.
    StreamsPublish,
    /// A `RedisStreamsPubSub`'s `subscribe`.
    StreamsSubscribe,
}

impl Subject {
    /// What a call after `close()` is told.
    fn closed(self) -> &'static str {
        match self {
            Self::LeaseProvider => "the lease provider is closed",
            Self::StreamsPubSub => "the streams pubsub is closed",
            // Mastra's own backend's words follow ours: code written against it matches them.
            Self::StreamsPublish => "the streams pubsub is closed: cannot publish on closed client",
            Self::StreamsSubscribe => {
                "the streams pubsub is closed: cannot subscribe on closed client"
            }
        }
    }
}

/// The argument an [`Error::InvalidArgument`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argument {
    /// The lease key.
    Key,
    /// An owner: `owner`, `fromOwner` or `toOwner`.
    Owner,
    /// A holder's metadata: `metadata`, `fromMetadata` or `toMetadata`.
    Metadata,
    /// The time to live in milliseconds.
    Ttl,
}

/// Whether bad input had the wrong type or a value out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputErrorKind {
    /// Becomes a JavaScript `TypeError`.
    Type,
    /// Becomes a JavaScript `RangeError`.
    Range,
}

/// The JavaScript error class a [`Error`] becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// `TypeError`
    Type,
    /// `RangeError`
    Range,
    /// `Error`
    Error,
}

/// Result of every core operation.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The stable string that becomes `err.code` in JavaScript.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgument { argument, .. } => match argument {
                Argument::Key => "ERR_LEASE_INVALID_KEY",
                Argument::Owner => "ERR_LEASE_INVALID_OWNER",
                Argument::Metadata => "ERR_LEASE_INVALID_METADATA",
                Argument::Ttl => "ERR_LEASE_INVALID_TTL",
            },
            Self::InvalidOption { .. } => "ERR_LEASE_INVALID_OPTION",
            Self::InvalidStreamsArgument { .. } => "ERR_STREAMS_INVALID_ARGUMENT",
            Self::Closed(_) => "ERR_LEASE_CLOSED",
            Self::Timeout(..) | Self::TlsTimeout(..) => "ERR_LEASE_TIMEOUT",
            Self::Protocol => "ERR_LEASE_PROTOCOL",
            Self::Connection(..) => "ERR_LEASE_CONNECTION",
            Self::OutcomeUnknown => "ERR_LEASE_OUTCOME_UNKNOWN",
            Self::Auth(_) => "ERR_LEASE_AUTH",
            Self::Replication { .. } => "ERR_LEASE_REPLICATION",
            Self::Unsupported { .. } => "ERR_LEASE_UNSUPPORTED_COMMAND",
            Self::Server(_) => "ERR_LEASE_REDIS",
            Self::Internal(_) => "ERR_LEASE_INTERNAL",
        }
    }

    /// Whether the call failed in Redis or on the way to it (not for bad input or a closed
    /// object): a failure Mastra swallows, counting a failed `acquireLease` as acquired.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::InvalidArgument { .. }
            | Self::InvalidOption { .. }
            | Self::InvalidStreamsArgument { .. }
            | Self::Closed(_) => false,
            Self::Timeout(..)
            | Self::TlsTimeout(..)
            | Self::Protocol
            | Self::Connection(..)
            | Self::OutcomeUnknown
            | Self::Auth(_)
            | Self::Replication { .. }
            | Self::Unsupported { .. }
            | Self::Server(_)
            | Self::Internal(_) => true,
        }
    }

    /// The JavaScript error class this error becomes.
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::InvalidArgument { kind, .. }
            | Self::InvalidOption { kind, .. }
            | Self::InvalidStreamsArgument { kind, .. } => match kind {
                InputErrorKind::Type => ErrorClass::Type,
                InputErrorKind::Range => ErrorClass::Range,
            },
            _ => ErrorClass::Error,
        }
    }

    /// The message with its whole `source()` chain, so nothing the transport said is lost.
    pub fn full_message(&self) -> String {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = cause.source();
        }
        message
    }

    /// A connection error or a timeout at `place` (see [`At`]); any other error as it is,
    /// and one that already names where it was.
    pub(crate) fn at(self, place: &Arc<str>) -> Self {
        let here = || At(Some(place.clone()));
        match self {
            Self::Connection(err, At(None)) => Self::Connection(err, here()),
            Self::Timeout(after, At(None)) => Self::Timeout(after, here()),
            Self::TlsTimeout(after, At(None)) => Self::TlsTimeout(after, here()),
            other => other,
        }
    }

    /// No answer within `after`, the place not (yet) named.
    pub(crate) fn timeout(after: Duration) -> Self {
        Self::Timeout(after, At::default())
    }

    pub(crate) fn argument(argument: Argument, kind: InputErrorKind, message: String) -> Self {
        Self::InvalidArgument {
            argument,
            kind,
            message,
        }
    }

    pub(crate) fn option(kind: InputErrorKind, message: impl Into<String>) -> Self {
        Self::InvalidOption {
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn streams_argument(kind: InputErrorKind, message: impl Into<String>) -> Self {
        Self::InvalidStreamsArgument {
            kind,
            message: message.into(),
        }
    }

    /// Whether Redis refused the credentials or a permission. redis-rs' cluster client hands
    /// an authentication failure of its first connections over as an I/O error whose detail
    /// is the cause's text, so that text is read too.
    pub(crate) fn is_auth(err: &redis::RedisError) -> bool {
        matches!(err.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
            || matches!(
                err.kind(),
                redis::ErrorKind::AuthenticationFailed
                    | redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
            )
            || err.detail().is_some_and(|detail| {
                ["AuthenticationFailed", "WRONGPASS", "NOAUTH"]
                    .iter()
                    .any(|cause| detail.contains(cause))
            })
    }

    /// The command a server answered it does not know (`unknown command 'X'`, as Redis,
    /// Valkey, KeyDB and Dragonfly word it), in capitals; `None` for any other error. An
    /// unknown command inside a script is not named by the server, so not found here.
    pub(crate) fn is_unknown_command(err: &redis::RedisError) -> Option<String> {
        const SAID: &str = "unknown command ";
        let text = err.to_string();
        let at = text.to_ascii_lowercase().find(SAID)?;
        let named = text[at + SAID.len()..].strip_prefix(['\'', '`'])?;
        let command: String = named
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '|' | '.'))
            .collect();
        (!command.is_empty()).then(|| command.to_ascii_uppercase())
    }

    /// Sorts a redis-rs error into the variant a caller can act on.
    pub(crate) fn from_redis(err: redis::RedisError, timeout: Duration) -> Self {
        if err.is_timeout() {
            return Self::timeout(timeout);
        }
        if Self::is_auth(&err) {
            return Self::Auth(err);
        }
        if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
            return Self::Connection(err, At::default());
        }
        // A server still loading its data after a start runs nothing yet: a connection to a
        // server not ready, not an error of the command's.
        if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading) {
            return Self::Connection(err, At::default());
        }
        if let Some(command) = Self::is_unknown_command(&err) {
            return Self::Unsupported {
                command,
                source: err,
            };
        }
        if matches!(
            err.kind(),
            redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
        ) {
            return Self::Server(err);
        }
        Self::Connection(err, At::default())
    }
}

/// What needs `command`, for the message of an [`Error::Unsupported`].
fn needed_by(command: &str) -> &'static str {
    match command {
        "EVALSHA" => {
            ": every lease call but getLeaseOwner, and the streams' settling, reclaiming and \
             trimming, run a script by its SHA; mastra-lease cannot work on this server"
        }
        "WAIT" => {
            ": minReplicas confirms every grant with it; leave minReplicas off on this server"
        }
        "XAUTOCLAIM" => {
            ": reclaiming what a dead consumer left (Redis 6.2) needs it; set reclaimIntervalMs \
             to 0 on this server"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_password_is_an_auth_error_even_flattened_into_an_io_error() {
        let direct = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "refused"));
        let flattened = redis::RedisError::from((
            redis::ErrorKind::Io,
            "Failed to create initial connections",
            "Io: Password authentication failed - AuthenticationFailed".to_owned(),
        ));
        let unrelated = redis::RedisError::from((
            redis::ErrorKind::Io,
            "Failed to create initial connections",
            "Connection refused (os error 111)".to_owned(),
        ));
        let timeout = Duration::from_secs(1);
        assert!(matches!(Error::from_redis(direct, timeout), Error::Auth(_)));
        assert!(matches!(
            Error::from_redis(flattened, timeout),
            Error::Auth(_)
        ));
        assert!(matches!(
            Error::from_redis(unrelated, timeout),
            Error::Connection(..)
        ));
    }

    /// The error a server's reply line makes, as redis-rs hands it over.
    fn reply(line: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn an_unknown_command_is_named_in_capitals_however_the_server_quotes_it() {
        let timeout = Duration::from_secs(1);
        for (line, command) in [
            // Redis and Valkey 7
            (
                "ERR unknown command 'evalsha', with args beginning with: 'abc' '0' ",
                "EVALSHA",
            ),
            // Redis 6 and KeyDB
            (
                "ERR unknown command `SSUBSCRIBE`, with args beginning with: `k`, ",
                "SSUBSCRIBE",
            ),
            // Dragonfly
            ("ERR unknown command 'WAIT'", "WAIT"),
        ] {
            assert_eq!(
                Error::is_unknown_command(&reply(line)).as_deref(),
                Some(command)
            );
            let err = Error::from_redis(reply(line), timeout);
            assert_eq!(err.code(), "ERR_LEASE_UNSUPPORTED_COMMAND");
            assert!(
                err.full_message().contains(command),
                "{}",
                err.full_message()
            );
        }
        // What needs the command is named with it.
        let wait = Error::from_redis(reply("ERR unknown command 'WAIT'"), timeout);
        assert!(wait.to_string().contains("minReplicas"), "{wait}");
        // Inside a script the server does not name the command: that stays a script error.
        for in_script in [
            "ERR Unknown Redis command called from script script: dd13fa9e, on @user_script:1.",
            // Valkey
            "ERR Unknown command called from script script: on @user_script:1.",
        ] {
            assert_eq!(Error::is_unknown_command(&reply(in_script)), None);
            assert_eq!(
                Error::from_redis(reply(in_script), timeout).code(),
                "ERR_LEASE_REDIS"
            );
        }
        assert_eq!(
            Error::from_redis(reply("WRONGTYPE Operation"), timeout).code(),
            "ERR_LEASE_REDIS"
        );
    }
}
