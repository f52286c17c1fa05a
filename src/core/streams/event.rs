//! Events on the wire: reading entries back, and the event fields delivery needs.
//!
//! An entry is `XADD <keyPrefix>:<topic> * event <json>`: one field, `event`, holding the
//! event as JSON, the layout Mastra's own Redis Streams backend writes and reads. The JSON
//! carries `id` (a random UUID), `createdAt` (an ISO 8601 UTC string, what `JSON.stringify`
//! makes of a `Date`) and `deliveryAttempt` (1 on publish, one more on each redelivery); the
//! TypeScript shell stamps them.

use std::fmt;

use redis::Value;
use serde_json::{Map, Value as Json};

use crate::core::error::{Error, Result};

/// The stream field that holds the event.
pub(crate) const EVENT_FIELD: &str = "event";

/// The event in `json` with `deliveryAttempt` set to `attempt`, serialised: the payload a
/// redelivery appends to the stream. `id` and `createdAt` stay those of the original.
pub(crate) fn with_attempt(json: &str, attempt: u64) -> Result<String> {
    let mut fields = object(json)
        .ok_or_else(|| Error::Internal("a delivered event is no longer a JSON object".into()))?;
    fields.insert("deliveryAttempt".into(), Json::from(attempt));
    serde_json::to_string(&Json::Object(fields))
        .map_err(|err| Error::Internal(format!("could not serialise an event: {err}")))
}

/// The whole event object in `json`, or `None` when it is not a JSON object.
pub(crate) fn object(json: &str) -> Option<Map<String, Json>> {
    match serde_json::from_str::<Json>(json) {
        Ok(Json::Object(fields)) => Some(fields),
        _ => None,
    }
}

/// A random (version 4) UUID, as `crypto.randomUUID()` formats it.
pub(crate) fn uuid_v4() -> Result<String> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes)
        .map_err(|err| Error::Internal(format!("the system random source failed: {err}")))?;
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let mut out = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push_str(&format!("{byte:02x}"));
    }
    Ok(out)
}

/// One stream entry as read: its stream id, the `event` field (if it had one), and how many
/// times Redis has delivered it to the group (1 for a fresh read; a reclaim's XAUTOCLAIM
/// counts one more each time).
#[derive(Debug)]
pub(crate) struct Entry {
    pub id: String,
    pub event: Option<Vec<u8>>,
    pub deliveries: u64,
}

/// A stream entry id, `<ms>-<seq>`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct EntryId {
    pub ms: u64,
    pub seq: u64,
}

impl EntryId {
    /// `0-0`: before every entry.
    pub const ZERO: Self = Self { ms: 0, seq: 0 };

