//! Work deferred to the end of the current turn of JavaScript: run as one microtask after
//! the code running now and the continuations already queued, so every call made in the
//! meantime can join it. One native function and one settled promise per environment are
//! kept for this, so a turn costs one JavaScript call, not a new function.
//!
//! The microtask is queued by the promise's own `then`, never by `globalThis.queueMicrotask`:
//! a test framework's fake timers replace that global (Jest's do by default), and a job
//! queued into a fake would wait for a clock nobody advances.

use std::cell::RefCell;
use std::ptr;

use napi::sys;

use super::give_back;
use crate::glue::js::{self, Env, Persistent, Value};

/// Work for the end of the turn.
pub type Job = Box<dyn FnOnce()>;

/// This thread's environment, the references it needs, and the jobs waiting for the turn's
/// end. Each Node environment (main thread or worker) runs on its own thread.
struct Turn {
    env: Env,
    run_jobs: Persistent,
    /// A promise settled once and for all, and its `then`: called with `run_jobs`, it queues
    /// a microtask in V8's own queue.
    settled: Persistent,
    then: Persistent,
    jobs: Vec<Job>,
}

thread_local! {
    static TURN: RefCell<Option<Turn>> = const { RefCell::new(None) };
}

/// Runs `job` at the end of this turn, together with every other job deferred in it. If the
/// microtask cannot be queued (the environment is shutting down), runs it at once.
pub fn at_end(env: Env, job: Job) {
    let queued = TURN.with(|turn| {
        let mut turn = turn.borrow_mut();
        if turn.as_ref().is_none_or(|t| t.env != env) {
            *turn = Turn::new(env);
        }
        let Some(turn) = turn.as_mut() else {
            return Err(job);
        };
        turn.jobs.push(job);
        if turn.jobs.len() > 1 {
            return Ok(());
        }
        if turn.schedule() {
            Ok(())
        } else {
            Err(turn.jobs.pop().unwrap_or_else(|| Box::new(|| ())))
        }
    });
    if let Err(job) = queued {
        job();
    }
}

impl Turn {
    fn new(env: Env) -> Option<Self> {
        let function = js::function(env, c"mastraLeaseEndOfTurn", run, ptr::null_mut(), None)?;
        let (deferred, settled) = js::promise(env);
        js::settle(env, deferred, Ok(js::undefined(env)));
        let then = match js::property(env, settled, c"then") {
            Ok(then) if js::type_of(env, then) == sys::ValueType::napi_function => then,
            _ => return None,
        };
        // All live as long as the environment.
        Some(Self {
            env,
            run_jobs: js::persist(env, function)?,
            settled: js::persist(env, settled)?,
            then: js::persist(env, then)?,
            jobs: Vec::new(),
        })
    }

    /// Queues the microtask that runs the jobs.
    fn schedule(&self) -> bool {
        let env = self.env;
        match (
            self.run_jobs.value(env),
            self.settled.value(env),
            self.then.value(env),
        ) {
            (Some(function), Some(settled), Some(then)) => {
                js::call_on(env, settled, then, &[function]).is_some()
            }
            _ => false,
        }
    }
}

/// The microtask: runs every job deferred in the turn that just ended.
unsafe extern "C" fn run(_env: Env, _info: sys::napi_callback_info) -> Value {
    let mut jobs = TURN.with(|turn| {
        turn.borrow_mut()
            .as_mut()
            .map(|turn| std::mem::take(&mut turn.jobs))
            .unwrap_or_default()
    });
    for job in jobs.drain(..) {
        // A panic must not unwind into Node; jobs do not panic, but be sure.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
    TURN.with(|turn| {
        if let Some(turn) = turn.borrow_mut().as_mut() {
            give_back(&mut turn.jobs, jobs);
        }
    });
    ptr::null_mut()
}
