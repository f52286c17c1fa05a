//! The option interfaces `src/shell/native.d.ts` documents, each declared once. These structs
//! exist only for napi-rs to write them out (the options are read by hand, in `reader.rs`);
//! the option-set test in `tests.rs` holds each one's fields against what the reader reads.

use napi_derive::napi;

use crate::glue::js::Value;

/// Declares an options interface: the `#[napi(object)]` struct napi-rs writes into
/// `src/shell/native.d.ts`, never converted (the reader reads the raw object). `with connection` puts
/// the connection block first and `with limits` the lease limits last, so the options
/// several classes share are written, and documented, once. Docs inside it are spelt
/// `#[doc = "..."]`: a `///` comment that goes through `macro_rules!` reaches napi-rs as a
/// raw string, which it copies into `native.d.ts` with its `r"`.
macro_rules! options {
    (
        $(#[$($attr:tt)*])*
        pub struct $name:ident with connection $(, $block:ident)* { $($fields:tt)* }
    ) => {
        options! {
            $(#[$($attr)*])*
            pub struct $name with $($block),* {
                #[doc = " `redis://[user:pass@]host[:port][/db]`, `rediss://` for TLS, or"]
                #[doc = " `redis+unix:///path/to.sock` (also `unix:///path`). Default"]
                #[doc = " `redis://127.0.0.1:6379`."]
                pub url: Option<String>,
                #[doc = " node-redis client options, as Mastra's backend takes them: `url`,"]
                #[doc = " `username`, `password`, `database`, `name`, and in `socket` `tls`,"]
                #[doc = " `connectTimeout`, `noDelay`, `keepAlive`, `keepAliveInitialDelay`. Any"]
                #[doc = " other field throws."]
                #[napi(ts_type = "RedisClientOptions")]
                pub redis_options: Option<RedisClientOptions>,
                #[doc = " A Redis Cluster instead of one server: `{ nodes, username?, password?"]
                #[doc = " }`, seed node URLs (`redis://host:port`, `rediss://` with `tls`), or"]
                #[doc = " node-redis' `{ rootNodes, defaults }`. Leases, their fencing tokens and"]
                #[doc = " each topic's stream are spread over the masters by hash slot. Not with"]
                #[doc = " `url`."]
                #[napi(ts_type = "ClusterOptions | NodeRedisClusterOptions")]
                pub cluster: Option<Value>,
                #[doc = " The master behind Redis Sentinel instead of one server: `{ nodes,"]
                #[doc = " masterName, username?, password?, database? }`: the sentinels' URLs"]
                #[doc = " (their own credentials in the URLs; `rediss://` for TLS to them and to"]
                #[doc = " the master), the name they monitor the master by, and the master's"]
                #[doc = " credentials. A failover is followed without a restart. Not with `url`."]
                #[napi(ts_type = "SentinelOptions")]
                pub sentinel: Option<Value>,
                #[doc = " Failover-safe grants: a lease write that grants or moves a lease"]
                #[doc = " (acquire, renew, transfer) is answered only once this many replicas"]
                #[doc = " confirmed it (`WAIT`, on a connection of its own, so nothing else waits"]
                #[doc = " for it); fewer within `replicaTimeoutMs` reject it with"]
                #[doc = " `ERR_LEASE_REPLICATION`. Default 0 (off)."]
                pub min_replicas: Option<u32>,
                #[doc = " How long to wait for `minReplicas` confirmations, in milliseconds;"]
                #[doc = " shorter than `commandTimeoutMs`. Default 1000, or half"]
                #[doc = " `commandTimeoutMs` when that is shorter."]
                pub replica_timeout_ms: Option<f64>,
                #[doc = " CA, client certificate and key for a `rediss://` URL, for every"]
                #[doc = " connection. Default: none (the platform's roots)."]
                #[napi(ts_type = "TlsOptions")]
                pub tls: Option<TlsOptions>,
                #[doc = " The name every connection gets (`CLIENT SETNAME`), to find them in"]
                #[doc = " `CLIENT LIST`. Default `mastra-lease`."]
                pub connection_name: Option<String>,
                #[doc = " Bound on one attempt to open a connection, in milliseconds (node-redis'"]
                #[doc = " `redisOptions.socket.connectTimeout`). Default 2000."]
                pub connect_timeout_ms: Option<f64>,
                #[doc = " Bound on every command but the streams' blocking reads (every lease"]
                #[doc = " call, publish, ack), connecting included, in milliseconds: each settles"]
                #[doc = " within it whatever Redis does. Default 2000 (well under Mastra's 5 s"]
                #[doc = " renewal interval)."]
                pub command_timeout_ms: Option<f64>,
                $($fields)*
            }
        }
    };
    ($(#[$($attr:tt)*])* pub struct $name:ident with limits { $($fields:tt)* }) => {
        options! {
            $(#[$($attr)*])*
            pub struct $name {
                $($fields)*
                #[doc = " Longest lease key accepted, in UTF-8 bytes (for `RedisStreamsPubSub`,"]
                #[doc = " also the longest topic or group name). Default 4096."]
                pub max_key_bytes: Option<u32>,
                #[doc = " Longest lease owner accepted, in UTF-8 bytes. Default 1024."]
                pub max_owner_bytes: Option<u32>,
                #[doc = " Longest lease metadata accepted, in UTF-8 bytes. Default 4096."]
                pub max_metadata_bytes: Option<u32>,
                #[doc = " Longest lease TTL accepted, in milliseconds. Default 86 400 000 (one"]
                #[doc = " day)."]
                pub max_ttl_ms: Option<f64>,
            }
        }
    };
    ($(#[$($attr:tt)*])* pub struct $name:ident { $($fields:tt)* }) => {
        $(#[$($attr)*])*
        #[napi(object, object_from_js = false, object_to_js = false)]
        pub struct $name {
            $($fields)*
        }
    };
}

options! {
    #[doc = " Options of `new MemoryLeaseProvider(options?)`."]
    pub struct MemoryLeaseProviderOptions with limits {
        #[doc = " The clock the leases' time follows: a function answering milliseconds (from"]
        #[doc = " any origin), read at each lease call and each sweep, and once here. Give"]
        #[doc = " `() => Date.now()` for leases to expire with a test's fake clock (vitest's and"]
        #[doc = " Jest's fake timers move `Date`). Only its steps forward count: a reading below"]
        #[doc = " the last moves nothing, so a clock set back never brings a lease back nor keeps"]
        #[doc = " one longer. A reading that is not a finite number, or a clock that throws,"]
        #[doc = " rejects the call (throws here) with `ERR_LEASE_INVALID_OPTION` and changes"]
        #[doc = " nothing. Default: a monotonic clock of the table's own, which no fake moves."]
        #[napi(ts_type = "() => number")]
        pub clock: Option<Value>,
    }
}

/// TLS material for a `rediss://` URL (option `tls`), each a PEM string or `Buffer`. Without
/// it, the server certificate is verified against the platform's roots and the file named
/// by `SSL_CERT_FILE`. Checked at construction: unparsable PEM, a `cert` without its `key`
/// (or the reverse), a key that is not the certificate's, or `tls` with a URL that is not
/// `rediss://` throw `ERR_LEASE_INVALID_OPTION`; no message repeats the material.
///
/// The server certificate is always verified against the URL's host: reach the server by
/// the name on its certificate (a DNS or hosts entry), not by its IP address, unless the
/// certificate names the IP. (`servername`, to verify against another name, is not
/// supported and is refused.)
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct TlsOptions {
    /// The CA certificates (PEM, one or more) trusted to sign the server's certificate, in
    /// place of the platform's roots.
    #[napi(ts_type = "string | Buffer")]
    pub ca: Option<Vec<u8>>,
    /// The client certificate (PEM, the chain leaf first) for servers with
    /// `tls-auth-clients yes`. Give `key` with it.
    #[napi(ts_type = "string | Buffer")]
    pub cert: Option<Vec<u8>>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1, unencrypted).
    #[napi(ts_type = "string | Buffer")]
    pub key: Option<Vec<u8>>,
}

/// The fields of node-redis client options (Mastra's own backend's `redisOptions`) that
/// mean something here, with the same meaning, so a configuration written for Mastra's
/// backend works unchanged. Any other field is refused by name.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisClientOptions {
    /// As `url`; give one of the two (the same URL in both is accepted).
    pub url: Option<String>,
    /// The ACL user, in place of one in the URL.
    pub username: Option<String>,
    /// The password, in place of one in the URL.
    pub password: Option<String>,
    /// The database number, in place of one in the URL.
    pub database: Option<u32>,
    /// The connection name, as `connectionName`.
    pub name: Option<String>,
    /// node-redis' socket options: `tls: true` for TLS with a `redis://` URL (as
    /// `rediss://`); `connectTimeout`, as `connectTimeoutMs` (both given must agree);
    /// `noDelay` (`TCP_NODELAY`, default true); `keepAlive` (TCP keepalive probes: `true`,
    /// `false`, or node-redis 4's delay in milliseconds; default on after 5000 ms) and
    /// `keepAliveInitialDelay` (node-redis 5's delay beside `keepAlive: true`).
    /// `reconnectStrategy: false` is what this client does; a delay or a function is refused:
    /// there is no reconnection loop to pace (the next call opens a broken connection again;
    /// every call settles within `commandTimeoutMs`). Any other field is refused by name.
    #[napi(ts_type = "RedisSocketOptions")]
    pub socket: Option<RedisSocketOptions>,
}

/// `redisOptions.socket`: the fields of node-redis' socket options that mean something
/// here. Any other field is refused by name.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisSocketOptions {
    /// `true` for TLS with a `redis://` URL (as `rediss://`); the certificates go in the
    /// `tls` option.
    pub tls: Option<bool>,
    /// As `connectTimeoutMs` (both given must agree).
    pub connect_timeout: Option<f64>,
    /// `TCP_NODELAY`. Default true.
    pub no_delay: Option<bool>,
    /// TCP keepalive probes: `true`, `false`, or node-redis 4's delay in milliseconds.
    /// Default on after 5000 ms.
    #[napi(ts_type = "boolean | number")]
    pub keep_alive: Option<Value>,
    /// node-redis 5's delay beside `keepAlive: true`, in milliseconds.
    pub keep_alive_initial_delay: Option<f64>,
    /// `false` only, what this client does: no reconnection loop runs in the background (the
    /// next call opens a broken connection again, and every call settles within
    /// `commandTimeoutMs`). A delay or a function, which would pace such a loop, is refused.
    #[napi(ts_type = "false")]
    pub reconnect_strategy: Option<bool>,
}

/// `cluster`: a Redis Cluster, found through any of its nodes.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct ClusterOptions {
    /// Seed node URLs, `redis://[user:pass@]host:port` or `rediss://`; every node takes the
    /// same credentials.
    pub nodes: Vec<String>,
    /// The ACL user of the nodes, in place of one in the URLs.
    pub username: Option<String>,
    /// The nodes' password, in place of one in the URLs.
    pub password: Option<String>,
}

/// `cluster` in node-redis' shape (`createCluster`'s options), as Mastra's own backend takes
/// it: the same as `ClusterOptions`. A root node's `socket` or credentials, any other field of
/// `defaults`, and `useReplicas: true` are refused by name.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct NodeRedisClusterOptions {
    /// The seed nodes, `[{ url }]`, as `ClusterOptions.nodes`.
    #[napi(ts_type = "Array<NodeRedisRootNode>")]
    pub root_nodes: Vec<NodeRedisRootNode>,
    /// Every node's ACL user and password, as `ClusterOptions.username` and `password`.
    #[napi(ts_type = "NodeRedisClusterDefaults")]
    pub defaults: Option<NodeRedisClusterDefaults>,
    /// `false` only: every call goes to the masters.
    #[napi(ts_type = "false")]
    pub use_replicas: Option<bool>,
}

/// A seed node of `cluster.rootNodes`: its URL, as `ClusterOptions.nodes` takes it.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct NodeRedisRootNode {
    /// `redis://host:port` or `rediss://`; the credentials go in `cluster.defaults`.
    pub url: String,
}

