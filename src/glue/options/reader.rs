//! Reading an options object: each option read is noted, and what is left is refused by
//! name, with the option meant when it looks like a typo.

use std::cell::RefCell;
use std::ffi::CString;

use napi::sys::ValueType;

use super::{OptionError, Read, MAX_COUNT, MAX_TEXT_BYTES};
use crate::core::lease::TTL_CEILING_MS;
use crate::core::{Error, InputErrorKind, Limits};
use crate::glue::args::{safe_integer, type_name};
use crate::glue::js::{self, Env, Value};

/// Options being read: each option read is noted, and [`Options::finish`] refuses the
/// rest.
pub(super) struct Options {
    pub(super) env: Env,
    object: Option<Value>,
    class: &'static str,
    read: RefCell<Vec<&'static str>>,
}

impl Options {
    pub(super) fn new(env: Env, value: Option<Value>, class: &'static str) -> Read<Self> {
        let object = match value.map(|v| (v, js::type_of(env, v))) {
            None => None,
            Some((_, ValueType::napi_undefined | ValueType::napi_null)) => None,
            Some((v, ValueType::napi_object)) if js::is_array(env, v) => {
                return Err(Error::option(
                    InputErrorKind::Type,
                    "options must be an object, got an array",
                )
                .into())
            }
            Some((v, ValueType::napi_object)) => Some(v),
            Some((_, kind)) => {
                return Err(Error::option(
                    InputErrorKind::Type,
                    format!("options must be an object, got {}", type_name(kind)),
                )
                .into())
            }
        };
        Ok(Self {
            env,
            object,
            class,
            read: RefCell::new(Vec::new()),
        })
    }