    /// Parses `<ms>-<seq>` (or a bare `<ms>`, as `<ms>-0`).
    pub fn parse(text: &str) -> Option<Self> {
        let (ms, seq) = text.split_once('-').unwrap_or((text, "0"));
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl EntryId {
    /// The smallest id after this one: where a page that ended here is continued from.
    pub fn next(self) -> Self {
        match self.seq.checked_add(1) {
            Some(seq) => Self { ms: self.ms, seq },
            None => Self {
                ms: self.ms.saturating_add(1),
                seq: 0,
            },
        }
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// Reads the entries of an XREAD / XREADGROUP reply, stream by stream: each stream's key and
/// its entries. A timed-out blocking read answers nil; RESP3 servers answer a map instead of
/// an array of pairs.
pub(crate) fn read_reply(reply: Value) -> Vec<(String, Vec<Entry>)> {
    let streams: Vec<(Value, Value)> = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|stream| match stream {
                Value::Array(pair) if pair.len() == 2 => {
                    let mut pair = pair.into_iter();
                    Some((pair.next()?, pair.next()?))
                }
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs,
        _ => Vec::new(),
    };
    streams
        .into_iter()
        .filter_map(|(key, list)| Some((text(&key)?, entries(list))))
        .collect()
}

/// The entries of an XRANGE / XREVRANGE reply.
pub(crate) fn range_reply(reply: Value) -> Vec<Entry> {
    entries(reply)
}

/// Reads the reply of `reclaim.lua`: the cursor to continue from, the claimed entries, and
/// (aligned with them) how many times Redis has now delivered each. Entries that were
/// trimmed away are not in it: Redis has already removed them from the pending list.
pub(crate) fn reclaim_reply(reply: Value) -> (String, Vec<Entry>) {
    let Value::Array(parts) = reply else {
        return ("0-0".into(), Vec::new());
    };
    let mut parts = parts.into_iter();
    let cursor = parts
        .next()
        .and_then(|c| text(&c))
        .unwrap_or_else(|| "0-0".into());
    let (Some(claimed), Some(Value::Array(counts))) = (parts.next(), parts.next()) else {
        return (cursor, Vec::new());
    };
    let Value::Array(claimed) = claimed else {
        return (cursor, Vec::new());
    };
    // The script returns both lists aligned and without holes; a pair that does not read as
    // an entry is skipped with its count, so the two never drift apart.
    let claimed = claimed
        .into_iter()
        .zip(counts)
        .filter_map(|(entry, count)| {
            let mut entry = one_entry(entry)?;
            entry.deliveries = match count {
                Value::Int(n) => u64::try_from(n).unwrap_or(1).max(1),
                _ => 1,
            };
            Some(entry)
        })
        .collect();
    (cursor, claimed)
}

/// The entries of one stream: `[[id, [field, value, ...]], ...]`. Nil entries (claimed ids
/// whose entry was deleted, on Redis 6.2) are skipped.
fn entries(list: Value) -> Vec<Entry> {
    let Value::Array(list) = list else {
        return Vec::new();
    };
    list.into_iter().filter_map(one_entry).collect()
}

/// One `[id, [field, value, ...]]`, as read for the first time (delivered once).
fn one_entry(entry: Value) -> Option<Entry> {
    let Value::Array(mut parts) = entry else {
        return None;
    };
    if parts.len() != 2 {
        return None;
    }
    let fields = parts.pop()?;
    let id = text(&parts[0])?;
    Some(Entry {
        id,
        event: field(fields, EVENT_FIELD),
        deliveries: 1,
    })
}

fn field(fields: Value, name: &str) -> Option<Vec<u8>> {
    match fields {
        Value::Array(flat) => {
            let mut items = flat.into_iter();
            while let (Some(key), Some(value)) = (items.next(), items.next()) {
                if bytes_eq(&key, name) {
                    return into_bytes(value);
                }
            }
            None
        }
        Value::Map(pairs) => pairs
            .into_iter()
            .find(|(key, _)| bytes_eq(key, name))
            .and_then(|(_, value)| into_bytes(value)),
        _ => None,
    }
}

fn bytes_eq(value: &Value, name: &str) -> bool {
    match value {
        Value::BulkString(bytes) => bytes == name.as_bytes(),
        Value::SimpleString(text) => text == name,
        _ => false,
    }
}

fn into_bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        _ => None,
    }
}

/// A stream id or status reply as text.
pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(text) => Some(text.clone()),
        Value::Okay => Some("OK".into()),
        _ => None,
    }
}

/// A delivery payload: the raw JSON, and the two fields delivery needs from it.
pub(crate) struct Parsed {
    pub json: String,
    /// The event's `id`, when it is a string.
    pub id: Option<String>,
    pub attempt: u64,
}

/// The fields of an event that delivery reads; the rest is skipped, not built.
#[derive(serde::Deserialize)]
struct Head {
    id: Option<Json>,
    #[serde(rename = "deliveryAttempt")]
    delivery_attempt: Option<Json>,
}

