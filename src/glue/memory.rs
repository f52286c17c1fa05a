//! `memoryLeaseTable()`: the in-memory store behind the shell's `MemoryLeaseProvider`.
//!
//! Its functions answer on the spot, with no thread hop, and synchronously: the shell makes
//! the promise and the `acquireLease` object in JavaScript, which skips the N-API calls
//! making them here would take. They are plain functions bound to their table, not class
//! methods, so a call skips napi-rs's instance lookup and borrow bookkeeping
//! (`docs/benchmarks.md` has what each piece cost). Everything runs on Node's thread, the
//! sweep of expired leases too (the shell calls `sweep()` on a timer), so the table takes no
//! lock and counts without atomics. A table made with a `clock` reads it there too, at each
//! call: one JavaScript call more, paid only by the tables that have one.

use std::cell::{Cell, RefCell};
use std::ffi::{c_void, CStr};
use std::ptr;
use std::rc::Rc;
use std::time::Instant;

use napi::bindgen_prelude::{Env, ToNapiValue, Unknown};
use napi::{sys, JsValue};
use napi_derive::napi;

use super::args;
use super::crossing::catching;
use super::js::{self, Value};
use super::options::{self, OptionError};
use super::reply::{to_js, LeaseStats, Reply};
use super::unknown;
use crate::core::lease::memory::FollowedClock;
use crate::core::lease::stats::{Operation, Stats};
use crate::core::{Answer, Call, Error, InputErrorKind, MemoryStore, Result, Subject};

/// Expired leases one `sweep()` reclaims at most, so a large backlog is swept over several
/// turns of Node's event loop rather than in one long one.
const SWEEP_CHUNK: usize = 10_000;

/// What the functions of one table share: the leases, the counters `stats()` reads, whether
/// `close()` was called, how many deadlines the sweep under way has looked at, and the
/// `clock` option's clock, if it was given.
struct Table {
    store: MemoryStore,
    stats: Stats<Cell<u64>>,
    closed: Cell<bool>,
    swept: Cell<usize>,
    clock: Option<JsClock>,
}

/// A `clock` option: the function read for the time, and the instants its readings make.
struct JsClock {
    /// Taken by `close()`, so a clock that holds its provider does not keep it alive. Held by
    /// an `Rc` while read: the clock may call the table, `close()` included.
    function: RefCell<Option<Rc<js::Held>>>,
    time: FollowedClock,
    /// What the clock threw at the reading under way, for the error's `cause`: taken by the
    /// table function that throws that error, before it returns.
    thrown: Cell<Option<Value>>,
}

impl JsClock {
    /// Reads the clock once (refusing a clock that throws or answers no finite number), and
    /// keeps it.
    fn new(env: js::Env, function: Value) -> std::result::Result<Self, OptionError> {
        let first = read(env, function).map_err(|(error, cause)| OptionError { error, cause })?;
        let time = FollowedClock::new(first)?;
        let held = js::Held::new(env, function)
            .ok_or_else(|| Error::Internal("could not keep the clock".into()))?;
        Ok(Self {
            function: RefCell::new(Some(Rc::new(held))),
            time,
            thrown: Cell::new(None),
        })
    }

    /// The instant the clock reads now, or why it could not be read (what it threw, if it
    /// did, kept in `thrown`).
    #[cold]
    #[inline(never)]
    fn now(&self, env: js::Env) -> Result<Instant> {
        let held = self.function.borrow().clone();
        let function = held
            .as_ref()
            .and_then(|held| held.value())
            .ok_or(Error::Closed(Subject::LeaseProvider))?;
        let reading = read(env, function).map_err(|(error, thrown)| {
            self.thrown.set(thrown);
            error
        })?;
        self.time.at(reading)
    }
}

/// One reading of a clock, in milliseconds: what it answered, if a number; or why not, with
/// what it threw if it did.
fn read(env: js::Env, clock: Value) -> std::result::Result<f64, (Error, Option<Value>)> {
    let answer = js::try_call(env, clock, &[]).map_err(|thrown| {
        let error = Error::option(
            InputErrorKind::Type,
            format!(
                "MemoryLeaseProvider: the clock threw: {}",
                js::describe(env, thrown)
            ),
        );
        (error, Some(thrown))
    })?;
    js::number_checked(env, answer).ok_or_else(|| {
        let kind = super::args::type_name(js::type_of(env, answer));
        let error = Error::option(
            InputErrorKind::Type,
            format!(
                "MemoryLeaseProvider: the clock must answer a number of milliseconds, got {kind}"
            ),
        );
        (error, None)
    })
}

impl Table {
    /// The time of a call: the table's own monotonic clock, or its `clock` option's.
    fn now(&self, env: js::Env) -> Result<Instant> {
        match &self.clock {
            None => Ok(Instant::now()),
            Some(clock) => clock.now(env),
        }
    }

