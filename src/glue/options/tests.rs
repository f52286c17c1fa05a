//! The option-set test: each interface `types.rs` declares names exactly the options its
//! reader takes. A top-level reader is run on no object at all, which reads every option it
//! knows without touching JavaScript; a nested object's reader takes the fields of its table.

use std::collections::BTreeSet;

use super::connection::{CLUSTER, SENTINEL, TLS};
use super::node_redis::{CLUSTER_DEFAULTS, REDIS_OPTIONS, ROOT_NODE, SOCKET};
use super::reader::Options;
use super::types::*;
use super::{
    list_leases_options, memory_options, redis_lease_options, redis_streams_options, Read,
};

/// A declared struct's fields, as JavaScript spells them. The pattern names every field and
/// has no `..`, so this fails to compile when the struct gains or loses a field the list
/// does not.
macro_rules! declared {
    ($ty:ident with connection, limits { $($field:ident),* $(,)? }) => {
        declared!($ty {
            url, redis_options, cluster, sentinel, min_replicas, replica_timeout_ms, tls,
            connection_name, connect_timeout_ms, command_timeout_ms,
            max_key_bytes, max_owner_bytes, max_metadata_bytes, max_ttl_ms,
            $($field),*
        })
    };
    ($ty:ident { $($field:ident),* $(,)? }) => {{
        #[allow(dead_code)]
        fn every_field(options: $ty) {
            let $ty { $($field: _),* } = options;
        }
        [$(camel(stringify!($field))),*].into_iter().collect::<BTreeSet<String>>()
    }};
}

/// napi-rs' name for a field: `snake_case` in camelCase.
fn camel(snake: &str) -> String {
    let mut words = snake.split('_');
    let mut name = words.next().unwrap_or_default().to_owned();
    for word in words {
        let mut letters = word.chars();
        if let Some(first) = letters.next() {
            name.extend(first.to_uppercase());
            name.push_str(letters.as_str());
        }
    }
    name
}

/// What `body` reads of an options object when there is none: every option it knows.
fn read_by<T>(body: fn(&Options) -> Read<T>) -> BTreeSet<String> {
    let Ok(options) = Options::new(std::ptr::null_mut(), None, "test") else {
        panic!("no options object is no options");
    };
    assert!(body(&options).is_ok(), "the defaults are refused");
    options
        .names_read()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

fn table(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

#[track_caller]
fn same(what: &str, declared: BTreeSet<String>, read: BTreeSet<String>) {
    let unread: Vec<_> = declared.difference(&read).collect();
    let undeclared: Vec<_> = read.difference(&declared).collect();
    assert!(
        unread.is_empty() && undeclared.is_empty(),
        "{what}: declared in types.rs but not read: {unread:?}; read but not declared: \
         {undeclared:?}"
    );
}

#[test]
fn every_constructor_declares_the_options_it_reads_and_no_others() {
    same(
        "MemoryLeaseProviderOptions",
        declared!(MemoryLeaseProviderOptions {
            clock,
            max_key_bytes,
            max_owner_bytes,
            max_metadata_bytes,
            max_ttl_ms,
        }),
        read_by(memory_options),
    );
    same(
        "RedisLeaseProviderOptions",
        declared!(RedisLeaseProviderOptions with connection, limits { key_prefix, logger }),
        read_by(redis_lease_options),
    );
    same(
        "RedisStreamsOptions",
        declared!(RedisStreamsOptions with connection, limits {
            key_prefix,
            block_ms,
            batch_count,
            max_stream_length,
            hard_max_stream_length,
            stream_idle_ttl_ms,
            max_delivery_attempts,
            max_in_flight,
            in_flight_timeout_ms,
            reclaim_interval_ms,
            reclaim_idle_ms,
            logger,
        }),
        read_by(redis_streams_options),
    );
    same(
        "ListLeasesOptions",
        declared!(ListLeasesOptions { cursor, count }),
        read_by(list_leases_options),
    );
}

#[test]
fn every_nested_options_object_declares_the_fields_its_reader_takes_and_no_others() {
    same(
        "TlsOptions",
        declared!(TlsOptions { ca, cert, key }),
        table(TLS),
    );
    same(
        "SentinelOptions",
        declared!(SentinelOptions {
            nodes,
            master_name,
            username,
            password,
            database,
        }),
        table(SENTINEL),
    );
    let mut cluster = declared!(ClusterOptions {
        nodes,
        username,
        password
    });
    cluster.extend(declared!(NodeRedisClusterOptions {
        root_nodes,
        defaults,
        use_replicas,
    }));
    same(
        "ClusterOptions | NodeRedisClusterOptions",
        cluster,
        table(CLUSTER),
    );
    same(
        "NodeRedisClusterDefaults",
        declared!(NodeRedisClusterDefaults { username, password }),
        table(CLUSTER_DEFAULTS),
    );
    same(
        "NodeRedisRootNode",
        declared!(NodeRedisRootNode { url }),
        table(ROOT_NODE),
    );
    same(
        "RedisClientOptions",
        declared!(RedisClientOptions {
            url,
            username,
            password,
            database,
            name,
            socket,
        }),
        table(REDIS_OPTIONS),
    );
    same(
        "RedisSocketOptions",
        declared!(RedisSocketOptions {
            tls,
            connect_timeout,
            no_delay,
            keep_alive,
            keep_alive_initial_delay,
            reconnect_strategy,
        }),
        table(SOCKET),
    );
}

#[test]
fn a_field_name_is_spelt_as_napi_spells_it() {
    assert_eq!(camel("url"), "url");
    assert_eq!(camel("keep_alive_initial_delay"), "keepAliveInitialDelay");
}