/// An event's `deliveryAttempt`: the whole number of at least 1 it carries, else 1 (a
/// fresh event). Read tolerantly: the entry was written by whatever process published it,
/// maybe not ours, and a field we cannot count with must not cost the event (`publish`
/// refuses such a value from its own caller).
fn delivery_attempt(value: Option<&Json>) -> u64 {
    value
        .and_then(Json::as_u64)
        .filter(|&n| n >= 1)
        .unwrap_or(1)
}

/// Reads an entry's `event` field. `None` when the entry is malformed: no `event` field,
/// not UTF-8, not JSON, or JSON that is not an object (an event is always an object). Every
/// delivery goes through here, so only `id` and `deliveryAttempt` are decoded; the text is
/// handed to JavaScript as it is.
pub(crate) fn parse(bytes: Vec<u8>) -> Option<Parsed> {
    let json = String::from_utf8(bytes).ok()?;
    let (id, attempt) = head(&json)?;
    Some(Parsed { json, id, attempt })
}

/// An event's `id` (when a string) and `deliveryAttempt`, read as [`parse`] reads them;
/// `None` when the text is not a JSON object.
pub(crate) fn head(json: &str) -> Option<(Option<String>, u64)> {
    // A struct also deserialises from a JSON array, field by position: rule that out first.
    if !json.trim_start().starts_with('{') {
        return None;
    }
    let (id, attempt) = match serde_json::from_str::<Head>(json) {
        Ok(head) => (head.id, head.delivery_attempt),
        // Repeated keys, which a struct refuses: read it whole, the last one wins.
        Err(_) => {
            let mut fields = object(json)?;
            (fields.remove("id"), fields.remove("deliveryAttempt"))
        }
    };
    let id = id.and_then(|id| id.as_str().map(str::to_owned));
    Some((id, delivery_attempt(attempt.as_ref())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_read_for_its_id_and_attempt_and_must_be_an_object() {
        let read = |text: &str| parse(text.as_bytes().to_vec()).map(|p| (p.id, p.attempt));
        let id = |s: &str| Some(s.to_owned());
        assert_eq!(
            read(r#"{"id":"e1","deliveryAttempt":3,"data":{"deep":[1,{"x":null}]}}"#),
            Some((id("e1"), 3))
        );
        assert_eq!(read(r#" {"type":"t"}"#), Some((None, 1)));
        assert_eq!(read(r#"{"id":7,"deliveryAttempt":0}"#), Some((None, 1)));
        assert_eq!(read(r#"{"deliveryAttempt":2.5}"#), Some((None, 1)));
        // Repeated keys: read whole, the last one wins (as JSON.parse does).
        assert_eq!(
            read(r#"{"id":"a","id":"b","deliveryAttempt":2,"deliveryAttempt":4}"#),
            Some((id("b"), 4))
        );
        for bad in [
            r#"["e1",3]"#,
            r#""text""#,
            "42",
            "null",
            "{",
            "not json",
            "",
        ] {
            assert_eq!(read(bad), None, "{bad}");
        }
        assert_eq!(parse(vec![b'{', 0xff, b'}']).map(|p| p.attempt), None);
    }

    #[test]
    fn uuids_are_version_4_and_distinct() {
        let a = uuid_v4().unwrap();
        let b = uuid_v4().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"));
    }

    #[test]
    fn entry_ids_order_as_redis_orders_them() {
        let id = |text: &str| EntryId::parse(text).unwrap();
        assert!(id("1-2") < id("1-10"));
        assert!(id("9-0") < id("10-0"));
        assert_eq!(id("5"), id("5-0"));
        assert_eq!(id("1700000000123-7").to_string(), "1700000000123-7");
        assert!(EntryId::parse("x-1").is_none());
    }

    #[test]
    fn malformed_payloads_do_not_parse() {
        assert!(parse(b"{\"a\":1}".to_vec()).is_some());
        assert!(parse(b"not json".to_vec()).is_none());
        assert!(parse(b"[1]".to_vec()).is_none());
        assert!(parse(vec![0xff, 0xfe]).is_none());
    }
}
