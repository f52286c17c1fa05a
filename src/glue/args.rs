//! Turning JavaScript arguments into Rust values, rejecting wrong types before any work.
//! Ranges (empty strings, byte caps, TTL bounds) are the core's to check (`Limits`).

use napi::sys::ValueType;

use super::crossing::JsCallback;
use super::js::{self, Env, Value};
use crate::core::lease::Holder;
use crate::core::streams::StartFrom;
use crate::core::{Argument, Call, Error, InputErrorKind, Limits, Result};

/// `acquireLease(key, owner, ttlMs, metadata?)`, or with `fenced` `acquireFencedLease`.
pub fn acquire_lease(
    env: Env,
    [key, owner, ttl_ms, metadata]: [Value; 4],
    fenced: bool,
) -> Result<Call> {
    Ok(Call::Acquire {
        key: self::key(env, key)?,
        holder: holder(env, owner, metadata, ["owner", "metadata"])?,
        ttl_ms: ttl(env, ttl_ms)?,
        fenced,
    })
}

/// `getLeaseOwner(key)`.
pub fn get_lease_owner(env: Env, key: Value) -> Result<Call> {
    Ok(Call::Owner {
        key: self::key(env, key)?,
    })
}

/// `getLease(key)`.
pub fn get_lease(env: Env, key: Value) -> Result<Call> {
    Ok(Call::Lease {
        key: self::key(env, key)?,
    })
}

/// `getLeaseRecord(key)`.
pub fn get_lease_record(env: Env, key: Value) -> Result<Call> {
    Ok(Call::Record {
        key: self::key(env, key)?,
    })
}

/// `releaseLease(key, owner, metadata?)`.
pub fn release_lease(env: Env, [key, owner, metadata]: [Value; 3]) -> Result<Call> {
    Ok(Call::Release {
        key: self::key(env, key)?,
        holder: holder(env, owner, metadata, ["owner", "metadata"])?,
    })
}

/// `renewLease(key, owner, ttlMs, metadata?)`.
pub fn renew_lease(env: Env, [key, owner, ttl_ms, metadata]: [Value; 4]) -> Result<Call> {
    Ok(Call::Renew {
        key: self::key(env, key)?,
        holder: holder(env, owner, metadata, ["owner", "metadata"])?,
        ttl_ms: ttl(env, ttl_ms)?,
    })
}

/// `transferLease(key, fromOwner, toOwner, ttlMs, fromMetadata?, toMetadata?)`.
pub fn transfer_lease(
    env: Env,
    [key, from, to, ttl_ms, from_metadata, to_metadata]: [Value; 6],
) -> Result<Call> {
    Ok(Call::Transfer {
        key: self::key(env, key)?,
        from: holder(env, from, from_metadata, ["fromOwner", "fromMetadata"])?,
        to: holder(env, to, to_metadata, ["toOwner", "toMetadata"])?,
        ttl_ms: ttl(env, ttl_ms)?,
    })
}

/// An owner and its metadata (`names`: theirs, in errors); the metadata may be left out
/// (`undefined`), and is otherwise a string of well-formed UTF-16.
fn holder(env: Env, owner: Value, metadata: Value, names: [&str; 2]) -> Result<Holder> {
    let owner = self::owner(env, owner, names[0])?;
    let metadata = match js::type_of(env, metadata) {
        ValueType::napi_undefined => None,
        _ => Some(text(env, metadata, names[1], Argument::Metadata)?),
    };
    Ok(Holder { owner, metadata })
}

/// A key: a string of well-formed UTF-16.
pub fn key(env: Env, value: Value) -> Result<String> {
    text(env, value, "key", Argument::Key)
}

/// A function the runtime calls with no arguments (`name` says which, in errors).
pub fn callback(env: Env, value: Value, name: &str) -> Result<JsCallback<()>> {
    if js::type_of(env, value) != ValueType::napi_function {
        return Err(Error::option(
            InputErrorKind::Type,
            format!("{name} must be a function"),
        ));
    }
    JsCallback::new(env, value, |_, ()| Vec::new()).map_err(|err| Error::Internal(err.reason))
}

/// An owner (`owner`, `fromOwner` or `toOwner`): a string of well-formed UTF-16.
pub fn owner(env: Env, value: Value, name: &str) -> Result<String> {
    text(env, value, name, Argument::Owner)
}

/// A topic or group name: a string of well-formed UTF-16, not empty, at most the lease
/// key limit in UTF-8 bytes (`name` says which, in errors).
pub fn stream_name(env: Env, value: Value, name: &str, limits: &Limits) -> Result<String> {
    let invalid = |kind, message: String| Error::streams_argument(kind, message);
    let kind = js::type_of(env, value);
    if kind != ValueType::napi_string {
        return Err(invalid(
            InputErrorKind::Type,
            format!("{name} must be a string, got {}", type_name(kind)),
        ));
    }
    let text = js::string_value(env, value).map_err(|_| {
        invalid(
            InputErrorKind::Type,
            format!("{name} must be well-formed UTF-16 (it contains a lone surrogate)"),
        )
    })?;
    if text.is_empty() || text.len() > limits.max_key_bytes {
        return Err(invalid(
            InputErrorKind::Range,
            format!(
                "{name} must be 1 to {} UTF-8 bytes long, got {}",
                limits.max_key_bytes,
                text.len()
            ),
        ));
    }
    Ok(text)
}

