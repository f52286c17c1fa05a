//! Events on the wire: stamping what is published, reading entries back.
//!
//! An entry is `XADD <keyPrefix>:<topic> * event <json>`: one field, `event`, holding the
//! event as JSON, the layout Mastra's own Redis Streams backend writes and reads. The JSON
//! carries `id` (a random UUID), `createdAt` (an ISO 8601 UTC string, what `JSON.stringify`
//! makes of a `Date`) and `deliveryAttempt` (1 on publish, one more on each redelivery).

use std::time::{SystemTime, UNIX_EPOCH};

use redis::Value;
use serde_json::{Map, Value as Json};

use crate::core::error::{InputErrorKind, LeaseError, Result};

/// The stream field that holds the event.
pub(crate) const EVENT_FIELD: &str = "event";

/// Adds `id`, `createdAt` and `deliveryAttempt` to an event and serialises it.
///
/// Like Mastra's backend, `id` and `createdAt` are always assigned here and a
/// `deliveryAttempt` the caller set is kept (a positive integer; anything else becomes 1).
pub(crate) fn stamp(event: Json) -> Result<(String, String)> {
    let Json::Object(mut fields) = event else {
        return Err(LeaseError::streams_argument(
            InputErrorKind::Type,
            "event must be a JSON object",
        ));
    };
    let id = uuid_v4()?;
    let attempt = attempt_of(&fields);
    fields.insert("id".into(), Json::String(id.clone()));
    fields.insert("createdAt".into(), Json::String(iso8601_now()));
    fields.insert("deliveryAttempt".into(), Json::from(attempt));
    let json = serde_json::to_string(&Json::Object(fields))
        .map_err(|err| LeaseError::Internal(format!("could not serialise an event: {err}")))?;
    Ok((id, json))
}

/// The `deliveryAttempt` of an event: a positive integer, or 1 when absent or unusable
/// (entries written by other producers may lack it).
pub(crate) fn attempt_of(fields: &Map<String, Json>) -> u64 {
    fields
        .get("deliveryAttempt")
        .and_then(Json::as_u64)
        .filter(|&n| n >= 1)
        .unwrap_or(1)
}

/// The event in `json` with `deliveryAttempt` set to `attempt`, serialised: the payload a
/// redelivery appends to the stream. `id` and `createdAt` stay those of the original.
pub(crate) fn with_attempt(json: &str, attempt: u64) -> Result<String> {
    let mut fields = object(json).ok_or_else(|| {
        LeaseError::Internal("a delivered event is no longer a JSON object".into())
    })?;
    fields.insert("deliveryAttempt".into(), Json::from(attempt));
    serde_json::to_string(&Json::Object(fields))
        .map_err(|err| LeaseError::Internal(format!("could not serialise an event: {err}")))
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
        .map_err(|err| LeaseError::Internal(format!("the system random source failed: {err}")))?;
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

/// Now as `YYYY-MM-DDTHH:MM:SS.mmmZ`, the format `Date.prototype.toJSON` produces, so a
/// JavaScript reader can turn it back into a `Date`.
pub(crate) fn iso8601_now() -> String {
    // A clock before 1970 is a misconfigured machine; the epoch is a harmless stand-in.
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    iso8601(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// Formats milliseconds since the Unix epoch (civil-from-days, proleptic Gregorian).
pub(crate) fn iso8601(ms: u64) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
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

/// Reads the entries of an XREAD / XREADGROUP reply for one stream. A timed-out blocking
/// read answers nil; RESP3 servers answer a map instead of an array of pairs.
pub(crate) fn read_reply(reply: Value) -> Vec<Entry> {
    let streams: Vec<Value> = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|stream| match stream {
                Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs.into_iter().map(|(_, entries)| entries).collect(),
        _ => Vec::new(),
    };
    streams.into_iter().flat_map(entries).collect()
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

/// Reads an entry's `event` field. `None` when the entry is malformed: no `event` field,
/// not UTF-8, not JSON, or JSON that is not an object (an event is always an object). Every
/// delivery goes through here, so only `id` and `deliveryAttempt` are decoded; the text is
/// handed to JavaScript as it is.
pub(crate) fn parse(bytes: Vec<u8>) -> Option<Parsed> {
    let json = String::from_utf8(bytes).ok()?;
    // A struct also deserialises from a JSON array, field by position: rule that out first.
    if !json.trim_start().starts_with('{') {
        return None;
    }
    let (id, attempt) = match serde_json::from_str::<Head>(&json) {
        Ok(head) => (head.id, head.delivery_attempt),
        // Repeated keys, which a struct refuses: read it whole, the last one wins.
        Err(_) => {
            let mut fields = object(&json)?;
            (fields.remove("id"), fields.remove("deliveryAttempt"))
        }
    };
    Some(Parsed {
        id: id.and_then(|id| id.as_str().map(str::to_owned)),
        attempt: attempt
            .and_then(|a| a.as_u64())
            .filter(|&n| n >= 1)
            .unwrap_or(1),
        json,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_matches_javascript_date_to_json() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        // new Date(1700000000123).toJSON()
        assert_eq!(iso8601(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        // A leap day: new Date(Date.UTC(2024, 1, 29, 23, 59, 59, 999)).toJSON()
        assert_eq!(iso8601(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
    }

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
    fn stamping_keeps_a_given_attempt_and_rejects_non_objects() {
        let (id, json) = stamp(serde_json::json!({"type": "t", "deliveryAttempt": 3})).unwrap();
        let back: Json = serde_json::from_str(&json).unwrap();
        assert_eq!(back["id"], Json::String(id));
        assert_eq!(back["deliveryAttempt"], 3);
        assert_eq!(back["type"], "t");
        let (_, json) = stamp(serde_json::json!({"deliveryAttempt": "x"})).unwrap();
        assert_eq!(
            serde_json::from_str::<Json>(&json).unwrap()["deliveryAttempt"],
            1
        );
        let err = stamp(serde_json::json!([1, 2])).unwrap_err();
        assert_eq!(err.code(), "ERR_STREAMS_INVALID_ARGUMENT");
    }

    #[test]
    fn malformed_payloads_do_not_parse() {
        assert!(parse(b"{\"a\":1}".to_vec()).is_some());
        assert!(parse(b"not json".to_vec()).is_none());
        assert!(parse(b"[1]".to_vec()).is_none());
        assert!(parse(vec![0xff, 0xfe]).is_none());
    }
}