    /// What the clock threw at this call's reading, if it did: the `cause` of its error.
    fn thrown(&self) -> Option<Value> {
        self.clock.as_ref().and_then(|clock| clock.thrown.take())
    }

    /// One round of a sweep: reclaims up to [`SWEEP_CHUNK`] expired leases, and answers
    /// whether more are due. A sweep of many ends by giving their memory back to the system.
    /// A clock that cannot be read leaves the round to the next (the calls reject meanwhile).
    fn sweep(&self, env: js::Env) -> bool {
        let Ok(now) = self.now(env) else {
            self.thrown();
            return false;
        };
        let looked = self.store.reclaim_expired_at(now, SWEEP_CHUNK);
        let swept = self.swept.get() + looked;
        let more = looked == SWEEP_CHUNK;
        self.swept.set(if more { swept } else { 0 });
        if !more && swept >= SWEEP_CHUNK {
            crate::give_back_memory();
        }
        more
    }
}

/// Makes a table of leases in this process's memory, enforcing `options`' limits, and answers
/// an object of functions bound to it: the lease calls (`acquireLease`, ...), `close`,
/// `ping`, `size`, `stats` and `sweep`. Each answers synchronously or throws the coded error
/// the provider rejects with. Throws `ERR_LEASE_INVALID_OPTION` for bad options.
#[napi(
    catch_unwind,
    ts_args_type = "options?: MemoryLeaseProviderOptions | undefined | null",
    ts_return_type = "{
  acquireLease(key: string, owner: string, ttlMs: number, metadata?: string): true | string
  acquireFencedLease(key: string, owner: string, ttlMs: number, metadata?: string): number | string
  getLeaseOwner(key: string): string | undefined
  getLease(key: string): LeaseState | undefined
  getLeaseRecord(key: string): LeaseRecord | undefined
  releaseLease(key: string, owner: string, metadata?: string): void
  renewLease(key: string, owner: string, ttlMs: number, metadata?: string): boolean
  transferLease(key: string, fromOwner: string, toOwner: string, ttlMs: number, fromMetadata?: string, toMetadata?: string): boolean
  close(): void
  ping(): number
  size(): number
  stats(): LeaseStats
  sweep(): boolean
}"
)]
pub fn memory_lease_table<'env>(
    env: &'env Env,
    options: Option<Unknown<'env>>,
) -> napi::Result<Unknown<'env>> {
    let raw = env.raw();
    let made = options::memory(raw, options.map(|o| o.raw())).and_then(|read| {
        let clock = match read.clock {
            Some(function) => Some(JsClock::new(raw, function)?),
            None => None,
        };
        let table = Rc::new(Table {
            store: MemoryStore::new(read.limits),
            stats: Stats::default(),
            closed: Cell::new(false),
            swept: Cell::new(0),
            clock,
        });
        Ok(functions(raw, &table)?)
    });
    match made {
        Ok(object) => Ok(unknown(env, object)),
        Err(err) => {
            err.throw(raw);
            Err(napi::Error::from_status(napi::Status::PendingException))
        }
    }
}

/// A native function of a table: what it answers (as a JavaScript value), or the coded error
/// to throw.
type TableFn<const N: usize> = fn(&Table, js::Env, [Value; N]) -> Result<Value>;

/// The object of functions, each holding the table alive for as long as it lives itself.
fn functions(env: js::Env, table: &Rc<Table>) -> Result<Value> {
    let object = js::object(env);
    bind(env, object, table, c"acquireLease", |t, e, args: [_; 4]| {
        lease_call(
            t,
            e,
            Operation::AcquireLease,
            args::acquire_lease(e, args, false),
        )
    })?;
    bind(
        env,
        object,
        table,
        c"acquireFencedLease",
        |t, e, args: [_; 4]| {
            lease_call(
                t,
                e,
                Operation::AcquireFencedLease,
                args::acquire_lease(e, args, true),
            )
        },
    )?;
    bind(env, object, table, c"getLeaseOwner", |t, e, [key]| {
        lease_call(
            t,
            e,
            Operation::GetLeaseOwner,
            args::get_lease_owner(e, key),
        )
    })?;
    bind(env, object, table, c"getLease", |t, e, [key]| {
        lease_call(t, e, Operation::GetLease, args::get_lease(e, key))
    })?;
    bind(env, object, table, c"getLeaseRecord", |t, e, [key]| {
        lease_call(
            t,
            e,
            Operation::GetLeaseRecord,
            args::get_lease_record(e, key),
        )
    })?;
    bind(env, object, table, c"releaseLease", |t, e, args| {
        lease_call(t, e, Operation::ReleaseLease, args::release_lease(e, args))
    })?;
    bind(env, object, table, c"renewLease", |t, e, args| {
        lease_call(t, e, Operation::RenewLease, args::renew_lease(e, args))
    })?;
    bind(env, object, table, c"transferLease", |t, e, args| {
        lease_call(
            t,
            e,
            Operation::TransferLease,
            args::transfer_lease(e, args),
        )
    })?;
    // `close()`: drops every lease; later calls throw `ERR_LEASE_CLOSED`. Idempotent.
    bind(env, object, table, c"close", |t, e, []| {
        if !t.closed.replace(true) {
            t.store.clear();
            if let Some(clock) = &t.clock {
                clock.function.borrow_mut().take();
            }
        }
        Ok(js::undefined(e))
    })?;
    // `ping()`: 0 (milliseconds: there is no server to reach); throws once closed.
    bind(env, object, table, c"ping", |t, e, []| {
        if t.closed.get() {
            return Err(Error::Closed(Subject::LeaseProvider));
        }
        Ok(js::number_value(e, 0.0))
    })?;
    // `size()`: leases resident, expired ones not yet swept included (0 once closed).
    bind(env, object, table, c"size", |t, e, []| {
        Ok(js::number_value(e, t.store.resident() as f64))
    })?;
    // `stats()`: the table's counters (see `LeaseStats`).
    bind(env, object, table, c"stats", |t, e, []| {
        let stats = LeaseStats::from(t.stats.snapshot());
        stats
            .into_unknown(&Env::from_raw(e))
            .map(|stats| stats.raw())
            .map_err(|err| Error::Internal(err.reason))
    })?;
    // `sweep()`: one round of reclaiming expired leases; `true` when more are due.
    bind(env, object, table, c"sweep", |t, e, []| {
        Ok(js::boolean(e, t.sweep(e)))
    })?;
    Ok(object)
}

