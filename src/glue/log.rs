//! Where the core's notices go in Node: a logger's `warn` and `debug` (Mastra's logger
//! fits; `debug` is optional), or, without one, `process.emitWarning` for the warnings.

use napi::sys::ValueType;
use serde_json::{Map, Value as Json};

use super::crossing::JsCallback;
use super::js::{self, Env, Value};
use crate::core::connection::EVICTION_WARNING_CODE;
use crate::core::log::{Level, Logger, Notice};
use crate::core::{Error, Result};

/// Notices on their way to JavaScript functions, called on Node's thread.
pub struct JsLog {
    warn: JsCallback<Notice>,
    debug: Option<JsCallback<Notice>>,
}

impl Logger for JsLog {
    fn log(&self, notice: Notice) {
        match notice.level {
            Level::Warn => {
                self.warn.call(notice);
            }
            Level::Debug => {
                if let Some(debug) = &self.debug {
                    debug.call(notice);
                }
            }
        }
    }
}

impl JsLog {
    /// `logger.warn(message, fields)`, and `logger.debug(message, fields)` when it has one;
    /// the options reader checked that `warn` is a function.
    pub fn logger(env: Env, logger: Value) -> Result<Self> {
        let method = |name: &std::ffi::CStr| {
            let function = js::property(env, logger, name).ok()?;
            JsCallback::new(env, bound(env, function, logger)?, message_and_fields).ok()
        };
        let warn = method(c"warn")
            .ok_or_else(|| Error::Internal("could not bind the logger's warn method".into()))?;
        Ok(Self {
            warn,
            debug: method(c"debug"),
        })
    }

    /// `process.emitWarning(message, { code })` for warnings; debug notes are dropped.
    pub fn process(env: Env) -> Result<Self> {
        let process = js::property(env, js::global(env), c"process").ok();
        let emit = process
            .filter(|process| js::type_of(env, *process) == ValueType::napi_object)
            .and_then(|process| {
                let emit = js::property(env, process, c"emitWarning").ok()?;
                bound(env, emit, process)
            })
            .and_then(|function| JsCallback::new(env, function, message_and_code).ok());
        match emit {
            Some(warn) => Ok(Self { warn, debug: None }),
            None => Err(Error::Internal("process.emitWarning is unavailable".into())),
        }
    }

    /// The logger's, or `process.emitWarning` for its warnings when there is none.
    pub fn logger_or_process(env: Env, logger: Option<Value>) -> Result<Option<Self>> {
        match logger {
            Some(logger) => Self::logger(env, logger).map(Some),
            None => Ok(Self::process(env).ok()),
        }
    }
}

/// On Node's thread, at once: `logger.warn(message, fields)`, or without a logger
/// `process.emitWarning(message, { code })`. For a warning a caller looks for as soon as the
/// call that caused it returns (a constructor's: Mastra's own tests of its backend do).
pub fn warn_now(env: Env, logger: Option<Value>, notice: Notice) {
    type ToArgs = fn(Env, Notice) -> Vec<Value>;
    let (this, method, to_args): (Option<Value>, &std::ffi::CStr, ToArgs) = match logger {
        Some(logger) => (Some(logger), c"warn", message_and_fields),
        None => {
            let process = js::property(env, js::global(env), c"process").ok();
            (process, c"emitWarning", message_and_code)
        }
    };
    let function = this
        .filter(|this| js::type_of(env, *this) == ValueType::napi_object)
        .and_then(|this| bound(env, js::property(env, this, method).ok()?, this));
    if let Some(function) = function {
        js::call(env, function, &to_args(env, notice));
    }
}

/// `function.bind(this)`, so the callback keeps its object when called on its own.
fn bound(env: Env, function: Value, this: Value) -> Option<Value> {
    if js::type_of(env, function) != ValueType::napi_function {
        return None;
    }
    let bind = js::property(env, function, c"bind").ok()?;
    if js::type_of(env, bind) != ValueType::napi_function {
        return None;
    }
    js::call_on(env, function, bind, &[this])
}

fn message_and_fields(env: Env, notice: Notice) -> Vec<Value> {
    vec![
        js::string(env, &notice.message),
        object(env, &notice.fields),
    ]
}

fn message_and_code(env: Env, notice: Notice) -> Vec<Value> {
    let code = notice
        .fields
        .get("code")
        .and_then(Json::as_str)
        .unwrap_or(EVICTION_WARNING_CODE);
    let mut options = Map::new();
    options.insert("code".into(), Json::from(code));
    vec![js::string(env, &notice.message), object(env, &options)]
}

/// A flat object of the fields: strings, numbers and booleans as themselves, anything else
/// as its JSON text.
fn object(env: Env, fields: &Map<String, Json>) -> Value {
    let out = js::object(env);
    for (name, value) in fields {
        let value = match value {
            Json::String(text) => js::string(env, text),
            Json::Number(n) => js::number_value(env, n.as_f64().unwrap_or(f64::NAN)),
            Json::Bool(b) => js::boolean(env, *b),
            other => js::string(env, &other.to_string()),
        };
        js::set_key(env, out, name, value);
    }
    out
}