/// `cluster.defaults`: what every node of the cluster takes.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct NodeRedisClusterDefaults {
    /// The nodes' ACL user, as `ClusterOptions.username`.
    pub username: Option<String>,
    /// The nodes' password, as `ClusterOptions.password`.
    pub password: Option<String>,
}

/// `sentinel`: the master that Redis Sentinel monitors under `masterName`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct SentinelOptions {
    /// The sentinels' URLs, `redis://[user:pass@]host:port` (the sentinels' own credentials)
    /// or `rediss://` (TLS to the sentinels and the master, with `tls`).
    pub nodes: Vec<String>,
    /// The name the sentinels monitor the master by.
    pub master_name: String,
    /// The master's ACL user.
    pub username: Option<String>,
    /// The master's password.
    pub password: Option<String>,
    /// The master's database number. Default 0.
    pub database: Option<u32>,
}

/// Options of `listLeases(options?)`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct ListLeasesOptions {
    /// Where to go on from: the `cursor` of the page before. Default: the first page.
    pub cursor: Option<String>,
    /// About how many keys a page scans (1 to 100 000). Default 1000.
    pub count: Option<u32>,
}

options! {
    #[doc = " Options of `new RedisLeaseProvider(options?)`."]
    pub struct RedisLeaseProviderOptions with connection, limits {
        #[doc = " Leases live at `<keyPrefix>:lease:<key>`. Default `mastra:topic`, as in Mastra's"]
        #[doc = " own Redis backend, so both can share a fleet's leases."]
        pub key_prefix: Option<String>,
        #[doc = " Gets the warning when the server's eviction policy could evict leases (any"]
        #[doc = " policy but `noeviction` with `maxmemory` set), once per policy, and debug notes"]
        #[doc = " when it has `debug`. Default: none, and the warning goes to"]
        #[doc = " `process.emitWarning` with code `MASTRA_LEASE_EVICTION_POLICY`."]
        #[napi(
            ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug?(message: string, fields?: Record<string, unknown>): void }"
        )]
        pub logger: Option<Value>,
    }
}