/// What a table function carries: its table and what it runs on it.
struct Bound<const N: usize> {
    table: Rc<Table>,
    call: TableFn<N>,
}

/// Sets `object[name]` to a function running `call` on `table` with its first `N` arguments
/// (`undefined` for those not passed). The function holds the table alive while it lives.
///
/// Made with N-API by hand rather than napi-rs' closures, whose trampoline allocates the
/// arguments' vector and reads them twice past four: `bench/instructions.mjs` counts what
/// that saves (docs/benchmarks.md).
fn bind<const N: usize>(
    env: js::Env,
    object: Value,
    table: &Rc<Table>,
    name: &CStr,
    call: TableFn<N>,
) -> Result<()> {
    let bound = Box::new(Bound::<N> {
        table: table.clone(),
        call,
    });
    let data = Box::into_raw(bound).cast();
    let function = js::function(env, name, run::<N>, data, Some(free::<N>))
        .ok_or_else(|| Error::Internal(format!("could not make {name:?}")))?;
    js::set_property(env, object, name, function);
    Ok(())
}

/// A call of a table function: its answer, or null with the coded error thrown.
unsafe extern "C" fn run<const N: usize>(env: js::Env, info: sys::napi_callback_info) -> Value {
    let Some((args, data)) = js::arguments::<N>(env, info) else {
        return ptr::null_mut();
    };
    // SAFETY: the function was made by `bind` with a `Bound<N>`, which lives until `free`.
    let bound = unsafe { &*data.cast::<Bound<N>>() };
    match catching(|| (bound.call)(&bound.table, env, args)) {
        Ok(value) => value,
        Err(err) => {
            js::throw(env, &err, bound.table.thrown());
            ptr::null_mut()
        }
    }
}

/// Frees what `bind` gave a function, once the function is collected.
unsafe extern "C" fn free<const N: usize>(_env: js::Env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` is the `Bound<N>` `bind` leaked for this function, freed once.
    let bound = unsafe { Box::from_raw(data.cast::<Bound<N>>()) };
    // A panic must not unwind into Node; dropping the table does not panic, but be sure.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(bound)));
}

/// One lease call on the table, its arguments read into `call`, at the table's time:
/// counted, then answered as [`answered`] says.
fn lease_call(
    table: &Table,
    env: js::Env,
    operation: Operation,
    call: Result<Call>,
) -> Result<Value> {
    let outcome = call.and_then(|call| {
        if table.closed.get() {
            return Err(Error::Closed(Subject::LeaseProvider));
        }
        table.store.apply_at(table.now(env)?, call)
    });
    table.stats.record(operation, outcome.as_ref());
    outcome.map(|answer| answered(env, answer))
}

/// A lease answer as a table function gives it: as a Redis call resolves (`reply::to_js`),
/// except an acquire: when granted, `true` (a fenced one: its token, a number), when refused
/// the holder's owner (a string), of which the shell makes `{ acquired, owner }` (and
/// `token`).
fn answered(env: js::Env, answer: Answer) -> Value {
    match answer {
        Answer::Grant(grant) if grant.acquired => match grant.token {
            Some(token) => js::number_value(env, token as f64),
            None => js::boolean(env, true),
        },
        Answer::Grant(grant) => js::string_or_undefined(env, grant.owner.as_deref()),
        other => match to_js(env, Ok(Reply::Answer(other))) {
            Ok(value) | Err(value) => value,
        },
    }
}
