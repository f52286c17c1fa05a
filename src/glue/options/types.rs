//! The option interfaces `index.d.ts` documents: these structs exist only for napi-rs to
//! write them out (the options are read by hand, in `reader.rs`). Keep a field here and its
//! reading there in step.

use napi_derive::napi;

use crate::glue::js::Value;

/// Options of `new MemoryLeaseProvider(options?)`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct MemoryLeaseProviderOptions {
    /// Longest key accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest lease metadata accepted, in UTF-8 bytes. Default 4096.
    pub max_metadata_bytes: Option<u32>,
    /// Longest TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
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
    /// `reconnectStrategy` is refused: there is no reconnection loop to pace or stop (the
    /// next call opens a broken connection again; every call settles within
    /// `commandTimeoutMs`). Any other field is refused by name.
    #[napi(
        ts_type = "{ tls?: boolean; connectTimeout?: number; noDelay?: boolean; keepAlive?: boolean | number; keepAliveInitialDelay?: number }"
    )]
    pub socket: Option<Value>,
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
    #[napi(ts_type = "Array<{ url: string }>")]
    pub root_nodes: Vec<String>,
    /// Every node's ACL user and password, as `ClusterOptions.username` and `password`.
    #[napi(ts_type = "{ username?: string; password?: string }")]
    pub defaults: Option<Value>,
    /// `false` only: every call goes to the masters.
    #[napi(ts_type = "false")]
    pub use_replicas: Option<bool>,
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

/// Options of `new RedisLeaseProvider(options?)`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisLeaseProviderOptions {
    /// `redis://[user:pass@]host[:port][/db]`, `rediss://` for TLS, or
    /// `redis+unix:///path/to.sock` (also `unix:///path`). Default `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// node-redis client options, as Mastra's backend takes them: `url`, `username`,
    /// `password`, `database`, `name`, and in `socket` `tls`, `connectTimeout`, `noDelay`,
    /// `keepAlive`, `keepAliveInitialDelay`. Any other field throws.
    #[napi(ts_type = "RedisClientOptions")]
    pub redis_options: Option<RedisClientOptions>,
    /// A Redis Cluster instead of one server: `{ nodes, username?, password? }`, seed node
    /// URLs (`redis://host:port`, `rediss://` with `tls`), or node-redis' `{ rootNodes,
    /// defaults }`. Leases, their fencing tokens and each topic's stream are spread over the
    /// masters by hash slot. Not with `url`.
    #[napi(ts_type = "ClusterOptions | NodeRedisClusterOptions")]
    pub cluster: Option<Value>,
    /// The master behind Redis Sentinel instead of one server: `{ nodes, masterName,
    /// username?, password?, database? }`: the sentinels' URLs (their own credentials in the
    /// URLs; `rediss://` for TLS to them and to the master), the name they monitor the master
    /// by, and the master's credentials. A failover is followed without a restart. Not with
    /// `url`.
    #[napi(ts_type = "SentinelOptions")]
    pub sentinel: Option<Value>,
    /// Failover-safe grants: a lease write that grants or moves a lease (acquire, renew,
    /// transfer) is answered only once this many replicas confirmed it (`WAIT`, on a
    /// connection of its own, so nothing else waits for it); fewer within `replicaTimeoutMs`
    /// reject it with `ERR_LEASE_REPLICATION`. Default 0 (off).
    pub min_replicas: Option<u32>,
    /// How long to wait for `minReplicas` confirmations, in milliseconds; shorter than
    /// `commandTimeoutMs`. Default 1000, or half `commandTimeoutMs` when that is shorter.
    pub replica_timeout_ms: Option<f64>,
    /// CA, client certificate and key for a `rediss://` URL. Default: none (the platform's
    /// roots).
    #[napi(ts_type = "TlsOptions")]
    pub tls: Option<TlsOptions>,
    /// The name every connection gets (`CLIENT SETNAME`), to find them in `CLIENT LIST`.
    /// Default `mastra-lease`.
    pub connection_name: Option<String>,
    /// Leases live at `<keyPrefix>:lease:<key>`. Default `mastra:topic`, as in Mastra's own
    /// Redis backend, so both can share a fleet's leases.
    pub key_prefix: Option<String>,
    /// Bound on one attempt to open the connection, in milliseconds (node-redis'
    /// `redisOptions.socket.connectTimeout`). Default 2000.
    pub connect_timeout_ms: Option<f64>,
    /// Bound on every call, connecting included, in milliseconds: a call settles within it
    /// whatever Redis does. Default 2000 (well under Mastra's 5 s renewal interval).
    pub command_timeout_ms: Option<f64>,
    /// Longest key accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest lease metadata accepted, in UTF-8 bytes. Default 4096.
    pub max_metadata_bytes: Option<u32>,
    /// Longest TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
    /// Gets the warning when the server's eviction policy could evict leases (any policy
    /// but `noeviction` with `maxmemory` set), once per policy, and debug notes when it has
    /// `debug`. Default: none, and the warning goes to `process.emitWarning` with code
    /// `MASTRA_LEASE_EVICTION_POLICY`.
    #[napi(
        ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug?(message: string, fields?: Record<string, unknown>): void }"
    )]
    pub logger: Option<Value>,
}