    /// The options read so far, in the order they were.
    #[cfg(test)]
    pub(super) fn names_read(&self) -> Vec<&'static str> {
        self.read.borrow().clone()
    }

    /// Refuses every option of the object that was not read, naming it.
    pub(super) fn finish(self) -> Read<()> {
        let Some(object) = self.object else {
            return Ok(());
        };
        let read = self.read.borrow();
        let names = js::property_names(self.env, object).map_err(|thrown| OptionError {
            error: Error::option(InputErrorKind::Type, "options: listing the options threw"),
            cause: Some(thrown),
        })?;
        for name in names {
            if read.contains(&name.as_str()) {
                continue;
            }
            let hint = match name.as_str() {
                "client" => "; the classes of mastra-lease read a node-redis client's \
                             configuration, this raw binding does not: give url (or \
                             redisOptions) instead"
                    .to_owned(),
                "inFlightTimeoutMs" | "hardMaxStreamLength" | "blockMs" | "maxStreamLength" => {
                    "; it is an option of RedisStreamsPubSub".to_owned()
                }
                "clock" => "; it is an option of MemoryLeaseProvider: Redis keeps the time \
                            of leases in Redis (a test's fake clock cannot move it)"
                    .to_owned(),
                "fencingTokens" => "; it is gone: acquireLease grants without a \
                                    token, as Mastra's own backend does, and a fenced grant is \
                                    asked for per call (acquireFencedLease, hold())"
                    .to_owned(),
                _ => match closest(&name, &read) {
                    Some(near) => format!("; did you mean {near}?"),
                    None => String::new(),
                },
            };
            return Err(Error::option(
                InputErrorKind::Type,
                format!(
                    "{}: unknown option {}{hint}",
                    self.class,
                    name.escape_debug()
                ),
            )
            .into());
        }
        Ok(())
    }

    /// The property's value and type, or `None` when absent or `undefined`. A getter that
    /// throws is an error carrying what it threw.
    pub(super) fn get(
        &self,
        name: &'static str,
    ) -> Read<Option<(Value, napi::sys::napi_valuetype)>> {
        self.read.borrow_mut().push(name);
        let Some(object) = self.object else {
            return Ok(None);
        };
        self.field(object, name, name)
    }

    /// `object[name]` of a nested object, labelled `label` in errors.
    pub(super) fn field(
        &self,
        object: Value,
        name: &str,
        label: &str,
    ) -> Read<Option<(Value, napi::sys::napi_valuetype)>> {
        let c_name = CString::new(name)
            .map_err(|_| Error::Internal(format!("option name {name:?} holds a NUL")))?;
        let value = js::property(self.env, object, &c_name).map_err(|thrown| OptionError {
            error: Error::option(
                InputErrorKind::Type,
                format!(
                    "reading option {label} threw: {}",
                    js::describe(self.env, thrown)
                ),
            ),
            cause: Some(thrown),
        })?;
        let kind = js::type_of(self.env, value);
        Ok((kind != ValueType::napi_undefined).then_some((value, kind)))
    }

    /// The lease limits: `maxKeyBytes`, `maxOwnerBytes`, `maxMetadataBytes`, `maxTtlMs`.
    pub(super) fn limits(&self) -> Read<Limits> {
        let d = Limits::default();
        Ok(Limits {
            max_key_bytes: self
                .whole("maxKeyBytes", 1, MAX_TEXT_BYTES)?
                .map_or(d.max_key_bytes, |n| n as usize),
            max_owner_bytes: self
                .whole("maxOwnerBytes", 1, MAX_TEXT_BYTES)?
                .map_or(d.max_owner_bytes, |n| n as usize),
            max_metadata_bytes: self
                .whole("maxMetadataBytes", 1, MAX_TEXT_BYTES)?
                .map_or(d.max_metadata_bytes, |n| n as usize),
            max_ttl_ms: self
                .whole("maxTtlMs", 1, TTL_CEILING_MS)?
                .unwrap_or(d.max_ttl_ms),
        })
    }

    /// `logger`: an object with a `warn` method, and optionally `debug`. Valid during this
    /// call only.
    pub(super) fn logger(&self) -> Read<Option<Value>> {
        let Some((value, kind)) = self.get("logger")? else {
            return Ok(None);
        };
        let object = matches!(kind, ValueType::napi_object | ValueType::napi_function);
        let warn = if object {
            self.field(value, "warn", "logger.warn")?
        } else {
            None
        };
        if !object || !matches!(warn, Some((_, ValueType::napi_function))) {
            return Err(Error::option(
                InputErrorKind::Type,
                "logger must have a warn(message, fields) method (and may have debug)",
            )
            .into());
        }
        match self.field(value, "debug", "logger.debug")? {
            None | Some((_, ValueType::napi_function)) => Ok(Some(value)),
            Some((_, kind)) => Err(Error::option(
                InputErrorKind::Type,
                format!("logger.debug must be a function, got {}", type_name(kind)),
            )
            .into()),
        }
    }

    /// A function option, valid during this call only.
    pub(super) fn function(&self, name: &'static str, what: &str) -> Read<Option<Value>> {
        match self.get(name)? {
            None => Ok(None),
            Some((value, ValueType::napi_function)) => Ok(Some(value)),
            Some((_, kind)) => Err(Error::option(
                InputErrorKind::Type,
                format!(
                    "{}: {name} must be {what}, got {}",
                    self.class,
                    type_name(kind)
                ),
            )
            .into()),
        }
    }

    pub(super) fn string(&self, name: &'static str) -> Read<Option<String>> {
        match self.get(name)? {
            Some((value, kind)) => self.text(value, kind, name).map(Some),
            None => Ok(None),
        }
    }

    /// A string option's value: well-formed UTF-16.
    pub(super) fn text(
        &self,
        value: Value,
        kind: napi::sys::napi_valuetype,
        label: &str,
    ) -> Read<String> {
        if kind != ValueType::napi_string {
            return Err(Error::option(
                InputErrorKind::Type,
                format!("{label} must be a string, got {}", type_name(kind)),
            )
            .into());
        }
        js::string_value(self.env, value).map_err(|_| {
            Error::option(
                InputErrorKind::Type,
                format!("{label} must be well-formed UTF-16"),
            )
            .into()
        })
    }

    /// A whole number from `min` to `max`.
    pub(super) fn whole(&self, name: &'static str, min: u64, max: u64) -> Read<Option<u64>> {
        match self.get(name)? {
            Some((value, kind)) => self.number_in(value, kind, name, min, max).map(Some),
            None => Ok(None),
        }
    }

    pub(super) fn number_in(
        &self,
        value: Value,
        kind: napi::sys::napi_valuetype,
        label: &str,
        min: u64,
        max: u64,
    ) -> Read<u64> {
        if kind != ValueType::napi_number {
            return Err(Error::option(
                InputErrorKind::Type,
                format!("{label} must be a number, got {}", type_name(kind)),
            )
            .into());
        }
        let number = js::number(self.env, value);
        match safe_integer(number) {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(Error::option(
                InputErrorKind::Range,
                format!("{label} must be a whole number from {min} to {max}, got {number}"),
            )
            .into()),
        }
    }

    /// A count, or `Infinity` (`Some(None)`); the caller says what 0 means.
    pub(super) fn count_or_infinity(&self, name: &'static str) -> Read<Option<Option<u64>>> {
        let Some((value, kind)) = self.get(name)? else {
            return Ok(None);
        };
        if kind == ValueType::napi_number && js::number(self.env, value) == f64::INFINITY {
            return Ok(Some(None));
        }
        self.number_in(value, kind, name, 0, MAX_COUNT)
            .map(|n| Some(Some(n)))
    }
}

/// The option among `known` closest to a misspelt `name`, when it is close enough to be
/// what was meant.
pub(super) fn closest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let name = name.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (distance(&name, &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_option_names_the_one_meant() {
        let known = ["url", "keyPrefix", "inFlightTimeoutMs", "reclaimIdleMs"];
        assert_eq!(closest("urll", &known), Some("url"));
        assert_eq!(closest("keyprefix", &known), Some("keyPrefix"));
        assert_eq!(
            closest("inFlightTimeoutMz", &known),
            Some("inFlightTimeoutMs")
        );
        assert_eq!(closest("somethingElse", &known), None);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
