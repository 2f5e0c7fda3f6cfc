//! The emulator's worker threads, kept between launches.
//!
//! Starting an OS thread costs far more than most emulated GPU threads run,
//! so workers outlive their task: after one they wait for the next, and exit
//! after [`IDLE_EXIT`] without work. A batch of tasks must run *all at once*
//! (they meet at block barriers), so [`Pool::run_batch`] makes sure there is
//! an idle worker reserved for every task before queueing them, spawning the
//! difference. Concurrent launches (several emulated devices in one process)
//! therefore never wait on each other's workers.

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

/// How long an idle worker waits for work before exiting.
const IDLE_EXIT: Duration = Duration::from_secs(20);
/// Stack of each worker: kernels' host forms are small, but debug builds are not frugal.
const STACK_BYTES: usize = 512 * 1024;

type Task = Box<dyn FnOnce() + Send + 'static>;

#[derive(Default)]
struct State {
    queue: VecDeque<Task>,
    /// Workers waiting for a task that no batch has reserved yet.
    idle: usize,
}

pub(crate) struct Pool {
    state: Mutex<State>,
    work: Condvar,
}

/// The process-wide pool.
pub(crate) fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool { state: Mutex::new(State::default()), work: Condvar::new() })
}

impl Pool {
    /// Runs every task concurrently, each on its own worker, and returns
    /// when all have finished. Tasks must not unwind (catch inside).
    pub(crate) fn run_batch(&'static self, tasks: Vec<Task>) -> Result<()> {
        let n = tasks.len();
        let done = Arc::new((Mutex::new(0usize), Condvar::new()));
        let spawn = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let reserved = st.idle.min(n);
            st.idle -= reserved;
            for task in tasks {
                let done = done.clone();
                st.queue.push_back(Box::new(move || {
                    task();
                    let (count, cv) = &*done;
                    *count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                    cv.notify_all();
                }));
            }
            self.work.notify_all();
            n - reserved
        };
        for _ in 0..spawn {
            let started = std::thread::Builder::new()
                .name("devcomm-emu".into())
                .stack_size(STACK_BYTES)
                .spawn(move || self.worker());
            if let Err(e) = started {
                // The queued tasks cannot all run at once; they may be waiting
                // on each other at a barrier. Report instead of hanging.
                return Err(Error::SystemError(format!("could not start an emulated GPU thread: {e}")));
            }
        }
        let (count, cv) = &*done;
        let mut c = count.lock().unwrap_or_else(|p| p.into_inner());
        while *c < n {
            c = cv.wait(c).unwrap_or_else(|p| p.into_inner());
        }
        Ok(())
    }

    fn worker(&'static self) {
        // A new worker was reserved by the batch that spawned it: take a task
        // straight away; afterwards it is idle until reserved again.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(task) = st.queue.pop_front() {
                drop(st);
                task();
                st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.idle += 1;
                continue;
            }
            let (g, timeout) = self.work.wait_timeout(st, IDLE_EXIT).unwrap_or_else(|p| p.into_inner());
            st = g;
            if timeout.timed_out() && st.queue.is_empty() && st.idle > 0 {
                st.idle -= 1;
                return;
            }
        }
    }
}