/// `trimTopic`'s `producedBefore` as the shell hands it: epoch milliseconds (a `Date` made a
/// number), or left out. Whether the number is finite is the core's check.
pub fn produced_before(env: Env, value: Value) -> Result<Option<f64>> {
    match js::type_of(env, value) {
        ValueType::napi_undefined | ValueType::napi_null => Ok(None),
        ValueType::napi_number => Ok(Some(js::number(env, value))),
        kind => Err(Error::streams_argument(
            InputErrorKind::Type,
            format!(
                "producedBefore must be a number of milliseconds or a Date, got {}",
                type_name(kind)
            ),
        )),
    }
}

/// `startFrom`: `'earliest'` (also when left out) or `'latest'`.
pub fn start_from(env: Env, value: Value) -> Result<StartFrom> {
    let kind = js::type_of(env, value);
    if matches!(kind, ValueType::napi_undefined | ValueType::napi_null) {
        return Ok(StartFrom::Earliest);
    }
    let text = (kind == ValueType::napi_string)
        .then(|| js::string_value(env, value).ok())
        .flatten();
    match text.as_deref() {
        Some("earliest") => Ok(StartFrom::Earliest),
        Some("latest") => Ok(StartFrom::Latest),
        _ => Err(Error::streams_argument(
            if kind == ValueType::napi_string {
                InputErrorKind::Range
            } else {
                InputErrorKind::Type
            },
            format!(
                "startFrom must be 'earliest' or 'latest', got {}",
                text.map_or_else(|| type_name(kind).to_owned(), |t| format!("{t:?}"))
            ),
        )),
    }
}

/// A TTL: a number that is a safe integer and at least 1 (the upper bound is `Limits`').
pub fn ttl(env: Env, value: Value) -> Result<u64> {
    let Some(ms) = js::number_checked(env, value) else {
        return Err(Error::argument(
            Argument::Ttl,
            InputErrorKind::Type,
            format!(
                "ttlMs must be a number of milliseconds, got {}",
                type_name(js::type_of(env, value))
            ),
        ));
    };
    safe_integer(ms).filter(|&ms| ms >= 1).ok_or_else(|| {
        Error::argument(
            Argument::Ttl,
            InputErrorKind::Range,
            format!("ttlMs must be a whole number of milliseconds of at least 1, got {ms}"),
        )
    })
}

/// `Some(n)` when `value` is an integer within JavaScript's safe range and not negative.
pub fn safe_integer(value: f64) -> Option<u64> {
    const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;
    (value.is_finite() && value.fract() == 0.0 && (0.0..=MAX_SAFE_INTEGER).contains(&value))
        .then_some(value as u64)
}

fn text(env: Env, value: Value, name: &str, argument: Argument) -> Result<String> {
    js::string_value(env, value).map_err(|err| not_text(env, value, name, argument, err))
}

/// Why `value` is no `text`, as the error `name`'s caller gets.
#[cold]
fn not_text(env: Env, value: Value, name: &str, argument: Argument, err: js::StringError) -> Error {
    match err {
        js::StringError::NotString => Error::argument(
            argument,
            InputErrorKind::Type,
            format!(
                "{name} must be a string, got {}",
                type_name(js::type_of(env, value))
            ),
        ),
        js::StringError::Unreadable => {
            Error::Internal(format!("could not read the {name} string from JavaScript"))
        }
        js::StringError::LoneSurrogate => Error::argument(
            argument,
            InputErrorKind::Type,
            format!("{name} must be well-formed UTF-16 (it contains a lone surrogate)"),
        ),
    }
}

/// The name `typeof` gives a value's type.
pub fn type_name(kind: napi::sys::napi_valuetype) -> &'static str {
    match kind {
        ValueType::napi_undefined => "undefined",
        ValueType::napi_null => "null",
        ValueType::napi_boolean => "boolean",
        ValueType::napi_number => "number",
        ValueType::napi_string => "string",
        ValueType::napi_symbol => "symbol",
        ValueType::napi_object => "object",
        ValueType::napi_function => "function",
        ValueType::napi_bigint => "bigint",
        _ => "an unsupported value",
    }
}

#[cfg(test)]
mod tests {
    use super::safe_integer;

    #[test]
    fn only_non_negative_safe_integers_pass() {
        assert_eq!(safe_integer(15_000.0), Some(15_000));
        assert_eq!(safe_integer(0.0), Some(0));
        assert_eq!(safe_integer(1.5), None);
        assert_eq!(safe_integer(-1.0), None);
        assert_eq!(safe_integer(f64::NAN), None);
        assert_eq!(safe_integer(f64::INFINITY), None);
        assert_eq!(safe_integer(2f64.powi(60)), None);
    }
}