options! {
    #[doc = " Options of `new RedisStreamsPubSub(options?)`. The connection options and lease"]
    #[doc = " limits are those of `RedisLeaseProviderOptions`."]
    pub struct RedisStreamsOptions with connection, limits {
        #[doc = " A topic's stream is `<keyPrefix>:<topic>`, a lease `<keyPrefix>:lease:<key>`."]
        #[doc = " Default `mastra:topic`, Mastra's own layout."]
        pub key_prefix: Option<String>,
        #[doc = " How long one blocking read waits for new entries, in milliseconds. Default 1000."]
        pub block_ms: Option<f64>,
        #[doc = " Most entries one read returns. Default 10."]
        pub batch_count: Option<u32>,
        #[doc = " Streams are trimmed to about this many entries, never cutting one a consumer"]
        #[doc = " group has not settled; 0 disables trimming. Default 10000."]
        pub max_stream_length: Option<f64>,
        #[doc = " Past this many entries trimming cuts unsettled entries after all, each one lost"]
        #[doc = " counted in a warning; 0 never does. Default 10 × `maxStreamLength`."]
        pub hard_max_stream_length: Option<f64>,
        #[doc = " A stream idle this long expires; 0 (the default) never. Every append (publish,"]
        #[doc = " redelivery) and every stream a subscribe makes (again after `clearTopic` too)"]
        #[doc = " sets it again."]
        pub stream_idle_ttl_ms: Option<f64>,
        #[doc = " A nacked or reclaimed event is delivered again until its `deliveryAttempt`"]
        #[doc = " reaches this, then dropped with a warning; `Infinity` redelivers forever, and so"]
        #[doc = " does 0 (as Mastra's backend takes it), with a warning once per instance (code"]
        #[doc = " `MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS`). Default 5."]
        pub max_delivery_attempts: Option<f64>,
        #[doc = " Most events a consumer holds unsettled (this process's consumer of a group on a"]
        #[doc = " topic, or one fan-out subscription); at the limit it reads no more, and the rest"]
        #[doc = " of a backlog stays for the group's other consumers. 0 or `Infinity` set no"]
        #[doc = " limit. Default 1000."]
        pub max_in_flight: Option<f64>,
        #[doc = " An event held unsettled this long (its callback neither acked nor nacked it) is"]
        #[doc = " nacked on its behalf, with a warning: Mastra's `inFlightTimeoutMs`. The"]
        #[doc = " callback's `extend()` makes it count again from then. 0 (the default) holds it"]
        #[doc = " until it is settled or the process ends."]
        pub in_flight_timeout_ms: Option<f64>,
        #[doc = " How often a consumer group looks for entries a dead consumer never settled"]
        #[doc = " (XAUTOCLAIM), in milliseconds; 0 disables it. Default 30000."]
        pub reclaim_interval_ms: Option<f64>,
        #[doc = " How long a dead consumer's entry sits unclaimed before it is reclaimed, in"]
        #[doc = " milliseconds. Default 60000. A live process keeps the entries it holds claimed,"]
        #[doc = " however long their handlers run."]
        pub reclaim_idle_ms: Option<f64>,
        #[doc = " Gets dropped-event warnings, connection trouble (at most once per 30 s), events"]
        #[doc = " held unusually long, the eviction-policy warning, the `maxDeliveryAttempts: 0`"]
        #[doc = " warning, and debug notes when it has `debug`. Without it, the eviction-policy"]
        #[doc = " and `maxDeliveryAttempts: 0` warnings go to `process.emitWarning`."]
        #[napi(
            ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug?(message: string, fields?: Record<string, unknown>): void }"
        )]
        pub logger: Option<Value>,
    }
}