/// Options of `new RedisStreamsPubSub(options?)`. The connection options and lease limits
/// are those of `RedisLeaseProviderOptions`.
#[napi(object, object_from_js = false, object_to_js = false)]
pub struct RedisStreamsOptions {
    /// As for `RedisLeaseProviderOptions`. Default `redis://127.0.0.1:6379`.
    pub url: Option<String>,
    /// As for `RedisLeaseProviderOptions`: node-redis client options, as Mastra's backend
    /// takes them.
    #[napi(ts_type = "RedisClientOptions")]
    pub redis_options: Option<RedisClientOptions>,
    /// A Redis Cluster instead of one server: `{ nodes, username?, password? }`, seed node
    /// URLs (`redis://host:port`, `rediss://` with `tls`), or node-redis' `{ rootNodes,
    /// defaults }`. Leases, their fencing tokens and each topic's stream are spread over the
    /// masters by hash slot. Not with `url`.
    #[napi(ts_type = "ClusterOptions | NodeRedisClusterOptions")]
    pub cluster: Option<Value>,
    /// The master behind Redis Sentinel instead of one server: `{ nodes, masterName,
    /// username?, password?, database? }`: the sentinels' URLs (their own credentials in the
    /// URLs; `rediss://` for TLS to them and to the master), the name they monitor the master
    /// by, and the master's credentials. A failover is followed without a restart. Not with
    /// `url`.
    #[napi(ts_type = "SentinelOptions")]
    pub sentinel: Option<Value>,
    /// Failover-safe grants: a lease write that grants or moves a lease (acquire, renew,
    /// transfer) is answered only once this many replicas confirmed it (`WAIT`, on a
    /// connection of its own, so nothing else waits for it); fewer within `replicaTimeoutMs`
    /// reject it with `ERR_LEASE_REPLICATION`. Default 0 (off).
    pub min_replicas: Option<u32>,
    /// How long to wait for `minReplicas` confirmations, in milliseconds; shorter than
    /// `commandTimeoutMs`. Default 1000, or half `commandTimeoutMs` when that is shorter.
    pub replica_timeout_ms: Option<f64>,
    /// CA, client certificate and key for a `rediss://` URL, for every connection. Default:
    /// none (the platform's roots).
    #[napi(ts_type = "TlsOptions")]
    pub tls: Option<TlsOptions>,
    /// The name every connection gets (`CLIENT SETNAME`). Default `mastra-lease`.
    pub connection_name: Option<String>,
    /// A topic's stream is `<keyPrefix>:<topic>`, a lease `<keyPrefix>:lease:<key>`. Default
    /// `mastra:topic`, Mastra's own layout.
    pub key_prefix: Option<String>,
    /// Bound on one attempt to open a connection, in milliseconds (node-redis'
    /// `redisOptions.socket.connectTimeout`). Default 2000.
    pub connect_timeout_ms: Option<f64>,
    /// Bound on every non-blocking command (publish, ack, lease calls), connecting
    /// included, in milliseconds. Default 2000.
    pub command_timeout_ms: Option<f64>,
    /// How long one blocking read waits for new entries, in milliseconds. Default 1000.
    pub block_ms: Option<f64>,
    /// Most entries one read returns. Default 10.
    pub batch_count: Option<u32>,
    /// Streams are trimmed to about this many entries, never cutting one a consumer group
    /// has not settled; 0 disables trimming. Default 10000.
    pub max_stream_length: Option<f64>,
    /// Past this many entries trimming cuts unsettled entries after all, each one lost
    /// counted in a warning; 0 never does. Default 10 × `maxStreamLength`.
    pub hard_max_stream_length: Option<f64>,
    /// A stream idle this long expires; 0 (the default) never. Every append (publish,
    /// redelivery) and every stream a subscribe makes (again after `clearTopic` too) sets it
    /// again.
    pub stream_idle_ttl_ms: Option<f64>,
    /// A nacked or reclaimed event is delivered again until its `deliveryAttempt` reaches
    /// this, then dropped with a warning; `Infinity` redelivers forever, and so does 0 (as
    /// Mastra's backend takes it), with a warning once per instance (code
    /// `MASTRA_LEASE_ZERO_DELIVERY_ATTEMPTS`). Default 5.
    pub max_delivery_attempts: Option<f64>,
    /// Most events a consumer holds unsettled (this process's consumer of a group on a
    /// topic, or one fan-out subscription); at the limit it reads no more, and the rest of a
    /// backlog stays for the group's other consumers. 0 or `Infinity` set no limit. Default
    /// 1000.
    pub max_in_flight: Option<f64>,
    /// An event held unsettled this long (its callback neither acked nor nacked it) is
    /// nacked on its behalf, with a warning: Mastra's `inFlightTimeoutMs`. The callback's
    /// `extend()` makes it count again from then. 0 (the default) holds it until it is
    /// settled or the process ends.
    pub in_flight_timeout_ms: Option<f64>,
    /// How often a consumer group looks for entries a dead consumer never settled
    /// (XAUTOCLAIM), in milliseconds; 0 disables it. Default 30000.
    pub reclaim_interval_ms: Option<f64>,
    /// How long a dead consumer's entry sits unclaimed before it is reclaimed, in
    /// milliseconds. Default 60000. A live process keeps the entries it holds claimed,
    /// however long their handlers run.
    pub reclaim_idle_ms: Option<f64>,
    /// Longest lease key (and topic or group name) accepted, in UTF-8 bytes. Default 4096.
    pub max_key_bytes: Option<u32>,
    /// Longest lease owner accepted, in UTF-8 bytes. Default 1024.
    pub max_owner_bytes: Option<u32>,
    /// Longest lease metadata accepted, in UTF-8 bytes. Default 4096.
    pub max_metadata_bytes: Option<u32>,
    /// Longest lease TTL accepted, in milliseconds. Default 86 400 000 (one day).
    pub max_ttl_ms: Option<f64>,
    /// Gets dropped-event warnings, connection trouble (at most once per 30 s), events held
    /// unusually long, the eviction-policy warning, the `maxDeliveryAttempts: 0` warning, and
    /// debug notes when it has `debug`. Without it, the eviction-policy and
    /// `maxDeliveryAttempts: 0` warnings go to `process.emitWarning`.
    #[napi(
        ts_type = "{ warn(message: string, fields?: Record<string, unknown>): void; debug?(message: string, fields?: Record<string, unknown>): void }"
    )]
    pub logger: Option<Value>,
}
